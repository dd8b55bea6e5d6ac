"""Every drafter on the bundled BPD model (data/heads-stern, the 4-gram, data/rescorer-small)
emits exactly greedy decoding's tokens on held-out prompts, batch 1 and 4 (prompts of
different lengths). Skipped until the bundled models are built (scripts/setup.sh)."""

import numpy as np
import pytest

from latticedraft.decoding.methods.bpd import DrafterSpec
from latticedraft.decoding.runs.loaders import default_model_dir, default_rescorer_dir
from latticedraft.paths import default_lm_dir
from tests.decoding.tiny import bundled_greedy

READY = all(p.exists() for p in (default_model_dir() / "heads_config.json", default_lm_dir(), default_rescorer_dir()))
pytestmark = [pytest.mark.skipif(not READY, reason="bundled models not built (bash scripts/setup.sh)"), pytest.mark.slow,
              pytest.mark.usefixtures("one_torch_thread")]
NEW = 32


@pytest.fixture(scope="module")
def setup():
    return bundled_greedy(4, NEW)


@pytest.mark.parametrize("spec", [
    DrafterSpec("top1"), DrafterSpec("ngram"), DrafterSpec("parallel", nbest=16, prune="otsu"),
    DrafterSpec("parallel-base", nbest=16), DrafterSpec("neural"), DrafterSpec("oracle", k=16),
], ids=lambda s: s.name)
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("fast", [False, True], ids=["paper", "fast"])
def test_bundled_every_drafter_is_greedy(setup, spec, batch, fast):
    if fast:  # --tree auto, context n-grams, the bundled draft vocabulary (the CLI defaults)
        spec = spec.fast()
    s, ids, greedy = setup
    res = s.decode(ids, "bpd", spec, max_new_tokens=NEW, batch_size=batch)
    assert all(np.array_equal(q.tokens, g) for q, g in zip(res.sequences, greedy))
    assert res.verify_mode == "tree"

"""Lookahead decoding on the bundled model (data/heads-stern's base) emits exactly greedy
decoding's tokens on held-out prompts, batch 1 and 4. Skipped until the bundled model is built."""

import numpy as np
import pytest

from latticedraft.decoding.methods.lookahead import lookahead_decode
from latticedraft.decoding.runs.loaders import default_model_dir
from tests.decoding.tiny import bundled_greedy

READY = (default_model_dir() / "heads_config.json").exists()
pytestmark = [pytest.mark.skipif(not READY, reason="bundled model not built (bash scripts/setup.sh)"), pytest.mark.slow,
              pytest.mark.usefixtures("one_torch_thread")]
NEW = 32


@pytest.fixture(scope="module")
def setup():
    return bundled_greedy(4, NEW)


@pytest.mark.parametrize("W,N,G,ref", [(15, 5, 15, False), (4, 3, 4, True), (1, 2, 0, False)])
@pytest.mark.parametrize("batch", [1, 4])
def test_bundled_lookahead_is_greedy(setup, W, N, G, ref, batch):
    s, ids, greedy = setup
    for at in range(0, len(ids), batch):
        r = lookahead_decode(s.model, ids[at:at + batch], W=W, N=N, G=G, max_new_tokens=NEW, eos_token_id=s.eos,
                             prompt_as_reference=ref)
        assert r.verify_mode == "tree"
        assert all(np.array_equal(q.tokens, g) for q, g in zip(r.sequences, greedy[at:at + batch]))

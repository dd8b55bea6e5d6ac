"""Kangaroo (the bundled adapter) and PPD on the bundled model emit exactly greedy decoding's
tokens on held-out prompts, batch 1 and 4. Skipped until the bundled model and adapter are built."""

import numpy as np
import pytest

from latticedraft.decoding.methods.kangaroo import KangarooOptions
from latticedraft.decoding.methods.ppd import PPDOptions
from latticedraft.decoding.runs.loaders import default_model_dir
from latticedraft.paths import data_dir
from tests.decoding.tiny import bundled_greedy

READY = (default_model_dir() / "heads_config.json").exists() and (data_dir() / "adapter-kangaroo" / "adapter.json").exists()
pytestmark = [pytest.mark.skipif(not READY, reason="bundled model or adapter not built (bash data/build.sh adapter-kangaroo)"),
              pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]
NEW = 32


@pytest.fixture(scope="module")
def setup():
    return bundled_greedy(4, NEW)


@pytest.mark.parametrize("method,opts,batch", [
    ("kangaroo", KangarooOptions(), 4), ("kangaroo", KangarooOptions(gamma=3, eta=0.0), 1),
    ("ppd", PPDOptions(), 1), ("ppd", PPDOptions(dbar=1, k=5), 4),
])
def test_bundled_self_draft_is_greedy(setup, method, opts, batch):
    s, ids, greedy = setup
    r = s.decode(ids, method, opts, max_new_tokens=NEW, batch_size=batch)
    assert all(np.array_equal(q.tokens, g) for q, g in zip(r.sequences, greedy))
    assert sum(sum(q.accepted_drafts) for q in r.sequences) > 0  # drafts / early predictions do get used

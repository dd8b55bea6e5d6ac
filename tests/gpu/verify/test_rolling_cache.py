"""Mistral's rolling-buffer KV cache and chunked prefill (``kv.KVCache.roll_in``,
``prefill.chunked_prefill``, ``Verifier(kv_cache=...)``) on tiny random Mistral models with
sliding windows of 8 and 16 and prompts of about 3 windows."""

import numpy as np
import pytest
import torch

from latticedraft.errors import ModelError
from latticedraft.gpu.verify.kv import KVCache
from latticedraft.gpu.verify.prefill import chunked_prefill
from latticedraft.gpu.verify.verifier import Verifier
from latticedraft.gpu.verify.modes import choose_kv_cache
from tests.decoding.tiny import ToyHeads, prompts, reference, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _left_padded(ps):
    n = max(len(p) for p in ps)
    ids = torch.zeros(len(ps), n, dtype=torch.long)
    valid = torch.zeros(len(ps), n, dtype=torch.bool)
    for i, p in enumerate(ps):
        ids[i, n - len(p):] = torch.as_tensor(p)
        valid[i, n - len(p):] = True
    return ids, valid


@pytest.mark.parametrize("window", [8, 16])
def test_chunked_prefill_equals_full_prefill_logits(window):
    model = tiny_model("mistral", torch.float32, seed=2, window=window)
    ps = prompts(3, seed=5, lengths=(3 * window, 3 * window - 5, window + 1))
    v = Verifier(model, kv_cache="rolling")
    ids, valid = _left_padded(ps)
    outs = []
    state = v.new_state(len(ps))

    def run(x, allowed, pos):
        outs.append(v._run(x, allowed, pos, state))
        return outs[-1]

    last = chunked_prefill(run, state, ids, valid, window)
    logits = [o.unembed(o.hidden) for o in outs]  # (lazy calls: the projection of every node)
    assert last is outs[-1] and [x.shape[1] for x in logits] == [window] * 3  # chunks of W
    got = torch.cat(logits, dim=1)
    for i, p in enumerate(ps):
        full = model(input_ids=torch.as_tensor(p)[None]).logits[0]  # one full-context forward
        torch.testing.assert_close(got[i, -len(p):], full, atol=1e-5, rtol=0)
    assert state.length == window
    assert state.next_pos.tolist() == [len(p) for p in ps]
    # position p of a row sits in slot p mod W, and only the last W positions are kept
    for i, p in enumerate(ps):
        want = [len(p) - 1 - ((len(p) - 1 - s) % window) for s in range(window)]
        assert state.pos[i].tolist() == want and bool(state.valid[i].all())


def test_roll_in_keeps_slots_of_short_rows_invalid_and_drops_rejected_nodes():
    W = 4
    st = KVCache(2, layers=1, window=W)
    # a forward appended 3 slots; row 0 keeps all three (positions 0..2), row 1 only its first
    st.reserve(3)
    st.update(torch.arange(6.0).view(2, 1, 3, 1), torch.zeros(2, 1, 3, 1), 0)
    st.roll_in(0, torch.tensor([[0, 1, 2], [0, -1, -1]]))
    assert st.length == 3 and st.next_pos.tolist() == [3, 1]
    assert st.pos.tolist() == [[0, 1, 2], [0, -1, -1]] and st.valid.tolist() == [[True] * 3, [True, False, False]]
    # verification commit: row 0 accepts appended nodes 2 and 0 (positions 3, 4), row 1 node 1 (position 1)
    st.reserve(3)
    st.update(torch.arange(10.0, 16.0).view(2, 1, 3, 1), torch.zeros(2, 1, 3, 1), 0)
    st.commit(3, torch.tensor([[2, 0], [1, 0]]), torch.tensor([[True, True], [True, False]]))
    assert st.length == W and st.next_pos.tolist() == [5, 2]
    assert st.pos.tolist() == [[4, 1, 2, 3], [0, 1, -1, -1]]  # position 0 of row 0 rolled out (slot 0 = 4)
    keys = st.store[0, 0, :, 0, :W, 0]
    assert keys[0].tolist() == [10.0, 1.0, 2.0, 12.0] and keys[1, :2].tolist() == [3.0, 14.0]


def test_rolling_needs_a_window_and_tree_mode():
    assert choose_kv_cache(8, "tree") and not choose_kv_cache(None, "tree") and not choose_kv_cache(8, "batched")
    assert not choose_kv_cache(8, "tree", "full")
    with pytest.raises(ModelError, match="sliding-window"):
        Verifier(tiny_model("llama"), kv_cache="rolling")
    with pytest.raises(ModelError, match="tree verification"):
        Verifier(tiny_model("mistral", window=8), "batched", kv_cache="rolling")


@pytest.mark.parametrize("window", [8, 16])
def test_verification_over_the_rolling_cache_equals_generate(window):
    """Random drafts with wrong tokens, batch 4 of different lengths and accepted lengths: the
    accepted tokens are generate's, and the cache never holds more than W slots between steps."""
    torch.manual_seed(0)
    model = ToyHeads(tiny_model("mistral", torch.float32, seed=1, window=window), num_heads=2)
    ps = prompts(4, seed=3, lengths=(3 * window, 3 * window + 3, 2 * window - 1, 5))
    refs = [reference(model, p, 3 * window) for p in ps]
    v = Verifier(model, kv_cache="rolling")
    state, roots, _ = v.prefill(ps)
    out = [[int(r)] for r in roots]
    rng = np.random.default_rng(0)
    while min(len(o) for o in out) < 3 * window:
        drafts = []
        for i, o in enumerate(out):
            good = refs[i][len(o):len(o) + 4] + [0] * 4
            d = rng.integers(0, 64, size=(3, 4))
            d[0] = good[:4]
            d[0, rng.integers(0, 5):] = rng.integers(0, 64)  # goes wrong somewhere (or never)
            drafts.append(d)
        res = v.verify(state, np.array([o[-1] for o in out]), drafts)
        assert state.length <= window  # only the last W positions of each row are held
        assert bool(((state.pos >= state.next_pos[:, None] - window) | ~state.valid).all())
        for i, o in enumerate(out):
            o.extend(res.accepted[i].tolist() + [int(res.bonus[i])])
    for i, o in enumerate(out):
        assert o[: 3 * window] == refs[i]

"""``rescore_batch``: one compiled call for many lattices gives, lattice by lattice, exactly
what ``rescore`` gives (tokens and scores), and ``rescore`` itself equals brute force."""

from __future__ import annotations

import numpy as np
import pytest

from latticedraft.errors import InputError
from latticedraft.lattice.rescoring import _history_state, rescore, rescore_batch
from latticedraft.lattice.sausage import Sausage, SausageBatch
from latticedraft.lattice.lm_tables import lm_arrays
from latticedraft.lattice.search import exact_pbest
from latticedraft.lattice.threshold import prune
from test_rescoring import assert_same, brute
from toylm import make_toy_lm


def _ragged(rng, h, k, V):
    """A sausage of depth h whose slots keep 1..k arcs (as after pruning), ids up to V + 2
    (the last two outside the LM's vocabulary 0..V-1)."""
    toks, lps = [], []
    for _ in range(h):
        w = int(rng.integers(1, k + 1))
        toks.append(rng.choice(V + 2, size=w, replace=False).tolist())
        lps.append(np.sort(rng.normal(size=w) - 1.0)[::-1].astype(np.float32))
    return Sausage.from_ragged(toks, lps)


def _pad(s: Sausage, k: int) -> Sausage:
    t = np.full((s.h, k), -1, np.int64)
    lp = np.full((s.h, k), -np.inf, np.float32)
    t[:, :s.k], lp[:, :s.k] = s.tokens, s.logp
    return Sausage(t, lp)


def _histories(rng, B, V, order):
    """Empty, shorter than, equal to and longer than order - 1; some with unknown ids."""
    out = []
    for b in range(B):
        n = [0, 1, order - 1, order + 2][b % 4]
        h = rng.integers(0, V, size=n).tolist()
        if h and b % 3 == 2:
            h[int(rng.integers(len(h)))] = V + int(rng.integers(0, 5))  # unknown to the LM
        out.append(h)
    return out


def _old_path(s, lm, alpha, p, history):
    """The pre-batch single-lattice route: Python history state and pseudo-slots, then the
    triple dynamic program one lattice at a time (an independent reference for the kernel)."""
    start, hist = _history_state(lm, history)
    cand, scores = exact_pbest(s.tokens, s.logp, s.widths, lm_arrays(lm), start, alpha, p, history=hist)
    return s.tokens[np.arange(s.h)[None, :], cand], scores.astype(np.float32)


def _assert_equal(d, e):
    np.testing.assert_array_equal(d.tokens, e.tokens)
    np.testing.assert_array_equal(d.scores, e.scores)
    assert d.tokens.dtype == np.int64 and d.scores.dtype == np.float32
    assert d.requested == e.requested and d.truncated == e.truncated


@pytest.mark.parametrize("order", [1, 2, 3, 4, 5, 6])
def test_batch_equals_rescore_and_brute_force(order):
    rng = np.random.default_rng(40 + order)
    V = 7
    for trial in range(10):
        lm = make_toy_lm(V=V, order=order, seed=300 + 10 * order + trial, density=0.9, undercut=True)
        B = 9
        ss = [_ragged(rng, int(rng.integers(1, 5)), 4, V) for _ in range(B)]  # depths 1..4, ragged widths
        hs = _histories(rng, B, V, order)
        p = int(rng.choice([1, 3, 40]))  # 40: more than most lattices have paths
        alpha = float(rng.choice([0.4, 2.5, 6.0]))
        for workers in (1, 2):
            out = rescore_batch(ss, lm, alpha, p, hs, workers=workers)
            assert len(out) == B
            for s, h, d in zip(ss, hs, out):
                _assert_equal(d, rescore(s, lm, alpha, p, h))
                tok, sc = _old_path(s, lm, alpha, p, h)
                np.testing.assert_array_equal(d.tokens, tok)
                np.testing.assert_array_equal(d.scores, sc)
                assert len(d) == min(p, s.num_paths())
        for s, h, d in zip(ss, hs, out):
            keep = h[-(order - 1):] if order > 1 else []
            if any(t >= V for t in keep):
                continue  # the toy reference scorer knows no unknown history ids
            assert_same(d, brute(s, lambda ids: lm.ref_score(keep, ids), alpha), p)


def test_sausage_batch_equals_a_list_of_its_rows():
    """The array form (what a decoder with a batch of prompts has): equal shapes, ragged
    widths after pruning, the histories as a list or as an int array [B, L]."""
    rng = np.random.default_rng(8)
    V = 9
    lm = make_toy_lm(V=V, order=4, seed=8, density=0.7)
    rows = [prune(Sausage.from_logits(rng.normal(size=(5, V + 3)) * 2.0, 4), otsu=True) for _ in range(12)]
    batch = SausageBatch(np.stack([_pad(s, 4).tokens for s in rows]), np.stack([_pad(s, 4).logp for s in rows]))
    assert (batch.widths < 4).any(), "pruning left every slot full; the test needs ragged widths"
    hist = rng.integers(0, V + 2, size=(12, 5))
    a = rescore_batch(batch, lm, 1.3, 6, hist)
    b = rescore_batch(list(batch), lm, 1.3, 6, [list(h) for h in hist], workers=1)
    for s, h, x, y in zip(rows, hist, a, b):
        _assert_equal(x, y)
        _assert_equal(x, rescore(s, lm, 1.3, 6, h.tolist()))
    assert rescore_batch(SausageBatch(batch.tokens[:0], batch.logp[:0]), lm, 1.0, 2) == []


def test_batch_on_a_real_model_equals_rescore(real_lm):
    fst, _, ids = real_lm
    rng = np.random.default_rng(2)
    V = fst.vocab_size
    logits = rng.normal(size=(16, 6, V)).astype(np.float32) * 3.0
    batch = SausageBatch.from_logits(logits, 8)
    hs = [ids[t - int(rng.integers(0, 5)):t].tolist() for t in rng.integers(10, len(ids), size=16)]
    for p in (1, 4, 16):
        for s, h, d in zip(batch, hs, rescore_batch(batch, fst, 0.9, p, hs)):
            _assert_equal(d, rescore(s, fst, 0.9, p, h))


def test_batch_falls_back_for_other_methods_and_alpha_zero():
    rng = np.random.default_rng(3)
    lm = make_toy_lm(V=6, order=3, seed=3)
    batch = SausageBatch.from_logits(rng.normal(size=(5, 3, 6)), 3)
    hs = [[1, 2]] * 5
    for alpha, method in ((0.0, "exact"), (1.0, "wfst")):
        for s, d in zip(batch, rescore_batch(batch, lm, alpha, 3, hs, method=method)):
            _assert_equal(d, rescore(s, lm, alpha, 3, [1, 2], method=method))


def test_batch_bad_input_is_one_input_error():
    lm = make_toy_lm(V=6, order=3, seed=0)
    tok = np.array([[[0, 1], [2, -1]], [[3, 4], [5, 5]]])
    lp = np.log(np.array([[[0.6, 0.4], [1.0, 1.0]], [[0.6, 0.4], [0.5, 0.5]]], np.float32))
    lp[0, 1, 1] = -np.inf
    with pytest.raises(InputError, match="slot 1 of lattice 1 lists a token twice"):
        SausageBatch(tok, lp)
    with pytest.raises(InputError, match=r"tokens\[B,h,k\]"):
        SausageBatch(tok[0], lp[0])
    with pytest.raises(InputError, match="NaN at slot"):
        SausageBatch.from_logits(np.full((2, 3, 6), np.nan), 2)
    tok[1, 1, 1] = 1
    batch = SausageBatch(tok, lp)
    with pytest.raises(InputError, match="one history per lattice"):
        rescore_batch(batch, lm, 1.0, 2, [[1]])
    with pytest.raises(InputError, match=r"history ids must be >= 0.*lattice 1"):
        rescore_batch(batch, lm, 1.0, 2, [[1], [2, -3]])
    with pytest.raises(InputError, match="SausageBatch or Sausages"):
        rescore_batch([tok[0]], lm, 1.0, 2)
    with pytest.raises(InputError, match="nbest"):
        rescore_batch(batch, lm, 1.0, 0)


def test_the_kernels_scratch_is_left_as_found_and_reused():
    """The label -> candidate scratch (``batched._posmap``, O(V) to fill) is made once per thread and
    vocabulary and reused: every search leaves it all -1, so the next one (its drafts equal to brute
    force) starts from a clean one."""
    from latticedraft.lattice.batched import _posmap

    V = 7
    lm = make_toy_lm(V=V, order=3, seed=3, density=0.6)
    rng = np.random.default_rng(5)
    before = _posmap(int(lm_arrays(lm).vocab_size))
    for t in range(12):
        s = _ragged(rng, 4, 4, V - 2)  # (ids inside the vocabulary: the reference scorer knows no others)
        hist = rng.integers(0, V, size=int(rng.integers(0, 4))).tolist()
        keep = hist[-2:]
        assert_same(rescore(s, lm, 0.7, 5, hist), brute(s, lambda ids: lm.ref_score(keep, ids), 0.7), 5)
        assert _posmap(int(lm_arrays(lm).vocab_size)) is before and (before == -1).all()

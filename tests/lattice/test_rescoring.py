"""Rescoring is exact: brute-force enumeration of all k^h paths is the reference."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from latticedraft.errors import InputError
from latticedraft.lattice.rescoring import base_drafts, lattice_fst_bytes, rescore, rescore_batch
from latticedraft.lattice.sausage import Sausage
from latticedraft.lattice.lm_tables import lm_arrays
from latticedraft.lattice.search import exact_pbest, lm_step
from latticedraft.lattice.state_dp import _state_pbest
from tests.lm.kenlm_ref import kenlm_logp
from toylm import make_toy_lm


def brute(s: Sausage, lm_score, alpha: float):
    """All paths scored as head + alpha * lm_score(ids), best first: [(score, ids)]."""
    out = []
    for cand in itertools.product(*[range(w) for w in s.widths]):
        ids = [int(s.tokens[i, c]) for i, c in enumerate(cand)]
        out.append((s.path_logp(np.array(cand)) + alpha * lm_score(ids), ids))
    out.sort(key=lambda x: -x[0])
    return out


def assert_same(d, ref, p, atol=1e-4):
    exp = ref[:p]
    assert len(d) == len(exp)
    np.testing.assert_allclose(d.scores, [e[0] for e in exp], atol=atol, rtol=1e-6)
    for row, (score, ids) in zip(d.tokens.tolist(), exp):
        # equal scores may come in either order; then the score must match
        if row != ids:
            alt = [e for e in ref if e[1] == row]
            assert alt and abs(alt[0][0] - score) < atol, (row, ids)
    assert len({tuple(r) for r in d.tokens.tolist()}) == len(d), "drafts must be distinct"


def random_case(rng, V, n_paths_max=256):
    h = int(rng.integers(1, 5))
    k = int(rng.integers(1, 5))
    logits = rng.normal(size=(h, V)) * 2.0
    return Sausage.from_logits(logits, k)


@pytest.mark.parametrize("order", [2, 3, 4, 5, 6])
def test_exact_matches_brute_force_on_random_backoff_lms(order):
    """Random unnormalised LMs with back-off weights above 1: the exact p best, always.
    Orders <= 4 use the triple dynamic program, orders 5 and 6 the state program."""
    rng = np.random.default_rng(order)
    for trial in range(60):
        lm = make_toy_lm(V=7, order=order, seed=100 * order + trial, undercut=True)
        s = random_case(rng, 7)
        hist = rng.integers(0, 7, size=int(rng.integers(0, 5))).tolist()
        alpha = float(rng.choice([0.3, 1.0, 2.5]))
        p = int(rng.integers(1, 12))
        d = rescore(s, lm, alpha, p, hist)
        assert_same(d, brute(s, lambda ids: lm.ref_score(hist[-(order - 1):], ids), alpha), p)


def test_triple_program_and_state_program_agree():
    """The two exact algorithms (``history`` given: triple DP; not given: the state program)."""
    rng = np.random.default_rng(9)
    for trial in range(30):
        lm = make_toy_lm(V=12, order=int(rng.integers(2, 5)), seed=500 + trial, density=0.7)
        A = lm_arrays(lm)
        s = Sausage.from_logits(rng.normal(size=(int(rng.integers(1, 7)), 12)), int(rng.integers(1, 6)))
        hist = rng.integers(0, 12, size=int(rng.integers(0, 4))).tolist()[-(lm.order - 1):]
        st = lm.state_for_history(hist)
        p = int(rng.integers(1, 9))
        a = exact_pbest(s.tokens, s.logp, s.widths, A, st, 1.3, p, history=hist)
        b = exact_pbest(s.tokens, s.logp, s.widths, A, st, 1.3, p)
        np.testing.assert_allclose(a[1], b[1], atol=1e-6)


@pytest.mark.parametrize("scan_row", [0, 10 ** 9])
def test_state_program_row_reads_and_repeated_candidates(scan_row):
    """Rows binary-searched (``scan_row=0``) or scanned whole, and a slot that repeats a token
    (the kernel then binary-searches every row; ``Sausage`` itself refuses repeats): the exact
    p best either way, against brute force over the raw arrays."""
    rng = np.random.default_rng(31 + (scan_row > 0))
    for trial in range(25):
        lm = make_toy_lm(V=40, order=5, seed=700 + trial, density=0.5)
        h, k = int(rng.integers(1, 5)), int(rng.integers(2, 5))
        tok = np.stack([rng.choice(40, size=k, replace=False) for _ in range(h)]).astype(np.int64)
        if trial % 3 == 0:
            tok[0, 1] = tok[0, 0]  # a repeated candidate
        hl = rng.normal(size=(h, k)) - 1.0
        widths = np.full(h, k, np.int64)
        hist = rng.integers(0, 40, size=int(rng.integers(0, 7))).tolist()[-4:]
        p = int(rng.integers(1, 10))
        cand, scores, _, _ = _state_pbest(tok, hl, widths, 1.0, p, lm.state_for_history(hist), scan_row,
                                          *lm_arrays(lm).lm_args(), *lm_arrays(lm).state_args())
        ref = sorted((sum(hl[i, c] for i, c in enumerate(cs)) + lm.ref_score(hist, [int(tok[i, c]) for i, c in
                      enumerate(cs)]) for cs in itertools.product(range(k), repeat=h)), reverse=True)
        np.testing.assert_allclose(scores, ref[:p], atol=1e-4, rtol=1e-6)


def test_exact_with_long_states_uses_hashed_rows():
    """V = 60 with dense contexts: rows longer than 16 arcs go through the hash tables."""
    rng = np.random.default_rng(7)
    lm = make_toy_lm(V=60, order=3, seed=3, density=0.6)
    assert np.diff(lm.state_offsets).max() > 16
    for trial in range(25):
        h, k = int(rng.integers(2, 5)), int(rng.integers(2, 5))
        s = Sausage.from_logits(rng.normal(size=(h, 60)), k)
        hist = rng.integers(0, 60, size=2).tolist()
        d = rescore(s, lm, 1.0, 5, hist)
        assert_same(d, brute(s, lambda ids: lm.ref_score(hist, ids), 1.0), 5)


def test_lookup_matches_reference_semantics():
    lm = make_toy_lm(V=9, order=4, seed=11)
    A = lm_arrays(lm)
    for st, ctx in enumerate(lm.contexts):
        for c in range(11):  # 9, 10 are outside the vocabulary
            ns, cost = lm_step(A, st, c)
            rc, rn = lm.ref_cost(ctx, c)
            assert cost == pytest.approx(rc, abs=1e-5) and lm.contexts[ns] == rn


def test_out_of_vocabulary_ids_cost_the_unseen_unigram():
    rng = np.random.default_rng(5)
    lm = make_toy_lm(V=6, order=3, seed=5)
    toks = [[0, 9], [1, 7, 2], [3]]  # 7 and 9 are outside 0..5
    s = Sausage.from_ragged(toks, [rng.normal(size=len(t)).astype(np.float32) - 2 for t in toks])
    d = rescore(s, lm, 1.0, 10, history=[0, 1])
    assert_same(d, brute(s, lambda ids: lm.ref_score([0, 1], ids), 1.0), 10)
    assert (d.scores[d.tokens.max(axis=1) >= 6] < -900).all()
    # an unknown id in the history restarts the context, never a crash
    d2 = rescore(s, lm, 1.0, 3, history=[4, 99])
    assert len(d2) == 3


def test_nbest_larger_than_the_lattice_returns_every_path():
    lm = make_toy_lm(V=6, order=3, seed=1)
    s = Sausage.from_logits(np.random.default_rng(0).normal(size=(3, 6)), 2)
    d = rescore(s, lm, 1.0, 100, history=[1])
    assert len(d) == 8 and d.truncated and d.requested == 100
    assert not rescore(s, lm, 1.0, 8, history=[1]).truncated


def test_history_longer_than_the_order_uses_the_last_n_minus_1():
    lm = make_toy_lm(V=6, order=3, seed=2)
    s = Sausage.from_logits(np.random.default_rng(1).normal(size=(3, 6)), 3)
    a = rescore(s, lm, 1.0, 4, history=[5, 4, 3, 2, 1, 0, 2])
    b = rescore(s, lm, 1.0, 4, history=[0, 2])
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.scores, b.scores)


def test_alpha_zero_and_base_drafts_rank_by_head_scores():
    rng = np.random.default_rng(3)
    s = Sausage.from_logits(rng.normal(size=(4, 9)), 3)
    ref = brute(s, lambda ids: 0.0, 0.0)
    assert_same(base_drafts(s, 7), ref, 7)
    assert_same(rescore(s, make_toy_lm(seed=1), 0.0, 7), ref, 7)
    np.testing.assert_array_equal(base_drafts(s, 1).tokens[0], s.top1())


def test_batch_equals_one_by_one():
    rng = np.random.default_rng(4)
    lm = make_toy_lm(V=8, order=3, seed=4)
    ss = Sausage.from_logits_batch(rng.normal(size=(5, 3, 8)), 3)
    hs = [rng.integers(0, 8, size=2).tolist() for _ in ss]
    out = rescore_batch(ss, lm, 0.7, 4, hs)
    for s, h, d in zip(ss, hs, out):
        e = rescore(s, lm, 0.7, 4, h)
        np.testing.assert_array_equal(d.tokens, e.tokens)
    with pytest.raises(InputError, match="one history per lattice"):
        rescore_batch(ss, lm, 0.7, 4, hs[:2])


def test_bad_arguments_are_input_errors():
    lm = make_toy_lm(seed=0)
    s = Sausage.from_logits(np.zeros((2, 6)), 2)
    with pytest.raises(InputError, match="alpha"):
        rescore(s, lm, -1.0)
    with pytest.raises(InputError, match="nbest"):
        rescore(s, lm, 1.0, 0)
    with pytest.raises(InputError, match="method"):
        rescore(s, lm, 1.0, 1, method="beam")


# ---- the WFST method ---------------------------------------------------------------------------


def test_lattice_binary_matches_fstcompile_text(tmp_path):
    pywrapfst = pytest.importorskip("pywrapfst")
    s = Sausage.from_ragged([[3, 1], [0], [2, 4, 5]], [[-0.5, -1.0], [-0.1], [-1, -2, -3]])
    a = pywrapfst.Fst.read_from_string(lattice_fst_bytes(s, 0.5))
    compiler = pywrapfst.Compiler(acceptor=True)
    compiler.write(s.to_fst_text(0.5))
    b = compiler.compile()
    assert pywrapfst.equal(a, b, delta=1e-6)


@pytest.mark.parametrize("order", [2, 3, 4])
def test_wfst_equals_brute_force_under_epsilon_semantics(order):
    """Composition + n-shortest is exact for what the epsilon automaton means: the best over
    every back-off choice (which undercuts the true score when backing off is cheaper)."""
    rng = np.random.default_rng(10 + order)
    undercuts = 0
    for trial in range(40):
        lm = make_toy_lm(V=7, order=order, seed=1000 + trial, undercut=True)
        s = random_case(rng, 7)
        hist = rng.integers(0, 7, size=order - 1).tolist()
        p = int(rng.integers(1, 8))
        d = rescore(s, lm, 1.5, p, hist, method="wfst")
        eps = brute(s, lambda ids: lm.ref_eps_score(hist, ids), 1.5)
        assert_same(d, eps, p, atol=2e-4)
        exact = brute(s, lambda ids: lm.ref_score(hist, ids), 1.5)
        undercuts += any(abs(a[0] - b[0]) > 1e-4 for a, b in zip(sorted(eps), sorted(exact)))
        same = all(abs(dict((tuple(x[1]), x[0]) for x in eps)[tuple(x[1])] - x[0]) < 1e-5 for x in exact)
        if same:  # no path is undercut: then the WFST's answer is the exact one
            assert_same(d, exact, p, atol=2e-4)
    assert undercuts > 0  # the random LMs do exercise the difference


# ---- a real KenLM model ------------------------------------------------------------------------


def _real_cases(ids, fst, rng, n, h_max=4, k_max=4):
    seen = np.nonzero(fst.arc_cost[fst.state_offsets[fst.unigram]:fst.state_offsets[fst.unigram + 1]]
                      < fst.unk_cost)[0]
    for _ in range(n):
        h = int(rng.integers(1, h_max + 1))
        k = int(rng.integers(1, k_max + 1))
        t = int(rng.integers(3, len(ids) - h))
        toks, lps = [], []
        for j in range(h):
            cand = {int(ids[t + j])} if ids[t + j] in seen else set()
            while len(cand) < k:
                cand.add(int(rng.choice(seen if rng.random() < 0.5 else ids[: t + 20])))
            cand = [c for c in cand if c in set(seen.tolist())][:k] or [int(seen[0])]
            toks.append(cand)
            lps.append(np.sort(rng.normal(size=len(cand)) - 1.5)[::-1].astype(np.float32))
        yield Sausage.from_ragged(toks, lps), ids[max(0, t - 5):t].tolist()


def test_exact_matches_kenlm_brute_force(real_lm):
    """Against KenLM itself: every path scored with kenlm.Model.BaseScore (log10 → ln)."""
    kenlm = pytest.importorskip("kenlm")
    fst, arpa, ids = real_lm
    model = kenlm.Model(str(arpa))


    rng = np.random.default_rng(0)
    for s, hist in _real_cases(ids, fst, rng, 25):
        hist = hist[-2:]
        if len(hist) < 2:
            continue
        p = int(rng.integers(1, 9))
        d = rescore(s, fst, 0.8, p, hist)
        assert_same(d, brute(s, lambda t: kenlm_logp(model, hist, t), 0.8), p, atol=2e-3)


def test_wfst_on_a_real_model_never_beats_exact_unless_it_undercuts(real_lm):
    fst, _, ids = real_lm
    rng = np.random.default_rng(1)
    for s, hist in _real_cases(ids, fst, rng, 30, h_max=4, k_max=4):
        state = fst.state_for_history(hist[-2:])
        e = rescore(s, fst, 1.0, 3, hist)
        w = rescore(s, fst, 1.0, 3, hist, method="wfst")
        assert w.scores[0] >= e.scores[0] - 1e-3  # epsilon semantics can only score higher
        # the WFST's best path under the true semantics is never better than the exact best
        true_w = s.path_logp(_cand(s, w.tokens[0])) - fst.exact_cost(state, w.tokens[0].tolist())[0]
        assert true_w <= e.scores[0] + 1e-3
        if abs(true_w - w.scores[0]) < 1e-4:  # not undercut on its own best path
            eps_of_exact = -fst.epsilon_cost(state, e.tokens[0].tolist())
            if abs(eps_of_exact - (e.scores[0] - s.path_logp(_cand(s, e.tokens[0])))) < 1e-4:
                assert w.scores[0] == pytest.approx(e.scores[0], abs=1e-3)


def _cand(s, toks):
    return np.array([int(np.nonzero(s.tokens[i] == t)[0][0]) for i, t in enumerate(toks)])


def test_package_exports_the_functions_not_modules():
    import latticedraft.lattice as lattice
    import latticedraft.lattice.rescoring  # noqa: F401  (importing the module must not shadow the function)

    assert callable(lattice.rescore) and lattice.rescore is latticedraft.lattice.rescoring.rescore
    assert lattice.Sausage.__name__ == "Sausage"

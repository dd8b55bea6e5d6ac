"""Corpus n-gram drafts: the LM's greedy continuation of each row's history as one path, rated
by the fitted LM table, cut to the row's room."""

import numpy as np
import pytest

from latticedraft.decoding.planning.acceptance import AcceptanceModel, head_bins
from latticedraft.decoding.proposers.base import Step
from latticedraft.decoding.proposers.lm_ngrams import LMNgrams, LMProposer
from latticedraft.errors import InputError
from latticedraft.lattice.lm_tables import lm_arrays
from tests.lattice.toylm import make_toy_lm


@pytest.fixture(scope="module")
def toy():
    lm = make_toy_lm(V=9, order=3, seed=3, density=0.5)
    return lm, lm_arrays(lm)


def test_continuation_is_the_reference_lms_greedy_walk_from_the_last_tokens(toy):
    lm, A = toy
    history = np.array([4, 1, 7, 2, 5], dtype=np.int64)
    toks, probs = LMNgrams(depth=5).continuation(A, history)
    ctx = lm.ref_state(tuple(history[-2:].tolist()))  # a 3-gram reads the last 2 tokens
    assert len(toks) == 5
    for t, p in zip(toks.tolist(), probs.tolist()):
        costs = [lm.ref_cost(ctx, c)[0] for c in range(lm.vocab_size)]
        assert t == int(np.argmin(costs))
        assert p == pytest.approx(np.exp(-costs[t]))
        ctx = lm.ref_cost(ctx, t)[1]


def test_proposals_are_cut_to_the_room_and_rated_by_the_lm_table(toy):
    _, A = toy
    model = AcceptanceModel.prior()
    model.table = lambda name: np.tile(np.arange(16)[None, :] / 100 + 0.01, (14, 1))  # rate = depth-coded
    prop = LMProposer(LMNgrams(depth=4), A)
    hist = [np.array([1, 2, 3], dtype=np.int64), np.array([8, 0], dtype=np.int64), np.array([5], dtype=np.int64)]
    step = Step(index=[0, 1, 2], rows=[0, 1, 2], histories=hist, rooms=[4, 2, 0], acceptance=model)
    out = prop.propose(step)
    for p, h, room in zip(out, hist, [4, 2, 0]):
        toks, probs = LMNgrams(depth=4).continuation(A, h)
        assert p.tokens.shape[1] == room and p.tokens[0].tolist() == toks[:room].tolist()
        if room:
            assert p.rates[0].tolist() == pytest.approx((np.arange(room) / 100 + 0.01).tolist())
            assert (head_bins(probs[:room]) >= 0).all()
    plain = prop.propose(Step(index=[0], rows=[0], histories=hist[:1], rooms=[4]))  # no acceptance: no rates
    assert plain[0].rates is None and plain[0].tokens.shape == (1, 4)


def test_lm_rates_read_the_table_by_probability_bin_and_depth():
    m = AcceptanceModel.prior()
    t = np.arange(14 * 3, dtype=float).reshape(14, 3)  # 3 depths: depth 3 reads the last column
    m.table = lambda name: t
    probs = np.array([0.95, 0.3, 0.01, 0.5])
    want = [t[head_bins(0.95), 0], t[head_bins(0.3), 1], t[head_bins(0.01), 2], t[head_bins(0.5), 2]]
    assert m.rates("lm", head_bins(probs)).tolist() == want


def test_depth_must_be_positive():
    with pytest.raises(InputError, match="--lm-drafts 0"):
        LMNgrams(depth=0)

"""The n-gram LM's greedy continuation against a pure-Python reference LM (``toylm.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from toylm import make_toy_lm

from latticedraft.lattice.lm_continuation import best_next, greedy_chain
from latticedraft.lattice.lm_tables import lm_arrays


def _true_costs(lm, ctx) -> np.ndarray:
    return np.array([lm.ref_cost(ctx, c)[0] for c in range(lm.vocab_size)])


@pytest.mark.parametrize("order,seed,positive", [(2, 0, True), (3, 1, True), (3, 2, False), (4, 3, True),
                                                  (4, 4, True), (5, 9, True)])
def test_best_next_is_the_arg_max_of_every_state(order, seed, positive):
    """Back-off weights above 1 (negative costs) included: a token the back-off state likes best
    may be one this state lists at a dearer cost, and then it is not the best here."""
    lm = make_toy_lm(V=7, order=order, seed=seed, density=0.4, positive_backoff=positive)
    A = lm_arrays(lm)
    labels, costs = best_next(A)
    for s, ctx in enumerate(lm.contexts):
        true = _true_costs(lm, ctx)
        want = int(np.flatnonzero(true <= true.min() + 1e-9)[0])  # ties: the lowest token
        assert int(labels[s]) - 1 == want, (ctx, true)
        assert costs[s] == pytest.approx(true[want], abs=1e-5)


@pytest.mark.parametrize("order,seed", [(3, 5), (4, 6)])
def test_greedy_chain_follows_best_next_with_the_exact_lm_costs(order, seed):
    lm = make_toy_lm(V=6, order=order, seed=seed, density=0.5)
    A = lm_arrays(lm)
    labels, _ = best_next(A)
    rng = np.random.default_rng(seed)
    for _ in range(20):
        context = rng.integers(0, lm.vocab_size, size=int(rng.integers(0, 5)))
        toks, costs = greedy_chain(context.astype(np.int64), 5, labels, *A.lm_args())
        ctx = lm.ref_state(tuple(int(t) for t in context))
        assert len(toks) == 5
        for t, c in zip(toks.tolist(), costs.tolist()):
            assert t == int(labels[lm.index[ctx]]) - 1
            want, ctx = lm.ref_cost(ctx, t)
            assert c == pytest.approx(want, abs=1e-6)


def test_best_next_is_cached_on_the_arrays():
    A = lm_arrays(make_toy_lm(V=5, order=3, seed=7))
    assert best_next(A) is best_next(A)


def test_greedy_chain_depth_zero_and_empty_context():
    lm = make_toy_lm(V=5, order=3, seed=8)
    A = lm_arrays(lm)
    labels, _ = best_next(A)
    toks, costs = greedy_chain(np.zeros(0, dtype=np.int64), 0, labels, *A.lm_args())
    assert toks.shape == (0,) and costs.shape == (0,)
    toks, _ = greedy_chain(np.zeros(0, dtype=np.int64), 1, labels, *A.lm_args())
    assert int(toks[0]) == int(labels[lm.index[()]]) - 1  # no context: the null state's best

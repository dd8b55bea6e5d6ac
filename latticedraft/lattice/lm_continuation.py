"""The n-gram LM's greedy continuation: each state's most likely next token, and chains of them.

``best_next`` finds, once per LM, each state's most likely next label under KenLM's back-off
semantics (a token listed by a state costs its arc there; any other costs the back-off plus its
cost at the back-off state, recursively). ``greedy_chain`` walks a context from the null state
with the exact LM step (``lm_tables._step``, back-off included) and then follows the best
labels. Both live in this package so that numba's cache is dropped with ``_step``'s source
(``_numba_cache``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from latticedraft.lattice.lm_tables import _find, _step


def best_next(arrays) -> tuple[np.ndarray, np.ndarray]:
    """Per LM state, its most likely next label (token + 1) and that label's cost (-ln p): int32[S],
    float64[S] (ties: the lower label); cached on ``arrays``."""
    got = getattr(arrays, "_best_next", None)
    if got is not None:
        return got
    got = _best_next(_by_cost(arrays.offsets, arrays.costs), *arrays.lm_args())
    try:
        object.__setattr__(arrays, "_best_next", got)
    except (AttributeError, TypeError):
        pass
    return got


@njit(cache=True)
def _by_cost(off, cost):
    """Arc ids, each state's cheapest first (stable: equal costs keep the CSR's label order)."""
    out = np.empty(off[-1], dtype=np.int64)
    for s in range(len(off) - 1):
        lo, hi = off[s], off[s + 1]
        out[lo:hi] = lo + np.argsort(cost[lo:hi], kind="mergesort")
    return out


@njit(cache=True)
def _best_next(by_cost, off, lab, cost, nxt, bon, boc, uni, V, unk, tab):
    """``best_next``'s kernel. A token's cost after state s is that of the first state on s's
    back-off chain that lists it, plus the back-off costs on the way (``_step``); so at each state
    t of the chain, scanned cheapest arc first, the first token no earlier state lists is t's
    candidate (a dearer arc of t cannot beat it), and the cheapest candidate wins."""
    S = len(off) - 1
    labels = np.zeros(S, dtype=np.int32)
    costs = np.full(S, np.inf)
    chain = np.empty(64, dtype=np.int64)
    for s in range(S):
        best, label, acc, t, n = np.inf, 0, 0.0, s, 0
        while True:
            for i in range(off[t], off[t + 1]):
                a = by_cost[i]
                c = acc + cost[a]
                if c > best or (c == best and lab[a] > label):
                    break  # (ties: the lower label)
                listed = False
                for k in range(n):
                    if _find(chain[k], lab[a], off, lab, tab) >= 0:
                        listed = True
                        break
                if not listed:
                    best, label = c, lab[a]
                    break
            if t == uni or bon[t] < 0 or n == len(chain):
                break
            chain[n] = t
            n += 1
            acc += boc[t]
            t = bon[t]
        labels[s] = label
        costs[s] = best if label > 0 else unk
    return labels, costs


@njit(cache=True)
def greedy_chain(context, depth, best_l, off, lab, cost, nxt, bon, boc, uni, V, unk, tab):
    """From the null state, walk ``context`` (token ids), then follow the best label ``depth`` times:
    (tokens int64[depth], costs float64[depth])."""
    s = uni
    for t in context:
        s = _step(s, t + 1, off, lab, cost, nxt, bon, boc, uni, V, unk, tab)[0]
    toks = np.empty(depth, dtype=np.int64)
    costs = np.empty(depth, dtype=np.float64)
    for d in range(depth):
        label = best_l[s]
        if label < 1:
            return toks[:d], costs[:d]
        s, c = _step(s, label, off, lab, cost, nxt, bon, boc, uni, V, unk, tab)
        toks[d] = label - 1
        costs[d] = c
    return toks, costs

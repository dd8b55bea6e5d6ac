"""Exact p-best search of a sausage lattice under an n-gram LM (numba over ``NgramFst`` arrays).

The score of a path ``y`` is ``sum_i head_logp[i, y_i] + alpha * ln p_LM(y_i | history, y_<i)``
with true back-off semantics (a lookup that misses a state adds the state's back-off cost
and retries at its back-off state, exactly like KenLM's ``BaseScore``).

``exact_pbest`` picks one of two exact algorithms (neither is a beam):

A. *Order <= 4* (``triple_dp``, the bundled 4-gram): a backward dynamic program over the
   lattice's candidate triples gives the exact best score of every suffix; a best-first
   search over prefixes with it as the heuristic pops the p best paths.
B. *Any order* (``bounded_search``, used above order 4): admissible suffix bounds from the
   LM's bound tables, a beam pass for a lower bound, then a pruned exact dynamic program over
   LM states.

Without an LM (or ``alpha = 0``) the p best by head score come from ``best_first``. The LM's
arrays and tables (``lm/search_tables.py``) are written by ``lm build`` and memory-mapped by
``NgramLM``; for other ``NgramFst`` objects ``lm_tables.lm_arrays`` builds them in memory.

A dynamic program over reachable LM states alone (no bound tables, merging prefixes only by
state) was tried for orders 5-6 and dropped: on a 51 M n-gram 5-gram it kept ~1300 states
per 8x16 lattice and cost 3-5x the bounded search's CPU time at 8x16 (equal at 16x16): a bound that
ignores the context (each token's best ln p anywhere) prunes little.

Why not more Python or a capped beam: a KenLM-state search in Python is exact but ~5 ms at
8x16, and capping states per slot loses the exact best on a fifth of lattices; the bound lets
the compiled search drop almost everything while staying exact (tests compare against
brute-force enumeration, KenLM's own scores and random back-off LMs with weights above 1).

Everything inside is float64; returned scores are float32.
"""

from __future__ import annotations

import numpy as np

from latticedraft.lattice.best_first import _base_pbest
from latticedraft.lattice.bounded_search import _context_bound, _pbest
from latticedraft.lattice.lm_tables import UNSEEN_COST, LMArrays, _step, _walk, build_arrays
from latticedraft.lattice.triple_dp import _triple_pbest

__all__ = ["context_bound", "exact_pbest", "history_state", "lm_step", "warm_up"]


def exact_pbest(tokens: np.ndarray, logp: np.ndarray, widths: np.ndarray, arrays: LMArrays | None,
                start: int, alpha: float, p: int, hist_last: int = -1, with_counts: bool = False,
                history=None):
    """Exact p best of a sausage (``tokens int64[h,k]``, ``logp float32[h,k]``, ``widths int64[h]``).

    ``start``: the LM state of the history; ``history``: its last ``order - 1`` ids (enables the
    triple dynamic program for LMs of order <= 4); ``hist_last``: the history's last id (-1: an
    empty history, i.e. ``<s>``). ``arrays=None`` or ``alpha=0`` ranks by head log-probability
    alone. Returns ``(cand int64[m, h], scores float64[m])``: candidate indices per slot, best
    first; with ``with_counts`` also two work counters (nodes of the two passes).
    """
    hl = logp.astype(np.float64)
    if arrays is None or alpha == 0.0:
        r = _base_pbest(hl, widths, int(p))
    elif arrays.triple is not None and history is not None:
        T, W, H, hp = _extend(tokens, hl, widths, arrays.vocab_size, arrays.order, history)
        r = _triple_pbest(T, W, H, hp, float(alpha), int(p), int(start), *arrays.lm_args(), arrays.uni_logp,
                          *arrays.triple)
    else:
        A = arrays
        hb = A.vocab_size if hist_last < 0 else int(hist_last)
        r = _pbest(tokens, hl, widths, float(alpha), int(p), int(start), hb, *A.lm_args(), *A.bound_args())
    return r if with_counts else (r[0], r[1])


def _extend(tokens, hl, widths, V, order, history):
    """The lattice with the history's context tokens as width-1 pseudo-slots in front.

    The context is the last ``order - 1`` ids, preceded by ``<s>`` (code ``V``) when the
    history is shorter, as ``NgramFst.state_for_history`` does; at most three are kept (the
    state of an order <= 4 model depends on no more). Ids outside the vocabulary become
    ``V + 1`` (all unknown ids behave alike).
    """
    n = order - 1
    hist = [int(t) for t in history]
    ctx = ([V] + hist) if len(hist) < n else hist[len(hist) - n:]
    ctx = [t if t < V or t == V and i == 0 and len(hist) < n else V + 1 for i, t in enumerate(ctx)] if n > 0 else []
    pseudo = ctx[-3:]
    hp = len(pseudo)
    h, k = tokens.shape
    T = np.full((hp + h, k), -1, dtype=np.int64)
    T[hp:] = np.where(tokens >= V, V + 1, tokens)
    if hp:
        T[:hp, 0] = pseudo
    W = np.concatenate([np.ones(hp, dtype=np.int64), widths.astype(np.int64)])
    H = np.zeros((hp + h, k))
    H[hp:] = np.where(np.isfinite(hl), hl, -np.inf)
    return T, W, H, hp


def history_state(arrays: LMArrays, order: int, history: list[int]) -> int:
    """``NgramFst.state_for_history`` in compiled code: the state after the last n-1 ids, from
    ``<s>`` when the history is shorter than n-1 (ids must be in the vocabulary)."""
    if order == 1:
        return arrays.unigram
    h = history[-(order - 1):]
    s = arrays.start if len(h) < order - 1 else arrays.unigram
    return int(_walk(s, np.asarray(h, dtype=np.int64), *arrays.lm_args()))


def warm_up(bounded: bool = True) -> None:
    """Compile (or load from numba's on-disk cache) every kernel on a tiny hand-made LM, so the
    first real call does not pay for compilation (~20-40 s on a cold cache, 2 cores)."""
    from types import SimpleNamespace

    V = 3
    # states: 0 null (arcs 1..3), 1 <s> (arc 1 -> 2), 2 the context "0" (arc 2 -> 0)
    fst = SimpleNamespace(
        order=3, vocab_size=V, start=1, unigram=0, unk_cost=UNSEEN_COST,
        state_offsets=np.array([0, 3, 4, 5], np.int64), arc_label=np.array([1, 2, 3, 1, 2], np.int32),
        arc_cost=np.array([1.0, 1.5, 2.0, 0.5, 0.7], np.float32), arc_next=np.array([2, 0, 0, 2, 0], np.int32),
        backoff_next=np.array([-1, 0, 0], np.int32), backoff_cost=np.array([0.0, 0.3, 0.4], np.float32))
    A = build_arrays(fst)
    tok = np.array([[0, 1], [1, 2]], np.int64)
    lp = np.log(np.array([[0.6, 0.4], [0.7, 0.3]], np.float32))
    w = np.array([2, 2], np.int64)
    exact_pbest(tok, lp, w, A, 1, 1.0, 2, history=[])
    from latticedraft.lattice.batched import pbest_batch  # the kernel rescore uses (order <= 4)

    pbest_batch(tok[None], lp[None], w[None], np.array([2]), np.zeros((1, 2), np.int64), np.zeros(1, np.int64),
                A, 1.0, 2)
    exact_pbest(tok, lp, w, None, 0, 0.0, 2)
    history_state(A, 3, [0, 1])
    if bounded:
        exact_pbest(tok, lp, w, A, 1, 1.0, 2)


def lm_step(arrays: LMArrays, state: int, token_id: int) -> tuple[int, float]:
    """(next_state, cost) with exact back-off; the kernels' own lookup, exposed for tests."""
    ns, c = _step(int(state), int(token_id) + 1, *arrays.lm_args())
    return int(ns), float(c)


def context_bound(arrays: LMArrays, b_tok: int, a_tok: int, c_tok: int) -> float:
    """Upper bound of ln p(c | any context ending in (b, a)) (``b = -1``: ``<s>``); for tests."""
    A = arrays
    b = A.vocab_size if b_tok < 0 else int(b_tok)
    uni_logp, ctx1, ctx1_gain, dflt, t1_off, t1_lab, t1_hash, t2_off, t2_lab, t2_val, t2_hash = A.bound_args()
    return float(_context_bound(b, int(a_tok), int(c_tok), A.offsets, A.labels, A.costs, uni_logp, ctx1,
                                ctx1_gain, dflt, A.vocab_size, A.unk_cost, A.arc_hash, t1_off, t1_lab, t1_hash,
                                t2_off, t2_lab, t2_val, t2_hash))

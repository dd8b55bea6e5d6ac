"""Exact p-best search of a sausage lattice under an n-gram LM (numba over ``NgramFst`` arrays).

The score of a path ``y`` is ``sum_i head_logp[i, y_i] + alpha * ln p_LM(y_i | history, y_<i)``
with true back-off semantics (a lookup that misses a state adds the state's back-off cost
and retries at its back-off state, exactly like KenLM's ``BaseScore``).

``exact_pbest`` picks one of two exact algorithms (neither is a beam):

A. *Order <= 4* (``triple_dp``, the bundled 4-gram): a backward dynamic program over the
   lattice's candidate triples gives the exact best score of every suffix; a best-first
   search over prefixes with it as the heuristic pops the p best paths.
B. *Any order* (``state_dp``, used above order 4): a forward dynamic program over the LM
   states the lattice reaches (the best path into each), closed under back-off so that a
   state's step to each candidate reuses its back-off state's (one read of its own arcs, no
   back-off walks); for p > 1 a backward pass and a best-first search pop the p best.

``rescore``/``rescore_batch`` run both through the batch kernels (``batched``). Measured on the
bundled 4-gram with real heads, A stays faster than B (8x16: 0.6-0.7 vs 0.9-1.2 ms 1-best),
so orders <= 4 keep it; on simulated heads and on a 26 M n-gram 4-gram the two are close.

Without an LM (or ``alpha = 0``) the p best by head score come from ``best_first``. The LM's
arrays and tables (``lm/search_tables.py``) are written by ``lm build`` and memory-mapped by
``NgramLM``; for other ``NgramFst`` objects ``lm_tables.lm_arrays`` builds them in memory.

Why not a bounded search with precomputed context bounds (the previous algorithm above order
4): its bound tables cost a 5.5 GB, 3.5-minute pass per 51 M n-gram build and it still
explored tens of thousands of nodes at 16x16 (21 ms); the state program touches a few
hundred states per slot and needs no table beyond the CSR arrays. Its cost on a virtual
machine is dominated by TLB misses on the gigabyte-sized tables, so rows of up to
``state_dp.SCAN_ROW`` arcs are read whole and longer ones binary-searched (a few pages)
rather than probed through the arc hash (two random pages per candidate).

Everything inside is float64; returned scores are float32.
"""

from __future__ import annotations

import numpy as np

from latticedraft.lattice.best_first import _base_pbest
from latticedraft.lattice.lm_tables import UNSEEN_COST, LMArrays, _step, _walk, build_arrays
from latticedraft.lattice.state_dp import SCAN_ROW, _state_pbest
from latticedraft.lattice.triple_dp import _triple_pbest

__all__ = ["exact_pbest", "history_state", "lm_step", "warm_up"]


def exact_pbest(tokens: np.ndarray, logp: np.ndarray, widths: np.ndarray, arrays: LMArrays | None,
                start: int, alpha: float, p: int, with_counts: bool = False, history=None):
    """Exact p best of a sausage (``tokens int64[h,k]``, ``logp float32[h,k]``, ``widths int64[h]``).

    ``start``: the LM state of the history; ``history``: its last ``order - 1`` ids (enables the
    triple dynamic program for LMs of order <= 4; without it the state program runs).
    ``arrays=None`` or ``alpha=0`` ranks by head log-probability alone. Returns
    ``(cand int64[m, h], scores float64[m])``: candidate indices per slot, best first; with
    ``with_counts`` also two work counters (search nodes, partial paths kept).
    """
    hl = logp.astype(np.float64)
    if arrays is None or alpha == 0.0:
        r = _base_pbest(hl, widths, int(p))
    elif arrays.triple is not None and history is not None:
        T, W, H, hp = _extend(tokens, hl, widths, arrays.vocab_size, arrays.order, history)
        r = _triple_pbest(T, W, H, hp, float(alpha), int(p), int(start), *arrays.lm_args(), arrays.uni_logp,
                          *arrays.triple)
    else:
        r = _state_pbest(tokens, hl, widths, float(alpha), int(p), int(start), SCAN_ROW, *arrays.lm_args(),
                         *arrays.state_args())
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


def warm_up(order: int = 0) -> None:
    """Compile (or load from numba's on-disk cache) the kernels an LM of ``order`` uses (0:
    every kernel) on a tiny hand-made LM, so the first real call does not pay for compilation
    (~20-40 s on a cold cache, 2 cores)."""
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
    from dataclasses import replace

    from latticedraft.lattice.batched import pbest_batch  # the kernels rescore uses

    args = (tok[None], lp[None], w[None], np.array([2]), np.zeros((1, 2), np.int64), np.zeros(1, np.int64))
    if order <= 4:
        pbest_batch(*args, A, 1.0, 2)
    if order == 0 or order > 4:
        pbest_batch(*args, replace(A, triple=None), 1.0, 2)
    exact_pbest(tok, lp, w, None, 0, 0.0, 2)
    history_state(A, 3, [0, 1])  # the wfst method's history walk

def lm_step(arrays: LMArrays, state: int, token_id: int) -> tuple[int, float]:
    """(next_state, cost) with exact back-off; the kernels' own lookup, exposed for tests."""
    ns, c = _step(int(state), int(token_id) + 1, *arrays.lm_args())
    return int(ns), float(c)

"""Exact p-best search of a sausage lattice under an n-gram LM (numba over ``NgramFst`` arrays).

The score of a path ``y`` is ``sum_i head_logp[i, y_i] + alpha * ln p_LM(y_i | history, y_<i)``
with true back-off semantics (a lookup that misses a state adds the state's back-off cost
and retries at its back-off state, exactly like KenLM's ``BaseScore``).

``exact_pbest`` runs ``state_dp`` for every order: a forward dynamic program over the LM
states each slot reaches (closed under back-off, so a state's step to each candidate reuses
its back-off state's), then, for p > 1, a backward pass and a best-first search that pops the
p best distinct paths. Without an LM (or ``alpha = 0``) the p best by head score come from
``best_first``. The LM's arrays (``lm/search_tables.py``) are written by ``lm build`` and
memory-mapped by ``NgramLM``; for other ``NgramFst`` objects ``lm_tables.lm_arrays`` builds
them in memory.

Earlier algorithms, measured and dropped: a backward dynamic program over candidate triples
with packed three-token context tables (orders <= 4; 15-30 % slower than the state program on
the bundled 4-gram and on a 30 M n-gram 4-gram, and its tables cost memory and build time),
and for higher orders a bounded search with precomputed context bounds (a 5.5 GB,
3.5-minute table pass per 51 M n-gram build and 21 ms at 16x16). The state program touches
a few hundred states per slot and needs no table beyond the CSR arrays; on a virtual machine
its cost is dominated by TLB misses on the gigabyte tables, hence rows scanned or
binary-searched rather than hashed (``state_dp``).

Everything inside is float64; returned scores are float32.
"""

from __future__ import annotations

import numpy as np

from latticedraft.lattice.best_first import _base_pbest
from latticedraft.lattice.lm_tables import UNSEEN_COST, LMArrays, _step, _walk, build_arrays
from latticedraft.lattice.state_dp import SCAN_ROW, _state_pbest

__all__ = ["exact_pbest", "history_state", "lm_step", "warm_up"]


def exact_pbest(tokens: np.ndarray, logp: np.ndarray, widths: np.ndarray, arrays: LMArrays | None,
                start: int, alpha: float, p: int, with_counts: bool = False):
    """Exact p best of a sausage (``tokens int64[h,k]``, ``logp float32[h,k]``, ``widths int64[h]``).

    ``start``: the LM state of the history. ``arrays=None`` or ``alpha=0`` ranks by head
    log-probability alone. Returns ``(cand int64[m, h], scores float64[m])``: candidate
    indices per slot, best first; with ``with_counts`` also two work counters (search nodes,
    paths and best-first items).
    """
    hl = logp.astype(np.float64)
    if arrays is None or alpha == 0.0:
        r = _base_pbest(hl, widths, int(p))
    else:
        r = _state_pbest(tokens, hl, widths, float(alpha), int(p), int(start), SCAN_ROW, *arrays.lm_args())
    return r if with_counts else (r[0], r[1])


def history_state(arrays: LMArrays, order: int, history: list[int]) -> int:
    """``NgramFst.state_for_history`` in compiled code: the state after the last n-1 ids, from
    ``<s>`` when the history is shorter than n-1 (ids must be in the vocabulary)."""
    if order == 1:
        return arrays.unigram
    h = history[-(order - 1):]
    s = arrays.start if len(h) < order - 1 else arrays.unigram
    return int(_walk(s, np.asarray(h, dtype=np.int64), *arrays.lm_args()))


def warm_up() -> None:
    """Compile (or load from numba's on-disk cache) every kernel on a tiny hand-made LM, so the
    first real call does not pay for compilation (~20 s on a cold cache, 2 cores)."""
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
    from latticedraft.lattice.batched import pbest_batch  # the kernel rescore uses

    for p in (1, 2):
        pbest_batch(tok[None], lp[None], w[None], np.array([2]), np.zeros((1, 2), np.int64),
                    np.zeros(1, np.int64), A, 1.0, p)
    exact_pbest(tok, lp, w, None, 0, 0.0, 2)
    history_state(A, 3, [0, 1])


def lm_step(arrays: LMArrays, state: int, token_id: int) -> tuple[int, float]:
    """(next_state, cost) with exact back-off; the kernels' own lookup, exposed for tests."""
    ns, c = _step(int(state), int(token_id) + 1, *arrays.lm_args())
    return int(ns), float(c)

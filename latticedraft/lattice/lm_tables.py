"""The n-gram LM as arrays for the compiled searches: ``LMArrays``, its bound and context tables, and the exact LM step.

``LMArrays`` holds an ``NgramFst``'s CSR arrays in the dtypes the kernels take (built once
per LM by ``lm_arrays`` and cached on the FST), plus the tables the searches read:

- *bound tables* (``bounded_search``): for a token ``c`` after a context ending in ``(b, a)``,
  the best arc for ``c`` over all states of two or more tokens ending in ``(b, a)``, over the
  one-token state ``(a)`` and over the null state, each plus the largest back-off gain a
  longer context can collect on its way down (back-off weights can exceed 1, so this is not
  assumed to be 0);
- *triple tables* (``triple_dp``, order <= 4 only): the states of two and three tokens,
  addressable by their tokens, packed with their arc range and back-off (``_triple_tables``).

``_step`` is the exact LM step with true back-off semantics (a lookup that misses a state
adds the state's back-off cost and retries at its back-off state, exactly like KenLM's
``BaseScore``): short CSR rows are scanned, long rows go through an open-addressing hash
table (``_build_hash``, ``_find``); ``_step_memo`` memoises the back-off tail per search.
Costs are ``-ln p`` (float32 arrays, float64 in the kernels). The kernels here are inlined into
``triple_dp``, ``bounded_search`` and ``batched``; numba's on-disk cache does not notice edits in
another file, so importing ``latticedraft.lattice`` drops caches older than any of its sources
(``_numba_cache.drop_stale``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from latticedraft.errors import ModelError

UNSEEN_COST = 1000.0  # -ln p of an id the LM has never seen (the paper's Appendix D convention)
# packed context entries of the order <= 4 tables (see _triple_tables); arc indices are int32
P2_ENTRY = np.dtype([("lo", "i4"), ("hi", "i4"), ("xlo", "i4"), ("xhi", "i4"), ("bo", "i4"), ("boc", "f4")],
                    align=True)
X3_ENTRY = np.dtype([("lo", "i4"), ("hi", "i4"), ("boc", "f4")], align=True)


@dataclass
class LMArrays:
    """The CSR arrays of an ``NgramFst`` in the dtypes the kernels take, plus bound tables.

    Bound tables (natural log, float64), for a token ``c`` after a context ending in ``(b, a)``:
    ``ctx1[a]``: the state of the one-token context ``(a)`` (-1 if the model keeps none),
    ``ctx1_gain[a]``: the largest back-off gain any longer context collects down to it,
    ``dflt[a]``: the largest gain down to the null state; ``t1_*`` maps ``(b, a)`` (``b = V``
    is ``<s>``) to a row of ``t2_*``, which holds, per label ``c+1``, the best
    ``ln p(c | s) + gain(s)`` over the states ``s`` of two or more tokens ending in ``(b, a)``.
    ``*_hash``: open-addressing tables over the long CSR rows (see ``_find``).
    """

    vocab_size: int
    offsets: np.ndarray
    labels: np.ndarray
    costs: np.ndarray
    nexts: np.ndarray
    bo_next: np.ndarray
    bo_cost: np.ndarray
    unigram: int
    start: int
    unk_cost: float
    arc_hash: np.ndarray
    uni_logp: np.ndarray
    ctx1: np.ndarray
    ctx1_gain: np.ndarray
    dflt: np.ndarray
    t1_off: np.ndarray
    t1_lab: np.ndarray
    t1_hash: np.ndarray
    t2_off: np.ndarray
    t2_lab: np.ndarray
    t2_val: np.ndarray
    t2_hash: np.ndarray
    order: int = 0
    triple: tuple | None = None  # exact (x, b, a) context tables when order <= 4, see _triple_tables

    def bound_args(self) -> tuple:
        return (self.uni_logp, self.ctx1, self.ctx1_gain, self.dflt, self.t1_off, self.t1_lab,
                self.t1_hash, self.t2_off, self.t2_lab, self.t2_val, self.t2_hash)

    def lm_args(self) -> tuple:
        return (self.offsets, self.labels, self.costs, self.nexts, self.bo_next, self.bo_cost,
                self.unigram, self.vocab_size, self.unk_cost, self.arc_hash)


def _fingerprint(fst) -> tuple:
    return (id(fst.state_offsets), id(fst.arc_label), id(fst.arc_cost), id(fst.arc_next),
            id(fst.backoff_next), id(fst.backoff_cost), int(fst.start), int(fst.unigram),
            float(getattr(fst, "unk_cost", UNSEEN_COST)))


def lm_arrays(fst) -> LMArrays:
    """``LMArrays`` for an ``NgramFst``, cached on the object (~1 s for millions of arcs).

    The cache is rebuilt when any of the FST's arrays is replaced (e.g. ``set_unk_cost``).
    """
    key = _fingerprint(fst)
    cached = getattr(fst, "_lattice_search_arrays", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    arr = _build_arrays(fst)
    try:
        object.__setattr__(fst, "_lattice_search_arrays", (key, arr))
    except (AttributeError, TypeError):
        pass
    return arr


def _build_arrays(fst) -> LMArrays:
    V = int(fst.vocab_size)
    off = np.ascontiguousarray(fst.state_offsets, dtype=np.int64)
    lab = np.ascontiguousarray(fst.arc_label, dtype=np.int32)
    cost = np.ascontiguousarray(fst.arc_cost, dtype=np.float32)
    nxt = np.ascontiguousarray(fst.arc_next, dtype=np.int32)
    bon = np.ascontiguousarray(fst.backoff_next, dtype=np.int32)
    boc = np.ascontiguousarray(fst.backoff_cost, dtype=np.float32)
    S = len(bon)
    uni = int(fst.unigram)
    if len(off) != S + 1 or off[-1] != len(lab):
        raise ModelError(f"NgramFst arrays disagree: {S} states, {len(off)} offsets, {len(lab)} arcs")
    ulo, uhi = off[uni], off[uni + 1]
    if uhi - ulo != V or not np.array_equal(lab[ulo:uhi], np.arange(1, V + 1, dtype=np.int32)):
        raise ModelError(
            f"the n-gram FST's unigram state has {uhi - ulo} arcs, expected one for every label 1..{V}; "
            "rebuild the LM with `latticedraft lm build`"
        )
    uni_logp = -cost[ulo:uhi].astype(np.float64)

    # depth of each state along its back-off chain; gain_into[s] = the largest total back-off
    # log-weight a context can collect on its way down to s (0: the context is s itself).
    depth = np.zeros(S, dtype=np.int64)
    cur = bon.astype(np.int64)
    for _ in range(64):
        live = cur >= 0
        if not live.any():
            break
        depth += live
        cur = np.where(live, bon[np.maximum(cur, 0)], -1)
    gain = np.zeros(S, dtype=np.float64)
    for d in range(int(depth.max()), 0, -1):
        idx = np.nonzero((depth == d) & (bon >= 0))[0]
        np.maximum.at(gain, bon[idx], gain[idx] - boc[idx].astype(np.float64))

    last = np.full(S, -1, dtype=np.int64)
    last[nxt] = lab.astype(np.int64) - 1
    last[uni] = -1
    arc_state = np.repeat(np.arange(S, dtype=np.int64), np.diff(off))
    # the one-token context (a): where the null state's arc for a leads (the null state if none)
    ctx1 = nxt[ulo:uhi].astype(np.int64)
    ctx1[ctx1 == uni] = -1
    is_ctx1 = np.zeros(S, dtype=bool)
    is_ctx1[ctx1[ctx1 >= 0]] = True
    long_state = (last >= 0) & ~is_ctx1
    long_state[uni] = False
    # second-to-last token of a long state = last token of any state with an arc into it
    code = last.copy()
    code[int(fst.start)] = V  # <s>
    prev = np.full(S, -1, dtype=np.int64)
    into_long = long_state[nxt]
    prev[nxt[into_long]] = code[arc_state[into_long]]
    ok = long_state & (prev >= 0)

    sel = ok[arc_state]
    a_state = arc_state[sel]
    key1 = prev[a_state] * (V + 1) + last[a_state]
    a_lab = lab[sel].astype(np.int64)
    a_val = -cost[sel].astype(np.float64) + gain[a_state]
    order = np.lexsort((a_lab, key1))
    key1, a_lab, a_val = key1[order], a_lab[order], a_val[order]
    if len(key1):
        brk = np.concatenate([[True], (np.diff(key1) != 0) | (np.diff(a_lab) != 0)])
        starts = np.nonzero(brk)[0]
        key1, a_lab = key1[starts], a_lab[starts]
        a_val = np.maximum.reduceat(a_val, starts)
        rstart = np.nonzero(np.concatenate([[True], np.diff(key1) != 0]))[0]
    else:
        rstart = np.zeros(0, np.int64)
    rkeys = key1[rstart]
    t1_off = np.searchsorted(rkeys // (V + 1), np.arange(V + 2)).astype(np.int64)
    t1_lab = (rkeys % (V + 1) + 1).astype(np.int32)
    t2_off = np.concatenate([rstart, [len(key1)]]).astype(np.int64)
    t2_lab = a_lab.astype(np.int32)

    ctx1_gain = np.where(ctx1 >= 0, gain[np.maximum(ctx1, 0)], 0.0)
    dflt = np.zeros(V, dtype=np.float64)
    to_uni = np.nonzero((bon == uni) & (last >= 0) & (last < V))[0]
    np.maximum.at(dflt, last[to_uni], gain[to_uni] - boc[to_uni].astype(np.float64))
    arrays = LMArrays(V, off, lab, cost, nxt, bon, boc, uni, int(fst.start),
                    float(getattr(fst, "unk_cost", UNSEEN_COST)), _build_hash(off, lab, uni), uni_logp,
                    ctx1, ctx1_gain, dflt, t1_off, t1_lab, _build_hash(t1_off, t1_lab, -1),
                    t2_off, t2_lab, a_val.astype(np.float64), _build_hash(t2_off, t2_lab, -1),
                    int(fst.order))
    if int(fst.order) <= 4:
        arrays.triple = _triple_tables(V, int(fst.start), uni, off, nxt, bon, boc, last, long_state, prev, ctx1,
                                       arc_state)
    return arrays


def _triple_tables(V, start, uni, off, nxt, bon, boc, last, long_state, prev, ctx1, arc_state) -> tuple | None:
    """The states of two and three tokens, addressable by their tokens (order <= 4 only).

    Returns ``(ctx1x, p2_off, p2_lab, p2, x_lab, x3)``: ``ctx1x[a]`` the one-token state of
    ``a`` (``a = V``: ``<s>``, the start state); a CSR over ``b`` (0..V) with labels ``a+1``
    whose entry ``r`` is the context ``(b, a)``: ``p2[r]`` (``P2_ENTRY``) holds its state's arc
    range ``lo:hi``, its back-off state and cost, and the range ``xlo:xhi`` of its three-token
    contexts ``(x, b, a)`` in ``x_lab`` (labels ``x+1``, ascending; ``x = V``: ``<s>``) and
    ``x3`` (``X3_ENTRY``: arc range and back-off cost; they back off to ``(b, a)``). The packing
    saves the chained look-ups state -> offsets -> back-off (~16 bytes per context, ~20 MB for
    the bundled 4-gram). ``None`` when arc indices exceed int32 (the bounded search is used).
    """
    S = len(bon)
    if off[-1] >= 2 ** 31:
        return None
    ctx1x = np.concatenate([ctx1, [start]]).astype(np.int64)
    three = long_state & (bon >= 0)
    three &= long_state[np.maximum(bon, 0)]
    two = long_state & ~three & (prev >= 0)
    # third-to-last token of a three-token state = second-to-last of a state with an arc into it
    third = np.full(S, -1, dtype=np.int64)
    into3 = three[nxt]
    src = arc_state[into3]
    third[nxt[into3]] = np.where(long_state[src], prev[src], -1)
    three &= third >= 0
    s2 = np.nonzero(two)[0]
    key2 = prev[s2] * (V + 1) + last[s2]
    o = np.argsort(key2, kind="stable")
    s2, key2 = s2[o], key2[o]
    p2_off = np.searchsorted(key2 // (V + 1), np.arange(V + 2)).astype(np.int64)
    p2_lab = (key2 % (V + 1) + 1).astype(np.int32)
    s3 = np.nonzero(three)[0]
    # parent two-token entry of each three-token state: its back-off state
    pos = np.full(S, -1, dtype=np.int64)
    pos[s2] = np.arange(len(s2))
    par = pos[bon[s3]]
    ok = par >= 0
    s3, par = s3[ok], par[ok]
    o = np.lexsort((third[s3], par))
    s3, par = s3[o], par[o]
    x_off = np.searchsorted(par, np.arange(len(s2) + 1)).astype(np.int64)
    x_lab = (third[s3] + 1).astype(np.int32)
    # packed entries: a context's arc range and back-off next to each other (one cache line)
    p2 = np.empty(len(s2), P2_ENTRY)
    p2["lo"], p2["hi"] = off[s2], off[s2 + 1]
    p2["xlo"], p2["xhi"] = x_off[:-1], x_off[1:]
    p2["bo"], p2["boc"] = bon[s2], boc[s2]
    x3 = np.empty(len(s3), X3_ENTRY)
    x3["lo"], x3["hi"], x3["boc"] = off[s3], off[s3 + 1], boc[s3]
    return (ctx1x, p2_off, p2_lab, p2, x_lab, x3)


# --------------------------------------------------------------------------------------------
# kernels


@njit(cache=True, inline="always")
def _hash(s, label, mask):
    x = s * 2654435761 + label * 40503
    x ^= x >> 15
    x *= 0x2C1B3C6D
    x ^= x >> 12
    return x & mask


@njit(cache=True)
def _build_hash(off, lab, skip_row):
    """Open-addressing table (int32 arc ids, -1 empty) over the arcs of every row but ``skip_row``."""
    n = off[-1] - (off[skip_row + 1] - off[skip_row] if skip_row >= 0 else 0)
    size = 16
    while size < 2 * n + 16:
        size *= 2
    mask = size - 1
    tab = np.full(size, -1, np.int32)
    for r in range(off.shape[0] - 1):
        if r == skip_row:
            continue
        for a in range(off[r], off[r + 1]):
            slot = _hash(r, lab[a], mask)
            while tab[slot] >= 0:
                slot = (slot + 1) & mask
            tab[slot] = a
    return tab


@njit(cache=True, inline="always")
def _find(r, label, off, lab, tab):
    """Index of ``label`` in row ``r`` of a CSR (ascending labels), or -1. Short rows are
    searched in place; long ones through the hash table (one or two probes)."""
    lo = off[r]
    hi = off[r + 1]
    if hi - lo <= 16:
        for a in range(lo, hi):
            m = lab[a]
            if m == label:
                return a
            if m > label:
                return -1
        return -1
    mask = tab.shape[0] - 1
    slot = _hash(r, label, mask)
    while True:
        a = tab[slot]
        if a < 0:
            return -1
        if lab[a] == label and lo <= a < hi:
            return a
        slot = (slot + 1) & mask


@njit(cache=True, inline="always")
def _step(s, label, off, lab, cost, nxt, bon, boc, uni, V, unk, tab):
    """(next_state, cost) of ``label`` (= token+1) from state ``s`` with back-off; float64 cost."""
    acc = 0.0
    while True:
        if s == uni:
            if 1 <= label <= V:
                a = off[uni] + label - 1
                return nxt[a], acc + cost[a]
            return uni, acc + unk
        a = _find(s, label, off, lab, tab)
        if a >= 0:
            return nxt[a], acc + cost[a]
        b = bon[s]
        if b < 0:
            return uni, acc + unk
        acc += boc[s]
        s = b


@njit(cache=True, inline="always")
def _step_memo(s, label, off, lab, cost, nxt, bon, boc, uni, V, unk, tab, mk, mn, mc):
    """``_step`` with the back-off tail memoised: after a miss at ``s`` the result for
    (back-off state, label) comes from a small per-search table (keys ``mk``, -1 empty),
    since many nodes of a slot back off to the same shorter contexts."""
    if s != uni:
        a = _find(s, label, off, lab, tab)
        if a >= 0:
            return nxt[a], np.float64(cost[a])
        b = bon[s]
        if b < 0:
            return uni, np.float64(unk)
        acc = np.float64(boc[s])
        s = b
    else:
        acc = 0.0
    key = s * (V + 2) + label
    mask = mk.shape[0] - 1
    slot = _hash(s, label, mask)
    for _ in range(8):
        kk = mk[slot]
        if kk == key:
            return mn[slot], acc + mc[slot]
        if kk < 0:
            break
        slot = (slot + 1) & mask
    ns, c = _step(s, label, off, lab, cost, nxt, bon, boc, uni, V, unk, tab)
    if mk[slot] < 0 or mk[slot] != key:
        mk[slot] = key
        mn[slot] = ns
        mc[slot] = c
    return ns, acc + c


@njit(cache=True)
def _walk(s, ids, off, lab, cost, nxt, bon, boc, uni, V, unk, tab):
    for t in ids:
        s = _step(s, t + 1, off, lab, cost, nxt, bon, boc, uni, V, unk, tab)[0]
    return s

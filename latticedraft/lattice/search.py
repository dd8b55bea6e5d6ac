"""Exact p-best search of a sausage lattice under an n-gram LM (numba over ``NgramFst`` arrays).

The score of a path ``y`` is ``sum_i head_logp[i, y_i] + alpha * ln p_LM(y_i | history, y_<i)``
with true back-off semantics (a lookup that misses a state adds the state's back-off cost
and retries at its back-off state, exactly like KenLM's ``BaseScore``).

Two exact algorithms (neither is a beam):

A. *Order <= 4 (``_triple_pbest``, the bundled 4-gram).* The LM state is fixed by the last
   three tokens, so a backward dynamic program over the lattice's candidate triples gives the
   exact best score of every suffix, ``V[j, x, b, a]``. Triples whose three-token context the
   model does not keep share their (b, a) value, so a slot costs ~k^3 additions plus CSR
   merges for the contexts that exist (not k^4 look-ups). A best-first search over prefixes
   with ``V`` as its heuristic (exact, hence admissible) then pops complete paths in order:
   the p best distinct strings after about p * h pops, each expanding one slot with exact
   back-off look-ups from the prefix's LM state (one row at a time for all the slot's labels).
   A fresh lattice is bound by cache misses, so each slot's table reads are issued together
   (prefetch) and the tables keep a context's arc range and back-off next to its label.

B. *Any order (``_pbest``), used above order 4:*

1. *Suffix bounds.* For a token ``c`` after any context ending in ``(b, a)`` an upper bound on
   ``ln p(c | context)`` comes from tables built once per LM (``LMArrays``): the best arc for
   ``c`` over all states of two or more tokens ending in ``(b, a)``, over the one-token state
   ``(a)`` and over the null state, each plus the largest back-off gain a longer context can
   collect on its way down (back-off weights can exceed 1, so this is not assumed to be 0).
   A backward max-sum pass over the lattice's adjacent candidate triples turns these into
   ``H[i, b, a]``, an admissible bound on the score of slots ``i..h-1``. Look-ups are sorted
   merges of the slot's labels with the tables' CSR rows (no hashing, few cache lines).
2. *Lower bound.* A beam pass (6 nodes, or p) over the same dynamic program gives ``p`` real
   paths; the p-th best score ``L`` is a lower bound on the true p-th best.
3. *Exact pass.* Dynamic program over nodes (LM state, previous candidate, candidate); equal
   states merge, each node keeps its own p best partial paths (so the p results are distinct
   token strings), and a partial path is dropped only when ``g + H < L``, which no top-p path
   can satisfy. LM steps are exact back-off look-ups over the CSR arrays: short rows are
   scanned, long rows go through an open-addressing hash table, and the back-off tail is
   memoised per search.

Why not more Python or a capped beam: a KenLM-state search in Python is exact but ~5 ms at
8x16, and capping states per slot loses the exact best on a fifth of lattices; the bound lets
the compiled search drop almost everything while staying exact (tests compare against
brute-force enumeration, KenLM's own scores and random back-off LMs with weights above 1).

Everything inside is float64; returned scores are float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from latticedraft.errors import ModelError
from latticedraft.lattice._prefetch import prefetch

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


@njit(cache=True, inline="always")
def _bound_short(a_tok, c_tok, off, lab, cost, uni_logp, ctx1, ctx1_gain, dflt, V, unk, tab):
    """Upper bound of ln p(c | context ending in a) when c is found at (a) or the null state."""
    if 0 <= c_tok < V:
        u = uni_logp[c_tok]
    else:
        u = -unk
    if a_tok < 0 or a_tok >= V:
        return u
    best = dflt[a_tok] + u
    s1 = ctx1[a_tok]
    if s1 >= 0:
        j = _find(s1, c_tok + 1, off, lab, tab)
        if j >= 0:
            v = -cost[j] + ctx1_gain[a_tok]
            if v > best:
                best = v
    return best


@njit(cache=True, inline="always")
def _row2(b_tok, a_tok, t1_off, t1_lab, t1_hash, V):
    """Row of the (b, a) table, or -1 (b = V is <s>)."""
    if b_tok < 0 or b_tok > V or a_tok < 0 or a_tok >= V:
        return -1
    return _find(b_tok, a_tok + 1, t1_off, t1_lab, t1_hash)


@njit(cache=True, inline="always")
def _match_sorted(lo, hi, lab, labels, order, w, out):
    """For each of ``labels[:w]`` (visited in ascending order ``order``), its index in the
    ascending CSR row ``lab[lo:hi]`` or -1, into ``out``; one narrowing binary search each."""
    pos = lo
    for q in range(w):
        c = order[q]
        x = labels[c]
        a = pos
        b = hi
        while a < b:
            mid = (a + b) >> 1
            if lab[mid] < x:
                a = mid + 1
            else:
                b = mid
        if a < hi and lab[a] == x:
            out[c] = a
            pos = a + 1
        else:
            out[c] = -1
            pos = a


@njit(cache=True)
def _suffix_bounds(tok, hl, widths, alpha, start, hist_b, off, lab, cost, nxt, bon, boc, uni, V, unk,
                   tab, uni_logp, ctx1, ctx1_gain, dflt, t1_off, t1_lab, t1_hash, t2_off, t2_lab,
                   t2_val, t2_hash):
    """Admissible bounds on the rest of the lattice, conditioned on the last two candidates.

    ``H[i, b, a]`` (float64[h+1, k, k]) bounds the score of slots i..h-1 given candidate ``a``
    at slot i-1 and ``b`` at slot i-2 (index 0 stands for the history where that slot lies
    before the lattice); ``H[h] = 0``. The bound of a path through (b, a, c) from slot i on is
    ``Gr[R[i, b, a], c]`` when the model has contexts ending in (b, a) (``R >= 0``), else
    ``Gb[i, a, c]``, which uses only the one-token context (a) and the null state. Slot 0 uses
    its exact LM step from ``start``. ``hist_b``: the last history token (``V``: ``<s>``).
    All table look-ups are sorted merges of a CSR row with the slot's sorted labels.
    """
    h, k = tok.shape
    H = np.zeros((h + 1, k, k))
    Gb = np.empty((h, k, k))
    R = np.full((h, k, k), -1, np.int64)
    Gr = np.empty((16, k))
    n_rows = 0
    use_lm = alpha != 0.0
    labels = tok + 1
    order = np.empty((h, k), np.int64)
    for i in range(h):
        o = np.argsort(labels[i, :widths[i]])
        for j in range(widths[i]):
            order[i, j] = o[j]
    idx = np.empty(k, np.int64)
    ridx = np.empty(k, np.int64)
    uni_c = np.empty(k)
    for i in range(h - 1, 0, -1):
        w = widths[i]
        wa = widths[i - 1]
        wb = widths[i - 2] if i >= 2 else 1
        best0 = np.empty(wa)
        if use_lm:
            for c in range(w):
                t = tok[i, c]
                uni_c[c] = uni_logp[t] if 0 <= t < V else -unk
        for a in range(wa):
            a_tok = tok[i - 1, a]
            s1 = -1
            if use_lm and 0 <= a_tok < V:
                s1 = ctx1[a_tok]
                if s1 >= 0:
                    _match_sorted(off[s1], off[s1 + 1], lab, labels[i], order[i], w, idx)
            bst = -np.inf
            for c in range(w):
                if use_lm:
                    if 0 <= a_tok < V:
                        v = dflt[a_tok] + uni_c[c]
                        if s1 >= 0 and idx[c] >= 0:
                            v2 = -cost[idx[c]] + ctx1_gain[a_tok]
                            if v2 > v:
                                v = v2
                    else:
                        v = uni_c[c]
                    g = hl[i, c] + alpha * v + H[i + 1, a, c]
                else:
                    g = hl[i, c] + H[i + 1, a, c]
                Gb[i, a, c] = g
                if g > bst:
                    bst = g
            best0[a] = bst
        for b in range(wb):
            b_tok = tok[i - 2, b] if i >= 2 else hist_b
            has_row = use_lm and 0 <= b_tok <= V
            if has_row:
                _match_sorted(t1_off[b_tok], t1_off[b_tok + 1], t1_lab, labels[i - 1], order[i - 1], wa, ridx)
            for a in range(wa):
                r = ridx[a] if has_row and tok[i - 1, a] >= 0 and tok[i - 1, a] < V else -1
                if r < 0:
                    H[i, b, a] = best0[a]
                    continue
                if n_rows == Gr.shape[0]:
                    Gr2 = np.empty((2 * n_rows, k))
                    Gr2[:n_rows] = Gr
                    Gr = Gr2
                row = n_rows
                n_rows += 1
                R[i, b, a] = row
                _match_sorted(t2_off[r], t2_off[r + 1], t2_lab, labels[i], order[i], w, idx)
                bst = -np.inf
                for c in range(w):
                    g = Gb[i, a, c]
                    if idx[c] >= 0:
                        g2 = hl[i, c] + alpha * t2_val[idx[c]] + H[i + 1, a, c]
                        if g2 > g:
                            g = g2
                    Gr[row, c] = g
                    if g > bst:
                        bst = g
                H[i, b, a] = bst
    bst = -np.inf
    for c in range(widths[0]):
        if use_lm:
            g = hl[0, c] - alpha * _step(start, tok[0, c] + 1, off, lab, cost, nxt, bon, boc, uni, V, unk, tab)[1]
        else:
            g = hl[0, c]
        g += H[1, 0, c]
        Gb[0, 0, c] = g
        if g > bst:
            bst = g
    H[0, 0, 0] = bst
    return H, Gb, R, Gr


@njit(cache=True)
def _search(tok, hl, widths, alpha, p, start, lower, cap, H, Gb, R, Gr,
            off, lab, cost, nxt, bon, boc, uni, V, unk, tab, mk, mn, mc):
    """Layered DP over nodes (LM state, previous candidate, candidate), each with its p best
    partial paths (sorted best first); the LM step from a node is looked up once for all.

    ``lower``: drop partials whose bound ``g + H`` is below it (-inf: none). ``cap`` > 0 keeps
    only the ``cap`` nodes of best bound per slot (a beam: it gives real paths, hence a lower
    bound, but is not exact). Returns (cand int64[m, h], scores float64[m], partials kept).
    """
    h, k = tok.shape
    tol = 1e-9 * (1.0 + abs(lower)) if lower > -np.inf else 0.0
    thr = lower - tol
    use_lm = alpha != 0.0
    # flat storage of every layer's partials: candidate and parent partial (for backtracking)
    e_cd = np.empty(4096, np.int64)
    e_par = np.empty(4096, np.int64)
    e_cd[0] = 0
    e_par[0] = -1
    n_ent = 1
    n_nodes = 1
    nd_state = np.full(1, start, np.int64)
    nd_b = np.zeros(1, np.int64)
    nd_c = np.zeros(1, np.int64)
    nd_cnt = np.ones(1, np.int64)
    nd_g = np.zeros((1, p))
    nd_id = np.zeros((1, p), np.int64)
    for i in range(h):
        w = widths[i]
        cap_nodes = n_nodes * w
        tsize = 16
        while tsize < 2 * cap_nodes:
            tsize *= 2
        table = np.full(tsize, -1, np.int64)
        mask = tsize - 1
        m_state = np.empty(cap_nodes, np.int64)
        m_b = np.empty(cap_nodes, np.int64)
        m_c = np.empty(cap_nodes, np.int64)
        m_cnt = np.zeros(cap_nodes, np.int64)
        m_g = np.empty((cap_nodes, p))
        m_par = np.empty((cap_nodes, p), np.int64)
        m = 0
        for u in range(n_nodes):
            s = nd_state[u]
            b = nd_b[u]
            a = nd_c[u]
            gtop = nd_g[u, 0]
            row = R[i, b, a]
            for c in range(w):
                if gtop + (Gr[row, c] if row >= 0 else Gb[i, a, c]) < thr:
                    continue
                if use_lm:
                    ns, lc = _step_memo(s, tok[i, c] + 1, off, lab, cost, nxt, bon, boc, uni, V, unk, tab,
                                        mk, mn, mc)
                    stepv = hl[i, c] - alpha * lc
                else:
                    ns = s
                    stepv = hl[i, c]
                hb = H[i + 1, a, c]
                if gtop + stepv + hb < thr:
                    continue
                key = (ns * k + a) * k + c
                slot = _hash(key, c, mask)
                while True:
                    v = table[slot]
                    if v < 0:
                        v = m
                        table[slot] = v
                        m_state[v] = ns
                        m_b[v] = a
                        m_c[v] = c
                        m += 1
                        break
                    if m_state[v] == ns and m_c[v] == c and m_b[v] == a:
                        break
                    slot = (slot + 1) & mask
                cnt = m_cnt[v]
                for t in range(nd_cnt[u]):
                    g = nd_g[u, t] + stepv
                    if g + hb < thr:
                        break
                    if cnt == p and g <= m_g[v, p - 1]:
                        break  # this and u's later (worse) partials cannot enter v's top p
                    pos = cnt if cnt < p else p - 1
                    while pos > 0 and m_g[v, pos - 1] < g:
                        m_g[v, pos] = m_g[v, pos - 1]
                        m_par[v, pos] = m_par[v, pos - 1]
                        pos -= 1
                    m_g[v, pos] = g
                    m_par[v, pos] = nd_id[u, t]
                    if cnt < p:
                        cnt += 1
                m_cnt[v] = cnt
        sel = np.arange(m)
        if cap > 0 and m > cap:
            fb = np.empty(m)
            for v in range(m):
                fb[v] = m_g[v, 0] + H[i + 1, m_b[v], m_c[v]]
            sel = np.argsort(-fb, kind="mergesort")[:cap]
        n_nodes = sel.shape[0]
        nd_state = np.empty(n_nodes, np.int64)
        nd_b = np.empty(n_nodes, np.int64)
        nd_c = np.empty(n_nodes, np.int64)
        nd_cnt = np.empty(n_nodes, np.int64)
        nd_g = np.empty((n_nodes, p))
        nd_id = np.empty((n_nodes, p), np.int64)
        need = n_ent + n_nodes * p
        if need > e_cd.shape[0]:
            size = max(need, 2 * e_cd.shape[0])
            t1 = np.empty(size, np.int64)
            t1[:n_ent] = e_cd[:n_ent]
            e_cd = t1
            t2 = np.empty(size, np.int64)
            t2[:n_ent] = e_par[:n_ent]
            e_par = t2
        for r in range(n_nodes):
            v = sel[r]
            nd_state[r] = m_state[v]
            nd_b[r] = m_b[v]
            nd_c[r] = m_c[v]
            nd_cnt[r] = m_cnt[v]
            for t in range(m_cnt[v]):
                nd_g[r, t] = m_g[v, t]
                e_cd[n_ent] = m_c[v]
                e_par[n_ent] = m_par[v, t]
                nd_id[r, t] = n_ent
                n_ent += 1
    # the final partials, best first (ties: the partial stored first)
    total = 0
    for r in range(n_nodes):
        total += nd_cnt[r]
    fg = np.empty(total)
    fid = np.empty(total, np.int64)
    q = 0
    for r in range(n_nodes):
        for t in range(nd_cnt[r]):
            fg[q] = nd_g[r, t]
            fid[q] = nd_id[r, t]
            q += 1
    o = np.argsort(-fg, kind="mergesort")
    mm = min(p, total)
    out = np.empty((mm, h), np.int64)
    scores = np.empty(mm)
    for r in range(mm):
        e = fid[o[r]]
        scores[r] = fg[o[r]]
        for i in range(h - 1, -1, -1):
            out[r, i] = e_cd[e]
            e = e_par[e]
    return out, scores, n_ent


@njit(cache=True, nogil=True)
def _pbest(tok, hl, widths, alpha, p, start, hist_b, off, lab, cost, nxt, bon, boc, uni, V, unk, tab,
           uni_logp, ctx1, ctx1_gain, dflt, t1_off, t1_lab, t1_hash, t2_off, t2_lab, t2_val, t2_hash):
    """Exact p best: bounds, a beam pass for the lower bound, then the pruned exact pass."""
    H, Gb, R, Gr = _suffix_bounds(tok, hl, widths, alpha, start, hist_b, off, lab, cost, nxt, bon, boc, uni, V,
                          unk, tab, uni_logp, ctx1, ctx1_gain, dflt, t1_off, t1_lab, t1_hash, t2_off,
                          t2_lab, t2_val, t2_hash)
    beam = max(p, 6)
    mk = np.full(1 << 12, -1, np.int64)
    mn = np.empty(1 << 12, np.int64)
    mc = np.empty(1 << 12)
    cand, scores, n1 = _search(tok, hl, widths, alpha, p, start, -np.inf, beam, H, Gb, R, Gr,
                               off, lab, cost, nxt, bon, boc, uni, V, unk, tab, mk, mn, mc)
    lower = scores[-1] if scores.shape[0] >= p else -np.inf
    cand, scores, n2 = _search(tok, hl, widths, alpha, p, start, lower, 0, H, Gb, R, Gr,
                               off, lab, cost, nxt, bon, boc, uni, V, unk, tab, mk, mn, mc)
    return cand, scores, n1, n2


@njit(cache=True, inline="always")
def _read_path(n_c, n_par, u, row):
    """Write the candidate indices on the path from the root to node ``u`` into ``row`` (int64[h])."""
    e = u
    for q in range(row.shape[0] - 1, -1, -1):
        row[q] = n_c[e]
        e = n_par[e]


@njit(cache=True)
def _grow_to(x, n):
    y = np.empty(n, dtype=x.dtype)
    y[: x.shape[0]] = x
    return y


@njit(cache=True, inline="always")
def _heap_push(hf, hi, n, f, v):
    i = n
    hf[i] = f
    hi[i] = v
    while i > 0:
        par = (i - 1) >> 1
        if hf[par] >= hf[i]:
            break
        hf[par], hf[i] = hf[i], hf[par]
        hi[par], hi[i] = hi[i], hi[par]
        i = par


@njit(cache=True, inline="always")
def _heap_pop(hf, hi, n):
    """Remove the max of a heap of ``n`` entries (returns f, id); the heap then has n - 1."""
    f = hf[0]
    v = hi[0]
    n -= 1
    hf[0] = hf[n]
    hi[0] = hi[n]
    i = 0
    while True:
        l = 2 * i + 1
        if l >= n:
            break
        m = l
        if l + 1 < n and hf[l + 1] > hf[l]:
            m = l + 1
        if hf[i] >= hf[m]:
            break
        hf[m], hf[i] = hf[i], hf[m]
        hi[m], hi[i] = hi[i], hi[m]
        i = m
    return f, v


@njit(cache=True, nogil=True)
def _triple_pbest(T, W, hl, hp, alpha, p, start, off, lab, cost, nxt, bon, boc, uni, V, unk, tab,
                  uni_logp, ctx1x, p2_off, p2_lab, p2, x_lab, x3):
    """Exact p best for LMs of order <= 4, whose state is fixed by the last three tokens.

    ``T int64[E, k]``: the lattice after ``hp`` pseudo-slots holding the history's last tokens
    (width 1; code -1: none, ``V``: ``<s>``), ``W int64[E]``, ``hl float64[E, k]`` (0 on
    pseudo-slots). A backward dynamic program over candidate triples computes
    ``Vv[j, x, b, a]``, the exact best score of slots j.. given the candidates (x, b, a) at
    slots j-3..j-1; all the (x, b, a) whose three-token context the model does not keep share
    the (b, a) value, so the work per slot is ~k^3 additions plus CSR merges for the contexts
    that exist. Then a best-first search over prefixes with ``Vv`` as its (exact) heuristic
    pops the complete paths best first: p distinct strings after about p * h pops.
    Returns (cand int64[m, h], scores float64[m], prefixes pushed, 0).
    """
    E, k = T.shape
    Vv = np.empty((E + 1, k, k, k))
    posmap = np.full((2, V + 3), -1, np.int64)
    _triple_values(T, W, hl, hp, alpha, off, lab, cost, nxt, bon, boc, uni, V, unk, tab, uni_logp, ctx1x,
                   p2_off, p2_lab, p2, x_lab, x3, Vv, posmap)
    out = np.empty((p, E - hp), np.int64)
    scores = np.empty(p)
    found, nn = _triple_best_first(T, W, hl, hp, alpha, p, start, off, lab, cost, nxt, bon, boc, uni, V, unk,
                                   tab, Vv, out, scores)
    return out[:found], scores[:found], nn, 0


@njit(cache=True, inline="always")
def _pf_span(arr, lo, hi, lines):
    """Prefetch up to ``lines`` cache lines (16 x 4-byte items) of arr[lo:hi]."""
    e = min(hi, lo + 16 * lines)
    i = lo
    while i < e:
        prefetch(arr, i)
        i += 16


@njit(cache=True, inline="always")
def _match_ls(lo, hi, lab, labels, w, out, base):
    """For each of ``labels[:w]``, its index in the ascending row ``lab[lo:hi]`` or -1, into
    ``out``: branchless binary searches run in lockstep (their loads overlap)."""
    n = hi - lo
    if n <= 0:
        for c in range(w):
            out[c] = -1
        return
    for c in range(w):
        base[c] = lo
    while n > 1:
        half = n >> 1
        for c in range(w):
            b = base[c]
            base[c] = b + half if lab[b + half] < labels[c] else b
        n -= half
    for c in range(w):
        b = base[c]
        x = labels[c]
        m = lab[b]
        if m < x:
            b += 1
            m = lab[b] if b < hi else -1
        out[c] = b if m == x else -1


@njit(cache=True, inline="always")
def _match_row(lo, hi, lab, labels, w, out, posmap, base):
    """``_match_ls`` for the current slot; a short row is scanned through ``posmap`` (label ->
    candidate index, -1 elsewhere) instead of searched."""
    if hi - lo <= 4 * w:
        for c in range(w):
            out[c] = -1
        for x in range(lo, hi):
            q = posmap[lab[x]]
            if q >= 0:
                out[q] = x
    else:
        _match_ls(lo, hi, lab, labels, w, out, base)


@njit(cache=True, inline="always")
def _expand(s, labels, w, off, lab, cost, nxt, bon, boc, uni, V, unk, idx, base, ns, lc):
    """``_step_memo(s, labels[c])`` for every c < w (same values, same float association),
    walking the back-off chain one row at a time: into ``ns`` (int64[>=w]) and ``lc`` (float64)."""
    if s != uni:
        _match_ls(off[s], off[s + 1], lab, labels, w, idx, base)
        pend = 0
        for c in range(w):
            a = idx[c]
            if a >= 0:
                ns[c] = nxt[a]
                lc[c] = cost[a]
            else:
                ns[c] = -1
                pend += 1
        if pend == 0:
            return
        cur = bon[s]
        if cur < 0:
            for c in range(w):
                if ns[c] < 0:
                    ns[c] = uni
                    lc[c] = unk
            return
        outer = np.float64(boc[s])
    else:
        for c in range(w):
            ns[c] = -1
        pend = w
        cur = uni
        outer = 0.0
    acc = 0.0
    while True:
        if cur == uni:
            for c in range(w):
                if ns[c] < 0:
                    label = labels[c]
                    if 1 <= label <= V:
                        a = off[uni] + label - 1
                        ns[c] = nxt[a]
                        lc[c] = outer + (acc + cost[a])
                    else:
                        ns[c] = uni
                        lc[c] = outer + (acc + unk)
            return
        _match_ls(off[cur], off[cur + 1], lab, labels, w, idx, base)
        for c in range(w):
            if ns[c] < 0 and idx[c] >= 0:
                a = idx[c]
                ns[c] = nxt[a]
                lc[c] = outer + (acc + cost[a])
                pend -= 1
        if pend == 0:
            return
        nb = bon[cur]
        if nb < 0:
            for c in range(w):
                if ns[c] < 0:
                    ns[c] = uni
                    lc[c] = outer + (acc + unk)
            return
        acc += boc[cur]
        cur = nb


@njit(cache=True, nogil=True)
def _triple_values(T, W, hl, hp, alpha, off, lab, cost, nxt, bon, boc, uni, V, unk, tab, uni_logp, ctx1x,
                   p2_off, p2_lab, p2, x_lab, x3, Vv, pos2):
    """The backward dynamic program of ``_triple_pbest``: fills ``Vv[:E+1]`` (float64[>=E+1, k, k, k]).
    ``pos2`` (int64[2, V+3], label -> candidate index of slot j and of slot j-3) must hold -1
    everywhere and is left so. Per slot, a gather phase first finds the slot's contexts and
    prefetches their table rows level by level (the misses overlap instead of forming one
    chain per context); the compute phase then reads them from cache."""
    E, k = T.shape
    Vv[E] = 0.0
    labels = T + 1
    lp1 = np.empty((k, k))
    lp2 = np.empty(k)
    idx = np.empty(k, np.int64)
    ridx = np.full(k, -1, np.int64)
    base = np.empty(k, np.int64)
    xidx = np.empty(k, np.int64)
    uni_c = np.empty(k)
    R = np.full((k, k), -1, np.int64)
    mst = np.zeros((k, k + 1), np.int64)
    mq = np.empty(k * k * k, np.int64)
    mx = np.empty(k * k * k, np.int64)
    posmap = pos2[0]
    posx = pos2[1]
    for j in range(E - 1, hp - 1, -1):
        w = W[j]
        if j >= 3:
            for x in range(W[j - 3]):
                posx[labels[j - 3, x]] = x
        wa = W[j - 1] if j >= 1 else 1
        wb = W[j - 2] if j >= 2 else 1
        wx = W[j - 3] if j >= 3 else 1
        # ---- gather: issue the slot's memory reads level by level (many misses in flight)
        for a in range(wa):
            at = T[j - 1, a] if j >= 1 else -1
            s1 = ctx1x[at] if 0 <= at <= V else -1
            if s1 >= 0:
                prefetch(off, s1)
                prefetch(bon, s1)
                prefetch(boc, s1)
        for b in range(wb):
            bt = T[j - 2, b] if j >= 2 else -1
            if 0 <= bt <= V:
                lo = p2_off[bt]
                hi = p2_off[bt + 1]
                prefetch(p2_lab, lo)
                if hi - lo > 16:
                    prefetch(p2_lab, (lo + hi) >> 1)
                    prefetch(p2_lab, (3 * lo + hi) >> 2)
                    prefetch(p2_lab, (lo + 3 * hi) >> 2)
        for a in range(wa):
            at = T[j - 1, a] if j >= 1 else -1
            s1 = ctx1x[at] if 0 <= at <= V else -1
            if s1 >= 0:
                lo = off[s1]
                hi = off[s1 + 1]
                if hi - lo <= 4 * w:
                    _pf_span(lab, lo, hi, 4)
                else:
                    prefetch(lab, (lo + hi) >> 1)
                    prefetch(lab, (3 * lo + hi) >> 2)
                    prefetch(lab, (lo + 3 * hi) >> 2)
        for b in range(wb):
            bt = T[j - 2, b] if j >= 2 else -1
            if 0 <= bt <= V:
                _match_ls(p2_off[bt], p2_off[bt + 1], p2_lab, labels[j - 1], wa, ridx, base)
                for a in range(wa):
                    at = T[j - 1, a]
                    r = ridx[a] if 0 <= at < V else -1
                    R[b, a] = r
                    if r >= 0:
                        prefetch(p2, r)
            else:
                for a in range(wa):
                    R[b, a] = -1
        for b in range(wb):
            for a in range(wa):
                r = R[b, a]
                if r >= 0:
                    e = p2[r]
                    if j >= 3:
                        _pf_span(x_lab, e.xlo, e.xhi, 4)
                    lo = e.lo
                    hi = e.hi
                    if hi - lo <= 4 * w:
                        _pf_span(lab, lo, hi, 4)
                        _pf_span(cost, lo, hi, 4)
                    else:
                        prefetch(lab, (lo + hi) >> 1)
        n = 0
        if j >= 3:
            for b in range(wb):
                for a in range(wa):
                    mst[b, a] = n
                    r = R[b, a]
                    if r >= 0:
                        xlo = p2[r].xlo
                        xhi = p2[r].xhi
                        if xhi - xlo <= 4 * wx:
                            for q in range(xlo, xhi):
                                x = posx[x_lab[q]]
                                if x >= 0:
                                    mq[n] = q
                                    mx[n] = x
                                    prefetch(x3, q)
                                    n += 1
                        else:
                            _match_ls(xlo, xhi, x_lab, labels[j - 3], wx, xidx, base)
                            for x in range(wx):
                                q = xidx[x]
                                if q >= 0:
                                    mq[n] = q
                                    mx[n] = x
                                    prefetch(x3, q)
                                    n += 1
                mst[b, wa] = n
            for m in range(n):
                e3 = x3[mq[m]]
                _pf_span(lab, e3.lo, e3.hi, 2)
                _pf_span(cost, e3.lo, e3.hi, 2)
        # ---- compute
        for c in range(w):
            t = T[j, c]
            uni_c[c] = uni_logp[t] if 0 <= t < V else -unk
            posmap[labels[j, c]] = c
        for a in range(wa):
            at = T[j - 1, a] if j >= 1 else -1
            s1 = ctx1x[at] if 0 <= at <= V else -1
            if s1 >= 0:
                _match_row(off[s1], off[s1 + 1], lab, labels[j], w, idx, posmap, base)
                bo = bon[s1]
                for c in range(w):
                    if idx[c] >= 0:
                        lp1[a, c] = -cost[idx[c]]
                    elif bo == uni:
                        lp1[a, c] = -boc[s1] + uni_c[c]
                    else:
                        lp1[a, c] = -boc[s1] - _step(bo, T[j, c] + 1, off, lab, cost, nxt, bon, boc, uni, V,
                                                     unk, tab)[1]
            else:
                for c in range(w):
                    lp1[a, c] = uni_c[c]
        for b in range(wb):
            for a in range(wa):
                r = R[b, a]
                if r >= 0:
                    at = T[j - 1, a]
                    e = p2[r]
                    _match_row(e.lo, e.hi, lab, labels[j], w, idx, posmap, base)
                    bo = e.bo
                    bc = e.boc
                    s1 = ctx1x[at]
                    for c in range(w):
                        if idx[c] >= 0:
                            lp2[c] = -cost[idx[c]]
                        elif bo == s1 and s1 >= 0:
                            lp2[c] = -bc + lp1[a, c]
                        elif bo == uni:
                            lp2[c] = -bc + uni_c[c]
                        else:
                            lp2[c] = -bc - _step(bo, T[j, c] + 1, off, lab, cost, nxt, bon, boc, uni, V,
                                                      unk, tab)[1]
                else:
                    for c in range(w):
                        lp2[c] = lp1[a, c]
                gen = -np.inf
                for c in range(w):
                    v = hl[j, c] + alpha * lp2[c] + Vv[j + 1, b, a, c]
                    if v > gen:
                        gen = v
                for x in range(wx):
                    Vv[j, x, b, a] = gen
                if r >= 0 and j >= 3:
                    for m in range(mst[b, a], mst[b, a + 1]):  # the (x, b, a) the model keeps
                        e3 = x3[mq[m]]
                        bc3 = e3.boc
                        _match_row(e3.lo, e3.hi, lab, labels[j], w, idx, posmap, base)
                        best = -np.inf
                        for c in range(w):
                            l3 = -cost[idx[c]] if idx[c] >= 0 else -bc3 + lp2[c]
                            v = hl[j, c] + alpha * l3 + Vv[j + 1, b, a, c]
                            if v > best:
                                best = v
                        Vv[j, mx[m], b, a] = best
        for c in range(w):
            posmap[labels[j, c]] = -1
        if j >= 3:
            for x in range(W[j - 3]):
                posx[labels[j - 3, x]] = -1


@njit(cache=True, nogil=True)
def _triple_best_first(T, W, hl, hp, alpha, p, start, off, lab, cost, nxt, bon, boc, uni, V, unk, tab, Vv,
                       out, scores):
    """Best-first over prefixes with ``Vv`` (from ``_triple_values``) as the exact heuristic: the
    p best paths into ``out`` (int64[>=p, h], candidate indices) and ``scores`` (float64[>=p]).
    Returns (paths found, prefixes pushed)."""
    E, k = T.shape
    h = E - hp
    # node arrays grow by doubling
    cap = 64 + 4 * p * h * k
    n_par = np.empty(cap, np.int64)
    n_c = np.empty(cap, np.int64)
    n_state = np.empty(cap, np.int64)
    n_g = np.empty(cap)
    n_i = np.empty(cap, np.int64)
    n_b = np.empty(cap, np.int64)
    n_a = np.empty(cap, np.int64)
    hf = np.empty(cap)
    hi = np.empty(cap, np.int64)
    labels = T + 1
    ns_c = np.empty(k, np.int64)
    lc_c = np.empty(k)
    idx = np.empty(k, np.int64)
    base = np.empty(k, np.int64)
    n_par[0] = -1
    n_c[0] = 0
    n_state[0] = start
    n_g[0] = 0.0
    n_i[0] = 0
    n_b[0] = 0
    n_a[0] = 0
    nn = 1
    hn = 0
    _heap_push(hf, hi, hn, Vv[hp, 0, 0, 0], 0)
    hn += 1
    found = 0
    while hn > 0 and found < p:
        f, u = _heap_pop(hf, hi, hn)
        hn -= 1
        i = n_i[u]
        if i == h:
            scores[found] = n_g[u]
            _read_path(n_c, n_par, u, out[found])
            found += 1
            continue
        j = hp + i
        w = W[j]
        if nn + w > n_par.shape[0]:
            size = 2 * (nn + w)
            n_par = _grow_to(n_par, size)
            n_c = _grow_to(n_c, size)
            n_state = _grow_to(n_state, size)
            n_g = _grow_to(n_g, size)
            n_i = _grow_to(n_i, size)
            n_b = _grow_to(n_b, size)
            n_a = _grow_to(n_a, size)
        if hn + w > hf.shape[0]:
            hf = _grow_to(hf, 2 * (hn + w))
            hi = _grow_to(hi, 2 * (hn + w))
        s = n_state[u]
        if alpha != 0.0:
            _expand(s, labels[j], w, off, lab, cost, nxt, bon, boc, uni, V, unk, idx, base, ns_c, lc_c)
        for c in range(w):
            if alpha != 0.0:
                ns = ns_c[c]
                g = n_g[u] + hl[j, c] - alpha * lc_c[c]
            else:
                ns = s
                g = n_g[u] + hl[j, c]
            v = nn
            nn += 1
            n_par[v] = u
            n_c[v] = c
            n_state[v] = ns
            n_g[v] = g
            n_i[v] = i + 1
            n_b[v] = n_a[u]
            n_a[v] = c
            _heap_push(hf, hi, hn, g + Vv[j + 1, n_b[u], n_a[u], c], v)
            hn += 1
    return found, nn


@njit(cache=True, nogil=True)
def _base_pbest(hl, widths, p):
    """p best paths by head score alone (no LM): best-first over prefixes with the exact
    heuristic "sum of the remaining slots' maxima". Returns (cand int64[m, h], scores)."""
    h, k = hl.shape
    suf = np.zeros(h + 1)
    for i in range(h - 1, -1, -1):
        m = -np.inf
        for c in range(widths[i]):
            if hl[i, c] > m:
                m = hl[i, c]
        suf[i] = suf[i + 1] + m
    cap = 64 + 2 * p * h * k
    n_par = np.empty(cap, np.int64)
    n_c = np.empty(cap, np.int64)
    n_i = np.empty(cap, np.int64)
    n_g = np.empty(cap)
    hf = np.empty(cap)
    hi = np.empty(cap, np.int64)
    n_par[0] = -1
    n_c[0] = 0
    n_i[0] = 0
    n_g[0] = 0.0
    nn = 1
    hn = 0
    _heap_push(hf, hi, hn, suf[0], 0)
    hn += 1
    out = np.empty((p, h), np.int64)
    scores = np.empty(p)
    found = 0
    while hn > 0 and found < p:
        f, u = _heap_pop(hf, hi, hn)
        hn -= 1
        i = n_i[u]
        if i == h:
            scores[found] = n_g[u]
            _read_path(n_c, n_par, u, out[found])
            found += 1
            continue
        w = widths[i]
        if nn + w > n_par.shape[0]:
            size = 2 * (nn + w)
            n_par = _grow_to(n_par, size)
            n_c = _grow_to(n_c, size)
            n_i = _grow_to(n_i, size)
            n_g = _grow_to(n_g, size)
        if hn + w > hf.shape[0]:
            hf = _grow_to(hf, 2 * (hn + w))
            hi = _grow_to(hi, 2 * (hn + w))
        for c in range(w):
            v = nn
            nn += 1
            n_par[v] = u
            n_c[v] = c
            n_i[v] = i + 1
            n_g[v] = n_g[u] + hl[i, c]
            _heap_push(hf, hi, hn, n_g[v] + suf[i + 1], v)
            hn += 1
    return out[:found], scores[:found], nn, 0




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


@njit(cache=True)
def _walk(s, ids, off, lab, cost, nxt, bon, boc, uni, V, unk, tab):
    for t in ids:
        s = _step(s, t + 1, off, lab, cost, nxt, bon, boc, uni, V, unk, tab)[0]
    return s


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
    A = _build_arrays(fst)
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


@njit(cache=True)
def _context_bound(b_tok, a_tok, c_tok, off, lab, cost, uni_logp, ctx1, ctx1_gain, dflt, V, unk, tab,
                   t1_off, t1_lab, t1_hash, t2_off, t2_lab, t2_val, t2_hash):
    v = _bound_short(a_tok, c_tok, off, lab, cost, uni_logp, ctx1, ctx1_gain, dflt, V, unk, tab)
    r = _row2(b_tok, a_tok, t1_off, t1_lab, t1_hash, V)
    if r >= 0:
        j = _find(r, c_tok + 1, t2_off, t2_lab, t2_hash)
        if j >= 0 and t2_val[j] > v:
            v = t2_val[j]
    return v


def context_bound(arrays: LMArrays, b_tok: int, a_tok: int, c_tok: int) -> float:
    """Upper bound of ln p(c | any context ending in (b, a)) (``b = -1``: ``<s>``); for tests."""
    A = arrays
    b = A.vocab_size if b_tok < 0 else int(b_tok)
    return float(_context_bound(b, int(a_tok), int(c_tok), A.offsets, A.labels, A.costs, A.uni_logp,
                                A.ctx1, A.ctx1_gain, A.dflt, A.vocab_size, A.unk_cost, A.arc_hash,
                                A.t1_off, A.t1_lab, A.t1_hash, A.t2_off, A.t2_lab, A.t2_val, A.t2_hash))

"""Exact p-best search of a sausage lattice under an n-gram LM (numba over ``NgramFst`` arrays).

The score of a path ``y`` is ``sum_i head_logp[i, y_i] + alpha * ln p_LM(y_i | history, y_<i)``
with true back-off semantics (a lookup that misses a state adds the state's back-off cost
and retries at its back-off state, exactly like KenLM's ``BaseScore``).

Algorithm (exact, not a beam):

1. *Suffix bounds.* For every pair of adjacent candidates ``(a at slot i-1, c at slot i)``
   an upper bound on ``ln p(c | any context ending in a)`` comes from a table built once per
   LM (``PairBound``): for each (last token, token) the best arc over all states whose
   history ends in that token, plus the largest back-off gain any longer context can add on
   its way to that state (back-off weights can exceed 1). A backward max-sum pass over the
   lattice turns these into ``H[i, a]``, an admissible bound on slots ``i..h-1``.
2. *Lower bound.* A beam pass (width ``max(4p, 16)``) over the same dynamic program gives
   ``p`` real paths; the p-th best score ``L`` is a lower bound on the true p-th best.
3. *Exact pass.* Dynamic program over (slot, LM state), states merged (each merged node keeps
   its own p best partial paths, so the p results are distinct token strings); a partial
   path is dropped only when ``g + H < L``, which no top-p path can satisfy. Candidates of
   a slot are visited in order of their bound, so the loop stops at the first one that fails.

Everything inside is float64; returned scores are float32.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
from numba import njit, types
from numba.typed import Dict

from latticedraft.errors import ModelError

UNSEEN_COST = 1000.0  # -ln p of an id the LM has never seen (the paper's Appendix D convention)


@dataclass
class LMArrays:
    """The CSR arrays of an ``NgramFst`` in the dtypes the kernels take, plus bound tables.

    ``pair_*``: per last token ``a`` (row ``a``), ascending labels ``c+1`` with the upper bound
    (float64, natural log) of ``ln p(c | context ending in a)`` over the states that have an
    arc for ``c``; ``pair_dflt[a] + uni_logp[c]`` bounds the rest (back-off to the unigram).
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
    uni_logp: np.ndarray
    pair_offsets: np.ndarray
    pair_labels: np.ndarray
    pair_val: np.ndarray
    pair_dflt: np.ndarray


_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def lm_arrays(fst) -> LMArrays:
    """``LMArrays`` for an ``NgramFst`` (cached per object; ~1 s for millions of arcs)."""
    try:
        return _CACHE[fst]
    except (KeyError, TypeError):
        pass
    arr = _build_arrays(fst)
    try:
        _CACHE[fst] = arr
    except TypeError:
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
    keep = last[arc_state] >= 0
    keep[ulo:uhi] = False
    a_last = last[arc_state[keep]]
    a_lab = lab[keep].astype(np.int64)
    a_val = -cost[keep].astype(np.float64) + gain[arc_state[keep]]
    key = a_last * (V + 2) + a_lab
    order = np.argsort(key, kind="stable")
    key, a_val = key[order], a_val[order]
    if len(key):
        starts = np.concatenate([[0], np.nonzero(np.diff(key))[0] + 1])
        ukey = key[starts]
        uval = np.maximum.reduceat(a_val, starts)
    else:
        ukey = np.zeros(0, np.int64)
        uval = np.zeros(0, np.float64)
    rows = ukey // (V + 2)
    pair_offsets = np.searchsorted(rows, np.arange(V + 1)).astype(np.int64)
    pair_labels = (ukey % (V + 2)).astype(np.int32)

    dflt = np.zeros(V, dtype=np.float64)
    to_uni = np.nonzero((bon == uni) & (last >= 0) & (last < V))[0]
    np.maximum.at(dflt, last[to_uni], gain[to_uni] - boc[to_uni].astype(np.float64))
    return LMArrays(V, off, lab, cost, nxt, bon, boc, uni, int(fst.start), uni_logp,
                    pair_offsets, pair_labels, uval.astype(np.float64), dflt)


# --------------------------------------------------------------------------------------------
# kernels


@njit(cache=True, inline="always")
def _step(s, label, off, lab, cost, nxt, bon, boc, uni, V):
    """(next_state, cost) of ``label`` (= token+1) from state ``s`` with back-off; float64 cost."""
    acc = 0.0
    while True:
        if s == uni:
            if 1 <= label <= V:
                a = off[uni] + label - 1
                return nxt[a], acc + cost[a]
            return uni, acc + UNSEEN_COST
        lo = off[s]
        hi = off[s + 1]
        while lo < hi:
            mid = (lo + hi) >> 1
            m = lab[mid]
            if m < label:
                lo = mid + 1
            elif m > label:
                hi = mid
            else:
                return nxt[mid], acc + cost[mid]
        b = bon[s]
        if b < 0:
            return uni, acc + UNSEEN_COST
        acc += boc[s]
        s = b


@njit(cache=True)
def _pair_bound(a_tok, c_tok, pair_off, pair_lab, pair_val, dflt, uni_logp, V):
    """Upper bound of ln p(c | any context whose last token is a)."""
    if 0 <= c_tok < V:
        u = uni_logp[c_tok]
    else:
        u = -UNSEEN_COST
    if a_tok < 0 or a_tok >= V:
        return u
    best = dflt[a_tok] + u
    lo = pair_off[a_tok]
    hi = pair_off[a_tok + 1]
    label = c_tok + 1
    while lo < hi:
        mid = (lo + hi) >> 1
        m = pair_lab[mid]
        if m < label:
            lo = mid + 1
        elif m > label:
            hi = mid
        else:
            if pair_val[mid] > best:
                best = pair_val[mid]
            break
    return best


@njit(cache=True)
def _suffix_bounds(tok, hl, widths, alpha, start, off, lab, cost, nxt, bon, boc, uni,
                   pair_off, pair_lab, pair_val, dflt, uni_logp, V):
    """H[h+1, k] and the per-(slot, prev cand) candidate order with its bound G[h, k, k].

    ``H[i, a]`` bounds the score of slots i..h-1 given candidate a at slot i-1 (H[h] = 0).
    ``order[i, a, :w_i]`` lists slot i's candidates by ``G = step bound + H[i+1, c]`` descending.
    Slot 0 (row a = 0 only) uses its exact LM step from ``start``.
    """
    h, k = tok.shape
    H = np.zeros((h + 1, k))
    G = np.full((h, k, k), -np.inf)
    order = np.zeros((h, k, k), dtype=np.int64)
    for i in range(h - 1, -1, -1):
        w = widths[i]
        na = widths[i - 1] if i > 0 else 1
        for a in range(na):
            best = -np.inf
            for c in range(w):
                if i > 0 and alpha != 0.0:
                    b = hl[i, c] + alpha * _pair_bound(tok[i - 1, a], tok[i, c], pair_off, pair_lab,
                                                       pair_val, dflt, uni_logp, V)
                elif alpha != 0.0:
                    b = hl[i, c] - alpha * _step(start, tok[i, c] + 1, off, lab, cost, nxt, bon, boc, uni, V)[1]
                else:
                    b = hl[i, c]
                g = b + H[i + 1, c]
                G[i, a, c] = g
                if g > best:
                    best = g
            H[i, a] = best
            o = np.argsort(-G[i, a, :w], kind="mergesort")
            for j in range(w):
                order[i, a, j] = o[j]
            tmp = G[i, a, :w].copy()
            for j in range(w):
                G[i, a, j] = tmp[o[j]]
    return H, G, order


@njit(cache=True)
def _grow(x, n):
    if n <= x.shape[0]:
        return x
    y = np.empty(max(n, 2 * x.shape[0]), dtype=x.dtype)
    y[: x.shape[0]] = x
    return y


@njit(cache=True)
def _search(tok, hl, widths, alpha, p, start, lower, cap, H, G, order,
            off, lab, cost, nxt, bon, boc, uni, V):
    """Layered DP over (slot, LM state, last candidate), p best partials per node.

    ``lower``: drop partials whose bound is below it (-inf: none); ``cap`` > 0 keeps only the
    ``cap`` best partials per slot (a beam; then the result is not guaranteed exact).
    Returns (cand int64[m, h], scores float64[m]), best first, m <= p.
    """
    h, k = tok.shape
    tol = 1e-9 * (1.0 + abs(lower)) if lower > -np.inf else 0.0
    use_lm = alpha != 0.0
    # all kept partials of all slots
    st = np.empty(1024, np.int64)
    cd = np.empty(1024, np.int64)
    par = np.empty(1024, np.int64)
    sc = np.empty(1024, np.float64)
    st[0] = start
    cd[0] = 0
    par[0] = -1
    sc[0] = 0.0
    n = 1
    lo_prev = 0
    hi_prev = 1
    for i in range(h):
        w = widths[i]
        m = (hi_prev - lo_prev) * w
        e_st = np.empty(m, np.int64)
        e_cd = np.empty(m, np.int64)
        e_par = np.empty(m, np.int64)
        e_g = np.empty(m, np.float64)
        e_f = np.empty(m, np.float64)
        ne = 0
        for e in range(lo_prev, hi_prev):
            g0 = sc[e]
            a = cd[e] if i > 0 else 0
            s = st[e]
            for j in range(w):
                if g0 + G[i, a, j] < lower - tol:
                    break
                c = order[i, a, j]
                if use_lm:
                    ns, lc = _step(s, tok[i, c] + 1, off, lab, cost, nxt, bon, boc, uni, V)
                    g = g0 + hl[i, c] - alpha * lc
                else:
                    ns = s
                    g = g0 + hl[i, c]
                f = g + H[i + 1, c]
                if f < lower - tol:
                    continue
                e_st[ne] = ns
                e_cd[ne] = c
                e_par[ne] = e
                e_g[ne] = g
                e_f[ne] = f
                ne += 1
        ordr = np.argsort(-e_f[:ne], kind="mergesort")
        counts = Dict.empty(key_type=types.int64, value_type=types.int64)
        need = n + ne
        st = _grow(st, need)
        cd = _grow(cd, need)
        par = _grow(par, need)
        sc = _grow(sc, need)
        lo_new = n
        kept = 0
        for t in range(ne):
            x = ordr[t]
            key = e_st[x] * k + e_cd[x]
            cnt = counts.get(key, 0)
            if cnt >= p:
                continue
            counts[key] = cnt + 1
            st[n] = e_st[x]
            cd[n] = e_cd[x]
            par[n] = e_par[x]
            sc[n] = e_g[x]
            n += 1
            kept += 1
            if cap > 0 and kept >= cap:
                break
        lo_prev = lo_new
        hi_prev = n
    m = min(p, hi_prev - lo_prev)
    out = np.empty((m, h), np.int64)
    scores = np.empty(m, np.float64)
    for r in range(m):
        e = lo_prev + r
        scores[r] = sc[e]
        for i in range(h - 1, -1, -1):
            out[r, i] = cd[e]
            e = par[e]
    return out, scores


@njit(cache=True)
def _pbest(tok, hl, widths, alpha, p, start, off, lab, cost, nxt, bon, boc, uni, V,
           pair_off, pair_lab, pair_val, dflt, uni_logp):
    """Exact p best: bounds, a beam pass for the lower bound, then the pruned exact pass."""
    H, G, order = _suffix_bounds(tok, hl, widths, alpha, start, off, lab, cost, nxt, bon, boc, uni,
                                 pair_off, pair_lab, pair_val, dflt, uni_logp, V)
    beam = max(4 * p, 16)
    cand, scores = _search(tok, hl, widths, alpha, p, start, -np.inf, beam, H, G, order,
                           off, lab, cost, nxt, bon, boc, uni, V)
    lower = scores[-1] if scores.shape[0] >= p else -np.inf
    return _search(tok, hl, widths, alpha, p, start, lower, 0, H, G, order,
                   off, lab, cost, nxt, bon, boc, uni, V)


_EMPTY_I64 = np.zeros(2, np.int64)
_EMPTY_I32 = np.zeros(1, np.int32)
_EMPTY_F32 = np.zeros(1, np.float32)
_EMPTY_F64 = np.zeros(1, np.float64)


def exact_pbest(tokens: np.ndarray, logp: np.ndarray, widths: np.ndarray, arrays: LMArrays | None,
                start: int, alpha: float, p: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact p best of a sausage (``tokens int64[h,k]``, ``logp float32[h,k]``, ``widths int64[h]``).

    ``arrays=None`` or ``alpha=0`` ranks by head log-probability alone. Returns
    ``(cand int64[m, h], scores float64[m])``: candidate indices per slot, best first.
    """
    hl = logp.astype(np.float64)
    if arrays is None or alpha == 0.0:
        z64 = np.zeros(1, np.int64)
        return _pbest(tokens, hl, widths, 0.0, int(p), 0, z64, _EMPTY_I32, _EMPTY_F32, _EMPTY_I32,
                      _EMPTY_I32, _EMPTY_F32, 0, 0, _EMPTY_I64, _EMPTY_I32, _EMPTY_F64, _EMPTY_F64,
                      _EMPTY_F64)
    A = arrays
    return _pbest(tokens, hl, widths, float(alpha), int(p), int(start), A.offsets, A.labels, A.costs,
                  A.nexts, A.bo_next, A.bo_cost, A.unigram, A.vocab_size, A.pair_offsets,
                  A.pair_labels, A.pair_val, A.pair_dflt, A.uni_logp)


def lm_step(arrays: LMArrays, state: int, token_id: int) -> tuple[int, float]:
    """(next_state, cost) with exact back-off; the kernels' own lookup, exposed for tests."""
    A = arrays
    ns, c = _step(int(state), int(token_id) + 1, A.offsets, A.labels, A.costs, A.nexts, A.bo_next,
                  A.bo_cost, A.unigram, A.vocab_size)
    return int(ns), float(c)


def pair_bound(arrays: LMArrays, a_tok: int, c_tok: int) -> float:
    """Upper bound of ln p(c | any context ending in a) (exposed for tests)."""
    A = arrays
    return float(_pair_bound(int(a_tok), int(c_tok), A.pair_offsets, A.pair_labels, A.pair_val,
                             A.pair_dflt, A.uni_logp, A.vocab_size))

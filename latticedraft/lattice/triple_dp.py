"""Exact p best for n-gram LMs of order <= 4 (the bundled 4-gram): a dynamic program over candidate triples.

The LM state is fixed by the last three tokens, so a backward dynamic program over the
lattice's candidate triples gives the exact best score of every suffix, ``V[j, x, b, a]``.
Triples whose three-token context the model does not keep share their (b, a) value, so a
slot costs ~k^3 additions plus CSR merges for the contexts that exist (not k^4 look-ups).
A best-first search over prefixes with ``V`` as its heuristic (exact, hence admissible) then
pops complete paths in order: the p best distinct strings after about p * h pops, each
expanding one slot with exact back-off look-ups from the prefix's LM state (one row at a time
for all the slot's labels). A fresh lattice is bound by cache misses, so each slot's table
reads are issued together (prefetch, ``lattice/_prefetch.py``) and the tables keep a
context's arc range and back-off next to its label (``lm_tables._triple_tables``).

The history's last tokens enter as width-1 pseudo-slots in front of the lattice
(``search._extend``; ``batched`` builds them in its kernel). Everything is float64.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from latticedraft.lattice._prefetch import prefetch
from latticedraft.lattice.best_first import _grow_to, _heap_pop, _heap_push, _read_path
from latticedraft.lattice.lm_tables import _step


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
    """``_step(s, labels[c])`` for every c < w (same values, same float association),
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

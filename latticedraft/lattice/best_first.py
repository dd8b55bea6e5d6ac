"""Best-first search over lattice prefixes: the shared max-heap and node-array helpers, and
the p best paths by head score alone (``_base_pbest``, used when there is no LM or ``alpha = 0``).

A node is a prefix (parent node, candidate index); the heap holds (bound, node) pairs, its
bound the prefix score plus an exact heuristic for the remaining slots, so complete paths are
popped best first. Node and heap arrays grow by doubling (``_grow_to``).
"""

from __future__ import annotations

import numpy as np
from numba import njit


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

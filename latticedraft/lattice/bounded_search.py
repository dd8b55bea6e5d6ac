"""Exact p best for n-gram LMs of any order (used above order 4): a bounded search over LM states.

1. *Suffix bounds.* For a token ``c`` after any context ending in ``(b, a)`` an upper bound on
   ``ln p(c | context)`` comes from the bound tables of ``LMArrays`` (``lm_tables``). A
   backward max-sum pass over the lattice's adjacent candidate triples turns these into
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

Everything is float64.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from latticedraft.lattice.lm_tables import _find, _hash, _step, _step_memo


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

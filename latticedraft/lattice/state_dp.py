"""Exact p best for n-gram LMs of any order: a dynamic program over the LM states reached in the lattice.

The LM state after a prefix (the automaton state: the longest suffix of the history that the
model keeps as a context) fixes the score of every continuation, so two prefixes that reach
the same state at the same slot compete only with each other. The program walks the slots
left to right and keeps, per reached state, its ``p`` best partial paths (sorted, best
first); the LM step from a state is looked up once per candidate for all of them
(``_step_memo``: exact back-off, the back-off tail memoised per search). At the end the p best
over all states are the exact p best paths: a path among the global p best is among the p best
of its state at every slot, since any path that beats it there would beat it to the end.

The states per slot are the distinct *reachable* contexts: at most ``k^(n-1)`` but in
practice far fewer, since a context the model never saw merges with its longest kept suffix.
Partials are pruned with an admissible bound: ``ub[i]``, the best head score of slots i..
plus ``alpha`` times the largest ln p each candidate gets in any context (``tok_ub``: its
best arc plus the largest back-off gain collected on the way to that arc's state); a partial
whose score plus ``ub`` falls below the p-th best score of a first beam pass (``cap`` states
per slot, real paths, hence a lower bound) cannot be among the p best.

Returns, like the other exact searches, ``(cand int64[m, h], scores float64[m], partials
kept, states kept)``, best first; equal scores keep the order in which they were reached.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from latticedraft.lattice.lm_tables import _hash, _step_memo

BEAM_CAP = 8  # states per slot of the beam pass that gives the lower bound


@njit(cache=True, nogil=True)
def _layers(tok, hl, widths, alpha, p, start, lower, cap, ub, cub, off, lab, cost, nxt, bon, boc, uni, V, unk, tab,
            mk, mn, mc):
    """Layered DP over LM states, each with its p best partials. ``lower``: drop partials whose
    score + ``ub`` is below it (-inf: none); ``cap`` > 0 keeps only the ``cap`` states with the
    best partial per slot (a beam). Returns (cand, scores, partials kept, states kept)."""
    h, k = tok.shape
    thr = lower - 1e-9 * (1.0 + abs(lower)) if lower > -np.inf else -np.inf
    e_cd = np.empty(4096, np.int64)
    e_par = np.empty(4096, np.int64)
    e_cd[0] = 0
    e_par[0] = -1
    n_ent = 1
    n_nodes = 1
    nd_state = np.full(1, start, np.int64)
    nd_cnt = np.ones(1, np.int64)
    nd_g = np.zeros((1, p))
    nd_id = np.zeros((1, p), np.int64)
    n_states = 1
    for i in range(h):
        w = widths[i]
        cap_nodes = max(16, n_nodes * w)
        tsize = 16
        while tsize < 2 * cap_nodes:
            tsize *= 2
        table = np.full(tsize, -1, np.int64)
        mask = tsize - 1
        m_state = np.empty(cap_nodes, np.int64)
        m_cnt = np.zeros(cap_nodes, np.int64)
        m_g = np.empty((cap_nodes, p))
        m_par = np.empty((cap_nodes, p), np.int64)
        m = 0
        rest = ub[i + 1]
        for u in range(n_nodes):
            s = nd_state[u]
            gtop = nd_g[u, 0]
            cnt_u = nd_cnt[u]
            for c in range(w):
                if gtop + ub[i] < thr:
                    break
                if gtop + cub[i, c] + rest < thr:
                    continue  # even its best context cannot lift it (saves the look-up)
                ns, lc = _step_memo(s, tok[i, c] + 1, off, lab, cost, nxt, bon, boc, uni, V, unk, tab, mk, mn, mc)
                stepv = hl[i, c] - alpha * lc
                if gtop + stepv + rest < thr:
                    continue
                slot = _hash(ns, 1, mask)
                while True:
                    v = table[slot]
                    if v < 0:
                        v = m
                        table[slot] = v
                        m_state[v] = ns
                        m += 1
                        break
                    if m_state[v] == ns:
                        break
                    slot = (slot + 1) & mask
                cnt = m_cnt[v]
                for t in range(cnt_u):
                    g = nd_g[u, t] + stepv
                    if g + rest < thr:
                        break
                    if cnt == p and g <= m_g[v, p - 1]:
                        break  # this and u's later (worse) partials cannot enter v's top p
                    pos = cnt if cnt < p else p - 1
                    while pos > 0 and m_g[v, pos - 1] < g:
                        m_g[v, pos] = m_g[v, pos - 1]
                        m_par[v, pos] = m_par[v, pos - 1]
                        pos -= 1
                    m_g[v, pos] = g
                    m_par[v, pos] = nd_id[u, t] * k + c
                    if cnt < p:
                        cnt += 1
                m_cnt[v] = cnt
        sel = np.arange(m)
        if cap > 0 and m > cap:
            fb = np.empty(m)
            for v in range(m):
                fb[v] = m_g[v, 0]
            sel = np.argsort(-fb, kind="mergesort")[:cap]
        n_nodes = sel.shape[0]
        n_states += n_nodes
        nd_state = np.empty(n_nodes, np.int64)
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
            nd_cnt[r] = m_cnt[v]
            for t in range(m_cnt[v]):
                nd_g[r, t] = m_g[v, t]
                e_cd[n_ent] = m_par[v, t] % k
                e_par[n_ent] = m_par[v, t] // k
                nd_id[r, t] = n_ent
                n_ent += 1
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
    return out, scores, n_ent, n_states


@njit(cache=True, nogil=True)
def _state_pbest(tok, hl, widths, alpha, p, start, off, lab, cost, nxt, bon, boc, uni, V, unk, tab, tok_ub):
    """Exact p best of ``tok int64[h, k]`` / ``hl float64[h, k]`` / ``widths int64[h]`` from LM
    state ``start`` (see the module docstring). ``tok_ub float64[V + 1]``: the largest ln p of
    each label in any context (``tok_ub[V]``: an unknown id)."""
    h, k = tok.shape
    ub = np.zeros(h + 1)
    cub = np.empty((h, k))  # per candidate: head score + alpha * its best ln p in any context
    for i in range(h - 1, -1, -1):
        best = -np.inf
        for c in range(widths[i]):
            t = tok[i, c]
            b = tok_ub[t] if 0 <= t < V else tok_ub[V]
            v = hl[i, c] + alpha * b
            cub[i, c] = v
            if v > best:
                best = v
        ub[i] = ub[i + 1] + best
    msize = 1024
    mk = np.full(msize, -1, np.int64)
    mn = np.empty(msize, np.int64)
    mc = np.empty(msize)
    lower = -np.inf
    if h > 2:
        _, sc, _, _ = _layers(tok, hl, widths, alpha, p, start, -np.inf, max(BEAM_CAP, p), ub, cub, off, lab, cost, nxt,
                              bon, boc, uni, V, unk, tab, mk, mn, mc)
        if sc.shape[0] == p:
            lower = sc[p - 1]
    return _layers(tok, hl, widths, alpha, p, start, lower, 0, ub, cub, off, lab, cost, nxt, bon, boc, uni, V, unk, tab,
                   mk, mn, mc)

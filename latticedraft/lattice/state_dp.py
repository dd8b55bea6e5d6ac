"""Exact p best for n-gram LMs of any order: a dynamic program over the LM states the lattice reaches.

The LM state after a prefix (the automaton state: the longest suffix of the history that the
model keeps as a context) fixes the score of every continuation, so prefixes that reach the
same state at the same slot compete only with each other: per slot and reached state the
program keeps the ``p`` best partial paths, best first. A path among the global p best is
among the p best of its state at every slot (a better path into the same state would beat it
to the end), so the p best over the last slot's states are the exact p best, as distinct
token strings.

*Shared back-off.* The LM step from a state ``s`` to candidate ``c`` is the arc ``(s, c)``
if the model has it, else ``-ln bo(s)`` plus the step from ``s``'s back-off state. The
program keeps, per slot, the reached states closed under back-off (shorter contexts are
added as nodes without partial paths) and fills a table ``step[node, c]`` from the shortest
context up: a node copies its back-off parent's row (plus its back-off cost) and overwrites
the candidates it has arcs for. Each step thus costs one read of the state's own arcs,
never a walk down the back-off chain, and the work grows with the states reached (a few
hundred per slot on a 51 M n-gram 5-gram), linearly in ``h`` and ``k``, not with the order.
The target of a step inherited from a back-off parent is the parent's, so the next slot's
state map is probed once per arc actually used (``owner``), not once per node and candidate.

*Memory.* On gigabyte tables a random read is a TLB miss as well as a cache miss (and on a
virtual machine a two-level page walk), so reads are few and grouped: a row of up to
``SCAN_ROW`` arcs is scanned whole through a label -> candidate map (one or two pages), a
longer row is binary-searched once per candidate in ascending label order (the arc hash
would cost two random pages per candidate), and every slot issues its rows', arcs' and
back-off reads as prefetches over all nodes before using them.

Scores: ``sum_i head_logp[i, y_i] + alpha * ln p(y_i | history, y_<i)`` (float64), the
history entering as the start state. Returns ``(cand int64[m, h], scores float64[m],
nodes, partials)``, best first; equal scores keep the order in which they were reached.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from latticedraft.lattice._prefetch import prefetch
from latticedraft.lattice.lm_tables import _hash

SCAN_ROW = 1024  # rows with at most this many arcs are scanned whole; longer ones binary-searched


@njit(cache=True, inline="always")
def _node(table, mask, st, n_st, s):
    """Index of state ``s`` in the slot's open-addressing map (``table`` of node ids, -1 empty;
    ``st`` the nodes' states), or ``-(slot + 1)`` where it would go."""
    slot = _hash(s, 1, mask)
    while True:
        v = table[slot]
        if v < 0:
            return -(slot + 1)
        if st[v] == s:
            return v
        slot = (slot + 1) & mask


@njit(cache=True, nogil=True)
def _state_pbest(tok, hl, widths, alpha, p, start, scan_row, off, lab, cost, nxt, bon, boc, uni, V, unk, tab):
    """``tok int64[h, k]``, ``hl float64[h, k]`` (head ln p), ``widths int64[h]``; ``start``: the
    history's LM state; ``scan_row``: ``SCAN_ROW``; the LM arguments are ``LMArrays.lm_args()``
    (``tab`` is not read)."""
    h, k = tok.shape
    # back-pointer entries: candidate index and parent entry (entry 0 is the empty prefix)
    e_cd = np.empty(1024, np.int64)
    e_par = np.empty(1024, np.int64)
    e_cd[0] = 0
    e_par[0] = -1
    n_ent = 1
    # the current slot's nodes (in back-off order: a node's back-off parent comes first)
    cap = 64
    st = np.empty(cap, np.int64)
    bo = np.empty(cap, np.int64)
    cnt = np.zeros(cap, np.int64)
    g = np.empty((cap, p))
    ent = np.empty((cap, p), np.int64)
    order = np.empty(cap, np.int64)
    n = 0
    n_nodes = 0
    n_part = 0
    cmap = np.full(V + 2, -1, np.int16)
    srt = np.empty(k, np.int64)
    chain = np.empty(64, np.int64)
    # slot 0 starts from the history's state, closed under back-off
    tsize = 64
    table = np.full(tsize, -1, np.int64)
    s = start
    m = 0
    while True:
        chain[m] = s
        m += 1
        if s == uni or bon[s] < 0:
            break
        s = bon[s]
    for q in range(m - 1, -1, -1):
        st[n] = chain[q]
        bo[n] = n - 1 if q < m - 1 else -1
        cnt[n] = 0
        order[n] = n
        r = _node(table, tsize - 1, st, n, chain[q])
        table[-r - 1] = n
        n += 1
    cnt[n - 1] = 1
    g[n - 1, 0] = 0.0
    ent[n - 1, 0] = 0
    for i in range(h):
        w = widths[i]
        n_nodes += n
        # label -> candidate map for the slot (a repeated candidate: binary-search every row)
        dup = False
        nsort = 0
        for c in range(w):
            t = tok[i, c]
            if 0 <= t < V:
                if cmap[t + 1] >= 0:
                    dup = True
                cmap[t + 1] = c
                srt[nsort] = c
                nsort += 1
        for q in range(1, nsort):  # the in-vocabulary candidates in ascending label order
            c = srt[q]
            x = tok[i, c]
            j = q
            while j > 0 and tok[i, srt[j - 1]] > x:
                srt[j] = srt[j - 1]
                j -= 1
            srt[j] = c
        # step[u, c]: next state and ln p, from the shortest context up. The table reads are
        # issued in stages over all nodes (rows, then arcs), so their cache misses overlap.
        for u in range(n):
            prefetch(off, st[u])
            prefetch(boc, st[u])
        arc = np.full((n, w), -1, np.int64)
        lo_u = np.empty(n, np.int64)
        hi_u = np.empty(n, np.int64)
        for u in range(n):
            s = st[u]
            lo = off[s]
            hi = off[s + 1]
            lo_u[u] = lo
            hi_u[u] = hi
            if s == uni:
                for c in range(w):
                    t = tok[i, c]
                    if 0 <= t < V:
                        prefetch(nxt, lo + t)
                        prefetch(cost, lo + t)
            elif hi - lo <= scan_row and not dup:
                for a in range(lo, hi, 16):
                    prefetch(lab, a)
            else:
                prefetch(lab, (lo + hi) >> 1)
        for u in range(n):  # arcs of each node to the slot's candidates
            s = st[u]
            lo = lo_u[u]
            hi = hi_u[u]
            if s == uni:
                for c in range(w):
                    t = tok[i, c]
                    if 0 <= t < V:
                        arc[u, c] = lo + t
            elif hi - lo <= scan_row and not dup:
                for a in range(lo, hi):
                    c = cmap[lab[a]]
                    if c >= 0:
                        arc[u, c] = a
                        prefetch(nxt, a)
                        prefetch(cost, a)
            else:  # a long row: one narrowing binary search per candidate, in label order
                pos = lo
                for q in range(nsort):
                    c = srt[q]
                    x = tok[i, c] + 1
                    aa = pos
                    bb = hi
                    while aa < bb:
                        mid = (aa + bb) >> 1
                        if lab[mid] < x:
                            aa = mid + 1
                        else:
                            bb = mid
                    pos = aa
                    if aa < hi and lab[aa] == x:
                        arc[u, c] = aa
                        prefetch(nxt, aa)
                        prefetch(cost, aa)
        # owner[u, c]: the node whose own arc (or unseen cost) the step uses; the step's target
        # node in the next slot is looked up once per owner (tgt), not once per node
        s_ns = np.empty((n, w), np.int64)
        s_lp = np.empty((n, w))
        owner = np.empty((n, w), np.int64)
        n_own = 0
        for oi in range(n):
            u = order[oi]
            s = st[u]
            pb = bo[u]
            bc = boc[s] if pb >= 0 else 0.0
            for c in range(w):
                a = arc[u, c]
                if a >= 0:
                    s_ns[u, c] = nxt[a]
                    s_lp[u, c] = -cost[a]
                    owner[u, c] = u
                    n_own += 1
                elif pb >= 0:
                    s_ns[u, c] = s_ns[pb, c]
                    s_lp[u, c] = s_lp[pb, c] - bc
                    owner[u, c] = owner[pb, c]
                else:  # the null state (an unknown id) or no back-off state: the unseen cost
                    s_ns[u, c] = uni
                    s_lp[u, c] = -unk
                    owner[u, c] = u
                    n_own += 1
        tgt = np.full((n, w), -1, np.int64)
        for c in range(w):
            t = tok[i, c]
            if 0 <= t < V:
                cmap[t + 1] = -1
        # relax every partial path of every node over every candidate; the next slot's nodes
        # are the distinct targets (at most one per owner and candidate: n_own)
        n2cap = 16
        while n2cap < 2 * n_own:
            n2cap *= 2
        tsize = 2 * n2cap
        table = np.full(tsize, -1, np.int64)
        mask = tsize - 1
        st2 = np.empty(n2cap, np.int64)
        cnt2 = np.zeros(n2cap, np.int64)
        g2 = np.empty((n_own, p))
        par2 = np.empty((n_own, p), np.int64)
        m2 = 0
        # p > 1: the nodes with the best partials first, so targets fill with good paths early
        # and later sources stop at their first partial
        if p > 1:
            key = np.empty(n)
            for u in range(n):
                key[u] = -g[u, 0] if cnt[u] > 0 else np.inf
            by = np.argsort(key)
        else:
            by = np.arange(n)
        for ui in range(n):
            u = by[ui]
            cu = cnt[u]
            if cu == 0:
                continue
            for c in range(w):
                stepv = hl[i, c] + alpha * s_lp[u, c]
                ow = owner[u, c]
                v = tgt[ow, c]
                if v < 0:
                    r = _node(table, mask, st2, m2, s_ns[u, c])
                    if r < 0:
                        v = m2
                        st2[v] = s_ns[u, c]
                        cnt2[v] = 0
                        table[-r - 1] = v
                        m2 += 1
                    else:
                        v = r
                    tgt[ow, c] = v
                if p == 1:
                    gg = g[u, 0] + stepv
                    if cnt2[v] == 0 or gg > g2[v, 0]:
                        g2[v, 0] = gg
                        par2[v, 0] = ent[u, 0] * k + c
                        cnt2[v] = 1
                    continue
                cv = cnt2[v]
                for t in range(cu):
                    gg = g[u, t] + stepv
                    if cv == p and gg <= g2[v, p - 1]:
                        break  # this and u's later (worse) partials cannot enter v's p best
                    pos = cv if cv < p else p - 1
                    while pos > 0 and g2[v, pos - 1] < gg:
                        g2[v, pos] = g2[v, pos - 1]
                        par2[v, pos] = par2[v, pos - 1]
                        pos -= 1
                    g2[v, pos] = gg
                    par2[v, pos] = ent[u, t] * k + c
                    if cv < p:
                        cv += 1
                cnt2[v] = cv
        # back-pointer entries of the new partials
        need = n_ent
        for v in range(m2):
            need += cnt2[v]
            n_part += cnt2[v]
        if need > e_cd.shape[0]:
            size = max(need, 2 * e_cd.shape[0])
            t1 = np.empty(size, np.int64)
            t1[:n_ent] = e_cd[:n_ent]
            e_cd = t1
            t2 = np.empty(size, np.int64)
            t2[:n_ent] = e_par[:n_ent]
            e_par = t2
        if i == h - 1:
            n = m2
            st = st2
            cnt = cnt2
            g = g2
            ent = np.empty((max(m2, 1), p), np.int64)
            for v in range(m2):
                for t in range(cnt2[v]):
                    e_cd[n_ent] = par2[v, t] % k
                    e_par[n_ent] = par2[v, t] // k
                    ent[v, t] = n_ent
                    n_ent += 1
            break
        # close the reached states under back-off; nodes ordered parents first
        n_real = m2
        bo2 = np.empty(n2cap, np.int64)
        order2 = np.empty(n2cap, np.int64)
        placed = np.zeros(n2cap, np.bool_)
        for v in range(n_real):
            prefetch(bon, st2[v])
        n_ord = 0
        for v0 in range(n_real):
            if placed[v0]:
                continue
            # walk up the back-off chain to a placed node (or the null state's end)
            m = 0
            v = v0
            top = -1
            while True:
                if m == chain.shape[0]:
                    tmp = np.empty(2 * m, np.int64)
                    tmp[:m] = chain
                    chain = tmp
                chain[m] = v
                m += 1
                s = st2[v]
                if s == uni or bon[s] < 0:
                    break
                b = bon[s]
                r = _node(table, mask, st2, m2, b)
                if r >= 0:
                    if placed[r]:
                        top = r
                        break
                    v = r
                else:
                    if m2 == n2cap:  # grow the node arrays (virtual nodes can outnumber the real ones)
                        n2cap *= 2
                        st2 = _grow1(st2, n2cap)
                        cnt2 = _grow1(cnt2, n2cap)
                        bo2 = _grow1(bo2, n2cap)
                        order2 = _grow1(order2, n2cap)
                        placed = _grow1(placed, n2cap)
                    v = m2
                    st2[v] = b
                    cnt2[v] = 0
                    placed[v] = False
                    m2 += 1
                    if 2 * m2 > tsize:  # keep the map at most half full
                        tsize *= 2
                        mask = tsize - 1
                        table = _rehash(st2, m2, tsize)
                    else:
                        table[-r - 1] = v
            for q in range(m - 1, -1, -1):
                x = chain[q]
                bo2[x] = chain[q + 1] if q < m - 1 else top
                placed[x] = True
                order2[n_ord] = x
                n_ord += 1
        n = m2
        st = st2
        bo = bo2
        cnt = cnt2
        g = g2
        order = order2
        ent = np.empty((max(n_real, 1), p), np.int64)
        for v in range(n_real):
            for t in range(cnt2[v]):
                e_cd[n_ent] = par2[v, t] % k
                e_par[n_ent] = par2[v, t] // k
                ent[v, t] = n_ent
                n_ent += 1
    # the p best over the last slot's states
    total = 0
    for v in range(n):
        total += cnt[v]
    fg = np.empty(total)
    fid = np.empty(total, np.int64)
    q = 0
    for v in range(n):
        for t in range(cnt[v]):
            fg[q] = g[v, t]
            fid[q] = ent[v, t]
            q += 1
    sel = np.argsort(-fg, kind="mergesort")[:p]
    m = sel.shape[0]
    cand = np.empty((m, h), np.int64)
    scores = np.empty(m)
    for r in range(m):
        scores[r] = fg[sel[r]]
        e = fid[sel[r]]
        for i in range(h - 1, -1, -1):
            cand[r, i] = e_cd[e]
            e = e_par[e]
    return cand, scores, n_nodes, n_part


@njit(cache=True)
def _rehash(st, m, tsize):
    """A fresh map of ``tsize`` slots over the states ``st[:m]``."""
    table = np.full(tsize, -1, np.int64)
    mask = tsize - 1
    for x in range(m):
        r = _node(table, mask, st, x, st[x])
        table[-r - 1] = x
    return table


@njit(cache=True, inline="always")
def _grow1(a, size):
    """``a`` copied into a new array of ``size`` entries."""
    b = np.empty(size, a.dtype)
    b[:a.shape[0]] = a
    return b

"""Exact p best for n-gram LMs of any order: a dynamic program over the LM states the lattice reaches.

The LM state after a prefix (the automaton state: the longest suffix of the history that the
model keeps as a context) fixes the score of every continuation, so the prefixes reaching the
same state at the same slot can be merged: the search graph's nodes are (slot, state).

1. *Forward* (``_state_pbest``): slot by slot, the states reached and the best path into each
   (1-best: done, read back through the back-pointers).
2. *Backward* (``_pbest_paths``, p > 1): from the recorded edges, every node's exact best
   completion score.
3. *Best first*: from the start node, partial paths ordered by score + exact best completion;
   complete paths pop in score order after expanding only the nodes on them (about ``p * h``
   pops of ``k`` pushes each). Distinct graph paths are distinct token strings (the tokens fix
   the states), so the p popped paths are the exact p best, distinct.

*Shared back-off.* The LM step from a state ``s`` to candidate ``c`` is the arc ``(s, c)``
if the model has it, else ``-ln bo(s)`` plus the step from ``s``'s back-off state. The
forward pass keeps, per slot, the reached states closed under back-off (shorter contexts are
added as nodes without a path) and fills ``step[node, c]`` from the shortest context up: a
node copies its back-off parent's row (plus its back-off cost) and overwrites the candidates
it has arcs for. Each step thus costs one read of the state's own arcs, never a walk down the
back-off chain, and the work grows with the states reached (a few hundred per slot on a 51 M
n-gram 5-gram), linearly in ``h`` and ``k``, not with the order. A step inherited from a
back-off parent has the parent's target, so the next slot's state map is probed once per arc
actually used (``owner``), not once per node and candidate.

*Memory.* On gigabyte tables a random read is a cache miss (and a TLB miss where the tables
are not mapped with huge pages), so reads are few and grouped: a state's arc range and back-off
are one 16-byte record (``LMArrays.state_rec``: one line, not three arrays' lines); a row of up to
``SCAN_ROW`` arcs is scanned whole through a label -> candidate map (one or two pages), a
longer row is binary-searched once per candidate in ascending label order (the arc hash
would cost two random pages per candidate), and every slot issues its rows', arcs' and
back-off reads as prefetches over all nodes before using them.

Scores: ``sum_i head_logp[i, y_i] + alpha * ln p(y_i | history, y_<i)`` (float64), the
history entering as the start state. Returns ``(cand int64[m, h], scores float64[m],
nodes, items)``, best first (``nodes``: forward nodes over all slots; ``items``: paths kept
plus best-first items).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from latticedraft.lattice._prefetch import prefetch
from latticedraft.lattice.best_first import _grow_to, _heap_pop, _heap_push, _read_path
from latticedraft.lattice.lm_tables import _hash

SCAN_ROW = 512  # rows with at most this many arcs are scanned whole; longer ones binary-searched


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
def _state_pbest(tok, hl, widths, alpha, p, start, scan_row, off, lab, cost, nxt, bon, boc, uni, V, unk, tab, rec,
                 recf):
    """``tok int64[h, k]``, ``hl float64[h, k]`` (head ln p), ``widths int64[h]``; ``start``: the
    history's LM state; ``scan_row``: ``SCAN_ROW``; the LM arguments are ``LMArrays.lm_args()``
    (``tab`` is not read; states are read from ``rec, recf = LMArrays.state_args()``)."""
    h, k = tok.shape
    # back-pointer entries: candidate index and parent entry (entry 0 is the empty prefix)
    e_cd = np.empty(1024, np.int64)
    e_par = np.empty(1024, np.int64)
    e_cd[0] = 0
    e_par[0] = -1
    n_ent = 1
    # the current slot's nodes (``order``: a node's back-off parent comes first); ``has``: the
    # node has a path (closure nodes have none), ``g`` its best score, ``ent`` its entry
    cap = 64
    st = np.empty(cap, np.int64)
    bo = np.empty(cap, np.int64)
    has = np.zeros(cap, np.bool_)
    g = np.empty(cap)
    ent = np.empty(cap, np.int64)
    order = np.empty(cap, np.int64)
    n = 0
    n_nodes = 0
    n_part = 0
    cmap = np.full(V + 2, -1, np.int16)
    srt = np.empty(k, np.int64)
    chain = np.empty(64, np.int64)
    # p > 1: every slot's edges, for _pbest_paths
    ev = np.empty(4096 if p > 1 else 1, np.int64)
    ew = np.empty(4096 if p > 1 else 1)
    eb = np.zeros(h + 1, np.int64)
    nb = np.zeros(h + 2, np.int64)
    e_used = 0
    # slot 0 starts from the history's state, closed under back-off
    tsize = 64
    table = np.full(tsize, -1, np.int64)
    s = start
    m = 0
    while True:
        chain[m] = s
        m += 1
        if s == uni or rec[4 * s + 2] < 0:
            break
        s = rec[4 * s + 2]
    for q in range(m - 1, -1, -1):
        st[n] = chain[q]
        bo[n] = n - 1 if q < m - 1 else -1
        order[n] = n
        r = _node(table, tsize - 1, st, n, chain[q])
        table[-r - 1] = n
        n += 1
    start_node = n - 1
    has[start_node] = True
    g[start_node] = 0.0
    ent[start_node] = 0
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
            prefetch(rec, 4 * st[u])
        arc = np.full((n, w), -1, np.int64)
        lo_u = np.empty(n, np.int64)
        hi_u = np.empty(n, np.int64)
        for u in range(n):
            s = st[u]
            lo = np.int64(rec[4 * s])
            hi = np.int64(rec[4 * s + 1])
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
            bc = recf[4 * s + 3] if pb >= 0 else 0.0
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
        # relax: the best path into each next-slot state (a node without one is a back-off
        # closure node). The next slot's nodes are the distinct targets, at most one per owner
        # and candidate (n_own).
        n2cap = 16
        while n2cap < 2 * n_own:
            n2cap *= 2
        tsize = 2 * n2cap
        table = np.full(tsize, -1, np.int64)
        mask = tsize - 1
        st2 = np.empty(n2cap, np.int64)
        has2 = np.zeros(n2cap, np.bool_)
        g2 = np.empty(n_own)
        par2 = np.empty(n_own, np.int64)
        m2 = 0
        for u in range(n):
            if not has[u]:
                continue
            for c in range(w):
                ow = owner[u, c]
                v = tgt[ow, c]
                if v < 0:
                    r = _node(table, mask, st2, m2, s_ns[u, c])
                    if r < 0:
                        v = m2
                        st2[v] = s_ns[u, c]
                        table[-r - 1] = v
                        m2 += 1
                    else:
                        v = r
                    tgt[ow, c] = v
                gg = g[u] + (hl[i, c] + alpha * s_lp[u, c])
                if not has2[v] or gg > g2[v]:
                    g2[v] = gg
                    par2[v] = ent[u] * k + c
                    has2[v] = True
        if p > 1:  # keep the slot's edges (node, candidate) -> (next node, step score)
            if e_used + n * w > ev.shape[0]:
                size = max(e_used + n * w, 2 * ev.shape[0])
                t1 = np.empty(size, np.int64)
                t1[:e_used] = ev[:e_used]
                ev = t1
                t3 = np.empty(size)
                t3[:e_used] = ew[:e_used]
                ew = t3
            eb[i] = e_used
            nb[i + 1] = nb[i] + n
            for u in range(n):
                row = e_used + u * w
                for c in range(w):
                    if has[u]:
                        ev[row + c] = tgt[owner[u, c], c]
                        ew[row + c] = hl[i, c] + alpha * s_lp[u, c]
                    else:
                        ev[row + c] = -1
            e_used += n * w
        n_part += m2
        # back-pointer entries of the new best paths
        if n_ent + m2 > e_cd.shape[0]:
            size = max(n_ent + m2, 2 * e_cd.shape[0])
            t1 = np.empty(size, np.int64)
            t1[:n_ent] = e_cd[:n_ent]
            e_cd = t1
            t2 = np.empty(size, np.int64)
            t2[:n_ent] = e_par[:n_ent]
            e_par = t2
        ent = np.empty(max(m2, 1), np.int64)
        for v in range(m2):
            e_cd[n_ent] = par2[v] % k
            e_par[n_ent] = par2[v] // k
            ent[v] = n_ent
            n_ent += 1
        if i == h - 1:
            n = m2
            g = g2
            break
        # close the reached states under back-off; nodes ordered parents first
        n_real = m2
        bo2 = np.empty(n2cap, np.int64)
        order2 = np.empty(n2cap, np.int64)
        placed = np.zeros(n2cap, np.bool_)
        for v in range(n_real):
            prefetch(rec, 4 * st2[v])
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
                if s == uni or rec[4 * s + 2] < 0:
                    break
                b = rec[4 * s + 2]
                r = _node(table, mask, st2, m2, b)
                if r >= 0:
                    if placed[r]:
                        top = r
                        break
                    v = r
                else:
                    if m2 == n2cap:  # grow the node arrays (closure nodes can outnumber the rest)
                        n2cap *= 2
                        st2 = _grow_to(st2, n2cap)
                        has2 = _grow_to(has2, n2cap)
                        bo2 = _grow_to(bo2, n2cap)
                        order2 = _grow_to(order2, n2cap)
                        placed = _grow_to(placed, n2cap)
                    v = m2
                    st2[v] = b
                    has2[v] = False
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
        has = has2
        g = g2
        order = order2
    if p == 1:  # the best final state's path
        best = 0
        for v in range(1, n):
            if g[v] > g[best]:
                best = v
        cand = np.empty((1, h), np.int64)
        scores = np.full(1, g[best])
        e = ent[best]
        for i in range(h - 1, -1, -1):
            cand[0, i] = e_cd[e]
            e = e_par[e]
        return cand, scores, n_nodes, n_part
    nb[h + 1] = nb[h] + n
    return _pbest_paths(widths, p, start_node, ev, ew, eb, nb, n_nodes, n_part)


@njit(cache=True)
def _pbest_paths(widths, p, start_node, ev, ew, eb, nb, n_nodes, n_part):
    """The p best paths of the state graph the forward pass recorded (slot ``i``'s node ``u``
    has edges ``ev/ew[eb[i] + u * w + c]`` to slot ``i + 1``'s nodes; node ``u`` of slot ``i``
    is ``nb[i] + u`` overall). A backward pass gives every node's exact best completion, so a
    best-first search from the start pops complete paths best first after expanding only the
    nodes on them (about ``p * h`` pops)."""
    h = widths.shape[0]
    sb = np.empty(nb[h + 1])
    for v in range(nb[h], nb[h + 1]):
        sb[v] = 0.0
    for i in range(h - 1, -1, -1):
        w = widths[i]
        for u in range(nb[i + 1] - nb[i]):
            row = eb[i] + u * w
            best = -np.inf
            if ev[row] >= 0:
                for c in range(w):
                    val = ew[row + c] + sb[nb[i + 1] + ev[row + c]]
                    if val > best:
                        best = val
            sb[nb[i] + u] = best
    # best-first over (slot, node) items; priority g + exact best completion
    cap = 64
    it_g = np.empty(cap)
    it_slot = np.empty(cap, np.int64)
    it_node = np.empty(cap, np.int64)
    it_par = np.empty(cap, np.int64)
    it_c = np.empty(cap, np.int64)
    hf = np.empty(cap)
    hid = np.empty(cap, np.int64)
    it_g[0] = 0.0
    it_slot[0] = 0
    it_node[0] = start_node
    it_par[0] = -1
    it_c[0] = -1
    n_it = 1
    hf[0] = sb[start_node]
    hid[0] = 0
    n_heap = 1
    done = np.empty(p, np.int64)
    found = 0
    while found < p and n_heap > 0:
        _, top = _heap_pop(hf, hid, n_heap)
        n_heap -= 1
        i = it_slot[top]
        if i == h:
            done[found] = top
            found += 1
            continue
        w = widths[i]
        row = eb[i] + it_node[top] * w
        if n_it + w > cap or n_heap + w > hf.shape[0]:
            cap = 2 * (cap + w)
            it_g = _grow_to(it_g, cap)
            it_slot = _grow_to(it_slot, cap)
            it_node = _grow_to(it_node, cap)
            it_par = _grow_to(it_par, cap)
            it_c = _grow_to(it_c, cap)
            hf = _grow_to(hf, cap)
            hid = _grow_to(hid, cap)
        for c in range(w):
            v = ev[row + c]
            gg = it_g[top] + ew[row + c]
            it_g[n_it] = gg
            it_slot[n_it] = i + 1
            it_node[n_it] = v
            it_par[n_it] = top
            it_c[n_it] = c
            _heap_push(hf, hid, n_heap, gg + sb[nb[i + 1] + v], n_it)
            n_heap += 1
            n_it += 1
    cand = np.empty((found, h), np.int64)
    scores = np.empty(found)
    for r in range(found):
        scores[r] = it_g[done[r]]
        _read_path(it_c, it_par, done[r], cand[r])
    return cand, scores, n_nodes, n_part + n_it


@njit(cache=True)
def _rehash(st, m, tsize):
    """A fresh map of ``tsize`` slots over the states ``st[:m]``."""
    table = np.full(tsize, -1, np.int64)
    mask = tsize - 1
    for x in range(m):
        r = _node(table, mask, st, x, st[x])
        table[-r - 1] = x
    return table

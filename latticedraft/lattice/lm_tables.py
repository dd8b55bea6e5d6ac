"""The exact LM step of the compiled searches, over ``LMArrays`` (``lm/search_tables.py``).

``_step`` is the exact LM step with true back-off semantics (a lookup that misses a state
adds the state's back-off cost and retries at its back-off state, exactly like KenLM's
``BaseScore``): short CSR rows are scanned, long rows go through the open-addressing hash
table ``arc_hash`` (``_find``).
Costs are ``-ln p`` (float32 arrays, float64 in the kernels). The kernels here are inlined into
``triple_dp``, ``state_dp`` and ``batched``; numba's on-disk cache does not
notice edits in another file, so importing ``latticedraft.lattice`` drops caches older than any
of their sources (``_numba_cache.drop_stale``).

``LMArrays``, ``lm_arrays`` and the table builders live in ``latticedraft.lm.search_tables``
(the build writes them to disk) and are re-exported here.
"""

from __future__ import annotations

from numba import njit

from latticedraft.lm.search_tables import (  # noqa: F401  (re-exported)
    P2_ENTRY, UNSEEN_COST, X3_ENTRY, LMArrays, _fingerprint, _hash, build_arrays, lm_arrays,
)


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


@njit(cache=True)
def _walk(s, ids, off, lab, cost, nxt, bon, boc, uni, V, unk, tab):
    for t in ids:
        s = _step(s, t + 1, off, lab, cost, nxt, bon, boc, uni, V, unk, tab)[0]
    return s

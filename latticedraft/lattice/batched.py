"""Exact p best of many sausages in one compiled call: the batch kernel.

``rescore`` and ``rescore_batch`` both end here for ``method="exact"``, so a lattice gets the
same drafts alone or in a batch. Per lattice the kernel computes the LM state of the history
and runs the state program (``state_dp``), with no Python in between. The GIL is released;
``pbest_batch`` splits the batch over threads.

Inputs (padded, one row per lattice): ``tokens int64[B, h, k]`` (-1 padding),
``logp float32[B, h, k]``, ``widths int64[B, h]`` (0 past a lattice's depth), ``depth
int64[B]``; ``hist int64[B, n]`` with ``hist_len int64[B]``: the last ``n = order - 1``
history ids (fewer: ``<s>`` precedes them). Ids outside the vocabulary are allowed anywhere.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from latticedraft.lattice.lm_tables import LMArrays, _step
from latticedraft.lattice.state_dp import SCAN_ROW, _state_pbest


@njit(cache=True, nogil=True)
def _batch_kernel(tok, logp, widths, depth, hist, hist_len, alpha, p, order, start, scan_row, off, lab, cost, nxt,
                  bon, boc, uni, V, unk, tab, out_tok, out_score, out_n):
    """Fills ``out_tok int64[B, p, h]`` (token ids), ``out_score float32[B, p]`` and
    ``out_n int64[B]`` (paths found: ``min(p, number of paths)``), best first per lattice."""
    B = tok.shape[0]
    n = order - 1
    for b in range(B):
        L = hist_len[b]
        # the LM state after the history: an unknown id restarts the context at the null state
        cut = -1
        for i in range(L):
            if hist[b, i] >= V:
                cut = i
        s = uni if cut >= 0 or L >= n else start
        for i in range(cut + 1, L):
            s = _step(s, hist[b, i] + 1, off, lab, cost, nxt, bon, boc, uni, V, unk, tab)[0]
        h = depth[b]
        hl = logp[b, :h].astype(np.float64)
        cand, scores, _, _ = _state_pbest(tok[b, :h], hl, widths[b, :h], alpha, p, s, scan_row, off, lab, cost,
                                          nxt, bon, boc, uni, V, unk, tab)
        found = scores.shape[0]
        out_n[b] = found
        for q in range(found):
            out_score[b, q] = scores[q]
            for i in range(h):
                out_tok[b, q, i] = tok[b, i, cand[q, i]]


def pbest_batch(tokens: np.ndarray, logp: np.ndarray, widths: np.ndarray, depth: np.ndarray, hist: np.ndarray,
                hist_len: np.ndarray, arrays: LMArrays, alpha: float, p: int, pool=None, chunks: int = 1):
    """``(tok int64[B, p, h], scores float32[B, p], found int64[B])`` for padded inputs (see the
    module docstring). With a thread ``pool`` the batch is cut into ``chunks`` contiguous parts,
    one kernel call each."""
    A = arrays
    B, H, _ = tokens.shape
    out_tok = np.zeros((B, p, H), np.int64)
    out_score = np.zeros((B, p), np.float32)
    out_n = np.zeros(B, np.int64)

    def run(lo, hi):
        _batch_kernel(tokens[lo:hi], logp[lo:hi], widths[lo:hi], depth[lo:hi], hist[lo:hi], hist_len[lo:hi],
                      float(alpha), int(p), int(A.order), int(A.start), SCAN_ROW, *A.lm_args(),
                      out_tok[lo:hi], out_score[lo:hi], out_n[lo:hi])

    chunks = max(1, min(int(chunks), B))
    if pool is None or chunks == 1:
        run(0, B)
    else:
        cuts = np.linspace(0, B, chunks + 1).astype(int)
        list(pool.map(lambda i: run(cuts[i], cuts[i + 1]), range(chunks)))
    return out_tok, out_score, out_n

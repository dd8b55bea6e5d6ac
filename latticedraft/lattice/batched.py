"""Exact p best of many sausages in one compiled call: the batch kernels.

``rescore`` and ``rescore_batch`` both end here for ``method="exact"``, so a lattice gets the
same drafts alone or in a batch. Order <= 4 (``_batch_kernel``): per lattice the kernel does
what ``search.exact_pbest`` does after ``search._extend`` — the LM
state of the history, the history's last tokens as width-1 pseudo-slots, the triple dynamic
program and the best-first read-out — with the scratch arrays allocated once per call and
no Python in between. Above order 4 (``_state_batch_kernel``): the history's state, then the
state program (``state_dp``). The GIL is released; ``pbest_batch`` splits the batch over threads.

Inputs (padded, one row per lattice): ``tokens int64[B, h, k]`` (-1 padding),
``logp float32[B, h, k]``, ``widths int64[B, h]`` (0 past a lattice's depth), ``depth
int64[B]``; ``hist int64[B, n]`` with ``hist_len int64[B]``: the last ``n = order - 1``
history ids (fewer: ``<s>`` precedes them). Ids outside the vocabulary are allowed anywhere.
"""

from __future__ import annotations

import threading

import numpy as np
from numba import njit

from latticedraft.lattice.lm_tables import LMArrays, _step
from latticedraft.lattice.state_dp import SCAN_ROW, _state_pbest
from latticedraft.lattice.triple_dp import _triple_best_first, _triple_values


@njit(cache=True, nogil=True)
def _batch_kernel(tok, logp, widths, depth, hist, hist_len, alpha, p, order, start, off, lab, cost, nxt, bon,
                  boc, uni, V, unk, tab, uni_logp, ctx1x, p2_off, p2_lab, p2, x_lab, x3, posmap,
                  out_tok, out_score, out_n):
    """Fills ``out_tok int64[B, p, h]`` (token ids), ``out_score float32[B, p]`` and
    ``out_n int64[B]`` (paths found: ``min(p, number of paths)``), best first per lattice.
    ``posmap int64[2, V + 3]``: scratch, all -1, which the triple program leaves all -1."""
    B, H, K = tok.shape
    n = order - 1
    T = np.full((H + 3, K), -1, np.int64)
    W = np.ones(H + 3, np.int64)
    hl = np.zeros((H + 3, K))
    Vv = np.empty((H + 4, K, K, K))
    ctx = np.empty(n + 1, np.int64)
    for b in range(B):
        L = hist_len[b]
        s = _history_start(hist[b], L, n, start, off, lab, cost, nxt, bon, boc, uni, V, unk, tab)
        # the context as pseudo-slots: <s> (code V) before a short history, unknown ids -> V + 1
        m = 0
        if n > 0:
            if L < n:
                ctx[0] = V
                m = 1
            for i in range(L):
                t = hist[b, i]
                ctx[m] = t if t < V else V + 1
                m += 1
        hp = min(m, 3)
        for q in range(hp):
            T[q, 0] = ctx[m - hp + q]
            for c in range(1, K):
                T[q, c] = -1
            W[q] = 1
            for c in range(K):
                hl[q, c] = 0.0
        h = depth[b]
        for i in range(h):
            W[hp + i] = widths[b, i]
            for c in range(K):
                t = tok[b, i, c]
                T[hp + i, c] = V + 1 if t >= V else t
                hl[hp + i, c] = logp[b, i, c]
        E = hp + h
        _triple_values(T[:E], W[:E], hl[:E], hp, alpha, off, lab, cost, nxt, bon, boc, uni, V, unk, tab,
                       uni_logp, ctx1x, p2_off, p2_lab, p2, x_lab, x3, Vv, posmap)
        cand = np.empty((p, h), np.int64)
        scores = np.empty(p)
        found, _ = _triple_best_first(T[:E], W[:E], hl[:E], hp, alpha, p, s, off, lab, cost, nxt, bon, boc, uni,
                                      V, unk, tab, Vv, cand, scores)
        out_n[b] = found
        for q in range(found):
            out_score[b, q] = scores[q]
            for i in range(h):
                out_tok[b, q, i] = tok[b, i, cand[q, i]]


@njit(cache=True, inline="always")
def _history_start(hist, L, n, start, off, lab, cost, nxt, bon, boc, uni, V, unk, tab):
    """The LM state after ``hist[:L]`` (the last ``n`` ids, ``<s>`` before a shorter history);
    an unknown id restarts the context at the null state."""
    cut = -1
    for i in range(L):
        if hist[i] >= V:
            cut = i
    s = uni if cut >= 0 or L >= n else start
    for i in range(cut + 1, L):
        s = _step(s, hist[i] + 1, off, lab, cost, nxt, bon, boc, uni, V, unk, tab)[0]
    return s


@njit(cache=True, nogil=True)
def _state_batch_kernel(tok, logp, widths, depth, hist, hist_len, alpha, p, order, start, scan_row, off, lab, cost,
                        nxt, bon, boc, uni, V, unk, tab, rec, recf, out_tok, out_score, out_n):
    """``_batch_kernel``'s contract for any order, by the state program."""
    for b in range(tok.shape[0]):
        s = _history_start(hist[b], hist_len[b], order - 1, start, off, lab, cost, nxt, bon, boc, uni, V, unk, tab)
        h = depth[b]
        cand, scores, _, _ = _state_pbest(tok[b, :h], logp[b, :h].astype(np.float64), widths[b, :h], alpha, p, s,
                                          scan_row, off, lab, cost, nxt, bon, boc, uni, V, unk, tab, rec, recf)
        out_n[b] = scores.shape[0]
        for q in range(scores.shape[0]):
            out_score[b, q] = scores[q]
            for i in range(h):
                out_tok[b, q, i] = tok[b, i, cand[q, i]]


_SCRATCH = threading.local()


def _posmap(V: int) -> np.ndarray:
    """This thread's label -> candidate scratch of the triple program, int64[2, V + 3] all -1: made
    once per thread and vocabulary (filling it costs O(V), more than a small lattice's search)."""
    buf = getattr(_SCRATCH, "posmap", None)
    if buf is None or buf.shape[1] != V + 3:
        buf = _SCRATCH.posmap = np.full((2, V + 3), -1, np.int64)
    return buf


def pbest_batch(tokens: np.ndarray, logp: np.ndarray, widths: np.ndarray, depth: np.ndarray, hist: np.ndarray,
                hist_len: np.ndarray, arrays: LMArrays, alpha: float, p: int, pool=None, chunks: int = 1):
    """``(tok int64[B, p, h], scores float32[B, p], found int64[B])`` for padded inputs (see the
    module docstring): the triple program when ``arrays.triple`` exists (order <= 4), else the
    state program. With a thread ``pool`` the batch is cut into ``chunks`` contiguous parts,
    one kernel call each."""
    A = arrays
    B, H, _ = tokens.shape
    out_tok = np.zeros((B, p, H), np.int64)
    out_score = np.zeros((B, p), np.float32)
    out_n = np.zeros(B, np.int64)

    def run(lo, hi):
        args = (tokens[lo:hi], logp[lo:hi], widths[lo:hi], depth[lo:hi], hist[lo:hi], hist_len[lo:hi],
                float(alpha), int(p), int(A.order), int(A.start))
        out = (out_tok[lo:hi], out_score[lo:hi], out_n[lo:hi])
        if A.triple is not None:
            _batch_kernel(*args, *A.lm_args(), A.uni_logp, *A.triple, _posmap(int(A.vocab_size)), *out)
        else:
            _state_batch_kernel(*args, SCAN_ROW, *A.lm_args(), *A.state_args(), *out)

    chunks = max(1, min(int(chunks), B))
    if pool is None or chunks == 1:
        run(0, B)
    else:
        cuts = np.linspace(0, B, chunks + 1).astype(int)
        list(pool.map(lambda i: run(cuts[i], cuts[i + 1]), range(chunks)))
    return out_tok, out_score, out_n

"""Each drafted token's probability under the interpolated model the rescorer ranked with.

A rescored path is the best of ``head_logp + alpha * lm_logp``; the cost-aware tree decides which
of its tokens to verify by each token's chance of being the target's (``planning/draft_tree.py``).
Rated by the heads' probability alone, a token the LM moved up is a token the heads doubt, so the
tree rarely verifies what the rescoring found (docs/rescoring.md). ``token_probs`` rates a path's
token j by the interpolated distribution over slot j's arcs, conditioned on the history and the
path's own tokens before it, with the slot keeping the heads' mass over its arcs:

    q(t) = M_j * exp(s(t)) / sum_a exp(s(a)),   s(a) = head_logp[j, a] + alpha * ln p_LM(a | history, path_<j),
    M_j = sum_a exp(head_logp[j, a])

so at ``alpha = 0`` q is the heads' own probability (``exp(head_logp)``), exactly.

    >>> from latticedraft.lattice.sausage import Sausage
    >>> s = Sausage(np.array([[3, 4]]), np.log(np.array([[0.6, 0.3]], np.float32)))
    >>> token_probs(s, np.array([[4]]), None, 0.0).round(3).tolist()
    [[0.3]]
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numba import njit

from latticedraft.lattice.lm_tables import _step
from latticedraft.lattice.sausage import Sausage

__all__ = ["token_probs"]


def token_probs(sausage: Sausage, paths: np.ndarray, lm, alpha: float, history: Sequence[int] = ()) -> np.ndarray:
    """float64[p, d]: each token of ``paths`` (int64[p, d], -1 pads; token j drafted in slot j of
    ``sausage``) by the interpolated model above, under ``lm`` (an ``NgramLM``/``NgramFst``; None
    or ``alpha = 0``: the heads' probability); 0 after a pad and where the slot lacks the token."""
    from latticedraft.lattice.rescoring import _fst_of, _history_state, lm_arrays

    paths = np.ascontiguousarray(np.atleast_2d(paths), dtype=np.int64)
    logp = sausage.logp.astype(np.float64)
    fst = _fst_of(lm)
    if fst is None or alpha == 0.0:
        return _head_probs(sausage.tokens, logp, sausage.widths, paths)
    arrays = lm_arrays(fst)
    start, _ = _history_state(fst, history)
    return _interpolated(sausage.tokens, logp, sausage.widths, paths, float(alpha), int(start), *arrays.lm_args())


@njit(cache=True)
def _head_probs(tokens, logp, widths, paths):
    p, d = paths.shape
    out = np.zeros((p, d))
    for r in range(p):
        for j in range(min(d, tokens.shape[0])):
            t = paths[r, j]
            if t < 0:
                break
            for a in range(widths[j]):
                if tokens[j, a] == t:
                    out[r, j] = np.exp(logp[j, a])
                    break
    return out


@njit(cache=True)
def _interpolated(tokens, logp, widths, paths, alpha, start, off, lab, cost, nxt, bon, boc, uni, V, unk, tab):
    # A slot's normaliser depends only on the path's prefix before it: paths sharing that prefix
    # (most of a p-best list) reuse it and look up their own token alone.
    p, d = paths.shape
    depth = min(d, tokens.shape[0])
    out = np.zeros((p, d))
    score = np.empty(tokens.shape[1])
    state = np.empty(tokens.shape[1], dtype=np.int64)
    into = np.full((p, depth + 1), -1, dtype=np.int64)  # LM state before slot j of path r
    top = np.zeros((p, depth))
    z = np.zeros((p, depth))
    mass = np.zeros(depth)
    for j in range(depth):
        for a in range(widths[j]):
            mass[j] += np.exp(logp[j, a])
    for r in range(p):
        s = start
        for j in range(depth):
            t = paths[r, j]
            if t < 0:
                break
            into[r, j] = s
            label = t + 1 if t < V else V + 1
            twin = -1
            for q in range(r):  # an earlier path with the same prefix before slot j
                if into[q, j] >= 0 and (j == 0 or paths[q, j - 1] == paths[r, j - 1]) and into[q, j] == s:
                    same = True
                    for i in range(j):
                        if paths[q, i] != paths[r, i]:
                            same = False
                            break
                    if same:
                        twin = q
                        break
            hit = -1
            for a in range(widths[j]):
                if tokens[j, a] == t:
                    hit = a
                    break
            if twin >= 0:
                top[r, j], z[r, j] = top[twin, j], z[twin, j]
                ns, c = _step(s, label, off, lab, cost, nxt, bon, boc, uni, V, unk, tab)
                if hit >= 0:
                    out[r, j] = mass[j] * np.exp(logp[j, hit] - alpha * c - top[r, j]) / z[r, j]
                s = ns
                continue
            best = -np.inf
            for a in range(widths[j]):
                ta = tokens[j, a]
                ns, c = _step(s, ta + 1 if ta < V else V + 1, off, lab, cost, nxt, bon, boc, uni, V, unk, tab)
                state[a] = ns
                score[a] = logp[j, a] - alpha * c
                if score[a] > best:
                    best = score[a]
            total = 0.0
            for a in range(widths[j]):
                total += np.exp(score[a] - best)
            top[r, j], z[r, j] = best, total
            if hit < 0:  # (not a token of the slot: 0, and the path's context goes on)
                s = _step(s, label, off, lab, cost, nxt, bon, boc, uni, V, unk, tab)[0]
                continue
            out[r, j] = mass[j] * np.exp(score[hit] - best) / total
            s = state[hit]
    return out

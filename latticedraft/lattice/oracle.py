"""Oracle drafts: how much a perfect choice from the lattice would be accepted (paper §6.3).

The *reference* is the continuation the target model would produce itself (its greedy tokens).
A draft is accepted up to its first disagreement with the reference; the oracle path picks, slot
by slot, the reference token while the slot offers it. Block efficiency of a step is the accepted
length + 1 (the target's bonus token).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latticedraft.errors import InputError
from latticedraft.lattice.sausage import PAD_TOKEN, Sausage


def accepted_length(draft, reference) -> int:
    """Length of the common prefix of ``draft`` and ``reference`` (int sequences)."""
    d = np.asarray(draft, dtype=np.int64).ravel()
    r = np.asarray(reference, dtype=np.int64).ravel()
    n = min(len(d), len(r))
    diff = np.nonzero(d[:n] != r[:n])[0]
    return int(diff[0]) if len(diff) else n


def reference_ranks(s: Sausage, reference) -> np.ndarray:
    """int64[h]: the rank of the reference token in each slot (0 = best), or -1 where absent
    (also for slots beyond the reference's length)."""
    r = np.asarray(reference, dtype=np.int64).ravel()
    ranks = np.full(s.h, -1, dtype=np.int64)
    for i in range(min(s.h, len(r))):
        hit = np.nonzero((s.tokens[i] == r[i]) & (s.tokens[i] != PAD_TOKEN))[0]
        if len(hit):
            ranks[i] = hit[0]
    return ranks


@dataclass
class Oracle:
    """The oracle path ``tokens int64[h]`` and its ``accepted`` prefix length."""

    tokens: np.ndarray
    accepted: int


def oracle_path(s: Sausage, reference) -> Oracle:
    """The lattice path with the longest accepted prefix (ties: best-scoring, i.e. top-1, tail)."""
    if len(np.asarray(reference).ravel()) == 0:
        raise InputError("the reference continuation is empty; give the target's greedy tokens")
    ranks = reference_ranks(s, reference)
    path = s.top1()
    acc = 0
    for i in range(s.h):
        if ranks[i] < 0:
            break
        path[i] = s.tokens[i, ranks[i]]
        acc += 1
    return Oracle(path, acc)


def oracle_accepted_by_k(s: Sausage, reference, ks) -> np.ndarray:
    """int64[len(ks)]: the oracle's accepted length when each slot offers only its top ``k``
    (Figure 6's input; ``k = 1`` is the vanilla BPD draft)."""
    ranks = reference_ranks(s, reference)
    out = []
    for k in ks:
        ok = (ranks >= 0) & (ranks < int(k))
        bad = np.nonzero(~ok)[0]
        out.append(int(bad[0]) if len(bad) else s.h)
    return np.asarray(out, dtype=np.int64)


def best_accepted(drafts_tokens, reference) -> int:
    """Accepted length of the best of ``p`` drafts (``int[p, d]``), as parallel verification gets."""
    t = np.asarray(drafts_tokens, dtype=np.int64)
    if t.ndim == 1:
        t = t[None]
    return max((accepted_length(row, reference) for row in t), default=0)

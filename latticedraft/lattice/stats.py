"""Statistics of drafts and heads: consecutive repetition (paper Table 3), per-slot entropy
(Figure 2) and ``h_max``, the last head up to which mean entropy rises (Figure 3)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latticedraft.errors import InputError
from latticedraft.lattice.sausage import _as_numpy, _check_finite


@dataclass
class Repetition:
    """``pct_consecutive``: % of adjacent token pairs that are identical; ``mean_max_run``:
    mean over drafts of the longest run of one repeated token (1 = no repetition);
    ``pairs``/``drafts``: how many were counted."""

    pct_consecutive: float
    mean_max_run: float
    pairs: int
    drafts: int


def max_run(draft) -> int:
    """Longest run of identical consecutive tokens in one draft (0 for an empty draft)."""
    d = np.asarray(draft).ravel()
    if len(d) == 0:
        return 0
    change = np.nonzero(d[1:] != d[:-1])[0]
    bounds = np.concatenate([[-1], change, [len(d) - 1]])
    return int(np.diff(bounds).max())


def repetition(drafts) -> Repetition:
    """Table 3's statistics over drafts (a list of 1-D int sequences or an ``int[n, d]`` array)."""
    rows = [np.asarray(r).ravel() for r in drafts]
    if not rows:
        raise InputError("repetition statistics need at least one draft")
    same = sum(int((r[1:] == r[:-1]).sum()) for r in rows)
    pairs = sum(max(len(r) - 1, 0) for r in rows)
    runs = [max_run(r) for r in rows]
    pct = 100.0 * same / pairs if pairs else 0.0
    return Repetition(float(pct), float(np.mean(runs)), int(pairs), len(rows))


def slot_entropy(logits) -> np.ndarray:
    """float64[..., h]: entropy in nats of each head's full softmax, from logits ``[..., h, V]``
    (numpy or torch)."""
    x = _as_numpy(logits).astype(np.float64)
    if x.ndim < 2:
        raise InputError(f"slot_entropy expects logits [..., h, V], got shape {x.shape}")
    _check_finite(x, "logits")
    z = x - x.max(axis=-1, keepdims=True)
    logz = np.log(np.exp(z).sum(axis=-1, keepdims=True))
    logp = z - logz
    return -(np.exp(logp) * logp).sum(axis=-1)


def h_max(mean_entropy) -> int:
    """The paper's ``h_max``: the largest head index k (1-based) such that mean entropy is
    non-decreasing over heads 1..k."""
    e = np.asarray(mean_entropy, dtype=np.float64).ravel()
    if len(e) == 0:
        raise InputError("h_max needs the mean entropy of at least one head")
    k = 1
    while k < len(e) and e[k - 1] <= e[k]:
        k += 1
    return k

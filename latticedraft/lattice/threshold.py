"""Pruning a sausage: static threshold, Otsu adaptive threshold per slot, back-off depth.

After DynaMo (section 3.2.2): a static threshold ``eps`` drops arcs with probability below it;
Otsu's method (OpenCV, on the slot's probabilities quantised to uint8, optionally after a
3-tap Gaussian blur) picks a per-slot threshold on top of that; back-off cuts the lattice at
the first slot whose best probability is below ``eps_b``, so the draft is only as long as the
heads are confident. Every operation keeps each slot's best arc and at least one slot: a
lattice never becomes empty.

Probabilities are ``exp(logp)`` of the head (the full-vocabulary softmax, not renormalised
over the top-k).
"""

from __future__ import annotations

import numpy as np

from latticedraft.errors import InputError
from latticedraft.lattice.sausage import PAD_TOKEN, Sausage


def _check_prob(name: str, eps: float) -> float:
    eps = float(eps)
    if not 0.0 <= eps <= 1.0:
        raise InputError(f"{name} = {eps} is not a probability; use a value in [0, 1]")
    return eps


def _apply_keep(s: Sausage, keep: np.ndarray) -> Sausage:
    """Keep the masked arcs (always the best of each slot), packed to the left."""
    keep = keep & (s.tokens != PAD_TOKEN)
    keep[:, 0] = True
    widths = keep.sum(axis=1)
    k = int(widths.max())
    T = np.full((s.h, k), PAD_TOKEN, dtype=np.int64)
    L = np.full((s.h, k), -np.inf, dtype=np.float32)
    for i in range(s.h):
        T[i, : widths[i]] = s.tokens[i][keep[i]]
        L[i, : widths[i]] = s.logp[i][keep[i]]
    return Sausage(T, L)


def static_threshold(s: Sausage, eps: float) -> Sausage:
    """Drop arcs whose probability is below ``eps`` (each slot keeps its best arc)."""
    eps = _check_prob("eps", eps)
    with np.errstate(divide="ignore"):
        log_eps = np.log(eps) if eps > 0 else -np.inf
    return _apply_keep(s, s.logp >= log_eps)


def quantize(p: np.ndarray) -> np.ndarray:
    """uint8 image of a slot's probabilities, scaled so the largest is 255 (``round``)."""
    p = np.asarray(p, dtype=np.float64)
    top = p.max()
    if not top > 0:
        return np.zeros(p.shape, dtype=np.uint8)
    return np.clip(np.rint(p / top * 255.0), 0, 255).astype(np.uint8)


def blur3(p: np.ndarray) -> np.ndarray:
    """DynaMo's Gaussian blur of a slot: ``cv2.GaussianBlur(row, (3, 3), 0)`` with replicated borders.

    On a single row this is the fixed kernel [0.25, 0.5, 0.25] along the slot with the end
    values repeated (OpenCV's default border would reflect and not preserve the total).
    """
    import cv2

    row = np.asarray(p, dtype=np.float32).reshape(1, -1)
    return cv2.GaussianBlur(row, (3, 3), 0, borderType=cv2.BORDER_REPLICATE).ravel()


def otsu_keep(p: np.ndarray, blur: bool = False) -> tuple[int, np.ndarray]:
    """Otsu's threshold of one slot: ``(t, keep)``; ``keep = image > t`` (OpenCV's rule).

    ``p``: float[w] probabilities of the live arcs. The image is ``quantize(p)`` (after
    ``blur3`` when ``blur``). A flat slot keeps every arc; the best arc is always kept.
    """
    import cv2

    p = np.asarray(p, dtype=np.float64)
    if p.size <= 1:
        return 0, np.ones(p.size, dtype=bool)
    img = quantize(blur3(p) if blur else p)
    t, _ = cv2.threshold(img.reshape(1, -1), 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    t = int(np.asarray(t).ravel()[0])
    keep = img > t
    if img.min() == img.max():
        keep[:] = True
    keep[int(np.argmax(p))] = True
    return t, keep


def otsu_threshold(s: Sausage, blur: bool = False) -> Sausage:
    """Per-slot Otsu adaptive threshold (see ``otsu_keep``)."""
    keep = np.zeros(s.tokens.shape, dtype=bool)
    w = s.widths
    for i in range(s.h):
        _, keep[i, : w[i]] = otsu_keep(np.exp(s.logp[i, : w[i]].astype(np.float64)), blur=blur)
    return _apply_keep(s, keep)


def backoff_depth(s: Sausage, eps_b: float) -> int:
    """Number of leading slots whose best probability is at least ``eps_b`` (at least 1)."""
    eps_b = _check_prob("eps_b", eps_b)
    best = np.exp(s.logp[:, 0].astype(np.float64))
    low = np.nonzero(best < eps_b)[0]
    d = int(low[0]) if len(low) else s.h
    return max(d, 1)


def backoff(s: Sausage, eps_b: float) -> Sausage:
    """Cut the lattice before the first slot whose best probability is below ``eps_b``."""
    return s.truncate(backoff_depth(s, eps_b))


def prune(s: Sausage, eps: float | None = None, otsu: bool = False, blur: bool = False,
          eps_b: float | None = None) -> Sausage:
    """DynaMo's order: static threshold, then Otsu on what is left, then back-off depth."""
    if eps is not None:
        s = static_threshold(s, eps)
    if otsu:
        s = otsu_threshold(s, blur=blur)
    if eps_b is not None:
        s = backoff(s, eps_b)
    return s

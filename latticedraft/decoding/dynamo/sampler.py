"""DynaMo dynamic multi-token sampling (Algorithm 1 of the DynaMo paper), seeded and batched.

One step, for a row whose heads 1..h gave logits ``[h, V]`` after the context ``x_{1:t}``:

1. Warp each head: ``p_i = softmax(logits_i / temperature)`` restricted to its top-k ids and
   renormalised (ties broken by the lower id).
2. For ``n = n_max .. 2``:
   a. ``J = p_1 ⊗ … ⊗ p_n`` (shape ``[k] * n``), times the co-occurrence mask
      ``(p̂(joint) / Π p̂(marginal)) ** alpha_c`` (``latticedraft.lm.cooccurrence``), renormalised
      to sum 1 (an all-zero ``J`` backs off; nothing is divided by zero);
   b. static threshold: entries ``≤ ε_b ** (n-1)`` are set to 0;
   c. adaptive threshold (optional): ``J`` (after an optional 3-tap Gaussian blur over every
      axis, kernel ``[0.25, 0.5, 0.25]``, replicated border) is quantised to uint8 relative to
      its maximum and Otsu's threshold ``t`` is found with OpenCV; entries whose quantised
      value is ``≤ t`` are set to 0. The blur only decides which entries survive; survivors keep
      their own probability;
   d. repetition penalty: an entry is divided by ``penalty ** r``, ``r`` = the number of its
      tokens already present in the context or earlier in the same tuple;
   e. back-off: if no entry is ``> ε_b ** (n-1)``, try ``n - 1``; otherwise sample the n-tuple
      with probability proportional to ``J``.
3. Fallback (``n = 1``): one token from the first head's warped distribution ``p_1``, with the
   same repetition penalty, renormalised.

So ``ε_b = 1`` always emits one token (a normalised ``J`` has no entry above 1) and is exactly
top-k/temperature/repetition-penalty sampling of head 1; ``ε_b = 0`` without adaptive
thresholding always emits ``n_max`` tokens (unless hard co-occurrence masking zeroes the grid).
Defaults follow the paper's Appendix A.1: k = 50, temperature 0.7, repetition penalty 1.1,
alpha_c = 1.0, adaptive thresholding with a kernel-3 blur, co-occurrence masking on.

Randomness: row ``r`` of a batch run with ``seed`` draws from ``numpy.random.default_rng([seed, r])``,
one uniform per step, so results do not depend on the other rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import cv2
import numpy as np

from latticedraft.decoding.dynamo.config import DynamoConfig
from latticedraft.errors import InputError, ModelError

# ---------------------------------------------------------------------------- one step


@dataclass
class StepDistribution:
    """What one step samples from: ``n`` tokens, ids per position, probabilities over the grid.

    ``ids``: n int64 arrays (the top-k ids of heads 1..n); ``probs``: float64 ``[k]*n``, sums to 1;
    ``backed_off``: the orders tried and rejected, with why (``"threshold"`` or ``"empty"``).
    """

    n: int
    ids: list[np.ndarray]
    probs: np.ndarray
    backed_off: list[tuple[int, str]] = field(default_factory=list)


def warp(logits: np.ndarray, config: DynamoConfig) -> tuple[np.ndarray, np.ndarray]:
    """Top-k of ``softmax(logits / T)``: ids int64 ``[k]`` (by falling probability) and probs float64 ``[k]`` (sum 1)."""
    x = np.asarray(logits, dtype=np.float64) / config.temperature
    k = config.top_k or x.size  # 0: the whole vocabulary
    if k < x.size:  # the k largest, ties broken by the lower id (as a stable descending sort would)
        kth = np.partition(-x, k - 1)[k - 1]
        cand = np.flatnonzero(-x <= kth)
        order = cand[np.lexsort((cand, -x[cand]))][:k]
    else:
        order = np.argsort(-x, kind="stable")
    z = x[order]
    p = np.exp(z - z.max())
    return order.astype(np.int64), p / p.sum()


def step_distribution(head_logits, context: Sequence[int], config: DynamoConfig, cooc=None,
                      n_max: int | None = None) -> StepDistribution:
    """The exact distribution one DynaMo step samples from (Algorithm 1), for one row.

    ``head_logits``: float ``[h, V]`` (numpy or torch); ``context``: the ids so far (for the
    repetition penalty); ``cooc``: a ``CooccurrenceStats`` (needed when co-occurrence masking is on).
    """
    logits = _as_numpy(head_logits)
    if logits.ndim != 2:
        raise InputError(f"head logits must be [heads, vocab], got shape {logits.shape}")
    h, V = logits.shape
    n = n_max if n_max is not None else config.n_for(h)
    config.validate(vocab_size=V, num_heads=h)
    if n > h:
        raise ModelError(f"the model has {h} heads but the step asks for {n} tokens; lower --max-n")
    use_co = config.cooccurrence and config.alpha_c > 0
    if use_co and cooc is None:
        raise InputError("co-occurrence masking is on but no table was given; pass --cooccurrence PATH or --no-cooccurrence")
    ctx = set(int(t) for t in np.asarray(context, dtype=np.int64).ravel())
    warped = [warp(logits[i], config) for i in range(n)]
    backed: list[tuple[int, str]] = []
    for m in range(n, 1, -1):
        ids = [warped[i][0] for i in range(m)]
        thr = config.epsilon_b ** (m - 1)
        if thr >= 1.0:  # a normalised J has no entry above 1
            backed.append((m, "threshold"))
            continue
        J = _outer([warped[i][1] for i in range(m)])
        if use_co:
            J = J * cooc.mask(ids, alpha_c=config.alpha_c, unseen_weight=config.unseen_weight)
        total = J.sum()
        if not total > 0:
            backed.append((m, "empty"))
            continue
        J = J / total
        J[J <= thr] = 0.0
        if config.repetition_penalty >= 1.0 and not (J > thr).any():
            backed.append((m, "threshold"))  # adaptive thresholding and the penalty only lower J
            continue
        if config.adaptive_threshold:
            J = J * adaptive_keep(J, config.blur_kernel if config.blur else 1)
        J = J * _repetition_weights(ids, ctx, config.repetition_penalty)
        if not (J > thr).any():
            backed.append((m, "threshold"))
            continue
        return StepDistribution(m, ids, J / J.sum(), backed)
    ids, p = warped[0]
    p = p * _repetition_weights([ids], ctx, config.repetition_penalty)
    return StepDistribution(1, [ids], p / p.sum(), backed)


def sample_from(dist: StepDistribution, rng: np.random.Generator) -> np.ndarray:
    """Draw one n-tuple (int64 ``[n]``) from ``dist`` with one uniform from ``rng``."""
    flat = dist.probs.ravel()
    cdf = np.cumsum(flat)
    j = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    j = min(j, flat.size - 1)
    while flat[j] == 0:  # never land on a zero entry (a uniform exactly at a cdf step)
        j -= 1
    idx = np.unravel_index(j, dist.probs.shape)
    return np.array([dist.ids[i][idx[i]] for i in range(dist.n)], dtype=np.int64)


def adaptive_keep(J: np.ndarray, blur_kernel: int = 3) -> np.ndarray:
    """Otsu's selection on a joint grid: bool ``J.shape``, True where the (blurred) value is above Otsu's threshold.

    The quantisation and the OpenCV call are the lattice's (``lattice.threshold.otsu_keep`` on the
    flattened grid: uint8 relative to the maximum, ``keep = image > t``, the maximum always kept);
    a flat grid keeps every entry; an all-zero grid keeps nothing.
    """
    from latticedraft.lattice.threshold import otsu_keep

    B = gaussian_blur(J, blur_kernel) if blur_kernel > 1 else np.asarray(J, dtype=np.float64)
    if not B.max() > 0:
        return np.zeros(J.shape, dtype=bool)
    _, keep = otsu_keep(B.ravel(), blur=False)
    return keep.reshape(J.shape)


def gaussian_blur(J: np.ndarray, kernel: int = 3) -> np.ndarray:
    """Separable Gaussian blur over every axis of an n-d grid (OpenCV, sigma from the kernel size,
    ``BORDER_REPLICATE``). Kernel 3 is ``[0.25, 0.5, 0.25]`` along each axis. float64, same shape."""
    out = np.asarray(J, dtype=np.float64)
    for ax in range(out.ndim):
        moved = np.moveaxis(out, ax, -1)
        shp = moved.shape
        flat = np.ascontiguousarray(moved.reshape(-1, shp[-1]))
        blurred = cv2.GaussianBlur(flat, (kernel, 1), 0, borderType=cv2.BORDER_REPLICATE)
        out = np.moveaxis(blurred.reshape(shp), -1, ax)
    return np.ascontiguousarray(out)


def _outer(ps: list[np.ndarray]) -> np.ndarray:
    J = ps[0]
    for p in ps[1:]:
        J = np.multiply.outer(J, p)
    return J.astype(np.float64, copy=True)


def _repetition_weights(ids: list[np.ndarray], ctx: set[int], penalty: float) -> np.ndarray:
    """``penalty ** -r`` on the grid, ``r`` = tokens of the tuple already in ``ctx`` or earlier in the tuple."""
    n = len(ids)
    shape = tuple(a.size for a in ids)
    if penalty == 1.0:
        return np.ones(shape)

    def along(v: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return v.reshape([v.shape[axes.index(a)] if a in axes else 1 for a in range(n)])

    r = np.zeros([1] * n, dtype=np.int64)
    for i in range(n):
        rep = along(np.fromiter((int(t) in ctx for t in ids[i]), dtype=bool, count=ids[i].size), (i,))
        for j in range(i):
            rep = rep | along(ids[j][:, None] == ids[i][None, :], (j, i))
        r = r + rep
    table = penalty ** -np.arange(n + 1, dtype=np.float64)
    return table[np.broadcast_to(r, shape)]


def _as_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x)

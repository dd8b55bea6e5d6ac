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

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

import cv2
import numpy as np

from latticedraft.errors import InputError, ModelError

VARIANTS = ("CO+AT+G3", "CO+AT", "CO", "CO-0.5+AT+G3", "AT+G3")
GRID_COPIES = 4  # float64 arrays of the joint's shape alive at once in ``step_distribution``


@dataclass(frozen=True)
class DynamoConfig:
    """Sampler settings. ``max_n``: the most tokens per step (default: the model's head count)."""

    epsilon_b: float = 0.5
    top_k: int = 50
    temperature: float = 0.7
    repetition_penalty: float = 1.1
    cooccurrence: bool = True
    alpha_c: float = 1.0
    unseen_weight: float = 0.5
    adaptive_threshold: bool = True
    blur: bool = True
    blur_kernel: int = 3
    max_n: int | None = None

    def validate(self, vocab_size: int | None = None, num_heads: int | None = None) -> None:
        """Raise ``InputError`` / ``ModelError`` for settings that cannot work with this model."""
        if not (isinstance(self.epsilon_b, (int, float)) and 0.0 <= self.epsilon_b <= 1.0) or math.isnan(self.epsilon_b):
            raise InputError(f"--epsilon-b {self.epsilon_b} is outside [0, 1]; 0 always emits n tokens, 1 always one")
        if self.top_k < 0:
            raise InputError(f"--top-k {self.top_k} must be >= 0 (0 = every token of the vocabulary)")
        if vocab_size is not None and self.top_k > vocab_size:
            raise InputError(f"--top-k {self.top_k} is larger than the vocabulary ({vocab_size} tokens); "
                             f"use --top-k ≤ {vocab_size}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise InputError(f"--temperature {self.temperature} must be a finite number > 0")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise InputError(f"--repetition-penalty {self.repetition_penalty} must be a finite number > 0 (1 = off)")
        if self.alpha_c < 0:
            raise InputError(f"--alpha-c {self.alpha_c} must be ≥ 0")
        if not 0.0 <= self.unseen_weight <= 1.0:
            raise InputError(f"--unseen-weight {self.unseen_weight} must be in [0, 1] (0: unseen pairs masked out)")
        if self.blur_kernel < 1 or self.blur_kernel % 2 == 0:
            raise InputError(f"--blur-kernel {self.blur_kernel} must be odd and ≥ 1")
        if self.max_n is not None:
            if self.max_n < 1:
                raise InputError(f"--max-n {self.max_n} must be at least 1")
            if num_heads is not None and self.max_n > num_heads:
                raise ModelError(
                    f"the model has {num_heads} heads but --max-n is {self.max_n}; a step cannot emit more tokens "
                    "than there are heads: lower --max-n or use a model with more heads"
                )
            if self.max_n > 3:
                raise InputError(f"--max-n {self.max_n}: co-occurrence statistics and joints cover at most 3 tokens")
        if vocab_size is not None and num_heads is not None:
            self._check_grid(vocab_size, self.n_for(num_heads))

    def _check_grid(self, vocab_size: int, n: int) -> None:
        """Refuse a joint grid (k^n float64 entries and its working copies: mask, blur, weights)
        that does not fit in host memory, naming the largest top-k that does."""
        from latticedraft.memory import available_bytes, human

        k = self.top_k or vocab_size
        need = lambda k: GRID_COPIES * 8 * k ** n  # noqa: E731
        have = available_bytes()
        if n < 2 or have is None or need(k) <= have:
            return
        fits = int((have / (GRID_COPIES * 8)) ** (1 / n))
        while need(fits + 1) <= have:
            fits += 1
        what = f"--top-k {self.top_k}" + (f" (0: the whole vocabulary, {vocab_size} tokens)" if not self.top_k else "")
        raise InputError(f"{what} makes DynaMo's joint over {n} tokens {k}^{n} entries, about {human(need(k))}, but "
                         f"{human(have)} is available; use --top-k {fits} or lower (the paper uses 50), or --max-n {n - 1}")

    def n_for(self, num_heads: int) -> int:
        return self.max_n if self.max_n is not None else min(num_heads, 3)


def variant(name: str, epsilon_b: float, base: DynamoConfig | None = None) -> DynamoConfig:
    """The ablation variants of the paper's Table 8 / Figure 10 (``VARIANTS``) at a given ``ε_b``."""
    b = base or DynamoConfig()
    table = {
        "CO+AT+G3": dict(cooccurrence=True, alpha_c=1.0, adaptive_threshold=True, blur=True),
        "CO+AT": dict(cooccurrence=True, alpha_c=1.0, adaptive_threshold=True, blur=False),
        "CO": dict(cooccurrence=True, alpha_c=1.0, adaptive_threshold=False, blur=False),
        "CO-0.5+AT+G3": dict(cooccurrence=True, alpha_c=0.5, adaptive_threshold=True, blur=True),
        "AT+G3": dict(cooccurrence=False, alpha_c=0.0, adaptive_threshold=True, blur=True),
    }
    if name not in table:
        raise InputError(f"unknown DynaMo variant {name!r}; choose one of {', '.join(VARIANTS)}")
    return replace(b, epsilon_b=float(epsilon_b), **table[name])


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

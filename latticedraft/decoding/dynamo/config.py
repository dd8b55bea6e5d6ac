"""DynaMo's settings (``DynamoConfig``, the paper's defaults, Appendix A.1) and its ablation
variants (Table 8 / Figure 10: which of its three techniques each turns on: co-occurrence masking
with exponent α_c, the Otsu adaptive threshold, the 3x3 Gaussian blur before it). Plain values,
so the CLI declares its options from them without loading the sampler's numpy and OpenCV.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from latticedraft.errors import InputError, ModelError

TECHNIQUES = {
    "CO+AT+G3": dict(cooccurrence=True, alpha_c=1.0, adaptive_threshold=True, blur=True),
    "CO+AT": dict(cooccurrence=True, alpha_c=1.0, adaptive_threshold=True, blur=False),
    "CO": dict(cooccurrence=True, alpha_c=1.0, adaptive_threshold=False, blur=False),
    "CO-0.5+AT+G3": dict(cooccurrence=True, alpha_c=0.5, adaptive_threshold=True, blur=True),
    "AT+G3": dict(cooccurrence=False, alpha_c=0.0, adaptive_threshold=True, blur=True),
}
VARIANTS = tuple(TECHNIQUES)

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
    if name not in TECHNIQUES:
        raise InputError(f"unknown DynaMo variant {name!r}; choose one of {', '.join(VARIANTS)}")
    return replace(b, epsilon_b=float(epsilon_b), **TECHNIQUES[name])

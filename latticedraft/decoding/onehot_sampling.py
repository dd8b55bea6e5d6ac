"""Lossless sampling verification of one-hot drafts (Fu et al. 2024, Algorithm 4).

Lookahead decoding's candidates are token sequences, not distributions: a draft token x has
q = one-hot(x), so speculative sampling's acceptance min(1, p(x) / q(x)) is p(x) and its
residual norm(max(0, p - q)) is p with p(x) set to 0, renormalised. At one position the
candidates' distinct next tokens (the children of the node in the candidate trie) are tried in
turn against the residual of the ones before; the first accepted moves the walk on, and when
all are rejected the token is drawn from the last residual. Either way the emitted token is
distributed exactly as p, so the output has the target's sampling distribution.

p is the target's distribution after the logits processing ``generate(do_sample=True)``
applies (transformers' own warpers, in its order: temperature, top-k, top-p; top_k = 0 and
top_p = 1 switch those off), computed in float64.

Randomness comes from a ``draws`` object with ``bernoulli(row, prob) -> bool`` and
``categorical(row, probs) -> int``; ``SeededDraws`` gives row r of a run with seed s its own
``numpy.random.default_rng([s, r])``, so outputs repeat and do not depend on the batch.

    >>> p = np.array([0.5, 0.3, 0.2])
    >>> accept_one_hot(p, [1, 0], row=0, draws=SeededDraws(0))    # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from latticedraft.errors import InputError


@dataclass(frozen=True)
class SamplingOptions:
    """temperature > 0; top_k >= 0 (0 = off); 0 < top_p <= 1 (1 = off); seed: row r draws from
    ``default_rng([seed, r])``."""

    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if not (np.isfinite(self.temperature) and self.temperature > 0):
            raise InputError(f"--temperature {self.temperature} must be a finite number > 0")
        if self.top_k < 0:
            raise InputError(f"--top-k {self.top_k} must be >= 0 (0 = no top-k filter)")
        if not 0.0 < self.top_p <= 1.0:
            raise InputError(f"--top-p {self.top_p} must be in (0, 1] (1 = no nucleus filter)")

    def warpers(self):
        """transformers' warpers that ``generate(do_sample=True)`` builds for these settings."""
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        procs = LogitsProcessorList()
        if self.temperature != 1.0:
            procs.append(TemperatureLogitsWarper(self.temperature))
        if self.top_k != 0:
            procs.append(TopKLogitsWarper(top_k=self.top_k, min_tokens_to_keep=1))
        if self.top_p < 1.0:
            procs.append(TopPLogitsWarper(top_p=self.top_p, min_tokens_to_keep=1))
        return procs

    def probs(self, logits: torch.Tensor) -> np.ndarray:
        """Target distributions from raw logits [m, V] -> float64 [m, V] (rows sum to 1)."""
        x = logits.detach().to(torch.float64)
        x = self.warpers()(torch.zeros(x.shape[0], 0, dtype=torch.long, device=x.device), x)
        return torch.softmax(x, dim=-1).cpu().numpy()


class SeededDraws:
    """Per-row generators ``default_rng([seed, row])``, created on first use."""

    def __init__(self, seed: int):
        self.seed = int(seed)
        self.rngs: dict[int, np.random.Generator] = {}

    def _rng(self, row: int) -> np.random.Generator:
        if row not in self.rngs:
            self.rngs[row] = np.random.default_rng([self.seed, int(row)])
        return self.rngs[row]

    def bernoulli(self, row: int, prob: float) -> bool:
        return bool(self._rng(row).random() < prob)

    def categorical(self, row: int, probs: np.ndarray) -> int:
        c = np.cumsum(probs)
        i = int(np.searchsorted(c, self._rng(row).random() * c[-1], side="right"))
        return int(np.flatnonzero(probs > 0)[-1]) if i >= len(probs) else i


def accept_one_hot(p: np.ndarray, candidates, row: int, draws) -> int:
    """Algorithm 4 at one position: p float64[V] the target's distribution, ``candidates`` the
    distinct draft tokens there, in the order they are tried. Returns the emitted token: a
    candidate (accepted) or a draw from the residual (never a rejected candidate)."""
    residual = np.array(p, dtype=np.float64)
    for x in candidates:
        mass = residual.sum()
        if draws.bernoulli(row, residual[x] / mass):
            return int(x)
        residual[x] = 0.0
    if residual.sum() <= 0:  # every token with mass was a candidate and all were (measure-zero) rejected
        return int(candidates[-1])
    return draws.categorical(row, residual / residual.sum())


class OneHotChooser:
    """The verifier's ``choose`` for sampling: at each walked node the target's warped
    distribution and the node's children give the emitted token (``accept_one_hot``).
    ``rows[i]`` is the run-wide row id of batch row i (what seeds its draws)."""

    def __init__(self, options: SamplingOptions, draws=None):
        self.options = options
        self.draws = draws if draws is not None else SeededDraws(options.seed)

    def __call__(self, batch_rows, logits: torch.Tensor, candidates, rows) -> np.ndarray:
        """batch_rows: int[m] batch rows of the m nodes; logits [m, V]; candidates: m lists of
        child tokens; rows: batch row -> run-wide row. Returns int64[m]."""
        p = self.options.probs(logits)
        return np.asarray([accept_one_hot(p[j], candidates[j], rows[r], self.draws)
                           for j, r in enumerate(batch_rows)], dtype=np.int64)

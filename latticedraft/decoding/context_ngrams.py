"""Context n-grams: draft paths copied from the text so far (prompt lookup).

If the last ``n`` tokens of the history (prompt + generated, ending with the root) occurred
earlier in it, the tokens that followed that occurrence are a likely continuation. This is
transformers' prompt-lookup decoding and lookahead decoding's n-gram pool fed from the
context; here it yields extra draft paths that the draft tree merges with the head drafts.

Example::

    >>> ctx = ContextNgrams(max_ngram=2, num_tokens=3)
    >>> [(c.tokens.tolist(), c.match) for c in ctx.candidates(np.array([5, 6, 7, 8, 9, 5, 6]))]
    [([7, 8, 9], 2)]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from latticedraft.errors import InputError


@dataclass(frozen=True)
class ContextCandidate:
    """tokens: int64[d], the continuation after the root; match: the matched suffix length n."""

    tokens: np.ndarray
    match: int


@dataclass(frozen=True)
class ContextNgrams:
    """Suffix matches of ``max_ngram`` .. ``min_ngram`` tokens, longest first, most recent
    occurrence first within a length; at most ``max_paths`` distinct continuations of at most
    ``num_tokens`` tokens each."""

    max_ngram: int = 3
    min_ngram: int = 1
    num_tokens: int = 10
    max_paths: int = 4

    def __post_init__(self):
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise InputError(f"--context-ngrams {self.max_ngram}: the longest suffix to match must be >= 1 "
                             f"(and >= the shortest, {self.min_ngram}); 0 turns context n-grams off")
        if self.num_tokens < 1 or self.max_paths < 1:
            raise InputError(f"context n-grams need num_tokens >= 1 and max_paths >= 1, got "
                             f"{self.num_tokens} and {self.max_paths}")

    def candidates(self, history: np.ndarray) -> list[ContextCandidate]:
        """Continuations of the earlier occurrences of the history's suffix. history: int64[T]."""
        h = np.asarray(history, dtype=np.int64).reshape(-1)
        T = len(h)
        out: list[ContextCandidate] = []
        seen: set[tuple] = set()
        for n in range(min(self.max_ngram, T - 1), self.min_ngram - 1, -1):
            # windows h[i : i + n] for i + n < T (the continuation starts inside the history)
            win = sliding_window_view(h[: T - 1], n)
            hits = np.flatnonzero((win == h[T - n:]).all(axis=1))
            for i in hits[::-1]:
                cont = h[i + n : i + n + self.num_tokens]
                key = tuple(cont.tolist())
                if not key or any(s[: len(key)] == key for s in seen):
                    continue  # a prefix of (or equal to) a continuation already taken adds no node
                seen.add(key)
                out.append(ContextCandidate(cont.copy(), n))
                if len(out) >= self.max_paths:
                    return out
        return out

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

from latticedraft.decoding.proposers.base import Proposal, Proposer, Step, StepRows, rated
from latticedraft.decoding.registry import option
from latticedraft.decoding.sources import DraftSource, longest_match
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
        """Continuations of the earlier occurrences of the history's suffix. history: int64[T].

        One pass: every earlier position e holding the last token is a hit; its match length is
        how many tokens before it also agree with the suffix (capped at ``max_ngram``)."""
        h = np.asarray(history, dtype=np.int64).reshape(-1)
        T = len(h)
        top = min(self.max_ngram, T - 1)
        if top < self.min_ngram:
            return []
        ends = np.flatnonzero(h[: T - 1] == h[T - 1])  # e: h[e] matches; the continuation starts at e + 1
        length = np.ones(len(ends), dtype=np.int64)
        live = np.ones(len(ends), dtype=bool)
        for k in range(1, top):
            live &= ends - k >= 0
            live[live] = h[ends[live] - k] == h[T - 1 - k]
            length += live
        keep = length >= self.min_ngram
        ends, length = ends[keep], length[keep]
        out: list[ContextCandidate] = []
        seen: list[tuple] = []
        for i in np.lexsort((-ends, -length)):  # longest match first, most recent first
            e = int(ends[i])
            key = tuple(h[e + 1 : e + 1 + self.num_tokens].tolist())
            if any(s[: len(key)] == key for s in seen):
                continue  # a prefix of (or equal to) a continuation already taken adds no node
            seen.append(key)
            out.append(ContextCandidate(np.asarray(key, dtype=np.int64), int(length[i])))
            if len(out) >= self.max_paths:
                break
        return out


class ContextProposer(Proposer):
    """Context n-gram paths for every row (prompt lookup on the shared verifier). ``match(i,
    history)`` searches ahead of the step (the head gate asks for the next step's longest match
    before the heads are computed); the step reuses that search."""

    name = "context"
    admits = True

    def __init__(self, ngrams: ContextNgrams):
        self.ngrams = ngrams
        self.found: dict[int, tuple[int, list[ContextCandidate]]] = {}

    def start(self, rows: StepRows) -> None:
        self.found = {}

    def _candidates(self, i: int, history: np.ndarray) -> list[ContextCandidate]:
        hit = self.found.get(i)
        if hit is None or hit[0] != len(history):
            hit = (len(history), self.ngrams.candidates(history))
            self.found[i] = hit
        return hit[1]

    def match(self, i: int, history: np.ndarray) -> int:
        """The longest suffix match of ``history`` (0: none); the candidates are kept for the step."""
        cands = self._candidates(i, history)
        return cands[0].match if cands else 0

    def paths(self, history: np.ndarray, i: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """The row's continuations [(tokens int64[d], bins int64[d]: the match length)]."""
        cands = self.ngrams.candidates(history) if i is None else self._candidates(i, history)
        return copied(cands)

    def propose(self, step: Step) -> list[Proposal]:
        return [rated(self.paths(h, i), step.acceptance, "context") for i, h in zip(step.index, step.histories)]


def copied(cands: list[ContextCandidate]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Continuations copied from earlier text as rated paths: each token's bin is its match length."""
    return [(c.tokens, np.full(len(c.tokens), c.match, dtype=np.int64)) for c in cands]


SOURCE = DraftSource(
    name="context", dest="context_ngrams", summary="prompt lookup: what followed earlier matches of the text's end",
    option=option(0, cli=3, group="tree", type=int, metavar="N", help=(
        "also draft what followed earlier matches of the last N..1 tokens in the prompt and output (prompt "
        "lookup); 0 = off")),
    build=lambda session, value: ContextProposer(ContextNgrams(max_ngram=value)),
    check=longest_match("--context-ngrams"), bins="match")

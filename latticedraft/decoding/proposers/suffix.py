"""Suffix drafts: paths copied from the run's earlier outputs (``--suffix-drafts N``).

Context n-grams (``context.py``) look only in the row's own prompt and output. A data-set run
often repeats itself across prompts (the same boilerplate, the same answer shapes); this source
looks in the sequences (prompt + output) of the session's earlier decode calls and in the
current call's prompts. At the start of each call they are concatenated, separated by -1, into
a corpus int64[N] and sorted into a suffix array truncated to ``max_ngram`` tokens (each suffix
ordered by its first ``max_ngram`` tokens: enough to find every match up to that length).
Each step, the longest suffix of the row's history (``max_ngram`` .. 1 tokens) found by binary
search is matched, and what followed its most recent occurrences (at most ``max_paths``
distinct continuations of ``num_tokens`` tokens, cut at a sequence boundary) are the row's
paths. Paths are rated as context paths of the same match length when the tree is cost-aware.

    >>> s = SuffixDrafts(max_ngram=2)
    >>> s.remember([np.array([5, 6, 7, 8])]); s.index([])
    >>> [c.tokens.tolist() for c in s.continuations(np.array([1, 5, 6]))]
    [[7, 8]]
"""

from __future__ import annotations

import numpy as np

from latticedraft.decoding.proposers.base import Proposal, Proposer, Step, StepRows, rated
from latticedraft.decoding.proposers.context import ContextCandidate, copied
from latticedraft.decoding.registry import option
from latticedraft.decoding.sources import DraftSource, longest_match
from latticedraft.errors import InputError

MEMORY_TOKENS = 1 << 20  # earlier sequences kept, oldest dropped first: int64, 8 MiB


class SuffixDrafts:
    """The suffix array over earlier sequences and its lookups. max_ngram: longest suffix matched;
    num_tokens: tokens per continuation; max_paths: continuations per step."""

    def __init__(self, max_ngram: int, num_tokens: int = 10, max_paths: int = 4):
        if max_ngram < 1:
            raise InputError(f"--suffix-drafts {max_ngram}: give the longest suffix to match (>= 1), or 0 for off")
        self.max_ngram, self.num_tokens, self.max_paths = int(max_ngram), int(num_tokens), int(max_paths)
        self.memory: list[np.ndarray] = []
        self.corpus = np.full(1 + self.max_ngram, -1, dtype=np.int64)  # sequences between -1s, max_ngram -1s after
        self.order = np.zeros(0, dtype=np.int64)  # start positions, sorted by their first max_ngram tokens

    def remember(self, sequences) -> None:
        """Keep ``sequences`` (int64[t] each) for the next ``index``; the oldest go past ``MEMORY_TOKENS``."""
        self.memory.extend(np.asarray(s, dtype=np.int64) for s in sequences if len(s))
        total = sum(len(s) for s in self.memory)
        while self.memory and total > MEMORY_TOKENS:
            total -= len(self.memory.pop(0))

    def index(self, prompts) -> None:
        """Build the suffix array over the remembered sequences and ``prompts``, oldest first."""
        K, sep = self.max_ngram, np.full(1, -1, dtype=np.int64)
        seqs = [*self.memory, *(np.asarray(q, dtype=np.int64) for q in prompts)]
        self.corpus = np.concatenate([sep, *[x for s in seqs for x in (s, sep)], np.full(K, -1, dtype=np.int64)])
        starts = np.flatnonzero(self.corpus >= 0)
        keys = [self.corpus[starts + k] for k in range(K - 1, -1, -1)]  # lexsort: the last key is the primary one
        self.order = starts[np.lexsort(keys)] if len(starts) else starts

    def _range(self, pattern: np.ndarray) -> tuple[int, int]:
        """[lo, hi): the suffixes (in ``order``) that start with ``pattern`` (len <= max_ngram)."""
        m, pad, order = len(pattern), self.corpus, self.order
        pat = pattern.tolist()

        def first(pos: int) -> list:
            return pad[pos : pos + m].tolist()

        lo, hi = 0, len(order)
        while lo < hi:  # first suffix >= pattern
            mid = (lo + hi) // 2
            if first(int(order[mid])) < pat:
                lo = mid + 1
            else:
                hi = mid
        start, hi = lo, len(order)
        while lo < hi:  # first suffix > pattern (on its first m tokens)
            mid = (lo + hi) // 2
            if first(int(order[mid])) <= pat:
                lo = mid + 1
            else:
                hi = mid
        return start, lo

    def continuations(self, history: np.ndarray) -> list[ContextCandidate]:
        """The continuations (and match length) of the longest matched suffix of ``history``, most
        recent occurrence first, distinct and none a prefix of an earlier one."""
        h = np.asarray(history, dtype=np.int64).reshape(-1)
        for m in range(min(self.max_ngram, len(h)), 0, -1):
            lo, hi = self._range(h[len(h) - m :])
            if lo == hi:
                continue
            out, seen = [], []
            for pos in np.sort(self.order[lo:hi])[::-1]:  # most recent first
                tail = self.corpus[pos + m : pos + m + self.num_tokens]
                cut = np.flatnonzero(tail < 0)
                tail = tail[: cut[0]] if len(cut) else tail
                key = tuple(tail.tolist())
                if not key or any(s[: len(key)] == key for s in seen):
                    continue
                seen.append(key)
                out.append(ContextCandidate(tail.copy(), m))
                if len(out) >= self.max_paths:
                    break
            if out:
                return out
        return []


class SuffixProposer(Proposer):
    """Suffix-draft paths for every row; it remembers every row's sequence for the calls after
    this one (the session keeps one proposer per setting, so a data-set run's batches feed it)."""

    name = "suffix"
    admits = True

    def __init__(self, max_ngram: int):
        self.drafts = SuffixDrafts(max_ngram)
        self.seen: dict[int, np.ndarray] = {}

    def start(self, rows: StepRows) -> None:
        self.drafts.remember(self.seen.values())
        self.seen = {}
        self.drafts.index(rows.prompts)

    def propose(self, step: Step) -> list[Proposal]:
        return [rated(copied(self.drafts.continuations(h)), step.acceptance, "context") for h in step.histories]

    def update(self, step: Step, accepted, bonus, side_argmax) -> None:
        """Each row's sequence so far (history, accepted drafts, bonus), remembered at the next call."""
        for j, i in enumerate(step.index):
            self.seen[i] = np.concatenate([step.histories[j], np.asarray(accepted[j], dtype=np.int64),
                                           np.asarray(bonus[j], dtype=np.int64).reshape(-1)])


SOURCE = DraftSource(
    name="suffix", dest="suffix_drafts", summary="what followed matches in the session's earlier outputs",
    option=option(0, fit=False, group="tree", type=int, metavar="N", help=(
        "also draft what followed the longest match (N..1 tokens) of the output's end in the session's earlier "
        "outputs and this call's prompts (a suffix array; a data-set run's later batches learn from the earlier); "
        "0 = off")),
    build=lambda session, value: SuffixProposer(value), check=longest_match("--suffix-drafts"), rates="context",
    bins="match")

"""Corpus n-gram drafts: the n-gram LM's most likely continuation of the history.

Context n-grams (``context.py``) copy what followed an earlier occurrence of the history's
suffix; where the text has not repeated itself yet they have nothing to offer and the step
verifies its root alone. The n-gram LM the lattices are rescored with (``latticedraft lm
build``) knows what usually follows in the corpus: from the LM state of the history's last
``order - 1`` tokens, its single most likely next token, then the most likely one after that,
``depth`` tokens deep, is one more draft path (a global n-gram draft, as in REST's retrieval
drafts, read from the WFST's arrays instead of a suffix array).

Each state's most likely next token is found once per LM and a chain then costs one LM step
per token (``lattice/lm_continuation.py``). Each token's LM probability rates it for the
cost-aware tree (``planning/acceptance.py``: ``lm_rate``, fitted like the heads' table).

    >>> src = LMNgrams(depth=3)
    >>> toks, probs = src.continuation(arrays, history)     # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latticedraft.decoding.proposers.base import Proposal, Proposer, Step
from latticedraft.errors import InputError
from latticedraft.lattice.lm_continuation import best_next, greedy_chain


@dataclass(frozen=True)
class LMNgrams:
    """depth: tokens drafted from the n-gram LM after the root (one path)."""

    depth: int = 3

    def __post_init__(self):
        if self.depth < 1:
            raise InputError(f"--lm-drafts {self.depth}: draft at least 1 token from the n-gram LM, or 0 for off")

    def continuation(self, arrays, history: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The LM's greedy continuation of ``history`` (int64[t], ending with the root): tokens
        int64[<= depth] and each token's LM probability float64[<= depth]."""
        best_l, _ = best_next(arrays)
        h = np.asarray(history, dtype=np.int64).reshape(-1)
        ctx = np.ascontiguousarray(h[max(len(h) - max(int(arrays.order) - 1, 1), 0):])
        toks, costs = greedy_chain(ctx, self.depth, best_l, *arrays.lm_args())
        return toks, np.exp(-costs)


class LMProposer(Proposer):
    """One path per row: the n-gram LM's greedy continuation (``LMNgrams``) of the row's history.
    arrays: the LM's ``LMArrays`` (``lattice.lm_tables.lm_arrays(lm.fst)``)."""

    name = "lm"
    admits = True

    def __init__(self, ngrams: LMNgrams, arrays):
        self.ngrams, self.arrays = ngrams, arrays
        best_next(arrays)  # once, before the first step

    def propose(self, step: Step) -> list[Proposal]:
        out = []
        for j, history in enumerate(step.histories):
            toks, probs = self.ngrams.continuation(self.arrays, history)
            toks, probs = toks[: step.rooms[j]], probs[: step.rooms[j]]
            if not len(toks):
                out.append(Proposal.empty())
                continue
            rates = None if step.acceptance is None else step.acceptance.lm_rates(probs)[None]
            out.append(Proposal(toks[None], rates=rates))
        return out

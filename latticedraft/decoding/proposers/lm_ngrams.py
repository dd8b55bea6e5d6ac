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
cost-aware tree (``planning/acceptance.py``: the source's table, by depth and probability bin,
fitted like the heads' table).

    >>> src = LMNgrams(depth=3)
    >>> toks, probs = src.continuation(arrays, history)     # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latticedraft.decoding.proposers.base import Proposal, Proposer, Step, rated
from latticedraft.decoding.registry import option
from latticedraft.decoding.sources import DraftSource
from latticedraft.errors import InputError

AUTO_DEPTH = 3  # tokens of the n-gram LM's continuation: deeper ones measured slower (docs/speed.md)


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
        from latticedraft.lattice.lm_continuation import best_next, greedy_chain

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
        self.ngrams.continuation(arrays, np.zeros(1, dtype=np.int64))  # the tables and kernels, before a step

    def paths(self, history: np.ndarray, room: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """[(tokens int64[d], bins int64[d]: each token's LM probability bin)], one path or none."""
        from latticedraft.decoding.planning.acceptance import head_bins

        toks, probs = self.ngrams.continuation(self.arrays, history)
        toks, probs = toks[:room], probs[:room]
        return [(toks, head_bins(probs))] if len(toks) else []

    def propose(self, step: Step) -> list[Proposal]:
        return [rated(self.paths(h, room), step.acceptance, "lm") for h, room in zip(step.histories, step.rooms)]


def _check(value) -> int | str:
    """``--lm-drafts``: a number of tokens (0 = off) or "auto"."""
    if value == "auto":
        return value
    try:
        depth = int(value)
    except (TypeError, ValueError):
        raise InputError(f"--lm-drafts {value!r}: give a number of tokens (0 = off) or auto") from None
    if depth < 0:
        raise InputError(f"--lm-drafts {depth}: give a number of tokens >= 1, 0 for off, or auto")
    return depth


def build(session, value) -> LMProposer | None:
    """The LM drafts of ``value`` tokens for this session (None: off; "auto": ``AUTO_DEPTH`` where
    an LM built with the session's tokenizer exists, ``loaders.lm_for``; an LM named with ``--lm``
    must load and fit)."""
    from latticedraft.decoding.runs.loaders import lm_for
    from latticedraft.errors import ModelError
    from latticedraft.lattice.lm_tables import lm_arrays

    if value == "auto":
        if session.lm_dir is None:  # the LM that fits this tokenizer where one is built (one named with --lm must)
            if not lm_for(session.tokenizer).is_dir():
                return None
            try:
                _ = session.lm
            except ModelError:  # built with another vocabulary: no LM drafts, the rest as asked
                return None
        value = AUTO_DEPTH
    return LMProposer(LMNgrams(int(value)), lm_arrays(session.lm.fst))  # (the arrays are cached on the LM)


SOURCE = DraftSource(
    name="lm", dest="lm_drafts", summary="the n-gram LM's most likely continuation (REST-style global n-grams)",
    option=option(0, cli="auto", fit=False, group="tree", metavar="D", help=(
        "also draft the n-gram LM's (--lm) most likely continuation, D tokens deep; 0 = off (default auto: "
        f"{AUTO_DEPTH} where the LM build exists and fits the tokenizer, else off; off under --do-sample)")),
    build=build, check=_check, files=("lm",), if_present=("auto",), sampled_default=0)

"""The lookahead draft source (Fu et al. 2024, Algorithms 2-3): a Jacobi window per row as a side
branch of each verify call, and the n-gram pool it fills, whose continuations of the root are the
row's paths. ``--method lookahead`` (``methods/lookahead.py``) decodes with it alone; BPD runs it
beside the heads (``--lookahead-pool``)."""

from __future__ import annotations

import numpy as np

from latticedraft.decoding.proposers.base import EMPTY, Proposal, Proposer, Step, StepRows
from latticedraft.decoding.proposers.lookahead_pool import JacobiWindow, NgramPool


def start_row(options, prompt: np.ndarray, vocab: int, row: int) -> tuple[JacobiWindow, NgramPool]:
    """A fresh window and pool for one prompt (int64[T]) of a run with ``options``
    (``LookaheadOptions``). The window starts from random tokens (the paper's random initial
    guess; from the prompt's tokens with ``prompt_as_reference``), seeded by (seed, row) so runs
    repeat."""
    rng = np.random.default_rng([options.seed, row])
    if options.prompt_as_reference:
        init = rng.choice(prompt, size=options.W)
    else:
        init = rng.integers(0, vocab, size=options.W)
    pool = NgramPool(options.G)
    if options.prompt_as_reference:
        pool.seed(prompt, options.N)
    return JacobiWindow(options.W, options.N, init), pool


class LookaheadProposer(Proposer):
    """Every row runs a lookahead Jacobi window as a side branch of each verify call; the n-grams
    of its pool that start with the root are its paths (at most G). Windows start from
    ``start_row`` seeded by the run-wide row id."""

    name = "lookahead"

    def __init__(self, options, vocab_size: int):
        self.options, self.vocab_size = options, int(vocab_size)
        self.rows: dict[int, tuple[JacobiWindow, NgramPool]] = {}

    def start(self, rows: StepRows) -> None:
        self.rows = {i: start_row(self.options, p, self.vocab_size, r)
                     for i, r, p in zip(rows.index, rows.rows, rows.prompts)}

    def propose(self, step: Step) -> list[Proposal]:
        out = []
        for j, i in enumerate(step.index):
            window, pool = self.rows[i]
            paths = pool.get(int(step.histories[j][-1]))[: self.options.G]
            toks = np.stack(paths) if paths else EMPTY
            rates = None
            if step.acceptance is not None and paths:
                rates = np.stack([step.acceptance.rates("context", np.ones(len(t), dtype=np.int64)) for t in paths])
            out.append(Proposal(toks, rates=rates, side=window.side()))
        return out

    def update(self, step: Step, accepted, bonus, side_argmax) -> None:
        for j, i in enumerate(step.index):
            window, pool = self.rows[i]
            for g in window.update(side_argmax[j]):
                pool.add(g)

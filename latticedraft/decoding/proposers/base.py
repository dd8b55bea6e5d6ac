"""The one interface every draft source implements (after vLLM's proposers and HF's
``CandidateGenerator``): it proposes paths after each live row's root and learns what was kept.

One decode call, for b live rows (batch order; rows leave as they finish)::

    proposer.start(step_rows)                    # once: the call's prompts
    proposals = proposer.propose(step)           # each step: one Proposal per live row
    proposer.update(step, accepted, bonus, side_argmax)    # what the target kept
    proposer.retire(keep)                        # rows that finished leave the batch

A proposal's paths start after the root (the token the target chose last, not yet verified:
the last entry of ``step.histories[j]``); path k's token t sits t + 1 places after the root.
Verification keeps the longest path prefix equal to the target's argmax (under sampling, its
argmax under the run's Gumbel noise, ``accept/sampling.py``), so any paths are exact; a proposer
drafts well under sampling by perturbing its own distribution with the same noise
(``Step.samplers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

if TYPE_CHECKING:
    import torch

EMPTY = np.zeros((1, 0), dtype=np.int64)


@dataclass
class StepRows:
    """The rows of a decode call. index: each row's position in the call's prompt list (per-call
    state such as the oracle's references); rows: run-wide row ids (row r of seed s samples with
    the noise of ``default_rng([s, r, t])`` at position t, whatever batch it is in); prompts:
    int64[t] each."""

    index: list[int]
    rows: list[int]
    prompts: list[np.ndarray]


@dataclass
class Step:
    """What proposers see of one step, one entry per live row (batch order).

    histories: int64[t] prompt + emitted tokens, ending with the root; rooms: draft tokens the row
    may still accept; head_logits: [b, h-1, V'] the extra heads at the root (slot j = token j + 1
    after it; columns = ``vocab`` ids when a reduced draft vocabulary is set), or None when this
    step computed no heads; samplers: one ``accept.sampling.DraftSampler`` per row when sampling
    (its processors and noise; None: greedy); acceptance: the ``planning.acceptance.AcceptanceModel``
    the auto tree rates paths with (None: the tree verifies every path, no rates needed); cache:
    the verifier's ``kv.KVCache`` of the live rows (committed slots: everything before each root),
    which a proposer may extend with pending slots of its own but leaves as it found it
    (``truncate(cache.length)``); cost(n): predicted seconds of this step's verify call over n
    nodes per row plus the step's other work, n an int or int[m] (None: the tree is fixed, every
    path is verified)."""

    index: list[int]
    rows: list[int]
    histories: list[np.ndarray]
    rooms: list[int]
    head_logits: torch.Tensor | None = None
    vocab: torch.Tensor | None = None
    samplers: list | None = None
    acceptance: object = None
    cache: object = None
    cost: Callable | None = None


@dataclass
class Proposal:
    """One row's paths. tokens: int64[p, d] (negative = end of path); q: float64[p, d] the draft's
    joint prefix probabilities, for a rule that reads them (MTAD's; None otherwise); rates:
    float[p, d] conditional acceptance rates for the cost-aware tree (None where unrated); side:
    a ``SideBranch`` riding along in the verify call (lookahead's Jacobi window); sausage: the
    lattice the paths came from; hidden: [1 + d, H] states of [root, path 0] at the verifier's
    first layer (split verification from stored layer-l states, Kangaroo); heads: drafted from
    the heads."""

    tokens: np.ndarray
    q: np.ndarray | None = None
    rates: np.ndarray | None = None
    side: object = None
    sausage: object = None
    hidden: torch.Tensor | None = None
    heads: bool = False

    @classmethod
    def empty(cls) -> "Proposal":
        return cls(EMPTY)


class Proposer:
    """Base class: proposes nothing. ``uses_heads``: reads ``Step.head_logits``; ``stem``: set by
    proposers that run the model's first layers themselves (split verification); ``admits``: its
    per-row state is keyed by the prompt (``start`` makes it for every prompt of the call), so
    prompts may join a running batch (``loop.speculative_decode``'s ``Request.in_flight``)."""

    name = "none"
    uses_heads = False
    stem = None
    admits = False  # per-row state keyed by the prompt only: rows may join a running batch (``Request.in_flight``)

    def start(self, rows: StepRows) -> None:
        """A new decode call (per-row state starts here)."""

    def propose(self, step: Step) -> list[Proposal]:
        return [Proposal.empty() for _ in step.rows]

    def update(self, step: Step, accepted: list[np.ndarray], bonus: np.ndarray, side_argmax) -> None:
        """Told the draft tokens each row accepted (int64[n_j]), its bonus token and, for rows
        with a side branch, the target's argmax there."""

    def retire(self, keep: list[int]) -> None:
        """Only the live rows at batch positions ``keep`` go on."""


def rated(paths: list, acceptance, table: str) -> Proposal:
    """One row's proposal of ``paths`` [(tokens int64[d], bins int64[d])]: tokens int64[p, d]
    padded with -1, each token rated from ``acceptance``'s table ``table`` by its bin and depth
    (``AcceptanceModel.rates``) where ``acceptance`` is given (the cost-aware tree)."""
    if not paths:
        return Proposal.empty()
    d = max(len(t) for t, _ in paths)
    toks = np.full((len(paths), d), -1, dtype=np.int64)
    rates = None if acceptance is None else np.zeros((len(paths), d))
    for k, (t, bins) in enumerate(paths):
        toks[k, : len(t)] = t
        if rates is not None:
            rates[k, : len(t)] = acceptance.rates(table, bins)
    return Proposal(toks, rates=rates)


def as_paths(tokens) -> np.ndarray:
    """Drafts (a ``Drafts``, a tensor, an array, one path or none) as int64[p, d]."""
    toks = getattr(tokens, "tokens", tokens)
    if hasattr(toks, "detach"):  # a tensor
        toks = toks.detach().cpu().numpy()
    toks = np.asarray(toks, dtype=np.int64)
    if toks.ndim == 1:
        toks = toks[None]
    if toks.shape[0] == 0:
        toks = EMPTY
    return toks

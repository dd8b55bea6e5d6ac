"""Classic speculative decoding's draft source: an auxiliary causal LM with the target's vocabulary.

``ModelProposer`` drafts up to ``gamma`` tokens after each row's history, greedily (its argmax:
exact greedy decoding) or, under sampling, its argmax perturbed by the run's Gumbel noise for the
position it drafts (after the sampling processors: the target's sampled token wherever the two
agree, ``accept/sampling.py``). Every row keeps its own KV cache
(``gpu.verify.incremental.IncrementalLM``), so a step feeds only the tokens accepted since the last one.

A draft ends early where it is unlikely to be accepted: each token's chance is read from the
draft model's own probability for it, calibrated online against what the target accepted
(``planning.acceptance.RateCorrection`` over the draft probability, never decaying: per
probability bin, the tokens kept over the probabilities tried, as the tree's rates are
corrected); the draft stops once the chance that every token so far is accepted falls below
``confidence``. (transformers' assisted generation stops at a raw draft probability below
``assistant_confidence_threshold``, 0.4, and tunes that threshold as it goes; a raw threshold
stops a draft model whose probabilities are flat but right, such as the bundled one, after its
first token.)
"""

from __future__ import annotations

import numpy as np
import torch

from latticedraft.decoding.planning.acceptance import RateCorrection
from latticedraft.decoding.proposers.base import Proposal, Proposer, Step, StepRows
from latticedraft.errors import InputError
from latticedraft.gpu.verify.incremental import IncrementalLM, lean_stack


class ModelProposer(Proposer):
    """gamma: tokens drafted per step at most (>= 1); draft_model: a causal LM with the target's
    vocabulary; confidence: stop drafting once the calibrated chance that the whole draft so far
    is accepted is below it (0: always ``gamma`` tokens). A token's draft probability is the
    draft model's for it (after the sampling processors when sampling). Under the cost-aware tree
    (``step.acceptance`` set) each draft token carries its calibrated chance as its rate, so
    the tree verifies only the prefix worth its step cost. ``calibration`` lives as long as the
    proposer (across decode calls)."""

    name = "model"

    def __init__(self, draft_model, gamma: int = 4, confidence: float = 0.2):
        if gamma < 1:
            raise InputError(f"--gamma {gamma}: the draft model drafts at least 1 token per step")
        if not 0.0 <= confidence < 1.0:
            raise InputError(f"--draft-confidence {confidence}: give a probability in [0, 1) (0 = off)")
        self.draft_model, self.gamma, self.confidence = draft_model, int(gamma), float(confidence)
        self.lms: dict[int, IncrementalLM] = {}
        self.calibration = RateCorrection(decay=1.0, sources=1)  # draft probability -> chance of acceptance
        self.drafted: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # row -> (tokens, draft probabilities) of this step

    def start(self, rows: StepRows) -> None:
        stack = lean_stack(self.draft_model)
        self.lms = {i: IncrementalLM(self.draft_model, stack) for i in rows.index}

    def propose(self, step: Step) -> list[Proposal]:
        out = []
        self.drafted = {}
        for j, i in enumerate(step.index):
            n = min(self.gamma, step.rooms[j])
            lm, history = self.lms[i], step.histories[j]
            if n == 0:
                out.append(Proposal.empty())
                continue
            x = lm.next_logits(history, room=n)
            toks, probs, chance = np.zeros((1, n), dtype=np.int64), np.zeros((1, n)), np.zeros((1, n))
            sampler = None if step.samplers is None else step.samplers[j]
            t, whole = 0, 1.0  # tokens drafted; the chance all of them are accepted
            while True:
                if sampler is None:
                    toks[0, t] = int(torch.argmax(x))
                    probs[0, t] = float(torch.softmax(x.float(), -1)[toks[0, t]])
                else:  # its token under the run's noise for the position it drafts
                    q = sampler.probs(x[None], [np.concatenate([history, toks[0, :t]])])[0]
                    toks[0, t] = sampler.draw(q, len(history) + t)
                    probs[0, t] = q[toks[0, t]]
                chance[0, t] = self.calibration.corrected([probs[0, t]])[0]
                whole *= chance[0, t]
                t += 1
                if t == n or whole < self.confidence:
                    break
                x = lm.push(int(toks[0, t - 1]))
            lm.rewind()
            self.drafted[i] = (toks[0, :t], probs[0, :t])
            rates = chance[:, :t] if step.acceptance is not None else None
            out.append(Proposal(toks[:, :t], rates=rates))
        return out

    def update(self, step: Step, accepted, bonus, side_argmax) -> None:
        """Calibrate: how much of each row's draft the target kept (its accepted tokens and bonus)."""
        for j, i in enumerate(step.index):
            if i not in self.drafted:
                continue
            toks, probs = self.drafted[i]
            kept = np.concatenate([np.asarray(accepted[j], dtype=np.int64), np.asarray(bonus[j]).reshape(-1)])
            m = min(len(toks), len(kept))  # the target's tokens are known this far
            miss = np.flatnonzero(toks[:m] != kept[:m])
            hits = int(miss[0]) if len(miss) else m  # tokens kept; the target decided those and the first miss
            tried = min(hits + 1, m)
            self.calibration.observe(probs[:tried], np.arange(tried) < hits)

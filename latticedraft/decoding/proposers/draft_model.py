"""Classic speculative decoding's draft source: an auxiliary causal LM with the target's vocabulary.

``ModelProposer`` drafts ``gamma`` tokens after each row's history, greedily (its argmax: exact
greedy decoding) or, for lossless sampling, each drawn from its distribution after the sampling
processors (q). Every row keeps its own KV cache (``gpu.models.incremental.IncrementalLM``), so a
step feeds only the tokens accepted since the last one.
"""

from __future__ import annotations

import numpy as np
import torch

from latticedraft.decoding.proposers.base import Proposal, Proposer, Step, StepRows
from latticedraft.errors import InputError
from latticedraft.gpu.models.incremental import IncrementalLM, lean_stack


class ModelProposer(Proposer):
    """gamma: tokens drafted per step (>= 1); draft_model: a causal LM with the target's vocabulary."""

    name = "model"
    samples = True  # under sampling: paths drawn from q

    def __init__(self, draft_model, gamma: int = 4):
        if gamma < 1:
            raise InputError(f"--gamma {gamma}: the draft model drafts at least 1 token per step")
        self.draft_model, self.gamma = draft_model, int(gamma)
        self.lms: dict[int, IncrementalLM] = {}

    def start(self, rows: StepRows) -> None:
        stack = lean_stack(self.draft_model)
        self.lms = {i: IncrementalLM(self.draft_model, stack) for i in rows.index}

    def propose(self, step: Step) -> list[Proposal]:
        out = []
        for j, i in enumerate(step.index):
            n = min(self.gamma, step.rooms[j])
            lm, history = self.lms[i], step.histories[j]
            if n == 0:
                out.append(Proposal.empty())
                continue
            x = lm.next_logits(history, room=n)
            toks = np.zeros((1, n), dtype=np.int64)
            sampler = None if step.samplers is None else step.samplers[j]
            qs = None if sampler is None else np.zeros((1, n, sampler.vocab_size))
            for t in range(n):
                if sampler is None:
                    toks[0, t] = int(torch.argmax(x))
                else:
                    qs[0, t] = sampler.probs(x[None], [np.concatenate([history, toks[0, :t]])])[0]
                    toks[0, t] = sampler.draw(qs[0, t])
                if t + 1 < n:
                    x = lm.push(int(toks[0, t]))
            lm.rewind()
            out.append(Proposal(toks, q=qs))
        return out

"""Classic speculative decoding's draft source: an auxiliary causal LM with the target's vocabulary.

``ModelProposer`` drafts ``gamma`` tokens after each row's history, greedily (its argmax: exact
greedy decoding) or, for lossless sampling, each drawn from its distribution after the sampling
processors (q). Every row keeps its own KV cache (``IncrementalLM``), so a step feeds only the
tokens accepted since the last one. The same ``IncrementalLM`` serves the neural rescorer.
"""

from __future__ import annotations

import numpy as np
import torch

from latticedraft.decoding.proposers.base import Proposal, Proposer, Step, StepRows
from latticedraft.errors import InputError
from latticedraft.gpu.verify.kvcache import cache_length, crop_to
from latticedraft.gpu.verify.modes import position_limit


class IncrementalLM:
    """A small causal LM that keeps its own KV cache over a growing history: ``next_logp(history)``
    returns its log-softmax after ``history`` (float32[V]), feeding only the tokens the cache
    lacks (it starts over where the history diverged from what it holds); ``push(token)`` feeds
    one drafted token; ``rewind()`` crops back to the last history fed. A model with fewer
    positions than the history + the tokens to be pushed sees the latest positions only (drafts
    only: the cache then starts over each step). ``calls`` counts forwards."""

    def __init__(self, model):
        self.model = model
        self.device = next(model.parameters()).device
        self.cache, self.fed, self.calls, self.mark = None, np.zeros(0, dtype=np.int64), 0, 0
        self.limit = position_limit(model)

    @torch.inference_mode()
    def _run(self, ids: np.ndarray) -> torch.Tensor:
        from transformers import DynamicCache

        if self.cache is None:
            self.cache = DynamicCache()
        x = torch.as_tensor(np.asarray(ids, dtype=np.int64)[None], device=self.device)
        out = self.model(input_ids=x, past_key_values=self.cache, use_cache=True)
        self.calls += 1
        self.fed = np.concatenate([self.fed, np.asarray(ids, dtype=np.int64)])
        return out.logits[0, -1]

    def next_logits(self, history: np.ndarray, room: int = 0) -> torch.Tensor:
        """Raw logits [V] after ``history`` (int64[t], t >= 1); room: tokens to be pushed after it."""
        history = np.asarray(history, dtype=np.int64)
        if self.limit and len(history) + room > self.limit:  # fewer positions: the latest ones only
            history = history[len(history) + room - self.limit:]
        n = len(self.fed)
        if n == 0 or n > len(history) or not np.array_equal(history[:n], self.fed):
            self.cache, self.fed, n = None, np.zeros(0, dtype=np.int64), 0  # diverged: start over
        if n == len(history):  # nothing new: re-run the last token to get its logits
            self.rewind(n - 1)
            n -= 1
        out = self._run(history[n:])
        self.mark = len(self.fed)
        return out

    def push(self, token: int) -> torch.Tensor:
        """Feed one token; raw logits [V] after it."""
        return self._run(np.asarray([token], dtype=np.int64))

    def rewind(self, n: int | None = None) -> None:
        """Crop back to the first n tokens (default: the history of the last ``next_logits``)."""
        n = self.mark if n is None else n
        crop_to(self.cache, n)
        self.fed = self.fed[:n]
        assert cache_length(self.cache) == n


class ModelProposer(Proposer):
    """gamma: tokens drafted per step (>= 1); draft_model: a causal LM with the target's vocabulary."""

    name = "model"

    def __init__(self, draft_model, gamma: int = 4):
        if gamma < 1:
            raise InputError(f"--gamma {gamma}: the draft model drafts at least 1 token per step")
        self.draft_model, self.gamma = draft_model, int(gamma)
        self.lms: dict[int, IncrementalLM] = {}

    def start(self, rows: StepRows) -> None:
        self.lms = {i: IncrementalLM(self.draft_model) for i in rows.index}

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

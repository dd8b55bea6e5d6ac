"""A KV-cached causal LM over one growing history, and beam search that forks its cache.

``IncrementalLM(model)`` keeps the model's keys and values for the tokens it has been fed
(``fed``: int64[t]), so a call feeds only the tokens the cache lacks. Logits are the model's raw
logits (float, [V] per row; V: the model's vocabulary), unprocessed. ``Beams`` forks that cache
into w rows (one per beam) and feeds one token per beam per call ([w] -> [w, V]).

Both keep their keys and values in one ``kv.KVCache``. Two paths give the same numbers: models
``lean_stack`` accepts (an unwrapped GPT-2, LLaMA or Mistral; see ``gpu.verify.lean``) run
through ``LeanStack``, without transformers' per-call work; others through transformers' forward
over the same cache (``KVCache.transformers_cache``). ``calls`` counts forwards of either path.

    >>> lm = IncrementalLM(model)                        # doctest: +SKIP
    >>> x = lm.next_logits(np.array([5, 8, 13]), room=2) # [V]: after the history; 2 pushes to come
    >>> y = lm.push(int(x.argmax()))                     # [V]: one more token fed
    >>> lm.rewind()                                      # back to the 3-token history
    >>> fork = lm.beams(); fork.keep(np.zeros(4, dtype=np.int64)); z = fork.step(np.arange(4))  # [4, V]
"""

from __future__ import annotations

import numpy as np
import torch

from latticedraft.gpu.models.hf import cache_arg
from latticedraft.gpu.verify.kv import KVCache
from latticedraft.gpu.masks import causal_mask
from latticedraft.gpu.verify.modes import base_config, position_limit, sliding_window


class IncrementalLM:
    """A small causal LM that keeps its own KV cache over a growing history: ``next_logits(history)``
    returns its logits after ``history`` (float[V]), feeding only the tokens the cache lacks (it
    starts over where the history diverged from what it holds); ``push(token)`` feeds one drafted
    token; ``rewind()`` crops back to the last history fed; ``beams()`` forks the cache for beam
    search. A model with fewer positions than the history + the tokens to be pushed sees the
    latest positions only (drafts only: the cache then starts over each step). ``calls`` counts
    forwards. Models ``lean_stack`` accepts run through ``LeanStack`` (the same numbers as
    transformers' forward without its per-call work); others through transformers."""

    def __init__(self, model, stack="auto"):
        """stack: ``lean_stack(model)``, shared by several instances ("auto": built here)."""
        self.model = model
        self.device = next(model.parameters()).device
        self.cache, self.fed, self.calls, self.mark = None, np.zeros(0, dtype=np.int64), 0, 0
        self.limit, self.window = position_limit(model), sliding_window(model)
        self.stack = lean_stack(model) if isinstance(stack, str) else stack

    def _run(self, ids: np.ndarray) -> torch.Tensor:
        ids = np.asarray(ids, dtype=np.int64)
        self.fed = np.concatenate([self.fed, ids])
        if self.cache is None:
            layers = self.stack.num_layers if self.stack is not None else int(base_config(self.model).num_hidden_layers)
            self.cache = KVCache(1, layers, self.device, capacity=len(ids) + 16)
        return self.feed(self.cache, torch.as_tensor(ids[None], device=self.device))[0]

    @torch.inference_mode()
    def feed(self, cache: KVCache, x: torch.Tensor) -> torch.Tensor:
        """Run tokens x int64[b, n] after the slots of ``cache`` (every row equally long, no padding)
        and keep them; raw logits [b, V] after each row's last token."""
        self.calls += 1
        b, n = x.shape
        start = cache.reserve(n)
        pos = torch.as_tensor(cache.next_pos[:, None] + np.arange(n), device=self.device)
        if self.stack is None:
            logits = self.model(input_ids=x, position_ids=pos, use_cache=True,
                                **cache_arg(cache.transformers_cache())).logits[:, -1]
        else:
            stack = self.stack
            h = stack.run(stack.embed(x, pos), 0, stack.num_layers, causal_mask(start, n, self.window, self.device),
                          pos, cache)
            logits = stack.unembed(stack.norm(h[:, -1]))
        cache.append_valid(np.ones((b, n), dtype=bool), pos.cpu().numpy())
        return logits

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
        self.cache.truncate(n)
        self.cache.next_pos[:] = n
        self.fed = self.fed[:n]

    def beams(self) -> "Beams":
        """A fork of the cache as of now (one beam) for beam search; this one is not changed."""
        return Beams(self)


class Beams:
    """Beam search over an ``IncrementalLM``'s history: ``keep(rows)`` picks (and repeats) beams,
    int64[w'] indices into the current ones; ``step(tokens)`` feeds one token per beam (int64[w])
    and returns the logits after each [w, V]. Every beam's cache is its own copy of the history's."""

    def __init__(self, lm: IncrementalLM):
        self.lm = lm
        self.cache = lm.cache.fork(np.zeros(1, dtype=np.int64))

    def keep(self, rows: np.ndarray) -> None:
        self.cache.select_rows(np.asarray(rows, dtype=np.int64))

    def step(self, tokens: np.ndarray) -> torch.Tensor:
        x = torch.as_tensor(np.asarray(tokens, dtype=np.int64)[:, None], device=self.lm.device)  # [w, 1]
        return self.lm.feed(self.cache, x)


def lean_stack(model):
    """``LeanStack(model)`` where its layers are written out (an unwrapped causal LM; see
    ``lean.supports``), else None."""
    from latticedraft.gpu.verify.lean import stack_for, supports

    if supports(model) is not None or hasattr(model, "base") or position_limit(model) is None:
        return None
    return stack_for(model)

"""What a user would run instead of latticedraft, all through transformers' ``generate``
(greedy, so each output must equal latticedraft's): prompt-lookup decoding, assisted generation
with a small draft model, and left-padded batched greedy. Each returns (token lists int64[n_i],
seconds); outputs are cut after the first EOS, as ``bpd_decode`` cuts them.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from latticedraft.decoding.rows import cut_at_end

GREEDY = dict(do_sample=False, pad_token_id=0, temperature=None, top_p=None, top_k=None)


def _one_by_one(model, ids, max_new_tokens: int, eos, **kw):
    base = getattr(model, "base", model)
    dev = next(base.parameters()).device
    out, t0 = [], time.perf_counter()
    for p in ids:
        x = torch.as_tensor(np.asarray(p)[None], device=dev)
        g = base.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, eos_token_id=eos,
                          **GREEDY, **kw)
        out.append(cut_at_end(g[0, x.shape[1]:].tolist(), eos))
    return out, time.perf_counter() - t0


def greedy(model, ids, max_new_tokens: int, eos=None):
    """transformers' greedy ``generate``, one prompt at a time."""
    return _one_by_one(model, ids, max_new_tokens, eos)


def prompt_lookup(model, ids, max_new_tokens: int, num_tokens: int = 10, eos=None):
    """transformers' prompt-lookup decoding (``prompt_lookup_num_tokens``), one prompt at a time."""
    return _one_by_one(model, ids, max_new_tokens, eos, prompt_lookup_num_tokens=num_tokens)


def assisted(model, assistant, ids, max_new_tokens: int, eos=None):
    """transformers' assisted generation with ``assistant`` (same tokenizer) drafting."""
    return _one_by_one(model, ids, max_new_tokens, eos, assistant_model=assistant)


def greedy_batched(model, ids, max_new_tokens: int, batch_size: int, eos=None):
    """transformers' greedy ``generate`` on left-padded batches of ``batch_size`` prompts."""
    base = getattr(model, "base", model)
    dev = next(base.parameters()).device
    out, t0 = [], time.perf_counter()
    for s in range(0, len(ids), batch_size):
        chunk = ids[s : s + batch_size]
        n = max(len(p) for p in chunk)
        x = torch.zeros(len(chunk), n, dtype=torch.long, device=dev)
        mask = torch.zeros_like(x)
        for i, p in enumerate(chunk):
            x[i, n - len(p):] = torch.as_tensor(np.asarray(p), device=dev)
            mask[i, n - len(p):] = 1
        g = base.generate(x, attention_mask=mask, max_new_tokens=max_new_tokens, eos_token_id=eos, **GREEDY)
        out.extend(cut_at_end(g[i, n:].tolist(), eos) for i in range(len(chunk)))
    return out, time.perf_counter() - t0


class CallCounter:
    """Counts forward calls of a module (the target's calls inside HF ``generate``): ``.n``."""

    def __init__(self, module):
        self.n = 0
        module.register_forward_pre_hook(self._hook)

    def _hook(self, *_):
        self.n += 1

"""Per-layer-range KV caches for decoders that run a model's layers in separate ranges.

Kangaroo and PPD run the shallow layers of a token before its deep layers, so the ranges'
caches hold different tokens at times. Each range gets its own ``kv.KVCache`` (its
``first_layer`` and layer count): slots reserved during a step are pending (``KVCache.mark``,
``keys``) until the step commits them. ``prefill`` runs left-padded prompts through every range.
"""

from __future__ import annotations

import numpy as np
import torch

from latticedraft.errors import InputError
from latticedraft.gpu.verify.kv import KVCache
from latticedraft.gpu.models.layer_split import LayerSplit
from latticedraft.gpu.masks import causal


def left_pad(prompts: list[np.ndarray], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids int64[b, n], valid bool[b, n], pos int64[b, n]) of left-padded prompts."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise InputError("every prompt must have at least one token")
    b, n = len(prompts), max(len(p) for p in prompts)
    ids = torch.zeros(b, n, dtype=torch.long, device=device)
    valid = torch.zeros(b, n, dtype=torch.bool, device=device)
    for i, p in enumerate(prompts):
        ids[i, n - len(p):] = torch.as_tensor(np.asarray(p, dtype=np.int64), device=device)
        valid[i, n - len(p):] = True
    pos = (torch.cumsum(valid.long(), dim=1) - 1).clamp(min=0)
    return ids, valid, pos


@torch.inference_mode()
def prefill(split: LayerSplit, bounds: list[int], segs: list[KVCache], prompts: list[np.ndarray], at_bound=None):
    """Run the prompts through layer ranges ``bounds[j]..bounds[j+1]`` into ``segs[j]``.
    ``at_bound(j, h, bias, rotary)`` sees the hidden states entering range j (e.g. the adapter).
    Returns the final layer's hidden states at each prompt's last token [b, H]."""
    ids, valid, pos = left_pad(prompts, split.device)
    b, n = ids.shape
    bias = split.bias(valid[:, :0], pos[:, :0], pos, causal(valid))
    h = split.embed(ids, pos)
    rot = split.rotary_for(h, pos)
    for j, seg in enumerate(segs):
        if at_bound is not None:
            at_bound(j, h, bias, rot)
        seg.reserve(n)
        h = split.run(h, bounds[j], bounds[j + 1], bias, pos, seg, rot)
        seg.append_valid(valid, pos)
    return h[:, n - 1]


def drop_rows(segs: list[KVCache], keep: list[int]) -> None:
    """Keep batch rows ``keep`` of every range (finished rows leave)."""
    if segs and len(keep) < segs[0].batch:
        for s in segs:
            s.select_rows(np.asarray(keep, dtype=np.int64))

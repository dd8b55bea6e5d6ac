"""Per-layer-range KV caches for decoders that run a model's layers in separate ranges.

Kangaroo and PPD run the shallow layers of a token before its deep layers, so the ranges'
caches hold different tokens at times. Each range gets its own ``SlotCache`` (``kvcache.py``:
per-row ``valid`` and ``pos``, ``commit`` keeps chosen slots); slots appended during a step are
*pending* (``Pending``) until the step commits them. ``prefill`` runs left-padded prompts through
every range.
"""

from __future__ import annotations

import numpy as np
import torch

from latticedraft.errors import InputError
from latticedraft.gpu.verify.kvcache import SlotCache
from latticedraft.gpu.verify.layer_split import LayerSplit
from latticedraft.gpu.verify.masks import causal


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


class Pending:
    """Slots appended to a range's cache during one step, before ``commit``: valid bool[b, P], pos [b, P]."""

    def __init__(self, seg: SlotCache):
        self.seg, self.start = seg, seg.length
        self.valid = seg.valid[:, :0]
        self.pos = seg.pos[:, :0]

    def keys(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(valid, pos) of every slot a new query may see: committed then pending."""
        return torch.cat([self.seg.valid, self.valid], dim=1), torch.cat([self.seg.pos, self.pos], dim=1)

    def add(self, valid: torch.Tensor, pos: torch.Tensor) -> None:
        self.valid = torch.cat([self.valid, valid], dim=1)
        self.pos = torch.cat([self.pos, pos], dim=1)

    def commit(self, keep: torch.Tensor, keep_valid: torch.Tensor) -> None:
        """Keep pending slots ``keep`` [b, m] (``keep_valid`` False: masked forever), drop the rest."""
        self.seg.commit(self.start, keep, keep_valid)

    def commit_prefix(self, counts: torch.Tensor) -> None:
        """Keep the first ``counts[i]`` pending slots of row i (int64[b]), drop the rest."""
        m = max(int(counts.max()), 1)
        keep = torch.arange(m, device=counts.device)[None].expand(len(counts), m).contiguous()
        self.seg.commit(self.start, keep, keep < counts[:, None])


@torch.inference_mode()
def prefill(split: LayerSplit, bounds: list[int], segs: list[SlotCache], prompts: list[np.ndarray], at_bound=None):
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
        h = split.run(h, bounds[j], bounds[j + 1], bias, pos, seg.cache, rot)
        seg.append_valid(valid, pos)
    return h[:, n - 1]


def drop_rows(segs: list[SlotCache], keep: list[int]) -> None:
    """Keep batch rows ``keep`` of every range (finished rows leave)."""
    if segs and len(keep) < segs[0].batch:
        rows = torch.as_tensor(keep, dtype=torch.long, device=segs[0].valid.device)
        for s in segs:
            s.select_rows(rows)

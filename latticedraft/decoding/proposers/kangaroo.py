"""Kangaroo's draft source (Liu et al. 2024): the first ``l`` layers and an adapter draft, a
double early exit stops them; ``methods/kangaroo.py`` decodes with it."""

from __future__ import annotations

import numpy as np
import torch

from latticedraft.decoding.proposers.base import Proposal, Proposer, Step
from latticedraft.errors import InputError
from latticedraft.gpu.verify.kv import KVCache
from latticedraft.gpu.models.layer_split import LayerSplit
from latticedraft.gpu.verify.split_cache import drop_rows


def check_kangaroo(gamma: int, eta: float) -> None:
    """Kangaroo's ranges: at least one draft per step, a confidence threshold in [0, 1)."""
    if gamma < 1 or not (0.0 <= eta < 1.0):
        raise InputError(f"kangaroo needs --gamma >= 1 and 0 <= --eta < 1; got gamma={gamma}, eta={eta}")


class KangarooProposer(Proposer):
    """Drafts from the base's first ``adapter.exit_layer`` layers and the adapter; its ``stem``
    runs the prompts through those layers at the verifier's prefill. Proposals carry the
    layer-l states the verifier continues from (``Proposal.hidden``)."""

    name = "kangaroo"

    def __init__(self, split: LayerSplit, adapter, gamma: int = 6, eta: float = 0.6):
        check_kangaroo(gamma, eta)
        self.split, self.adapter, self.gamma, self.eta = split, adapter, int(gamma), float(eta)
        self.exit_layer = int(adapter.exit_layer)
        self.shallow = self.adapt = None  # KVCaches of layers 0..l and of the adapter's layer
        self.pending = None  # (shallow, adapt) first slot the current step's drafts reserved

    def stem(self, ids: torch.Tensor, valid: torch.Tensor, pos: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Prefill: left-padded prompts ids int64[b, n] (valid bool[b, n], pos int64[b, n], causal
        bias [b, 1, n, n]) through layers 0..l and the adapter; returns the layer-l states [b, n, H]."""
        (b, n), dev = ids.shape, ids.device
        self.shallow, self.adapt = KVCache(b, self.exit_layer, dev), KVCache(b, 1, dev)
        self.shallow.reserve(n)
        self.adapt.reserve(n)
        h = self.split.embed(ids, pos)
        rot = self.split.rotary_for(h, pos)
        h = self.split.run(h, 0, self.exit_layer, bias, pos, self.shallow, rot)
        self.shallow.append_valid(valid, pos)
        self.adapter(h, bias, rot, self.adapt)
        self.adapt.append_valid(valid, pos)
        return h

    def propose(self, step: Step) -> list[Proposal]:
        split, dev, n = self.split, self.split.device, len(step.rows)
        limit = np.asarray([min(self.gamma, r) for r in step.rooms])
        self.pending = (self.shallow.end, self.adapt.end)
        live = np.ones(n, dtype=bool)
        ndraft = np.zeros(n, dtype=np.int64)
        cur = torch.as_tensor([int(h[-1]) for h in step.histories], dtype=torch.long, device=dev)
        one = np.ones((n, 1, 1), dtype=bool)
        states, drafts = [], []
        for j in range(self.gamma + 1):
            q_h = split.clamp(self.shallow.next_pos[:, None] + j)
            q_pos = torch.from_numpy(q_h).to(dev)
            bias = split.bias(*self.shallow.keys(), q_h, one)
            self.shallow.reserve(1)
            self.adapt.reserve(1)
            x = split.embed(cur[:, None], q_pos)
            rot = split.rotary_for(x, q_pos)
            h = split.run(x, 0, self.exit_layer, bias, q_pos, self.shallow, rot)
            a = self.adapter(h, bias, rot, self.adapt)
            states.append(h)
            self.shallow.mark(live[:, None], q_h)
            self.adapt.mark(live[:, None], q_h)
            go = live & (j < limit)
            if not go.any():
                break
            conf, top = torch.softmax(split.head(a[:, 0]).float(), dim=-1).max(dim=-1)
            go &= (conf > self.eta).cpu().numpy()
            if not go.any():
                break
            cur = torch.where(torch.from_numpy(go).to(dev), top, torch.zeros_like(top))
            drafts.append(cur)
            live, ndraft = go, ndraft + go
        hs = torch.cat(states, dim=1)  # [n, J + 1, H]
        dr = torch.stack(drafts, dim=1).cpu().numpy() if drafts else np.zeros((n, 0), dtype=np.int64)
        return [Proposal(dr[j : j + 1, : ndraft[j]], hidden=hs[j, : 1 + ndraft[j]]) for j in range(n)]

    def update(self, step: Step, accepted, bonus, side_argmax) -> None:
        kept = np.asarray([len(a) + 1 for a in accepted], dtype=np.int64)
        for cache, start in zip((self.shallow, self.adapt), self.pending):
            cache.commit_prefix(start, kept)
        self.pending = None

    def retire(self, keep: list[int]) -> None:
        drop_rows([self.shallow, self.adapt], keep)

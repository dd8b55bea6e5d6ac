"""Kangaroo (Liu et al. 2024): self-speculative decoding with a double early exit; greedy, exact.

Each step of a row, from its root token (the last emitted, in no cache yet):

1. drafting (``KangarooProposer``): the root, then each drafted token, runs once through the
   first ``l`` layers (appending to the proposer's shallow cache) and the adapter
   (``gpu/models/adapter.py``, its own cache); the adapter's top-1 is the next draft, until
   ``gamma`` drafts or a top-1 confidence <= ``eta`` (the second early exit). Rows of a batch
   draft in lock step; a row that stopped drafting carries masked dummy slots;
2. verification: the shared verifier in split mode (``Verifier(model, from_layer=l)``) runs
   layers ``l..d`` once over the kept layer-``l`` states of [root, drafts] (the first ``l``
   layers are never recomputed); the longest draft prefix equal to the full model's argmax is
   accepted plus one bonus token;
3. every cache keeps exactly the accepted slots (the verifier its deep layers', the proposer
   its shallow layers' and the adapter's).

Counting as every decoder: the prefill emits 1 token, each step (one deep pass) emits
accepted + 1; ``tree_nodes`` records 1 + drafted tokens per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from latticedraft.decoding.proposers.base import Proposal, Proposer, Step
from latticedraft.decoding.registry import Method
from latticedraft.errors import InputError
from latticedraft.gpu.verify.kvcache import SlotCache
from latticedraft.gpu.verify.layer_split import LayerSplit
from latticedraft.gpu.verify.split_cache import Pending, drop_rows


@dataclass(frozen=True)
class KangarooOptions:
    """gamma: most drafts per step; eta: drafting stops when the adapter's top-1 probability is
    <= eta; adapter: the adapter directory (None: the bundled ``data/adapter-kangaroo``)."""

    gamma: int = 6
    eta: float = 0.6
    adapter: str | None = None

    def __post_init__(self):
        if self.gamma < 1 or not (0.0 <= self.eta < 1.0):
            raise InputError(f"kangaroo needs --gamma >= 1 and 0 <= --eta < 1; got gamma={self.gamma}, eta={self.eta}")


class KangarooProposer(Proposer):
    """Drafts from the base's first ``adapter.exit_layer`` layers and the adapter; its ``stem``
    runs the prompts through those layers at the verifier's prefill. Proposals carry the
    layer-l states the verifier continues from (``Proposal.hidden``)."""

    name = "kangaroo"

    def __init__(self, split: LayerSplit, adapter, gamma: int = 6, eta: float = 0.6):
        KangarooOptions(gamma, eta)
        self.split, self.adapter, self.gamma, self.eta = split, adapter, int(gamma), float(eta)
        self.exit_layer = int(adapter.exit_layer)
        self.shallow = self.adapt = None
        self.pending: tuple[Pending, Pending] | None = None

    def stem(self, ids: torch.Tensor, valid: torch.Tensor, pos: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Prefill: left-padded prompts ids int64[b, n] (valid bool[b, n], pos int64[b, n], causal
        bias [b, 1, n, n]) through layers 0..l and the adapter; returns the layer-l states [b, n, H]."""
        b, dev = ids.shape[0], ids.device
        self.shallow, self.adapt = SlotCache.empty(b, dev), SlotCache.empty(b, dev)
        h = self.split.embed(ids, pos)
        rot = self.split.rotary_for(h, pos)
        h = self.split.run(h, 0, self.exit_layer, bias, pos, self.shallow.cache, rot)
        self.shallow.append_valid(valid, pos)
        self.adapter(h, bias, rot, self.adapt.cache)
        self.adapt.append_valid(valid, pos)
        return h

    def propose(self, step: Step) -> list[Proposal]:
        split, dev, n = self.split, self.split.device, len(step.rows)
        limit = torch.as_tensor([min(self.gamma, r) for r in step.rooms], device=dev)
        ps, pa = Pending(self.shallow), Pending(self.adapt)
        live = torch.ones(n, dtype=torch.bool, device=dev)
        ndraft = torch.zeros(n, dtype=torch.long, device=dev)
        cur = torch.as_tensor([int(h[-1]) for h in step.histories], dtype=torch.long, device=dev)
        states, drafts = [], []
        for j in range(self.gamma + 1):
            q_pos = split.clamp(self.shallow.next_pos[:, None] + j)
            kv, kp = ps.keys()
            bias = split.bias(kv, kp, q_pos, torch.ones(n, 1, 1, dtype=torch.bool, device=dev))
            x = split.embed(cur[:, None], q_pos)
            rot = split.rotary_for(x, q_pos)
            h = split.run(x, 0, self.exit_layer, bias, q_pos, self.shallow.cache, rot)
            a = self.adapter(h, bias, rot, self.adapt.cache)
            states.append(h)
            ps.add(live[:, None], q_pos)
            pa.add(live[:, None], q_pos)
            go = live & (j < limit)
            if not bool(go.any()):
                break
            conf, top = torch.softmax(split.head(a[:, 0]).float(), dim=-1).max(dim=-1)
            go &= conf > self.eta
            if not bool(go.any()):
                break
            cur = torch.where(go, top, torch.zeros_like(top))
            drafts.append(cur)
            live, ndraft = go, ndraft + go.long()
        self.pending = (ps, pa)
        hs = torch.cat(states, dim=1)  # [n, J + 1, H]
        dr = torch.stack(drafts, dim=1).cpu().numpy() if drafts else np.zeros((n, 0), dtype=np.int64)
        nd = ndraft.tolist()
        return [Proposal(dr[j : j + 1, : nd[j]], hidden=hs[j, : 1 + nd[j]]) for j in range(n)]

    def update(self, step: Step, accepted, bonus, side_argmax) -> None:
        kept = torch.as_tensor([len(a) + 1 for a in accepted], dtype=torch.long, device=self.split.device)
        for p in self.pending:
            p.commit_prefix(kept)
        self.pending = None

    def retire(self, keep: list[int]) -> None:
        drop_rows([self.shallow, self.adapt], keep)


def acceptance_by_position(sequences) -> list[float]:
    """Early-exit acceptance rate per draft position j = 1, 2, ...: of the steps that drafted at
    least j tokens, the fraction whose first j drafts were all accepted (from ``accepted_drafts``
    and ``tree_nodes`` = 1 + drafted of each step)."""
    drafted = [n - 1 for s in sequences for n in s.tree_nodes]
    accepted = [a for s in sequences for a in s.accepted_drafts]
    top = max(drafted, default=0)
    out = []
    for j in range(1, top + 1):
        tried = [a for a, n in zip(accepted, drafted) if n >= j]
        out.append(round(sum(a >= j for a in tried) / len(tried), 4) if tried else 0.0)
    return out


def kangaroo_decode(model, prompts: list, adapter, *, gamma: int = 6, eta: float = 0.6, max_new_tokens: int = 64,
                    eos_token_id=None, on_tokens=None, first_row: int = 0, rows: list | None = None):
    """Greedy Kangaroo decoding on the one loop; output equals ``generate(do_sample=False)``.

    model: an HF causal LM (or a BlockwiseModel: its base runs); adapter: a ``KangarooAdapter``
    for that base (its ``exit_layer`` is l). prompts: int sequences (>= 1 token each)."""
    from latticedraft.decoding.loop import speculative_decode
    from latticedraft.gpu.verify.verifier import Verifier

    proposer = KangarooProposer(LayerSplit(model), adapter, gamma, eta)
    index = list(range(first_row, first_row + len(prompts)))
    res = speculative_decode(model, prompts, [proposer], max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                             verifier=Verifier(model, num_heads=1, from_layer=proposer.exit_layer), index=index,
                             rows=index if rows is None else rows, on_tokens=on_tokens)
    res.verify_reason = f"kangaroo l={proposer.exit_layer} gamma={gamma} eta={eta}; {res.verify_reason}"
    return res


def _configure(values: dict, given: set) -> KangarooOptions:
    pick = lambda k, d: d if values.get(k) is None else values[k]  # noqa: E731
    return KangarooOptions(gamma=pick("gamma", 6), eta=pick("eta", 0.6), adapter=values.get("adapter"))


def _label(o: KangarooOptions, sampling) -> str:
    return f"kangaroo gamma={o.gamma} eta={o.eta}"


def _settings(o: KangarooOptions, sampling) -> dict:
    from dataclasses import asdict

    return asdict(o)


def _prepare(session, o: KangarooOptions, batch_size: int) -> None:
    session.adapter(o.adapter)  # a missing or mismatching adapter fails before any output


def _run(session, prompts, o: KangarooOptions, req):
    return kangaroo_decode(session.model, prompts, session.adapter(o.adapter), gamma=o.gamma, eta=o.eta,
                           max_new_tokens=req.max_new_tokens, eos_token_id=req.eos_token_id, on_tokens=req.on_tokens,
                           rows=req.rows)


METHOD = Method(
    name="kangaroo",
    summary="Kangaroo: drafts from the first l layers + an adapter, verifies with the remaining layers over the "
            "stored states; lossless",
    lossless=True,
    sampling="never",
    options=("adapter", "gamma", "eta"),
    configure=_configure,
    label=_label,
    settings=_settings,
    run=_run,
    prepare=_prepare,
    files=lambda o: ("adapter",),
)

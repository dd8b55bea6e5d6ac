"""Kangaroo (Liu et al. 2024): self-speculative decoding with a double early exit; greedy, exact.

Each step of a row, from its root token (the last emitted, in no cache yet):

1. drafting: the root, then each drafted token, runs once through the first ``l`` layers
   (appending to the shallow cache) and the adapter (``gpu/adapter.py``, its own cache); the
   adapter's top-1 is the next draft, until ``gamma`` drafts or a top-1 confidence <= ``eta``
   (the second early exit);
2. verification: layers ``l..d`` run once over the kept layer-``l`` states of [root, drafts]
   (the first ``l`` layers are never recomputed); the longest draft prefix equal to the full
   model's argmax is accepted plus one bonus token (the argmax after it);
3. every range's cache keeps exactly the accepted slots.

Rows of a batch draft in lock step; a row that stopped drafting carries masked dummy slots.
Counting as ``bpd.py``: the prefill emits 1 token, each step (one deep pass) emits accepted + 1;
``tree_nodes`` records 1 + drafted tokens per step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from latticedraft.decoding.loop import DecodeResult, SequenceResult, _eos_set, checked_prompts
from latticedraft.errors import InputError
from latticedraft.gpu.verify.kvcache import SlotCache
from latticedraft.gpu.verify.layer_split import LayerSplit
from latticedraft.gpu.verify.split_cache import Pending, drop_rows, prefill


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


class Rows:
    """Emitted tokens and per-step counts of every row; ``emit`` cuts at EOS and the budget."""

    def __init__(self, prompts, max_new_tokens, eos, on_tokens, t_start):
        b = len(prompts)
        self.prompts, self.max_new, self.eos, self.cb, self.t0 = prompts, max_new_tokens, eos, on_tokens, t_start
        self.out = [[] for _ in range(b)]
        self.per_call = [[] for _ in range(b)]
        self.accepted = [[] for _ in range(b)]
        self.nodes = [[] for _ in range(b)]
        self.done_at = [0.0] * b

    def room(self, i: int) -> int:
        """Drafts row i may still accept (the bonus token takes the last place)."""
        return max(self.max_new - len(self.out[i]) - 1, 0)

    def emit(self, i: int, new: list[int]) -> bool:
        take = []
        for t in new:
            take.append(t)
            if t in self.eos or len(self.out[i]) + len(take) >= self.max_new:
                break
        self.out[i].extend(take)
        self.per_call[i].append(len(take))
        if self.cb is not None:
            self.cb(i, take)
        finished = len(take) < len(new) or take[-1] in self.eos or len(self.out[i]) >= self.max_new
        if finished:
            self.done_at[i] = time.perf_counter() - self.t0
        return finished

    def result(self, mode: str, reason: str, timing: dict) -> DecodeResult:
        seqs = [SequenceResult(prompt_ids=self.prompts[i], tokens=np.asarray(self.out[i], dtype=np.int64),
                               calls=len(self.per_call[i]), tokens_per_call=self.per_call[i], seconds=self.done_at[i],
                               accepted_drafts=self.accepted[i], tree_nodes=self.nodes[i])
                for i in range(len(self.prompts))]
        return DecodeResult(seqs, mode, reason, time.perf_counter() - self.t0, timing)


@torch.inference_mode()
def kangaroo_decode(model, prompts: list, adapter, *, gamma: int = 6, eta: float = 0.6, max_new_tokens: int = 64,
                    eos_token_id=None, on_tokens=None) -> DecodeResult:
    """Greedy Kangaroo decoding; output equals ``generate(do_sample=False)``.

    model: an HF causal LM (or a BlockwiseModel: its base runs); adapter: a ``KangarooAdapter``
    for that base (its ``exit_layer`` is l). prompts: int sequences (>= 1 token each)."""
    KangarooOptions(gamma, eta)
    prompts = checked_prompts(model, prompts, max_new_tokens)
    split = LayerSplit(model)
    l, d, dev = adapter.exit_layer, split.num_layers, split.device
    timing = {"model": 0.0, "draft": 0.0, "accept": 0.0}
    t_start = time.perf_counter()
    rows = Rows(prompts, max_new_tokens, _eos_set(eos_token_id), on_tokens, t_start)
    b = len(prompts)
    shallow, adapt, deep = SlotCache.empty(b, dev), SlotCache.empty(b, dev), SlotCache.empty(b, dev)

    def feed_adapter(j, h, bias, rot):
        if j == 1:  # the prompt's layer-l states enter the adapter's cache
            adapter(h, bias, rot, adapt.cache)
            adapt.append_valid(shallow.valid, shallow.pos)  # the slots the prefill just recorded

    t0 = time.perf_counter()
    last = prefill(split, [0, l, d], [shallow, deep], prompts, at_bound=feed_adapter)
    first = split.logits(last).argmax(-1).cpu().numpy()
    timing["model"] += time.perf_counter() - t0
    active = [i for i in range(b) if not rows.emit(i, [int(first[i])])]
    drop_rows([shallow, adapt, deep], active)
    roots = torch.as_tensor([int(first[i]) for i in active], dtype=torch.long, device=dev)

    while active:
        t0 = time.perf_counter()
        n = len(active)
        limit = torch.as_tensor([min(gamma, rows.room(i)) for i in active], device=dev)
        ps, pa = Pending(shallow), Pending(adapt)
        live = torch.ones(n, dtype=torch.bool, device=dev)
        ndraft = torch.zeros(n, dtype=torch.long, device=dev)
        cur, states, drafts = roots, [], []
        for j in range(gamma + 1):
            q_pos = split.clamp(shallow.next_pos[:, None] + j)
            kv, kp = ps.keys()
            bias = split.bias(kv, kp, q_pos, torch.ones(n, 1, 1, dtype=torch.bool, device=dev))
            x = split.embed(cur[:, None], q_pos)
            rot = split.rotary_for(x, q_pos)
            h = split.run(x, 0, l, bias, q_pos, shallow.cache, rot)
            a = adapter(h, bias, rot, adapt.cache)
            states.append(h)
            ps.add(live[:, None], q_pos)
            pa.add(live[:, None], q_pos)
            go = live & (j < limit)
            if not bool(go.any()):
                break
            conf, top = torch.softmax(split.head(a[:, 0]).float(), dim=-1).max(dim=-1)
            go &= conf > eta
            if not bool(go.any()):
                break
            cur = torch.where(go, top, torch.zeros_like(top))
            drafts.append(cur)
            live, ndraft = go, ndraft + go.long()
        t1 = time.perf_counter()
        # verification: the deep layers over the kept layer-l states
        hs = torch.cat(states, dim=1)  # [n, J+1, H]
        pend_valid, pend_pos = ps.valid, ps.pos
        J1 = hs.shape[1]
        tri = torch.ones(J1, J1, dtype=torch.bool, device=dev).tril()[None] & pend_valid[:, None, :]
        bias = split.bias(deep.valid, deep.pos, pend_pos, tri)
        hd = split.run(hs, l, d, bias, pend_pos, deep.cache)
        am = split.logits(hd).argmax(-1)  # [n, J+1]
        t2 = time.perf_counter()
        if drafts:
            dr = torch.stack(drafts, dim=1)  # [n, J]
            ok = (dr == am[:, :-1]) & (torch.arange(dr.shape[1], device=dev)[None] < ndraft[:, None])
            acc = torch.cumprod(ok.long(), dim=1).sum(dim=1)
        else:
            dr, acc = None, torch.zeros(n, dtype=torch.long, device=dev)
        bonus = am[torch.arange(n, device=dev), acc]
        dp = Pending(deep)
        dp.add(pend_valid, pend_pos)
        for p in (ps, pa, dp):
            p.commit_prefix(acc + 1)
        still, live_rows = [], []
        acc_l, nd_l, bonus_l = acc.tolist(), ndraft.tolist(), bonus.tolist()
        for j, i in enumerate(active):
            toks = [] if dr is None else dr[j, : acc_l[j]].tolist()
            rows.accepted[i].append(acc_l[j])
            rows.nodes[i].append(1 + nd_l[j])
            if not rows.emit(i, toks + [bonus_l[j]]):
                still.append(i)
                live_rows.append(j)
        drop_rows([shallow, adapt, deep], live_rows)
        roots = bonus[torch.as_tensor(live_rows, dtype=torch.long, device=dev)]
        active = still
        timing["draft"] += t1 - t0
        timing["model"] += t2 - t1
        timing["accept"] += time.perf_counter() - t2
    return rows.result("split", f"kangaroo l={l} gamma={gamma} eta={eta}", timing)


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

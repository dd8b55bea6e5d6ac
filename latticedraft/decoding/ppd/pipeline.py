"""Predictive pipelined decoding (Yang et al. 2023, Algorithm 1 and Appendix C); greedy, exact.

Per token x_t of a row (d layers, early exit after layer ``dbar``, ``k`` candidates,
``m = min(d - dbar, dbar)`` layers of candidate pre-computation):

1. the main pass runs x_t through layers ``0..dbar`` (from layer m when x_t was a matched
   candidate: its first m layers are done) and takes the early-exit top-k at layer dbar, with the
   shared LM head (final norm + head) or a per-layer head (``exit_head``);
2. *in parallel in the paper*: the main pass finishes layers ``dbar..d`` (its greedy token y),
   while the k candidates run layers ``0..m`` as k extra query rows of one forward, each seeing
   the cache and x_t (layers < m of x_t are done, so they never wait for the main pass);
3. y is emitted. If y is a candidate, that candidate's layer-m state and cache slots become
   x_{t+1}'s (its first m layers are not run again); otherwise x_{t+1} = y starts at layer 0.

What runs in parallel where: the k candidates always run as k rows of one forward (one call,
not k). On CUDA with ``streams=True`` the candidates' forward runs on a side stream concurrently
with the main pass's layers dbar..d (they touch disjoint layer caches). On CPU both run one
after the other on the same threads: no concurrency between the main pass and the
candidates, so PPD cannot be faster than greedy there; its latency is predicted by
``ppd_model.py`` (Theorem 4.1) from the measured match rate.

Counting: every step emits exactly one token (``tokens_per_call`` 1); ``accepted_drafts`` per
step is 1 where the early prediction held y (a pipelined, saved step), ``tree_nodes`` is 1 + k.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from latticedraft.decoding.rows import Rows
from latticedraft.decoding.runs.prompt_length import checked_prompts
from latticedraft.errors import InputError
from latticedraft.gpu.verify.kv import KVCache
from latticedraft.gpu.models.layer_split import LayerSplit
from latticedraft.gpu.verify.split_cache import drop_rows, prefill


def check_ppd(dbar: int | None, k: int) -> None:
    """PPD's ranges before the model is known: at least one candidate, an exit after layer 1 or later."""
    if k < 1 or (dbar is not None and dbar < 1):
        raise InputError(f"ppd needs --k >= 1 and --exit-layer >= 1; got k={k}, exit layer={dbar}")


def check_dbar(dbar: int, d: int) -> None:
    if not 1 <= dbar < d:
        raise InputError(f"--exit-layer {dbar} must lie in [1, {d - 1}] for a model of {d} layers")


@dataclass
class _Settings:
    """A run's fixed settings: the layer split (d layers), the early exit after layer ``dbar``, ``k``
    candidates, ``m`` layers of candidate pre-computation, the exit head (None: the shared LM head)
    and whether the candidates run on a CUDA side stream."""

    split: LayerSplit
    dbar: int
    k: int
    m: int
    exit_head: Callable | None
    use_streams: bool
    eye: np.ndarray = field(init=False)  # [k, k]: each candidate row sees itself, not the others

    def __post_init__(self):
        self.eye = np.eye(self.k, dtype=bool)

    @property
    def d(self) -> int:
        return self.split.num_layers

    def early(self, h: torch.Tensor) -> torch.Tensor:
        """Logits [n, V] at the early exit from the layer-``dbar`` states ``h`` [n, H]."""
        return self.split.logits(h) if self.exit_head is None else self.exit_head(h, self.dbar)


@dataclass
class _Live:
    """The live rows between steps: their row ids (``active``), the token each feeds next (``x`` [n]),
    whether that token is a matched candidate (``matched`` [n] on the device, ``matched_h`` on the host)
    and the matched candidates' layer-m states (``h_cand`` [n, 1, H]; None before the first step)."""

    active: list
    x: torch.Tensor
    matched: torch.Tensor
    matched_h: np.ndarray
    h_cand: torch.Tensor | None = None


@dataclass
class _Query:
    """The step's one query row per live row: x_t's position (``q_h`` [n, 1] on the host, ``q`` on the
    device; ``high`` holds every token before it), the masks ``one`` [n, 1, 1] and slot ``first_slot``."""

    q_h: np.ndarray
    q: torch.Tensor
    one: np.ndarray
    first_slot: np.ndarray


def _lower_layers(P: _Settings, low: KVCache, live: _Live, qy: _Query) -> torch.Tensor:
    """Layers 0..m of x_t, [n, 1, H]: run for rows whose token is not a matched candidate (matched rows
    are masked dummies there and keep their candidate's state)."""
    if live.matched_h.all():
        return live.h_cand
    split = P.split
    bias = split.bias(*low.keys(), qy.q_h, qy.one)
    start = low.reserve(1)
    hm = split.run(split.embed(live.x[:, None], qy.q), 0, P.m, bias, qy.q, low)
    low.commit(start, qy.first_slot, ~live.matched_h[:, None])
    if live.h_cand is not None:
        hm = torch.where(live.matched[:, None, None], live.h_cand, hm)
    return hm


def _finish_and_candidates(P: _Settings, low: KVCache, high: KVCache, qy: _Query, hd, cands, bias, rot):
    """Step 2: the main pass's layers dbar..d (greedy tokens y [n]) and the k candidates' layers 0..m
    as k query rows of one forward (states [n, k, H]), concurrently on CUDA with side streams.
    Returns ``(y, candidate states, the candidates' first slot in low)``."""
    split, k, dev = P.split, P.k, P.split.device
    n = len(qy.q_h)
    cq_h = np.repeat(split.clamp(qy.q_h + 1), k, axis=1)
    cq = torch.from_numpy(cq_h).to(dev)
    cbias = split.bias(*low.keys(), cq_h, np.broadcast_to(P.eye, (n, k, k)))
    cstart = low.reserve(k)

    def candidates():
        return split.run(split.embed(cands, cq), 0, P.m, cbias, cq, low)

    if P.use_streams:
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            hc = candidates()
        hf = split.run(hd, P.dbar, P.d, bias, qy.q, high, rot)
        torch.cuda.current_stream(dev).wait_stream(side)
    else:
        hf = split.run(hd, P.dbar, P.d, bias, qy.q, high, rot)
        hc = candidates()
    return split.logits(hf[:, 0]).argmax(-1), hc, cstart


def _accept(P: _Settings, low: KVCache, high: KVCache, live: _Live, rows: Rows, cands, y, hc, cstart: int) -> None:
    """Step 3: emit y per row; where y is a candidate, its layer-m state and cache slots become x_{t+1}'s.
    Finished rows leave the caches and ``live``."""
    n, dev = len(live.active), P.split.device
    hit = cands == y[:, None]
    matched = hit.any(dim=1)
    c = hit.long().argmax(dim=1)
    matched_h, c_h = matched.cpu().numpy(), c.cpu().numpy()
    low.commit(cstart, c_h[:, None], matched_h[:, None])
    h_cand = hc[torch.arange(n, device=dev), c][:, None]
    ml, yl = matched_h.tolist(), y.tolist()
    done = []
    for j, i in enumerate(live.active):
        rows.step(i, int(ml[j]), 1 + P.k)
        done.append(rows.emit(i, [yl[j]]))
    kept = rows.finish(done)
    still = list(rows.live)
    if len(kept) < n:
        drop_rows([low, high], kept)
        sel = torch.as_tensor(kept, dtype=torch.long, device=dev)
        y, matched, h_cand, matched_h = y[sel], matched[sel], h_cand[sel], matched_h[kept]
    live.x, live.active, live.matched, live.matched_h, live.h_cand = y, still, matched, matched_h, h_cand


def _step(P: _Settings, low: KVCache, high: KVCache, live: _Live, rows: Rows, timing: dict) -> None:
    """One token of every live row (the module docstring's steps 1-3); ``timing``: draft (step 1),
    model (step 2), accept (step 3) seconds."""
    split = P.split
    t0 = time.perf_counter()
    n = len(live.active)
    q_h = high.next_pos[:, None]  # x_t's position (high holds every token before it)
    qy = _Query(q_h, torch.from_numpy(q_h).to(split.device), np.ones((n, 1, 1), dtype=bool),
                np.zeros((n, 1), dtype=np.int64))
    hm = _lower_layers(P, low, live, qy)
    bias = split.bias(*high.keys(), qy.q_h, qy.one)  # the main pass to the early exit, its top-k there
    hstart = high.reserve(1)
    rot = split.rotary_for(hm, qy.q)
    hd = split.run(hm, P.m, P.dbar, bias, qy.q, high, rot)
    cands = P.early(hd[:, 0]).topk(P.k, dim=-1).indices  # [n, k]
    t1 = time.perf_counter()
    y, hc, cstart = _finish_and_candidates(P, low, high, qy, hd, cands, bias, rot)
    t2 = time.perf_counter()
    high.commit(hstart, qy.first_slot, qy.one[:, 0], prefix=True)
    _accept(P, low, high, live, rows, cands, y, hc, cstart)
    timing["draft"] += t1 - t0
    timing["model"] += t2 - t1
    timing["accept"] += time.perf_counter() - t2


@torch.inference_mode()
def ppd_decode(model, prompts: list, *, dbar: int | None = None, k: int = 3, max_new_tokens: int = 64,
               eos_token_id=None, on_tokens=None, exit_head=None, streams: bool = True):
    """Greedy PPD; output equals ``generate(do_sample=False)``. exit_head: ``f(h [n, H], dbar) ->
    logits [n, V]`` at the early exit (None: the shared final norm + LM head)."""
    check_ppd(dbar, k)
    prompts = checked_prompts(model, prompts, max_new_tokens)
    check_candidates(k, model)
    split = LayerSplit(model)
    d, dev = split.num_layers, split.device
    dbar = d // 2 if dbar is None else int(dbar)
    check_dbar(dbar, d)
    m = min(d - dbar, dbar)
    P = _Settings(split, dbar, k, m, exit_head, streams and dev.type == "cuda")
    timing = {"model": 0.0, "draft": 0.0, "accept": 0.0}
    rows = Rows(prompts, max_new_tokens, eos_token_id, on_tokens)
    b = len(prompts)
    low, high = KVCache(b, m, dev), KVCache(b, d - m, dev, first_layer=m)  # layers 0..m, m..d
    t0 = time.perf_counter()
    last = prefill(split, [0, m, d], [low, high], prompts)
    first = split.logits(last).argmax(-1)
    timing["model"] += time.perf_counter() - t0
    rows.finish([rows.emit(i, [int(first[i])]) for i in range(b)])
    active = list(rows.live)
    drop_rows([low, high], active)
    live = _Live(active, first[torch.as_tensor(active, dtype=torch.long, device=dev)],
                 torch.zeros(len(active), dtype=torch.bool, device=dev), np.zeros(len(active), dtype=bool))
    while live.active:
        _step(P, low, high, live, rows, timing)
    where = "CUDA side stream" if P.use_streams else "sequential on one stream"
    return rows.result("split", f"ppd d={d} dbar={dbar} k={k} m={m}; candidates {where}", timing)


def check_candidates(k: int, model) -> None:
    """k early candidates index the vocabulary: at most V of them."""
    from latticedraft.gpu.models import hf

    V = hf.model_vocab_size(getattr(model, "base", model))
    if not 1 <= k <= V:
        raise InputError(f"--candidates {k} must lie in [1, {V}] (the model's vocabulary); lower --candidates")

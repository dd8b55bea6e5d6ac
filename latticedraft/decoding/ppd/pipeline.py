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
    early = (lambda h: split.logits(h)) if exit_head is None else (lambda h: exit_head(h, dbar))
    use_streams = streams and dev.type == "cuda"
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
    keep = torch.as_tensor(active, dtype=torch.long, device=dev)
    x = first[keep]
    matched = torch.zeros(len(active), dtype=torch.bool, device=dev)
    matched_h = np.zeros(len(active), dtype=bool)
    h_cand = None
    eye = np.eye(k, dtype=bool)
    while active:
        t0 = time.perf_counter()
        n = len(active)
        one, first_slot = np.ones((n, 1, 1), dtype=bool), np.zeros((n, 1), dtype=np.int64)
        q_h = high.next_pos[:, None]  # x_t's position (high holds every token before it)
        q = torch.from_numpy(q_h).to(dev)
        # 1. layers 0..m for rows whose token is not a matched candidate (matched rows: masked dummies)
        if matched_h.all():
            hm = h_cand
        else:
            bias = split.bias(*low.keys(), q_h, one)
            start = low.reserve(1)
            hm = split.run(split.embed(x[:, None], q), 0, m, bias, q, low)
            low.commit(start, first_slot, ~matched_h[:, None])
            if h_cand is not None:
                hm = torch.where(matched[:, None, None], h_cand, hm)
        # main pass to the early exit, top-k there
        bias = split.bias(*high.keys(), q_h, one)
        hstart = high.reserve(1)
        rot = split.rotary_for(hm, q)
        hd = split.run(hm, m, dbar, bias, q, high, rot)
        cands = early(hd[:, 0]).topk(k, dim=-1).indices  # [n, k]
        t1 = time.perf_counter()
        # 2. candidates (k query rows, layers 0..m) and the main pass's layers dbar..d
        cq_h = np.repeat(split.clamp(q_h + 1), k, axis=1)
        cq = torch.from_numpy(cq_h).to(dev)
        cbias = split.bias(*low.keys(), cq_h, np.broadcast_to(eye, (n, k, k)))
        cstart = low.reserve(k)

        def candidates():
            return split.run(split.embed(cands, cq), 0, m, cbias, cq, low)

        if use_streams:
            side = torch.cuda.Stream(device=dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                hc = candidates()
            hf = split.run(hd, dbar, d, bias, q, high, rot)
            torch.cuda.current_stream(dev).wait_stream(side)
        else:
            hf = split.run(hd, dbar, d, bias, q, high, rot)
            hc = candidates()
        y = split.logits(hf[:, 0]).argmax(-1)  # [n]
        t2 = time.perf_counter()
        high.commit(hstart, first_slot, one[:, 0], prefix=True)
        hit = cands == y[:, None]
        matched = hit.any(dim=1)
        c = hit.long().argmax(dim=1)
        matched_h, c_h = matched.cpu().numpy(), c.cpu().numpy()
        low.commit(cstart, c_h[:, None], matched_h[:, None])
        h_cand = hc[torch.arange(n, device=dev), c][:, None]
        ml, yl = matched_h.tolist(), y.tolist()
        done = []
        for j, i in enumerate(active):
            rows.step(i, int(ml[j]), 1 + k)
            done.append(rows.emit(i, [yl[j]]))
        live = rows.finish(done)
        still = list(rows.live)
        if len(live) < n:
            drop_rows([low, high], live)
            sel = torch.as_tensor(live, dtype=torch.long, device=dev)
            y, matched, h_cand, matched_h = y[sel], matched[sel], h_cand[sel], matched_h[live]
        x, active = y, still
        timing["draft"] += t1 - t0
        timing["model"] += t2 - t1
        timing["accept"] += time.perf_counter() - t2
    where = "CUDA side stream" if use_streams else "sequential on one stream"
    return rows.result("split", f"ppd d={d} dbar={dbar} k={k} m={m}; candidates {where}", timing)


def check_candidates(k: int, model) -> None:
    """k early candidates index the vocabulary: at most V of them."""
    from latticedraft.gpu.models import hf

    V = hf.model_vocab_size(getattr(model, "base", model))
    if not 1 <= k <= V:
        raise InputError(f"--candidates {k} must lie in [1, {V}] (the model's vocabulary); lower --candidates")

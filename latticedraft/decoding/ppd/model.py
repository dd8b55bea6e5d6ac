"""The PPD latency/compute model (Yang et al. 2023, Section 4) and what feeds it.

Units: one *time unit* is one decoder layer's forward for one token on one compute unit; a
greedy token costs d units. With the early exit after layer ``dbar`` and ``k`` candidates, a
matched candidate has done ``m = min(d - dbar, dbar)`` layers of the next token by the time
the main pass ends (for dbar >= d/2, m = d - dbar, the paper's case).

- ``expected_latency`` / ``expected_compute``: Theorem 4.1, E over N - 1 ~ Bin(l - 1, 1 - p):
  latency ``d l - m (l - 1) p``, compute ``latency + k m l`` (equal to the theorem for
  dbar >= d/2; for dbar < d/2 a matched token saves only the dbar layers the candidates could do);
- ``simulate``: a discrete-event simulation of the pipeline (main process and k candidate
  processes as timed events), independent of the formula, which it checks;
- ``match_rates``: the measured p_correct (the final greedy token among the early-exit top-k at
  layer dbar) per layer and k on greedy continuations of held-out prompts.
"""

from __future__ import annotations

import heapq

import numpy as np
import torch

from latticedraft.errors import InputError


def _check(d: int, dbar: int, p: float, l: int) -> int:
    if not 1 <= dbar < d:
        raise InputError(f"early-exit layer {dbar} must lie in [1, {d - 1}] for d = {d} layers")
    if not 0.0 <= p <= 1.0 or l < 1:
        raise InputError(f"p_correct {p} must lie in [0, 1] and l {l} >= 1")
    return min(d - dbar, dbar)


def expected_latency(d: int, dbar: int, p: float, l: int) -> float:
    """E[time units] to generate l tokens (Theorem 4.1)."""
    m = _check(d, dbar, p, l)
    return d * l - m * (l - 1) * p


def expected_compute(d: int, dbar: int, p: float, k: int, l: int) -> float:
    """E[compute units] (unit-busy time summed over the k + 1 units) for l tokens (Theorem 4.1)."""
    m = _check(d, dbar, p, l)
    return expected_latency(d, dbar, p, l) + k * m * l


def simulate(d: int, dbar: int, k: int, l: int, p: float | None = None, rng=None,
             matches: np.ndarray | None = None) -> tuple[float, float]:
    """One run of the pipeline as discrete events; returns (latency, compute) in time units.

    Events: ``exit`` (the main pass of forward t reaches layer dbar: k candidate processes
    start, each busy for m units) and ``done`` (the main pass ends: token t is out; if the
    early prediction held it, which is ``matches[t]`` or a Bernoulli(p) draw, forward t + 1
    resumes from layer m the moment its candidate is done, else it starts at layer 0)."""
    m = _check(d, dbar, 0.0 if p is None else p, l)
    if matches is None and (p is None or rng is None):
        raise InputError("simulate needs p and rng, or a recorded matches array")
    events: list[tuple[float, int, str, int]] = []
    seq = 0

    def push(t, kind, tok):
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, tok))
        seq += 1

    busy = 0.0  # compute units: the main process's busy time + the candidates'
    cand_done = 0.0
    push(float(dbar), "exit", 0)
    start_layer = {0: 0}
    started = {0: 0.0}
    while events:
        now, _, kind, t = heapq.heappop(events)
        if kind == "exit":
            busy += k * m
            cand_done = now + m
            push(now + (d - dbar), "done", t)
        else:  # main pass of forward t done at `now`: token t emitted
            busy += now - started[t]
            if t == l - 1:
                return now, busy
            hit = bool(matches[t]) if matches is not None else bool(rng.random() < p)
            begin = max(now, cand_done) if hit else now
            start_layer[t + 1] = m if hit else 0
            started[t + 1] = begin
            push(begin + (dbar - start_layer[t + 1]), "exit", t + 1)
    raise AssertionError("unreachable: the last token ends the simulation")


def simulate_mean(d: int, dbar: int, k: int, l: int, p: float, seeds: int = 50) -> tuple[float, float]:
    """Mean (latency, compute) over ``seeds`` simulated runs."""
    runs = [simulate(d, dbar, k, l, p, np.random.default_rng(s)) for s in range(seeds)]
    return float(np.mean([r[0] for r in runs])), float(np.mean([r[1] for r in runs]))


@torch.inference_mode()
def match_rates(model, sequences: list[tuple[np.ndarray, int]], ks=(1, 3, 5), exit_head=None) -> dict:
    """p_correct[dbar][k] over the generated positions of ``sequences`` ((ids int64[T], n_prompt)
    pairs: a prompt and its greedy continuation), for every dbar in 1..d-1: the fraction of
    positions whose final greedy token is among the top-k at layer dbar (shared final norm +
    LM head, or ``exit_head(h [n, H], dbar) -> logits``). Returns {"rates": {dbar: {k: p}},
    "positions": count}."""
    from latticedraft.gpu.models.layer_split import LayerSplit

    split = LayerSplit(model)
    d = split.num_layers
    hits = {j: {kk: 0 for kk in ks} for j in range(1, d)}
    total = 0
    for ids, n_prompt in sequences:
        x = torch.as_tensor(np.asarray(ids, dtype=np.int64)[None], device=split.device)
        out = split.lm(input_ids=x, attention_mask=torch.ones_like(x), output_hidden_states=True)
        # positions n_prompt-1 .. T-2 predict the generated tokens n_prompt .. T-1
        sl = slice(n_prompt - 1, x.shape[1] - 1)
        target = out.logits[0, sl].argmax(-1)
        total += int(target.numel())
        for j in range(1, d):
            h = out.hidden_states[j][0, sl]
            logits = split.logits(h) if exit_head is None else exit_head(h, j)
            top = logits.topk(max(ks), dim=-1).indices
            for kk in ks:
                hits[j][kk] += int((top[:, :kk] == target[:, None]).any(dim=1).sum())
    return {"rates": {j: {kk: hits[j][kk] / max(total, 1) for kk in ks} for j in hits}, "positions": total}


def predicted(sequences, d: int, dbar: int, k: int) -> dict:
    """PPD's measured match rate over decoded ``sequences`` (``accepted_drafts`` per step: 1 where
    the early top-k held the greedy token) and Theorem 4.1's latency and compute per token,
    in layer-time units and relative to greedy's d per token, for the mean output length l."""
    hits = [a for s in sequences for a in s.accepted_drafts]
    p = float(np.mean(hits)) if hits else 0.0
    l = max(1, int(round(np.mean([len(s.tokens) for s in sequences])))) if sequences else 1
    lat, comp = expected_latency(d, dbar, p, l) / l, expected_compute(d, dbar, p, k, l) / l
    return {"p_correct": round(p, 4), "steps": len(hits), "d": d, "dbar": dbar, "k": k, "l": l,
            "latency_per_token": round(lat, 4), "compute_per_token": round(comp, 4),
            "latency_vs_greedy": round(lat / d, 4), "compute_vs_greedy": round(comp / d, 4)}

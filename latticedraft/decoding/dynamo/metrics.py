"""Multi-token perplexity (DynaMo's Eq. 4, PPL_d) and a judge-free quality proxy for generations.

Perplexities (natural log inside, all heads at temperature 1 over the full vocabulary):

- ``PPL_n     = exp(-mean_t log f^n(x_{t+n} | x_{1:t}))``: head n alone;
- ``PPL_{1:n} = exp(-mean_t (1/n) Σ_{i≤n} log f^i(x_{t+i} | x_{1:t}))``: the independent joint of
  heads 1..n (Eq. 2), per token;
- ``PPL_d(ε_b)``: walk the text; at position t the sampler's back-off rule (thresholds, mask,
  repetition penalty on the true context) picks n_t; score ``Σ_{i≤n_t} log f^i(x_{t+i}|x_{1:t})``
  and jump to t + n_t. ``PPL_d = exp(-Σ score / Σ n_t)``; ``tokens_per_step = Σ n_t / steps``.

Means run over every position whose targets lie inside the evaluation window (the paper's Eq. 4
divides by T; dividing by the number of terms makes PPL_n comparable across n). Texts are cut
into windows of ``window`` tokens, each scored independently (no context across windows).

Quality proxy for open-ended generations: the base model's own perplexity of the generated
tokens given the prompt (``continuation_perplexity``), ``distinct_n`` (unique / total n-grams,
pooled over the generations) and ``repetition_rate`` (share of n-grams in a generation that
already occurred earlier in the same generation, pooled).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from latticedraft.errors import InputError


@dataclass
class MultiTokenPerplexity:
    """``ppl_n[n]``, ``ppl_1n[n]`` for n = 1..h; ``dynamic[ε_b] = (PPL_d, tokens_per_step)``; token counts."""

    ppl_n: dict[int, float]
    ppl_1n: dict[int, float]
    dynamic: dict[float, tuple[float, float]] = field(default_factory=dict)
    tokens: int = 0
    dynamic_tokens: int = 0


def windows(ids: Sequence[int], window: int) -> list[np.ndarray]:
    """Non-overlapping windows of ``window`` tokens (the last may be shorter; windows of < 2 are dropped)."""
    a = np.asarray(ids, dtype=np.int64)
    return [a[i:i + window] for i in range(0, a.size, window) if a[i:i + window].size >= 2]


def multi_token_perplexity(model, texts: Sequence[Sequence[int]], window: int = 256,
                           epsilons: Sequence[float] = (), config=None, cooc=None,
                           dynamic_tokens: int | None = 4096, progress: bool | None = None) -> MultiTokenPerplexity:
    """PPL_n, PPL_{1:n} for every head n of ``model`` and PPL_d for each ``ε_b`` in ``epsilons``.

    ``model``: a multi-head model (``forward(input_ids, heads=True).head_logits [b, s, h, V]``) or
    a plain HF causal LM (one head). ``texts``: token-id sequences. PPL_d (which runs the
    sampler's decision at each visited position) uses the first ``dynamic_tokens`` tokens only.
    ``config``: a ``DynamoConfig`` for PPL_d (its ``epsilon_b`` is replaced by each value).
    """
    import torch
    from dataclasses import replace

    from latticedraft.decoding.dynamo.config import DynamoConfig
    from latticedraft.decoding.dynamo.sampler import step_distribution

    config = config or DynamoConfig()
    wins = [w for t in texts for w in windows(t, window)]
    if not wins:
        raise InputError("no held-out text to score: every text is shorter than 2 tokens")
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    joint: dict[int, float] = {}
    jcount: dict[int, int] = {}
    dyn = {float(e): [0.0, 0, 0] for e in epsilons}  # logp sum, tokens, steps
    dyn_budget = dynamic_tokens if dynamic_tokens is not None else sum(w.size for w in wins)
    used = 0
    bar = _bar(len(wins), progress, "perplexity")
    with torch.no_grad():
        for w in wins:
            head_logits = _head_logits(model, torch.tensor(w[None, :]))[0]  # [s, h, V]
            logp = torch.log_softmax(head_logits.double(), dim=-1).cpu().numpy()
            s, h, _ = logp.shape
            g = np.full((s, h), np.nan)
            for i in range(h):
                t = np.arange(s - i - 1)
                g[t, i] = logp[t, i, w[t + i + 1]]
            for n in range(1, h + 1):
                col = g[:, n - 1]
                ok = ~np.isnan(col)
                sums[n] = sums.get(n, 0.0) + col[ok].sum()
                counts[n] = counts.get(n, 0) + int(ok.sum())
                rows = ~np.isnan(g[:, :n]).any(axis=1)
                joint[n] = joint.get(n, 0.0) + g[rows, :n].sum()
                jcount[n] = jcount.get(n, 0) + int(rows.sum()) * n
            if dyn and used < dyn_budget:
                for e, acc in dyn.items():
                    cfg = replace(config, epsilon_b=e, max_n=None)
                    t = 0
                    while t < s - 1:
                        room = min(s - 1 - t, h, config.n_for(h))
                        n = step_distribution(head_logits[t, :room].double().cpu().numpy(), w[: t + 1], cfg, cooc,
                                              n_max=room).n
                        acc[0] += g[t, :n].sum()
                        acc[1] += n
                        acc[2] += 1
                        t += n
                used += s
            bar.update(1)
    bar.close()
    res = MultiTokenPerplexity(
        ppl_n={n: math.exp(-sums[n] / counts[n]) for n in sums if counts[n]},
        ppl_1n={n: math.exp(-joint[n] / jcount[n]) for n in joint if jcount[n]},
        tokens=int(sum(w.size for w in wins)),
        dynamic_tokens=int(min(used, dyn_budget)) if dyn else 0,
    )
    for e, (lp, tok, steps) in dyn.items():
        if tok:
            res.dynamic[e] = (math.exp(-lp / tok), tok / steps)
    return res


def continuation_perplexity(model, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
                            batch_size: int = 16) -> float:
    """The base model's perplexity of ``continuations`` given ``prompts`` (token-weighted, natural log).

    ``model``: an HF causal LM (``forward(input_ids, attention_mask).logits``) or a multi-head model
    (its first head, which is the base model's next-token head, is used).
    """
    import torch

    if len(prompts) != len(continuations):
        raise InputError(f"{len(prompts)} prompts but {len(continuations)} continuations")
    total, n = 0.0, 0
    pairs = [(list(p), list(c)) for p, c in zip(prompts, continuations) if len(c)]
    with torch.no_grad():
        for b in range(0, len(pairs), batch_size):
            chunk = pairs[b:b + batch_size]
            L = max(len(p) + len(c) for p, c in chunk)
            ids = torch.zeros((len(chunk), L), dtype=torch.long)
            mask = torch.zeros((len(chunk), L), dtype=torch.long)
            for i, (p, c) in enumerate(chunk):
                s = p + c
                ids[i, : len(s)] = torch.tensor(s)
                mask[i, : len(s)] = 1
            logits = _next_token_logits(model, ids, mask)
            logp = torch.log_softmax(logits.double(), dim=-1).cpu().numpy()
            for i, (p, c) in enumerate(chunk):
                pos = np.arange(len(p) - 1, len(p) + len(c) - 1)
                total += logp[i, pos, np.asarray(c)].sum()
                n += len(c)
    if n == 0:
        raise InputError("no generated tokens to score")
    return math.exp(-total / n)


def distinct_n(seqs: Sequence[Sequence[int]], n: int) -> float:
    """Unique n-grams / all n-grams over every sequence (pooled). 0.0 when there is none."""
    grams = [tuple(s[i:i + n]) for s in seqs for i in range(len(s) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def repetition_rate(seqs: Sequence[Sequence[int]], n: int = 4) -> float:
    """Share of n-grams that already occurred earlier in the same sequence (pooled over sequences)."""
    rep = tot = 0
    for s in seqs:
        seen: set[tuple] = set()
        for i in range(len(s) - n + 1):
            g = tuple(s[i:i + n])
            rep += g in seen
            tot += 1
            seen.add(g)
    return rep / tot if tot else 0.0


def _head_logits(model, ids):
    if hasattr(model, "num_heads"):
        return model(input_ids=ids, heads=True).head_logits
    return model(input_ids=ids).logits[:, :, None, :]


def _next_token_logits(model, ids, mask):
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    if hasattr(model, "num_heads"):
        return model(input_ids=ids, attention_mask=mask, position_ids=pos, heads=True).head_logits[:, :, 0]
    return model(input_ids=ids, attention_mask=mask, position_ids=pos).logits


def _bar(total: int, enabled: bool | None, desc: str):
    from tqdm.auto import tqdm

    disable = (not sys.stderr.isatty()) if enabled is None else not enabled
    return tqdm(total=total, desc=desc, disable=disable)

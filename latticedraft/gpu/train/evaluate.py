"""Held-out evaluation: perplexity of a causal LM, per-head top-1 accuracy, entropy and agreement
with the base of a BlockwiseModel, and how closely a draft model follows its base."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from latticedraft.gpu.train.data import progress_enabled


@torch.no_grad()
def perplexity(model, windows: np.ndarray, batch_size: int = 8, from_position: int = 1) -> float:
    """exp(mean next-token NLL) over ``windows`` (int64[n, s]); the tokens at positions
    ``from_position`` .. s-1 are scored (default every position but the first; a later start
    scores only tokens with at least that much context)."""
    model.eval()
    nll, count = 0.0, 0
    k = max(1, from_position)
    for i in tqdm(range(0, len(windows), batch_size), desc="perplexity", disable=not progress_enabled()):
        b = torch.from_numpy(windows[i : i + batch_size]).to(next(model.parameters()).device)
        logits = model(input_ids=b, attention_mask=torch.ones_like(b)).logits[:, k - 1:-1].float()
        nll += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), b[:, k:].reshape(-1), reduction="sum").item()
        count += b[:, k:].numel()
    return math.exp(nll / count)


@dataclass
class HeadMetrics:
    """Per head j = 1..h (list index j-1), over held-out positions t with a target t+j.

    accuracy: top-1 accuracy of head j for token t+j; entropy: mean entropy of head j's
    distribution (nats); nll: mean −ln p(token t+j) (nats); agreement: fraction of positions
    where head j's argmax is the base's own prediction of token t+j (its argmax at t+j-1, the
    text read by the base); positions: positions scored per head.
    """

    accuracy: list[float]
    entropy: list[float]
    nll: list[float]
    positions: list[int]
    agreement: list[float]


@torch.no_grad()
def head_metrics(bm, windows: np.ndarray, batch_size: int = 4) -> HeadMetrics:
    """Evaluate every head of ``bm`` on ``windows`` (int64[n, s], s > h)."""
    bm.eval()
    h = bm.num_heads
    acc, ent, nll, agree = np.zeros(h), np.zeros(h), np.zeros(h), np.zeros(h)
    cnt = np.zeros(h, dtype=np.int64)
    dev = next(bm.parameters()).device
    for i in tqdm(range(0, len(windows), batch_size), desc="head metrics", disable=not progress_enabled()):
        b = torch.from_numpy(windows[i : i + batch_size]).to(dev)
        s = b.shape[1]
        out = bm(b, heads=True)
        base_next = out.logits.argmax(-1)  # [b, s]: the base's prediction of token t+1
        for j in range(1, h + 1):
            logp = torch.log_softmax(out.head_logits[:, : s - j, j - 1].float(), dim=-1)
            tgt = b[:, j:]
            acc[j - 1] += (logp.argmax(-1) == tgt).sum().item()
            agree[j - 1] += (logp.argmax(-1) == base_next[:, j - 1 : s - 1]).sum().item()
            ent[j - 1] += -(logp.exp() * logp).sum(-1).sum().item()
            nll[j - 1] += -logp.gather(-1, tgt.unsqueeze(-1)).sum().item()
            cnt[j - 1] += tgt.numel()
    return HeadMetrics(accuracy=(acc / cnt).tolist(), entropy=(ent / cnt).tolist(), nll=(nll / cnt).tolist(),
                       positions=cnt.tolist(), agreement=(agree / cnt).tolist())


@torch.no_grad()
def follows_base(model, base, windows: np.ndarray, batch_size: int = 8) -> dict:
    """How closely a draft model follows its base on ``windows`` (int64[n, s]): the mean
    ``KL(p_base || p_model)`` of the next token (nats) and the fraction of positions where their
    argmaxes agree, every position scored."""
    from latticedraft.gpu.train.distill import Teacher

    model.eval(), base.eval()
    kl = agree = 0.0
    count = 0
    dev = next(model.parameters()).device
    for i in tqdm(range(0, len(windows), batch_size), desc="follows base", disable=not progress_enabled()):
        b = torch.from_numpy(windows[i : i + batch_size]).to(dev)
        t = Teacher(base(input_ids=b).logits)
        logits = model(input_ids=b).logits
        n = b.numel()
        kl += t.kl(logits, 0, b.shape[1]).item() * n
        agree += t.agreement(logits, 0, b.shape[1]) * n
        count += n
    return {"kl": kl / count, "agreement": agree / count}

"""Probe: would an EAGLE-style feature drafter draft more than SmolLM2's heads? (offline, not timed)

EAGLE (Li et al. 2024) drafts at the feature level: from the target's last-layer state f_t (before
the final norm) and the embedding of the token x_{t+1} the target chose there, one decoder layer
predicts f_{t+1}; the target's own norm and output projection turn it into the draft x_{t+2}; then
(f^_{t+1}, x^_{t+2}) give f^_{t+2}, and so on. Our heads read h_t (and x_{t+1}) once and guess
every later token from it. This probe trains such a layer on the heads' own corpus on this CPU
(the layer started from SmolLM2's last layer, an input projection 2H -> H; loss: smooth-L1 to the
next feature + w * cross-entropy of the next-next token over the heads' 8192-token draft
vocabulary, EAGLE's noise on input features; ``--ttt`` adds EAGLE-3's training-time test, a second
chain step fed the drafter's own features and scored on the token after), then compares it with
``data/heads-smollm2`` on the 24 Spec-Bench answers ``head_agreement.py`` uses (seed 17, first
turns through the chat template, HF greedy, 64 tokens), teacher-forced at every answer position t:

- depth d top-1: the chain's d-th draft (token t+1+d), the drafter fed its own earlier drafts
  (EAGLE) or head d+1's top-1 (heads), equal to greedy's token there;
- chain tokens per call: 1 + the leading run of correct drafts, a chain of 1-4 drafts, averaged
  over positions (an upper bound on what a chain adds per verify call, its nodes not costed).

Both choose among the 1024 most frequent tokens of the heads' draft vocabulary (what ``decode``
projects heads onto by default) and, in a second column, among all 49152.

    .venv/bin/python benchmarks/results/closing-2026-11-29b/probe_feature_drafter.py
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from head_agreement import prompt_ids  # noqa: E402
from latticedraft.atomic import write_atomic  # noqa: E402
from latticedraft.decoding.eval import hf_baselines  # noqa: E402
from latticedraft.decoding.eval.evaluate import machine  # noqa: E402
from latticedraft.decoding.runs.session import Session  # noqa: E402
from latticedraft.gpu.models.draft_vocab import load_ranked  # noqa: E402


class FeatureDrafter(nn.Module):
    """EAGLE's drafter: f^_{t+1} = layer(fc([e(x_{t+1}), f_t])), a Llama decoder layer started from
    the base's last layer; ``forward`` takes an explicit attention mask so chains can be scored in
    parallel."""

    def __init__(self, base):
        super().__init__()
        cfg = base.config
        self.h, self.nh, self.nkv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
        self.hd = cfg.hidden_size // cfg.num_attention_heads
        self.fc = nn.Linear(2 * self.h, self.h, bias=False)
        with torch.no_grad():  # start as "the feature, plus nothing from the token"
            self.fc.weight.zero_()
            self.fc.weight[:, self.h:] = torch.eye(self.h)
        self.layer = copy.deepcopy(base.model.layers[-1]).float()
        for p in self.layer.parameters():
            p.requires_grad_(True)
        theta = cfg.rope_parameters["rope_theta"] if getattr(cfg, "rope_parameters", None) else cfg.rope_theta
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, self.hd, 2).float() / self.hd), persistent=False)

    def _rope(self, x, pos):
        ang = pos.float()[..., None] * self.inv_freq  # [N, hd/2]
        cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
        x1, x2 = x[..., : self.hd // 2], x[..., self.hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def forward(self, emb, feat, pos, mask=None):
        """emb, feat [B, N, H]; pos int64[N]; mask bool[N, N] (True = may attend) or None (causal)."""
        L = self.layer
        x = self.fc(torch.cat([emb, feat], -1))
        B, N, _ = x.shape
        a = L.input_layernorm(x)
        q = L.self_attn.q_proj(a).view(B, N, self.nh, self.hd).transpose(1, 2)
        k = L.self_attn.k_proj(a).view(B, N, self.nkv, self.hd).transpose(1, 2)
        v = L.self_attn.v_proj(a).view(B, N, self.nkv, self.hd).transpose(1, 2)
        q, k = self._rope(q, pos), self._rope(k, pos)
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        x = x + L.self_attn.o_proj(o.transpose(1, 2).reshape(B, N, self.h))
        return x + L.mlp(L.post_attention_layernorm(x))


def last_states(base, ids: torch.Tensor) -> torch.Tensor:
    """The last decoder layer's output before the final norm, [B, L, H] float32."""
    got = {}
    hook = base.model.layers[-1].register_forward_hook(lambda m, i, o: got.__setitem__("f", o[0] if isinstance(o, tuple) else o))
    try:
        base.model(input_ids=ids)
    finally:
        hook.remove()
    return got["f"].float()


def corpus_windows(tokenizer, files: list[Path], seq: int, limit: int, seed: int) -> torch.Tensor:
    """int64[n, seq] non-overlapping windows of the files' tokens, shuffled, up to ``limit`` tokens."""
    ids = []
    for f in files:
        ids += tokenizer.encode(gzip.open(f, "rt", encoding="utf-8").read()).ids
    n = len(ids) // seq
    w = torch.as_tensor(ids[: n * seq]).view(n, seq)
    w = w[torch.randperm(n, generator=torch.Generator().manual_seed(seed))]
    return w[: max(1, limit // seq)]


def train(drafter, base, windows, feats, cols_train, args, log):
    """EAGLE's loss on precomputed features; returns the per-step log."""
    emb, norm, head = base.model.embed_tokens, base.model.norm, base.lm_head.weight
    w_cols = head[cols_train].detach()  # [V', H]
    remap = torch.full((head.shape[0],), -100, dtype=torch.long)
    remap[cols_train] = torch.arange(len(cols_train))
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=args.lr, betas=(0.9, 0.95))
    n = len(windows)
    hist, t0 = [], time.time()
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        idx = torch.randint(0, n, (args.batch_size,))
        x, f = windows[idx], feats[idx].float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fin = f[:, :-1] + (torch.rand_like(f[:, :-1]) - 0.5) * 0.2  # EAGLE's U(-0.1, 0.1)
            with torch.no_grad():
                e = emb(x[:, 1:])
            pred = drafter(e, fin, torch.arange(x.shape[1] - 1))  # f^_{t+1} for t = 0..L-2
            reg = F.smooth_l1_loss(pred.float(), f[:, 1:])
            logits = F.linear(norm(pred[:, :-1]), w_cols)  # token t+2 for t = 0..L-3
            ce = F.cross_entropy(logits.float().reshape(-1, len(cols_train)), remap[x[:, 2:]].reshape(-1), ignore_index=-100)
        loss = args.reg_weight * reg + args.ce_weight * ce
        if args.ttt:  # EAGLE-3's training-time test: a second step fed its own features
            with torch.autocast("cpu", dtype=torch.bfloat16):
                ce2 = second_step(drafter, x, fin, e, pred, w_cols, remap, norm, emb)
            loss = loss + args.ce_weight * ce2
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        hist.append({"step": step + 1, "reg": round(reg.item(), 4), "ce": round(ce.item(), 4)})
        if (step + 1) % 25 == 0 or step == 0:
            log(f"step {step + 1}/{args.steps}: smooth-L1 {reg.item():.4f}, cross-entropy {ce.item():.3f}, {time.time() - t0:.0f} s")
    return hist


def chain_mask(n_true: int, ts: torch.Tensor, blocks: int) -> torch.Tensor:
    """bool[n, n] (True = may attend), n = n_true + blocks * len(ts): causal over the n_true true
    inputs; row j of chain block b (position ts[j] + b) sees the true inputs 0..ts[j] and row j of
    blocks 1..b, as drafting token by token would."""
    T = len(ts)
    n = n_true + blocks * T
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask[:n_true, :n_true] = torch.ones(n_true, n_true, dtype=torch.bool).tril()
    j = torch.arange(T)
    for b in range(1, blocks + 1):
        rows = n_true + (b - 1) * T + j
        mask[rows, :n_true] = torch.arange(n_true)[None] <= ts[:, None]
        for bb in range(1, b + 1):
            mask[rows, n_true + (bb - 1) * T + j] = True
    return mask


def second_step(drafter, x, fin, e, pred, w_cols, remap, norm, emb):
    """The chain's second step in training: at position t + 1 the input (f^_{t+1}, e(x_{t+2})) beside
    the true inputs of positions 0..t; its output f^_{t+2} is scored on x_{t+3} alone
    (EAGLE-3 drops the feature loss there): the cross-entropy."""
    N = fin.shape[1]  # N = L - 1 true inputs (positions 0..L-2)
    n2 = N - 1  # second-step rows t = 0..L-3
    with torch.no_grad():
        e2 = emb(x[:, 2:])
    E = torch.cat([e, e2], 1)
    Fe = torch.cat([fin, pred[:, :-1]], 1)
    P = torch.cat([torch.arange(N), torch.arange(1, n2 + 1)])
    out = drafter(E, Fe, P, chain_mask(N, torch.arange(n2), 1))[:, N:]  # f^_{t+2}, t = 0..L-3
    logits = F.linear(norm(out[:, :-1]), w_cols)  # token t+3 for t = 0..L-4
    ce = F.cross_entropy(logits.float().reshape(-1, w_cols.shape[0]), remap[x[:, 3:]].reshape(-1), ignore_index=-100)
    return ce


@torch.no_grad()
def eagle_chain(drafter, base, text: torch.Tensor, lo: int, depth: int, cols):
    """Drafts [T, depth] of the chain at positions t = lo .. L-2 (token t+1 is the target's), fed its
    own features and tokens, over the token ids ``cols`` (None: all)."""
    L = len(text)
    f = last_states(base, text[None])[0]  # [L, H]
    emb, norm, head = base.model.embed_tokens, base.model.norm, base.lm_head.weight
    w = head if cols is None else head[cols]
    T = L - 1 - lo  # positions t = lo .. L-2, each with the target's token t+1 = text[t+1]
    ts = torch.arange(lo, L - 1)
    # block 0: every position's true input (f_s, e(x_{s+1})) for s = 0..L-2, causal
    e0, f0, p0 = emb(text[1:]), f[:-1], torch.arange(L - 1)
    blocks_e, blocks_f, blocks_p = [e0], [f0], [p0]
    drafts = torch.zeros(T, depth, dtype=torch.long)
    for d in range(1, depth + 1):
        E, Fe, P = torch.cat(blocks_e), torch.cat(blocks_f), torch.cat(blocks_p)
        out = drafter(E[None], Fe[None], P, chain_mask(L - 1, ts, d - 1))[0]
        pred = out[ts] if d == 1 else out[L - 1 + (d - 2) * T: L - 1 + (d - 1) * T]  # f^_{t+d}
        logits = F.linear(norm(pred), w)
        tok = logits.argmax(-1)
        tok = tok if cols is None else cols[tok]
        drafts[:, d - 1] = tok
        blocks_e.append(emb(tok))
        blocks_f.append(pred)
        blocks_p.append(ts + d)
    return drafts


@torch.no_grad()
def head_chain(heads_model, text: torch.Tensor, lo: int, depth: int, cols):
    """Drafts [T, depth]: head j+1's top-1 at t for token t+1+j (j = 1..depth), over ``cols``."""
    hl = heads_model(text[None], heads=True).head_logits[0]  # [L, h, V]
    T = len(text) - 1 - lo
    out = torch.zeros(T, depth, dtype=torch.long)
    for j in range(1, depth + 1):
        lg = hl[lo: lo + T, j].float()
        if cols is not None:
            out[:, j - 1] = cols[lg[:, cols].argmax(-1)]
        else:
            out[:, j - 1] = lg.argmax(-1)
    return out


def score(drafts: torch.Tensor, text: torch.Tensor, lo: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(correct per depth [depth], sum of leading-run lengths per chain length [depth], positions)
    for drafts of tokens t+2.. at t = lo.., where only positions whose tokens exist count."""
    T, depth = drafts.shape
    hits, runs, n = np.zeros(depth), np.zeros(depth), 0
    for i in range(T):
        t = lo + i
        if len(text) - (t + 2) < depth:
            continue  # near the end: not every depth has a reference token
        ok = (drafts[i] == text[t + 2: t + 2 + depth]).numpy()
        hits += ok
        run = 0
        for k in range(depth):
            if not ok[k]:
                break
            run += 1
        for k in range(depth):
            runs[k] += min(run, k + 1)
        n += 1
    return hits, runs, n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", default="data/heads-smollm2")
    ap.add_argument("--corpus", nargs="+", default=["data/smollm2-task-answers.txt.gz", "data/smollm2-own-answers.txt.gz",
                                                     "data/smollm2-own-text.txt.gz"])
    ap.add_argument("--train-tokens", type=int, default=1_200_000)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--ce-weight", type=float, default=0.5)
    ap.add_argument("--reg-weight", type=float, default=1.0)
    ap.add_argument("--ttt", action="store_true", help="train a second chain step on the drafter's own features (EAGLE-3)")
    ap.add_argument("--features-cache", default=None, help="a .pt file: the training windows' features, kept for the next run")
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--questions", default="../shared/benchmarks/spec-bench/question.jsonl")
    ap.add_argument("--sample", type=int, default=24)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(Path(__file__).with_name("probe_feature_drafter.json")))
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731

    hs = Session(a.heads, threads=a.threads)
    base = hs.model.base if hasattr(hs.model, "base") else hs.model
    base.eval()
    for p in base.parameters():
        p.requires_grad_(False)
    cols_train = torch.as_tensor(load_ranked(Path(a.heads), 8192))
    cols_eval = cols_train[:1024]

    t0 = time.time()
    windows = corpus_windows(hs.tokenizer, [Path(c) for c in a.corpus], a.seq_len, a.train_tokens, 0)
    cache = Path(a.features_cache) if a.features_cache else None
    if cache is not None and cache.is_file():
        feats = torch.load(cache)
        assert feats.shape[:2] == windows.shape, "features cache of other windows"
    else:
        feats = torch.empty(len(windows), a.seq_len, base.config.hidden_size, dtype=torch.bfloat16)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            for s in range(0, len(windows), 16):
                feats[s: s + 16] = last_states(base, windows[s: s + 16]).to(torch.bfloat16)
                if s % 800 == 0:
                    log(f"features {s}/{len(windows)} windows, {time.time() - t0:.0f} s")
        if cache is not None:
            torch.save(feats, cache)
    t_feat = time.time() - t0
    log(f"features of {windows.numel()} tokens in {t_feat:.0f} s")

    drafter = FeatureDrafter(base)
    t1 = time.time()
    hist = train(drafter, base, windows, feats, cols_train, a, log)
    t_train = time.time() - t1
    drafter.eval()

    idx, ids = prompt_ids(hs, Path(a.questions), None, True, a.sample, a.seed)
    refs, _ = hf_baselines.greedy(base, ids, a.max_new_tokens, hs.eos)
    res = {}
    for name, cols in (("1024", cols_eval), ("49152", None)):
        for who in ("eagle", "heads"):
            hits, runs, n = np.zeros(a.depth), np.zeros(a.depth), 0
            for p, r in zip(ids, refs):
                text = torch.as_tensor(np.concatenate([np.asarray(p), np.asarray(r)]), dtype=torch.long)
                lo = len(p) - 1
                if len(text) - lo < a.depth + 2:
                    continue
                d = (eagle_chain(drafter, base, text, lo, a.depth, cols) if who == "eagle"
                     else head_chain(hs.model, text, lo, a.depth, cols))
                h_, r_, n_ = score(d, text, lo)
                hits, runs, n = hits + h_, runs + r_, n + n_
            res[f"{who} over {name}"] = {"depth_top1": [round(x / n, 4) for x in hits],
                                         "chain_tokens_per_call": [round(1 + x / n, 3) for x in runs], "positions": n}
            log(f"{who} over {name}: {res[f'{who} over {name}']}")
    doc = {"machine": machine(), "args": vars(a), "train_tokens": int(windows.numel()), "feature_seconds": round(t_feat),
           "train_seconds": round(t_train), "drafter_parameters": sum(p.numel() for p in drafter.parameters()),
           "final_loss": hist[-1], "loss_log": hist[:: max(1, len(hist) // 40)], "results": res}
    write_atomic(Path(a.out), json.dumps(doc, indent=1) + "\n")
    print(f"{'drafter':<20} " + " ".join(f"depth {k + 1:>2}" for k in range(a.depth)) + "   "
          + " ".join(f"chain {k + 1}" for k in range(a.depth)))
    for k, v in res.items():
        print(f"{k:<20} " + " ".join(f"{x:8.3f}" for x in v["depth_top1"]) + "   "
              + " ".join(f"{x:7.2f}" for x in v["chain_tokens_per_call"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

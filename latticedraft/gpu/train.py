"""Training loops: a small causal LM from scratch (``train_lm``) and multi-token heads (``train_heads``).

Both share one loop (``run_training``): AdamW with β = (0.9, 0.95), ε = 1e-8, a cosine schedule
with linear warm-up over ``warmup_frac`` (1%) of the steps, gradient accumulation, gradient
clipping, a checkpoint every ``checkpoint_every`` steps (written atomically), exact ``resume``
(batch ``i`` depends only on the seed and ``i``), a tqdm bar with the loss of every head, and a
stop on a non-finite loss that keeps the last good checkpoint and says so.

Heads (Stern et al., Appendix C.1): loss ``Σ_h λ_h L_h`` where ``L_h`` is the mean cross-entropy of
head ``h`` predicting token ``t+h`` from position ``t``. By default the base model is frozen and
only heads 2..h learn. ``unfreeze=True`` trains the base too, with DynaMo's three learning rates:
``lr_base`` (LR_B) for the base's parameters, ``lr`` (LR_M) for the new heads, and ``lr_stem``
(LR_MB) for the gradient that heads 2..h send into the base: it is multiplied by
``lr_stem / lr_base`` wherever it enters a base parameter (the trunk state the heads read, the
shared output embedding, DynaMo's shared final norm), so the base's update is
``LR_B · (g_own + (LR_MB / LR_B) · g_heads)`` before Adam's normalisation.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from tqdm import tqdm

from latticedraft.errors import BuildError, InputError, ModelError
from latticedraft.gpu.data import TokenWindows, encode_files, progress_enabled
from latticedraft.gpu.heads import scale_grad

CHECKPOINT = "checkpoint.pt"


@dataclass
class OptimConfig:
    """Optimisation settings shared by LM and head training. ``steps`` counts optimizer updates;
    each update sees ``batch_size * grad_accum`` windows of ``seq_len`` tokens."""

    steps: int
    lr: float = 1e-3
    batch_size: int = 16
    seq_len: int = 256
    grad_accum: int = 1
    warmup_frac: float = 0.01
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    checkpoint_every: int = 100
    seed: int = 0

    def validate(self) -> None:
        if self.steps < 1:
            raise InputError(f"--steps {self.steps} must be at least 1")
        if self.batch_size < 1 or self.grad_accum < 1:
            raise InputError(f"--batch-size {self.batch_size} and --grad-accum {self.grad_accum} must be at least 1")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise InputError(f"--lr {self.lr} must be a positive number")
        if self.checkpoint_every < 1:
            raise InputError(f"--checkpoint-every {self.checkpoint_every} must be at least 1")


@dataclass
class TrainResult:
    """What a training run did. ``losses`` maps a loss name (``"loss"``, ``"h1"``, ``"h2"`` …) to its
    mean over the last 10% of steps (nats/token); ``history`` holds one dict per step."""

    out_dir: str
    steps: int
    tokens: int
    seconds: float
    resumed_from: int
    losses: dict[str, float]
    history: list[dict] = field(default_factory=list, repr=False)
    finished: bool = True  # False when ``stop_after`` ended the run early (only the checkpoint was written)


def cosine_lr_lambda(steps: int, warmup_frac: float) -> Callable[[int], float]:
    """Multiplier for step ``s``: linear warm-up over ``max(1, round(warmup_frac*steps))`` steps, cosine to 0."""
    warm = max(1, round(warmup_frac * steps))

    def f(s: int) -> float:
        if s < warm:
            return (s + 1) / warm
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (s - warm) / max(1, steps - warm))))

    return f


def _atomic_torch_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def run_training(
    module: torch.nn.Module,
    param_groups: list[dict],
    loss_fn: Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, float]]],
    windows: TokenWindows,
    cfg: OptimConfig,
    out_dir: Path,
    config_key: dict,
    resume: bool = False,
    desc: str = "train",
    device=None,
    stop_after: int | None = None,
) -> TrainResult:
    """The shared loop. ``loss_fn(batch int64[b, s]) -> (scalar loss, {name: float})``.

    ``module``'s trainable state (``requires_grad`` parameters) goes into the checkpoint
    ``out_dir/checkpoint.pt`` with the optimizer, the schedule and ``config_key``; resuming from a
    checkpoint whose ``config_key`` differs raises ``ModelError``. ``stop_after`` ends this run after
    that many steps with a checkpoint to ``resume`` from (time-sliced training on a shared machine).
    """
    cfg.validate()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = out_dir / CHECKPOINT
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(param_groups, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine_lr_lambda(cfg.steps, cfg.warmup_frac))
    start, history = 0, []
    if resume:
        if not ckpt_path.is_file():
            raise InputError(f"--resume given but {ckpt_path} does not exist; drop --resume to start afresh")
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        if ck["config_key"] != config_key:
            diff = sorted(k for k in set(ck["config_key"]) | set(config_key) if ck["config_key"].get(k) != config_key.get(k))
            raise ModelError(
                f"checkpoint {ckpt_path} was made with another configuration (differs in: {', '.join(diff)}); "
                "use the same settings as that run or drop --resume and choose another --out"
            )
        own = {n: p for n, p in module.named_parameters() if n in trainable}
        with torch.no_grad():
            for n, t in ck["trainable"].items():
                own[n].copy_(t)
        opt.load_state_dict(ck["optimizer"])
        sched.load_state_dict(ck["scheduler"])
        torch.set_rng_state(ck["rng"])
        start, history = int(ck["step"]), list(ck["history"])
        if start >= cfg.steps:
            raise InputError(f"checkpoint {ckpt_path} already finished all {cfg.steps} steps; nothing to resume")

    def save(step: int) -> None:
        state = {n: p.detach().cpu().clone() for n, p in module.named_parameters() if n in trainable}
        _atomic_torch_save(
            {"step": step, "trainable": state, "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
             "rng": torch.get_rng_state(), "config_key": config_key, "history": history},
            ckpt_path,
        )

    params = [p for g in param_groups for p in g["params"]]
    last_good = start if resume else None
    t0 = time.time()
    module.train()
    bar = tqdm(range(start, cfg.steps), desc=desc, unit="step", initial=start, total=cfg.steps,
               disable=not progress_enabled())
    for step in bar:
        sums: dict[str, float] = {}
        for micro in range(cfg.grad_accum):
            batch = torch.from_numpy(windows.batch(step * cfg.grad_accum + micro))
            if device is not None:
                batch = batch.to(device)
            loss, parts = loss_fn(batch)
            if not torch.isfinite(loss):
                bar.close()
                kept = (f"the last good checkpoint (step {last_good}) is kept in {ckpt_path}"
                        if last_good is not None else "no checkpoint had been written yet")
                raise BuildError(
                    f"training loss became {loss.item()} at step {step}; stopped, {kept}; "
                    "lower --lr or check the data, then --resume"
                )
            (loss / cfg.grad_accum).backward()
            for k, v in parts.items():
                sums[k] = sums.get(k, 0.0) + v / cfg.grad_accum
        if cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        history.append({"step": step + 1, **{k: round(v, 5) for k, v in sums.items()}})
        bar.set_postfix({k: f"{v:.3f}" for k, v in sums.items()}, refresh=False)
        stopping = stop_after is not None and step + 1 - start >= stop_after
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps or stopping:
            save(step + 1)
            last_good = step + 1
        if stopping:
            break
    bar.close()
    module.eval()
    tail = history[-max(1, len(history) // 10):]
    losses = {k: float(np.mean([h[k] for h in tail])) for k in tail[0] if k != "step"} if tail else {}
    done = history[-1]["step"] if history else start
    return TrainResult(
        out_dir=str(out_dir), steps=done, tokens=(done - start) * cfg.batch_size * cfg.grad_accum * cfg.seq_len,
        seconds=round(time.time() - t0, 1), resumed_from=start, losses=losses, history=history,
        finished=done == cfg.steps,
    )


def _check_resume(out_dir: str | Path, resume: bool) -> None:
    """Fail before any expensive work when ``--resume`` has nothing to resume from."""
    ck = Path(out_dir) / CHECKPOINT
    if resume and not ck.is_file():
        raise InputError(f"--resume given but {ck} does not exist; drop --resume to start afresh")


def _write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _finish_dir(out_dir: Path, write: Callable[[Path], None], keep_checkpoint: bool) -> None:
    """Write the final artefacts into a hidden staging dir, then move each file into ``out_dir``."""
    stage = out_dir / ".partial"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    write(stage)
    for f in sorted(stage.iterdir()):
        target = out_dir / f.name
        if target.is_dir():
            shutil.rmtree(target)
        os.replace(f, target)
    stage.rmdir()
    if not keep_checkpoint:
        (out_dir / CHECKPOINT).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# A causal LM from scratch


@dataclass
class LMArch:
    """GPT-2-style architecture: learned absolute positions, tied embeddings, no dropout."""

    n_embd: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_positions: int = 256


def _lm_loss(model, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    logits = model(input_ids=batch).logits[:, :-1].float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    return loss, {"loss": loss.item()}


def train_lm(
    tokenizer_path: str | Path,
    corpus: Sequence[Path],
    out_dir: str | Path,
    arch: LMArch,
    cfg: OptimConfig,
    resume: bool = False,
    save_dtype: str = "float32",
    keep_checkpoint: bool = False,
    device=None,
    encoding_errors: str = "strict",
    stop_after: int | None = None,
) -> TrainResult:
    """Train a GPT-2-style causal LM on ``corpus`` and save it (HF format + ``tokenizer.json`` +
    ``training.json``) into ``out_dir``, loadable by ``AutoModelForCausalLM.from_pretrained``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from latticedraft.gpu.hf import resolve_dtype
    from latticedraft.lm.tokenizer import fingerprint, load_tokenizer

    cfg.validate()
    _check_resume(out_dir, resume)
    if cfg.seq_len > arch.n_positions:
        raise InputError(f"--seq-len {cfg.seq_len} exceeds the model's context --n-positions {arch.n_positions}")
    if arch.n_embd % arch.n_head:
        raise InputError(f"--n-embd {arch.n_embd} is not divisible by --n-head {arch.n_head}")
    tok = load_tokenizer(tokenizer_path)
    tokens = encode_files(corpus, tok, encoding_errors)
    windows = TokenWindows(tokens, cfg.seq_len, cfg.batch_size, cfg.seed, source=f"the corpus ({len(corpus)} files)")
    vocab = tok.get_vocab_size(with_added_tokens=True)
    torch.manual_seed(cfg.seed)
    config = GPT2Config(
        vocab_size=vocab, n_positions=arch.n_positions, n_embd=arch.n_embd, n_layer=arch.n_layer, n_head=arch.n_head,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    if device is not None:
        model = model.to(device)
    key = {"kind": "lm", "arch": asdict(arch), "optim": {k: v for k, v in asdict(cfg).items() if k != "checkpoint_every"},
           "tokenizer": fingerprint(tok), "tokens": int(len(tokens))}
    out = Path(out_dir)
    res = run_training(model, [{"params": [p for p in model.parameters() if p.requires_grad]}],
                       lambda b: _lm_loss(model, b), windows, cfg, out, key, resume, desc="train lm", device=device,
                       stop_after=stop_after)
    if not res.finished:
        return res

    def write(stage: Path) -> None:
        model.to(resolve_dtype(save_dtype)).save_pretrained(stage)
        model.float()
        tok.save(str(stage / "tokenizer.json"))
        _write_json_atomic(stage / "training.json", {
            "arch": asdict(arch), "optim": asdict(cfg), "parameters": sum(p.numel() for p in model.parameters()),
            "corpus_files": len(corpus), "corpus_tokens": int(len(tokens)), "steps": res.steps, "tokens_seen": res.tokens,
            "seconds": res.seconds, "final_loss": res.losses, "resumed_from": res.resumed_from,
            "loss_every_10": [h["loss"] for h in res.history[::10]],
        })

    _finish_dir(out, write, keep_checkpoint)
    return res


# ---------------------------------------------------------------------------------------------
# Multi-token heads


def head_losses(bm, batch: torch.Tensor, frozen: bool = True, stem_grad_scale: float = 1.0) -> list[torch.Tensor]:
    """Mean cross-entropy of every head on ``batch`` (int64[b, s]): element ``j-1`` is head ``j`` predicting
    token ``t+j`` from position ``t`` (positions ``t < s - j``). Head 1's loss is the base model's own."""
    s = batch.shape[1]
    if bm.num_heads >= s:
        raise InputError(f"--heads {bm.num_heads} needs sequences longer than {bm.num_heads} tokens; --seq-len is {s}")
    with torch.set_grad_enabled(not frozen and torch.is_grad_enabled()):
        out = bm.base(input_ids=batch, output_hidden_states=True)
    feed = out.hidden_states[-2] if bm.kind == "dynamo" else out.hidden_states[-1]
    scale = 1.0 if frozen else stem_grad_scale
    feed = feed.detach() if frozen else scale_grad(feed, scale)
    if bm.kind == "dynamo":
        bm.heads.set_base_grad_scale(scale)
        try:
            states = bm.heads(feed)[0]  # [b, s, h-1, H]
        finally:
            bm.heads.set_base_grad_scale(1.0)
    else:
        states = bm.heads(feed)
    ce = torch.nn.functional.cross_entropy
    v = out.logits.shape[-1]
    losses = [ce(out.logits[:, :-1].float().reshape(-1, v), batch[:, 1:].reshape(-1))]
    for j in range(2, bm.num_heads + 1):
        logits = bm.unembed(states[:, : s - j, j - 2], grad_scale=scale).float()
        losses.append(ce(logits.reshape(-1, v), batch[:, j:].reshape(-1)))
    return losses


def train_heads(
    base_dir: str | Path,
    corpus: Sequence[Path],
    out_dir: str | Path,
    num_heads: int,
    kind: str,
    cfg: OptimConfig,
    lambdas: Sequence[float] | None = None,
    unfreeze: bool = False,
    lr_base: float = 1e-5,
    lr_stem: float = 1e-6,
    ffn_dim: int | None = None,
    tokenizer_path: str | Path | None = None,
    resume: bool = False,
    save_dtype: str = "float32",
    keep_checkpoint: bool = False,
    device=None,
    encoding_errors: str = "strict",
    stop_after: int | None = None,
) -> TrainResult:
    """Train heads 2..h of a ``BlockwiseModel`` on ``base_dir`` and save them into ``out_dir``.

    ``cfg.lr`` is LR_M (the new heads). With ``unfreeze`` the base trains too at ``lr_base`` (LR_B)
    and the heads' gradient into the trunk is scaled by ``lr_stem / lr_base`` (LR_MB); the
    updated base is then saved into ``out_dir/base``. ``lambdas`` weights the per-head losses
    (length ``num_heads``, default all 1). The config names ``base_dir`` relatively.
    """
    import hashlib

    from latticedraft.gpu.blockwise import BlockwiseModel, _check_num_heads
    from latticedraft.gpu.hf import check_tokenizer_fits, load_causal_lm, resolve_dtype
    from latticedraft.lm.tokenizer import fingerprint, load_tokenizer

    cfg.validate()
    _check_num_heads(num_heads)
    _check_resume(out_dir, resume)
    if num_heads >= cfg.seq_len:
        raise InputError(f"--heads {num_heads} must be smaller than --seq-len {cfg.seq_len} (each head needs a target token)")
    lambdas = [1.0] * num_heads if lambdas is None else [float(x) for x in lambdas]
    if len(lambdas) != num_heads or any(not (x >= 0) for x in lambdas):
        raise InputError(f"--lambdas needs {num_heads} non-negative weights (one per head), got {lambdas}")
    base_dir = Path(base_dir)
    base = load_causal_lm(base_dir, device=device)
    n_pos = getattr(base.config, "max_position_embeddings", None) or getattr(base.config, "n_positions", None)
    if n_pos is not None and cfg.seq_len > int(n_pos):
        raise InputError(f"--seq-len {cfg.seq_len} exceeds the base model's context of {n_pos} tokens")
    tok_path = Path(tokenizer_path) if tokenizer_path else base_dir / "tokenizer.json"
    tok = load_tokenizer(tok_path)
    check_tokenizer_fits(tok, base, where=f"the base model in {base_dir}")
    tokens = encode_files(corpus, tok, encoding_errors)
    windows = TokenWindows(tokens, cfg.seq_len, cfg.batch_size, cfg.seed, source=f"the corpus ({len(corpus)} files)")
    bm = BlockwiseModel.from_base(base, num_heads, kind, seed=cfg.seed, ffn_dim=ffn_dim)
    for p in bm.base.parameters():
        p.requires_grad_(unfreeze)
    head_params = bm.head_parameters()
    groups = [{"params": head_params, "lr": cfg.lr}]
    if unfreeze:
        ids = {id(p) for p in head_params}
        groups.append({"params": [p for p in bm.base.parameters() if id(p) not in ids], "lr": lr_base})
    with open(base_dir / "config.json", "rb") as f:
        base_id = hashlib.sha256(f.read()).hexdigest()[:16]
    key = {"kind": kind, "num_heads": num_heads, "ffn_dim": ffn_dim, "lambdas": lambdas, "unfreeze": unfreeze,
           "lr_base": lr_base if unfreeze else None, "lr_stem": lr_stem if unfreeze else None, "base_config": base_id,
           "tokenizer": fingerprint(tok), "tokens": int(len(tokens)),
           "optim": {k: v for k, v in asdict(cfg).items() if k != "checkpoint_every"}}
    scale = lr_stem / lr_base if unfreeze else 1.0

    def loss_fn(batch):
        if not unfreeze:
            bm.base.eval()
        losses = head_losses(bm, batch, frozen=not unfreeze, stem_grad_scale=scale)
        total = sum(lam * l for lam, l in zip(lambdas, losses))
        return total, {f"h{j + 1}": l.item() for j, l in enumerate(losses)}

    out = Path(out_dir)
    res = run_training(bm, groups, loss_fn, windows, cfg, out, key, resume, desc=f"train {kind} heads", device=device,
                       stop_after=stop_after)
    if not res.finished:
        return res

    def write(stage: Path) -> None:
        bm.heads.to(resolve_dtype(save_dtype))
        if unfreeze:
            bm.base.to(resolve_dtype(save_dtype))
            bm.save_pretrained(stage, bundle_base=True)
            tok.save(str(stage / "base" / "tokenizer.json"))
        else:
            bm.save_pretrained(stage, base_ref=os.path.relpath(base_dir.resolve(), out.resolve()))
        bm.float()
        _write_json_atomic(stage / "training.json", {
            "kind": kind, "num_heads": num_heads, "lambdas": lambdas, "unfreeze": unfreeze,
            "lr_heads": cfg.lr, "lr_base": lr_base if unfreeze else None, "lr_stem": lr_stem if unfreeze else None,
            "optim": asdict(cfg), "head_parameters": sum(p.numel() for p in head_params),
            "corpus_files": len(corpus), "corpus_tokens": int(len(tokens)), "steps": res.steps, "tokens_seen": res.tokens,
            "seconds": res.seconds, "final_loss": res.losses, "resumed_from": res.resumed_from,
        })

    _finish_dir(out, write, keep_checkpoint)
    return res

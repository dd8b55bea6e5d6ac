"""The training loop shared by ``train_lm`` and ``train_heads``.

AdamW with β = (0.9, 0.95), ε = 1e-8, a cosine schedule with linear warm-up over
``warmup_frac`` (1%) of the steps, gradient accumulation, gradient clipping, a checkpoint every
``checkpoint_every`` steps (written atomically), exact ``resume`` (batch ``i`` depends only on the
seed and ``i``), a tqdm bar with every loss term, and a stop on a non-finite loss that keeps
the last good checkpoint and says so. An interrupt (Ctrl-C) names the checkpoint it keeps.

Where a command may write (and what ``--force`` / ``--resume`` mean there) is ``outputs.py``'s
rule: each ``train_*`` function calls ``outputs.claim_dir`` before any work and ``finish_dir`` at the end.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from latticedraft import interrupts, outputs
from latticedraft.atomic import atomic_file, write_atomic
from latticedraft.errors import BuildError, InputError, ModelError
from latticedraft.gpu.train.data import TokenWindows, progress_enabled

CHECKPOINT = outputs.CHECKPOINT
MAX_SEED = 2**63 - 1  # torch.manual_seed takes 64-bit seeds; numpy's take any non-negative integer


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
    autocast: str | None = None  # "bfloat16": each forward and loss under torch.autocast; weights stay float32

    def validate(self) -> None:
        if self.steps < 1:
            raise InputError(f"--steps {self.steps} must be at least 1")
        if self.batch_size < 1 or self.grad_accum < 1:
            raise InputError(f"--batch-size {self.batch_size} and --grad-accum {self.grad_accum} must be at least 1")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise InputError(f"--lr {self.lr} must be a positive number")
        if self.checkpoint_every < 1:
            raise InputError(f"--checkpoint-every {self.checkpoint_every} must be at least 1")
        if not 0 <= self.seed <= MAX_SEED:
            raise InputError(f"--seed {self.seed} is outside 0..{MAX_SEED} (it seeds torch and numpy generators)")
        if self.seq_len < 2:
            raise InputError(f"--seq-len {self.seq_len} must be at least 2 (a window predicts its next tokens)")
        if not (math.isfinite(self.warmup_frac) and 0.0 <= self.warmup_frac <= 1.0):
            raise InputError(f"--warmup-frac {self.warmup_frac} must lie in [0, 1] (a fraction of --steps)")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise InputError(f"--weight-decay {self.weight_decay} must be a finite number >= 0")
        if self.autocast not in (None, "bfloat16"):
            raise InputError(f"--autocast {self.autocast}: use bfloat16 (or leave it out for float32)")

    def key(self) -> dict:
        """The settings a checkpoint must share to be resumed (not ``checkpoint_every``; ``autocast``
        only where set, so float32 runs keep the keys they had)."""
        return {k: v for k, v in asdict(self).items()
                if k != "checkpoint_every" and not (k == "autocast" and v is None)}


@dataclass
class TrainResult:
    """What a training run did. ``tokens`` and ``seconds``: over every slice of a resumed run
    (``resumed_from``: the step this slice started at). ``losses`` maps a loss name (``"loss"``,
    ``"h1"``, ``"h2"`` …) to its mean over the last 10% of steps (nats/token); ``history`` holds
    one dict per step."""

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
    with atomic_file(path) as tmp:
        torch.save(obj, tmp)


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
    Without ``resume`` an existing checkpoint is removed first (the caller's ``outputs.claim_dir``
    allowed that only under ``--force``); a directory this call made is removed again when the run
    fails before writing anything into it. Resuming a checkpoint of the last step trains no more steps and
    returns a finished result, so an interrupted ``finish_dir`` completes on ``--resume``.
    """
    cfg.validate()
    out_dir = Path(out_dir)
    made = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        return _run(module, param_groups, loss_fn, windows, cfg, out_dir, config_key, resume, desc, device, stop_after)
    except BaseException:
        if made and not any(out_dir.iterdir()):  # a run that failed before its first checkpoint leaves no directory
            out_dir.rmdir()
        raise


@dataclass
class _Run:
    """One slice of a training run: the module and the names of its trainable parameters, the optimizer
    and schedule, the checkpoint path and key; ``start``: the step this slice began at; ``history``:
    one dict per step; ``before``: seconds the earlier slices trained; ``t0``: when this slice began;
    ``last_good``: the last step checkpointed (None: none yet)."""

    module: torch.nn.Module
    trainable: set
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    ckpt_path: Path
    config_key: dict
    start: int = 0
    history: list = field(default_factory=list)
    before: float = 0.0
    t0: float = 0.0
    last_good: int | None = None

    def resume(self) -> None:
        """Load the checkpoint into the module, optimizer, schedule and RNG; refuses a missing one
        and one made with another ``config_key`` (``ModelError`` naming the differences)."""
        if not self.ckpt_path.is_file():
            raise InputError(f"--resume given but {self.ckpt_path} does not exist; drop --resume to start afresh")
        ck = torch.load(self.ckpt_path, map_location="cpu", weights_only=False)
        if ck["config_key"] != self.config_key:
            from latticedraft.gpu.train.key_diff import differences

            raise ModelError(
                f"checkpoint {self.ckpt_path} was made with other settings: "
                f"{'; '.join(differences(ck['config_key'], self.config_key))}; rerun with the checkpoint's settings, "
                "or drop --resume and pass --force (discarding the checkpoint) or choose another --out"
            )
        own = {n: p for n, p in self.module.named_parameters() if n in self.trainable}
        with torch.no_grad():
            for n, t in ck["trainable"].items():
                own[n].copy_(t)
        self.opt.load_state_dict(ck["optimizer"])
        self.sched.load_state_dict(ck["scheduler"])
        torch.set_rng_state(ck["rng"])
        self.start, self.history, self.before = int(ck["step"]), list(ck["history"]), float(ck.get("seconds", 0.0))
        self.last_good = self.start

    def save(self, step: int) -> None:
        """Checkpoint after ``step`` steps (atomically)."""
        state = {n: p.detach().cpu().clone() for n, p in self.module.named_parameters() if n in self.trainable}
        _atomic_torch_save(
            {"step": step, "trainable": state, "optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict(),
             "rng": torch.get_rng_state(), "config_key": self.config_key, "history": self.history,
             "seconds": self.before + time.time() - self.t0},
            self.ckpt_path,
        )
        self.last_good = step

    def kept(self, cfg: OptimConfig) -> str:
        """What an interrupt leaves and how to continue."""
        if self.last_good is None:
            return (f"no checkpoint had been written yet (the first comes at step {min(cfg.checkpoint_every, cfg.steps)}); "
                    f"rerun the command to start again")
        return (f"the checkpoint of step {self.last_good} of {cfg.steps} is kept in {self.ckpt_path}; rerun the same "
                "command with --resume to continue")

    def result(self, out_dir: Path, cfg: OptimConfig) -> TrainResult:
        """The ``TrainResult`` of the slice (losses: means over the last 10% of steps)."""
        history = self.history
        tail = history[-max(1, len(history) // 10):]
        losses = {k: float(np.mean([h[k] for h in tail])) for k in tail[0] if k != "step"} if tail else {}
        done = history[-1]["step"] if history else self.start
        return TrainResult(
            out_dir=str(out_dir), steps=done, tokens=done * cfg.batch_size * cfg.grad_accum * cfg.seq_len,
            seconds=round(self.before + time.time() - self.t0, 1), resumed_from=self.start, losses=losses,
            history=history, finished=done == cfg.steps,
        )


def _accumulate(run: _Run, step: int, loss_fn, windows: TokenWindows, cfg: OptimConfig, device, bar) -> dict[str, float]:
    """The gradients of step ``step`` over its ``grad_accum`` micro-batches; returns each loss term's
    mean. A non-finite loss closes the bar and raises ``BuildError`` naming the last good checkpoint."""
    sums: dict[str, float] = {}
    for micro in range(cfg.grad_accum):
        batch = torch.from_numpy(windows.batch(step * cfg.grad_accum + micro))
        if device is not None:
            batch = batch.to(device)
        with torch.autocast(batch.device.type, dtype=torch.bfloat16, enabled=cfg.autocast is not None):
            loss, parts = loss_fn(batch)
        if not torch.isfinite(loss):
            bar.close()
            good = (f"the last good checkpoint (step {run.last_good}) is kept in {run.ckpt_path}"
                    if run.last_good is not None else "no checkpoint had been written yet")
            raise BuildError(
                f"training loss became {loss.item()} at step {step}; stopped, {good}; "
                "lower --lr or check the data, then --resume"
            )
        (loss / cfg.grad_accum).backward()
        for k, v in parts.items():
            sums[k] = sums.get(k, 0.0) + v / cfg.grad_accum
    return sums


def _run(module, param_groups, loss_fn, windows, cfg: OptimConfig, out_dir: Path, config_key: dict, resume: bool,
         desc: str, device, stop_after: int | None) -> TrainResult:
    """``run_training`` once its directory exists: resume or start, then the steps, checkpointing
    every ``checkpoint_every``, at the last step and where ``stop_after`` ends the slice."""
    opt = torch.optim.AdamW(param_groups, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    run = _Run(module, {n for n, p in module.named_parameters() if p.requires_grad}, opt,
               torch.optim.lr_scheduler.LambdaLR(opt, cosine_lr_lambda(cfg.steps, cfg.warmup_frac)),
               out_dir / CHECKPOINT, config_key)
    if resume:
        run.resume()
    else:
        run.ckpt_path.unlink(missing_ok=True)  # allowed by outputs.claim_dir (--force) or absent
    params = [p for g in param_groups for p in g["params"]]
    run.t0 = time.time()
    module.train()
    bar = tqdm(range(run.start, cfg.steps), desc=desc, unit="step", initial=run.start, total=cfg.steps,
               disable=not progress_enabled())
    with interrupts.keeping(lambda: run.kept(cfg)):
        for step in bar:
            sums = _accumulate(run, step, loss_fn, windows, cfg, device, bar)
            if cfg.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            run.sched.step()
            opt.zero_grad(set_to_none=True)
            run.history.append({"step": step + 1, **{k: round(v, 5) for k, v in sums.items()}})
            bar.set_postfix({k: f"{v:.3f}" for k, v in sums.items()}, refresh=False)
            stopping = stop_after is not None and step + 1 - run.start >= stop_after
            if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps or stopping:
                run.save(step + 1)
            if stopping:
                break
    bar.close()
    module.eval()
    return run.result(out_dir, cfg)


def load_base(base_dir, seq_len: int, tokenizer_path=None, device=None):
    """The frozen-to-be base of a training run and its tokenizer: ``(base, tokenizer, tokenizer path)``,
    checked by ``check_base``."""
    from latticedraft.gpu.models.hf import load_causal_lm

    base = load_causal_lm(Path(base_dir), device=device)
    return (base, *check_base(base, base_dir, seq_len, tokenizer_path))


def base_config_id(base_dir: Path) -> str:
    """The first 16 hex digits of the sha256 of ``base_dir/config.json``: the base in a checkpoint's key."""
    import hashlib

    with open(Path(base_dir) / "config.json", "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def check_base(base, base_dir, seq_len: int, tokenizer_path=None, position_limit: int | None = None):
    """Refuse ``seq_len`` beyond the base's context (``position_limit``, default its config's) and a
    tokenizer (default ``BASE/tokenizer.json``) with ids beyond the base's vocabulary, in one line;
    returns ``(tokenizer, tokenizer path)``."""
    from latticedraft.gpu.models.hf import check_tokenizer_fits
    from latticedraft.lm.tokenizer import load_tokenizer

    base_dir = Path(base_dir)
    n_pos = position_limit or getattr(base.config, "max_position_embeddings", None) or getattr(
        base.config, "n_positions", None)
    if n_pos is not None and seq_len > int(n_pos):
        raise InputError(f"--seq-len {seq_len} exceeds the base model's context of {n_pos} tokens")
    tok_path = Path(tokenizer_path) if tokenizer_path else base_dir / "tokenizer.json"
    tok = load_tokenizer(tok_path)
    check_tokenizer_fits(tok, base, where=f"the base model in {base_dir}")
    return tok, tok_path


def write_json_atomic(path: Path, obj) -> None:
    write_atomic(path, json.dumps(obj, indent=1) + "\n")


def finish_dir(out_dir: Path, write: Callable[[Path], None], keep_checkpoint: bool,
               kind: outputs.OutputKind) -> None:
    """Write the final artefacts into a hidden staging dir, then move each into ``out_dir``, and
    remove what an earlier output of ``kind`` had there that this one no longer writes (a forced
    replacement; other files stay). An interrupt here keeps the last step's checkpoint, from
    which ``--resume`` writes the output without training again."""
    stage = out_dir / outputs.STAGING
    note = (f"training finished and its checkpoint is kept in {out_dir / CHECKPOINT}; rerun the same command "
            "with --resume to write the output")
    with interrupts.keeping(lambda: note):
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir(parents=True)
        try:
            write(stage)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        written = {f.name for f in stage.iterdir()}
        for f in sorted(stage.iterdir()):
            target = out_dir / f.name
            if target.is_dir():
                shutil.rmtree(target)
            os.replace(f, target)
        stage.rmdir()
        outputs.remove_stale(out_dir, kind, written)
    if not keep_checkpoint:
        (out_dir / CHECKPOINT).unlink(missing_ok=True)

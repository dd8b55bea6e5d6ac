"""Distillation of self-drafting modules from a frozen base, on the shared loop (``gpu/train/loop.py``):

- ``train_adapter``: Kangaroo's adapter (``gpu/models/adapter.py``) on the states after layer l, loss the
  cross-entropy from the full model's next-token distribution to the adapter's (Kangaroo's
  distillation objective), nats/token; also reported: ``top1``, the fraction of positions
  where the adapter's argmax equals the full model's;
- ``train_exit_heads``: PPD's per-layer early-exit heads (``gpu/models/exit_heads.py``), the same loss
  summed over layers 1..d-1 (``l1``, ``l2`` … in the progress bar and JSON).

Same progress bar, checkpoints, ``--resume`` and ``training.json`` as ``train heads``.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import torch

from latticedraft.gpu.train.data import TokenWindows, encode_files
from latticedraft.gpu.models.layer_split import LayerSplit
from latticedraft.gpu.train.loop import (OptimConfig, TrainResult, base_config_id, finish_dir, run_training,
                                         write_json_atomic)
from latticedraft.outputs import ADAPTER, EXIT_HEADS, OutputKind, claim_dir


def soft_ce(student: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """Mean over positions of -sum_v p_teacher(v) log p_student(v); both [..., V]."""
    return -(teacher_logp.exp() * torch.log_softmax(student.float(), dim=-1)).sum(-1).mean()


def _teacher(split: LayerSplit, batch: torch.Tensor):
    with torch.no_grad():
        split.lm.eval()
        out = split.lm(input_ids=batch, attention_mask=torch.ones_like(batch), output_hidden_states=True)
    return out, torch.log_softmax(out.logits.float(), dim=-1)


def adapter_loss(split: LayerSplit, adapter, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    out, tlogp = _teacher(split, batch)
    h = out.hidden_states[adapter.exit_layer]
    b, s = batch.shape
    pos = torch.arange(s, device=batch.device)[None].expand(b, s)
    ones = torch.ones(b, s, dtype=torch.bool, device=batch.device)
    bias = split.bias(ones[:, :0], pos[:, :0], pos, torch.ones(s, s, dtype=torch.bool, device=batch.device).tril()[None]
                      .expand(b, s, s))
    logits = split.head(adapter(h, bias, split.rotary_for(h, pos), None))
    loss = soft_ce(logits, tlogp)
    top1 = (logits.argmax(-1) == tlogp.argmax(-1)).float().mean().item()
    return loss, {"loss": loss.item(), "top1": top1}


def exit_heads_loss(split: LayerSplit, heads, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    out, tlogp = _teacher(split, batch)
    losses = [soft_ce(heads(out.hidden_states[j], j), tlogp) for j in range(1, split.num_layers)]
    return sum(losses), {f"l{j}": x.item() for j, x in enumerate(losses, start=1)}


def _setup(base_dir, corpus, cfg: OptimConfig, tokenizer_path, device, encoding_errors, out_dir, resume,
           out_kind: OutputKind, force: bool):
    from latticedraft.gpu.models.hf import load_causal_lm
    from latticedraft.gpu.train.loop import check_base
    from latticedraft.lm.tokenizer import fingerprint

    cfg.validate()
    claim_dir(out_dir, out_kind, force=force, resume=resume, inputs={"--base": base_dir, "--tokenizer": tokenizer_path})
    base_dir = Path(base_dir)
    base = load_causal_lm(base_dir, device=device)
    split = LayerSplit(base)  # refuses encoder-decoders and attention without 4-D masks, in one line
    tok, _ = check_base(base, base_dir, cfg.seq_len, tokenizer_path, split.position_limit)
    tokens = encode_files(corpus, tok, encoding_errors)
    windows = TokenWindows(tokens, cfg.seq_len, cfg.batch_size, cfg.seed, source=f"the corpus ({len(corpus)} files)")
    for p in base.parameters():
        p.requires_grad_(False)
    key = {"base_config": base_config_id(base_dir), "tokenizer": fingerprint(tok), "tokens": int(len(tokens)),
           "optim": cfg.key()}
    return split, windows, key, len(tokens)


def _train(module, loss_fn, kind, split, windows, key, n_tokens, corpus, cfg, out_dir, resume, save, save_dtype,
           keep_checkpoint, device, stop_after, desc, out_kind: OutputKind) -> TrainResult:
    from latticedraft.gpu.models.hf import resolve_dtype

    torch.manual_seed(cfg.seed)
    params = [p for p in module.parameters() if p.requires_grad]
    out = Path(out_dir)
    res = run_training(module, [{"params": params, "lr": cfg.lr}], loss_fn, windows, cfg, out, {"kind": kind, **key},
                       resume, desc=desc, device=device, stop_after=stop_after)
    if not res.finished:
        return res
    report = {"kind": kind, "optim": asdict(cfg), "parameters": sum(p.numel() for p in params),
              "corpus_files": len(corpus), "corpus_tokens": n_tokens, "steps": res.steps, "tokens_seen": res.tokens,
              "seconds": res.seconds, "final_loss": res.losses, "resumed_from": res.resumed_from}

    def write(stage: Path) -> None:
        module.to(resolve_dtype(save_dtype))
        save(stage, report)
        module.float()
        write_json_atomic(stage / "training.json", report)

    finish_dir(out, write, keep_checkpoint, out_kind)
    return res


def train_adapter(base_dir, corpus: Sequence[Path], out_dir, exit_layer: int, cfg: OptimConfig,
                  tokenizer_path=None, resume: bool = False, save_dtype: str = "float32", keep_checkpoint: bool = False,
                  device=None, encoding_errors: str = "strict", stop_after: int | None = None,
                  force: bool = False) -> TrainResult:
    """Train Kangaroo's adapter on the first ``exit_layer`` layers of the base in ``base_dir``; save it into ``out_dir``."""
    from latticedraft.gpu.models.adapter import KangarooAdapter, save_adapter

    split, windows, key, n = _setup(base_dir, corpus, cfg, tokenizer_path, device, encoding_errors, out_dir, resume,
                                    ADAPTER, force)
    adapter = KangarooAdapter(split, exit_layer).to(split.device)
    return _train(adapter, lambda b: adapter_loss(split, adapter, b), "kangaroo-adapter", split, windows,
                  {**key, "exit_layer": exit_layer}, n, corpus, cfg, out_dir, resume,
                  lambda stage, rep: save_adapter(adapter, split, stage, {"training": rep["final_loss"]}),
                  save_dtype, keep_checkpoint, device, stop_after, desc=f"train adapter l={exit_layer}", out_kind=ADAPTER)


def train_exit_heads(base_dir, corpus: Sequence[Path], out_dir, cfg: OptimConfig, tokenizer_path=None,
                     resume: bool = False, save_dtype: str = "float32", keep_checkpoint: bool = False, device=None,
                     encoding_errors: str = "strict", stop_after: int | None = None,
                     force: bool = False) -> TrainResult:
    """Train PPD's early-exit heads for layers 1..d-1 of the base in ``base_dir``; save them into ``out_dir``."""
    from latticedraft.gpu.models.exit_heads import ExitHeads, save_exit_heads

    split, windows, key, n = _setup(base_dir, corpus, cfg, tokenizer_path, device, encoding_errors, out_dir, resume,
                                    EXIT_HEADS, force)
    heads = ExitHeads(split).to(split.device)
    return _train(heads, lambda b: exit_heads_loss(split, heads, b), "early-exit-heads", split, windows, key, n, corpus,
                  cfg, out_dir, resume, lambda stage, rep: save_exit_heads(heads, split, stage, {"training": rep["final_loss"]}),
                  save_dtype, keep_checkpoint, device, stop_after, desc="train early-exit heads", out_kind=EXIT_HEADS)

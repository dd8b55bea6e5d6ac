"""Training multi-token heads on a base causal LM (``train_heads``).

Runs the loop in ``loop.py`` (AdamW β = (0.9, 0.95), ε = 1e-8, cosine schedule with 1% warm-up,
gradient accumulation, atomic checkpoints, exact ``--resume``, a stop on NaN).

Heads (Stern et al., Appendix C.1): loss ``Σ_h λ_h L_h`` where ``L_h`` is the mean cross-entropy of
head ``h`` predicting token ``t+h`` from position ``t``. By default the base model is frozen and
only heads 2..h learn. ``unfreeze=True`` trains the base too, with DynaMo's three learning rates:
``lr_base`` (LR_B) for the base's parameters, ``lr`` (LR_M) for the new heads, and ``lr_stem``
(LR_MB) for the gradient that heads 2..h send into the base: it is multiplied by
``lr_stem / lr_base`` wherever it enters a base parameter (the trunk state the heads read, the
shared output embedding, DynaMo's shared final norm), so the base's update is
``LR_B · (g_own + (LR_MB / LR_B) · g_heads)`` before Adam's normalisation.

Self-distillation (``distill``, ``distill.py``): the text is the base's own continuations of
corpus prompts and/or the loss of head j is the KL divergence to the frozen base's distribution of
token t+j; with ``unfreeze`` a frozen copy of the base made before training is the teacher.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch

from latticedraft.errors import InputError
from latticedraft.outputs import HEADS, claim_dir
from latticedraft.gpu.models.heads import scale_grad
from latticedraft.gpu.train.data import quiet_hf_progress
from latticedraft.gpu.train.distill import DistillConfig, Teacher, frozen_copy, training_text
from latticedraft.gpu.train.loop import (
    OptimConfig,
    TrainResult,
    base_config_id,
    finish_dir,
    load_base,
    run_training,
    write_json_atomic,
)


def head_states(bm, batch: torch.Tensor, frozen: bool = True, stem_grad_scale: float = 1.0):
    """The base's forward on ``batch`` (int64[b, s]) and the extra heads' states ``[b, s, h-1, H]``.

    Frozen: the base runs without gradient and the heads read a detached trunk; else the heads'
    gradient reaches the trunk scaled by ``stem_grad_scale`` (LR_MB / LR_B). Token-input heads
    read the text's own token after each position (teacher forcing; decoding feeds the token the
    step emitted, which on sampled text is not the argmax), the base's greedy token after the
    last position (which has no target). Returns ``(base output, states, scale)``."""
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
            states = bm.heads(feed)[0]
        finally:
            bm.heads.set_base_grad_scale(1.0)
    elif bm.token_input:
        states = bm.heads(feed, next_tokens=torch.cat([batch[:, 1:], out.logits[:, -1:].argmax(-1)], dim=1))
    else:
        states = bm.heads(feed)
    return out, states, scale


def head_logits(bm, states: torch.Tensor, j: int, length: int, scale: float,
                columns: torch.Tensor | None = None) -> torch.Tensor:
    """Head j's logits ``[b, length, V]`` at the first ``length`` positions of ``states`` (its own LM
    head for Medusa heads, the base's output embedding otherwise; ``[b, length, V']`` over the token
    ids ``columns`` int64[V'] when given, whose gathered weights get no gradient). The positions go in as one
    contiguous ``[b * length, 1, H]`` block: a strided view makes ``linear`` a batched product of
    ``b * length`` single rows, each reading the whole ``V x H`` weight (about 10x slower on a CPU,
    and the bulk of a training step on a GPU)."""
    x = states[:, :length, j - 2].reshape(-1, 1, states.shape[-1]).contiguous()
    return bm.project_heads(x, first=j - 2, columns=columns, grad_scale=scale).view(states.shape[0], length, -1)


def head_losses(bm, batch: torch.Tensor, frozen: bool = True, stem_grad_scale: float = 1.0,
                draft_vocab: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Mean cross-entropy of every head on ``batch`` (int64[b, s]): element ``j-1`` is head ``j`` predicting
    token ``t+j`` from position ``t`` (positions ``t < s - j``). Head 1's loss is the base model's own.

    ``draft_vocab`` (int64[V'] token ids; frozen base only): heads 2..h are scored over those V'
    tokens only (FR-Spec's draft vocabulary), and targets outside them are left out of their mean."""
    s = batch.shape[1]
    out, states, scale = head_states(bm, batch, frozen, stem_grad_scale)
    ce = torch.nn.functional.cross_entropy
    v = out.logits.shape[-1]
    losses = [ce(out.logits[:, :-1].float().reshape(-1, v), batch[:, 1:].reshape(-1))]
    targets = batch
    if draft_vocab is not None:
        if not frozen:
            raise InputError("a draft vocabulary trains heads on a frozen base (its weights are gathered once)")
        remap = torch.full((v,), -100, dtype=torch.long, device=batch.device)
        remap[draft_vocab.to(batch.device)] = torch.arange(len(draft_vocab), device=batch.device)
        targets = remap[batch]
    for j in range(2, bm.num_heads + 1):
        logits = head_logits(bm, states, j, s - j, scale, draft_vocab).float()
        target = targets[:, j:].reshape(-1)
        # a mean over the targets inside the draft vocabulary (0, not NaN, where a window has none)
        total = ce(logits.reshape(-1, logits.shape[-1]), target, reduction="sum")
        losses.append(total / (target >= 0).sum().clamp(min=1))
    return losses


def head_kl_losses(bm, batch: torch.Tensor, teacher_logits: torch.Tensor | None = None, frozen: bool = True,
                   stem_grad_scale: float = 1.0) -> tuple[list[torch.Tensor], list[float]]:
    """Per head j = 1..h (list index j-1): ``KL(p_base(. | x_{<=t+j-1}) || p_head_j(. | x_{<=t}))`` over
    positions t < s - j + 1 of ``batch`` (int64[b, s]), and head j's top-1 agreement with the base there.

    ``teacher_logits`` [b, s, V]: the frozen base's logits on ``batch`` (None: the base's own
    logits of this forward, which is the teacher when the base is frozen). Head 1 is the base:
    its KL is 0 when frozen (a constant, no gradient), else the drift of the training base from
    the teacher. Gradients reach the trunk as in ``head_losses``."""
    s = batch.shape[1]
    if teacher_logits is None and not frozen:
        raise InputError("an unfrozen base needs a separate frozen teacher for the KL loss")
    out, states, scale = head_states(bm, batch, frozen, stem_grad_scale)
    teacher = Teacher(out.logits if teacher_logits is None else teacher_logits)
    if frozen:
        losses, agree = [out.logits.new_zeros(())], [1.0]
    else:
        losses, agree = [teacher.kl(out.logits, 0, s)], [teacher.agreement(out.logits, 0, s)]
    for j in range(2, bm.num_heads + 1):
        logits = head_logits(bm, states, j, s - j, scale)
        losses.append(teacher.kl(logits, j - 1, s - 1))
        agree.append(teacher.agreement(logits, j - 1, s - 1))
    return losses, agree


def check_head_options(num_heads: int, seq_len: int, lambdas: Sequence[float] | None) -> list[float]:
    """``--heads`` in [2, ``seq_len`` - 1] (head h predicts token t+h inside a window) and one
    non-negative finite ``--lambdas`` weight per head; returns the weights (default all 1)."""
    from latticedraft.gpu.models.blockwise import _check_num_heads

    _check_num_heads(num_heads)
    if num_heads >= seq_len:
        raise InputError(f"--heads {num_heads} must be smaller than --seq-len {seq_len} (each head needs a target "
                         f"token in the window); use --heads 2..{seq_len - 1} or a longer --seq-len")
    weights = [1.0] * num_heads if lambdas is None else [float(x) for x in lambdas]
    if len(weights) != num_heads or any(not (0 <= x < float("inf")) for x in weights):
        raise InputError(f"--lambdas needs {num_heads} finite non-negative weights (one per head), got "
                         f"{' '.join(f'{x:g}' for x in weights)}")
    return weights


def check_draft_vocab(size: int | None, kind: str, medusa_lm_head: str, unfreeze: bool,
                      distill: DistillConfig | None) -> None:
    """``--draft-vocab`` trains through the frozen output embedding with the hard-label loss."""
    if size is None:
        return
    if size < 1:
        raise InputError(f"--draft-vocab {size}: give the number of most frequent tokens the heads learn (>= 1)")
    if unfreeze or (kind == "medusa" and medusa_lm_head == "heads"):
        raise InputError("--draft-vocab trains heads that project through the frozen base's output embedding; drop "
                         "--unfreeze, and give Medusa heads --medusa-lm-head tied")
    if distill is not None and distill.loss == "kl":
        raise InputError("--draft-vocab trains on the text's own tokens; add --distill-loss hard (the KL loss needs "
                         "the whole vocabulary)")


@dataclass
class _HeadsSpec:
    """What ``train_heads`` trains beside the optimiser settings (its arguments; ``lambdas`` checked)."""

    kind: str
    num_heads: int
    lambdas: list[float]
    unfreeze: bool
    lr_base: float
    lr_stem: float
    ffn_dim: int | None
    medusa_layers: int
    medusa_lm_head: str
    distill: DistillConfig | None
    token_input: bool
    draft_vocab: int | None

    @property
    def medusa(self) -> dict:
        """The Medusa settings (empty for other kinds)."""
        if self.kind != "medusa":
            return {}
        return {"medusa_layers": self.medusa_layers, "medusa_lm_head": self.medusa_lm_head}

    @property
    def kl(self) -> bool:
        return self.distill is not None and self.distill.loss == "kl"

    def key(self, cfg: OptimConfig, base_id: str, tokenizer: str, tokens: int) -> dict:
        """The checkpoint's ``config_key``: what a resumed run must share."""
        key = {"kind": self.kind, "num_heads": self.num_heads, "ffn_dim": self.ffn_dim, **self.medusa,
               "lambdas": self.lambdas, "unfreeze": self.unfreeze, "lr_base": self.lr_base if self.unfreeze else None,
               "lr_stem": self.lr_stem if self.unfreeze else None, "base_config": base_id, "tokenizer": tokenizer,
               "tokens": tokens, "optim": cfg.key()}
        if self.distill is not None:
            key["distill"] = self.distill.settings()
        if self.token_input:
            key["token_input"] = True
        if self.draft_vocab is not None:
            key["draft_vocab"] = self.draft_vocab
        return key

    def training_json(self, cfg: OptimConfig, res: TrainResult, text_info: dict, head_parameters: int) -> dict:
        """``training.json``: these settings, the optimiser's, the text and what the run did."""
        return {
            "kind": self.kind, "num_heads": self.num_heads, **self.medusa, "lambdas": self.lambdas,
            "unfreeze": self.unfreeze, "lr_heads": cfg.lr, "lr_base": self.lr_base if self.unfreeze else None,
            "lr_stem": self.lr_stem if self.unfreeze else None, "optim": asdict(cfg),
            "head_parameters": head_parameters, **text_info, "steps": res.steps, "tokens_seen": res.tokens,
            "seconds": res.seconds, "final_loss": res.losses, "resumed_from": res.resumed_from,
            "self_distill": None if self.distill is None else self.distill.settings(), "token_input": self.token_input,
            "draft_vocab": self.draft_vocab,
        }


def _head_model(base, spec: _HeadsSpec, cfg: OptimConfig):
    """The ``BlockwiseModel`` with new heads on ``base`` (trainable only with ``unfreeze``) and its
    optimiser parameter groups: the heads at ``cfg.lr`` (LR_M), the base's own at ``lr_base`` (LR_B)."""
    from latticedraft.gpu.models.blockwise import BlockwiseModel

    bm = BlockwiseModel.from_base(base, spec.num_heads, spec.kind, seed=cfg.seed, ffn_dim=spec.ffn_dim,
                                  medusa_layers=spec.medusa_layers, medusa_lm_head=spec.medusa_lm_head,
                                  token_input=spec.token_input)
    for p in bm.base.parameters():
        p.requires_grad_(spec.unfreeze)
    head_params = bm.head_parameters()
    groups = [{"params": head_params, "lr": cfg.lr}]
    if spec.unfreeze:
        ids = {id(p) for p in head_params}
        groups.append({"params": [p for p in bm.base.parameters() if id(p) not in ids], "lr": spec.lr_base})
    return bm, groups


def _loss_fn(bm, spec: _HeadsSpec, teacher, columns: torch.Tensor | None):
    """``run_training``'s loss: ``Σ_j λ_j L_j`` on a batch, with each head's loss (``hj``) and, for the
    KL loss, its top-1 agreement with the teacher (``aj``; head 1's only where the base trains).
    ``teacher``: the frozen copy of an unfrozen base (None: the base is its own teacher)."""
    scale = spec.lr_stem / spec.lr_base if spec.unfreeze else 1.0

    def loss_fn(batch):
        if not spec.unfreeze:
            bm.base.eval()
        agree = []
        if spec.kl:
            t_logits = None
            if teacher is not None:
                with torch.no_grad():
                    t_logits = teacher(input_ids=batch).logits
            losses, agree = head_kl_losses(bm, batch, t_logits, frozen=not spec.unfreeze, stem_grad_scale=scale)
        else:
            losses = head_losses(bm, batch, frozen=not spec.unfreeze, stem_grad_scale=scale, draft_vocab=columns)
        total = sum(lam * l for lam, l in zip(spec.lambdas, losses))
        parts = {f"h{j + 1}": l.item() for j, l in enumerate(losses)}
        parts.update({f"a{j + 1}": a for j, a in enumerate(agree) if j > 0 or spec.unfreeze})
        return total, parts

    return loss_fn


def _draft_columns(windows, base, draft_vocab: int | None, device) -> torch.Tensor | None:
    """The ``draft_vocab`` most frequent token ids of the training text (int64[V']; None: all)."""
    if draft_vocab is None:
        return None
    from latticedraft.gpu.models import hf
    from latticedraft.gpu.models.draft_vocab import rank_tokens

    return torch.from_numpy(rank_tokens(windows.tokens, hf.model_vocab_size(base))[:draft_vocab]).to(device)


def _save_heads(stage: Path, bm, spec: _HeadsSpec, tok, base_dir: Path, out: Path, save_dtype: str) -> None:
    """The heads (``save_dtype``) into ``stage``, naming the base relatively; with ``unfreeze`` the
    trained base and its tokenizer into ``stage/base``. The model is float32 again after."""
    from latticedraft.gpu.models.hf import resolve_dtype

    quiet_hf_progress()
    bm.heads.to(resolve_dtype(save_dtype))
    if spec.unfreeze:
        bm.base.to(resolve_dtype(save_dtype))
        bm.save_pretrained(stage, bundle_base=True)
        tok.save(str(stage / "base" / "tokenizer.json"))
    else:
        bm.save_pretrained(stage, base_ref=os.path.relpath(base_dir.resolve(), out.resolve()))
    bm.float()


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
    medusa_layers: int = 1,
    medusa_lm_head: str = "heads",
    tokenizer_path: str | Path | None = None,
    resume: bool = False,
    save_dtype: str = "float32",
    keep_checkpoint: bool = False,
    device=None,
    encoding_errors: str = "strict",
    stop_after: int | None = None,
    force: bool = False,
    distill: DistillConfig | None = None,
    token_input: bool = False,
    draft_vocab: int | None = None,
) -> TrainResult:
    """Train heads 2..h of a ``BlockwiseModel`` on ``base_dir`` and save them into ``out_dir``.

    ``cfg.lr`` is LR_M (the new heads). With ``unfreeze`` the base trains too at ``lr_base`` (LR_B)
    and the heads' gradient into the trunk is scaled by ``lr_stem / lr_base`` (LR_MB); the
    updated base is then saved into ``out_dir/base``. ``lambdas`` weights the per-head losses
    (length ``num_heads``, default all 1). The config names ``base_dir`` relatively. ``kind="medusa"``:
    ``medusa_layers`` residual blocks per head and ``medusa_lm_head`` ("heads": one LM head each,
    starting from the base's output embedding; "tied": the base's output embedding). ``distill``:
    train on the base's own continuations and/or with the KL loss (``DistillConfig``; None: the
    corpus and its tokens). ``token_input``: Stern heads that also read the base's greedy next
    token (``SternHeads``). ``draft_vocab`` V': heads 2..h learn to draft among the V' most frequent
    tokens of the training text only (``head_losses``; the ranking is saved as ``draft_vocab.json``).
    """
    from latticedraft.gpu.models import hf
    from latticedraft.lm.tokenizer import fingerprint

    cfg.validate()
    if distill is not None:
        distill.validate()
    spec = _HeadsSpec(kind, num_heads, check_head_options(num_heads, cfg.seq_len, lambdas), unfreeze, lr_base,
                      lr_stem, ffn_dim, medusa_layers, medusa_lm_head, distill, token_input, draft_vocab)
    check_draft_vocab(draft_vocab, kind, medusa_lm_head, unfreeze, distill)
    claim_dir(out_dir, HEADS, force=force, resume=resume, inputs={"--base": base_dir, "--tokenizer": tokenizer_path})
    base_dir, out = Path(base_dir), Path(out_dir)
    base, tok, tok_path = load_base(base_dir, cfg.seq_len, tokenizer_path, device)
    text = training_text(base_dir, corpus, tok, tok_path, cfg.seq_len, cfg.batch_size, cfg.seed, distill,
                         encoding_errors, device)
    windows = text.windows
    columns = _draft_columns(windows, base, draft_vocab, device)
    teacher = frozen_copy(base) if spec.kl and unfreeze else None
    bm, groups = _head_model(base, spec, cfg)
    key = spec.key(cfg, base_config_id(base_dir), fingerprint(tok), int(windows.tokens.size))
    res = run_training(bm, groups, _loss_fn(bm, spec, teacher, columns), windows, cfg, out, key, resume,
                       desc=f"train {kind} heads", device=device, stop_after=stop_after)
    if not res.finished:
        return res

    def write(stage: Path) -> None:
        _save_heads(stage, bm, spec, tok, base_dir, out, save_dtype)
        if draft_vocab is not None:
            from latticedraft.gpu.models.draft_vocab import write_ranked

            write_ranked(stage, windows.tokens, hf.model_vocab_size(base), windows.source, trained=draft_vocab)
        n_params = sum(p.numel() for p in bm.head_parameters())
        write_json_atomic(stage / "training.json", spec.training_json(cfg, res, text.info, n_params))

    finish_dir(out, write, keep_checkpoint, HEADS)
    return res

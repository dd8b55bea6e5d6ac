"""Distilling a small draft model from a base (``train_draft_model``).

The student is the base's own architecture scaled down (``draft_config``): same ``model_type``,
vocabulary, tokenizer, positions, attention pattern (sliding window, RoPE settings), norms and
tied embeddings; only the depth, width, attention heads and feed-forward width change. It learns
the frozen base's next-token distribution (``KL(p_base || p_student)``, or the cross-entropy on
the text with ``loss="hard"``) on the base's own continuations of corpus prompts
(``continuations.py``) or on the corpus itself. This is the model that ``--drafter model``,
``--method mtad``, HF assisted generation and the neural rescorer use.

``init="base"`` (the default) starts the student from the base where their shapes allow
(``init_from_base``): the token (and learned position) embeddings, projected onto their top
``n_embd`` principal directions when the student is narrower, and at the base's width also the
final norm and, with the base's attention heads, evenly spaced decoder layers (a one-layer
student starts from the base's first layer, DistilBERT's layer-dropping init). ``init="random"`` starts from the config's own init.

The saved ``generation_config.json`` asks HF assisted generation for ``assistant_tokens`` drafted
tokens per round on its ``heuristic`` schedule (grown by 2 after a fully accepted round, shrunk by 1
otherwise) instead of transformers' constant 20: a small model on a CPU pays per drafted token
nearly what the base pays per token, so long rounds of rejected drafts cost more than they save.

Runs the loop in ``loop.py`` (AdamW, cosine schedule, atomic checkpoints, exact ``--resume``, a
stop on NaN); saves the student in HF format with the base's ``tokenizer.json`` and a
``training.json`` naming the base and the distillation settings.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch

from latticedraft.errors import InputError
from latticedraft.gpu.train.distill import DistillConfig, frozen_copy, lm_kl_loss, training_text
from latticedraft.gpu.train.loop import (OptimConfig, TrainResult, base_config_id, finish_dir, load_base, run_training,
                                         write_json_atomic)
from latticedraft.outputs import DRAFT_MODEL, claim_dir


@dataclass(frozen=True)
class DraftArch:
    """The student's size: ``n_layer`` decoder layers of width ``n_embd`` with ``n_head`` attention
    heads; ``ffn_dim`` the feed-forward width (None: the base's ratio of feed-forward width to
    hidden size, times ``n_embd``, rounded up to a multiple of 8)."""

    n_layer: int = 1
    n_embd: int = 64
    n_head: int = 4
    ffn_dim: int | None = None

    def validate(self) -> None:
        for name in ("n_layer", "n_embd", "n_head"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} {getattr(self, name)} must be at least 1")
        if self.n_embd % self.n_head:
            raise InputError(f"--n-embd {self.n_embd} is not divisible by --n-head {self.n_head}")
        if self.ffn_dim is not None and self.ffn_dim < 1:
            raise InputError(f"--ffn-dim {self.ffn_dim} must be at least 1")


def _ffn_attr(cfg) -> str | None:
    for name in ("intermediate_size", "n_inner"):
        if name in cfg.to_dict():
            return name
    return None


def draft_config(base_config, arch: DraftArch):
    """The base's config (a transformers ``PretrainedConfig``) with ``arch``'s depth and width.

    Refuses a config whose width or depth it cannot name (it sets ``hidden_size``,
    ``num_hidden_layers`` and ``num_attention_heads``, which every causal LM config in transformers
    maps to its own names)."""
    arch.validate()
    cfg = copy.deepcopy(base_config)
    try:
        base_width, base_heads = int(cfg.hidden_size), int(cfg.num_attention_heads)
        cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads = arch.n_embd, arch.n_layer, arch.n_head
    except AttributeError as e:
        raise InputError(f"the base's config ({type(cfg).__name__}) does not name its width, depth and attention "
                         f"heads the usual way ({e}); a draft model cannot be derived from it") from e
    kv = getattr(cfg, "num_key_value_heads", None)
    if kv is not None:  # keep the base's grouping where it divides, else one key/value head per query head
        group = base_heads // int(kv) if int(kv) and base_heads % int(kv) == 0 else 1
        cfg.num_key_value_heads = arch.n_head // group if arch.n_head % group == 0 else arch.n_head
    if getattr(cfg, "head_dim", None) is not None:
        cfg.head_dim = arch.n_embd // arch.n_head
    ffn = _ffn_attr(cfg)
    if ffn is not None:
        base_ffn = getattr(cfg, ffn) or 4 * base_width
        cfg_ffn = arch.ffn_dim or -(-int(base_ffn) * arch.n_embd // base_width // 8) * 8
        setattr(cfg, ffn, int(cfg_ffn))
    elif arch.ffn_dim is not None:
        raise InputError(f"--ffn-dim: the base's config ({type(cfg).__name__}) has no feed-forward width to set; "
                         "drop --ffn-dim")
    types = getattr(cfg, "layer_types", None)
    if isinstance(types, (list, tuple)) and types:
        cfg.layer_types = [types[min(i, len(types) - 1)] for i in range(arch.n_layer)]
    for name in ("attention_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout", "dropout"):
        if isinstance(getattr(cfg, name, None), float):
            setattr(cfg, name, 0.0)
    return cfg


INITS = ("base", "random")


@torch.no_grad()
def init_from_base(student: torch.nn.Module, base: torch.nn.Module) -> list[str]:
    """Copy into ``student`` what fits of ``base`` (see the module docstring); returns the names of
    the student's tensors that were set. Matrices whose last dimension is the base's width H and
    the student's w < H are multiplied by ``P`` [H, w], the top-w right singular vectors of the
    base's token embedding (so tied input and output embeddings stay tied)."""
    from latticedraft.gpu.models import hf

    H, w = int(base.config.hidden_size), int(student.config.hidden_size)
    emb = base.get_input_embeddings().weight.float()
    P = torch.linalg.svd(emb, full_matrices=False).Vh[:w].T if w < H else None  # [H, w]
    sb, bb = hf.backbone(student), hf.backbone(base)
    n_s, n_b = hf.num_layers(student.config), hf.num_layers(base.config)
    layers_s, layers_b = hf.decoder_layers_name(sb, n_s), hf.decoder_layers_name(bb, n_b)
    prefix_s = next(n for n, m in student.named_modules() if m is sb)
    own = student.state_dict()
    done = []
    for name, t in base.state_dict().items():
        if f".{layers_b}." in f".{name}" or name not in own:
            continue
        tgt = own[name]
        if tgt.shape == t.shape:
            tgt.copy_(t)
        elif P is not None and t.dim() == 2 and t.shape[-1] == H and tgt.shape == (t.shape[0], w):
            tgt.copy_((t.float() @ P).to(tgt.dtype))
        else:
            continue
        done.append(name)
    heads = lambda c: (c.num_attention_heads, getattr(c, "num_key_value_heads", None))  # noqa: E731
    if w == H and heads(student.config) == heads(base.config):  # evenly spaced layers of the base
        picks = [round(i * (n_b - 1) / max(1, n_s - 1)) for i in range(n_s)]
        for i, j in enumerate(picks):
            src = getattr(bb, layers_b)[j].state_dict()
            dst = getattr(sb, layers_s)[i]
            if all(k in dst.state_dict() and dst.state_dict()[k].shape == v.shape for k, v in src.items()):
                dst.load_state_dict(src)
                done.append(f"{prefix_s}.{layers_s}.{i} <- {layers_b}.{j}")
    return done


def _student(teacher, arch: DraftArch, cfg: OptimConfig, init: str, device):
    """The student ``draft_config(teacher, arch)``, seeded, started from what fits of the teacher with
    ``init="base"``: ``(student, names of the tensors copied)``; refuses a vocabulary that differs."""
    from transformers import AutoModelForCausalLM

    from latticedraft.gpu.models.hf import model_vocab_size

    scfg = draft_config(teacher.config, arch)
    torch.manual_seed(cfg.seed)
    student = AutoModelForCausalLM.from_config(scfg)
    copied = init_from_base(student, teacher) if init == "base" else []
    if device is not None:
        student = student.to(device)
    if model_vocab_size(student) != model_vocab_size(teacher):
        raise InputError(f"the draft model's vocabulary ({model_vocab_size(student)}) differs from the base's "
                         f"({model_vocab_size(teacher)}); the base's config does not carry its vocabulary size")
    return student, copied


def _loss_fn(student, teacher, distill: DistillConfig):
    """``run_training``'s loss: ``KL(p_base || p_student)`` (with the top-1 agreement ``a``), or the
    cross-entropy on the text with ``loss="hard"``."""
    def loss_fn(batch):
        if distill.loss == "kl":
            loss, agree = lm_kl_loss(student, batch, teacher)
            return loss, {"kl": loss.item(), "a": agree}
        logits = student(input_ids=batch).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        return loss, {"ce": loss.item()}

    return loss_fn


def _save_student(stage: Path, student, save_dtype: str, assistant_tokens: int, tok) -> None:
    """The student (``save_dtype``, HF format, files readable by all) with its generation config's
    assistant schedule and the base's ``tokenizer.json``; float32 again after."""
    from latticedraft.atomic import publish_mode
    from latticedraft.gpu.models.hf import resolve_dtype

    student.generation_config.num_assistant_tokens = assistant_tokens
    student.generation_config.num_assistant_tokens_schedule = "heuristic"
    student.to(resolve_dtype(save_dtype)).save_pretrained(stage)
    student.float()
    for f in stage.iterdir():  # transformers writes some files with mode 0600
        publish_mode(f)
    tok.save(str(stage / "tokenizer.json"))


def _check_draft_options(cfg: OptimConfig, distill: DistillConfig, arch: DraftArch, init: str,
                         assistant_tokens: int) -> None:
    """Every option's range, before anything is read or written."""
    if assistant_tokens < 1:
        raise InputError(f"--assistant-tokens {assistant_tokens} must be at least 1")
    cfg.validate()
    distill.validate()
    arch.validate()
    if init not in INITS:
        raise InputError(f"--init {init!r} is not one of {', '.join(INITS)}")


def train_draft_model(
    base_dir: str | Path,
    corpus: Sequence[Path],
    out_dir: str | Path,
    arch: DraftArch,
    cfg: OptimConfig,
    distill: DistillConfig,
    tokenizer_path: str | Path | None = None,
    resume: bool = False,
    save_dtype: str = "float32",
    keep_checkpoint: bool = False,
    device=None,
    encoding_errors: str = "strict",
    stop_after: int | None = None,
    init: str = "base",
    assistant_tokens: int = 5,
    force: bool = False,
) -> TrainResult:
    """Distil a ``draft_config(base, arch)`` student from the frozen base in ``base_dir`` and save it
    into ``out_dir`` (HF format + ``tokenizer.json`` + ``training.json``); ``init``: ``base`` (start
    from what fits of the base, ``init_from_base``) or ``random``."""
    import os

    from latticedraft.lm.tokenizer import fingerprint

    _check_draft_options(cfg, distill, arch, init, assistant_tokens)
    claim_dir(out_dir, DRAFT_MODEL, force=force, resume=resume,
              inputs={"--base": base_dir, "--tokenizer": tokenizer_path})
    base_dir, out = Path(base_dir), Path(out_dir)
    base, tok, tok_path = load_base(base_dir, cfg.seq_len, tokenizer_path, device)
    text = training_text(base_dir, corpus, tok, tok_path, cfg.seq_len, cfg.batch_size, cfg.seed, distill,
                         encoding_errors, device)
    teacher = frozen_copy(base)
    del base
    student, copied = _student(teacher, arch, cfg, init, device)
    key = {"kind": "draft-model", "arch": asdict(arch), "init": init, "base_config": base_config_id(base_dir),
           "tokenizer": fingerprint(tok), "tokens": int(text.windows.tokens.size), "distill": distill.settings(),
           "optim": cfg.key()}
    res = run_training(student, [{"params": [p for p in student.parameters() if p.requires_grad]}],
                       _loss_fn(student, teacher, distill), text.windows, cfg, out, key, resume,
                       desc="train draft model", device=device, stop_after=stop_after)
    if not res.finished:
        return res

    def write(stage: Path) -> None:
        _save_student(stage, student, save_dtype, assistant_tokens, tok)
        write_json_atomic(stage / "training.json", {
            "kind": "draft-model", "base": os.path.relpath(base_dir.resolve(), out.resolve()), "arch": asdict(arch),
            "init": init, "init_from_base": copied,
            "self_distill": distill.settings(), "optim": asdict(cfg),
            "parameters": sum(p.numel() for p in student.parameters()),
            "base_parameters": sum(p.numel() for p in teacher.parameters()), **text.info, "steps": res.steps,
            "tokens_seen": res.tokens, "seconds": res.seconds, "final_loss": res.losses,
            "resumed_from": res.resumed_from,
        })

    finish_dir(out, write, keep_checkpoint, DRAFT_MODEL)
    return res

"""What a training run needs to know before it starts: the base's shape (read from its directory
without loading it) and a lower bound on the memory each ``train`` verb will take.

Bytes are float32 (4 per number). A trained parameter costs 16 bytes (weight, gradient and
AdamW's two moments), a frozen one 4. Of the activations only what one micro-batch must keep for
the backward pass is counted, and from below: the copies of the logits ``[b, s, V]`` alive at the
peak of the backward pass (each loss's saved log-softmax, and one gradient of that size), about
8 hidden-sized tensors ``[b, s, H]`` per trained layer (and two ``[b, s, F]`` of a trained MLP),
none for frozen layers run without gradients. So a run this estimate refuses cannot fit; one it
admits may still not (the estimate ignores the allocator, the corpus and the framework itself).
``benchmarks/train_footprint.py`` checks it against measured peaks: 0.39-0.75 of the real growth
of the resident set on CPU.

Sizes: ``b`` = ``--batch-size``, ``s`` = ``--seq-len``, ``V`` vocabulary, ``H`` hidden size,
``L`` layers, ``F`` feed-forward width.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from latticedraft.errors import ModelError

F32, TRAINED, FROZEN = 4, 16, 4  # bytes per activation number / trained parameter / frozen parameter
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class BaseShape:
    """A base causal LM's sizes from its ``config.json`` and weight headers (nothing loaded).
    ``positions``: the context length (None where the config states none); ``params``: weights."""

    path: Path
    layers: int
    hidden: int
    vocab: int
    positions: int | None
    ffn: int
    params: int

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer, from below (attention 4H² + a two-matrix MLP 2HF)."""
        return 4 * self.hidden ** 2 + 2 * self.hidden * self.ffn


def _first(cfg: dict, *keys):
    return next((cfg[k] for k in keys if isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool)), None)


def _safetensors_params(path: Path) -> int:
    """Numbers stored in one ``.safetensors`` file, from its JSON header (8-byte length + JSON)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    total = 0
    for name, t in header.items():
        if name != "__metadata__":
            count = 1
            for d in t["shape"]:
                count *= int(d)
            total += count
    return total


def _weight_params(d: Path) -> int:
    """Parameters of the weights in model directory ``d``: exact for safetensors, from the file
    size at 4 bytes each (a lower bound) for ``pytorch_model.bin``."""
    index = d / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return sum(_safetensors_params(d / f) for f in files)
    if (d / "model.safetensors").is_file():
        return _safetensors_params(d / "model.safetensors")
    return sum(p.stat().st_size for p in d.glob("pytorch_model*.bin")) // 4


def read_base_shape(base_dir) -> BaseShape:
    """The shape of the HF causal LM in ``base_dir`` (``ModelError`` naming what is missing or unreadable)."""
    from latticedraft.gpu.models.hf import check_model_dir

    d = check_model_dir(base_dir)
    try:
        cfg = json.loads((d / "config.json").read_text())
        layers = _first(cfg, "num_hidden_layers", "n_layer", "num_layers")
        hidden = _first(cfg, "hidden_size", "n_embd", "d_model")
        vocab = _first(cfg, "vocab_size")
        if layers is None or hidden is None or vocab is None:
            raise KeyError("num_hidden_layers / hidden_size / vocab_size")
        params = _weight_params(d)
    except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
        raise ModelError(f"model directory {d}: config.json or the weights' header cannot be read ({e}); "
                         "re-save the model") from e
    if cfg.get("is_encoder_decoder"):
        raise ModelError(f"model directory {d} holds an encoder-decoder model ({cfg.get('model_type', '?')}); "
                         "training on a base needs a causal LM (decoder only)")
    return BaseShape(path=d, layers=layers, hidden=hidden, vocab=vocab,
                     positions=_first(cfg, "max_position_embeddings", "n_positions", "n_ctx"),
                     ffn=_first(cfg, "intermediate_size", "n_inner") or 4 * hidden, params=params)


def _logits(b: int, s: int, v: int, copies: int) -> int:
    return copies * b * s * v * F32


def lm_bytes(vocab: int, n_embd: int, n_layer: int, n_positions: int, ffn: int, b: int, s: int) -> int:
    """``train lm``: every parameter trained (learned positions counted, as GPT-2 has them)."""
    params = vocab * n_embd + n_positions * n_embd + n_layer * (4 * n_embd ** 2 + 2 * n_embd * ffn)
    acts = n_layer * b * s * (8 * n_embd + 2 * ffn) * F32  # + the MLP's input and output of its activation
    return params * TRAINED + acts + _logits(b, s, vocab, 2)


def draft_model_bytes(base: BaseShape, n_embd: int, n_layer: int, ffn: int, b: int, s: int) -> int:
    """``train draft-model``: the student trained as ``train lm`` trains (its positions rotary or
    learned, counted as learned), the frozen base as its teacher, and the teacher's probabilities."""
    student = lm_bytes(base.vocab, n_embd, n_layer, base.positions or 0, ffn, b, s)
    return student + base.params * FROZEN + _logits(b, s, base.vocab, 1)


def heads_bytes(base: BaseShape, heads: int, kind: str, ffn: int, b: int, s: int, unfreeze: bool) -> int:
    """``train heads``: the base (trained with ``unfreeze``), heads 2..h, each head's saved log-softmax and one gradient."""
    per_head = 2 * base.hidden * ffn if kind == "stern" else base.layer_params
    extra = heads - 1
    base_bytes = base.params * (TRAINED if unfreeze else FROZEN)
    acts = extra * 8 * b * s * base.hidden * F32 + (base.layers * 8 * b * s * base.hidden * F32 if unfreeze else 0)
    return base_bytes + extra * per_head * TRAINED + acts + _logits(b, s, base.vocab, heads + 1)


def adapter_bytes(base: BaseShape, b: int, s: int) -> int:
    """``train adapter``: the frozen base, one trained attention layer, the teacher's probabilities, the
    adapter's log-softmax and its gradient."""
    return (base.params * FROZEN + 4 * base.hidden ** 2 * TRAINED + _logits(b, s, base.vocab, 3)
            + (base.layers + 1) * b * s * base.hidden * F32)


def exit_heads_bytes(base: BaseShape, b: int, s: int) -> int:
    """``train heads --early-exit``: the frozen base, an H x H map per layer 1..L-1, and per layer the
    teacher's probabilities and the head's log-softmax (all kept for the summed loss's backward pass)."""
    extra = base.layers - 1
    return (base.params * FROZEN + extra * base.hidden ** 2 * TRAINED + _logits(b, s, base.vocab, 2 * extra + 1)
            + (base.layers + 1) * b * s * base.hidden * F32)

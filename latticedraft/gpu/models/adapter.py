"""Kangaroo's self-drafting adapter (Liu et al. 2024): one attention layer and two norms on the
hidden states after the base model's first ``exit_layer`` layers, sharing the base's LM head.

``adapter(h [b, s, H]) -> states [b, s, H]``: ``norm_out(h + attn(norm_in(h)))``, and
``split.head(states)`` are the draft logits [b, s, V]. The attention and ``norm_in`` are copies
of layer ``exit_layer``'s own (same type, so GPT-2 gets LayerNorm, LLaMA/Mistral RMSNorm and
rotary angles), ``norm_out`` a copy of the final norm; the adapter keeps its own one-layer KV
cache (``layer_idx`` 0). Saved as ``adapter.json`` (exit layer, base fingerprint) +
``adapter.safetensors``; ``load_adapter`` refuses, in one line, an adapter made for another base.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from latticedraft.errors import InputError, ModelError
from latticedraft.gpu.models import hf
from latticedraft.gpu.models.layer_split import LayerSplit

CONFIG = "adapter.json"
WEIGHTS = "adapter.safetensors"


def base_fingerprint(split: LayerSplit) -> dict:
    """What an adapter or exit heads must match: architecture, sizes, and two hashes of the first 64
    embedding rows: of their float32 bytes (``embedding_sha256``, exact in float32 only) and of
    their sign bits (``embedding_signs_sha256``), which no rounding to float16 or bfloat16 changes,
    so a base cast to half precision is still recognised."""
    rows = split.wte.weight.detach()[:64].cpu()
    emb = rows.float().contiguous()
    signs = np.packbits(torch.signbit(rows).numpy().reshape(-1))
    return {"model_type": str(getattr(split.config, "model_type", "?")), "hidden_size": split.hidden_size,
            "num_layers": split.num_layers, "vocab_size": int(split.head.weight.shape[0]),
            "embedding_sha256": hashlib.sha256(emb.numpy().tobytes()).hexdigest()[:16],
            "embedding_signs_sha256": hashlib.sha256(signs.tobytes()).hexdigest()[:16]}


def fingerprint_mismatch(made_for: dict, split: LayerSplit) -> str | None:
    """None when ``made_for`` (a stored ``base_fingerprint``) fits the base in ``split``, else
    "key stored vs here, ..." naming what differs. The sign hash decides where both hold it (any
    dtype); a fingerprint stored before it existed is held to the float32 byte hash."""
    here = base_fingerprint(split)
    keys = ["model_type", "hidden_size", "num_layers", "vocab_size"]
    keys.append("embedding_signs_sha256" if "embedding_signs_sha256" in made_for else "embedding_sha256")
    diff = [k for k in keys if made_for.get(k) != here[k]]
    return ", ".join(f"{k} {made_for.get(k)} vs {here[k]}" for k in diff) or None


def check_exit_layer(split: LayerSplit, exit_layer: int, what: str = "--exit-layer") -> None:
    if not 1 <= exit_layer < split.num_layers:
        raise InputError(f"{what} {exit_layer} must lie in [1, {split.num_layers - 1}] for a base of "
                         f"{split.num_layers} layers (the remaining layers verify)")


class KangarooAdapter(nn.Module):
    def __init__(self, split: LayerSplit, exit_layer: int):
        super().__init__()
        check_exit_layer(split, exit_layer)
        self.exit_layer = int(exit_layer)
        layer = split.layers[exit_layer]
        attn = getattr(layer, "attn", None) or getattr(layer, "self_attn", None)
        norm = getattr(layer, "ln_1", None) or getattr(layer, "input_layernorm", None)
        if attn is None or norm is None:
            raise ModelError(f"{type(layer).__name__} has no attn/self_attn and ln_1/input_layernorm; "
                             "the Kangaroo adapter supports GPT-2, LLaMA and Mistral style layers")
        self.rotary = split.rotary is not None
        self.norm_in = copy.deepcopy(norm)
        self.attn = copy.deepcopy(attn)
        self.attn.layer_idx = 0  # its own one-layer cache
        self.norm_out = copy.deepcopy(split.norm)
        for p in self.parameters():
            p.requires_grad_(True)

    def forward(self, h: torch.Tensor, bias: torch.Tensor, rotary, cache) -> torch.Tensor:
        """h [b, s, H] (layer ``exit_layer``'s input), bias [b, 1, s, K + s], rotary: (cos, sin)
        or None; cache: a ``kv.KVCache`` with room reserved, a DynamicCache or None. Returns the states
        the LM head reads [b, s, H]."""
        x = self.norm_in(h)
        if self.rotary:
            a = self.attn(x, position_embeddings=rotary, attention_mask=bias, **hf.cache_arg(cache))
        else:
            a = self.attn(x, cache, bias)
        a = a[0] if isinstance(a, tuple) else a
        return self.norm_out(h + a)


def save_adapter(adapter: KangarooAdapter, split: LayerSplit, out: Path, extra: dict | None = None) -> None:
    """Write ``adapter.json`` + ``adapter.safetensors`` into ``out`` (a staging directory)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in adapter.state_dict().items()}, str(out / WEIGHTS))
    cfg = {"kind": "kangaroo-adapter", "exit_layer": adapter.exit_layer, "base": base_fingerprint(split),
           **(extra or {})}
    (out / CONFIG).write_text(json.dumps(cfg, indent=1) + "\n")


def load_adapter(path, split: LayerSplit) -> KangarooAdapter:
    """The adapter in ``path`` for ``split``'s base; ModelError (one line) when it was made for another."""
    from latticedraft.gpu.models.hf import load_safetensors

    p = Path(path)
    if not (p / CONFIG).is_file() or not (p / WEIGHTS).is_file():
        raise InputError(f"adapter directory {p} has no {CONFIG} and {WEIGHTS}; train one with "
                         "`latticedraft train adapter --base BASE --out DIR` or `bash data/build.sh adapter-kangaroo`")
    try:
        cfg = json.loads((p / CONFIG).read_text())
        exit_layer, made_for = int(cfg["exit_layer"]), dict(cfg["base"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ModelError(f"{p / CONFIG} is not an adapter config ({e}); re-train the adapter") from e
    what = fingerprint_mismatch(made_for, split)
    if what:
        raise ModelError(f"adapter {p} was trained for another base ({what}); retrain it on this base with "
                         "`latticedraft train adapter --base BASE --out DIR`")
    adapter = KangarooAdapter(split, exit_layer)
    state = load_safetensors(p / WEIGHTS)
    try:
        adapter.load_state_dict(state)
    except RuntimeError as e:
        raise ModelError(f"adapter weights {p / WEIGHTS} do not fit this base ({str(e).splitlines()[0]}); "
                         "retrain the adapter") from e
    return adapter.to(split.device, split.dtype).eval()

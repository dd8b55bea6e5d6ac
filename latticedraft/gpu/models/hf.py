"""Loading HF causal LMs from a directory, checking them against tokenizers, and finding their parts.

The helpers that find a decoder's parts (``backbone``, ``decoder_layers``, ``final_norm``) work
by structure, not by model name, so GPT-2, LLaMA, Mistral, GPT-NeoX/Pythia and most other
``*ForCausalLM`` classes are covered without a per-architecture table.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path

import torch
from torch import nn

from latticedraft.errors import InputError, ModelError

_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_NORM_NAMES = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "norm_f")


@functools.cache
def cache_keyword() -> str:
    """The keyword transformers' models, decoder layers and attention modules take a KV cache by,
    and the field of their outputs that returns it: ``cache`` from transformers 5.24 (which
    deprecates the old name), ``past_key_values`` before; read once from ``LlamaModel.forward``."""
    from transformers import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


def cache_arg(cache) -> dict:
    """``{cache_keyword(): cache}``: the keyword argument of a KV cache for a transformers call."""
    return {cache_keyword(): cache}


def output_cache(out):
    """The KV cache a transformers model output returns (``out.cache`` or ``out.past_key_values``)."""
    return getattr(out, cache_keyword())


def resolve_dtype(dtype) -> torch.dtype:
    """``None`` → float32; accepts a ``torch.dtype`` or its name (``"float16"``, ``"bfloat16"`` …)."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    d = getattr(torch, str(dtype), None)
    if not isinstance(d, torch.dtype) or not d.is_floating_point:
        raise InputError(f"unknown dtype {dtype!r}; use float32, float16 or bfloat16")
    return d


def check_model_dir(path: str | Path) -> Path:
    """A directory with ``config.json`` and weights, or ``ModelError`` naming what is missing."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ModelError(f"model directory {p} is a file, not a directory; pass the directory saved by save_pretrained")
    if not p.is_dir():
        raise ModelError(f"model directory {p} does not exist; pass a directory saved by save_pretrained")
    if not (p / "config.json").is_file():
        raise ModelError(f"model directory {p} has no config.json; pass a directory saved by save_pretrained")
    if not any((p / w).is_file() for w in _WEIGHT_FILES):
        raise ModelError(
            f"model directory {p} has a config.json but no weights ({', '.join(_WEIGHT_FILES[::2])}); "
            "copy the weights there or re-save the model"
        )
    return p


def load_causal_lm(path: str | Path, device=None, dtype=None) -> nn.Module:
    """``AutoModelForCausalLM.from_pretrained(path)`` in eval mode, float32 unless ``dtype`` says otherwise."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from latticedraft.gpu.train.data import progress_enabled

    if not progress_enabled():
        hf_logging.disable_progress_bar()
    p = check_model_dir(path)
    dtype = resolve_dtype(dtype)  # a bad name is the caller's, not the directory's
    try:
        model, info = AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype, output_loading_info=True)
    except Exception as e:  # safetensors, json, size mismatches: any failure here is a bad directory
        raise ModelError(f"model directory {p} cannot be loaded as a causal LM ({brief(e)}); "
                         "check its config.json and weights, or re-save the model") from e
    check_loading_info(info, p)
    if device is not None:
        model = model.to(device)
    return model.eval()


def loading_problem(info: dict) -> tuple[str, str] | None:
    """The first problem ``from_pretrained(..., output_loading_info=True)`` reports, as (its key:
    "missing_keys" | "mismatched_keys" | "unexpected_keys", "first name and N more"), or None."""
    for key in ("missing_keys", "mismatched_keys", "unexpected_keys"):
        names = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info.get(key) or ())
        if names:
            return key, names[0] + (f" and {len(names) - 1} more" if len(names) > 1 else "")
    return None


def check_loading_info(info: dict, path: Path) -> None:
    """``ModelError`` when ``from_pretrained(..., output_loading_info=True)`` reports weights the config
    does not describe, or config parts the weights lack (transformers would start those at random)."""
    problem = loading_problem(info)
    if problem is not None:
        what = {"missing_keys": "lacks weights its config.json describes",
                "mismatched_keys": "has weights of other shapes than its config.json describes",
                "unexpected_keys": "has weights its config.json does not describe"}[problem[0]]
        raise ModelError(f"model directory {path} {what} ({problem[1]}); the config and the weights come "
                         "from different models: copy the matching config.json or re-save the model")


def brief(e: BaseException, limit: int = 160) -> str:
    """The gist of a library's exception as one short line (its first line, truncated)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def load_safetensors(path: str | Path) -> dict:
    """``safetensors.torch.load_file(path)``, or ``ModelError`` naming the file when it is truncated or corrupt."""
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as e:
        raise ModelError(f"{path} is truncated or corrupt ({brief(e)}); copy or re-save it") from e


def model_vocab_size(model: nn.Module) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


WRONG_TOKENIZER = "use the tokenizer the model was trained with (its directory's tokenizer.json)"


def check_tokenizer_fits(tokenizer, model: nn.Module, where: str = "the model", fix: str = WRONG_TOKENIZER) -> None:
    """The tokenizer's vocabulary must be the model's (padding the model's up to a multiple of 128 is
    allowed); else ``ModelError`` naming ``where`` and ``fix``."""
    check_vocab_fits(tokenizer.get_vocab_size(with_added_tokens=True), model_vocab_size(model), where, fix)


def check_vocab_fits(nt: int, nm: int, where: str = "the model", fix: str = WRONG_TOKENIZER) -> None:
    """``check_tokenizer_fits`` on sizes: a tokenizer of ``nt`` tokens, a model vocabulary of ``nm``."""
    padded = -(-nt // 128) * 128
    if nt > nm or (nt != nm and nm != padded):
        raise ModelError(f"the tokenizer has {nt} tokens but {where} has a vocabulary of {nm}; {fix}")


def backbone(model: nn.Module) -> nn.Module:
    """The decoder stack without the LM head (``model.model``, ``model.transformer``, ``model.gpt_neox`` …)."""
    bb = getattr(model, "base_model", None)
    if bb is None or bb is model:
        raise ModelError(f"{type(model).__name__} has no separate decoder backbone; it is not a *ForCausalLM model")
    return bb


def decoder_layers_name(bb: nn.Module, num_layers: int) -> str:
    """Attribute name of the ``ModuleList`` holding the ``num_layers`` decoder layers."""
    for name, child in bb.named_children():
        if isinstance(child, nn.ModuleList) and len(child) == num_layers:
            return name
    raise ModelError(f"{type(bb).__name__} has no list of {num_layers} decoder layers; this architecture is not supported")


def final_norm_name(bb: nn.Module) -> str:
    """Attribute name of the final norm applied after the last decoder layer."""
    for name in _NORM_NAMES:
        if isinstance(getattr(bb, name, None), nn.Module):
            return name
    raise ModelError(f"{type(bb).__name__} has no final norm ({'/'.join(_NORM_NAMES)}); this architecture is not supported")


def num_layers(config) -> int:
    return int(config.num_hidden_layers)

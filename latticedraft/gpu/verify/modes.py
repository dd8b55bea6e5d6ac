"""What a model allows the verifier to do: tree or batched verification, a rolling KV cache,
its positions, window, dtype and device (plain values read off the HF config)."""

from __future__ import annotations

import torch

from latticedraft.errors import InputError, ModelError


MODES = ("auto", "tree", "batched")


def base_config(model):
    """The HF config of a causal LM or of a BlockwiseModel's base."""
    base = getattr(model, "base", None)
    return (base if base is not None else model).config


def sliding_window(model) -> int | None:
    """The attention window in tokens, or None for full attention."""
    cfg = base_config(model)
    if getattr(cfg, "use_sliding_window", True) is False:
        return None
    w = getattr(cfg, "sliding_window", None)
    return int(w) if w else None


def check_verifiable(model) -> None:
    """Refuse (``ModelError``) a model the verifier cannot run: DynaMo heads (their own sampler)."""
    if getattr(model, "kind", None) == "dynamo":
        raise ModelError("BPD verification runs Stern heads; a DynaMo model decodes with --method dynamo")


def choose_mode(model, requested: str = "auto") -> tuple[str, str]:
    """("tree" | "batched", why). ``requested`` other than "auto" is honoured if possible."""
    if requested not in MODES:
        raise InputError(f"verify mode {requested!r} is not one of {', '.join(MODES)}")
    cfg = base_config(model)
    impl = getattr(cfg, "_attn_implementation", None) or "eager"
    layer_types = set(getattr(cfg, "layer_types", None) or [])
    if getattr(cfg, "is_encoder_decoder", False):
        raise ModelError(f"{type(model).__name__} is an encoder-decoder model; BPD needs a causal LM")
    problem = None
    if impl not in ("eager", "sdpa"):
        problem = f"attention implementation {impl!r} takes no custom 4-D mask"
    elif len(layer_types) > 1:
        problem = f"mixed layer types {sorted(layer_types)} need different masks per layer"
    if requested == "tree" and problem:
        raise ModelError(f"tree verification impossible: {problem}; use --verify batched")
    if requested == "batched":
        return "batched", "requested"
    if problem:
        return "batched", problem
    return "tree", f"{impl} attention accepts a 4-D tree mask"


KV_CACHES = ("auto", "full", "rolling")


def choose_kv_cache(window: int | None, mode: str, requested: str = "auto") -> bool:
    """Whether verification keeps a rolling buffer of W slots (``kv.KVCache`` with a window) instead
    of every position. "auto": rolling for sliding-window models in tree mode (the only mode whose
    masks are built from positions, not slot order); "rolling" fails where it cannot apply."""
    if requested not in KV_CACHES:
        raise InputError(f"--kv-cache {requested!r} is not one of {', '.join(KV_CACHES)}")
    if requested == "rolling" and window is None:
        raise ModelError("--kv-cache rolling needs a sliding-window model (config.sliding_window); use --kv-cache full")
    if requested == "rolling" and mode != "tree":
        raise ModelError(f"--kv-cache rolling needs tree verification (this model verifies in {mode} mode); "
                         "use --kv-cache full")
    return requested != "full" and window is not None and mode == "tree"


def position_limit(model) -> int | None:
    """The number of position ids the model embeds (GPT-2's n_positions), or None."""
    cfg = base_config(model)
    return getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)


def model_dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype


def model_device(model) -> torch.device:
    return next(model.parameters()).device

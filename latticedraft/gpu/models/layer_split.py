"""A decoder's forward pass split at layer boundaries, for self-drafting from early layers.

``LayerSplit(model)`` exposes the pieces of a GPT-2, LLaMA or Mistral causal LM (found by
structure, ``hf.backbone`` / ``hf.decoder_layers_name`` / ``hf.final_norm_name``):

- ``embed(ids [b, s], pos [b, s]) -> h [b, s, H]`` (token + learned position embeddings for GPT-2,
  token embeddings for rotary models);
- ``run(h, lo, hi, bias, pos, cache) -> h``: decoder layers ``lo..hi-1`` under an additive 4-D
  mask ``bias [b, 1, s, K]`` (K = cached slots + s) with position ids ``pos`` (rotary angles are
  computed here), writing each layer's keys/values into ``cache`` (a ``kv.KVCache`` with room
  reserved, or a ``DynamicCache``; layers are indexed by their own ``layer_idx``, so different
  layer ranges may live in different caches);
- ``logits(h) -> [.., V]``: the final norm and the LM head (on any layer's output: the shared
  early-exit head of Kangaroo and PPD).

``embed`` + ``run(0, d)`` + ``logits`` equals the model's own forward (tests: 1e-5, float32).
Only attention that takes a custom 4-D mask (eager, sdpa) is supported.
"""

from __future__ import annotations

import torch
from torch import nn

from latticedraft.errors import ModelError
from latticedraft.gpu.models import hf
from latticedraft.gpu.masks import attention_bias, visible


class LayerSplit:
    """The layers of ``model`` (an HF causal LM, or a wrapper with ``.base``), callable in ranges."""

    def __init__(self, model: nn.Module):
        lm = getattr(model, "base", None) or model
        cfg = lm.config
        if getattr(cfg, "is_encoder_decoder", False):
            raise ModelError(f"{type(lm).__name__} is an encoder-decoder model; early-layer drafting needs a causal LM")
        impl = getattr(cfg, "_attn_implementation", None) or "eager"
        if impl not in ("eager", "sdpa"):
            raise ModelError(f"attention implementation {impl!r} takes no custom 4-D mask; load the model with "
                             "attn_implementation='sdpa' or 'eager'")
        if len(set(getattr(cfg, "layer_types", None) or [])) > 1:
            raise ModelError(f"{type(lm).__name__} mixes layer types {sorted(set(cfg.layer_types))}; "
                             "early-layer drafting supports one attention type per model")
        self.lm = lm
        self.config = cfg
        self.bb = hf.backbone(lm)
        self.num_layers = hf.num_layers(cfg)
        self.layers = getattr(self.bb, hf.decoder_layers_name(self.bb, self.num_layers))
        self.norm = getattr(self.bb, hf.final_norm_name(self.bb))
        self.head = lm.get_output_embeddings()
        self.wte = self.bb.get_input_embeddings()
        self.wpe = getattr(self.bb, "wpe", None)  # GPT-2's learned positions
        self.rotary = getattr(self.bb, "rotary_emb", None)
        if self.wpe is None and self.rotary is None:
            raise ModelError(f"{type(self.bb).__name__} has neither learned positions (wpe) nor rotary_emb; "
                             "early-layer drafting supports GPT-2, LLaMA and Mistral style models")
        self.hidden_size = int(getattr(cfg, "hidden_size", None) or cfg.n_embd)
        self.dtype = next(lm.parameters()).dtype
        self.device = next(lm.parameters()).device
        w = getattr(cfg, "sliding_window", None)
        self.window = int(w) if w and getattr(cfg, "use_sliding_window", True) is not False else None
        self.position_limit = getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)

    def embed(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        h = self.wte(ids)
        if self.wpe is not None:
            h = h + self.wpe(pos)
            h = self.bb.drop(h) if hasattr(self.bb, "drop") else h
        return h

    def rotary_for(self, h: torch.Tensor, pos: torch.Tensor):
        """(cos, sin) of the rotary models for positions ``pos`` [b, s]; None for GPT-2."""
        return None if self.rotary is None else self.rotary(h, position_ids=pos)

    def run(self, h: torch.Tensor, lo: int, hi: int, bias: torch.Tensor, pos: torch.Tensor, cache,
            rotary=None) -> torch.Tensor:
        """Layers ``lo..hi-1`` on h [b, s, H]; keys/values written into ``cache``."""
        if lo >= hi:
            return h
        if self.rotary is not None and rotary is None:
            rotary = self.rotary_for(h, pos)
        for layer in self.layers[lo:hi]:
            if self.rotary is None:
                h = layer(h, cache, bias, None, use_cache=True, position_ids=pos)
            else:
                h = layer(h, attention_mask=bias, position_embeddings=rotary, position_ids=pos, use_cache=True,
                          **hf.cache_arg(cache))
            h = h[0] if isinstance(h, tuple) else h
        return h

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head on any layer's hidden states: [..., H] -> [..., V]."""
        return self.head(self.norm(h))

    def bias(self, key_valid: torch.Tensor, key_pos: torch.Tensor, q_pos: torch.Tensor,
             allowed_new: torch.Tensor) -> torch.Tensor:
        """The additive mask [b, 1, s, K + s] for s queries at ``q_pos`` [b, s] over K cached slots
        (``key_valid`` bool[b, K], ``key_pos`` [b, K]) and the s new ones (``allowed_new``
        bool[b, s, s]: which new tokens each query sees, itself included), with Mistral's window.
        numpy inputs (a ``kv.KVCache``'s host bookkeeping) cross to the device once."""
        return attention_bias(visible(key_valid, key_pos, q_pos, allowed_new, self.window), self.dtype, self.device)

    def clamp(self, pos):
        """Drafted positions may pass GPT-2's last learned position; they are never accepted there
        (numpy or torch)."""
        return pos if self.position_limit is None else pos.clip(max=int(self.position_limit) - 1)

"""The extra prediction heads (heads 2..h) of a ``BlockwiseModel``.

Head 1 is always the base model's own next-token head and lives in the base model, untouched.
The modules here map a trunk state to one pre-unembedding state per extra head; the base
model's output embedding (shared, tied) turns each into logits.

- ``SternHeads`` (Stern et al. 2018; the BPD paper's setup): head ``j`` is a feed-forward block
  with one hidden layer and a residual connection on the final hidden state (after the final
  norm): ``z_j = x + W2_j act(W1_j x + b1_j) + b2_j``. ``W2_j, b2_j`` start at zero, so before
  training every head predicts what head 1 predicts. With ``token_input`` (EAGLE's token input,
  Hydra's dependence on the draft so far) each head also reads the embedding of the token that
  follows ``x``: ``z_j = x + W2_j act(W1_j x + U_j e(y) + b1_j) + b2_j``. Decoding feeds the token
  the step emits after ``x`` (the verifier's bonus token: the base's argmax when greedy, the drawn
  token when sampling), so it costs no target call; training feeds the text's next token.
- ``DynamoHeads`` (DynaMo, Tuli et al.): head ``j`` is an extra decoder layer, initialised as a
  copy of the base's final layer (weight transfer), fed the stem's output (the input of the
  base's final layer), followed by the base's final norm (shared). Each head layer is run as a
  one-layer instance of the base's own backbone class called with ``inputs_embeds``, so masks,
  rotary/absolute positions and KV caching are the base architecture's own code; positional
  and token embeddings of that one-layer backbone are zero and frozen, so it computes exactly
  ``final_norm(layer(stem))``. ``check_weight_transfer`` proves this on the concrete model.
- ``MedusaHeads`` (Medusa, Cai et al. 2024; vLLM's and FasterDecoding's layout): head ``j`` is
  ``num_layers`` residual blocks ``x <- x + SiLU(W_jl x + b_jl)`` on the final hidden state,
  then its own LM head ``[V, H]`` (``lm_head="heads"``) or the base's output embedding
  (``lm_head="tied"``). ``W, b`` start at zero and own LM heads as copies of the base's output
  embedding, so before training every head predicts what head 1 predicts.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from latticedraft.errors import InputError, ModelError
from latticedraft.gpu.models import hf


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale, None


def scale_grad(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Identity in the forward pass; multiplies the gradient by ``scale`` in the backward pass."""
    return x if scale == 1.0 else _ScaleGrad.apply(x, scale)


class _SharedNorm(nn.Module):
    """The base's final norm used inside a head block without registering it twice.

    ``grad_scale`` (default 1: plain call, bit-identical) multiplies the gradient that the head
    sends into the norm's parameters (DynaMo's LR_MB / LR_B when the base is unfrozen).
    """

    def __init__(self, norm: nn.Module):
        super().__init__()
        self._norm = [norm]
        self.grad_scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = self._norm[0]
        if self.grad_scale == 1.0:
            return norm(x)
        params = {n: scale_grad(p, self.grad_scale) for n, p in norm.named_parameters()}
        return torch.func.functional_call(norm, params, (x,))


_ACTS = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU}


class SternHeads(nn.Module):
    """``num_extra`` Stern heads, head ``j``: ``z_j = x + W2_j act(W1_j x + b1_j) + b2_j``.

    The weights of all heads are stacked (``w1 [n, F, H]``, ``b1 [n, F]``, ``w2 [n, H, F]``,
    ``b2 [n, H]``; with ``token_input`` also ``u1 [n, F, H]``) so that every head runs in two
    batched matmuls, not 2n small ones. ``forward(hidden [..., H], count=None, next_tokens=None)
    -> [..., count, H]``: the first ``count`` heads (default all). ``next_tokens`` [...] (int64),
    for ``token_input`` heads only: the token after each position (default: the base's greedy
    token there, computed from ``hidden`` with the base's output embedding; ``attach(base)`` must
    have been called). Checkpoints keep one entry per head and layer (``heads.{j}.fc1.weight`` …,
    ``head_state_dict``); the initialisation is that of n pairs of ``nn.Linear`` with ``W2, b2``
    zeroed, drawn in that order from the RNG, then (``token_input``) n bias-free ``nn.Linear`` for ``U``.
    """

    def __init__(self, hidden: int, num_extra: int, ffn: int, act: str = "gelu", token_input: bool = False):
        super().__init__()
        if act not in _ACTS:
            raise ModelError(f"unknown head activation {act!r}; use one of {', '.join(_ACTS)}")
        self.ffn, self.act_name, self.token_input = ffn, act, bool(token_input)
        self.act = _ACTS[act]()
        w1, b1 = [], []
        for _ in range(num_extra):
            fc1, _fc2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)  # the RNG draws of two Linears
            w1.append(fc1.weight.detach())
            b1.append(fc1.bias.detach())
        self.w1 = nn.Parameter(torch.stack(w1))
        self.b1 = nn.Parameter(torch.stack(b1))
        self.w2 = nn.Parameter(torch.zeros(num_extra, hidden, ffn))
        self.b2 = nn.Parameter(torch.zeros(num_extra, hidden))
        if self.token_input:
            self.u1 = nn.Parameter(torch.stack([nn.Linear(hidden, ffn, bias=False).weight.detach()
                                                for _ in range(num_extra)]))
        self._io: list = []  # [input embedding, output embedding] of the base (not registered: the base owns them)

    def attach(self, base: nn.Module) -> None:
        """Read the next token's embedding (and the greedy token) with ``base``'s own embeddings."""
        self._io = [base.get_input_embeddings(), base.get_output_embeddings()]

    @property
    def num_extra(self) -> int:
        return int(self.w1.shape[0])

    def forward(self, hidden: torch.Tensor, count: int | None = None, next_tokens: torch.Tensor | None = None):
        n = self.num_extra if count is None else min(int(count), self.num_extra)
        lead, H = hidden.shape[:-1], hidden.shape[-1]
        x = hidden.reshape(1, -1, H).expand(n, -1, H)  # [n, M, H]
        z = torch.baddbmm(self.b1[:n, None, :], x, self.w1[:n].transpose(1, 2))  # [n, M, F]
        if self.token_input:
            z = z + torch.bmm(self.token_embedding(hidden, next_tokens).reshape(1, -1, H).expand(n, -1, H),
                              self.u1[:n].transpose(1, 2))
        out = torch.baddbmm(self.b2[:n, None, :], self.act(z), self.w2[:n].transpose(1, 2))  # [n, M, H]
        # [..., n, H] stored in that order, so that a projection of it is one matrix product
        return (x + out).transpose(0, 1).contiguous().view(*lead, n, H)

    def token_embedding(self, hidden: torch.Tensor, next_tokens: torch.Tensor | None) -> torch.Tensor:
        """``e(y)`` [..., H] of the token after each position: ``next_tokens`` or the base's greedy token
        (no gradient: the base's embedding is read, never trained through the heads)."""
        if not self._io:
            raise ModelError("token-input Stern heads need the base's embeddings: call attach(base) first")
        emb, lm = self._io
        with torch.no_grad():  # the base's embedding is read, never trained through the heads
            if next_tokens is None:
                next_tokens = lm(hidden).argmax(-1)
            return emb(next_tokens).to(hidden.dtype)

    def head_state_dict(self) -> dict[str, torch.Tensor]:
        """Per-head views of the stacked weights: copying into them loads a checkpoint."""
        out = {}
        for j in range(self.num_extra):
            out[f"heads.{j}.fc1.weight"], out[f"heads.{j}.fc1.bias"] = self.w1[j], self.b1[j]
            out[f"heads.{j}.fc2.weight"], out[f"heads.{j}.fc2.bias"] = self.w2[j], self.b2[j]
            if self.token_input:
                out[f"heads.{j}.fc1_token.weight"] = self.u1[j]
        return out


LM_HEADS = ("heads", "tied")


class MedusaHeads(nn.Module):
    """``num_extra`` Medusa heads: ``num_layers`` residual SiLU blocks each, then an LM head.

    Stacked weights: ``w [n, L, H, H]``, ``b [n, L, H]`` (absent with ``fc_bias=False``), and with
    ``lm_head="heads"`` ``lm [n, V, H]`` (None when tied to the base's output embedding).
    ``forward(hidden [..., H], count=None) -> [..., count, H]``: the states before the LM head
    of the first ``count`` heads. ``lm_weights(first, n) -> [n, V, H]`` or None (tied).
    ``logit_scale`` multiplies the heads' logits (vLLM's ``logit_scale``; 1 for heads trained here).
    Checkpoint names are vLLM's: ``blocks.{j}.layers.{l}.weight`` / ``.bias``, ``lm_heads.{j}.weight``.
    """

    def __init__(self, hidden: int, num_extra: int, num_layers: int = 1, lm_head: str = "heads",
                 fc_bias: bool = True, output_embedding: torch.Tensor | None = None, logit_scale: float = 1.0):
        super().__init__()
        if lm_head not in LM_HEADS:
            raise ModelError(f"unknown Medusa lm_head {lm_head!r}; use one of {', '.join(LM_HEADS)}")
        if not isinstance(num_layers, int) or num_layers < 0:
            raise InputError(f"--medusa-layers {num_layers}: a Medusa head needs 0 or more residual blocks")
        self.num_layers, self.lm_head, self.fc_bias = num_layers, lm_head, bool(fc_bias)
        self.logit_scale = float(logit_scale)
        self.w = nn.Parameter(torch.zeros(num_extra, num_layers, hidden, hidden))
        self.b = nn.Parameter(torch.zeros(num_extra, num_layers, hidden)) if fc_bias else None
        self.lm = None
        if lm_head == "heads":
            if output_embedding is None:
                raise ModelError("Medusa heads with their own LM heads start from the base's output embedding; pass it")
            self.lm = nn.Parameter(output_embedding.detach().float().clone()[None].repeat(num_extra, 1, 1))
        self.act = nn.SiLU()
        self._n = num_extra

    @property
    def num_extra(self) -> int:
        return self._n

    def forward(self, hidden: torch.Tensor, count: int | None = None) -> torch.Tensor:
        n = self.num_extra if count is None else min(int(count), self.num_extra)
        lead, H = hidden.shape[:-1], hidden.shape[-1]
        x = hidden.reshape(1, -1, H).expand(n, -1, H)  # [n, M, H]
        for layer in range(self.num_layers):
            w = self.w[:n, layer].transpose(1, 2)
            z = torch.bmm(x, w) if self.b is None else torch.baddbmm(self.b[:n, layer, None, :], x, w)
            x = x + self.act(z)
        return x.transpose(0, 1).contiguous().view(*lead, n, H)

    def lm_weights(self, first: int, n: int) -> torch.Tensor | None:
        """The own LM heads of heads ``first .. first+n-1`` (0-based among the extra heads): [n, V, H]; None if tied."""
        return None if self.lm is None else self.lm[first : first + n]

    def head_state_dict(self) -> dict[str, torch.Tensor]:
        """Per-head views of the stacked weights (vLLM's names): copying into them loads a checkpoint."""
        out = {}
        for j in range(self.num_extra):
            for layer in range(self.num_layers):
                out[f"blocks.{j}.layers.{layer}.weight"] = self.w[j, layer]
                if self.b is not None:
                    out[f"blocks.{j}.layers.{layer}.bias"] = self.b[j, layer]
            if self.lm is not None:
                out[f"lm_heads.{j}.weight"] = self.lm[j]
        return out


def _one_layer_config(config):
    cfg = copy.deepcopy(config)
    cfg.num_hidden_layers = 1
    types = getattr(cfg, "layer_types", None)
    if isinstance(types, (list, tuple)) and types:
        cfg.layer_types = [types[-1]]
    cfg.vocab_size = 1
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if hasattr(cfg, name):
            setattr(cfg, name, None)
    return cfg


class DynamoHeads(nn.Module):
    """``num_extra`` decoder-layer heads sharing the base's final norm.

    ``forward(stem [b, s, H], attention_mask, position_ids, caches, use_cache)`` returns
    ``(states [b, s, num_extra, H], caches)`` where ``caches`` is one HF ``Cache`` per head
    (``None`` when ``use_cache`` is false and none were given).
    """

    def __init__(self, base: nn.Module, num_extra: int):
        super().__init__()
        bb = hf.backbone(base)
        n = hf.num_layers(base.config)
        self.layers_name = hf.decoder_layers_name(bb, n)
        self.norm_name = hf.final_norm_name(bb)
        cfg = _one_layer_config(base.config)
        last = getattr(bb, self.layers_name)[n - 1].state_dict()
        p = next(base.parameters())
        blocks = []
        for _ in range(num_extra):
            head = type(bb)(cfg).to(device=p.device, dtype=p.dtype)
            getattr(head, self.layers_name)[0].load_state_dict(last)
            for m in head.modules():
                if isinstance(m, nn.Embedding):
                    nn.init.zeros_(m.weight)
                    m.weight.requires_grad_(False)
            blocks.append(head)
        self.blocks = nn.ModuleList(blocks)
        # Shared final norm: the base's own module, called through a wrapper that does not register it.
        shared = getattr(bb, self.norm_name)
        for head in self.blocks:
            setattr(head, self.norm_name, _SharedNorm(shared))

    def set_base_grad_scale(self, scale: float) -> None:
        """Scale the gradient the heads send into the shared final norm (see ``_SharedNorm``)."""
        for head in self.blocks:
            getattr(head, self.norm_name).grad_scale = scale

    def forward(self, stem: torch.Tensor, attention_mask=None, position_ids=None, caches=None, use_cache=False):
        if use_cache and caches is None:
            from transformers import DynamicCache

            caches = [DynamicCache(config=b.config) for b in self.blocks]
        outs = []
        for j, block in enumerate(self.blocks):
            o = block(inputs_embeds=stem, attention_mask=attention_mask, position_ids=position_ids,
                      use_cache=use_cache, **hf.cache_arg(None if caches is None else caches[j]))
            outs.append(o.last_hidden_state)
        return torch.stack(outs, dim=-2), caches

    def head_state_dict(self) -> dict[str, torch.Tensor]:
        """The trainable weights only: each head's decoder layer (not the shared norm, not the zero embeddings)."""
        out = {}
        for j, block in enumerate(self.blocks):
            for k, v in getattr(block, self.layers_name)[0].state_dict().items():
                out[f"blocks.{j}.{self.layers_name}.0.{k}"] = v
        return out

    def head_parameters(self):
        for block in self.blocks:
            yield from getattr(block, self.layers_name)[0].parameters()


def check_weight_transfer(base: nn.Module, heads: DynamoHeads) -> None:
    """Prove on a probe input that head layer ``j`` (still a copy) reproduces the base's final hidden state.

    Raises ``ModelError`` if the architecture's final hidden state is not ``final_norm(last_layer(stem))``.
    """
    n_pos = getattr(base.config, "max_position_embeddings", None) or getattr(base.config, "n_positions", 8)
    vocab = hf.model_vocab_size(base)
    p = next(base.parameters())
    ids = (torch.arange(min(8, int(n_pos)), device=p.device) * 7 + 1).remainder(vocab)[None]
    was_training = base.training, heads.training
    base.eval(), heads.eval()
    with torch.no_grad():
        hs = base(input_ids=ids, output_hidden_states=True).hidden_states
        got, _ = heads(hs[-2])
    base.train(was_training[0]), heads.train(was_training[1])
    for j in range(got.shape[-2]):
        if not torch.allclose(got[..., j, :].float(), hs[-1].float(), rtol=1e-4, atol=1e-4):
            raise ModelError(
                f"{type(base).__name__}: a copy of the final decoder layer run on the stem output does not "
                "reproduce the final hidden state, so DynaMo heads cannot be built on it; use --kind stern"
            )

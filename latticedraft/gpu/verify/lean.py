"""``LeanStack``: a decoder's forward written out over its own weights, for the verify step and
the self-draft.

A verify call on a small model is mostly per-call overhead: module hooks, wrappers, mask and
rotary preparation, cache objects. ``LeanStack`` runs the same arithmetic as transformers' layers
of the architectures in ``archs.ARCHS`` (GPT-2, LLaMA, Mistral: the same ops in the same order on
the same weights: norms, projections, rotary embedding, scaled-dot-product attention, MLP) with

- keys and values written straight into the preallocated ``kv.KVCache``;
- the rotary cos/sin of every position computed once (by the model's own rotary module) and
  gathered per call;
- a boolean attention mask [b, 1, n, K] (True = attend), or none where every cached slot is
  visible (one node, no padding, all inside the window), or ``masks.CAUSAL`` for a prompt into an
  empty cache without padding: attention's own causal kernel then, as transformers' SDPA attention
  runs such a prompt (with a mask it takes another kernel: 343 against 220 ms of SmolLM2's 926-token
  prefill on a 2-core CPU);
- any layer range (``lo..hi``): the split verifier continues from stored layer-l states;
- on small models (their projections copied side by side take at most ``FUSE_BYTES``), the q, k,
  v projections as one matmul and the MLP's gate and up projections as another, where this
  machine's matmul gives them bit for bit (checked once at construction, else run apart and put
  side by side); likewise the RMS norms as one ``F.rms_norm`` call each.

With ``scheme`` (``gpu.models.quantized.Scheme``) the stack is the model's own weights at 4 or 8
bits: every projection is a ``QuantizedLinear``'s product (the output projection in int8,
``quantized.OUTPUT``)
(``Quantized``: bfloat16 in and out; the residual stream, norms and attention stay in the
model's dtype), sharing the embeddings, norms and rotary tables: the self-draft
(``decoding/proposers/self_draft.py``). A projection whose widths
the scheme cannot hold falls back to int8, else keeps its float weights (``fallbacks`` says which
and why).

``supports(model)`` says whether a model's layers are written out here (``archs.arch_of``); others
go through transformers' forward. Tests compare hidden states and logits with transformers'
forward (``tests/gpu/verify/test_lean.py``).

    >>> stack = LeanStack(model)                        # doctest: +SKIP
    >>> cache = KVCache(batch=1, layers=stack.num_layers); start = cache.reserve(ids.shape[1])
    >>> h = stack.run(stack.embed(ids, pos), 0, stack.num_layers, None, pos, cache)
    >>> logits = stack.unembed(stack.norm(h))
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from latticedraft.gpu.models.layer_split import LayerSplit
from latticedraft.gpu.models.quantized import OUTPUT
from latticedraft.gpu.verify.archs import Arch, arch_of
from latticedraft.gpu.masks import CAUSAL
from latticedraft.memo import kept, weights_key

FUSE_BYTES = 64 << 20  # fuse the projections of models whose fused copies take at most this


def stack_for(model) -> "LeanStack":
    """``LeanStack(model)``, built once per model and weights and kept on the model (``memo.kept``): a
    decode call reuses it instead of fusing projections and tabling rotary positions again."""
    return kept(model, "verify", "stack", weights_key(model), lambda: LeanStack(model))


def supports(model) -> str | None:
    """None where ``LeanStack`` runs ``model`` (an HF causal LM or a wrapper with ``.base``), else why not."""
    return arch_of(getattr(model, "base", None) or model)[1]


# -- projections: x [.., K] -> [.., N] ----------------------------------------------------------------
class Dense:
    """``F.linear(x, w, b)``."""

    def __init__(self, w, b):
        self.w, self.b = w, b

    def __call__(self, x):
        return F.linear(x, self.w, self.b)


class DenseCast(Dense):
    """``Dense`` on inputs of any dtype (cast to the weights'): a quantized stack's float fallback."""

    def __call__(self, x):
        return F.linear(x.to(self.w.dtype), self.w, self.b)


class Conv1D:
    """GPT-2's ``Conv1D``: ``addmm(bias, x, weight)`` over the last dimension (weight [in, out])."""

    def __init__(self, w, b):
        self.w, self.b = w, b

    def __call__(self, x):
        out = torch.addmm(self.b, x.reshape(-1, x.shape[-1]), self.w)
        return out.view(*x.shape[:-1], out.shape[-1])


class Quantized:
    """A ``quantized.QuantizedLinear``'s product without the module's call machinery (a draft
    forward runs over a hundred of them): x [.., K] -> [.., N] in bfloat16 where the model's
    dtype is float32 (adding it to the residual stream keeps float32) or bfloat16, else in the
    model's dtype (float16: bfloat16 and float16 would add up to float32)."""

    def __init__(self, module, dtype: torch.dtype):
        self.module, self.mm, self.bias, self.n = module, module.product(), module.bias, module.out_features
        self.cast = None if dtype in (torch.float32, torch.bfloat16) else dtype

    def __call__(self, x):
        shape = x.shape
        y = self.mm(x.reshape(-1, shape[-1]).to(torch.bfloat16))
        if self.bias is not None:
            y = y + self.bias
        y = y.view(*shape[:-1], self.n)
        return y if self.cast is None else y.to(self.cast)

    def nbytes(self) -> int:
        return self.module.nbytes()


class SideBySide:
    """Several projections of one input run apart, their outputs concatenated."""

    def __init__(self, parts):
        self.parts = parts

    def __call__(self, x):
        return torch.cat([p(x) for p in self.parts], dim=-1)


@dataclass
class Norm:
    """A layer's norm: kind "rms" | "layer"; weight, bias (layer norm), eps; rms: the RMS function
    (``_fused_rms`` or ``_rms``, chosen by the stack)."""

    kind: str
    weight: torch.Tensor
    bias: torch.Tensor | None
    eps: float
    rms: object = None

    def __call__(self, h):
        if self.kind == "rms":
            return self.rms(h, self.weight, self.eps)
        return F.layer_norm(h, (h.shape[-1],), self.weight, self.bias, self.eps)


@dataclass
class LayerWeights:
    """One layer: norm1, qkv -> [.., (hq + 2 hk) d], o, norm2, up -> [.., 2 I] (gated: gate | up)
    or [.., I], down, act (a function), scaling (attention's)."""

    norm1: Norm
    qkv: object
    o: object
    norm2: Norm
    up: object
    down: object
    act: object
    scaling: float


class LeanStack:
    """The layers of ``model`` (see ``supports``), callable in ranges; ``scheme``: quantized
    projections (the self-draft), None: the model's own."""

    def __init__(self, model, scheme=None):
        why = supports(model)
        if why is not None:
            raise ValueError(f"LeanStack cannot run this model: {why}")
        self.split = LayerSplit(model)
        self.lm, self.config = self.split.lm, self.split.config
        self.arch: Arch = arch_of(self.lm)[0]
        self.scheme, self.fallbacks = scheme, []
        self.fused = None  # a fused_draft.FusedDraft running ``token_logits`` in one call (the self-draft sets it)
        self.num_layers, self.hidden = self.split.num_layers, self.split.hidden_size
        attn = getattr(self.split.layers[0], self.arch.attention)
        self.head_dim = int(attn.head_dim)
        self.heads = int(getattr(self.config, "num_attention_heads", None) or self.config.n_head)
        self.kv_heads = int(getattr(self.config, "num_key_value_heads", None) or self.heads)
        self.gqa = self.kv_heads != self.heads
        self.rotary = self.arch.positions == "rotary"
        self.fuse = sum(m.weight.numel() * m.weight.element_size() for L in self.split.layers
                        for m in _all_projections(self.arch, L)) <= FUSE_BYTES
        self.weights = [self._layer_weights(i, L) for i, L in enumerate(self.split.layers)]
        if self.arch.norm == "rms":
            rms = _fused_rms if scheme is not None else self._choose_rms()  # (drafts need no bit-for-bit norm)
            for w in self.weights:
                w.norm1.rms = w.norm2.rms = rms
        self.final = _norm_of(self.arch, self.split.norm)
        self.final.rms = self.weights[0].norm1.rms if self.weights else _rms
        self.unembed = self.split.head if scheme is None else self._quantized(self.split.head.weight, None, "lm_head",
                                                                              OUTPUT)
        self.cos = self.sin = None
        if self.rotary:  # every position's rotary cos/sin, from the model's own module
            p = self.split.position_limit or 4096
            pos = torch.arange(p, device=self.split.device)[None]
            x = torch.zeros(1, 1, 1, dtype=self.split.dtype, device=self.split.device)
            cos, sin = self.split.rotary(x, position_ids=pos)
            self.cos, self.sin = cos[0], sin[0]  # [P, head_dim]

    # -- building -------------------------------------------------------------------------
    def _layer_weights(self, i: int, L) -> LayerWeights:
        a = self.arch
        attn, mlp = getattr(L, a.attention), getattr(L, a.mlp)
        n1, n2 = (_norm_of(a, getattr(L, n)) for n in a.norms)
        act = F.silu if a.act == "silu" else getattr(mlp, a.act)
        qkv = self._projection([getattr(attn, n) for n in a.qkv], f"layer {i} {'/'.join(a.qkv)}")
        up = self._projection([getattr(mlp, n) for n in a.up], f"layer {i} {'/'.join(a.up)}")
        o = self._projection([getattr(attn, a.o)], f"layer {i} {a.o}")
        down = self._projection([getattr(mlp, a.down)], f"layer {i} {a.down}")
        return LayerWeights(n1, qkv, o, n2, up, down, act, float(attn.scaling))

    def _projection(self, modules: list, name: str):
        """One projection of the modules' outputs side by side: quantized (``scheme``), one fused
        matmul (small models, where bit for bit), or each module's own."""
        if self.arch.conv1d:  # [in, out] weights
            ws, bs = [m.weight for m in modules], [m.bias for m in modules]
            if self.scheme is not None:
                return self._quantized(torch.cat([w.t() for w in ws]), _cat(bs), name)
            parts = [Conv1D(w, b) for w, b in zip(ws, bs)]
            return parts[0] if len(parts) == 1 else SideBySide(parts)
        ws, bs = [m.weight for m in modules], [m.bias for m in modules]
        if self.scheme is not None:
            return self._quantized(torch.cat(ws), _cat(bs), name)
        if len(modules) == 1:
            return Dense(ws[0], bs[0])
        if self.fuse:
            fused = Dense(torch.cat(ws).contiguous(), _cat(bs))
            if _same_bits(fused, [Dense(w, b) for w, b in zip(ws, bs)], self.hidden, ws[0]):
                return fused
        return SideBySide([Dense(w, b) for w, b in zip(ws, bs)])

    def _quantized(self, w: torch.Tensor, b, name: str, first=None):
        """``w`` [N, K] (+ b) in ``first`` (default the stack's scheme); else int8, else float (each
        fallback recorded)."""
        from latticedraft.gpu.models.quantized import Scheme, quantize

        first = first or self.scheme
        for scheme in (first, Scheme("int8")):
            why = scheme.fits(*w.shape)
            if why is None:
                if scheme != first:
                    self.fallbacks.append(f"{name}: {first.kind} cannot hold it ({self._why}), int8 instead")
                return Quantized(quantize(w, b, scheme), self.split.dtype)
            self._why = why
        self.fallbacks.append(f"{name}: neither {first.kind} nor int8 can hold it ({self._why}); float weights")
        return DenseCast(w, b)

    def _choose_rms(self):
        """``F.rms_norm`` (one op) where this machine gives transformers' RMSNorm arithmetic bit for
        bit with it on every norm's weights (checked once), else ``_rms`` (the same ops written out)."""
        norms = [n for w in self.weights for n in (w.norm1, w.norm2)] + [_norm_of(self.arch, self.split.norm)]
        g = torch.Generator(device="cpu").manual_seed(0)
        for rows in (1, 3, 16):
            x = (3 * torch.randn(2, rows, self.hidden, generator=g)).to(self.split.dtype).to(self.split.device)
            if not all(torch.equal(_fused_rms(x, n.weight, n.eps), _rms(x, n.weight, n.eps)) for n in norms):
                return _rms
        return _fused_rms

    # -- running --------------------------------------------------------------------------
    def embed(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """ids int64[b, n], pos int64[b, n] -> hidden [b, n, H]."""
        return self.split.embed(ids, pos)

    def norm(self, h: torch.Tensor) -> torch.Tensor:
        """The final norm: [.., H] -> [.., H]."""
        return self.final(h)

    def nbytes(self) -> int:
        """Bytes of quantized weights this stack holds beside the model's (0 without ``scheme``)."""
        mods = [p for w in self.weights for p in (w.qkv, w.o, w.up, w.down)] + [self.unembed]
        return sum(m.nbytes() for m in mods if hasattr(m, "nbytes"))

    def run(self, h: torch.Tensor, lo: int, hi: int, mask: torch.Tensor | str | None, pos: torch.Tensor,
            cache) -> torch.Tensor:
        """Layers ``lo..hi-1`` on h [b, n, H] at positions pos int64[b, n]; mask bool[b, 1, n, K]
        (K = the cache's slots after ``cache.reserve(n)``; None: every slot visible; ``CAUSAL``: K = n
        and token i sees slots 0..i); each layer's keys and values go to ``cache.write(layer -
        cache.first_layer, ...)``. A boolean mask is turned once into the additive one (0 or -inf)
        that attention would make of it in every layer."""
        if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=h.dtype, device=h.device).masked_fill_(~mask, float("-inf"))
        cos = sin = None
        if self.rotary:
            cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]  # [b, 1, n, head_dim]
        for i in range(lo, hi):
            h = self._layer(i, h, mask, cos, sin, cache)
        return h

    def token_logits(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None, cache) -> torch.Tensor:
        """One token per row through every layer and the output projection: ids x int64[b, 1] at
        positions pos int64[b, 1], after ``cache.reserve(1)``; mask bool[b, 1, 1, K] (K = cache.end) or
        None (every slot) -> logits float32[b, V]. Through ``fused`` where set, else op by op."""
        if self.fused is not None and cache.store.dtype == torch.float32:  # (the kernels read a float32 cache)
            return self.fused(self.embed(x, pos)[:, 0], pos[:, 0], cache, None if mask is None else mask[:, 0, 0])
        return self.unembed(self.norm(self.run(self.embed(x, pos), 0, self.num_layers, mask, pos, cache)[:, -1])).float()

    def _layer(self, i, h, mask, cos, sin, cache):
        w = self.weights[i]
        b, n, _ = h.shape
        hq, hk = self.heads, self.kv_heads
        qkv = w.qkv(w.norm1(h)).view(b, n, hq + 2 * hk, self.head_dim).transpose(1, 2)
        if cos is None:
            q, k = qkv[:, :hq], qkv[:, hq: hq + hk]
        else:  # q and k side by side: one rotary embedding for both (the same elementwise ops)
            qk = qkv[:, : hq + hk]
            qk = qk * cos + _rotate_half(qk) * sin
            q, k = qk[:, :hq], qk[:, hq:]
        o = self._attend(i, q, k, qkv[:, hq + hk:], mask, cache, w.scaling).transpose(1, 2).reshape(b, n, -1)
        h = h + w.o(o)
        x = w.up(w.norm2(h))
        if self.arch.gated:
            gate, up = x.chunk(2, dim=-1)
            x = w.act(gate) * up
        else:
            x = w.act(x)
        return h + w.down(x)

    def _attend(self, i, q, k, v, mask, cache, scale):
        K, V = cache.write(i - cache.first_layer, k, v)
        q = q.to(K.dtype)
        if mask is CAUSAL:
            return F.scaled_dot_product_attention(q, K, V, is_causal=True, scale=scale, enable_gqa=self.gqa)
        return F.scaled_dot_product_attention(q, K, V, attn_mask=mask, scale=scale, enable_gqa=self.gqa)


@torch.inference_mode()
def token_seconds(stack: LeanStack, other: LeanStack, context: int = 64, repeats: int = 9) -> float:
    """How long one token's forward through ``stack`` takes against ``other``'s (output projection
    included, batch 1, after ``context`` cached tokens): the median over ``repeats`` of the ratio
    of the two, timed back to back (so a busy machine slows both alike), after two untimed rounds.
    Both read a cache ``other`` wrote, as a self-draft reads the verifier's."""
    import time

    from latticedraft.gpu.verify.kv import KVCache

    def prepared(st):
        dev = st.split.device
        cache = KVCache(1, st.num_layers, dev)
        ids = torch.arange(1, context + 1, device=dev)[None] % int(st.config.vocab_size)
        pos = torch.arange(context, device=dev)[None]
        cache.reserve(context)
        other.run(other.embed(ids, pos), 0, other.num_layers, CAUSAL, pos, cache)
        cache.append_valid(np.ones((1, context), dtype=bool), pos.cpu().numpy())
        x, p = ids[:, -1:], torch.full((1, 1), context, device=dev)

        def one() -> float:
            t0 = time.perf_counter()
            cache.reserve(1)
            st.token_logits(x, p, None, cache)
            cache.truncate(context)
            return time.perf_counter() - t0

        return one

    a, b = prepared(stack), prepared(other)
    ratios = [a() / b() for _ in range(repeats + 2)]
    return float(np.median(ratios[2:]))


def _norm_of(arch: Arch, module) -> Norm:
    eps = getattr(module, "variance_epsilon", None)
    if eps is None:
        eps = getattr(module, "eps")
    return Norm(arch.norm, module.weight, getattr(module, "bias", None), float(eps))


def _all_projections(arch: Arch, L) -> list:
    attn, mlp = getattr(L, arch.attention), getattr(L, arch.mlp)
    return [getattr(attn, n) for n in arch.qkv] + [getattr(mlp, n) for n in arch.up]


def _cat(bs: list):
    return None if bs[0] is None else torch.cat(bs).contiguous()


def _same_bits(fused: Dense, alone: list, hidden: int, ref: torch.Tensor) -> bool:
    """Whether this machine's matmul gives the fused projection's outputs bit for bit with the
    separate ones (1, 3 and 16 rows)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    for rows in (1, 3, 16):
        x = torch.randn(1, rows, hidden, generator=g).to(ref.dtype).to(ref.device)
        if not torch.equal(fused(x), torch.cat([a(x) for a in alone], dim=-1)):
            return False
    return True


def _rms(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LLaMA/Mistral RMSNorm, op for op."""
    x = h.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(h.dtype)


def _fused_rms(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``_rms`` as one ``F.rms_norm`` call (float32 inputs only: ``_rms`` normalises in float32)."""
    if h.dtype != torch.float32 or weight.dtype != torch.float32:
        return _rms(h, weight, eps)
    return F.rms_norm(h, (h.shape[-1],), weight, eps)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

"""``LeanStack``: a decoder's forward written out over its own weights, for the verify step.

A verify call on a small model is mostly per-call overhead: module hooks, wrappers, mask and
rotary preparation, cache objects. ``LeanStack`` runs the same arithmetic as transformers' GPT-2,
LLaMA and Mistral layers (the same ops in the same order on the same weights: layer norms,
projections, rotary embedding, scaled-dot-product attention, MLP) with

- keys and values written straight into the preallocated ``kv.KVCache``;
- the rotary cos/sin of every position computed once (by the model's own rotary module) and
  gathered per call;
- a boolean attention mask [b, 1, n, K] (True = attend), or none where every cached slot is
  visible (one node, no padding, all inside the window), or ``masks.CAUSAL`` for a prompt into an empty
  cache without padding: attention's own causal kernel then, as transformers' SDPA attention runs
  such a prompt (with a mask it takes another kernel: 343 against 220 ms of SmolLM2's 926-token
  prefill on a 2-core CPU);
- any layer range (``lo..hi``): the split verifier continues from stored layer-l states;
- on small models (their projections copied side by side take at most ``FUSE_BYTES``), the q, k,
  v projections as one matmul and the MLP's gate and up projections as another, where this
  machine's matmul gives them bit for bit (checked once at construction, else left apart);
  likewise the RMS norms as one ``F.rms_norm`` call each.

``supports(model)`` says whether a model's layers are of a shape written out here (plain RoPE,
no logit transforms, eager or sdpa attention); other models go through transformers' forward.
Tests compare hidden states and logits with transformers' forward (``tests/gpu/verify/test_lean.py``).

    >>> stack = LeanStack(model)                        # doctest: +SKIP
    >>> cache = KVCache(batch=1, layers=stack.num_layers); start = cache.reserve(ids.shape[1])
    >>> h = stack.run(stack.embed(ids, pos), 0, stack.num_layers, None, pos, cache)
    >>> logits = stack.unembed(stack.norm(h))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from latticedraft.gpu.models.layer_split import LayerSplit
from latticedraft.gpu.verify.masks import CAUSAL
from latticedraft.memo import kept, weights_key

FUSE_BYTES = 64 << 20  # fuse the projections of models whose fused copies take at most this


def stack_for(model) -> "LeanStack":
    """``LeanStack(model)``, built once per model and weights and kept on the model (``memo.kept``): a
    decode call reuses it instead of fusing projections and tabling rotary positions again."""
    return kept(model, "verify", "stack", weights_key(model), lambda: LeanStack(model))


def supports(model) -> str | None:
    """None where ``LeanStack`` runs ``model`` (an HF causal LM or a wrapper with ``.base``), else why not."""
    lm = getattr(model, "base", None) or model
    cfg = lm.config
    arch = getattr(cfg, "model_type", "")
    if arch not in ("gpt2", "llama", "mistral"):
        return f"{arch or type(lm).__name__} layers are not written out (GPT-2, LLaMA and Mistral are)"
    if (getattr(cfg, "_attn_implementation", None) or "eager") not in ("eager", "sdpa"):
        return f"attention implementation {cfg._attn_implementation!r}"
    if arch == "gpt2":
        if getattr(cfg, "reorder_and_upcast_attn", False) or getattr(cfg, "add_cross_attention", False):
            return "GPT-2 with reordered/upcast or cross attention"
        return None
    rot = getattr(lm.model, "rotary_emb", None)
    if rot is None or getattr(rot, "rope_type", "default") != "default":
        return f"rope type {getattr(rot, 'rope_type', None)!r}"
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "pretraining_tp", 1) != 1:
        return f"activation {cfg.hidden_act!r} / tensor-parallel {getattr(cfg, 'pretraining_tp', 1)}"
    return None


class LeanStack:
    """The layers of ``model`` (GPT-2, LLaMA or Mistral; see ``supports``), callable in ranges."""

    def __init__(self, model):
        why = supports(model)
        if why is not None:
            raise ValueError(f"LeanStack cannot run this model: {why}")
        self.split = LayerSplit(model)
        self.lm, self.config = self.split.lm, self.split.config
        self.gpt2 = self.config.model_type == "gpt2"
        self.num_layers, self.hidden = self.split.num_layers, self.split.hidden_size
        self.layers = list(self.split.layers)
        attn = self.layers[0].attn if self.gpt2 else self.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.heads = int(self.config.num_attention_heads if not self.gpt2 else self.config.n_head)
        self.kv_heads = int(getattr(self.config, "num_key_value_heads", None) or self.heads)
        self.scaling = [float((L.attn if self.gpt2 else L.self_attn).scaling) for L in self.layers]
        self.gqa = self.kv_heads != self.heads
        self.params = [self._gpt2_params(L) if self.gpt2 else self._llama_params(L) for L in self.layers]
        self.fused = None if self.gpt2 else self._fuse()
        self.rms = None if self.gpt2 else self._choose_rms()
        self.cos = self.sin = None
        if not self.gpt2:  # every position's rotary cos/sin, from the model's own module
            p = self.split.position_limit or 4096
            pos = torch.arange(p, device=self.split.device)[None]
            x = torch.zeros(1, 1, 1, dtype=self.split.dtype, device=self.split.device)
            cos, sin = self.split.rotary(x, position_ids=pos)
            self.cos, self.sin = cos[0], sin[0]  # [P, head_dim]

    def embed(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """ids int64[b, n], pos int64[b, n] -> hidden [b, n, H]."""
        return self.split.embed(ids, pos)

    def norm(self, h: torch.Tensor) -> torch.Tensor:
        """The final norm: [.., H] -> [.., H]."""
        if self.rms is None:
            return self.split.norm(h)
        return self.rms(h, self.split.norm.weight, self.split.norm.variance_epsilon)

    @property
    def unembed(self) -> nn.Module:
        """The output projection (the LM head): [.., H] -> [.., V]."""
        return self.split.head

    def run(self, h: torch.Tensor, lo: int, hi: int, mask: torch.Tensor | str | None, pos: torch.Tensor,
            cache) -> torch.Tensor:
        """Layers ``lo..hi-1`` on h [b, n, H] at positions pos int64[b, n]; mask bool[b, 1, n, K]
        (K = the cache's slots after ``cache.reserve(n)``; None: every slot visible; ``CAUSAL``: K = n
        and token i sees slots 0..i); each layer's keys and values go to ``cache.write(layer -
        cache.first_layer, ...)``. A boolean mask is turned once into the additive one (0 or -inf)
        that attention would make of it in every layer."""
        if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=h.dtype, device=h.device).masked_fill_(~mask, float("-inf"))
        if self.gpt2:
            for i in range(lo, hi):
                h = self._gpt2_layer(i, h, mask, cache)
            return h
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]  # [b, 1, n, head_dim]
        for i in range(lo, hi):
            h = self._llama_layer(i, h, mask, cos, sin, cache)
        return h

    @staticmethod
    def _llama_params(L) -> tuple:
        """One layer's tensors, looked up once (module attribute access costs per call)."""
        at, mlp = L.self_attn, L.mlp
        return (L.input_layernorm.weight, L.input_layernorm.variance_epsilon,
                at.q_proj.weight, at.q_proj.bias, at.k_proj.weight, at.k_proj.bias, at.v_proj.weight, at.v_proj.bias,
                at.o_proj.weight, at.o_proj.bias, L.post_attention_layernorm.weight,
                L.post_attention_layernorm.variance_epsilon, mlp.gate_proj.weight, mlp.gate_proj.bias,
                mlp.up_proj.weight, mlp.up_proj.bias, mlp.down_proj.weight, mlp.down_proj.bias)

    def _fuse(self) -> list | None:
        """Per layer (Wqkv, bqkv, q/k/v sizes, Wgu, bgu, gate size), or None when the copies would be
        too big or this machine's matmul does not give the fused outputs bit for bit."""
        size = sum(p.numel() * p.element_size() for L in self.params for p in L[2:8:2] + L[12:16:2])
        if size > FUSE_BYTES:
            return None
        fused = []
        for (_, _, wq, bq, wk, bk, wv, bv, _, _, _, _, wg, bg, wu, bu, _, _) in self.params:
            cat = lambda ws: None if ws[0] is None else torch.cat(ws).contiguous()  # noqa: E731
            fused.append((cat([wq, wk, wv]), cat([bq, bk, bv]), [wq.shape[0], wk.shape[0], wv.shape[0]],
                          cat([wg, wu]), cat([bg, bu]), [wg.shape[0], wu.shape[0]]))
        g = torch.Generator(device="cpu").manual_seed(0)
        for rows in (1, 3, 16):
            x = torch.randn(1, rows, self.hidden, generator=g).to(self.split.dtype).to(self.split.device)
            for (_, _, wq, bq, wk, bk, wv, bv, _, _, _, _, wg, bg, wu, bu, _, _), (wa, ba, sa, wb, bb, sb) in zip(
                    self.params, fused):
                parts = F.linear(x, wa, ba).split(sa, dim=-1) + F.linear(x, wb, bb).split(sb, dim=-1)
                alone = [F.linear(x, w, b) for w, b in ((wq, bq), (wk, bk), (wv, bv), (wg, bg), (wu, bu))]
                if not all(torch.equal(a, b) for a, b in zip(parts, alone)):
                    return None
        return fused

    def _choose_rms(self):
        """``F.rms_norm`` (one op) where this machine gives transformers' RMSNorm arithmetic bit for
        bit with it on every norm's weights (checked once), else ``_rms`` (the same ops written out)."""
        final = self.split.norm
        norms = [(L[0], L[1]) for L in self.params] + [(L[10], L[11]) for L in self.params]
        norms.append((final.weight, final.variance_epsilon))
        g = torch.Generator(device="cpu").manual_seed(0)
        for rows in (1, 3, 16):
            x = (3 * torch.randn(2, rows, self.hidden, generator=g)).to(self.split.dtype).to(self.split.device)
            if not all(torch.equal(_fused_rms(x, w, eps), _rms(x, w, eps)) for w, eps in norms):
                return _rms
        return _fused_rms

    @staticmethod
    def _gpt2_params(L) -> tuple:
        at, mlp = L.attn, L.mlp
        return (L.ln_1.weight, L.ln_1.bias, L.ln_1.eps, at.c_attn.weight, at.c_attn.bias, at.c_proj.weight,
                at.c_proj.bias, L.ln_2.weight, L.ln_2.bias, L.ln_2.eps, mlp.c_fc.weight, mlp.c_fc.bias,
                mlp.c_proj.weight, mlp.c_proj.bias, mlp.act)

    def _attend(self, i, q, k, v, mask, cache):
        K, V = cache.write(i - cache.first_layer, k, v)
        if mask is CAUSAL:
            return F.scaled_dot_product_attention(q, K, V, is_causal=True, scale=self.scaling[i], enable_gqa=self.gqa)
        return F.scaled_dot_product_attention(q, K, V, attn_mask=mask, scale=self.scaling[i], enable_gqa=self.gqa)

    def _llama_layer(self, i, h, mask, cos, sin, cache):
        (w_in, eps_in, wq, bq, wk, bk, wv, bv, wo, bo, w_post, eps_post, wg, bg, wu, bu, wd, bd) = self.params[i]
        b, n, _ = h.shape
        x = self.rms(h, w_in, eps_in)
        hq, hk, d = self.heads, self.kv_heads, self.head_dim
        if self.fused is None:
            q = F.linear(x, wq, bq).view(b, n, hq, d).transpose(1, 2)
            k = F.linear(x, wk, bk).view(b, n, hk, d).transpose(1, 2)
            v = F.linear(x, wv, bv).view(b, n, hk, d).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        else:  # q and k side by side: one rotary embedding for both (the same elementwise ops)
            wa, ba = self.fused[i][:2]
            qkv = F.linear(x, wa, ba).view(b, n, hq + 2 * hk, d).transpose(1, 2)
            qk = qkv[:, : hq + hk]
            qk = qk * cos + _rotate_half(qk) * sin
            q, k, v = qk[:, :hq], qk[:, hq:], qkv[:, hq + hk:]
        o = self._attend(i, q, k, v, mask, cache).transpose(1, 2).reshape(b, n, -1)
        h = h + F.linear(o, wo, bo)
        x = self.rms(h, w_post, eps_post)
        if self.fused is None:
            gate, up = F.linear(x, wg, bg), F.linear(x, wu, bu)
        else:
            wb, bb, sb = self.fused[i][3:]
            gate, up = F.linear(x, wb, bb).split(sb, dim=-1)
        return h + F.linear(F.silu(gate) * up, wd, bd)

    def _gpt2_layer(self, i, h, mask, cache):
        (w1, b1, e1, wa, ba, wp, bp, w2, b2, e2, wf, bf, wc, bc, act) = self.params[i]
        b, n, H = h.shape
        x = F.layer_norm(h, (H,), w1, b1, e1)
        q, k, v = _conv1d(x, wa, ba).split(H, dim=2)
        q = q.view(b, n, -1, self.head_dim).transpose(1, 2)
        k = k.view(b, n, -1, self.head_dim).transpose(1, 2)
        v = v.view(b, n, -1, self.head_dim).transpose(1, 2)
        o = self._attend(i, q, k, v, mask, cache).transpose(1, 2).reshape(b, n, -1)
        h = h + _conv1d(o, wp, bp)
        x = F.layer_norm(h, (H,), w2, b2, e2)
        return h + _conv1d(act(_conv1d(x, wf, bf)), wc, bc)


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


def _conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """GPT-2's ``Conv1D``: ``addmm(bias, x, weight)`` over the last dimension."""
    out = torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight)
    return out.view(*x.shape[:-1], out.shape[-1])

"""The architectures the lean forward path writes out (``lean.LeanStack``): one entry each.

An entry names where a decoder layer keeps its weights and says how the layer computes: the norm
(RMS or layer norm), the positions (rotary, applied to q and k, or learned, added at the
embedding), the projections that make q, k and v (three, or GPT-2's one joint ``c_attn``), the MLP
(gated: ``act(gate) * up``, or plain: ``act(fc)``) and its activation. Every entry computes one
layer as

    x = norm1(h);  q, k, v = qkv(x);  [rotary on q, k];  h = h + o(attention(q, k, v))
    x = norm2(h);  h = h + down(act(gate(x)) * up(x))   (plain MLP: down(act(fc(x))))

the same ops in the same order as transformers' own layers of that type, so the lean path's
logits equal transformers' (tests/gpu/verify/test_lean.py). Adding an architecture whose layers
have this shape is one ``ARCHS`` entry (its ``check`` refuses the configurations it does not
write out) and one case in that test.

    >>> ARCHS["llama"].gated, ARCHS["gpt2"].joint_qkv
    (True, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Arch:
    """norm: "rms" | "layer"; positions: "rotary" | "learned"; attention / mlp: the attribute of a
    layer holding the attention / MLP module; qkv: the projections (attributes of the attention
    module) whose outputs, side by side, are [q | k | v]; o: the attention's output projection;
    up: the MLP's input projections ([gate, up], or [fc]); down: its output projection; norms:
    the layer's two norms (before attention, before the MLP); act: "silu" (``F.silu``) or the
    attribute of the MLP holding its activation module; conv1d: the weights are stored [in, out]
    (GPT-2's ``Conv1D``, computed as ``addmm(bias, x, W)``); check(config, lm) -> None where the
    lean path computes this configuration as transformers does, else why not."""

    norm: str
    positions: str
    attention: str
    qkv: tuple
    o: str
    mlp: str
    up: tuple
    down: str
    norms: tuple
    act: str
    check: Callable
    conv1d: bool = False

    @property
    def gated(self) -> bool:
        return len(self.up) == 2

    @property
    def joint_qkv(self) -> bool:
        return len(self.qkv) == 1


def _llama_check(cfg, lm) -> str | None:
    rot = getattr(getattr(lm, "model", None), "rotary_emb", None)
    if rot is None or getattr(rot, "rope_type", "default") != "default":
        return f"rope type {getattr(rot, 'rope_type', None)!r}"
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "pretraining_tp", 1) != 1:
        return f"activation {cfg.hidden_act!r} / tensor-parallel {getattr(cfg, 'pretraining_tp', 1)}"
    return None


def _gpt2_check(cfg, lm) -> str | None:
    if getattr(cfg, "reorder_and_upcast_attn", False) or getattr(cfg, "add_cross_attention", False):
        return "GPT-2 with reordered/upcast or cross attention"
    return None


LLAMA = Arch(norm="rms", positions="rotary", attention="self_attn", qkv=("q_proj", "k_proj", "v_proj"), o="o_proj",
             mlp="mlp", up=("gate_proj", "up_proj"), down="down_proj",
             norms=("input_layernorm", "post_attention_layernorm"), act="silu", check=_llama_check)

ARCHS = {  # config.model_type -> its layers
    "llama": LLAMA,
    "mistral": LLAMA,
    "qwen2": LLAMA,  # (biased q, k, v projections: the projections carry their biases)
    "gpt2": Arch(norm="layer", positions="learned", attention="attn", qkv=("c_attn",), o="c_proj", mlp="mlp",
                 up=("c_fc",), down="c_proj", norms=("ln_1", "ln_2"), act="act", check=_gpt2_check, conv1d=True),
}


def arch_of(lm) -> tuple[Arch | None, str | None]:
    """(the entry, None) for an HF causal LM the lean path writes out, else (None, why not)."""
    cfg = lm.config
    name = getattr(cfg, "model_type", "")
    arch = ARCHS.get(name)
    if arch is None:
        return None, (f"{name or type(lm).__name__} layers are not written out "
                      f"(the lean path writes out {', '.join(sorted(ARCHS))})")
    if (getattr(cfg, "_attn_implementation", None) or "eager") not in ("eager", "sdpa"):
        return None, f"attention implementation {cfg._attn_implementation!r}"
    why = arch.check(cfg, lm)
    return (None, why) if why else (arch, None)


def config_support(config: dict) -> str | None:
    """What ``arch_of`` can tell from a model's config.json alone (before its weights load): None
    where its ``model_type`` has an entry and its activation is the entry's, else why not (the
    loaded model's own check, ``arch_of``, still runs)."""
    name = config.get("model_type", "") if isinstance(config, dict) else ""
    if name not in ARCHS:
        return f"{name or 'its'} layers are not written out (the lean path writes out {', '.join(sorted(ARCHS))})"
    if ARCHS[name].act == "silu" and config.get("hidden_act", "silu") != "silu":
        return f"activation {config['hidden_act']!r}"
    return None

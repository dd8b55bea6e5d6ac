"""Weight-only quantized projections: the target's own weights at 4 or 8 bits, for self-drafting.

``quantize(weight, bias, scheme)`` turns a float projection ``y = x W^T + b`` (W float[N, K]) into
a module that computes it from low-bit weights with torch's weight-only kernels:

- ``int4`` (default): groups of ``group`` (32) consecutive weights along K, asymmetric
  round-to-nearest: per group a scale ``s = (max - min) / 15`` and ``q = round((w - min) / s)`` in
  0..15, so ``w ~ q * s + min``; packed by ``aten._convert_weight_to_int4pack_for_cpu`` and run by
  ``aten._weight_int4pack_mm_for_cpu`` (CUDA: ``_convert_weight_to_int4pack`` /
  ``_weight_int4pack_mm``), which read the group's (scale, zero) as ``w = (q - 8) * s + zero``, so
  ``zero = min + 8 s``. Needs N % 16 == 0 and K % group == 0, group in 32, 64, 128, 256.
- ``int8``: per output channel, symmetric: ``s = max |w| / 127``, ``q = round(w / s)`` in
  -127..127, run by ``aten._weight_int8pack_mm``. Needs K % 16 == 0 (the CPU kernel reads K in
  blocks of 16; other widths crash it, so they are refused here).

Both kernels take bfloat16 activations (float32 ones run a slow reference path: 83 against 2.8 ms
for SmolLM2's 210 layer products at one row on a 2-core AVX512-BF16 CPU), accumulate in float32
and round the output to bfloat16. So for an input row x the output differs from the float
product by at most (``error_bound``, checked in tests/gpu/models/test_quantized.py)

    |y - x W^T| <= sum_k |x_k| e_k  +  sum_k |x_k - bf16(x_k)| |w~_k|  +  2^-8 |y~|  +  K 2^-23 sum_k |x_k w~_k|

with e_k the weight's rounding error (at most s/2 of its group or channel), w~ the de-quantized
weight and y~ the exact product of bf16(x) and w~: quantization, the input's rounding, the
output's rounding and the float32 accumulation; a bias b, added in bfloat16, adds
``2^-8 (1 + 2^-7) (|y~| + 2 |b|)`` (its own rounding and the sum's).

The output projection is quantized per channel in int8 whatever the layers' scheme
(``OUTPUT``): on SmolLM2-135M an int4 one (groups of 32) left the copy's argmax equal to the
float model's at 90.0% of 360 answer positions of Spec-Bench first turns, int8 at 98.6% (float32:
99.4%, at 6.7 against 0.5 ms a row; benchmarks/quantized_draft.py).

``quantized_copy(model)`` is an HF causal LM sharing the target's embeddings, norms and rotary
tables and holding these modules in place of every ``nn.Linear`` (GPT-2's ``Conv1D`` too) and the
output projection: the self-draft as transformers runs it (HF assisted generation's
``assistant_model``, the fair peer in benchmarks/spec_bench.py).

    >>> q = quantize(layer.weight, layer.bias, Scheme("int4"))      # doctest: +SKIP
    >>> y = q(x)                                                    # [.., N], x's dtype
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass

import torch
from torch import nn

from latticedraft.errors import ModelError

KINDS = ("int4", "int8")
INT4_GROUPS = (32, 64, 128, 256)
INT8_BLOCK = 16  # the CPU int8 kernel reads K in blocks of this


@dataclass(frozen=True)
class Scheme:
    """kind: "int4" (groupwise, ``group`` weights per scale) or "int8" (per output channel)."""

    kind: str = "int4"
    group: int = 32

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ModelError(f"quantization {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.kind == "int4" and self.group not in INT4_GROUPS:
            raise ModelError(f"int4 group size {self.group}: torch's int4 kernel takes {INT4_GROUPS}")

    def fits(self, n: int, k: int) -> str | None:
        """None where a [n, k] weight runs in this scheme, else why not."""
        if self.kind == "int4":
            if n % 16:
                return f"{n} output rows are not a multiple of 16"
            if k % self.group:
                return f"{k} inputs are not a multiple of the group size {self.group}"
            return None
        return None if k % INT8_BLOCK == 0 else f"{k} inputs are not a multiple of {INT8_BLOCK}"


OUTPUT = Scheme("int8")  # the output projection's scheme (module doc)


def kernels_missing(device) -> str | None:
    """None where this torch build has the weight-only kernels for ``device``, else a line naming
    the build and what to install."""
    dev = torch.device(device)
    names = (("_weight_int4pack_mm", "_convert_weight_to_int4pack") if dev.type == "cuda" else
             ("_weight_int4pack_mm_for_cpu", "_convert_weight_to_int4pack_for_cpu")) + ("_weight_int8pack_mm",)
    lacking = [n for n in names if not has_op(n)]
    if not lacking:
        return None
    return (f"torch {torch.__version__} has no {', '.join(lacking)} for {dev.type}; install torch >= 2.6 "
            "(pyproject pins torch==2.13.0: bash scripts/setup.sh)")


def has_op(name: str) -> bool:
    """Whether this torch build registers ``aten::<name>``."""
    return torch._C._dispatch_has_kernel(f"aten::{name}") if hasattr(torch._C, "_dispatch_has_kernel") else \
        hasattr(torch.ops.aten, name)


class QuantizedLinear(nn.Module):
    """A projection [.., K] -> [.., N] from low-bit weights (see the module doc): bfloat16 into
    the kernel, its output back in the input's dtype. ``scheme``: how it was quantized; ``error_scale`` float32[N, K / g]: the largest
    rounding error of each weight group (s / 2), for ``error_bound``."""

    def __init__(self, scheme: Scheme, n: int, k: int, packed: torch.Tensor, scales: torch.Tensor,
                 bias: torch.Tensor | None, error_scale: torch.Tensor):
        super().__init__()
        self.scheme, self.out_features, self.in_features = scheme, n, k
        self.register_buffer("packed", packed)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.bfloat16))
        self.register_buffer("error_scale", error_scale, persistent=False)
        cuda = packed.device.type == "cuda"
        self._int4 = torch.ops.aten._weight_int4pack_mm if cuda else getattr(
            torch.ops.aten, "_weight_int4pack_mm_for_cpu", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, dtype = x.shape, x.dtype
        x = x.reshape(-1, shape[-1]).to(torch.bfloat16)
        if self.scheme.kind == "int4":
            y = self._int4(x, self.packed, self.scheme.group, self.scales)
        else:
            y = torch.ops.aten._weight_int8pack_mm(x, self.packed, self.scales)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], self.out_features).to(dtype)

    def product(self):
        """The bare product as a function of x bfloat16[m, K] -> bfloat16[m, N] (no bias, no module
        call): what a caller that runs many of them per token uses (``lean.LeanStack``)."""
        packed, scales, group = self.packed, self.scales, self.scheme.group
        if self.scheme.kind == "int4":
            int4 = self._int4
            return lambda x: int4(x, packed, group, scales)
        return lambda x: torch.ops.aten._weight_int8pack_mm(x, packed, scales)

    def dequantized(self) -> torch.Tensor:
        """The weights this module multiplies by, float32[N, K] (for checks)."""
        eye = torch.eye(self.in_features, dtype=torch.bfloat16, device=self.packed.device)
        bias, self.bias = self.bias, None
        try:
            return self.forward(eye).float().t().contiguous()
        finally:
            self.bias = bias

    def nbytes(self) -> int:
        """Bytes this module adds to the target's (packed weights, scales, bias)."""
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scales, self.bias) if t is not None)


def quantize(weight: torch.Tensor, bias: torch.Tensor | None, scheme: Scheme) -> QuantizedLinear:
    """``y = x weight^T + bias`` (weight float[N, K]) as a ``QuantizedLinear`` of ``scheme`` on the
    weight's device; ``ModelError`` where the widths do not fit the scheme (``Scheme.fits``)."""
    n, k = weight.shape
    why = scheme.fits(n, k)
    if why is not None:
        raise ModelError(f"{scheme.kind} cannot hold a {n} x {k} weight: {why}")
    w = weight.detach().float()
    if scheme.kind == "int8":
        s = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
        q = torch.clamp(torch.round(w / s[:, None]), -127, 127).to(torch.int8)
        err = (w - q.float() * s[:, None]).abs().amax(dim=1, keepdim=True)  # per channel, <= s / 2
        return QuantizedLinear(scheme, n, k, q.contiguous(), s.to(torch.bfloat16), bias, err)
    g = scheme.group
    wg = w.view(n, k // g, g)
    lo, hi = wg.amin(dim=-1, keepdim=True), wg.amax(dim=-1, keepdim=True)
    s = ((hi - lo) / 15).clamp(min=1e-12)
    q = torch.clamp(torch.round((wg - lo) / s), 0, 15).to(torch.int32)
    # the kernel's (scale, zero) in bfloat16: the error is measured against the weights it multiplies by
    s16, zero16 = s.to(torch.bfloat16), (lo + 8 * s).to(torch.bfloat16)
    deq = (q.float() - 8) * s16.float() + zero16.float()
    err = (wg - deq).abs().amax(dim=-1)  # [n, k / g]
    scales = torch.stack([s16.squeeze(-1), zero16.squeeze(-1)], dim=-1).transpose(0, 1).contiguous()
    q = q.view(n, k)
    if w.device.type == "cuda":  # two 4-bit values per byte, high nibble first; K in tiles of 16 x inner
        inner = next(t for t in (8, 4, 2, 1) if (k // 16) % t == 0)
        packed = torch.ops.aten._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8), inner)
    else:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    return QuantizedLinear(scheme, n, k, packed, scales, bias, err)


def error_bound(module: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    """The bound of the module doc on |module(x) - x W^T| for each output, float32[m, N], of
    inputs x float32[m, K] (W: the float weights it was made from)."""
    x = x.float()
    xb = x.to(torch.bfloat16).float()
    g = module.in_features // module.error_scale.shape[1]
    e = module.error_scale.float().repeat_interleave(g, dim=1)  # [N, K]
    w = module.dequantized()
    exact = xb @ w.t()
    quant = x.abs() @ e.t()
    rounding = (x - xb).abs() @ w.abs().t()
    accumulate = module.in_features * 2.0 ** -23 * (xb.abs() @ w.abs().t())
    bias = 0.0 if module.bias is None else 2.0 ** -8 * (1 + 2.0 ** -7) * (exact.abs() + 2 * module.bias.float().abs())
    return quant + rounding + exact.abs() * 2.0 ** -8 + accumulate + bias + 1e-6


def quantized_copy(model, scheme: Scheme) -> nn.Module:
    """An HF causal LM computing like ``model`` with every ``nn.Linear`` / ``Conv1D`` replaced by a
    ``QuantizedLinear`` of ``scheme`` (the output projection by one of ``OUTPUT``); embeddings, norms, rotary tables and
    every other tensor are ``model``'s own (shared, not copied); its modules carry no hooks. A
    projection whose widths do not fit ``scheme`` keeps its float weights."""
    lm = getattr(model, "base", None) or model
    shared = {id(t): t for t in itertools.chain(lm.parameters(), lm.buffers())}
    twin = copy.deepcopy(lm, shared)
    twin.config.tie_word_embeddings = False  # its output projection is its own quantized module
    for m in twin.modules():  # the target's hooks (a call counter, say) stay the target's
        m._forward_hooks.clear()
        m._forward_pre_hooks.clear()
    head = lm.get_output_embeddings()
    for name, module in list(twin.named_modules()):
        w = projection_weight(module)
        mine = OUTPUT if w is not None and w is projection_weight(head) else scheme
        if w is None or mine.fits(*w.shape) is not None:
            continue
        parent, _, attr = name.rpartition(".")
        setattr(twin.get_submodule(parent) if parent else twin, attr, quantize(w, module.bias, mine))
    return twin.eval()


def projection_weight(module) -> torch.Tensor | None:
    """The [out, in] weight of a projection module (``nn.Linear``, GPT-2's ``Conv1D``: [in, out]
    transposed), None for any other module."""
    if isinstance(module, nn.Linear):
        return module.weight
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf"):
        return module.weight.t()
    return None

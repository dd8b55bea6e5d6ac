"""Weight-only quantized projections: the stated error bound holds (int4 groupwise and int8 per
channel, CPU kernels), widths the kernels cannot hold are refused in one line, and the HF copy
computes like the target with quantized projections and shares the rest."""

import pytest
import torch

from latticedraft.errors import ModelError
from latticedraft.gpu.models.quantized import Scheme, error_bound, kernels_missing, quantize, quantized_copy
from tests.decoding.tiny import tiny_model

pytestmark = pytest.mark.skipif(kernels_missing("cpu") is not None, reason="torch lacks the weight-only CPU kernels")


@pytest.mark.parametrize("scheme", [Scheme("int4", 32), Scheme("int4", 64), Scheme("int8")])
@pytest.mark.parametrize("bias", [False, True])
def test_outputs_stay_within_the_stated_bound(scheme, bias):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 128, generator=g) * torch.rand(48, 1, generator=g)  # rows of unlike scales
    b = torch.randn(48, generator=g) if bias else None
    q = quantize(w, b, scheme)
    x = torch.randn(7, 128, generator=g) * 3
    exact = x @ w.t() + (0 if b is None else b)
    got = q(x).float()
    bound = error_bound(q, x)
    assert got.dtype == torch.float32 and got.shape == (7, 48)
    assert ((got - exact).abs() <= bound).all()
    assert (got - exact).abs().max() > 0  # quantized: not the float product
    one = torch.zeros(1, 128)
    one[0, 5] = 1.0  # one input: no cancellation, the error is the weights' own rounding error of column 5
    err = (q(one).float() - one @ w.t() - (0 if b is None else b)).abs()
    assert (err <= error_bound(q, one)).all()
    assert err.max() >= 0.25 * error_bound(q, one).max()  # the bound is within a small factor of what is reached


def test_dequantized_weights_are_within_half_a_step_of_the_float_ones():
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    q = quantize(w, None, Scheme("int4"))
    err = (q.dequantized() - w).abs().view(32, 2, 32)
    step = (w.view(32, 2, 32).amax(-1) - w.view(32, 2, 32).amin(-1)) / 15
    assert (err.amax(-1) <= step / 2 + 0.02 * step.abs() + 1e-6).all()  # (+ the bfloat16 scale's rounding)


@pytest.mark.parametrize("scheme,shape,why", [
    (Scheme("int4"), (24, 64), "24 output rows are not a multiple of 16"),
    (Scheme("int4"), (32, 48), "48 inputs are not a multiple of the group size 32"),
    (Scheme("int8"), (32, 40), "40 inputs are not a multiple of 16"),
])
def test_widths_the_kernels_cannot_hold_are_refused_in_one_line(scheme, shape, why):
    with pytest.raises(ModelError, match=why) as e:
        quantize(torch.randn(*shape), None, scheme)
    assert "\n" not in str(e.value)


def test_unknown_schemes_and_group_sizes_are_refused():
    with pytest.raises(ModelError, match="int3"):
        Scheme("int3")
    with pytest.raises(ModelError, match="group size 16"):
        Scheme("int4", 16)


def test_a_torch_build_without_the_kernels_is_named(monkeypatch):
    from latticedraft.gpu.models import quantized

    monkeypatch.setattr(quantized, "has_op", lambda name: name != "_weight_int4pack_mm_for_cpu")
    why = kernels_missing("cpu")
    assert why is not None and torch.__version__ in why and "install torch" in why and "\n" not in why


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_hf_copy_shares_the_rest_and_computes_as_the_self_drafts_stack(arch):
    """HF assisted generation's assistant and latticedraft's self-draft are the same 4-bit copy: the
    HF copy's logits equal the quantized lean stack's (up to bfloat16 rounding), both near the target's."""
    from latticedraft.gpu.verify.kv import KVCache
    from latticedraft.gpu.verify.lean import LeanStack

    model = tiny_model(arch, vocab=96)
    twin = quantized_copy(model, Scheme("int4"))
    ids = torch.randint(1, 96, (1, 9), generator=torch.Generator().manual_seed(2))
    pos = torch.arange(9)[None]
    stack = LeanStack(model, Scheme("int4"))
    cache = KVCache(1, stack.num_layers)
    cache.reserve(9)
    with torch.no_grad():
        want, got = model(input_ids=ids).logits, twin(input_ids=ids).logits.float()
        ours = stack.unembed(stack.norm(stack.run(stack.embed(ids, pos), 0, stack.num_layers, "causal", pos, cache)))
    assert twin.get_input_embeddings().weight is model.get_input_embeddings().weight  # shared, not copied
    assert not any(isinstance(m, torch.nn.Linear) for m in twin.modules())  # every projection quantized
    assert (ours.float() - got).abs().max() <= 0.02 * got.abs().max()
    assert 0 < (got - want).abs().max() < 0.25 * want.abs().max()

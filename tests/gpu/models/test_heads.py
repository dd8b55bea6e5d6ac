"""Stern heads: the stacked batched-matmul form computes each head's residual FFN, starts
from the draws of n pairs of ``nn.Linear``, and checkpoints per head."""

import pytest
import torch
from torch import nn

from latticedraft.errors import ModelError
from latticedraft.gpu.models.heads import SternHeads


def _per_head(m: SternHeads, x: torch.Tensor) -> torch.Tensor:
    outs = []
    for j in range(m.num_extra):
        z = nn.functional.linear(x, m.w1[j], m.b1[j])
        outs.append(x + nn.functional.linear(m.act(z), m.w2[j], m.b2[j]))
    return torch.stack(outs, dim=-2)


def test_stacked_heads_equal_the_per_head_formula():
    torch.manual_seed(0)
    m = SternHeads(hidden=6, num_extra=3, ffn=10)
    with torch.no_grad():
        m.w2.normal_(), m.b2.normal_()
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    m = m.double()
    got = m(x)
    assert got.shape == (2, 5, 3, 6)
    assert torch.allclose(got, _per_head(m, x), atol=1e-12)
    assert torch.allclose(m(x, count=2), got[..., :2, :], atol=1e-12)
    assert m(x[0, 0]).shape == (3, 6)


def test_fresh_heads_are_identities_drawn_like_linear_pairs():
    torch.manual_seed(3)
    m = SternHeads(hidden=4, num_extra=2, ffn=8)
    torch.manual_seed(3)
    pairs = [(nn.Linear(4, 8), nn.Linear(8, 4)) for _ in range(2)]
    for j, (fc1, _) in enumerate(pairs):
        assert torch.equal(m.w1[j], fc1.weight) and torch.equal(m.b1[j], fc1.bias)
    x = torch.randn(3, 4)
    assert torch.equal(m(x), x[:, None, :].expand(3, 2, 4))


def test_state_dict_is_per_head_and_loads_by_copy():
    m = SternHeads(hidden=4, num_extra=2, ffn=8)
    sd = m.head_state_dict()
    assert sorted(sd) == sorted(f"heads.{j}.{l}.{p}" for j in range(2) for l in ("fc1", "fc2") for p in ("weight", "bias"))
    assert sd["heads.1.fc1.weight"].shape == (8, 4) and sd["heads.0.fc2.bias"].shape == (4,)
    with torch.no_grad():
        sd["heads.1.fc2.bias"].copy_(torch.arange(4.0))
    assert m.b2[1].tolist() == [0.0, 1.0, 2.0, 3.0] and m.b2[0].abs().sum() == 0


def test_unknown_activation():
    with pytest.raises(ModelError, match="unknown head activation 'tanhh'"):
        SternHeads(4, 2, 8, act="tanhh")


def _medusa_per_head(m, x):
    """Medusa's formula head by head: L residual SiLU blocks, then the head's own LM head."""
    outs = []
    for j in range(m.num_extra):
        z = x
        for layer in range(m.num_layers):
            z = z + nn.functional.silu(nn.functional.linear(z, m.w[j, layer], None if m.b is None else m.b[j, layer]))
        outs.append(z if m.lm is None else nn.functional.linear(z, m.lm[j]))
    return torch.stack(outs, dim=-2)


@pytest.mark.parametrize("layers,bias", [(1, True), (2, False), (0, True)])
def test_medusa_stacked_blocks_equal_the_per_head_formula(layers, bias):
    from latticedraft.gpu.models.heads import MedusaHeads

    torch.manual_seed(0)
    emb = torch.randn(11, 6)
    m = MedusaHeads(hidden=6, num_extra=3, num_layers=layers, fc_bias=bias, output_embedding=emb).double()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p))
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    states = m(x)
    assert states.shape == (2, 5, 3, 6)
    logits = torch.einsum("bsnh,nvh->bsnv", states, m.lm_weights(0, 3))
    assert torch.allclose(logits, _medusa_per_head(m, x), atol=1e-12)
    assert torch.allclose(m(x, count=2), states[..., :2, :], atol=1e-12)


def test_fresh_medusa_heads_are_identities_with_copied_lm_heads():
    from latticedraft.gpu.models.heads import MedusaHeads

    emb = torch.randn(9, 4)
    m = MedusaHeads(hidden=4, num_extra=2, output_embedding=emb)
    x = torch.randn(3, 4)
    assert torch.equal(m(x), x[:, None, :].expand(3, 2, 4))
    assert all(torch.equal(m.lm[j], emb) for j in range(2))
    assert MedusaHeads(4, 2, lm_head="tied").lm is None


def test_medusa_state_dict_uses_vllm_names():
    from latticedraft.gpu.models.heads import MedusaHeads

    m = MedusaHeads(hidden=4, num_extra=2, num_layers=2, output_embedding=torch.zeros(9, 4))
    sd = m.head_state_dict()
    assert sorted(sd) == sorted([f"blocks.{j}.layers.{l}.{p}" for j in range(2) for l in range(2) for p in ("weight", "bias")]
                                + [f"lm_heads.{j}.weight" for j in range(2)])
    assert sd["lm_heads.1.weight"].shape == (9, 4) and sd["blocks.0.layers.1.bias"].shape == (4,)
    tied = MedusaHeads(hidden=4, num_extra=2, lm_head="tied", fc_bias=False).head_state_dict()
    assert sorted(tied) == ["blocks.0.layers.0.weight", "blocks.1.layers.0.weight"]


def test_medusa_bad_options():
    from latticedraft.errors import InputError
    from latticedraft.gpu.models.heads import MedusaHeads

    with pytest.raises(ModelError, match="unknown Medusa lm_head 'shared'"):
        MedusaHeads(4, 2, lm_head="shared")
    with pytest.raises(InputError, match="--medusa-layers -1"):
        MedusaHeads(4, 2, num_layers=-1, lm_head="tied")

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

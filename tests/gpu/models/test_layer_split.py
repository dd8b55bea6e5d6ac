"""The split forward equals the model's own forward (logits to 1e-5, float32)."""

import numpy as np
import pytest
import torch

from latticedraft.errors import ModelError
from latticedraft.gpu.verify.kv import KVCache
from latticedraft.gpu.models.layer_split import LayerSplit
from latticedraft.gpu.masks import causal
from latticedraft.gpu.verify.split_cache import left_pad, prefill
from tests.decoding.tiny import prompts, tiny_model


@pytest.mark.parametrize("arch", ["gpt2", "llama", "mistral"])
@torch.inference_mode()
def test_split_forward_equals_full_forward(arch):
    m = tiny_model(arch, layers=4)
    split = LayerSplit(m)
    ps = prompts(3, seed=2, lengths=(12, 5, 9))
    ids, valid, pos = left_pad(ps, "cpu")
    caches = [KVCache(3, hi - lo, first_layer=lo) for lo, hi in [(0, 1), (1, 3), (3, 4)]]
    last = prefill(split, [0, 1, 3, 4], caches, ps)
    for i, p in enumerate(ps):
        ref = m(torch.as_tensor(p)[None]).logits[0, -1]
        assert torch.allclose(split.logits(last[i]), ref, atol=1e-5), arch
    # one more token per row through the three ranges' caches equals the full forward of prompt + token
    nxt = torch.tensor([[5], [6], [7]])
    q_h = caches[0].next_pos[:, None]
    q = torch.from_numpy(q_h)
    h = split.embed(nxt, q)
    rot = split.rotary_for(h, q)
    for (lo, hi), c in zip([(0, 1), (1, 3), (3, 4)], caches):
        bias = split.bias(*c.keys(), q_h, np.ones((3, 1, 1), dtype=bool))
        c.reserve(1)
        h = split.run(h, lo, hi, bias, q, c, rot)
    for i, p in enumerate(ps):
        ref = m(torch.as_tensor(list(p) + [5 + i])[None]).logits[0, -1]
        assert torch.allclose(split.logits(h[i, 0]), ref, atol=1e-5), arch


def test_split_refuses_flash_like_attention():
    m = tiny_model("llama", attn="flex_attention")
    with pytest.raises(ModelError, match="4-D mask"):
        LayerSplit(m)


def test_causal_mask_hides_padding():
    _, valid, _ = left_pad([[1, 2, 3], [4]], "cpu")
    c = causal(valid)
    assert c[1, 2].tolist() == [False, False, True] and c[0, 1].tolist() == [True, True, False]

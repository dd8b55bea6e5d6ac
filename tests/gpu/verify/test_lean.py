"""``LeanStack`` computes what transformers' forward computes: every architecture of
``archs.ARCHS`` (a new entry needs a tiny model of its kind in ``tests/decoding/tiny.py``), float32
and float64, left-padded batches under tree masks, any layer range, with and without a mask."""

import pytest
import torch

from latticedraft.gpu.masks import attention_bias
from latticedraft.gpu.verify.archs import ARCHS
from latticedraft.gpu.verify.kv import KVCache
from latticedraft.gpu.verify.lean import LeanStack, supports
from tests.decoding.tiny import tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TOL = {torch.float32: 2e-5, torch.float64: 1e-10}


def _batch(seed=0, lengths=(7, 4, 9), vocab=64):
    """Left-padded ids int64[b, n], valid bool[b, n], positions and a causal mask bool[b, n, n]."""
    g = torch.Generator().manual_seed(seed)
    n = max(lengths)
    ids = torch.zeros(len(lengths), n, dtype=torch.long)
    valid = torch.zeros(len(lengths), n, dtype=torch.bool)
    for i, L in enumerate(lengths):
        ids[i, n - L:] = torch.randint(1, vocab, (L,), generator=g)
        valid[i, n - L:] = True
    pos = (valid.long().cumsum(1) - 1).clamp(min=0)
    allowed = torch.ones(n, n, dtype=torch.bool).tril()[None] & valid[:, None, :]
    allowed |= torch.eye(n, dtype=torch.bool)[None]
    return ids, valid, pos, allowed


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_lean_forward_equals_transformers(arch, dtype):
    model = tiny_model(arch, dtype, seed=3, layers=3, window=5)
    ids, valid, pos, allowed = _batch()
    if arch == "mistral":  # the window lives in the mask, as the verifier builds it
        allowed &= pos[:, None, :] > pos[:, :, None] - 5
    want = model(input_ids=ids, attention_mask=attention_bias(allowed, dtype), position_ids=pos).logits
    stack = LeanStack(model)
    cache = KVCache(ids.shape[0], stack.num_layers)
    cache.reserve(ids.shape[1])
    h = stack.run(stack.embed(ids, pos), 0, stack.num_layers, allowed[:, None], pos, cache)
    got = stack.unembed(stack.norm(h))
    torch.testing.assert_close(got[valid], want[valid], atol=TOL[dtype], rtol=0)


@pytest.mark.parametrize("arch", ["gpt2", "mistral"])
def test_layer_ranges_and_cached_steps_compose(arch):
    """A prefill then one cached step, and the layers run in two ranges with two caches (the split
    verifier's), give what one full forward over prompt + token gives."""
    model = tiny_model(arch, torch.float64, seed=4, layers=4, window=64)
    stack = LeanStack(model)
    ids = torch.randint(1, 64, (1, 9), generator=torch.Generator().manual_seed(1))
    full = model(input_ids=ids).logits[0, -1]
    pos = torch.arange(9)[None]
    lo, hi = KVCache(1, 2), KVCache(1, 2, first_layer=2)
    for c in (lo, hi):
        c.reserve(8)
    h = stack.run(stack.embed(ids[:, :8], pos[:, :8]), 0, 2, torch.ones(1, 1, 8, 8, dtype=torch.bool).tril(),
                  pos[:, :8], lo)
    stack.run(h, 2, 4, torch.ones(1, 1, 8, 8, dtype=torch.bool).tril(), pos[:, :8], hi)
    for c in (lo, hi):
        c.append_valid(torch.ones(1, 8, dtype=torch.bool), pos[:, :8])
        c.reserve(1)
    h = stack.run(stack.embed(ids[:, 8:], pos[:, 8:]), 0, 2, None, pos[:, 8:], lo)  # no mask: every slot seen
    h = stack.run(h, 2, 4, None, pos[:, 8:], hi)
    torch.testing.assert_close(stack.unembed(stack.norm(h))[0, -1], full, atol=1e-10, rtol=0)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_prompt_into_an_empty_cache_runs_attentions_causal_kernel(arch, monkeypatch):
    """``CAUSAL`` gives transformers' logits at every position (its SDPA attention runs an unpadded
    prompt with ``is_causal`` too), and the verifier's prefill chooses it only where no row is padded."""
    from latticedraft.gpu.masks import CAUSAL
    from latticedraft.gpu.verify.verifier import Verifier

    model = tiny_model(arch, torch.float32, seed=5, layers=3)
    ids = torch.randint(1, 64, (2, 11), generator=torch.Generator().manual_seed(2))
    pos = torch.arange(11).expand(2, -1)
    stack = LeanStack(model)
    cache = KVCache(2, stack.num_layers)
    cache.reserve(11)
    got = stack.unembed(stack.norm(stack.run(stack.embed(ids, pos), 0, stack.num_layers, CAUSAL, pos, cache)))
    torch.testing.assert_close(got, model(input_ids=ids).logits, atol=TOL[torch.float32], rtol=0)
    masks = []
    run = LeanStack.run
    monkeypatch.setattr(LeanStack, "run", lambda self, h, lo, hi, mask, *a: masks.append(mask) or run(
        self, h, lo, hi, mask, *a))
    verifier = Verifier(model)
    verifier.prefill([ids[0].numpy(), ids[1].numpy()])  # equal lengths: no padding
    verifier.prefill([ids[0].numpy(), ids[1, 3:].numpy()])  # left padding: the mask
    assert masks[0] is CAUSAL and isinstance(masks[1], torch.Tensor)


def test_what_is_not_written_out_is_said():
    assert supports(tiny_model("llama")) is None
    m = tiny_model("llama")
    m.config._attn_implementation = "flash_attention_2"
    assert "flash_attention_2" in supports(m)
    m = tiny_model("llama")
    m.model.rotary_emb.rope_type = "dynamic"
    assert "dynamic" in supports(m)
    with pytest.raises(ValueError, match="cannot run"):
        LeanStack(m)


def test_stack_for_builds_once_per_model_and_weights():
    """A decode call per batch reuses the model's LeanStack; replaced or trained weights rebuild it
    (the fused projections are copies of the weights)."""
    from latticedraft.gpu.verify.lean import stack_for

    m = tiny_model("llama")
    s1 = stack_for(m)
    assert stack_for(m) is s1 and stack_for(tiny_model("llama")) is not s1
    with torch.no_grad():
        m.model.layers[0].self_attn.q_proj.weight.add_(1.0)
    s2 = stack_for(m)
    assert s2 is not s1 and stack_for(m) is s2
    qkv = s2.weights[0].qkv
    w = qkv.w if hasattr(qkv, "w") else qkv.parts[0].w  # fused (a copy), or the weight itself
    assert torch.equal(w[: m.config.hidden_size], m.model.layers[0].self_attn.q_proj.weight)

"""The lean step on CUDA (skipped without a CUDA device): LeanStack and the KV cache compute what
transformers computes there, and the one loop, tree verification with heads, equals
``generate(do_sample=False)`` on the GPU token for token, batch 1 and 3, also with the self-draft
(torch's CUDA int4 / int8 kernels). The CPU suite proves
the same on the CPU; CI has no GPU."""

import numpy as np
import pytest
import torch

from latticedraft.decoding.loop import speculative_decode
from latticedraft.decoding.registry import Request
from latticedraft.decoding.proposers.heads import HeadProposer, LatticeOptions, make_drafter
from latticedraft.gpu.verify.incremental import IncrementalLM
from latticedraft.gpu.masks import attention_bias
from latticedraft.gpu.verify.kv import KVCache
from latticedraft.gpu.verify.lean import LeanStack
from tests.decoding.tiny import blockwise, prompts, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
DEV = "cuda"


def _reference(base, prompt, n):
    ids = torch.as_tensor(np.asarray(prompt)[None], device=DEV)
    g = base.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, pad_token_id=0)
    return g[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("arch", ["gpt2", "llama", "mistral"])
def test_lean_forward_equals_transformers_on_cuda(arch):
    model = tiny_model(arch, torch.float32, seed=3, layers=3, window=5).to(DEV)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 64, (2, 9), generator=g).to(DEV)
    pos = torch.arange(9, device=DEV)[None].expand(2, 9)
    allowed = torch.ones(9, 9, dtype=torch.bool, device=DEV).tril()[None].expand(2, 9, 9)
    if arch == "mistral":
        allowed = allowed & (pos[:, None, :] > pos[:, :, None] - 5)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=attention_bias(allowed, torch.float32), position_ids=pos).logits
        stack = LeanStack(model)
        cache = KVCache(2, stack.num_layers, device=DEV)
        cache.reserve(9)
        h = stack.run(stack.embed(ids, pos), 0, stack.num_layers, allowed[:, None], pos, cache)
        got = stack.unembed(stack.norm(h))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert cache.store.device.type == torch.device(DEV).type


@pytest.mark.parametrize("drafter", ["parallel-base", "oracle"])
@pytest.mark.parametrize("arch", ["llama", "mistral"])
@pytest.mark.parametrize("batch", [1, 3])
def test_tree_verification_equals_generate_on_cuda(arch, batch, drafter):
    """Branching trees (parallel-base) and long accepted chains (the oracle, whose lattice holds
    the whole vocabulary: every draft accepted, the cache committed in place) on the GPU."""
    model = blockwise(arch, torch.float64, num_heads=4, seed=2).to(DEV)
    ps = prompts(batch, seed=5)
    want = [_reference(model.base, p, 16) for p in ps]
    opts = LatticeOptions(k=64, slots=2)
    source = (make_drafter("parallel-base", nbest=4, options=opts) if drafter == "parallel-base"
              else make_drafter("oracle", references=want, options=opts))
    res = speculative_decode(model, ps, [HeadProposer(source)], Request(max_new_tokens=16))
    assert res.verify_mode == "tree"
    assert [q.tokens.tolist() for q in res.sequences] == want
    if drafter == "oracle":
        assert res.block_efficiency > 2.0


def test_incremental_draft_model_on_cuda():
    model = tiny_model("llama", torch.float64, seed=4).to(DEV)
    lm = IncrementalLM(model)
    assert lm.stack is not None
    history = np.arange(1, 12)
    got = lm.next_logits(history)
    with torch.no_grad():
        want = model(torch.as_tensor(history[None], device=DEV)).logits[0, -1]
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("kind", ["int4", "int8"])
@pytest.mark.parametrize("batch", [1, 3])
def test_self_draft_equals_generate_on_cuda(kind, batch):
    """The model's own quantized copy drafting on the GPU (torch's CUDA int4 / int8 kernels) over the
    verifier's cache: the output is generate's, and the copy's drafts are kept."""
    from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode
    from latticedraft.decoding.proposers.self_draft import SelfDraftProposer
    from latticedraft.gpu.models.quantized import Scheme, kernels_missing

    if kernels_missing(DEV) is not None:
        pytest.skip(kernels_missing(DEV))
    model = tiny_model("llama", torch.float32, seed=0, window=7).to(DEV)
    with torch.no_grad():
        model.model.norm.weight.mul_(8.0)  # peaked next-token distributions: the copy agrees often
    ps = prompts(batch, seed=1)
    want = [_reference(model, p, 24) for p in ps]
    src = SelfDraftProposer(LeanStack(model, Scheme(kind)))
    r = bpd_decode(model, ps, None, BpdPlan(tree="fixed", sources=(src,)), Request(max_new_tokens=24))
    assert [q.tokens.tolist() for q in r.sequences] == want
    assert sum(sum(q.accepted_drafts) for q in r.sequences) > 0

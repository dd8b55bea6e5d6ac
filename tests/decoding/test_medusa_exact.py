"""Medusa heads (``kind="medusa"``) decode exactly: every head drafter emits
``model.generate(do_sample=False)``'s tokens with random Medusa heads and with heads after a few
training steps, own or tied LM heads, on GPT-2 / LLaMA / Mistral bases, tree and batched
verification, with and without a reduced draft vocabulary."""

import functools

import numpy as np
import pytest
import torch

from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode
from latticedraft.decoding.registry import Request
from latticedraft.decoding.proposers.heads import LatticeOptions, make_drafter
from latticedraft.gpu.models.blockwise import BlockwiseModel
from latticedraft.gpu.verify.forward import lazy_logits_ok
from tests.decoding.tiny import prompts, reference, tiny_model
from tests.lattice.toylm import make_toy_lm

MAX_NEW = 20

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _train_a_few_steps(bm, steps: int = 6, seed: int = 0) -> None:
    """AdamW on the heads' loss over the base's own greedy continuations (text the heads can learn)."""
    from latticedraft.gpu.train.heads import head_losses

    g = torch.Generator().manual_seed(seed)
    start = torch.randint(1, 64, (4, 4), generator=g)
    with torch.no_grad():
        batch = bm.base.generate(start, attention_mask=torch.ones_like(start), do_sample=False, max_new_tokens=28,
                                 pad_token_id=0)
    opt = torch.optim.AdamW(bm.head_parameters(), lr=1e-2)
    before = [p.detach().clone() for p in bm.head_parameters()]
    for _ in range(steps):
        opt.zero_grad()
        sum(head_losses(bm, batch)[1:]).backward()
        opt.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, bm.head_parameters()))


@functools.lru_cache(maxsize=None)
def _case(arch: str, state: str, lm_head: str = "heads", layers: int = 1, bias: bool = True):
    """(model, prompts, greedy references) for Medusa heads that are random or briefly trained."""
    bm = BlockwiseModel.from_base(tiny_model(arch, seed=2), 4, "medusa", seed=0, medusa_layers=layers,
                                  medusa_lm_head=lm_head, medusa_fc_bias=bias)
    if state == "random":
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for p in bm.head_parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.3)
    else:
        _train_a_few_steps(bm)
    bm.eval()
    ps = prompts(4, seed=3)
    return bm, ps, [reference(bm, p, MAX_NEW) for p in ps]


@pytest.fixture(scope="module")
def toy_lm():
    return make_toy_lm(V=64, order=3, seed=0, density=0.5)


@pytest.fixture(scope="module")
def rescorer():
    return tiny_model("gpt2", torch.float32, seed=7)


def _drafter(name, refs, lm, rescorer, k=8):
    return make_drafter(name, options=LatticeOptions(k=k), lm=lm, rescorer=rescorer, alpha=1.0, nbest=8,
                        references=refs)


@pytest.mark.parametrize("state", ["random", "trained"])
@pytest.mark.parametrize("name", ["top1", "neural", "ngram", "parallel", "parallel-base", "oracle"])
def test_every_drafter_with_medusa_heads_equals_generate(name, state, toy_lm, rescorer):
    model, ps, refs = _case("gpt2", state)
    assert lazy_logits_ok(model)  # the verifier computes the heads at the accepted node only (draft_logits)
    r = bpd_decode(model, ps, _drafter(name, refs, toy_lm, rescorer), request=Request(max_new_tokens=MAX_NEW))
    assert [s.tokens.tolist() for s in r.sequences] == refs
    assert r.verify_mode == "tree"
    if name == "oracle":  # the heads' lattices really drive the drafts
        assert sum(a for s in r.sequences for a in s.accepted_drafts) > 0


@pytest.mark.parametrize("arch,lm_head,layers,bias,verify,vocab", [
    ("llama", "tied", 2, False, "auto", None), ("llama", "heads", 1, True, "auto", 32),
    ("mistral", "heads", 1, True, "batched", 32), ("mistral", "tied", 1, True, "auto", None),
    ("gpt2", "heads", 0, True, "batched", None),
])
def test_medusa_shapes_verify_modes_and_draft_vocab_stay_exact(arch, lm_head, layers, bias, verify, vocab, toy_lm):
    model, ps, refs = _case(arch, "trained", lm_head, layers, bias)
    ids = np.random.default_rng(0).permutation(64)[:vocab] if vocab else None
    r = bpd_decode(
        model,
        ps,
        _drafter("parallel", refs, toy_lm, None),
        BpdPlan(draft_vocab=ids),
        Request(max_new_tokens=MAX_NEW, verify=verify, record_steps=True),
    )
    assert [s.tokens.tolist() for s in r.sequences] == refs
    if vocab:
        assert all(
            set(st.sausage.tokens[st.sausage.tokens >= 0].tolist()) <= set(ids.tolist())
            for st in r.steps
            if st.sausage is not None
        )
    oracle = bpd_decode(
        model,
        ps,
        make_drafter("oracle", options=LatticeOptions(k=64), references=refs),
        request=Request(max_new_tokens=MAX_NEW, verify=verify),
    )
    assert [s.tokens.tolist() for s in oracle.sequences] == refs
    assert oracle.block_efficiency > 1.5  # k = V: every slot holds the true token

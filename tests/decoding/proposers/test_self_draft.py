"""The self-draft (the target's own weights at 4 bits): every decode equals ``generate`` (GPT-2,
LLaMA, Mistral with its rolling cache, Qwen2; batch 1 and 4, a continuous batch, EOS first, long
prompts; fixed and cost-aware trees), drafting leaves the verifier's cache as it found it, partial
acceptance is calibrated, and each refusal is one line."""

import json
import re

import numpy as np
import pytest
import torch

from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode
from latticedraft.decoding.proposers.self_draft import SelfDraftProposer, build
from latticedraft.decoding.registry import Request
from latticedraft.decoding.runs.session import Session
from latticedraft.errors import ModelError
from latticedraft.gpu.models.quantized import Scheme, kernels_missing
from latticedraft.gpu.verify.cost_model import CostModel
from latticedraft.gpu.verify.lean import LeanStack
from tests.decoding.tiny import prompts, reference, tiny_model

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.skipif(kernels_missing("cpu") is not None, reason="torch lacks the weight-only kernels")]
MAX_NEW = 24
FLAT = CostModel((1, 2, 4, 8, 16), (1.0, 1.01, 1.02, 1.04, 1.08))  # nodes are cheap: the chains grow


def peaked(arch: str, seed: int = 0, window: int = 7, dtype=torch.float32):
    """A tiny random model whose next-token distributions are peaked (its final norm scaled up), so
    that its 4-bit copy agrees often and drafts are accepted in runs, partly."""
    m = tiny_model(arch, dtype, seed=seed, window=window)
    norm = m.transformer.ln_f if arch == "gpt2" else m.model.norm
    with torch.no_grad():
        norm.weight.mul_(8.0)
    return m


def self_draft(model, kind: str = "int4") -> SelfDraftProposer:
    return SelfDraftProposer(LeanStack(model, Scheme(kind)))


@pytest.mark.parametrize("arch", ["gpt2", "llama", "mistral", "qwen2"])
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("tree", ["fixed", "auto"])
def test_self_draft_decodes_exactly(arch, batch, tree):
    model = peaked(arch)
    ps = prompts(batch, seed=1, lengths=(3, 9, 5, 14))
    refs = [reference(model, p, MAX_NEW) for p in ps]
    src = self_draft(model)
    r = bpd_decode(model, ps, None, BpdPlan(tree=tree, sources=(src,), cost=FLAT if tree == "auto" else None),
                   Request(max_new_tokens=MAX_NEW, record_steps=True))
    assert [s.tokens.tolist() for s in r.sequences] == refs
    assert sum(sum(s.accepted_drafts) for s in r.sequences) > MAX_NEW * batch // 3  # the copy agrees: drafts kept


def test_partial_acceptance_rolls_back_and_calibrates():
    """Chains are kept in part (a prefix, then the target's own token) and the decode stays exact;
    the calibration learned from the chain tokens tried (here the copy agrees more often than its
    flat probabilities say: the calibrated chance rises above the raw probability)."""
    model = peaked("llama", seed=2)
    ps = prompts(4, seed=3, lengths=(6, 11, 4, 17))
    src = self_draft(model)
    r = bpd_decode(model, ps, None, BpdPlan(sources=(src,)), Request(max_new_tokens=32, record_steps=True))
    assert [s.tokens.tolist() for s in r.sequences] == [reference(model, p, 32) for p in ps]
    partial = [st for st in r.steps if 0 < len(st.accepted) < (st.drafts[0] >= 0).sum()]
    assert partial, "no step kept a chain in part"
    cal = src.calibration
    seen = np.flatnonzero(cal.expected[0] > cal.prior[0])
    assert len(seen) and all(cal.corrected([p], 0)[0] != pytest.approx(p) for p in (0.075, 0.15)[: len(seen)])


def test_continuous_batch_eos_first_and_long_prompts_in_a_rolling_cache():
    """Mistral's window of 7 with prompts up to 20 tokens (the rolling buffer), rows joining a
    running batch of 2, one prompt whose first token is the end id."""
    model = peaked("mistral", seed=4, window=7)
    ps = prompts(5, seed=5, lengths=(20, 3, 12, 17, 6))
    eos = reference(model, ps[1], 1)[0]  # prompt 1 ends at once
    refs = [reference(model, p, MAX_NEW, eos=eos) for p in ps]
    assert refs[1] == [eos]
    r = bpd_decode(model, ps, None, BpdPlan(sources=(self_draft(model),), kv_cache="rolling"),
                   Request(max_new_tokens=MAX_NEW, eos_token_id=eos, in_flight=2))
    assert [s.tokens.tolist() for s in r.sequences] == refs


def test_drafting_leaves_the_verifiers_cache_as_it_found_it():
    from latticedraft.decoding.proposers.base import Step
    from latticedraft.gpu.verify.verifier import Verifier

    model = peaked("llama", seed=6)
    ver = Verifier(model)
    ps = prompts(2, seed=7, lengths=(5, 9))
    state, roots, _ = ver.prefill(ps)
    before = (state.length, state.end, state.valid.copy(), state.pos.copy(), state.next_pos.copy(),
              state.store[..., : state.length, :].clone())
    step = Step(index=[0, 1], rows=[0, 1], histories=[np.append(p, r) for p, r in zip(ps, roots)], rooms=[8, 8],
                cache=state)
    out = self_draft(model).propose(step)
    assert all(p.tokens.shape[1] >= 1 for p in out)
    after = (state.length, state.end, state.valid, state.pos, state.next_pos, state.store[..., : state.length, :])
    assert before[:2] == after[:2]
    assert all(np.array_equal(a, b) for a, b in zip(before[2:5], after[2:5]))
    assert torch.equal(before[5], after[5])


def test_sampling_keeps_the_target_distribution_with_the_self_draft():
    """Under sampling the self-draft drafts with the run's noise; the output is plain sampling's, token
    for token (the chi-square of the noise itself: tests/decoding/accept/test_sampling.py)."""
    from latticedraft.decoding.accept.sampling import SamplingOptions
    from tests.decoding.tiny import sampled_reference

    model = peaked("llama", seed=8)
    ps = prompts(3, seed=9, lengths=(4, 10, 7))
    opts = SamplingOptions(temperature=0.8, top_k=5, top_p=1.0, seed=4)
    src = self_draft(model)
    r = bpd_decode(model, ps, None, BpdPlan(sources=(src,)), Request(max_new_tokens=20, sampling=opts, first_row=2))
    for i, (p, q) in enumerate(zip(ps, r.sequences)):
        assert q.tokens.tolist() == sampled_reference(model, p, 20, opts, row=2 + i)
    assert sum(sum(q.accepted_drafts) for q in r.sequences) > 0


def test_widths_the_scheme_cannot_hold_fall_back_and_are_named():
    """A down projection of 40 inputs fits neither int4 (groups of 32) nor int8 (blocks of 16): it
    keeps its float weights; the fallback is listed and the decode stays exact."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    stack = LeanStack(model, Scheme("int4"))
    assert len(stack.fallbacks) == 2 and "layer 0 down_proj: neither int4 nor int8" in stack.fallbacks[0]
    ps = prompts(2, seed=1)
    r = bpd_decode(model, ps, None, BpdPlan(sources=(SelfDraftProposer(stack),)), Request(max_new_tokens=12))
    assert [s.tokens.tolist() for s in r.sequences] == [reference(model, p, 12) for p in ps]


def test_refusals_are_one_line():
    neox = Session(model=tiny_model_neox())
    with pytest.raises(ModelError, match=r"--self-draft int4: gpt_neox layers are not written out \(the lean path "
                                         r"writes out gpt2, llama, mistral, qwen2\)") as e:
        build(neox, "int4")
    assert "\n" not in str(e.value)
    assert build(neox, "auto") is None and "off (gpt_neox" in neox.learned.events[-1]


def test_a_torch_without_the_kernels_is_refused_naming_the_build(monkeypatch):
    from latticedraft.gpu.models import quantized

    monkeypatch.setattr(quantized, "has_op", lambda name: False)
    s = Session(model=tiny_model("llama", vocab=8192))
    with pytest.raises(ModelError, match=rf"--self-draft int8: torch {re.escape(torch.__version__)} has no .*install torch"):
        build(s, "int8")


def test_auto_turns_itself_off_where_a_4_bit_forward_does_not_pay(monkeypatch, own_cache):
    from latticedraft.gpu.verify import lean

    monkeypatch.setattr(lean, "token_seconds", lambda stack, other, **kw: 1.0)  # as slow as the float forward
    s = Session(model=tiny_model("llama", vocab=8192))
    assert build(s, "auto") is None and "it would not pay" in s.learned.events[-1]
    assert "int4 1.00x, int8 1.00x" in s.learned.events[-1]  # both schemes timed
    n = len(s.learned.events)
    assert build(s, "auto") is None and len(s.learned.events) == n  # decided once per session
    first = build(s, "int4")
    assert isinstance(first, SelfDraftProposer)  # asked for by name: built
    assert build(s, "int4").stack is first.stack  # a warm-up's fresh proposer shares the stack
    again = Session(model=s.model)  # a later process: the measured choice is read, nothing timed
    monkeypatch.setattr(lean, "token_seconds", lambda stack, other, **kw: pytest.fail("timed again"))
    assert build(again, "auto") is None and "read from" in again.learned.events[-1]


def test_auto_takes_the_faster_scheme_and_keeps_the_choice(monkeypatch, own_cache):
    from latticedraft.gpu.verify import lean

    monkeypatch.setattr(lean, "token_seconds", lambda stack, other, **kw: {"int4": 0.3, "int8": 0.2}[stack.scheme.kind])
    s = Session(model=tiny_model("llama", vocab=8192))
    assert build(s, "auto").stack.scheme.kind == "int8"
    assert "auto: int8" in s.learned.events[-1] and "int4 0.30x, int8 0.20x" in s.learned.events[-1]
    kept = list((own_cache / "self_draft").iterdir())
    assert len(kept) == 1 and json.loads(kept[0].read_text())["scheme"] == "int8"
    again = Session(model=s.model)
    assert build(again, "auto").stack.scheme.kind == "int8" and any("read from" in e for e in again.learned.events)


def tiny_model_neox():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    return GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=8192, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, max_position_embeddings=64)).eval()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_targets_draft_and_decode(dtype):
    """A bfloat16 or float16 target: the copy's products keep the residual stream in the target's
    dtype, drafts are kept, and (no near-ties in a peaked model) the output is generate's in that dtype."""
    model = peaked("llama", seed=11, dtype=dtype)
    ps = prompts(2, seed=12, lengths=(5, 9))
    r = bpd_decode(model, ps, None, BpdPlan(sources=(self_draft(model),)), Request(max_new_tokens=16))
    assert [s.tokens.tolist() for s in r.sequences] == [reference(model, p, 16) for p in ps]
    assert sum(sum(s.accepted_drafts) for s in r.sequences) > 0

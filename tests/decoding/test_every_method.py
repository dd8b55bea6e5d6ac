"""Every registered method, batch 1, 2 and 4 (bpd at 2: a continuous batch), on prompts that end
where the model stops: one prompt whose first generated token is the end of text, one that stops
mid-batch, two that run to the budget. Each gives one sequence per prompt, cut exactly at EOS,
and every lossless greedy method equals ``generate(do_sample=False)``. (The crash this guards: a
batch whose rows all stop at the prefill.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from latticedraft.decoding import registry
from latticedraft.decoding.accept.sampling import SamplingOptions
from latticedraft.decoding.runs.session import Session
from tests.decoding.tiny import reference

NEW = 12
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A tiny Mistral base (vocabulary of the bundled tokenizer) with Stern heads, DynaMo heads and a
    Kangaroo adapter, saved as the CLI loads them; prompts A (stops at once), B (stops later), C, D."""
    from transformers import MistralConfig, MistralForCausalLM

    from latticedraft.gpu.models.adapter import KangarooAdapter, save_adapter
    from latticedraft.gpu.models.blockwise import BlockwiseModel
    from latticedraft.gpu.models.layer_split import LayerSplit

    d = tmp_path_factory.mktemp("every-method")
    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=8192, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, sliding_window=16)
    base = MistralForCausalLM(cfg).eval()
    base.config._attn_implementation = "sdpa"
    base.save_pretrained(d / "base")
    for kind, n in (("stern", 4), ("dynamo", 3)):
        bm = BlockwiseModel.from_base(base, n, kind=kind, seed=1)
        with torch.no_grad():
            for p in bm.heads.parameters():
                p.add_(torch.randn_like(p) * 0.2)
        bm.save_pretrained(d / f"heads-{kind}", base_ref="../base")
    save_adapter(KangarooAdapter(LayerSplit(base), 1).eval(), LayerSplit(base), d / "adapter")
    rng = np.random.default_rng(3)
    cands = [rng.integers(1, 8192, size=int(rng.integers(3, 12))) for _ in range(40)]
    conts = [reference(base, p, NEW) for p in cands]
    for b, cont in enumerate(conts):  # B: a prompt whose continuation repeats a token that starts A's
        for a_, first in enumerate(c[0] for c in conts):
            if a_ != b and first in cont[1:-1]:
                eos = int(first)
                rest = [p for k, p in enumerate(cands) if k not in (a_, b) and eos not in conts[k]][:2]
                return d, base, [cands[a_], cands[b], *rest], eos
    raise AssertionError("no prompt pair found: change the seed")


def _options(method: str, d) -> dict:
    return {"bpd": {"drafter": "parallel-base", "nbest": 4},
              "mtad": {"draft_model": str(d / "base"), "gamma": 3, "beams": 2},
              "kangaroo": {"adapter": str(d / "adapter"), "gamma": 3, "eta": 0.0},
              "ppd": {"exit_layer": 1, "candidates": 3},
              "dynamo": {"no_cooccurrence": True, "epsilon_b": 0.2}}.get(method, {})


@pytest.mark.parametrize("batch", [1, 2, 4])  # 2: bpd's continuous batch (rows refill as they finish)
@pytest.mark.parametrize("method", list(registry.methods()))
def test_every_method_stops_at_eos_and_keeps_one_sequence_per_prompt(bundle, method, batch):
    d, base, ps, eos = bundle
    m = registry.get(method)
    model = d / ("heads-dynamo" if method == "dynamo" else "heads-stern")
    s = Session(model, draft_model_dir=d / "base" if method == "mtad" else None)
    s.eos = eos
    options = s.configure(method, _options(method, d))
    s.prepare(method, options, batch)
    sampling = SamplingOptions(seed=5) if m.sampling == "always" else None
    r = s.decode(ps, method, options, max_new_tokens=NEW, batch_size=batch, sampling=sampling)
    assert len(r.sequences) == len(ps)
    for q in r.sequences:
        toks = q.tokens.tolist()
        assert 1 <= len(toks) <= NEW and (len(toks) == NEW or toks[-1] == eos)
        assert eos not in toks[:-1] and sum(q.tokens_per_call) == len(toks)
    if m.lossless and sampling is None:
        assert [q.tokens.tolist() for q in r.sequences] == [reference(base, p, NEW, eos=eos) for p in ps]
        assert r.sequences[0].tokens.tolist() == [eos] and r.sequences[0].calls == 1  # A: stopped at the prefill
        assert 1 < len(r.sequences[1].tokens) < NEW  # B: stopped mid-batch


@pytest.mark.parametrize("method", [m.name for m in registry.methods().values() if m.sampling == "optional"])
def test_sampling_methods_stop_at_eos_too(bundle, method):
    d, base, ps, eos = bundle
    s = Session(d / "heads-stern")
    s.eos = eos
    options = s.configure(method, {"drafter": "top1", "do_sample": True} if method == "bpd" else {})
    outs = []
    for batch in (1, 2, 4):
        r = s.decode(ps, method, options, max_new_tokens=NEW, batch_size=batch, sampling=SamplingOptions(seed=1))
        assert len(r.sequences) == len(ps)
        for q in r.sequences:
            toks = q.tokens.tolist()
            assert len(toks) == NEW or toks[-1] == eos
            assert eos not in toks[:-1]
        outs.append([q.tokens.tolist() for q in r.sequences])
    assert outs[0] == outs[1] == outs[2]  # row r draws from default_rng([seed, r]) whatever its batch

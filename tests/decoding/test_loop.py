"""Exactness of the BPD loop: every drafter emits ``model.generate(do_sample=False)``'s tokens
on tiny random BlockwiseModels (float32 and float64, GPT-2 / LLaMA / Mistral), for batch 1
and 4 with prompts of different lengths; per-row stopping; call accounting."""

import functools
from dataclasses import replace

import numpy as np
import pytest
import torch

from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode
from latticedraft.decoding.registry import Request
from latticedraft.decoding.methods.greedy import greedy_decode
from latticedraft.decoding.proposers.heads import LatticeOptions, make_drafter
from latticedraft.errors import InputError, ModelError
from tests.decoding.tiny import blockwise, prompts, reference, tiny_model
from tests.lattice.toylm import make_toy_lm

MAX_NEW = 24

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@functools.lru_cache(maxsize=None)
def _case(arch, dtype, num_heads, seed, batch=4, lengths=(3, 9, 5, 14)):
    """(model, prompts, greedy references): built once per module, shared by the drafters."""
    model = blockwise(arch, dtype, num_heads=num_heads)
    ps = prompts(batch, seed=seed, lengths=lengths)
    return model, ps, [reference(model, p, MAX_NEW) for p in ps]


@pytest.fixture(scope="module")
def toy_lm():
    return make_toy_lm(V=64, order=3, seed=0, density=0.5)


@pytest.fixture(scope="module")
def rescorer():
    return tiny_model("gpt2", torch.float32, seed=7)


def _drafter(name, refs, lm, rescorer, k=16, prune="none", nbest=16):
    return make_drafter(name, options=LatticeOptions(k=k, prune=prune), lm=lm, rescorer=rescorer,
                        alpha=1.0, nbest=nbest, references=refs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["top1", "neural", "ngram", "parallel", "parallel-base", "oracle"])
def test_every_drafter_equals_generate_batch_4(name, dtype, toy_lm, rescorer):
    model, ps, refs = _case("gpt2", dtype, 5, 1)
    r = bpd_decode(model, ps, _drafter(name, refs, toy_lm, rescorer.to(dtype)), request=Request(max_new_tokens=MAX_NEW))
    assert [s.tokens.tolist() for s in r.sequences] == refs
    assert r.verify_mode == "tree"
    for s in r.sequences:
        assert sum(s.tokens_per_call) == len(s.tokens) == MAX_NEW
        assert s.calls == len(s.tokens_per_call) == 1 + len(s.accepted_drafts)
        assert all(1 <= n <= 5 for n in s.tokens_per_call)


@pytest.mark.parametrize("arch", ["gpt2", "llama", "mistral", "qwen2"])
@pytest.mark.parametrize("batch", [1, 4])
def test_parallel_16_on_otsu_pruned_lattices(arch, batch, toy_lm):
    model, ps, refs = _case(arch, torch.float32, 4, 2, batch, (11, 4, 8, 2))
    d = _drafter("parallel", refs, toy_lm, None, k=8, prune="otsu", nbest=16)
    r = bpd_decode(model, ps, d, request=Request(max_new_tokens=MAX_NEW))
    assert [s.tokens.tolist() for s in r.sequences] == refs


def test_oracle_with_whole_vocab_accepts_every_slot():
    """k = V puts the true token in every slot, so each call emits all h tokens: the
    accept/commit path is exercised at full length, and still exact."""
    model = blockwise("llama", torch.float64, num_heads=4)
    ps = prompts(4, seed=3)
    refs = [reference(model, p, MAX_NEW) for p in ps]
    r = bpd_decode(
        model,
        ps,
        make_drafter("oracle", options=LatticeOptions(k=64), references=refs),
        request=Request(max_new_tokens=MAX_NEW),
    )
    assert [s.tokens.tolist() for s in r.sequences] == refs
    for s in r.sequences:  # 1 (prefill) + 4 + 4 + ... ; the last call may be cut by max_new_tokens
        assert s.tokens_per_call[0] == 1 and all(n == 4 for n in s.tokens_per_call[1:-1])
    assert r.block_efficiency == pytest.approx(4 * MAX_NEW / sum(s.calls for s in r.sequences))


def test_batched_fallback_is_exact_with_sliding_window(toy_lm):
    model = blockwise("mistral", torch.float32, num_heads=4)
    ps = prompts(4, seed=4)
    refs = [reference(model, p, MAX_NEW) for p in ps]
    r = bpd_decode(
        model,
        ps,
        make_drafter("oracle", options=LatticeOptions(k=64), references=refs),
        request=Request(max_new_tokens=MAX_NEW, verify="batched"),
    )
    assert r.verify_mode == "batched"
    assert [s.tokens.tolist() for s in r.sequences] == refs


def test_rows_stop_on_their_own_eos():
    model = blockwise("gpt2", torch.float64, num_heads=4)
    ps = prompts(4, seed=5)
    free = [reference(model, p, MAX_NEW) for p in ps]
    eos = free[1][5]  # a token row 1 emits; other rows may stop on it too, or not at all
    refs = [reference(model, p, MAX_NEW, eos=eos) for p in ps]
    assert len(refs[1]) <= 6
    streamed = {i: [] for i in range(4)}
    r = bpd_decode(
        model,
        ps,
        make_drafter("oracle", options=LatticeOptions(k=64), references=free),
        request=Request(max_new_tokens=MAX_NEW, eos_token_id=eos, on_tokens=lambda i, t: streamed[i].extend(t)),
    )
    assert [s.tokens.tolist() for s in r.sequences] == refs
    assert [streamed[i] for i in range(4)] == refs


def test_greedy_baseline_and_one_token_budget():
    model = blockwise("gpt2", torch.float32, num_heads=3)
    ps = prompts(2, seed=6)
    g = greedy_decode(model, ps, max_new_tokens=5)
    assert [s.tokens.tolist() for s in g.sequences] == [reference(model, p, 5) for p in ps]
    assert g.block_efficiency == 1.0
    r = bpd_decode(model, ps, make_drafter("top1"), request=Request(max_new_tokens=1))
    assert [s.calls for s in r.sequences] == [1, 1]


def test_plain_causal_lm_decodes_greedily():
    model = tiny_model("llama")
    p = prompts(1)[0]
    r = bpd_decode(model, [p], make_drafter("top1"), request=Request(max_new_tokens=6))
    assert r.sequences[0].tokens.tolist() == reference(model, p, 6) and r.block_efficiency == 1.0


def test_bad_arguments():
    model = blockwise("gpt2", num_heads=3)
    with pytest.raises(InputError, match="max_new_tokens"):
        bpd_decode(model, [[1, 2]], make_drafter("top1"), request=Request(max_new_tokens=0))
    with pytest.raises(InputError, match="256 positions"):
        bpd_decode(model, [list(range(1, 60)) * 4], make_drafter("top1"), request=Request(max_new_tokens=30))
    with pytest.raises(InputError, match="--lm"):
        make_drafter("ngram")
    with pytest.raises(InputError, match="unknown drafter"):
        make_drafter("psychic")
    with pytest.raises(InputError, match="--prune"):
        LatticeOptions(prune="sometimes")
    dyn = blockwise("gpt2", num_heads=3)
    dyn.kind = "dynamo"
    with pytest.raises(ModelError, match="--method dynamo"):
        bpd_decode(dyn, [[1, 2]], make_drafter("top1"))


def test_oracle_references_follow_the_prompt_across_batches():
    """Decoding in chunks (batch_size 1) must give each prompt its own reference: the
    oracle's per-prompt efficiency is the same whatever the batch size."""
    from latticedraft.decoding.results import merge

    model = blockwise("gpt2", torch.float32, num_heads=4)
    ps = prompts(4, seed=5)
    refs = [reference(model, p, MAX_NEW) for p in ps]
    assert len({tuple(r) for r in refs}) > 1  # distinct references, or the test proves nothing
    oracle = make_drafter("oracle", options=LatticeOptions(k=8), references=refs)
    runs = {
        bs: merge(
            [
                bpd_decode(model, ps[s : s + bs], oracle, request=Request(max_new_tokens=MAX_NEW, first_row=s))
                for s in range(0, len(ps), bs)
            ]
        )
        for bs in (1, 4)
    }
    for r in runs.values():
        assert [s.tokens.tolist() for s in r.sequences] == refs
    assert [s.calls for s in runs[1].sequences] == [s.calls for s in runs[4].sequences]


@pytest.mark.parametrize("arch", ["gpt2", "mistral"])
def test_fewer_slots_compute_fewer_heads_and_stay_exact(arch, toy_lm):
    model, ps, refs = _case(arch, torch.float32, 5, 4)
    d = make_drafter("parallel", options=LatticeOptions(k=8, slots=2), lm=toy_lm, alpha=1.0, nbest=4)
    r = bpd_decode(model, ps, d, request=Request(max_new_tokens=MAX_NEW, record_steps=True))
    assert [s.tokens.tolist() for s in r.sequences] == refs
    assert all(st.sausage.h == 2 for st in r.steps)  # heads 1..2 only
    assert all(n <= 3 for s in r.sequences for n in s.tokens_per_call)


def _repetitive(batch, seed, lengths=(6, 11, 4, 9)):
    """Prompts that repeat a random motif, so context n-grams find matches from the first step."""
    rng = np.random.default_rng(seed)
    return [np.tile(rng.integers(1, 64, size=n), 3).astype(np.int64) for n in lengths[:batch]]


def _flat_or_steep(slope):
    from latticedraft.gpu.verify.cost_model import CostModel

    n = np.arange(1, 65)
    return CostModel(tuple(n.tolist()), tuple((1.0 + slope * (n - 1)).tolist()))


@pytest.mark.parametrize("arch", ["gpt2", "llama", "mistral"])
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize(
    "tree,ctx,vocab,slope,verify",
    [
        ("auto", 3, None, 0.02, "auto"),
        ("auto", 2, 24, 0.5, "auto"),
        ("fixed", 3, 24, None, "auto"),
        ("auto", None, 24, 0.05, "auto"),
        ("fixed", 2, None, None, "batched"),
        ("auto", 3, None, 0.1, "batched"),
    ],
)
def test_tree_policies_context_ngrams_and_draft_vocab_stay_exact(arch, batch, tree, ctx, vocab, slope, verify, toy_lm):
    from latticedraft.decoding.proposers.context import ContextNgrams, ContextProposer

    model = blockwise(arch, torch.float32, num_heads=4, seed=3)
    ps = _repetitive(batch, seed=5) if ctx else prompts(batch, seed=5, lengths=(7, 3, 12, 5))
    refs = [reference(model, p, MAX_NEW) for p in ps]
    ids = np.random.default_rng(0).permutation(64)[:vocab] if vocab else None
    d = make_drafter("parallel-base", options=LatticeOptions(k=4), alpha=1.0, nbest=4)
    r = bpd_decode(
        model,
        ps,
        d,
        BpdPlan(
            tree=tree,
            sources=(ContextProposer(ContextNgrams(max_ngram=ctx)),) if ctx else (),
            draft_vocab=ids,
            cost=None if slope is None else _flat_or_steep(slope),
        ),
        Request(max_new_tokens=MAX_NEW, verify=verify, record_steps=True),
    )
    assert [s.tokens.tolist() for s in r.sequences] == refs
    for s in r.sequences:
        assert len(s.tree_nodes) == len(s.accepted_drafts) and all(n >= 1 for n in s.tree_nodes)
    if vocab:  # every head-drafted token comes from the draft vocabulary
        assert all(
            set(st.sausage.tokens[st.sausage.tokens >= 0].tolist()) <= set(ids.tolist())
            for st in r.steps
            if st.sausage is not None
        )
    if ctx and tree == "fixed":  # the context paths are in the verified trees
        assert sum(a for s in r.sequences for a in s.accepted_drafts) > 0


def test_auto_tree_follows_the_cost_curve():
    """A flat T(n) verifies big trees, a steep one nothing beyond the root; both exact."""
    model = blockwise("gpt2", torch.float32, num_heads=4, seed=3)
    ps = prompts(2, seed=6)
    d = make_drafter("parallel-base", options=LatticeOptions(k=4), alpha=1.0, nbest=8)
    flat = bpd_decode(model, ps, d, BpdPlan(tree="auto", cost=_flat_or_steep(0.0)), Request(max_new_tokens=MAX_NEW))
    steep = bpd_decode(model, ps, d, BpdPlan(tree="auto", cost=_flat_or_steep(100.0)), Request(max_new_tokens=MAX_NEW))
    refs = [reference(model, p, MAX_NEW) for p in ps]
    for r in (flat, steep):
        assert [s.tokens.tolist() for s in r.sequences] == refs
    assert all(n == 1 for s in steep.sequences for n in s.tree_nodes)
    assert np.mean([n for s in flat.sequences for n in s.tree_nodes]) > 4


@pytest.mark.parametrize("arch", ["gpt2", "mistral"])
def test_no_drafter_is_the_greedy_loop_and_context_alone_is_prompt_lookup(arch):
    from latticedraft.decoding.proposers.context import ContextNgrams, ContextProposer

    model = blockwise(arch, torch.float32, num_heads=4, seed=3)
    ps = _repetitive(4, seed=8)
    refs = [reference(model, p, MAX_NEW) for p in ps]
    plain = bpd_decode(model, ps, None, request=Request(max_new_tokens=MAX_NEW))
    assert [s.tokens.tolist() for s in plain.sequences] == refs
    assert all(n == 1 for s in plain.sequences for n in s.tokens_per_call)
    ctx = bpd_decode(model, ps, None, BpdPlan(sources=(ContextProposer(ContextNgrams(max_ngram=3)),)), Request(max_new_tokens=MAX_NEW))
    assert [s.tokens.tolist() for s in ctx.sequences] == refs


@pytest.mark.parametrize("verify", ["auto", "batched"])
def test_head_gate_skips_heads_on_some_steps_and_stays_exact(verify):
    from latticedraft.decoding.proposers.context import ContextNgrams, ContextProposer

    model = blockwise("llama", torch.float32, num_heads=4, seed=3)
    ps = _repetitive(2, seed=9, lengths=(5, 8))
    refs = [reference(model, p, 40) for p in ps]
    d = make_drafter("parallel-base", options=LatticeOptions(k=4), alpha=1.0, nbest=4)
    r = bpd_decode(
        model,
        ps,
        d,
        BpdPlan(tree="auto", sources=(ContextProposer(ContextNgrams(max_ngram=3)),), cost=_flat_or_steep(0.05)),
        Request(max_new_tokens=40, verify=verify),
    )
    assert [s.tokens.tolist() for s in r.sequences] == refs
    flags = [f for s in r.sequences for f in s.heads_per_step]
    assert len(flags) == sum(len(s.accepted_drafts) for s in r.sequences)
    assert 0 in flags and 1 in flags  # the gate tried both arms


@pytest.mark.parametrize("name", ["top1", "neural", "ngram", "parallel", "parallel-base", "oracle"])
def test_every_drafter_with_the_fast_options_equals_generate(name, toy_lm, rescorer):
    """--tree auto, context n-grams and a reduced draft vocabulary on every drafter, batch 4."""
    from latticedraft.decoding.proposers.context import ContextNgrams, ContextProposer
    from latticedraft.decoding.planning.head_gate import HeadGate

    model, ps, refs = _case("gpt2", torch.float32, 5, 1)
    ps = [np.concatenate([p, p]) for p in ps]  # repeated text: the context paths get accepted
    refs = [reference(model, p, MAX_NEW) for p in ps]
    ids = np.random.default_rng(1).permutation(64)[:32]
    gate = HeadGate()
    for batch in (ps, ps[:1]):
        r = bpd_decode(
            model,
            batch,
            _drafter(name, refs, toy_lm, rescorer, nbest=4),
            BpdPlan(
                tree="auto", sources=(ContextProposer(ContextNgrams(max_ngram=3)),), draft_vocab=ids, cost=_flat_or_steep(0.1), gate=gate
            ),
            Request(max_new_tokens=MAX_NEW),
        )
        assert [s.tokens.tolist() for s in r.sequences] == refs[: len(batch)]


@pytest.mark.parametrize("arch", ["gpt2", "llama", "mistral"])
@pytest.mark.parametrize(
    "batch,tree,heads,slots",
    [(1, "fixed", False, None), (4, "fixed", True, None), (4, "auto", True, None), (4, "auto", False, 2)],
)
def test_lm_drafts_are_verified_and_stay_exact(arch, batch, tree, heads, slots, toy_lm):
    """The n-gram LM's continuation rides along as one more path (with heads and context paths, a
    fixed or auto tree, a continuous batch): every output is ``generate``'s, and with the fixed
    tree every step verifies the LM's continuation of its history (cut to the row's room)."""
    from latticedraft.decoding.planning.head_gate import HeadGate
    from latticedraft.decoding.proposers.context import ContextNgrams, ContextProposer
    from latticedraft.decoding.proposers.lm_ngrams import LMNgrams, LMProposer
    from latticedraft.lattice.lm_tables import lm_arrays

    model = blockwise(arch, torch.float32, num_heads=4, seed=3)
    ps = prompts(batch, seed=5, lengths=(7, 3, 12, 5))
    refs = [reference(model, p, MAX_NEW) for p in ps]
    lm = (LMNgrams(4), lm_arrays(toy_lm))
    d = make_drafter("parallel-base", options=LatticeOptions(k=4), alpha=1.0, nbest=4) if heads else None
    r = bpd_decode(
        model,
        ps,
        d,
        BpdPlan(
            tree=tree,
            sources=(ContextProposer(ContextNgrams(max_ngram=3)), LMProposer(*lm)),
            cost=None if tree == "fixed" else _flat_or_steep(0.02),
            gate=HeadGate(),
        ),
        Request(max_new_tokens=MAX_NEW, in_flight=slots, record_steps=True),
    )
    assert [s.tokens.tolist() for s in r.sequences] == refs
    if tree == "fixed":
        for st in r.steps:
            toks, _ = lm[0].continuation(lm[1], st.history)
            room = MAX_NEW - (len(st.history) - len(ps[st.row])) - 1
            want = toks[:room].tolist()
            assert any(row[row >= 0].tolist()[: len(want)] == want for row in np.atleast_2d(st.drafts)), st.row


# -- a continuous batch: rows that finish make room for the next prompts --------------------------
@pytest.mark.parametrize(
    "arch,verify",
    [("gpt2", "auto"), ("llama", "auto"), ("mistral", "auto"), ("llama", "batched"), ("mistral", "batched")],
)
def test_a_continuous_batch_equals_generate_row_by_row(arch, verify, toy_lm):
    """Seven prompts of different lengths through 3 rows, heads and context paths on an auto tree
    with the head gate (rows finish at different steps, so later prompts join running rows, the
    rolling buffer's included): every output is ``generate``'s; with max_new_tokens = 1 every row
    finishes at its first token and the next ones are admitted at once."""
    from latticedraft.decoding.planning.head_gate import HeadGate
    from latticedraft.decoding.proposers.context import ContextNgrams, ContextProposer

    model = blockwise(arch, torch.float32, num_heads=4, seed=3)
    ps = _repetitive(4, seed=5) + prompts(3, seed=8, lengths=(11, 2, 17))
    refs = [reference(model, p, MAX_NEW) for p in ps]
    d = make_drafter("parallel-base", options=LatticeOptions(k=4), alpha=1.0, nbest=4)
    plan = BpdPlan(tree="auto", sources=(ContextProposer(ContextNgrams(max_ngram=3)),), cost=_flat_or_steep(0.02))
    r = bpd_decode(
        model, ps, d, replace(plan, gate=HeadGate()), Request(max_new_tokens=MAX_NEW, in_flight=3, verify=verify)
    )
    assert [s.tokens.tolist() for s in r.sequences] == refs
    assert len({len(s.tokens_per_call) for s in r.sequences}) > 1  # rows took different numbers of steps
    one = bpd_decode(model, ps, d, plan, Request(max_new_tokens=1, in_flight=3, verify=verify))
    assert [s.tokens.tolist() for s in one.sequences] == [x[:1] for x in refs]


def test_prompts_of_unlike_lengths_are_prefilled_apart():
    """A prefill call takes prompts while its padding stays within PAD_SHARE of their tokens: a long
    prompt is not padded onto short ones; the rows still equal ``generate`` and start together."""
    from latticedraft.decoding import loop
    from latticedraft.gpu.verify.verifier import Verifier

    assert [loop.prefill_group(x) for x in ([40, 926, 50, 60], [926, 50], [50, 60], [100] * 4, [100, 90, 80, 20])] \
        == [1, 1, 2, 4, 3]
    model = tiny_model("llama", torch.float32, seed=2)
    ps = prompts(4, seed=3, lengths=(3, 40, 4, 5))
    calls = []
    verifier = Verifier.for_model(model)
    prompt_call = verifier.prompt_call
    verifier.prompt_call = lambda rows, **kw: calls.append(len(rows)) or prompt_call(rows, **kw)
    r = loop.speculative_decode(verifier, ps, [], Request(max_new_tokens=MAX_NEW))
    assert calls == [1, 1, 2]
    assert [s.tokens.tolist() for s in r.sequences] == [reference(model, p, MAX_NEW) for p in ps]


def test_a_continuous_batch_with_eos_and_sampling_repeats_the_fixed_batch_rows():
    """Lossless sampling draws per row (seed, row), so a row emits the same tokens in a continuous
    batch as alone; an EOS ends rows early and frees their rows."""
    from latticedraft.decoding.accept.sampling import SamplingOptions

    model = blockwise("llama", torch.float32, num_heads=3, seed=2)
    ps = prompts(5, seed=9, lengths=(4, 9, 6, 13, 3))
    d = make_drafter("top1", options=LatticeOptions(k=4))
    opts = SamplingOptions(temperature=1.0, top_k=20, seed=4)
    eos = int(
        bpd_decode(model, ps[1:2], d, request=Request(max_new_tokens=16, sampling=opts, first_row=1))
        .sequences[0]
        .tokens[4]
    )
    alone = [
        bpd_decode(
            model, [p], d, request=Request(max_new_tokens=16, sampling=opts, eos_token_id=eos, first_row=i)
        ).sequences[0]
        for i, p in enumerate(ps)
    ]
    batch = bpd_decode(
        model, ps, d, request=Request(max_new_tokens=16, sampling=opts, eos_token_id=eos, in_flight=2)
    ).sequences
    assert [s.tokens.tolist() for s in batch] == [s.tokens.tolist() for s in alone]
    assert len(batch[1].tokens) <= 5 and batch[1].tokens[-1] == eos  # an EOS ended a row early


def test_a_continuous_batch_needs_proposers_that_admit_rows():
    from latticedraft.decoding.loop import speculative_decode
    from latticedraft.decoding.registry import Request
    from latticedraft.decoding.proposers.draft_model import ModelProposer

    model, ps, _ = _case("llama", torch.float32, 2, 0)
    with pytest.raises(InputError, match="fixed batches"):
        speculative_decode(
            model,
            ps,
            [ModelProposer(tiny_model("llama", torch.float32, seed=2), 3)],
            Request(max_new_tokens=4, in_flight=2),
        )
    with pytest.raises(InputError, match="in_flight = 0"):
        speculative_decode(model, ps, [], Request(max_new_tokens=4, in_flight=0))

"""Lossless speculative sampling (``accept/sampling.py`` on the one loop): exact distributions.

Exactness by enumeration, as for lookahead (``test_lookahead_sampling.py``): the real decoder
runs once per outcome path of every random decision (draft draws, accepts, residual draws),
each path weighted by its probability, which gives the exact distribution of the first 3
emitted tokens; it must equal the target's own sampling distribution (transformers' logits
processors, full forwards) to 1e-9. Tiny LLaMA, V = 8, float64. Supports are kept small (top-k,
top-p, one or two draft slots) so the number of paths stays in the hundreds.
"""

from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from latticedraft.decoding.methods.bpd_loop import bpd_decode
from latticedraft.decoding.registry import Request
from latticedraft.decoding.proposers.heads import LatticeOptions, make_drafter
from latticedraft.decoding.accept.sampling import SamplingOptions, SpeculativeRule, accept, attempts_at
from latticedraft.gpu.models.blockwise import BlockwiseModel
from tests.decoding.proposers.test_lookahead_sampling import enumerate_outcomes, target_distribution
from tests.decoding.tiny import reference, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
V = 8
PROMPT = np.array([1, 2, 3, 1, 2, 3, 1, 2], dtype=np.int64)


def heads_model(num_heads: int, arch: str = "llama", dtype=torch.float64):
    m = BlockwiseModel.from_base(tiny_model(arch, dtype, seed=3, vocab=V), num_heads, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for prm in m.heads.parameters():
            prm.add_(torch.randn(prm.shape, generator=g).to(prm.dtype) * 0.5)
    return m.eval()


def assert_exact(run, base, opts, prompt=PROMPT):
    got, paths = enumerate_outcomes(run)
    want = target_distribution(base, prompt, opts)
    assert set(got) <= set(want)
    assert max(abs(got.get(s, 0.0) - want[s]) for s in want) < 1e-9
    return paths


@pytest.mark.parametrize("q_kind", ["sampled", "one-hot", "mixed"])
def test_one_node_distribution_equals_p(q_kind):
    """accept alone: i.i.d. attempts from q, deterministic ones, and both, give exactly p."""
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(5))
    q = rng.dirichlet(np.ones(5))
    q[1] = 0.0
    q /= q.sum()
    support = np.flatnonzero(q)
    for n in (1, 2, 3):
        acc = np.zeros(5)
        for xs in np.ndindex(*(len(support),) * n):  # every ordered draw of n attempts from q
            toks = support[list(xs)]
            w = float(np.prod(q[toks])) if q_kind != "one-hot" else 1.0 / len(support) ** n
            att = [(t, None if q_kind == "one-hot" or (q_kind == "mixed" and k % 2) else q)
                   for k, t in enumerate(toks)]
            if q_kind == "mixed":  # one-hot attempts are not draws: weight only the sampled ones
                w = float(np.prod([q[t] for k, t in enumerate(toks) if not k % 2])) / len(support) ** (n // 2)
            dist, _ = enumerate_outcomes(lambda d: accept(p, att, 0, d))
            for tok, pr in dist.items():
                acc[tok] += w * pr
        np.testing.assert_allclose(acc, p, rtol=0, atol=1e-12)


def test_attempts_follow_the_drafts_through_a_node():
    drafts = np.array([[4, 1, 2], [4, 3, -1], [5, 1, 1], [4, 1, 7]])
    qs = np.arange(4 * 3 * 2, dtype=float).reshape(4, 3, 2)
    assert [t for t, _ in attempts_at(drafts, None, ())] == [4, 4, 5, 4]
    assert [t for t, _ in attempts_at(drafts, None, (4,))] == [1, 3, 1]
    att = attempts_at(drafts, qs, (4, 1))
    assert [t for t, _ in att] == [2, 7] and np.array_equal(att[1][1], qs[3, 2])
    assert attempts_at(drafts, None, (4, 3)) == []


@pytest.mark.parametrize("drafter,heads,verify,opts", [
    ("top1", 3, "tree", SamplingOptions(temperature=0.7, top_k=2, top_p=1.0)),
    ("parallel-base", 2, "tree", SamplingOptions(temperature=1.0, top_k=2, top_p=1.0)),  # tree: p = 4 paths
    ("top1", 2, "batched", SamplingOptions(temperature=1.3, top_k=0, top_p=0.45)),
    ("ngram-like one-hot", 2, "tree", SamplingOptions(temperature=1.0, top_k=3, top_p=1.0)),
])
def test_head_drafts_first_three_tokens_have_the_target_distribution(drafter, heads, verify, opts):
    model = heads_model(heads)
    if drafter == "ngram-like one-hot":  # deterministic paths (how rescored lattices are verified)
        d = make_drafter("parallel-base", options=LatticeOptions(k=3), nbest=3)
        d.sample = lambda h, v, hist, s, room: (np.atleast_2d(d.draft(d.lattice(h, v), hist).tokens)[:, :room], None)
    else:
        d = make_drafter(drafter, options=LatticeOptions(k=4), nbest=4)

    def run(draws):
        r = bpd_decode(model, [PROMPT], d, request=Request(max_new_tokens=3, sampling=opts, verify=verify),
                       rule=SpeculativeRule(opts, draws))
        return tuple(r.sequences[0].tokens.tolist())

    assert_exact(run, model.base, opts)


@pytest.mark.parametrize("confidence", [0.0, 0.7])
def test_model_drafter_first_three_tokens_have_the_target_distribution(confidence):
    """(confidence 0.7 ends some drafts early: a draft's length may follow its own draws.)"""
    target = tiny_model("llama", torch.float64, seed=3, vocab=V)
    draft = tiny_model("llama", torch.float64, seed=9, vocab=V)
    opts = SamplingOptions(temperature=0.8, top_k=2, top_p=1.0)
    d = make_drafter("model", draft_model=draft, gamma=2, confidence=confidence)

    def run(draws):
        r = bpd_decode(target, [PROMPT], d, request=Request(max_new_tokens=3, sampling=opts),
                       rule=SpeculativeRule(opts, draws))
        return tuple(r.sequences[0].tokens.tolist())

    assert_exact(run, target, opts)


@pytest.mark.parametrize("tree", ["fixed", "auto"])
def test_context_and_suffix_drafts_without_a_drafter_keep_the_target_distribution(tree):
    """Without a drafter, context n-grams and suffix drafts (two deterministic sources of the
    history) are planned as in greedy decoding, the cost-aware tree included: one-hot attempts,
    exact whichever paths the plan keeps."""
    from latticedraft.decoding.methods.bpd_loop import BpdPlan
    from latticedraft.decoding.proposers.context import ContextNgrams
    from latticedraft.decoding.proposers.suffix import SuffixProposer
    from latticedraft.gpu.verify.cost_model import CostModel

    target = tiny_model("llama", torch.float64, seed=3, vocab=V)
    opts = SamplingOptions(temperature=0.9, top_k=3, top_p=1.0)
    cost = CostModel((1, 2, 4, 8), (1.0, 1.2, 1.5, 2.5)) if tree == "auto" else None
    counts = []

    def run(draws):
        plan = BpdPlan(tree=tree, cost=cost, context=ContextNgrams(max_ngram=3), extra=(SuffixProposer(3),))
        r = bpd_decode(target, [PROMPT], None, plan, Request(max_new_tokens=3, sampling=opts, record_steps=True),
                       rule=SpeculativeRule(opts, draws))
        counts.append(max(r.sequences[0].tree_nodes, default=1))
        return tuple(r.sequences[0].tokens.tolist())

    assert_exact(run, target, opts)
    assert max(counts) > 2  # the drafts were verified, not only the root


def test_repetition_penalty_is_in_p_and_q():
    model = heads_model(2)
    opts = SamplingOptions(temperature=1.0, top_k=2, top_p=1.0, repetition_penalty=1.8)
    d = make_drafter("top1", options=LatticeOptions(k=4))

    def run(draws):
        return tuple(bpd_decode(model, [PROMPT], d, request=Request(max_new_tokens=3, sampling=opts),
                                rule=SpeculativeRule(opts, draws)).sequences[0]
                     .tokens.tolist())

    assert_exact(run, model.base, opts)


def test_neural_drafter_first_three_tokens_have_the_target_distribution():
    model = heads_model(2)
    resc = tiny_model("gpt2", torch.float64, seed=5, vocab=V)
    opts = SamplingOptions(temperature=1.0, top_k=2, top_p=1.0)
    d = make_drafter("neural", options=LatticeOptions(k=4), rescorer=resc, alpha=0.7)

    def run(draws):
        return tuple(bpd_decode(model, [PROMPT], d, request=Request(max_new_tokens=3, sampling=opts),
                                rule=SpeculativeRule(opts, draws)).sequences[0]
                     .tokens.tolist())

    assert_exact(run, model.base, opts)


@pytest.mark.slow
def test_chi_square_of_20000_seeded_continuations():
    """End to end, seeded: 20 000 two-token continuations (rows of batches of 50, tree drafts
    of 4 paths) against the target's exact distribution, by a chi-square test."""
    model = heads_model(2, dtype=torch.float32)
    opts = SamplingOptions(temperature=1.0, top_k=4, top_p=1.0, seed=11)
    d = make_drafter("parallel-base", options=LatticeOptions(k=4), nbest=4)
    counts, b = Counter(), 500
    for s in range(0, 20000, b):
        r = bpd_decode(model, [PROMPT] * b, d, request=Request(max_new_tokens=2, sampling=opts, first_row=s))
        counts.update(tuple(q.tokens.tolist()) for q in r.sequences)
    want = target_distribution(model.base.double(), PROMPT, opts, length=2)
    keys = sorted(want)
    f_obs = np.array([counts.get(k, 0) for k in keys], dtype=float)
    f_exp = np.array([want[k] for k in keys]) * 20000
    assert sum(counts.values()) == 20000 and set(counts) <= set(want)
    assert chisquare(f_obs, f_exp / f_exp.sum() * f_obs.sum()).pvalue > 0.001


def test_seeded_rows_repeat_and_do_not_depend_on_the_batch():
    model = heads_model(3, arch="gpt2", dtype=torch.float32)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, V, size=n) for n in (4, 9, 6)]
    d = make_drafter("parallel-base", options=LatticeOptions(k=4), nbest=3)

    def out(ps, seed=7, first_row=0):
        o = SamplingOptions(temperature=1.0, top_k=0, top_p=1.0, seed=seed)
        res = bpd_decode(model, ps, d, request=Request(max_new_tokens=12, sampling=o, first_row=first_row))
        return [q.tokens.tolist() for q in res.sequences]

    both = out(prompts)
    assert both == out(prompts)
    assert out(prompts[1:], first_row=1) == both[1:]
    assert out(prompts, seed=8) != both


@pytest.mark.parametrize("arch", ["gpt2", "llama", "mistral"])
@pytest.mark.parametrize("batch", [1, 4])
def test_model_drafter_greedy_equals_generate(arch, batch):
    target = tiny_model(arch, torch.float32, seed=1, vocab=64)
    draft = tiny_model(arch, torch.float32, seed=2, vocab=64)
    rng = np.random.default_rng(batch)
    prompts = [rng.integers(1, 64, size=n) for n in (5, 11, 3, 8)[:batch]]
    r = bpd_decode(target, prompts, make_drafter("model", draft_model=draft, gamma=3),
                   request=Request(max_new_tokens=20))
    for p, q in zip(prompts, r.sequences):
        assert q.tokens.tolist() == reference(target, p, 20)
    same = bpd_decode(target, prompts, make_drafter("model", draft_model=target, gamma=3, confidence=0.0),
                      request=Request(max_new_tokens=20))
    assert [q.tokens.tolist() for q in same.sequences] == [q.tokens.tolist() for q in r.sequences]
    assert same.block_efficiency > 3.0  # a draft model equal to the target: every draft accepted


def test_acceptance_calibration_starts_at_the_draft_probability_and_follows_what_was_kept():
    from latticedraft.decoding.planning.acceptance import head_bins
    from latticedraft.decoding.proposers.draft_model import AcceptanceCalibration

    c = AcceptanceCalibration()
    assert c.rate([0.33, 0.97]).tolist() == pytest.approx([0.35, 0.975])  # the bins' middles
    for _ in range(200):
        c.observe(np.array([0.33, 0.33, 0.33]), kept=3)  # flat but right: every token kept
        c.observe(np.array([0.97, 0.97]), kept=0)  # sure but wrong: the first token missed, the second untried
    assert c.rate([0.33])[0] > 0.95 and c.rate([0.97])[0] < 0.05
    assert c.tried[head_bins(0.97)] == pytest.approx(4 + 200)  # the prior's 4, then first tokens only


@pytest.mark.parametrize("tree", ["fixed", "auto"])
def test_draft_confidence_ends_the_draft_and_rates_its_tokens(tree):
    """A draft stops once its calibrated chance of being accepted whole falls below ``confidence``;
    under the auto tree each token carries its calibrated chance as its rate; what the target kept
    calibrates the next steps; the output stays HF greedy's."""
    from latticedraft.decoding.methods.bpd_loop import BpdPlan
    from latticedraft.decoding.planning.acceptance import AcceptanceModel
    from latticedraft.decoding.proposers.base import Step, StepRows
    from latticedraft.gpu.verify.cost_model import CostModel

    target = tiny_model("llama", torch.float32, seed=1, vocab=64)
    draft = tiny_model("llama", torch.float32, seed=2, vocab=64)
    history = np.array([5, 9, 17, 3], dtype=np.int64)
    with torch.no_grad():
        logits = draft(torch.as_tensor(history[None])).logits[0, -1]
    p0 = float(torch.softmax(logits, -1).max())
    for confidence, want in [(0.0, 4), (0.99, 1)]:
        d = make_drafter("model", draft_model=draft, gamma=4, confidence=confidence)
        d.start(StepRows([0], [0], [history]))
        step = Step([0], [0], [history], [8], acceptance=AcceptanceModel.prior())
        prop = d.propose(step)[0]
        assert prop.tokens.shape == (1, want) and prop.tokens[0, 0] == int(logits.argmax())
        assert prop.rates[0, 0] == pytest.approx(float(d.calibration.rate([p0])[0]))
        tried = d.calibration.tried.sum()
        d.update(step, [prop.tokens[0, :1]], np.array([7]), None)  # kept the first token, then the target's 7
        assert d.calibration.tried.sum() == tried + min(2, want) and d.calibration.hits.sum() > 0
    rng = np.random.default_rng(3)
    prompts = [rng.integers(1, 64, size=n) for n in (5, 11, 3)]
    cost = CostModel((1, 2, 4, 8), (1.0, 1.2, 1.5, 2.5)) if tree == "auto" else None
    for confidence in (0.0, 0.05, 0.5):
        r = bpd_decode(target, prompts, make_drafter("model", draft_model=draft, gamma=3, confidence=confidence),
                       BpdPlan(tree=tree, cost=cost), Request(max_new_tokens=20))
        assert [q.tokens.tolist() for q in r.sequences] == [reference(target, p, 20) for p in prompts]


# -- MTAD (approximate; exact only in its limits) ---------------------------------------------
from latticedraft.decoding.accept.mtad import MtadRule  # noqa: E402
from latticedraft.decoding.proposers.mtad import MtadProposer, beam_sample  # noqa: E402


@pytest.mark.parametrize("verify", ["tree", "batched"])
def test_mtad_with_tau_at_least_one_is_ordinary_sampling(verify):
    target = tiny_model("llama", torch.float64, seed=3, vocab=V)
    draft = tiny_model("llama", torch.float64, seed=9, vocab=V)
    opts = SamplingOptions(temperature=1.0, top_k=3, top_p=0.9)

    def run(draws):
        r = bpd_decode(target, [PROMPT], MtadProposer(draft, gamma=2, beams=3),
                       request=Request(max_new_tokens=3, sampling=opts, verify=verify),
                       rule=MtadRule(opts, tau=1.0, draws=draws))
        return tuple(r.sequences[0].tokens.tolist())

    assert_exact(run, target, opts)


def test_mtad_accepts_every_draft_when_q_is_p():
    target = tiny_model("llama", torch.float64, seed=3, vocab=V)
    opts = SamplingOptions(temperature=1.0, top_k=4, top_p=0.9, seed=2)
    r = bpd_decode(target, [PROMPT, PROMPT[:5]], MtadProposer(target, gamma=4, beams=3),
                   request=Request(max_new_tokens=21, sampling=opts), rule=MtadRule(opts, tau=0.1))
    for q in r.sequences:
        assert q.accepted_drafts == [4] * 4  # 1 (prefill) + 4 steps of 4 accepted + 1 end token = 21
        assert len(q.tokens) == 21


def test_mtad_eta_is_the_largest_passing_index():
    ch = MtadRule(SamplingOptions(), tau=0.6)
    P = np.full((4, 2), 0.5)
    # joint p: 0.5, 0.25, 0.125; q: 0.5 (passes), 0.9 (0.28 fails), 0.2 (0.625 passes) -> eta = 3
    assert ch.eta(P, np.array([0, 1, 0]), np.array([0.5, 0.9, 0.2])) == 3
    assert ch.eta(P, np.array([0, 1, 0]), np.array([0.9, 0.9, 0.9])) == 0


def test_beam_sample_returns_the_joint_q_of_its_best_beam():
    draft = tiny_model("llama", torch.float64, seed=9, vocab=V)
    opts = SamplingOptions(temperature=1.0, top_k=0, top_p=1.0)
    toks, q = beam_sample(draft, PROMPT, 3, 4, opts, np.random.default_rng(0))
    want, ids = 1.0, list(PROMPT)
    for i, t in enumerate(toks.tolist()):
        with torch.no_grad():
            want *= float(torch.softmax(draft(torch.as_tensor([ids])).logits[0, -1].double(), -1)[t])
        ids.append(t)
        assert q[i] == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize(
    "opts",
    [
        SamplingOptions(top_k=20, top_p=0.9),
        SamplingOptions(top_k=50),
        SamplingOptions(top_k=7, top_p=0.5, temperature=0.7),
        SamplingOptions(top_k=3, top_p=0.99, repetition_penalty=1.3),
    ],
)
def test_top_k_and_top_p_on_the_k_candidates_equal_transformers_warpers(opts):
    """``SamplingOptions.probs`` warps on the k best scores; transformers' processors sort the whole
    vocabulary: the same distribution, bit for bit, ties at the k-th score included."""
    g = torch.Generator().manual_seed(1)
    for trial in range(40):
        V, m = int(torch.randint(20, 3000, (1,), generator=g)), 3
        x = torch.randn(m, V, generator=g, dtype=torch.float64) * (1 + trial % 4)
        if trial % 5 == 0:  # a tie at the k-th score
            top = torch.topk(x[0], opts.top_k).values
            x[0, x[0] < top[-1]] = x[0, x[0] < top[-1]].max()
            x[0, torch.argsort(x[0])[0]] = top[-1]
        ctx = [np.arange(4)] * m
        y = x.clone()
        procs = list(opts.processors())
        if opts.repetition_penalty != 1.0:
            penalty = procs.pop(0)
            y = torch.cat([penalty(torch.as_tensor(ctx[i])[None], y[i : i + 1]) for i in range(m)])
        for p in procs:
            y = p(torch.zeros(m, 0, dtype=torch.long), y)
        assert np.array_equal(opts.probs(x, ctx), torch.softmax(y, -1).numpy())


@pytest.mark.parametrize(
    "opts",
    [
        SamplingOptions(top_k=20, top_p=0.9),
        SamplingOptions(top_k=0, top_p=0.8),
        SamplingOptions(top_k=5, temperature=0.5, repetition_penalty=1.2),
    ],
)
def test_kept_lists_the_nonzero_entries_of_probs(opts):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 300, generator=g, dtype=torch.float64) * 3
    x[1, :] = x[1].max()  # every score tied: the warpers' own path
    ctx = [np.arange(6)] * 4
    dense = opts.probs(x, ctx)
    rows, toks, p = opts.kept(x, ctx)
    assert np.array_equal(np.sort(rows * 300 + toks), np.flatnonzero(dense))
    np.testing.assert_allclose(p, dense[rows, toks], rtol=1e-12)
    np.testing.assert_allclose(np.bincount(rows, p), 1.0, rtol=1e-12)

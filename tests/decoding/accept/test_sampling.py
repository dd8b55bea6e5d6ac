"""Lossless sampling by shared Gumbel noise (``accept/sampling.py`` on the one loop).

Every lossless decoder must emit, token for token, what plain sampling emits with the same noise
(``tests.decoding.tiny.sampled_reference``: one full forward per token, the argmax of log p + the
row's noise at that position): whatever it drafts, however it plans, whatever batch. That plain
sampler draws from p (the Gumbel-max theorem, checked here on counts), and p is generate's own
(processors equal transformers' bit for bit, below); a slow end-to-end test counts 20 000 seeded
continuations against the target's exact distribution. Tiny models, V = 8 where distributions
are enumerated.
"""

from collections import Counter, defaultdict

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import GenerationConfig

from latticedraft.decoding.accept.sampling import DraftSampler, GumbelNoise, SamplingOptions
from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode
from latticedraft.decoding.proposers.heads import LatticeOptions, make_drafter
from latticedraft.decoding.registry import Request
from latticedraft.gpu.models.blockwise import BlockwiseModel
from tests.decoding.tiny import reference, sampled_reference, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
V = 8
PROMPT = np.array([1, 2, 3, 1, 2, 3, 1, 2], dtype=np.int64)


def heads_model(num_heads: int, arch: str = "llama", dtype=torch.float64, vocab: int = V):
    m = BlockwiseModel.from_base(tiny_model(arch, dtype, seed=3, vocab=vocab), num_heads, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for prm in m.heads.parameters():
            prm.add_(torch.randn(prm.shape, generator=g).to(prm.dtype) * 0.5)
    return m.eval()


class Replay:
    """Random source for exact enumeration (MTAD's end tokens): decision i takes option
    ``forced[i]`` (0 past the end) among those of positive probability; ``weight`` is the product
    of their probabilities, ``log`` holds (chosen, number of options) per decision."""

    def __init__(self, forced):
        self.forced, self.log, self.weight = list(forced), [], 1.0

    def categorical(self, row, probs):
        options = [k for k, q in enumerate(probs) if q > 0]
        c = self.forced[len(self.log)] if len(self.log) < len(self.forced) else 0
        self.log.append((c, len(options)))
        self.weight *= float(probs[options[c]])
        return options[c]


def enumerate_outcomes(run):
    """Call ``run(draws)`` once per outcome path of its decisions; {result: probability}."""
    dist, forced = defaultdict(float), []
    while True:
        r = Replay(forced)
        dist[run(r)] += r.weight
        open_at = [i for i, (c, n) in enumerate(r.log) if c < n - 1]
        if not open_at:
            return dict(dist)
        i = open_at[-1]
        forced = [c for c, _ in r.log[:i]] + [r.log[i][0] + 1]


def target_distribution(model, prompt, opts: SamplingOptions, length: int = 3) -> dict:
    """P(first ``length`` tokens) of ``model`` sampling with generate's own logits processors
    (one full forward per prefix of positive probability)."""
    procs = model._get_logits_processor(GenerationConfig(do_sample=True, temperature=opts.temperature,
                                                         top_k=opts.top_k, top_p=opts.top_p,
                                                         repetition_penalty=opts.repetition_penalty),
                                     input_ids_seq_length=len(prompt))
    dist = {}

    def walk(seq: tuple, prob: float):
        if len(seq) == length:
            dist[seq] = prob
            return
        ids = torch.as_tensor([list(prompt) + list(seq)])
        with torch.no_grad():
            logits = model(ids).logits[:, -1].to(torch.float64)
        p = torch.softmax(procs(ids, logits), dim=-1)[0].tolist()
        for tok in range(len(p)):
            if p[tok] > 0:
                walk(seq + (tok,), prob * p[tok])

    walk((), 1.0)
    return dist


def test_the_perturbed_argmax_draws_from_p():
    """Gumbel-max: over 60 000 positions of one row the chosen tokens follow p (chi-square), never
    a token without mass; the noise repeats by (seed, row, position) and differs between them."""
    p = np.array([0.35, 0.0, 0.05, 0.3, 0.2, 0.1])
    noise = GumbelNoise(seed=4)
    counts = np.bincount([noise.choice(p, 0, t) for t in range(60000)], minlength=6)
    assert counts[1] == 0
    support = p > 0
    assert chisquare(counts[support], p[support] * counts.sum()).pvalue > 1e-3
    v = np.arange(6)
    assert np.array_equal(noise.of(2, 7, v), GumbelNoise(seed=4).of(2, 7, v))
    assert not np.array_equal(noise.of(2, 7, v), noise.of(3, 7, v))
    assert not np.array_equal(noise.of(2, 7, v), noise.of(2, 8, v))


def _suffix_and_context():
    from latticedraft.decoding.proposers.context import ContextNgrams, ContextProposer
    from latticedraft.decoding.proposers.suffix import SuffixProposer

    return dict(sources=(ContextProposer(ContextNgrams(max_ngram=3)), SuffixProposer(3)))


CASES = {  # name -> (drafter factory(model), plan keywords, verify)
    "top1": (lambda m: make_drafter("top1", options=LatticeOptions(k=4)), {}, "tree"),
    "parallel-base, 4 paths": (lambda m: make_drafter("parallel-base", options=LatticeOptions(k=4), nbest=4), {}, "tree"),
    "top1, batched rows": (lambda m: make_drafter("top1", options=LatticeOptions(k=4)), {}, "batched"),
    "neural rescorer": (lambda m: make_drafter("neural", options=LatticeOptions(k=4), alpha=0.7,
                                               rescorer=tiny_model("gpt2", torch.float64, seed=5, vocab=V)), {}, "tree"),
    "draft model": (lambda m: make_drafter("model", draft_model=tiny_model("llama", torch.float64, seed=9, vocab=V),
                                           gamma=3), {}, "tree"),
    "no drafter: context n-grams + suffix drafts": (lambda m: None, "ngrams", "tree"),
    "heads + n-grams, auto tree, head gate": (lambda m: make_drafter("parallel-base", options=LatticeOptions(k=4),
                                                                     nbest=4), "auto", "tree"),
    "heads + lookahead pool": (lambda m: make_drafter("top1", options=LatticeOptions(k=4)), "pool", "tree"),
    "self-draft (the target at 4 bits), auto tree": (lambda m: None, "self", "tree"),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("opts", [SamplingOptions(temperature=0.8, top_k=3, top_p=1.0, seed=5),
                                  SamplingOptions(temperature=1.2, top_k=0, top_p=0.9, seed=6, repetition_penalty=1.4)],
                         ids=["top-k", "top-p+repetition"])
def test_every_drafter_emits_the_plain_samplers_tokens(case, opts):
    """Under sampling, each drafter (sampled heads, rescored heads, a draft model, n-grams, a
    lookahead pool, and heads with n-grams under the cost-aware tree and the head gate) emits exactly the tokens of plain sampling
    with the same noise, for every row of a batch: drafts and plans change the speed only."""
    from latticedraft.decoding.planning.head_gate import HeadGate
    from latticedraft.gpu.verify.cost_model import CostModel

    model = heads_model(3)
    factory, plan_kw, verify = CASES[case]
    if plan_kw == "ngrams":
        plan = BpdPlan(**_suffix_and_context())
    elif plan_kw == "pool":
        from latticedraft.decoding.methods.lookahead import LookaheadOptions

        plan = BpdPlan(lookahead=LookaheadOptions(W=2, N=2, G=3, prompt_as_reference=True))
    elif plan_kw == "self":
        from latticedraft.decoding.proposers.self_draft import SelfDraftProposer
        from latticedraft.gpu.models.quantized import Scheme
        from latticedraft.gpu.verify.lean import LeanStack

        plan = BpdPlan(tree="auto", cost=CostModel((1, 2, 4, 8), (1.0, 1.01, 1.02, 1.04)),
                       sources=(SelfDraftProposer(LeanStack(model, Scheme("int4"))),))
    elif plan_kw == "auto":
        plan = BpdPlan(tree="auto", cost=CostModel((1, 2, 4, 8), (1.0, 1.2, 1.5, 2.5)), gate=HeadGate(),
                       **_suffix_and_context())
    else:
        plan = BpdPlan()
    rng = np.random.default_rng(2)
    prompts = [PROMPT, rng.integers(0, V, size=5), rng.integers(0, V, size=11)]
    r = bpd_decode(model, prompts, factory(model), plan,
                   Request(max_new_tokens=16, sampling=opts, verify=verify, first_row=3))
    for i, (p, q) in enumerate(zip(prompts, r.sequences)):
        assert q.tokens.tolist() == sampled_reference(model, p, 16, opts, row=3 + i)
    if case != "top1, batched rows":
        assert sum(sum(q.accepted_drafts) for q in r.sequences) > 0  # drafts were kept on the way


def test_a_draft_model_equal_to_the_target_has_every_draft_kept():
    """The same noise in drafting and verification: a draft model equal to the target drafts the
    target's sampled tokens, so every drafted token is kept (and the output is the plain sampler's)."""
    target = tiny_model("llama", torch.float64, seed=3, vocab=V)
    opts = SamplingOptions(temperature=1.0, top_k=0, top_p=1.0, seed=1)
    r = bpd_decode(target, [PROMPT], make_drafter("model", draft_model=target, gamma=4, confidence=0.0),
                   request=Request(max_new_tokens=21, sampling=opts))
    q = r.sequences[0]
    assert q.accepted_drafts == [4] * 4  # 1 (prefill) + 4 steps of 4 kept + 1 = 21
    assert q.tokens.tolist() == sampled_reference(target, PROMPT, 21, opts)


@pytest.mark.slow
def test_chi_square_of_20000_seeded_continuations():
    """End to end, seeded: 20 000 two-token continuations (rows of batches of 500, 4 rescored-lattice
    paths per step) against the target's exact distribution, by a chi-square test."""
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


def test_the_draft_models_calibration_starts_at_the_draft_probability_and_follows_what_was_kept():
    """The draft model's calibration is a never-decaying ``RateCorrection`` of its draft
    probabilities, taught by ``update`` with the tokens the target decided: those kept, then the
    first miss (the tokens after it are untried)."""
    from latticedraft.decoding.planning.acceptance import PRIOR_WEIGHT, head_bins
    from latticedraft.decoding.proposers.base import Step, StepRows

    d = make_drafter("model", draft_model=tiny_model("llama", torch.float32, seed=2, vocab=64), gamma=4)
    c = d.calibration
    assert c.corrected([0.33, 0.97]).tolist() == pytest.approx([0.33, 0.97])  # no data: the probability itself
    step, bin97 = Step([0], [0], [np.array([1, 2])], [8]), head_bins(0.97)
    prior = c.expected[0, bin97]
    for _ in range(200):
        d.drafted = {0: (np.array([5, 6, 7]), np.full(3, 0.33))}  # flat but right: every token kept
        d.update(step, [np.array([5, 6, 7])], np.array([9]), None)
        d.drafted = {0: (np.array([5, 6]), np.full(2, 0.97))}  # sure but wrong: the first missed, the second untried
        d.update(step, [np.array([], dtype=np.int64)], np.array([4]), None)
    assert c.corrected([0.33])[0] > 0.95 and c.corrected([0.97])[0] < 0.05
    assert c.expected[0, bin97] == pytest.approx(prior + 200 * 0.97)  # first tokens only
    assert prior == pytest.approx(PRIOR_WEIGHT * 0.975)


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
        assert prop.rates[0, 0] == pytest.approx(float(d.calibration.corrected([p0])[0]))
        kept, expected = d.calibration.kept.sum(), d.calibration.expected.sum()
        d.update(step, [prop.tokens[0, :1]], np.array([7]), None)  # kept the first token, then the target's 7
        tried = min(2, want)  # the target decided the first two drafted tokens: kept, then kept or missed
        hit = tried == 2 and prop.tokens[0, 1] == 7
        assert d.calibration.kept.sum() == pytest.approx(kept + 1 + hit)
        assert d.calibration.expected.sum() == pytest.approx(expected + d.drafted[0][1][:tried].sum())
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

    got = enumerate_outcomes(run)
    want = target_distribution(target, PROMPT, opts)
    assert set(got) <= set(want) and max(abs(got.get(k, 0.0) - want[k]) for k in want) < 1e-9


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


@pytest.mark.parametrize(
    "opts",
    [
        SamplingOptions(top_k=20),
        SamplingOptions(top_k=7, top_p=0.5, temperature=0.7),
        SamplingOptions(top_k=0, top_p=0.9),
        SamplingOptions(top_k=5, repetition_penalty=1.3),
    ],
)
def test_a_draft_vocabulary_gives_the_distribution_of_its_columns_alone(opts):
    """``DraftSampler.probs`` over a reduced draft vocabulary (columns) lists only the entries a
    top-k can keep; q must equal the processors on the full row with every other token at -inf,
    a tie at the k-th score included."""
    g = torch.Generator().manual_seed(4)
    V, n = 500, 120
    cols = torch.randperm(V, generator=g)[:n].numpy()
    x = torch.randn(3, n, generator=g, dtype=torch.float32) * 2
    if opts.top_k:
        kth = torch.topk(x[1], opts.top_k).values[-1]
        x[1, torch.argsort(x[1])[:3]] = kth  # three more tokens tied at the k-th score
    full = torch.full((3, V), -float("inf"))
    full[:, torch.as_tensor(cols)] = x
    ctx = [np.arange(6)] * 3
    sampler = DraftSampler(opts, GumbelNoise(0), row=0, vocab_size=V)
    np.testing.assert_allclose(sampler.probs(x, ctx, columns=cols), opts.probs(full.double(), ctx), atol=1e-7)


def test_draft_scores_are_the_perturbed_log_probabilities_on_the_support_alone():
    opts = SamplingOptions(top_k=4)
    sampler = DraftSampler(opts, GumbelNoise(7), row=3, vocab_size=30)
    q = opts.probs(torch.randn(1, 30, generator=torch.Generator().manual_seed(0), dtype=torch.float64))[0]
    cols = np.arange(0, 30, 2)
    s = sampler.scores(q, 11, cols)
    live = q[cols] > 0
    assert np.all(np.isneginf(s[~live]))
    np.testing.assert_array_equal(s[live], np.log(q[cols][live]) + GumbelNoise(7).of(3, 11, cols[live]))
    assert sampler.ranked(q, 11, 1)[0] == sampler.draw(q, 11)

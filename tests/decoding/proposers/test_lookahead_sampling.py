"""Algorithm 4 (one-hot drafts, sampling verification) preserves the target's distribution.

Exactness is checked by enumeration, not by sampling: ``Replay`` is a random source that
follows a forced list of outcomes and multiplies the probability of each, so running the real
decoder once per outcome path (depth-first over every Bernoulli accept and every residual
draw) gives the exact probability of every emitted prefix. That distribution of the first 3
tokens must equal the target's own sampling distribution, computed from full forwards with the
logits processors ``generate(do_sample=True)`` builds, to 1e-9 (tiny LLaMA, V = 8, float64).
"""

from collections import defaultdict

import numpy as np
import pytest
import torch
from transformers import GenerationConfig

from latticedraft.decoding.methods.lookahead import lookahead_decode
from latticedraft.decoding.accept.sampling import SamplingOptions, SeededDraws, accept
from tests.decoding.tiny import tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
V = 8


class Replay:
    """Random source for exact enumeration: decision i takes option ``forced[i]`` (0 past the
    end) among the options of positive probability; ``weight`` is the product of their
    probabilities, ``log`` holds (chosen, number of options) per decision."""

    def __init__(self, forced):
        self.forced, self.log, self.weight = list(forced), [], 1.0

    def _decide(self, probs) -> int:
        options = [k for k, q in enumerate(probs) if q > 0]
        c = self.forced[len(self.log)] if len(self.log) < len(self.forced) else 0
        self.log.append((c, len(options)))
        self.weight *= float(probs[options[c]])
        return options[c]

    def bernoulli(self, row, prob):
        accept = self._decide([prob, 1.0 - prob]) == 0
        self.rejected = getattr(self, "rejected", False) or not accept
        return accept

    def categorical(self, row, probs):
        return self._decide(list(probs))


def enumerate_outcomes(run):
    """Call ``run(draws)`` once per outcome path of its decisions; {result: probability}."""
    dist, forced, paths = defaultdict(float), [], 0
    while True:
        r = Replay(forced)
        dist[run(r)] += r.weight
        paths += 1
        open_at = [i for i, (c, n) in enumerate(r.log) if c < n - 1]
        if not open_at:
            return dict(dist), paths
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
        for tok in range(V):
            if p[tok] > 0:
                walk(seq + (tok,), prob * p[tok])

    walk((), 1.0)
    return dist


def test_one_position_distribution_equals_p():
    """accept with one-hot attempts alone: every candidate order, candidates of zero mass, a full support."""
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(V))
    p[[2, 5]] = 0.0
    p /= p.sum()
    for cands in ([], [3], [3, 1, 7], [2, 3], [0, 1, 3, 4, 6, 7], [7, 6, 4, 3, 1, 0, 2]):
        dist, _ = enumerate_outcomes(lambda d: accept(p, [(c, None) for c in cands], 0, d))
        got = np.zeros(V)
        for tok, q in dist.items():
            got[tok] += q
        np.testing.assert_allclose(got, p, rtol=0, atol=1e-12)


@pytest.mark.parametrize("W,N,G,verify,opts", [
    (2, 2, 3, "tree", SamplingOptions(temperature=0.7, top_k=0, top_p=1.0)),
    (3, 3, 2, "tree", SamplingOptions(temperature=1.3, top_k=7, top_p=0.97)),
    (2, 3, 3, "batched", SamplingOptions(temperature=1.0, top_k=6, top_p=0.95)),
])
def test_first_three_tokens_have_the_target_distribution(W, N, G, verify, opts):
    model = tiny_model("llama", torch.float64, seed=3, vocab=V)
    prompt = np.array([1, 2, 3, 1, 2, 3, 1, 2], dtype=np.int64)  # repeats: the pool has candidates at once
    accepted, rejected = defaultdict(float), defaultdict(float)

    def run(draws):
        r = lookahead_decode(model, [prompt], W=W, N=N, G=G, max_new_tokens=3, prompt_as_reference=True,
                             verify=verify, sampling=opts, draws=draws)
        q = r.sequences[0]
        accepted[sum(q.accepted_drafts) > 0] += draws.weight
        rejected[getattr(draws, "rejected", False)] += draws.weight
        return tuple(q.tokens.tolist())

    got, _ = enumerate_outcomes(run)
    want = target_distribution(model, prompt, opts)
    assert accepted[True] > 0.01 and rejected[True] > 0.01  # drafts were accepted and rejected on the way
    assert set(got) == set(want)
    assert max(abs(got[s] - want[s]) for s in want) < 1e-9
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)


def test_seed_reproduces_and_rows_do_not_depend_on_the_batch():
    model = tiny_model("gpt2", torch.float64, seed=1, vocab=V)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, V, size=n) for n in (4, 9, 6)]
    opts = SamplingOptions(temperature=1.0, top_k=0, top_p=1.0, seed=7)

    def out(ps, seed=7, first_row=0):
        o = SamplingOptions(opts.temperature, opts.top_k, opts.top_p, seed)
        r = lookahead_decode(model, ps, W=3, N=3, G=3, max_new_tokens=20, sampling=o, first_row=first_row)
        return [q.tokens.tolist() for q in r.sequences]

    both = out(prompts)
    assert both == out(prompts)
    assert out(prompts[1:], first_row=1) == both[1:]  # row 1 draws from default_rng([7, 1]) either way
    assert out(prompts, seed=8) != both
    assert SeededDraws(7).categorical(0, np.array([0.0, 1.0, 0.0])) == 1

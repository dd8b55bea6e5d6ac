"""Multi-token perplexity and the generation-quality proxy against brute-force recomputation."""

import math

import numpy as np
import pytest
import torch

from latticedraft.decoding.dynamo.config import DynamoConfig
from latticedraft.decoding.dynamo.metrics import (
    continuation_perplexity,
    distinct_n,
    multi_token_perplexity,
    repetition_rate,
    windows,
)
from latticedraft.errors import InputError
from tests.decoding.dynamo.test_sampler import _tiny_model


@pytest.fixture(scope="module")
def model():
    return _tiny_model()


TEXT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4]


def _prefix_logp(model, ids):
    """log f^i(· | ids[:t+1]) for every t, one forward per prefix (no batching, no windows): [T, h, V]."""
    out = []
    with torch.no_grad():
        for t in range(len(ids)):
            lg = model(input_ids=torch.tensor([ids[: t + 1]]), heads=True).head_logits[0, -1]
            out.append(torch.log_softmax(lg.double(), -1).numpy())
    return np.stack(out)


def test_ppl_n_and_ppl_1n_match_prefix_by_prefix_scoring(model):
    res = multi_token_perplexity(model, [TEXT], window=64)
    lp = _prefix_logp(model, TEXT)
    T = len(TEXT)
    for n in (1, 2, 3):
        terms = [lp[t, n - 1, TEXT[t + n]] for t in range(T - n)]
        assert res.ppl_n[n] == pytest.approx(math.exp(-np.mean(terms)), rel=1e-9)
        joint = [sum(lp[t, i, TEXT[t + i + 1]] for i in range(n)) / n for t in range(T - n)]
        assert res.ppl_1n[n] == pytest.approx(math.exp(-np.mean(joint)), rel=1e-9)
    assert res.ppl_1n[1] == pytest.approx(res.ppl_n[1])
    assert res.tokens == T


def test_dynamic_perplexity_extremes(model):
    cfg = DynamoConfig(top_k=8, cooccurrence=False, adaptive_threshold=False)
    res = multi_token_perplexity(model, [TEXT], window=64, epsilons=[1.0, 0.0], config=cfg)
    ppl1, steps1 = res.dynamic[1.0]
    assert steps1 == 1.0 and ppl1 == pytest.approx(res.ppl_n[1], rel=1e-9)
    # ε_b = 0 without thresholds: n = 3 at t = 0, 3, 6, ... (fewer heads at the very end)
    lp = _prefix_logp(model, TEXT)
    T, t, total, toks, steps = len(TEXT), 0, 0.0, 0, 0
    while t < T - 1:
        n = min(3, T - 1 - t)
        total += sum(lp[t, i, TEXT[t + i + 1]] for i in range(n))
        toks, steps, t = toks + n, steps + 1, t + n
    ppl0, speed0 = res.dynamic[0.0]
    assert ppl0 == pytest.approx(math.exp(-total / toks), rel=1e-9)
    assert speed0 == pytest.approx(toks / steps)


def test_windows_are_scored_independently(model):
    res = multi_token_perplexity(model, [TEXT], window=12)
    lp = np.concatenate([_prefix_logp(model, TEXT[:12]), _prefix_logp(model, TEXT[12:])])
    terms = [lp[t, 0, TEXT[t + 1]] for t in range(11)] + [lp[12 + t, 0, TEXT[12 + t + 1]] for t in range(11)]
    assert res.ppl_n[1] == pytest.approx(math.exp(-np.mean(terms)), rel=1e-9)
    assert [w.size for w in windows(TEXT, 10)] == [10, 10, 4]
    with pytest.raises(InputError, match="shorter than 2"):
        multi_token_perplexity(model, [[1]], window=8)


def test_continuation_perplexity_batched_equals_one_by_one(model):
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]
    conts = [[9, 9, 2], [3, 3, 3, 3, 1], [7]]
    lp_sum, n = 0.0, 0
    with torch.no_grad():
        for p, c in zip(prompts, conts):
            lg = model(input_ids=torch.tensor([p + c]), heads=True).head_logits[0, :, 0]
            lp = torch.log_softmax(lg.double(), -1).numpy()
            lp_sum += sum(lp[len(p) - 1 + j, c[j]] for j in range(len(c)))
            n += len(c)
    want = math.exp(-lp_sum / n)
    assert continuation_perplexity(model, prompts, conts, batch_size=2) == pytest.approx(want, rel=1e-9)
    assert continuation_perplexity(model.base if hasattr(model, "base") else model, prompts, conts) == \
        pytest.approx(want, rel=1e-6)


def test_distinct_and_repetition_by_hand():
    seqs = [[1, 2, 1, 2, 1], [1, 2, 3]]
    # bigrams: (1,2),(2,1),(1,2),(2,1) | (1,2),(2,3) → 3 unique of 6
    assert distinct_n(seqs, 2) == pytest.approx(3 / 6)
    # trigrams: (1,2,1),(2,1,2),(1,2,1) | (1,2,3) → 3 unique of 4
    assert distinct_n(seqs, 3) == pytest.approx(3 / 4)
    # repeated bigrams inside one sequence: 2nd (1,2) and 2nd (2,1) of seq 1 → 2 of 6
    assert repetition_rate(seqs, 2) == pytest.approx(2 / 6)
    assert distinct_n([[1]], 2) == 0.0 and repetition_rate([], 4) == 0.0

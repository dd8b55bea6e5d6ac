"""DynaMo sampler (Algorithm 1): exact enumeration on tiny vocabularies, thresholds, bad input."""

import itertools

import numpy as np
import pytest
import torch

from latticedraft.decoding.dynamo.config import DynamoConfig, variant
from latticedraft.decoding.dynamo.sampler import adaptive_keep, gaussian_blur, sample_from, step_distribution
from latticedraft.decoding.dynamo.generate import generate as dynamo_generate
from latticedraft.errors import InputError, ModelError
from latticedraft.lm.cooccurrence import CooccurrenceStats

V = 7


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def _head_warped(logits, k, T):
    """Independent reference: full softmax at temperature T, keep the k largest, renormalise (dict id → p)."""
    p = _softmax(np.asarray(logits, dtype=np.float64) / T)
    keep = np.argsort(-p, kind="stable")[:k]
    z = p[keep].sum()
    return {int(i): p[i] / z for i in keep}


def _as_dict(dist):
    """The non-zero entries of a step distribution: tuple (or id) → probability."""
    out = {}
    for idx in itertools.product(*[range(a.size) for a in dist.ids]):
        key = tuple(int(dist.ids[i][j]) for i, j in enumerate(idx))
        if dist.probs[idx] > 0:
            out[key if dist.n > 1 else key[0]] = float(dist.probs[idx])
    return out


@pytest.mark.parametrize("seed", range(5))
def test_epsilon_one_is_first_head_warped_distribution(seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(3, V)) * 2
    context = [2, 5]
    cfg = DynamoConfig(epsilon_b=1.0, top_k=4, temperature=0.7, repetition_penalty=1.3, cooccurrence=False)
    dist = step_distribution(logits, context, cfg)
    assert dist.n == 1
    ref = _head_warped(logits[0], 4, 0.7)
    ref = {t: p / (1.3 if t in context else 1.0) for t, p in ref.items()}
    z = sum(ref.values())
    got = _as_dict(dist)
    assert set(got) == set(ref)
    for t in ref:
        assert got[t] == pytest.approx(ref[t] / z, rel=1e-12)


def test_epsilon_one_with_every_technique_still_one_token():
    rng = np.random.default_rng(9)
    stats = CooccurrenceStats.from_sequences([rng.integers(0, V, 200)], vocab_size=V, fingerprint="x")
    for _ in range(20):
        logits = rng.normal(size=(3, V)) * 4
        cfg = DynamoConfig(epsilon_b=1.0, top_k=V)
        assert step_distribution(logits, [1], cfg, stats).n == 1


def test_samples_follow_the_enumerated_distribution():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(3, V))
    cfg = DynamoConfig(epsilon_b=1.0, top_k=5, cooccurrence=False)
    dist = step_distribution(logits, [], cfg)
    draws = np.array([sample_from(dist, np.random.default_rng([3, i]))[0] for i in range(6000)])
    want = _as_dict(dist)
    freq = {t: np.mean(draws == t) for t in want}
    assert set(np.unique(draws)) <= set(want)
    # chi-square with 4 degrees of freedom; 18.5 is its 0.999 quantile (fixed seeds: deterministic)
    chi2 = sum((freq[t] - p) ** 2 / p for t, p in want.items()) * draws.size
    assert chi2 < 18.5


@pytest.mark.parametrize("seed", range(5))
def test_epsilon_zero_without_thresholds_emits_n_tokens_with_exact_joint(seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(3, V)) * 3
    context = [0, 3]
    stats = CooccurrenceStats.from_sequences([rng.integers(0, V, 60)], vocab_size=V, fingerprint="x")
    cfg = DynamoConfig(epsilon_b=0.0, top_k=3, adaptive_threshold=False, repetition_penalty=1.5,
                       alpha_c=0.8, unseen_weight=0.5)
    dist = step_distribution(logits, context, cfg, stats)
    assert dist.n == 3 and dist.backed_off == []
    heads = [_head_warped(logits[i], 3, 0.7) for i in range(3)]
    uni = stats.unigram
    want = {}
    for a, b, c in itertools.product(*[h.keys() for h in heads]):
        count = stats.counts([np.array([a]), np.array([b]), np.array([c])])[0, 0, 0]
        if count:
            co = (count / stats.n_tokens[2]) / np.prod([uni[t] / stats.n_tokens[0] for t in (a, b, c)])
        else:
            co = 0.5 if all(uni[t] for t in (a, b, c)) else 1.0
        reps = (a in context) + (b in context or b == a) + (c in context or c in (a, b))
        want[(a, b, c)] = heads[0][a] * heads[1][b] * heads[2][c] * co**0.8 / 1.5**reps
    z = sum(want.values())
    got = _as_dict(dist)
    assert set(got) == set(want)
    for key in want:
        assert got[key] == pytest.approx(want[key] / z, rel=1e-9)


def test_static_threshold_and_back_off_orders():
    # head 1 and 2 peaked (0.9 each): J(0,0)=0.81 > 0.5 → emits 2 tokens deterministically;
    # head 3 flat: every triple ≤ 0.25 = 0.5² → n = 3 backs off on the threshold
    lg = np.full((3, 4), -30.0)
    lg[0, 0] = lg[1, 0] = 0.0
    lg[2, :] = 0.0
    cfg = DynamoConfig(epsilon_b=0.5, top_k=4, temperature=1.0, repetition_penalty=1.0,
                       cooccurrence=False, adaptive_threshold=False)
    dist = step_distribution(lg, [], cfg)
    assert dist.n == 2 and dist.backed_off == [(3, "threshold")]
    assert _as_dict(dist) == {(0, 0): 1.0}


def test_repetition_penalty_can_trigger_back_off():
    lg = np.full((2, 4), -30.0)
    lg[:, 1] = 0.0  # both heads sure of token 1: J(1,1) ≈ 1 but 1 repeats itself inside the pair
    cfg = DynamoConfig(epsilon_b=0.9, top_k=2, temperature=1.0, repetition_penalty=1.5,
                       cooccurrence=False, adaptive_threshold=False)
    assert step_distribution(lg, [], cfg).n == 1
    assert step_distribution(lg, [], replace_cfg(cfg, repetition_penalty=1.0)).n == 2


def replace_cfg(cfg, **kw):
    from dataclasses import replace

    return replace(cfg, **kw)


def test_all_zero_joint_backs_off_without_dividing_by_zero():
    # hard co-occurrence masking (δ = 0) of a grid made only of a pair the corpus never saw, (1, 1)
    stats = CooccurrenceStats.from_sequences([[0, 1, 0, 1, 0, 1]], vocab_size=4, fingerprint="x")
    lg = np.full((2, 4), -30.0)
    lg[0, 1] = lg[1, 1] = 0.0
    cfg = DynamoConfig(epsilon_b=0.0, top_k=1, unseen_weight=0.0, adaptive_threshold=True)
    with np.errstate(all="raise"):
        dist = step_distribution(lg, [], cfg, stats)
    assert dist.n == 1 and dist.backed_off == [(2, "empty")]
    assert _as_dict(dist) == {1: 1.0}


def test_otsu_keeps_the_peaks_flat_keeps_all_zero_keeps_none():
    J = np.array([[0.40, 0.38, 0.01], [0.02, 0.01, 0.03], [0.05, 0.06, 0.04]])
    assert adaptive_keep(J, 1).tolist() == [[True, True, False], [False, False, False], [False, False, False]]
    assert adaptive_keep(np.full((3, 3), 1 / 9), 1).all()
    assert not adaptive_keep(np.zeros((2, 2)), 3).any()
    # 3-d grids work too (k³ entries)
    J3 = np.full((3, 3, 3), 0.001)
    J3[1, 2, 0] = 0.9
    assert adaptive_keep(J3, 1).sum() == 1


def test_gaussian_blur_is_the_kernel_quarter_half_quarter_with_replicated_border():
    J = np.zeros((4, 5))
    J[1, 2] = 1.0
    B = gaussian_blur(J, 3)
    k = np.array([0.25, 0.5, 0.25])
    want = np.zeros((4, 5))
    want[0:3, 1:4] = np.outer(k, k)
    assert np.allclose(B, want, atol=1e-12)
    edge = np.zeros((3, 3))
    edge[0, 0] = 1.0  # replicated border: the corner keeps 0.75 × 0.75 of itself
    assert gaussian_blur(edge, 3)[0, 0] == pytest.approx(0.5625)
    J3 = np.zeros((3, 3, 3))
    J3[1, 1, 1] = 1.0
    assert gaussian_blur(J3, 3).sum() == pytest.approx(1.0)
    assert gaussian_blur(J3, 3)[0, 1, 2] == pytest.approx(0.25 * 0.5 * 0.25)


def test_bad_input():
    lg = np.zeros((2, V))
    with pytest.raises(ModelError, match="has 2 heads"):
        step_distribution(lg, [], DynamoConfig(max_n=3, cooccurrence=False, top_k=3))
    with pytest.raises(InputError, match="larger than the vocabulary"):
        step_distribution(lg, [], DynamoConfig(top_k=V + 1, cooccurrence=False))
    for eps in (-0.1, 1.5, float("nan")):
        with pytest.raises(InputError, match="outside"):
            step_distribution(lg, [], DynamoConfig(epsilon_b=eps, cooccurrence=False, top_k=3))
    with pytest.raises(InputError, match="no table"):
        step_distribution(lg, [], DynamoConfig(top_k=3))
    with pytest.raises(InputError, match="unknown DynaMo variant"):
        variant("CO+XX", 0.5)


def test_variants_switch_the_techniques():
    v = variant("AT+G3", 0.3)
    assert (v.cooccurrence, v.adaptive_threshold, v.blur, v.epsilon_b) == (False, True, True, 0.3)
    assert variant("CO-0.5+AT+G3", 0.3).alpha_c == 0.5
    assert not variant("CO", 0.3).adaptive_threshold


# ---------------------------------------------------------------------------- with a model


def _tiny_model(h=3, vocab=32):
    """A tiny random GPT-2 with DynaMo heads (extra decoder layers), in float64.

    The head layers start as copies of the final layer; they are perturbed so heads 2..h predict
    differently from head 1 (the frozen, zero embeddings of the one-layer head backbones stay zero).
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    from latticedraft.gpu.models.blockwise import BlockwiseModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=vocab, n_positions=128, n_embd=32, n_layer=2, n_head=2,
                     bos_token_id=None, eos_token_id=None)
    base = GPT2LMHeadModel(cfg).eval()
    m = BlockwiseModel.from_base(base, num_heads=h, kind="dynamo")
    with torch.no_grad():
        for p in m.heads.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.5)
    return m.double().eval()


@pytest.fixture(scope="module")
def model():
    return _tiny_model()


PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]]


class Row:
    """One sequence of a DynaMo decode: tokens (a list), calls, ns (tokens sampled per call)."""

    def __init__(self, q):
        self.tokens, self.calls, self.ns = q.tokens.tolist(), q.calls, [a + 1 for a in q.accepted_drafts]


def generate(*args, **kw) -> list[Row]:
    """``dynamo.generate.generate``'s sequences as ``Row`` s."""
    return [Row(q) for q in dynamo_generate(*args, **kw).sequences]


def test_generation_is_reproducible_and_batch_independent(model):
    cfg = DynamoConfig(epsilon_b=0.2, top_k=8, cooccurrence=False)
    a = generate(model, PROMPTS, cfg, max_new_tokens=12, seed=7)
    b = generate(model, PROMPTS, cfg, max_new_tokens=12, seed=7)
    c = generate(model, PROMPTS, cfg, max_new_tokens=12, seed=8)
    assert [r.tokens for r in a] == [r.tokens for r in b]
    assert [r.tokens for r in a] != [r.tokens for r in c]
    one = generate(model, [PROMPTS[1]], cfg, max_new_tokens=12, seed=7)
    # row r draws from default_rng([seed, r]): the lone prompt is row 0, so compare with row 0
    assert one[0].tokens == generate(model, [PROMPTS[1], PROMPTS[0]], cfg, max_new_tokens=12, seed=7)[0].tokens
    assert all(len(r.tokens) == 12 for r in a)


def test_generation_epsilon_extremes(model):
    one = generate(model, PROMPTS, DynamoConfig(epsilon_b=1.0, top_k=8, cooccurrence=False), max_new_tokens=7)
    assert all(r.calls == 7 and r.ns == [1] * 7 for r in one)
    three = generate(model, PROMPTS, DynamoConfig(epsilon_b=0.0, top_k=8, cooccurrence=False,
                                                  adaptive_threshold=False), max_new_tokens=7)
    assert all(r.calls == 3 and r.ns == [3, 3, 3] and len(r.tokens) == 7 for r in three)


def test_generation_epsilon_one_matches_stepwise_head_one_sampling(model):
    cfg = DynamoConfig(epsilon_b=1.0, top_k=8, cooccurrence=False)
    got = generate(model, [PROMPTS[0]], cfg, max_new_tokens=5, seed=3)[0].tokens
    rng = np.random.default_rng([3, 0])
    ids = list(PROMPTS[0])
    with torch.no_grad():
        for _ in range(5):
            out = model(input_ids=torch.tensor([ids]), heads=True)
            lg = out.head_logits[0, -1, 0].numpy()
            p = _head_warped(lg, 8, 0.7)
            p = {t: q / (1.1 if t in ids else 1.0) for t, q in p.items()}
            keys = sorted(p, key=lambda t: (-lg[t], t))
            w = np.array([p[t] for t in keys])
            cdf = np.cumsum(w)
            ids.append(keys[int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))])
    assert got == ids[len(PROMPTS[0]):]


def test_generation_refuses_mismatched_inputs(model):
    stats = CooccurrenceStats.from_sequences([[1, 2, 3]], vocab_size=31, fingerprint="x")
    with pytest.raises(ModelError, match="vocabulary size 31"):
        generate(model, PROMPTS, DynamoConfig(top_k=8), cooc=stats)
    stats = CooccurrenceStats.from_sequences([[1, 2, 3]], vocab_size=32, fingerprint="x" * 64)
    with pytest.raises(ModelError, match="tokenizer"):
        generate(model, PROMPTS, DynamoConfig(top_k=8), cooc=stats, tokenizer_fingerprint="y" * 64)
    with pytest.raises(ModelError, match="3 heads"):
        generate(model, PROMPTS, DynamoConfig(top_k=8, max_n=4, cooccurrence=False))
    two = _tiny_model(h=2)
    with pytest.raises(ModelError, match="has 2 heads but --max-n is 3"):
        generate(two, PROMPTS, DynamoConfig(top_k=8, max_n=3, cooccurrence=False))
    res = generate(two, PROMPTS, DynamoConfig(epsilon_b=0, top_k=8, cooccurrence=False), max_new_tokens=4)
    assert all(r.ns == [2, 2] for r in res)  # n defaults to the model's 2 heads
    with pytest.raises(InputError, match="larger than the vocabulary"):
        generate(model, PROMPTS, DynamoConfig(top_k=33, cooccurrence=False))


@pytest.mark.slow
def test_ablation_writes_table_json_and_plot(model, tmp_path):
    import json

    from latticedraft.decoding.dynamo.evaluate import flatness, run_ablation, write_report

    rng = np.random.default_rng(0)
    stats = CooccurrenceStats.from_sequences([rng.integers(0, 32, 400)], vocab_size=32, fingerprint="x")
    res = run_ablation(model, PROMPTS, stats, variants=["CO+AT+G3", "AT+G3"], epsilons=[0.0, 1.0],
                       max_new_tokens=6, base=DynamoConfig(top_k=8))
    assert [(r.variant, r.epsilon_b) for r in res.rows] == [("CO+AT+G3", 0.0), ("CO+AT+G3", 1.0),
                                                           ("AT+G3", 0.0), ("AT+G3", 1.0)]
    one = [r for r in res.rows if r.epsilon_b == 1.0]
    assert all(r.tokens_per_call == 1.0 and r.n_hist == {1: r.calls} for r in one)
    assert res.baseline.tokens == 18 and res.baseline.base_ppl > 1
    assert set(flatness(res)) == {"CO+AT+G3", "AT+G3"}
    paths = write_report(res, tmp_path)
    assert json.loads(paths["json"].read_text())["rows"][0]["variant"] == "CO+AT+G3"
    assert "| AT+G3 | 1.0 | 1.00 |" in paths["table"].read_text()
    assert paths["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dynamo_ablation.md", "dynamo_ablation.png", "results.json"]


def test_kv_cached_generation_equals_full_recomputation(model):
    # rows emit different n per call, so the cache gets masked holes; float64 keeps decisions identical
    cfg = DynamoConfig(epsilon_b=0.2, top_k=3, cooccurrence=False, adaptive_threshold=False)
    a = generate(model, PROMPTS, cfg, max_new_tokens=10, seed=5, use_cache=True)
    b = generate(model, PROMPTS, cfg, max_new_tokens=10, seed=5, use_cache=False)
    assert [r.tokens for r in a] == [r.tokens for r in b]
    assert [r.ns for r in a] == [r.ns for r in b]
    assert any(len(set(r.ns)) > 1 for r in a)  # the test exercises uneven steps
    ends = generate(model, PROMPTS, cfg, max_new_tokens=10, seed=5, eos_token_id=a[1].tokens[2])
    assert ends[1].tokens == a[1].tokens[:3]  # stops at EOS (kept); the others go on
    assert len(ends[0].tokens) == 10 or a[1].tokens[2] in ends[0].tokens


def test_top_k_breaks_ties_by_lower_id_like_a_stable_sort():
    from latticedraft.decoding.dynamo.sampler import warp

    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(2, 40))
        k = int(rng.integers(1, n + 1))
        x = rng.integers(0, 4, n).astype(float)  # many ties
        ids, p = warp(x, DynamoConfig(top_k=k, temperature=1.0))
        assert ids.tolist() == np.argsort(-x, kind="stable")[:k].tolist()
        assert p.sum() == pytest.approx(1.0) and np.all(np.diff(p) <= 1e-15)


def _otsu_reference(q):
    """Otsu (1979) by hand on a uint8 image: the t maximising the between-class variance of {≤ t} vs {> t}."""
    hist = np.bincount(q.ravel(), minlength=256).astype(np.float64)
    p = hist / hist.sum()
    levels = np.arange(256)
    best, best_t = -1.0, 0
    for t in range(256):
        w0, w1 = p[: t + 1].sum(), p[t + 1:].sum()
        if w0 == 0 or w1 == 0:
            continue
        m0 = (levels[: t + 1] * p[: t + 1]).sum() / w0
        m1 = (levels[t + 1:] * p[t + 1:]).sum() / w1
        var = w0 * w1 * (m0 - m1) ** 2
        if var > best + 1e-12:
            best, best_t = var, t
    return best_t


@pytest.mark.parametrize("shape", [(6, 6), (5, 4, 3)])
def test_adaptive_keep_is_otsu_of_the_blurred_quantised_grid(shape):
    rng = np.random.default_rng(len(shape))
    for _ in range(20):
        J = rng.dirichlet(np.full(int(np.prod(shape)), 0.3)).reshape(shape)
        for kernel in (1, 3):
            B = gaussian_blur(J, kernel) if kernel > 1 else J
            q = np.rint(B / B.max() * 255).astype(np.uint8)
            assert adaptive_keep(J, kernel).tolist() == (q > _otsu_reference(q)).tolist()


# ---------------------------------------------------------------------------- command line


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny DynaMo checkpoint on disk (base + heads) and a 32-word tokenizer that matches it."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    d = tmp_path_factory.mktemp("dynamo")
    m = _tiny_model().float()
    m.base.save_pretrained(d / "base")
    m.save_pretrained(d / "heads", base_ref=str(d / "base"))
    words = ["<|endoftext|>"] + [f"w{i}" for i in range(31)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(d / "tokenizer.json"))
    return d


def _run(argv, capsys):
    from latticedraft.cli import main

    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_decode_dynamo_prints_tokens_per_call_and_n(saved, capsys):
    import json

    base = ["decode", "--method", "dynamo", "--model", str(saved / "heads"), "--tokenizer", str(saved / "tokenizer.json"),
            "--prompt", "w1 w2 w3", "--max-new-tokens", "6", "--top-k", "4", "--no-cooccurrence"]
    rc, out, err = _run(base + ["--json", "--epsilon-b", "0", "--no-adaptive-threshold"], capsys)
    assert rc == 0, err
    rec = json.loads(out)  # the record every method writes: 3 tokens (2 beyond the first) per call
    assert rec["accepted_per_step"] == [2, 2] and rec["calls"] == 2 and rec["block_efficiency"] == 3.0
    assert len(rec["tokens"]) == 6 and rec["tokens_per_call"] == [3, 3]
    rc, out, err = _run(base + ["--epsilon-b", "1", "--seed", "4"], capsys)
    assert rc == 0 and out.startswith("w1 w2 w3")
    assert "-- 6 tokens, 6 calls, block efficiency 1.00" in err


@pytest.mark.parametrize("extra, message", [
    (["--epsilon-b", "1.5"], "outside [0, 1]"),
    (["--top-k", "33", "--no-cooccurrence"], "larger than the vocabulary"),
    (["--max-n", "4", "--no-cooccurrence"], "at most 3 tokens"),
    (["--cooccurrence", "WRONG"], "vocabulary size 6"),
])
def test_cli_decode_dynamo_bad_input_is_one_line(saved, capsys, extra, message):
    if "WRONG" in extra:
        CooccurrenceStats.from_sequences([[1, 2, 3]], vocab_size=6, fingerprint="x").save(saved / "wrong.npz")
        extra = ["--cooccurrence", str(saved / "wrong.npz"), "--top-k", "4"]  # the model's checks come first
    rc, out, err = _run(["decode", "--method", "dynamo", "--model", str(saved / "heads"), "--tokenizer",
                         str(saved / "tokenizer.json"), "--prompt", "w1 w2", "--max-new-tokens", "3"] + extra, capsys)
    assert rc == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1


def test_a_joint_grid_that_cannot_fit_is_refused_naming_the_top_k_that_does(monkeypatch):
    import latticedraft.memory as memory

    monkeypatch.setattr(memory, "available_bytes", lambda device=None: 4 * 8 * 100 ** 3)  # exactly k=100 at n=3
    DynamoConfig(top_k=100, cooccurrence=False).validate(vocab_size=8192, num_heads=3)
    with pytest.raises(InputError, match=r"--top-k 0 \(0: the whole vocabulary, 8192 tokens\).*use --top-k 100 or "
                                         r"lower.*--max-n 2"):
        DynamoConfig(top_k=0, cooccurrence=False).validate(vocab_size=8192, num_heads=3)
    with pytest.raises(InputError, match="--top-k 101 makes"):
        DynamoConfig(top_k=101, cooccurrence=False).validate(vocab_size=8192, num_heads=3)
    DynamoConfig(top_k=0, cooccurrence=False, max_n=1).validate(vocab_size=8192, num_heads=3)  # one token: no grid

"""ARPA → WFST: exact back-off equals KenLM and a brute-force ARPA reading; epsilon semantics measured."""

from __future__ import annotations

import itertools
import math
import shutil
import subprocess

import kenlm
import numpy as np
import pytest
import pywrapfst

from latticedraft.errors import InputError
from latticedraft.lm.wfst import NgramFst
from tests.lm.conftest import synthetic_text
from tests.lm.reference import log10_prob, read_arpa_dict, sentence_log10

LN10 = math.log(10)


@pytest.fixture
def fst(tiny_arpa) -> NgramFst:
    return NgramFst.from_arpa(tiny_arpa, vocab_size=5)  # ids 3, 4 never occur


def test_structure_of_the_fixture(fst):
    # states: null, <s>, 0, 1, 2 (back-off only), "<s> 0", "0 1"; "<s> 1", "0 2", "1 2" fold into suffixes
    assert fst.num_states == 7 and fst.unigram == 0 and fst.order == 3
    lo, hi = fst.state_offsets[0], fst.state_offsets[1]
    assert fst.arc_label[lo:hi].tolist() == [1, 2, 3, 4, 5]  # every label leaves the null state
    np.testing.assert_allclose(fst.arc_cost[lo + 3 : hi], [1000.0, 1000.0])  # unseen ids 3, 4
    for s in range(fst.num_states):  # strictly ascending labels, no epsilon among labelled arcs
        lab = fst.arc_label[fst.state_offsets[s] : fst.state_offsets[s + 1]]
        assert np.all(np.diff(lab) > 0) and np.all(lab > 0)
    assert fst.backoff_next[0] == -1 and np.all(fst.backoff_next[1:] >= 0)
    assert fst.num_arcs == len(fst.arc_label) + 6
    # "<s>" state: back-off -0.5 (log10)
    assert fst.backoff_cost[fst.start] == pytest.approx(0.5 * LN10)


def test_exact_cost_equals_reference_and_kenlm_on_all_short_strings(fst, tiny_arpa):
    order, grams = read_arpa_dict(tiny_arpa)
    model = kenlm.Model(str(tiny_arpa))
    fst.set_unk_cost(fst.unk_arpa_cost)  # ids 3, 4 as KenLM's <unk>
    n = 0
    for length in range(1, 5):
        for ids in itertools.product(range(5), repeat=length):
            words = [str(i) for i in ids]
            ref = np.array(sentence_log10(order, grams, words)) * LN10
            ken = np.array([p for p, _, _ in model.full_scores(" ".join(words), bos=True, eos=False)]) * LN10
            s, got = fst.start, []
            for t in ids:
                s, c = fst.arc_lookup(s, t)
                got.append(-c)
            np.testing.assert_allclose(got, ref, atol=1e-5)
            np.testing.assert_allclose(got, ken, atol=1e-5)
            # end of sentence: exact -ln p(</s> | state)
            eos_ref = log10_prob(order, grams, ["<s>"] + words, "</s>") * LN10
            assert -fst.end_cost(s) == pytest.approx(eos_ref, abs=1e-5)
            n += 1
    assert n == 5 + 25 + 125 + 625


def test_state_for_history_matches_kenlm_state(fst, tiny_arpa):
    order, grams = read_arpa_dict(tiny_arpa)
    for h in itertools.product(range(3), repeat=3):
        for k in range(4):
            hist = list(h[:k])
            s = fst.state_for_history(hist)
            ctx = ["<s>"] + [str(t) for t in hist] if k < order - 1 else [str(t) for t in hist]
            for w in range(3):
                _, c = fst.arc_lookup(s, w)
                assert -c == pytest.approx(log10_prob(order, grams, ctx, str(w)) * LN10, abs=1e-5)
    # equal contexts give equal states; a longer history only matters through its last n-1 ids
    assert fst.state_for_history([2, 2, 0, 1]) == fst.state_for_history([0, 1])  != fst.state_for_history([1])


def test_epsilon_path_beats_explicit_ngram(fst):
    """The fixture's "0 2" (log10 -1.8) is worse than backing off: bo(0) + p(2) = -0.3 - 1.2."""
    s0 = fst.state_for_history([0, 0])  # context "0 0" does not exist → state "0"
    exact, _ = fst.exact_cost(s0, [2])
    assert exact == pytest.approx(1.8 * LN10, abs=1e-5)
    assert fst.epsilon_cost(s0, [2]) == pytest.approx(1.5 * LN10, abs=1e-5)


def _compose_cost(lm: pywrapfst.Fst, ids) -> float:
    a = pywrapfst.VectorFst()
    states = [a.add_state() for _ in range(len(ids) + 1)]
    a.set_start(states[0])
    a.set_final(states[-1])
    one = pywrapfst.Weight.one(a.weight_type())
    for i, t in enumerate(ids):
        a.add_arc(states[i], pywrapfst.Arc(t + 1, t + 1, one, states[i + 1]))
    c = pywrapfst.compose(a, lm)
    d = pywrapfst.shortestdistance(c, reverse=True)
    return float(d[c.start()]) if c.start() >= 0 and len(d) else math.inf


def test_openfst_composition_computes_the_epsilon_cost(fst, tmp_path):
    p = tmp_path / "lm.fst"
    fst.save(p)
    lm = pywrapfst.Fst.read(str(p))
    for length in range(1, 4):
        for ids in itertools.product(range(5), repeat=length):
            assert _compose_cost(lm, list(ids)) == pytest.approx(fst.epsilon_cost(fst.start, ids), rel=1e-6)


def test_save_and_load_round_trip(fst, tmp_path):
    p = tmp_path / "lm.fst"
    fst.save(p)
    fst.save_npz(tmp_path / "lm.npz")
    for back in (NgramFst.load(tmp_path / "lm.npz"), NgramFst._from_openfst(p)):
        for name in ("state_offsets", "arc_label", "arc_cost", "arc_next", "backoff_next", "backoff_cost"):
            np.testing.assert_array_equal(getattr(back, name), getattr(fst, name), err_msg=name)
        assert (back.start, back.unigram, back.order, back.vocab_size) == (fst.start, 0, 3, 5)
    np.testing.assert_array_equal(NgramFst.load(p).final_cost, fst.final_cost)  # lm.npz found beside lm.fst
    if shutil.which("fstinfo"):
        info = subprocess.run(["fstinfo", str(p)], capture_output=True, text=True, check=True).stdout
        assert f"# of states                                       {fst.num_states}" in info
        assert f"# of arcs                                         {fst.num_arcs}" in info
    eos = tmp_path / "eos.fst"
    fst.save(eos, eos_final=True)
    g = pywrapfst.Fst.read(str(eos))
    assert float(g.final(fst.start)) == pytest.approx(float(fst.final_cost[fst.start]))


def test_unk_cost_is_configurable(tiny_arpa):
    f = NgramFst.from_arpa(tiny_arpa, vocab_size=5, unk_cost=50.0)
    assert f.arc_lookup(0, 4) == (0, pytest.approx(50.0))
    f.set_unk_cost(7.0)
    assert f.arc_lookup(0, 3)[1] == pytest.approx(7.0)
    assert f.arc_lookup(0, 2)[1] == pytest.approx(1.2 * LN10, abs=1e-5)  # seen ids untouched
    with pytest.raises(InputError, match="outside the LM vocabulary"):
        f.arc_lookup(0, 5)


def _segment_gaps(fst: NgramFst, ids, first: int) -> tuple[int, list[float]]:
    """Compare epsilon and exact back-off cost on the 8-token segments of ``ids`` from ``first`` on
    (each after its full history); asserts epsilon <= exact on every one. Returns the number of
    segments and the gaps (nats) of those where epsilon is cheaper."""
    n_seg, gaps = 0, []
    for i in range(first, len(ids) - 8, 8):
        s = fst.state_for_history(ids[:i])
        c, _ = fst.exact_cost(s, ids[i : i + 8])
        e = fst.epsilon_cost(s, ids[i : i + 8])
        assert e <= c + 1e-4
        n_seg += 1
        if e < c - 1e-4:
            gaps.append(c - e)
    return n_seg, gaps


def test_lmplz_model_exact_vs_reference_and_epsilon_gap(tiny_build):
    """A pruned lmplz 3-gram: exact scores equal the brute-force ARPA reading on held-out text.
    Measured: per token (from the exact state) epsilon never undercuts exact back-off for
    lmplz's interpolated estimates; over 8-token segments it does, by backing off early."""
    arpa = tiny_build / "lm.arpa"
    order, grams = read_arpa_dict(arpa)
    fst = NgramFst.from_arpa(arpa, vocab_size=300)
    fst.set_unk_cost(fst.unk_arpa_cost)
    from latticedraft.lm.tokenizer import load_tokenizer

    tok = load_tokenizer(tiny_build / "tokenizer.json")
    held = synthetic_text(40, seed=99).split("\n\n")
    n_tok = n_diff = n_seg = n_seg_diff = 0
    gap = 0.0
    for para in held:
        ids = tok.encode(para).ids
        ref = np.array(sentence_log10(order, grams, [str(i) for i in ids])) * LN10
        s, got = fst.start, []
        for t in ids:
            eps = fst.epsilon_cost(s, [t])
            s, c = fst.arc_lookup(s, t)
            got.append(-c)
            assert eps <= c + 1e-4
            n_tok += 1
            n_diff += eps < c - 1e-4
        np.testing.assert_allclose(got, ref, atol=1e-4)
        seg, seg_gaps = _segment_gaps(fst, ids, first=0)
        n_seg += seg
        n_seg_diff += len(seg_gaps)
        gap = max([gap, *seg_gaps])
    print(f"\nepsilon vs exact back-off: {n_diff}/{n_tok} tokens, {n_seg_diff}/{n_seg} 8-token segments "
          f"cheaper by epsilon (largest gap {gap:.3f} nats)")
    assert n_tok > 1000 and n_diff == 0  # interpolated KN: explicit p >= bo * p(lower order)


def test_epsilon_gap_on_real_code(tmp_path):
    """On real text (a few standard-library modules, another one held out) an early back-off pays
    off over 8-token segments for a measurable share of segments; per token it never does."""
    from latticedraft.lm.build import BuildOptions, build
    from latticedraft.lm.corpus import read_text, stdlib_root
    from latticedraft.lm.tokenizer import load_tokenizer

    root = stdlib_root()
    train = [root / f for f in ("argparse.py", "textwrap.py", "json/decoder.py", "json/encoder.py", "shlex.py")]
    out = tmp_path / "lm"
    build(BuildOptions(corpus=[str(p) for p in train], out=out, order=3, train_tokenizer=500, memory="64M", progress=False))
    fst = NgramFst.load(out / "lm.fst")
    ids = load_tokenizer(out).encode(read_text(root / "string.py")).ids[:4000]
    n_tok_diff = 0
    s = fst.start
    for t in ids:
        e = fst.epsilon_cost(s, [t])
        s, c = fst.arc_lookup(s, t)
        n_tok_diff += e < c - 1e-4
    n_seg, gaps = _segment_gaps(fst, ids, first=8)
    n_seg_diff = len(gaps)
    print(f"\nepsilon vs exact on string.py: {n_tok_diff}/{len(ids)} tokens, {n_seg_diff}/{n_seg} 8-token segments "
          f"cheaper by epsilon; gap mean {np.mean(gaps) if gaps else 0:.3f}, max {max(gaps, default=0):.3f} nats")
    assert n_tok_diff == 0
    assert n_seg_diff > 0


BAD = {
    "duplicate": ("\\data\\\nngram 1=3\n\n\\1-grams:\n-1\t<s>\t0\n-1\t0\t0\n-1\t0\t0\n\n\\end\\\n", "line 7: duplicate 1-gram"),
    "no prefix": ("\\data\\\nngram 1=2\nngram 2=1\n\n\\1-grams:\n-1\t<s>\t0\n-1\t0\t0\n\n\\2-grams:\n-1\t1 0\n\n\\end\\\n",
                  r"line 10: the 2-gram's prefix \(1-gram\) is not in the file"),
    "id too big": ("\\data\\\nngram 1=2\n\n\\1-grams:\n-1\t<s>\t0\n-1\t9\t0\n\n\\end\\\n", "line 6: token id 9 is outside the vocabulary of 5"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_inconsistent_arpa_is_reported_with_line(tmp_path, name):
    text, msg = BAD[name]
    p = tmp_path / "bad.arpa"
    p.write_text(text)
    with pytest.raises(InputError, match=msg):
        NgramFst.from_arpa(p, vocab_size=5)


def test_arc_lookup_many_equals_arc_lookup(tiny_build, fst):
    big = NgramFst.load(tiny_build / "lm.fst")
    rng = np.random.default_rng(3)
    for f, V in ((fst, 5), (big, 300)):
        states = rng.integers(0, f.num_states, size=(40, 25))
        toks = rng.integers(0, V, size=(40, 25))
        nxt, cost = f.arc_lookup_many(states, toks)
        assert nxt.shape == cost.shape == (40, 25) and cost.dtype == np.float32
        for i in range(40):
            for j in range(25):
                n, c = f.arc_lookup(int(states[i, j]), int(toks[i, j]))
                assert nxt[i, j] == n and cost[i, j] == pytest.approx(c, rel=1e-6)
    # broadcasting: one state, many tokens
    nxt, cost = big.arc_lookup_many(big.start, np.arange(300))
    assert nxt.shape == (300,)
    with pytest.raises(InputError, match="token id 300"):
        big.arc_lookup_many([0, 0], [1, 300])


def test_lm_package_exports():
    import latticedraft.lm as lm_pkg

    assert lm_pkg.NgramFst is NgramFst and lm_pkg.NgramLM.__name__ == "NgramLM"

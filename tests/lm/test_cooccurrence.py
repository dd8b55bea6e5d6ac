"""Co-occurrence counts and masks against hand counts on a 20-token corpus."""

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from latticedraft.errors import InputError, ModelError
from latticedraft.lm.cooccurrence import CooccurrenceStats, build_for_lm_dir

# 20 tokens over ids 0..5. Hand counts (see comments):
#   unigrams: 0→6, 1→6, 2→4, 3→2, 4→1, 5→1                      (20 positions)
#   bigrams:  (0,1)→5, (1,2)→4, (2,0)→3, the 7 others once        (19 positions)
#   triples:  (0,1,2)→3, (1,2,0)→3, (2,0,1)→2, 10 others once     (18 positions)
#   offset 2: (0,2)→3
CORPUS = [0, 1, 2, 0, 1, 3, 0, 1, 2, 4, 5, 0, 1, 2, 0, 3, 1, 2, 0, 1]
V = 6


@pytest.fixture
def stats():
    return CooccurrenceStats.from_sequences([CORPUS], vocab_size=V, fingerprint="f" * 64)


def test_counts_equal_hand_counts(stats):
    assert stats.unigram.tolist() == [6, 6, 4, 2, 1, 1]
    assert stats.n_tokens == (20, 19, 18)
    c2 = stats.counts([np.arange(V), np.arange(V)])
    assert c2[0, 1] == 5 and c2[1, 2] == 4 and c2[2, 0] == 3
    assert c2[1, 0] == 0 and c2.sum() == 19
    assert sorted(c2[c2 > 0].tolist()) == [1] * 7 + [3, 4, 5]
    c3 = stats.counts([np.arange(V)] * 3)
    assert c3[0, 1, 2] == 3 and c3[1, 2, 0] == 3 and c3[2, 0, 1] == 2
    assert c3.sum() == 18 and (c3 == 1).sum() == 10
    assert stats.pairs[2][0, 2] == 3


def test_mask_equals_hand_values(stats):
    # (p̂(0,1) / p̂(0) p̂(1)) = (5/19) / (6/20 * 6/20)
    m = stats.mask([np.array([0, 1]), np.array([1, 0])], alpha_c=1.0, unseen_weight=0.5)
    assert m[0, 0] == pytest.approx((5 / 19) / (0.3 * 0.3))
    assert m[1, 1] == 0.5  # (1,0) never seen, both tokens seen: δ
    m3 = stats.mask([np.array([0]), np.array([1]), np.array([2, 5])], alpha_c=1.0, unseen_weight=0.0)
    assert m3[0, 0, 0] == pytest.approx((3 / 18) / (0.3 * 0.3 * 0.2))
    assert m3[0, 0, 1] == 0.0  # (0,1,5) never seen: hard masking with δ = 0
    half = stats.mask([np.array([4]), np.array([5])], alpha_c=0.5)
    assert half[0, 0] == pytest.approx(((1 / 19) / (0.05 * 0.05)) ** 0.5)
    assert stats.mask([np.array([1]), np.array([0])], alpha_c=0.5, unseen_weight=0.25)[0, 0] == 0.5
    assert np.all(stats.mask([np.arange(V)] * 2, alpha_c=0.0) == 1.0)


def test_mask_matches_brute_force_on_every_grid_cell(stats):
    from collections import Counter

    big = Counter(zip(CORPUS, CORPUS[1:]))
    tri = Counter(zip(CORPUS, CORPUS[1:], CORPUS[2:]))
    uni = Counter(CORPUS)
    ids = np.arange(V)
    m = stats.mask([ids, ids], alpha_c=0.7, unseen_weight=0.25)
    m3 = stats.mask([ids, ids, ids], alpha_c=1.0, unseen_weight=0.1)
    for a in range(V):
        for b in range(V):
            want = (big[(a, b)] / 19) / ((uni[a] / 20) * (uni[b] / 20)) if big[(a, b)] else 0.25
            assert m[a, b] == pytest.approx(want**0.7)
            for c in range(V):
                want = (tri[(a, b, c)] / 18) / (uni[a] * uni[b] * uni[c] / 20**3) if tri[(a, b, c)] else 0.1
                assert m3[a, b, c] == pytest.approx(want)


def test_tokens_the_corpus_never_contains_are_not_reweighted():
    # a floor on the joint count (0.5) would give (0.5/3) / (0.5/4)² ≈ 10.7 to the never-seen pair (3,2): no
    s = CooccurrenceStats.from_sequences([[0, 1, 0, 1]], vocab_size=4, fingerprint="x")
    with np.errstate(all="raise"):
        m = s.mask([np.array([0, 3]), np.array([1, 2])], unseen_weight=0.0)
    assert m[0, 0] == pytest.approx((2 / 3) / (0.5 * 0.5))  # (0,1): 2 of the 3 bigrams
    assert m[0, 1] == 1.0 and m[1, 0] == 1.0 and m[1, 1] == 1.0
    with pytest.raises(InputError, match="unseen_weight"):
        s.mask([np.array([0]), np.array([1])], unseen_weight=2.0)


def test_ngrams_do_not_cross_sequence_boundaries():
    s = CooccurrenceStats.from_sequences([[0, 1], [2, 3]], vocab_size=4, fingerprint="x")
    assert s.counts([np.array([1]), np.array([2])])[0, 0] == 0
    assert s.n_tokens == (4, 2, 0)


def test_save_load_round_trip_and_atomic(tmp_path, stats):
    p = stats.save(tmp_path)
    assert p.name == "cooccurrence.npz" and [q.name for q in tmp_path.iterdir()] == ["cooccurrence.npz"]
    back = CooccurrenceStats.load(tmp_path)
    assert back.vocab_size == V and back.fingerprint == stats.fingerprint
    ids = np.arange(V)
    assert np.array_equal(back.counts([ids] * 3), stats.counts([ids] * 3))
    assert np.array_equal(back.mask([ids] * 2), stats.mask([ids] * 2))


def test_vocabulary_mismatch_is_refused(stats):
    stats.check(vocab_size=V, fingerprint="f" * 64)
    with pytest.raises(ModelError, match="vocabulary size 6 but the model has 7"):
        stats.check(vocab_size=7)
    with pytest.raises(ModelError, match="tokenizer"):
        stats.check(fingerprint="e" * 64)


def test_bad_inputs(tmp_path, stats):
    with pytest.raises(InputError, match="outside the vocabulary"):
        CooccurrenceStats.from_sequences([[0, 9]], vocab_size=4, fingerprint="x")
    with pytest.raises(InputError, match="not found"):
        CooccurrenceStats.load(tmp_path / "nope")
    with pytest.raises(InputError, match="2..3"):
        stats.mask([np.arange(2)])
    bad = tmp_path / "cooccurrence.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ModelError, match="is not a co-occurrence table") as e:
        CooccurrenceStats.load(bad)
    assert "allow_pickle" not in str(e.value)


def _word_tokenizer(words):
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def test_build_for_lm_dir_from_files(tmp_path):
    tok = _word_tokenizer(["<unk>", "a", "b", "c"])
    tok_path = tmp_path / "tokenizer.json"
    tok.save(str(tok_path))
    (tmp_path / "c1.txt").write_text("a b c a b\n")
    (tmp_path / "c2.txt").write_text("b c\n")
    lm = tmp_path / "lm"
    lm.mkdir()
    out = build_for_lm_dir(lm, tokenizer_path=tok_path, corpus=[str(tmp_path / "c1.txt"), str(tmp_path / "c2.txt")])
    s = CooccurrenceStats.load(out)
    assert s.unigram.tolist() == [0, 2, 3, 2]
    assert s.counts([np.array([1]), np.array([2])])[0, 0] == 2  # "a b" twice
    assert s.counts([np.array([2]), np.array([3])])[0, 0] == 2  # "b c" once per file
    assert s.counts([np.array([3]), np.array([2])])[0, 0] == 0  # no "c b" across files
    with pytest.raises(InputError, match="--force"):
        build_for_lm_dir(lm, tokenizer_path=tok_path, corpus=[str(tmp_path / "c1.txt")])


def test_build_for_lm_dir_reads_the_manifest(tmp_path):
    import json

    tok = _word_tokenizer(["<unk>", "a", "b", "c"])
    lm = tmp_path / "lm"
    lm.mkdir()
    tok.save(str(lm / "tokenizer.json"))
    (tmp_path / "c1.txt").write_text("a b c a b\n")
    (lm / "manifest.json").write_text(json.dumps({
        "tokenizer": {"file": "tokenizer.json"}, "corpus": {"files": [{"path": str(tmp_path / "c1.txt")}]}}))
    s = CooccurrenceStats.load(build_for_lm_dir(lm))
    assert s.unigram.tolist() == [0, 2, 2, 1] and s.vocab_size == 4
    from latticedraft.lm.tokenizer import fingerprint

    s.check(vocab_size=4, fingerprint=fingerprint(tok))


def test_grid_lookup_with_repeated_ids_and_empty_tables(stats):
    c = stats.counts([np.array([0, 0, 2]), np.array([1, 1, 0])])
    assert c.tolist() == [[5, 5, 0], [5, 5, 0], [0, 0, 3]]
    c3 = stats.counts([np.array([0]), np.array([1, 1]), np.array([2, 3, 2])])
    assert c3.tolist() == [[[3, 1, 3], [3, 1, 3]]]
    empty = CooccurrenceStats.from_sequences([[1]], vocab_size=3, fingerprint="x")
    assert empty.counts([np.arange(3)] * 3).sum() == 0 and empty.counts([np.arange(3)] * 2).sum() == 0


def test_cli_lm_cooccurrence_one_line_errors_and_success(tmp_path, capsys):
    from latticedraft.cli import main

    assert main(["lm", "cooccurrence", "--lm", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: LM build directory") and "\n" not in err
    tok = _word_tokenizer(["<unk>", "a", "b"])
    lm = tmp_path / "lm"
    lm.mkdir()
    tok.save(str(lm / "tokenizer.json"))
    (tmp_path / "c.txt").write_text("a b a b\n")
    assert main(["lm", "cooccurrence", "--lm", str(lm), "--corpus", str(tmp_path / "c.txt")]) == 2  # not an LM build
    assert "holds no manifest.json, so it is not a" in capsys.readouterr().err
    (lm / "manifest.json").write_text("{}")
    assert main(["lm", "cooccurrence", "--lm", str(lm), "--corpus", str(tmp_path / "c.txt")]) == 0
    assert "2 distinct triples" in capsys.readouterr().out  # (a b a), (b a b)
    assert CooccurrenceStats.load(lm).triple_keys.size == 2
    assert main(["lm", "cooccurrence", "--lm", str(lm), "--corpus", str(tmp_path / "c.txt")]) == 2
    assert "--force" in capsys.readouterr().err

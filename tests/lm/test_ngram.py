"""NgramLM: loading, the state API (hashable, context-equal states), scoring conventions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from latticedraft.errors import InputError, ModelError
from latticedraft.lm.ngram import LMState, NgramLM


@pytest.fixture(scope="module")
def lm(tiny_build) -> NgramLM:
    return NgramLM.load(tiny_build)


def test_load_is_lazy_and_reports_shape(lm, tiny_build):
    fresh = NgramLM.load(tiny_build)
    assert fresh._fst is None  # manifest only until scoring starts
    assert fresh.order == 3 and fresh.vocab_size == 300 and fresh.build_dir == tiny_build
    assert len(fresh.vocab) == 300 and fresh.vocab[0] == "<|endoftext|>"


def test_states_are_hashable_and_equal_for_equal_contexts(lm):
    ids = lm.tokenizer.encode("def alpha_3(beta, gamma):\n    return beta.gamma").ids
    a = lm.begin(ids)
    b = lm.begin([7, 7, 7] + ids)  # only the last n-1 ids matter
    assert a == b and hash(a) == hash(b) and isinstance(a, LMState)
    assert len({a, b, lm.begin(ids[:-1])}) == 2
    s, lp = lm.advance(lm.begin(ids[:-1]), ids[-1])
    assert s == a and lp == pytest.approx(lm.logprob(ids[:-1], ids[-1]))
    assert lm.begin([]) == lm.begin(()) != lm.begin([ids[0]])


def test_score_is_float32_natural_log_and_normalised(lm):
    ids = lm.tokenizer.encode("for item in data:\n").ids
    sc = lm.score(ids)
    assert sc.dtype == np.float32 and sc.shape == (len(ids),) and np.all(sc < 0)
    # a proper distribution: p(x | state) over the tokens the corpus had, plus </s>, plus lmplz's
    # original <unk> mass (which the build replaced by Appendix D's 1000 nats) sums to 1
    fst = lm.fst
    s = fst.state_for_history(ids)
    seen = [t for t in range(lm.vocab_size) if fst.arc_lookup(0, t)[1] < 999]
    total = sum(math.exp(-fst.arc_lookup(s, t)[1]) for t in seen) + math.exp(-fst.end_cost(s))
    unk = 10 ** lm.manifest["lmplz"]["unk_log10_from_lmplz"]
    assert total + unk * math.exp(-_backoff_to_null(fst, s)) == pytest.approx(1.0, abs=1e-4)


def _backoff_to_null(fst, s):
    c = 0.0
    while fst.backoff_next[s] >= 0:
        c += float(fst.backoff_cost[s])
        s = int(fst.backoff_next[s])
    return c


def test_bad_ids_and_missing_build(lm, tmp_path):
    with pytest.raises(InputError, match="token id 300 is outside"):
        lm.score([1, 300])
    with pytest.raises(InputError, match="does not exist"):
        NgramLM.load(tmp_path / "nothing")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "lm.fst").write_bytes(b"")
    with pytest.raises(InputError, match="holds no manifest.json, so it is not a complete LM build"):
        NgramLM.load(tmp_path / "half")


def test_unk_cost_option(tiny_build):
    lm = NgramLM.load(tiny_build, unk_cost=20.0)
    fst = lm.fst
    unseen = [t for t in range(300) if fst.arc_lookup(0, t) == (0, pytest.approx(20.0))]
    assert unseen, "the 300-token BPE has byte tokens the corpus never uses"
    assert lm.score([unseen[0]])[0] == pytest.approx(-20.0 - float(fst.backoff_cost[fst.start]), abs=1e-4)
    kl = NgramLM.load(tiny_build, unk_cost="kenlm")
    assert kl.score([unseen[0]])[0] == pytest.approx(-kl.fst.unk_arpa_cost - float(fst.backoff_cost[fst.start]), abs=1e-4)


def test_not_a_build(tmp_path):
    d = tmp_path / "other"
    d.mkdir()
    (d / "manifest.json").write_text('{"format": "something-else"}')
    with pytest.raises(ModelError, match="not a latticedraft n-gram build"):
        NgramLM.load(d)

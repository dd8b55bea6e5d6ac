"""Suffix drafts: the suffix array's lookups equal a brute-force scan of the remembered sequences,
and decoding with them stays exact while a later call copies an earlier call's output."""

import numpy as np
import pytest

from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode
from latticedraft.decoding.registry import Request
from latticedraft.decoding.proposers.suffix import SuffixDrafts, SuffixProposer
from latticedraft.errors import InputError
from tests.decoding.tiny import prompts, reference, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def brute_force(sequences, history, max_ngram, num_tokens, max_paths):
    corpus = [-1]
    for s in sequences:
        corpus += list(s) + [-1]
    h = list(history)
    for m in range(min(max_ngram, len(h)), 0, -1):
        out, seen = [], []
        for p in range(len(corpus) - m, -1, -1):  # most recent first
            if corpus[p:p + m] == h[len(h) - m:]:
                tail = []
                for t in corpus[p + m:p + m + num_tokens]:
                    if t < 0:
                        break
                    tail.append(t)
                key = tuple(tail)
                if key and not any(x[:len(key)] == key for x in seen):
                    seen.append(key)
                    out.append((tail, m))
                    if len(out) == max_paths:
                        break
        if out:
            return out
    return []


@pytest.mark.parametrize("seed", range(30))
def test_continuations_equal_brute_force(seed):
    rng = np.random.default_rng(seed)
    V = 3 + seed % 5
    memory = [rng.integers(0, V, size=rng.integers(1, 30)) for _ in range(rng.integers(0, 5))]
    calls = [rng.integers(0, V, size=rng.integers(1, 10)) for _ in range(rng.integers(0, 3))]
    s = SuffixDrafts(max_ngram=1 + seed % 4, num_tokens=1 + seed % 6, max_paths=1 + seed % 4)
    s.remember(memory)
    s.index(calls)
    for _ in range(5):
        h = rng.integers(0, V, size=rng.integers(1, 12))
        got = [(c.tokens.tolist(), c.match) for c in s.continuations(h)]
        assert got == brute_force([*memory, *calls], h, s.max_ngram, s.num_tokens, s.max_paths)


def test_memory_keeps_the_newest_sequences(monkeypatch):
    import latticedraft.decoding.proposers.suffix as suffix

    monkeypatch.setattr(suffix, "MEMORY_TOKENS", 10)
    s = SuffixDrafts(max_ngram=2)
    s.remember([np.arange(6), np.arange(6) + 10, np.arange(4) + 20])
    assert [x.tolist() for x in s.memory] == [list(range(10, 16)), [20, 21, 22, 23]]


def test_a_later_call_drafts_an_earlier_output_and_stays_exact():
    model = tiny_model("llama")
    ps = prompts(2, seed=3, lengths=(5, 8))
    refs = [reference(model, p, 24) for p in ps]
    src = SuffixProposer(4)
    first = bpd_decode(model, ps, None, BpdPlan(sources=[src]), Request(max_new_tokens=24))
    again = bpd_decode(model, ps, None, BpdPlan(sources=[src]), Request(max_new_tokens=24))
    for res in (first, again):
        assert [q.tokens.tolist() for q in res.sequences] == refs
    before = sum(q.calls for q in first.sequences)
    after = sum(q.calls for q in again.sequences)
    assert after < before / 2  # the second call copies the first call's continuations


def test_bad_values_are_refused_in_one_line():
    from latticedraft.decoding import registry

    bpd = registry.get("bpd")
    with pytest.raises(InputError, match="--suffix-drafts -1"):
        bpd.configure({"drafter": "none", "suffix_drafts": -1}, {"suffix_drafts"})
    assert bpd.configure({"drafter": "top1", "do_sample": True, "suffix_drafts": 3}, set()).suffix_drafts == 3

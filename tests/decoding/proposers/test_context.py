"""Context n-grams (prompt lookup) equal a brute-force scan of the history."""

import numpy as np
import pytest

from latticedraft.decoding.proposers.context import ContextNgrams
from latticedraft.errors import InputError


def brute_force(h, max_ngram, min_ngram, num_tokens, max_paths):
    out, seen = [], []
    for n in range(min(max_ngram, len(h) - 1), min_ngram - 1, -1):
        for i in range(len(h) - n - 1, -1, -1):
            if list(h[i:i + n]) == list(h[len(h) - n:]):
                cont = tuple(h[i + n:i + n + num_tokens])
                if cont and not any(s[:len(cont)] == cont for s in seen):
                    seen.append(cont)
                    out.append((list(cont), n))
                    if len(out) == max_paths:
                        return out
    return out


@pytest.mark.parametrize("seed", range(30))
def test_candidates_equal_brute_force(seed):
    rng = np.random.default_rng(seed)
    h = rng.integers(0, 4 + seed % 5, size=rng.integers(1, 60))
    opts = ContextNgrams(max_ngram=1 + seed % 4, min_ngram=1, num_tokens=1 + seed % 7, max_paths=1 + seed % 5)
    got = [(c.tokens.tolist(), c.match) for c in opts.candidates(h)]
    assert got == brute_force(h.tolist(), opts.max_ngram, opts.min_ngram, opts.num_tokens, opts.max_paths)


def test_longest_match_first_and_continuations_follow_the_match():
    h = np.array([1, 2, 3, 9, 9, 7, 2, 3, 4, 4, 2, 3])
    cands = ContextNgrams(max_ngram=2, num_tokens=2, max_paths=4).candidates(h)
    assert [(c.tokens.tolist(), c.match) for c in cands] == [([4, 4], 2), ([9, 9], 2)]
    # min_ngram=1 also offers what followed the last token alone where that differs
    more = ContextNgrams(max_ngram=2, min_ngram=1, num_tokens=1, max_paths=4).candidates(np.array([5, 3, 8, 3, 6, 5, 3]))
    assert [(c.tokens.tolist(), c.match) for c in more] == [([8], 2), ([6], 1)]


def test_no_match_and_short_history():
    assert ContextNgrams().candidates(np.array([1, 2, 3])) == []
    assert ContextNgrams().candidates(np.array([7])) == []


@pytest.mark.parametrize("kw", [dict(max_ngram=0), dict(max_ngram=2, min_ngram=3), dict(num_tokens=0),
                                dict(max_paths=0)])
def test_bad_options(kw):
    with pytest.raises(InputError):
        ContextNgrams(**kw)

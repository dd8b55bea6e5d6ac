"""A drafted token's interpolated probability equals the one computed from KenLM's own scores."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from latticedraft.lattice.interpolated import token_probs
from latticedraft.lattice.rescoring import rescore
from latticedraft.lattice.sausage import Sausage
from tests.lattice.test_rescoring import _real_cases
from tests.lm.kenlm_ref import kenlm_logp


def reference(s: Sausage, paths, lm_logp, alpha: float) -> np.ndarray:
    """q(t) = M_j softmax_a(head_logp + alpha * ln p_LM(a | path_<j))[t], by enumeration."""
    out = np.zeros(paths.shape)
    for r, path in enumerate(paths.tolist()):
        for j, t in enumerate(path):
            if t < 0:
                break
            arcs = [int(a) for a in s.tokens[j, : s.widths[j]]]
            if t not in arcs:
                continue
            head = [float(x) for x in s.logp[j, : s.widths[j]]]
            scores = [h + alpha * lm_logp(path[:j], a) for h, a in zip(head, arcs)]
            top = max(scores)
            z = sum(math.exp(x - top) for x in scores)
            out[r, j] = sum(math.exp(h) for h in head) * math.exp(scores[arcs.index(t)] - top) / z
    return out


def test_equals_kenlm_enumeration(real_lm):
    kenlm = pytest.importorskip("kenlm")
    fst, arpa, ids = real_lm
    model = kenlm.Model(str(arpa))
    rng = np.random.default_rng(3)
    checked = 0
    for s, hist in _real_cases(ids, fst, rng, 30):
        hist = hist[-2:]
        if len(hist) < 2:
            continue
        alpha = float(rng.choice([0.25, 1.0, 2.0]))
        paths = rescore(s, fst, alpha, 6, hist).tokens
        lm = lambda prefix, a: kenlm_logp(model, hist, prefix + [a]) - kenlm_logp(model, hist, prefix)  # noqa: E731
        np.testing.assert_allclose(token_probs(s, paths, fst, alpha, hist), reference(s, paths, lm, alpha),
                                   rtol=2e-3, atol=1e-6)
        checked += 1
    assert checked >= 10


def test_alpha_zero_is_the_heads_probability_and_a_pad_ends_a_path(real_lm):
    fst, _, ids = real_lm
    s = Sausage(np.array([[5, 6, 7], [8, 9, 10]]), np.log(np.array([[0.5, 0.3, 0.1], [0.6, 0.2, 0.1]], np.float32)))
    paths = np.array([[6, 9], [7, -1], [11, 8]])  # 11 is in no slot: 0 there
    exp = np.array([[0.3, 0.2], [0.1, 0.0], [0.0, 0.6]])
    np.testing.assert_allclose(token_probs(s, paths, fst, 0.0, ids[:5]), exp, rtol=1e-6)
    np.testing.assert_allclose(token_probs(s, paths, None, 1.0), exp, rtol=1e-6)
    q = token_probs(s, paths, fst, 1.0, ids[:5])
    assert q[1, 1] == 0.0 and q[2, 0] == 0.0 and (q[0] > 0).all() and q[2, 1] > 0
    # a slot keeps the heads' mass over its arcs, however the LM reorders them
    every = np.array(list(itertools.product(*[s.tokens[j].tolist() for j in range(2)])))
    first = {int(t): v for t, v in zip(every[:, 0], token_probs(s, every, fst, 1.0, ids[:5])[:, 0])}
    assert sum(first.values()) == pytest.approx(0.9, rel=1e-6)

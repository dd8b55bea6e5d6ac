"""Acceptance tables fitted from decode steps: counts conditional on the greedy prefix, each
source's table per bin (match length or probability) and depth, smoothing towards the prior, and
the on-disk cache."""

import numpy as np
import pytest

from latticedraft.decoding.planning import acceptance
from latticedraft.decoding.planning.acceptance import HEAD_EDGES, PRIOR_WEIGHT, AcceptanceModel, fit, head_bins
from latticedraft.decoding.proposers.context import ContextNgrams, ContextProposer
from latticedraft.lattice import Sausage


def lattice(rows):
    """rows: per slot, [(token, prob), ...] -> a Sausage with those log-probabilities."""
    k = max(len(r) for r in rows)
    tokens = np.full((len(rows), k), -1, dtype=np.int64)
    logp = np.full((len(rows), k), -np.inf, dtype=np.float32)
    for j, r in enumerate(rows):
        for c, (t, p) in enumerate(r):
            tokens[j, c], logp[j, c] = t, np.log(p)
    return Sausage(tokens, logp)


def test_head_rates_count_only_where_the_greedy_prefix_is_in_the_lattice():
    # slot 0 candidates at p=0.85: greedy token present in 3 of 4 steps; slot 1 counts only those 3
    s = lattice([[(1, 0.85), (2, 0.07)], [(3, 0.85), (4, 0.07)]])
    greedy = [np.array([1, 3]), np.array([1, 3]), np.array([1, 4]), np.array([9, 3])]
    m = fit([s] * 4, greedy, [np.array([0])] * 4)
    b85 = int(np.searchsorted(HEAD_EDGES, 0.85, side="right")) - 1
    b05 = int(np.searchsorted(HEAD_EDGES, 0.07, side="right")) - 1
    prior = AcceptanceModel.prior()
    assert m.head_rate[0, b85] == pytest.approx((3 + PRIOR_WEIGHT * prior.head_rate[0, b85]) / (4 + PRIOR_WEIGHT))
    assert m.head_rate[1, b85] == pytest.approx((2 + PRIOR_WEIGHT * prior.head_rate[1, b85]) / (3 + PRIOR_WEIGHT))
    assert m.head_rate[1, b05] == pytest.approx((1 + PRIOR_WEIGHT * prior.head_rate[1, b05]) / (3 + PRIOR_WEIGHT))
    assert m.head(0, 0.85) == m.head_rate[0, b85]
    assert m.counts["head"] == 4 * 2 + 3 * 2


def test_with_the_drafted_paths_head_rates_count_tree_nodes_whose_parent_is_the_greedy_prefix():
    """The chain rule multiplies P(node right | parent right): a slot-1 node counts only where its
    own parent is the greedy token, not wherever the greedy token is somewhere in slot 0."""
    s = lattice([[(1, 0.85), (2, 0.07)], [(3, 0.85), (4, 0.07)]])
    drafts = np.array([[1, 3], [2, 4]])  # the tree: 1 -> 3 and 2 -> 4
    greedy = [np.array([1, 3]), np.array([1, 4]), np.array([2, 4]), np.array([9, 3])]
    m = fit([s] * 4, greedy, [np.array([0])] * 4, drafts=[drafts] * 4)
    b85 = int(np.searchsorted(HEAD_EDGES, 0.85, side="right")) - 1
    b05 = int(np.searchsorted(HEAD_EDGES, 0.07, side="right")) - 1
    prior = AcceptanceModel.prior()
    rate = lambda hit, seen, j, b: (hit + PRIOR_WEIGHT * prior.head_rate[j, b]) / (seen + PRIOR_WEIGHT)  # noqa: E731
    assert m.head_rate[0, b85] == pytest.approx(rate(2, 4, 0, b85))  # token 1: right in steps 1 and 2
    assert m.head_rate[0, b05] == pytest.approx(rate(1, 4, 0, b05))  # token 2: right in step 3
    # slot 1: node 1 -> 3 seen where greedy starts with 1 (steps 1, 2), right in step 1; node 2 -> 4 seen in
    # step 3 only, right there. The lattice-wide count would also have seen 4 under 1 in step 2 (a hit).
    assert m.head_rate[1, b85] == pytest.approx(rate(1, 2, 1, b85))
    assert m.head_rate[1, b05] == pytest.approx(rate(1, 1, 1, b05))
    assert m.counts["head"] == 4 * 2 + 3


def test_context_rates_per_match_and_depth():
    ctx = ContextProposer(ContextNgrams(max_ngram=2, min_ngram=2, num_tokens=3, max_paths=1))
    hist = np.array([5, 6, 7, 8, 9, 5, 6])  # suffix [5, 6] matched: continuation [7, 8, 9]
    greedy = [np.array([7, 8, 9]), np.array([7, 1, 9]), np.array([2, 8, 9])]
    m = fit([lattice([[(1, 0.5)]])] * 3, greedy, [hist] * 3, paths={"context": (ctx.paths, "match")})
    w, p0 = PRIOR_WEIGHT, acceptance.CTX_PRIOR
    assert m.rates("context", [2, 2, 2]).tolist() == pytest.approx(
        [(2 + w * p0) / (3 + w), (1 + w * p0) / (2 + w), (1 + w * p0) / (1 + w)])
    assert m.rates("context", [1]) == pytest.approx(p0)  # no data: the prior
    assert m.counts["context"] == 3 + 2 + 1


def test_counts_are_stored_read_and_added_to(tmp_path, monkeypatch):
    """A session's counts go to .cache/acceptance under their key; the next session reads them and
    adds its own: rates from both sessions' observations."""
    monkeypatch.setenv("LATTICEDRAFT_CACHE", str(tmp_path))
    first = fit([lattice([[(1, 0.9)]])] * 3, [np.array([1])] * 3, [np.array([0])] * 3)
    assert acceptance.load({"k": 1}) is None
    acceptance.store({"k": 1}, first)
    again = acceptance.load({"k": 1})
    assert np.array_equal(again.head_seen, first.head_seen) and acceptance.load({"k": 2}) is None
    both = again.add(fit([lattice([[(1, 0.9)]])], [np.array([2])], [np.array([0])]))
    b = int(head_bins(0.9))
    assert both.head_seen[0, b] == 4 and both.head_hit[0, b] == 3
    assert both.head_rate[0, b] == pytest.approx((3 + PRIOR_WEIGHT * AcceptanceModel().head_rate[0, b]) / (4 + PRIOR_WEIGHT))


def test_lm_rates_per_depth_and_probability_bin_conditional_on_the_prefix():
    """The LM table counts token d of the LM's continuation in its probability's bin where tokens
    < d were right, and survives the cache's JSON."""
    def lm(history):  # a continuation whose probabilities fall in the 0.85 and 0.07 bins
        return [(np.array([7, 8]), head_bins(np.array([0.85, 0.07])))]

    greedy = [np.array([7, 8]), np.array([7, 1]), np.array([2, 8])]
    m = fit([None] * 3, greedy, [np.array([0])] * 3, paths={"lm": (lm, "probability")})
    b85, b07 = int(head_bins(0.85)), int(head_bins(0.07))
    prior = acceptance.prior_table("probability")
    rate = lambda hit, seen, d, b: (hit + PRIOR_WEIGHT * prior[b, d]) / (seen + PRIOR_WEIGHT)  # noqa: E731
    t = m.table("lm")
    assert t[b85, 0] == pytest.approx(rate(2, 3, 0, b85))
    assert t[b07, 1] == pytest.approx(rate(1, 2, 1, b07))  # seen only where token 0 was right
    assert t[b85, 1] == pytest.approx(prior[b85, 1])  # no data: the prior (the bin's middle)
    assert m.counts["lm"] == 5
    back = AcceptanceModel.from_json(m.to_json())
    assert np.allclose(back.table("lm"), t, atol=1e-5)

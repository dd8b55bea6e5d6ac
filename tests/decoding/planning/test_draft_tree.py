"""The cost-aware draft tree: ``fixed`` verifies every path; ``auto`` picks the ancestor-closed
node set that maximises expected tokens per second, equal to brute force on small tries."""

import itertools

import numpy as np
import pytest

from latticedraft.decoding.planning.acceptance import AcceptanceModel, RateCorrection
from latticedraft.decoding.proposers.base import Proposal, Step
from latticedraft.decoding.proposers.context import ContextNgrams, ContextProposer
from latticedraft.decoding.proposers.heads import draft_probs
from latticedraft.decoding.planning.draft_tree import TreePlanner
from latticedraft.errors import InputError
from latticedraft.gpu.verify.cost_model import CostModel
from latticedraft.gpu.verify.tree import build_tree
from latticedraft.lattice import Sausage


def curve(t1, slope):
    n = np.arange(1, 65)
    return CostModel(tuple(n.tolist()), tuple((t1 + slope * (n - 1)).tolist()))


def sausage(rng, h=3, k=3, V=6):
    logits = rng.normal(size=(h, V)).astype(np.float32) * 2
    return Sausage.from_logits(logits, k=k)


def prefixes(paths):
    return {tuple(p[: i + 1]) for p in paths for i in range(len(p))}


def heads(s, drafts, acc=None):
    """The heads' proposal of ``drafts`` from lattice ``s``, rated as ``HeadProposer`` rates it
    (unrated without ``acc``: the fixed tree)."""
    rates = None if acc is None else acc.head_rates(draft_probs(s, drafts)) if s is not None else np.full(drafts.shape, 0.5)
    return Proposal(np.asarray(drafts), rates=rates, sausage=s)


def context(ngrams, history, acc=None):
    """The context n-grams' proposal after ``history``, rated as ``ContextProposer`` rates it."""
    step = Step([0], [0], [np.asarray(history)], [64], acceptance=acc)
    return ContextProposer(ngrams).propose(step)[0]


def test_fixed_keeps_every_path_cut_to_room():
    drafts = np.array([[4, 5, 6], [4, 7, -1]])
    plan = TreePlanner("fixed").plan([heads(None, drafts)], room=2)
    assert plan.drafts.tolist() == [[4, 5], [4, 7]] and plan.nodes == 4
    ctx = TreePlanner("fixed").plan([heads(None, drafts),
                                     context(ContextNgrams(max_ngram=1, num_tokens=2), np.array([3, 8, 9, 3]))])
    assert ctx.drafts.tolist() == [[4, 5, 6], [4, 7, -1], [8, 9, -1]]
    assert ctx.nodes == build_tree(3, ctx.drafts).size


@pytest.mark.parametrize("seed", range(12))
def test_auto_equals_brute_force_over_ancestor_closed_sets(seed):
    rng = np.random.default_rng(seed)
    s = sausage(rng)
    drafts = np.array(list(itertools.product(*[s.tokens[j].tolist() for j in range(2)])))[: 4 + seed % 4]
    cost = curve(1.0, [0.02, 0.1, 0.3, 1.5][seed % 4])
    planner = TreePlanner("auto", acceptance=AcceptanceModel.prior(), cost=cost)
    prop = heads(s, drafts, planner.acceptance)
    plan = planner.plan([prop])
    # brute force: every ancestor-closed subset of the candidate trie
    prob = {}
    for toks, rates in zip(prop.tokens, prop.rates):
        p = 1.0
        for i, r in enumerate(rates):
            p *= r
            key = tuple(toks[: i + 1].tolist())
            prob[key] = max(prob.get(key, 0.0), p)
    nodes = sorted(prob)
    best = 0.0
    for m in range(len(nodes) + 1):
        for sub in itertools.combinations(nodes, m):
            if all(x[:-1] in sub or len(x) == 1 for x in sub):
                best = max(best, (1 + sum(prob[x] for x in sub)) / cost.seconds(1 + m))
    got = prefixes([row[row >= 0].tolist() for row in plan.drafts])
    assert plan.nodes == 1 + len(got)
    assert all(x[:-1] in got or len(x) == 1 for x in got)  # ancestor-closed
    assert (1 + sum(prob[x] for x in got)) / cost.seconds(plan.nodes) == pytest.approx(best)
    assert plan.expected == pytest.approx(1 + sum(prob[x] for x in got))


def test_cheap_nodes_verify_everything_and_dear_ones_nothing():
    rng = np.random.default_rng(0)
    s = sausage(rng)
    drafts = np.array([[s.tokens[0, 0], s.tokens[1, 0]], [s.tokens[0, 1], s.tokens[1, 1]]])
    flat = TreePlanner("auto", cost=curve(1.0, 0.0))
    assert flat.plan([heads(s, drafts, flat.acceptance)]).nodes == build_tree(0, drafts).size
    dear = TreePlanner("auto", cost=curve(1.0, 10.0))
    dear = dear.plan([heads(s, drafts, dear.acceptance)])
    assert dear.nodes == 1 and dear.drafts.shape == (1, 0)


def test_overhead_makes_bigger_trees_pay():
    rng = np.random.default_rng(3)
    s = sausage(rng, h=4, k=4)
    drafts = np.array(list(itertools.product(*[s.tokens[j, :2].tolist() for j in range(4)])))
    planner = TreePlanner("auto", cost=curve(1.0, 0.15))
    prop = heads(s, drafts, planner.acceptance)
    small = planner.plan([prop]).nodes
    planner.overhead = 5.0
    assert planner.plan([prop]).nodes > small


def test_max_nodes_caps_the_tree():
    drafts = np.arange(1, 41).reshape(4, 10)
    planner = TreePlanner("auto", cost=curve(1.0, 0.0), max_nodes=8)
    plan = planner.plan([heads(None, drafts, planner.acceptance)])
    assert plan.nodes <= 8


def test_bad_policy_and_missing_cost():
    with pytest.raises(InputError, match="--tree"):
        TreePlanner("bogus")
    with pytest.raises(InputError, match="cost model"):
        TreePlanner("auto")


def test_rows_of_a_batch_share_one_tree_size():
    """The padded batch pays for the largest tree: one size m for every row (all its nodes where a
    row has fewer), the m maximising the rows' summed gain over T(m + 1), by brute force."""
    planner = TreePlanner("auto", cost=curve(1.0, 0.05))
    rich = Proposal(np.array([[1, 2, 3, 4], [5, 6, 7, 8]]), rates=np.array([[0.9] * 4, [0.3] * 4]))
    poor = Proposal(np.array([[9, 10, 11, 12]]), rates=np.array([[0.2, 0.1, 0.1, 0.1]]))
    Ps = [np.sort(np.concatenate([np.cumprod(r) for r in p.rates]))[::-1] for p in (rich, poor)]
    rate = [sum(1 + P[:m].sum() for P in Ps) / (1.0 + 0.05 * m) for m in range(9)]
    m = int(np.argmax(rate))
    plans = planner.plan_rows([[rich], [poor]], [None, None])
    assert [p.nodes for p in plans] == [1 + min(m, len(P)) for P in Ps] == [6, 5]
    assert planner.plan([poor]).nodes == 2  # alone, the poor row would verify one node
    assert TreePlanner("fixed").plan_rows([[rich], [poor]], [2, None])[0].drafts.shape == (2, 2)


def test_rate_correction_starts_neutral_and_learns_per_bin():
    c = RateCorrection(decay=1.0)
    r = np.array([0.05, 0.5, 0.97])
    assert np.allclose(c.corrected(r), r)  # ratio 1 before any data
    c.observe(np.full(40, 0.5), np.zeros(40, dtype=bool))  # 40 misses at 0.5
    fixed = c.corrected(r)
    assert fixed[1] < 0.1 * 0.5 and fixed[0] == pytest.approx(0.05) and fixed[2] == pytest.approx(0.97)
    c.observe(np.full(400, 0.6), np.ones(400, dtype=bool))  # every 0.6 kept
    assert c.corrected(np.array([0.6]))[0] == pytest.approx(0.6 * (400 + 2.6) / (240 + 2.6))
    assert c.corrected(np.array([0.69]))[0] == 1.0  # capped


def test_observe_counts_the_nodes_whose_parent_was_kept():
    """Tree 1 -> 2 -> 3 and 1 -> 4, plus 5: the target kept [1, 2]. Counted: 1 and 5 (under the
    root), 2 and 4 (under 1), 3 (under 2); kept: 1 and 2."""
    c = RateCorrection(decay=1.0)
    planner = TreePlanner("auto", cost=curve(1.0, 0.0), correction=c)
    prop = Proposal(np.array([[1, 2, 3], [1, 4, -1], [5, -1, -1]]),
                    rates=np.array([[0.9, 0.8, 0.6], [0.9, 0.3, 0], [0.15, 0, 0]]))
    plan = planner.plan([prop])
    assert plan.nodes == 6
    before = (c.kept.copy(), c.expected.copy())
    planner.observe([np.array([1, 2])])
    added = c.expected - before[1]
    from latticedraft.decoding.planning.acceptance import head_bins
    want = np.zeros_like(added)  # [sources, bins]: one source here, 0
    np.add.at(want[0], head_bins(np.array([0.9, 0.15, 0.8, 0.3, 0.6])), [0.9, 0.15, 0.8, 0.3, 0.6])
    assert np.allclose(added, want)
    hits = np.zeros_like(added)
    np.add.at(hits[0], head_bins(np.array([0.9, 0.8])), 1.0)
    assert np.allclose(c.kept - before[0], hits)
    planner.observe([np.array([1, 2])])  # nothing planned since: nothing counted twice
    assert np.allclose(c.expected - before[1], want)


def test_a_correction_that_saw_misses_plans_a_smaller_tree():
    """Rates the run does not bear out (every 0.5-0.9 token missed) shrink the tree; without the
    correction the same proposal verifies every node."""
    drafts = np.arange(1, 13).reshape(3, 4)
    prop = Proposal(drafts, rates=np.full(drafts.shape, 0.85))
    plain = TreePlanner("auto", cost=curve(1.0, 0.08))
    c = RateCorrection(decay=1.0)
    c.observe(np.full(200, 0.85), np.zeros(200, dtype=bool))
    taught = TreePlanner("auto", cost=curve(1.0, 0.08), correction=c)
    assert taught.plan([prop]).nodes < plain.plan([prop]).nodes


def test_each_source_is_corrected_on_its_own():
    """Misses of the first proposal's 0.85 tokens correct that source only: the second
    proposal's 0.85 tokens keep their rate, and the tree keeps them."""
    c = RateCorrection(decay=1.0)
    planner = TreePlanner("auto", cost=curve(1.0, 0.08), correction=c)
    first = Proposal(np.array([[1, 2, 3]]), rates=np.full((1, 3), 0.85))
    second = Proposal(np.array([[4, 5, 6]]), rates=np.full((1, 3), 0.85))
    for _ in range(50):
        planner.plan([first, second])
        planner.observe([np.array([4, 5, 6])])  # the second source's path, every time
    assert c.corrected(np.array([0.85]), 0)[0] < 0.3 and c.corrected(np.array([0.85]), 1)[0] > 0.85
    kept = prefixes([row[row >= 0].tolist() for row in planner.plan([first, second]).drafts])
    assert (4, 5, 6) in kept and (1,) not in kept


def test_the_calls_own_times_rescale_t_of_n_and_keep_its_shape():
    """T(n) follows the verify calls' times as one scale on the measured curve: its shape (what n
    nodes cost against one) is kept, so calls at one size teach every size, and a burst of load in
    one call moves it little."""
    from latticedraft.gpu.verify.cost_model import CostModel

    p = TreePlanner("auto", cost=CostModel((1, 4, 8), (1.0, 1.3, 1.6)), max_nodes=8)
    before = p._T.copy()
    for _ in range(60):
        p.observe_cost(4, 2.6)  # calls twice as slow as measured (a longer cache, a busy machine)
    assert np.allclose(p._T, 2 * before, rtol=0.01) and (np.diff(p._T) >= 0).all()
    p.observe_cost(2, 1000.0)  # one call stalled: clipped to twice the curve, a tenth of the way
    assert np.allclose(p._T, before * (2 + 0.1 * (2 - 2)), rtol=0.02)
    assert p.step_seconds(4) == pytest.approx(p._T[3] + p.overhead)
    TreePlanner("fixed").observe_cost(3, 9.0)  # no cost model: nothing to refine

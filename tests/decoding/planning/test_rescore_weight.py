"""The n-gram rescorer's learned weight (``decoding/planning/rescore_weight.py``): scored against
what the target kept, it rises where the LM knows the target's path and backs off to 0 where the
LM is mismatched; it pays for its rescoring or stays at 0; it round-trips through the cache."""

import json

import numpy as np
import pytest

from latticedraft.decoding.planning import rescore_weight as rw
from latticedraft.decoding.planning.rescore_weight import ARMS, AlphaLearner, kept
from latticedraft.decoding.proposers.base import as_paths
from latticedraft.decoding.proposers.heads import NgramDrafter
from latticedraft.lattice.sausage import Sausage
from latticedraft.lm.wfst import NgramFst

V = 16


def chain_lm(tmp_path, follows: dict, name: str) -> NgramFst:
    """A bigram LM over ids 0..V-1 in which token a is followed by ``follows[a]`` with probability
    0.98 (every other pair backs off to a flat unigram)."""
    uni = [f"{-np.log10(V):.4f}\t{t}\t-2.0" for t in range(V)]
    bi = [f"-0.0088\t{a} {b}" for a, b in follows.items()]
    text = ("\\data\\\n" f"ngram 1={V + 2}\n" f"ngram 2={len(bi)}\n\n\\1-grams:\n-99\t<s>\t0\n-2\t</s>\n"
            + "\n".join(uni) + "\n\n\\2-grams:\n" + "\n".join(bi) + "\n\n\\end\\\n")
    path = tmp_path / f"{name}.arpa"
    path.write_text(text)
    return NgramFst.from_arpa(path, vocab_size=V)


TARGET = np.array([3, 4, 5, 6])  # the target's path after the root (token 2)
WRONG = np.array([9, 10, 11, 12])


def lattice(heads_right: bool) -> Sausage:
    """4 slots of 3 arcs: the target's token and a wrong one, the heads preferring the target's
    (``heads_right``) or the wrong one, and a third token far behind."""
    first, second = (TARGET, WRONG) if heads_right else (WRONG, TARGET)
    tokens = np.stack([first, second, np.full(4, 14)], axis=1)
    logp = np.tile(np.log([0.55, 0.4, 0.05]), (4, 1)).astype(np.float32)
    return Sausage(tokens, logp)


def run(drafter: NgramDrafter, sausage: Sausage, steps: int, seconds: float = 0.05) -> None:
    """``steps`` lattice steps of one row whose target kept all of TARGET and a bonus."""
    history = np.array([1, 2])
    for _ in range(steps):
        paths = as_paths(drafter.draft(sausage, history))
        record = drafter.learn(sausage, history, paths, kept(paths, TARGET) + 1, seconds, drafter.drafted)
        if record is not None:  # (None: arm 0 drafted and nothing was probed)
            drafter.settle(record, TARGET)


def test_kept_is_the_longest_target_prefix_a_path_holds():
    paths = np.array([[3, 4, 9, -1], [3, 8, 8, 8], [7, 4, 5, 6]])
    assert kept(paths, np.array([3, 4, 5, 6, 1])) == 2
    assert kept(paths, np.array([3])) == 1  # at most what the target is known for
    assert kept(paths, np.array([5, 5])) == 0
    assert kept(np.zeros((1, 0), np.int64), np.array([3])) == 0


def test_kept_in_a_cost_aware_tree_counts_the_prefixes_it_would_verify():
    """Under the cost-aware tree only the ``nodes`` most probable prefixes are verified (a prefix's
    chance: the product of its tokens' rates): a path's match counts as far as its prefixes are
    among them."""
    paths = np.array([[3, 4, 5], [3, 8, -1], [7, 4, 5]])
    rates = np.array([[0.9, 0.2, 0.9], [0.9, 0.5, 0.0], [0.05, 0.9, 0.9]])
    target = np.array([3, 4, 5])
    # chances: 3: .9, 3 4: .18, 3 4 5: .162, 3 8: .45, 7: .05, 7 4: .045, 7 4 5: .0405
    assert kept(paths, target) == 3
    assert kept(paths, target, rates, nodes=6) == 3
    assert kept(paths, target, rates, nodes=3) == 2  # 3, 3 8, 3 4
    assert kept(paths, target, rates, nodes=2) == 1  # 3, 3 8
    assert kept(paths, target, rates, nodes=0) == 0


def test_kept_sizes_each_rankings_tree_as_the_planner_would():
    """With the step's predicted seconds instead of a node count, a ranking's tree is the size of
    most expected tokens per second for its own rates (``draft_tree.best_size``): the same paths
    rated higher earn a bigger tree and keep more; rated too low to pay, no tree at all."""
    from latticedraft.decoding.planning.draft_tree import TreePlanner
    from latticedraft.decoding.proposers.base import Proposal
    from latticedraft.gpu.verify.cost_model import CostModel

    paths = np.array([[3, 4, 5]])
    target = np.array([3, 4, 5])
    n = np.arange(1, 5)
    planner = TreePlanner("auto", cost=CostModel(tuple(n.tolist()), tuple((1.0 + 0.3 * (n - 1)).tolist())))
    seconds = planner.step_seconds(np.arange(1, 5))
    for rates, size in (([0.9, 0.9, 0.9], 3), ([0.9, 0.3, 0.3], 1), ([0.2, 0.9, 0.9], 0)):
        rates = np.array([rates])
        assert planner.plan([Proposal(paths, rates=rates)]).nodes - 1 == size  # (what the planner verifies)
        assert kept(paths, target, rates, seconds=seconds) == size


def test_the_weight_rises_where_the_lm_knows_the_target(tmp_path):
    """The heads rank a wrong token first in every slot; the LM follows the target's chain. The
    learner starts at 0 (the heads' ranking, which keeps nothing), probes the weights and moves to
    one whose best path is the target's."""
    lm = chain_lm(tmp_path, {2: 3, 3: 4, 4: 5, 5: 6}, "helps")
    w = AlphaLearner(probe_share=1.0)  # probe every step
    d = NgramDrafter(lm, nbest=1, learner=w)
    assert w.alpha == 0.0
    run(d, lattice(heads_right=False), 40)
    assert w.alpha > 0
    assert kept(as_paths(d.draft(lattice(False), np.array([1, 2]))), TARGET) == 4
    assert w.best[0] > w.best[1]  # the rescored best path kept more than the heads' best path
    assert w.drafted_at[w.arm] > 0


def test_the_weight_backs_off_to_0_where_the_lm_is_mismatched(tmp_path):
    """The heads rank the target's token first; the LM follows a wrong chain. A learner that
    believed in alpha = 1 (a stored gain) drafts with it, loses tokens against the heads' ranking
    and backs off to 0."""
    lm = chain_lm(tmp_path, {2: 9, 9: 10, 10: 11, 11: 12}, "mismatched")
    w = AlphaLearner(probe_share=1.0)
    i = ARMS.index((1.0, 0))
    w.gain[i], w.n[i], w.cost[i], w.seconds = 2.0, 1.0, 1e-6, 0.05
    d = NgramDrafter(lm, nbest=1, learner=w)
    assert w.alpha == 1.0
    run(d, lattice(heads_right=True), 40)
    assert w.alpha == 0.0
    assert (w.gains()[1:] <= 0).all()
    assert d.draft(lattice(True), np.array([1, 2])).tokens[0].tolist() == TARGET.tolist()  # the heads' own ranking


def test_a_weight_that_gains_too_little_for_its_rescoring_stays_at_0(tmp_path):
    """Tokens per second decide: the same gain as above, but steps as cheap as a rescoring, so
    the LM search would cost more time than its tokens save (and more than ``MAX_SHARE`` of a step)."""
    lm = chain_lm(tmp_path, {2: 3, 3: 4, 4: 5, 5: 6}, "helps")
    w = AlphaLearner(probe_share=1.0)
    d = NgramDrafter(lm, nbest=1, learner=w)
    run(d, lattice(heads_right=False), 40, seconds=1e-7)
    assert (w.gains()[1:] > 0).any() and w.alpha == 0.0


def test_the_learner_round_trips_through_the_cache(tmp_path, own_cache):
    lm = chain_lm(tmp_path, {2: 3, 3: 4, 4: 5, 5: 6}, "helps")
    w = AlphaLearner(probe_share=1.0)
    run(NgramDrafter(lm, nbest=1, learner=w), lattice(heads_right=False), 20)
    key = {"weights": ["/m.safetensors"], "lm": "/lm", "drafter": {"name": "ngram", "k": 3}}
    assert rw.load(key) is None
    path = rw.store(key, w)
    assert path == rw.path_of(key) and path.parent == own_cache / "rescore_weight"
    back = rw.load(key)
    assert back.alpha == w.alpha > 0 and back.to_json() == w.to_json()
    assert rw.load({**key, "lm": "/other"}) is None  # another LM: its own entry


@pytest.mark.parametrize("damage", [
    lambda d: "{not json",
    lambda d: json.dumps({**d, "gain": [1.0]}),
    lambda d: json.dumps({**d, "n": [-1.0] * len(ARMS)}),
    lambda d: json.dumps({**d, "arms": [[0.0, 0], [1.0, 0]]}),
    lambda d: json.dumps({**d, "seconds": float("nan")}),
    lambda d: json.dumps({**d, "gain": [1e9] * len(ARMS)}),
    lambda d: json.dumps({**d, "cost": [-1.0] * len(ARMS)}),
])
def test_a_damaged_entry_reads_as_none_and_says_why(own_cache, damage):
    key = {"lm": "/lm"}
    path = rw.store(key, AlphaLearner())
    path.write_text(damage(json.loads(path.read_text())))
    heard = []
    assert rw.load(key, note=heard.append) is None
    assert len(heard) == 1 and str(path) in heard[0]


def test_a_narrow_lm_search_is_drafted_with_where_the_whole_lattice_costs_too_much():
    """The arms' costs decide between LM searches that keep the same tokens: over the whole
    lattice a rescoring costs 10% of a step (over ``MAX_SHARE``), over the best 4 arcs of each slot
    0.1%; the learner drafts with a top-4 arm (costs given, not timed)."""
    wrong = np.array([[9, 10, 11, 12]])

    def rank(alpha, width):
        paths = TARGET[None] if alpha >= 0.25 else wrong
        return paths, np.full(paths.shape, 0.5), (1e-6 if alpha == 0 else 1e-3 if width == 0 else 1e-5)

    w = AlphaLearner(probe_share=1.0)
    arm = 0
    for _ in range(60):
        paths, _, secs = rank(*ARMS[arm])
        record = w.ranked(rank, arm, paths, wrong[0], kept(paths, TARGET) + 1, 0.01, secs)
        if record is not None:
            w.observe(record, TARGET)
        arm = w.arm
    alpha, width = ARMS[w.arm]
    assert alpha >= 0.25 and width == 4
    assert not w.affordable()[ARMS.index((0.25, 0))]


def test_a_step_drafted_with_arm_0_and_no_probe_makes_no_record():
    """Learning costs nothing beyond the probes while the heads' own ranking drafts: arm 0 against
    itself is no comparison, so such a step leaves only its tokens and seconds."""
    paths = np.array([[3, 4, 5, 6]])
    rank = lambda alpha, width: (paths, np.full(paths.shape, 0.5), 1e-4)  # noqa: E731
    w = AlphaLearner(probe_share=0.0)
    assert w.ranked(rank, 0, paths, paths[0], 2, 0.01, 1e-5) is not None  # (a first probe: nothing spent yet)
    assert all(w.ranked(rank, 0, paths, paths[0], 2, 0.01, 1e-5) is None for _ in range(5))
    assert w.steps == 6 and w.drafted_at[0] == 6

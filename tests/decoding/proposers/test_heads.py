"""The heads' drafts (``decoding/proposers/heads.py``): under sampling, the first slot's runner-up;
greedy, the n-gram drafters' learned weight, which never changes the output."""

import numpy as np
import pytest
import torch

from latticedraft.decoding.proposers.heads import with_runner_up
from latticedraft.lattice.sausage import Sausage


def sausage(tokens):
    t = np.asarray(tokens, dtype=np.int64)
    logp = np.where(t >= 0, np.log(0.5) - np.arange(t.shape[1])[None, :], -np.inf).astype(np.float32)
    return Sausage(t, logp)


def test_a_single_path_gets_the_first_slots_runner_up_as_a_one_token_path():
    s = sausage([[4, 9, 2], [5, 1, -1]])
    out = with_runner_up(np.array([[4, 5]]), s)
    np.testing.assert_array_equal(out, [[4, 5], [9, -1]])


def test_nothing_is_added_without_a_runner_up_or_beside_several_paths():
    paths = np.array([[4, 5]])
    np.testing.assert_array_equal(with_runner_up(paths, sausage([[4, -1], [5, -1]])), paths)  # pruned to one arc
    np.testing.assert_array_equal(with_runner_up(paths, sausage([[4], [5]])), paths)  # k = 1
    two = np.array([[4, 5], [9, 1]])
    np.testing.assert_array_equal(with_runner_up(two, sausage([[4, 9], [5, 1]])), two)
    empty = np.zeros((1, 0), dtype=np.int64)
    assert with_runner_up(empty, sausage([[4, 9]])).shape == (1, 0)


def test_a_runner_up_equal_to_the_drafted_token_is_not_repeated():
    """A rescoring drafter may draft the slot's second arc: its runner-up is then the path itself."""
    paths = np.array([[9, 5]])
    np.testing.assert_array_equal(with_runner_up(paths, sausage([[4, 9], [5, 1]])), [[9, 5], [4, -1]])


@pytest.mark.parametrize("name,arch,tree", [("parallel", "gpt2", "fixed"), ("ngram", "llama", "fixed"),
                                            ("parallel", "llama", "auto")])
def test_a_decode_with_a_learned_weight_equals_generate(name, arch, tree, one_torch_thread):
    """The n-gram drafters with a learned weight (``alpha=None``): a learner that believes in 0.5
    drafts with it, probes the other arms (narrower LM searches too) and learns from every step
    (under the cost-aware tree, from the prefixes a tree of the step's size would verify); the
    output is generate's."""
    from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode
    from latticedraft.gpu.verify.cost_model import CostModel
    from latticedraft.decoding.planning.rescore_weight import ARMS, AlphaLearner
    from latticedraft.decoding.proposers.heads import LatticeOptions, NgramDrafter, make_drafter
    from latticedraft.decoding.registry import Request
    from tests.decoding.tiny import blockwise, prompts, reference
    from tests.lattice.toylm import make_toy_lm

    model = blockwise(arch, torch.float32, num_heads=5)
    ps = prompts(4, seed=2, lengths=(3, 9, 5, 14))
    refs = [reference(model, p, 24) for p in ps]
    w = AlphaLearner(probe_share=1.0)
    i = ARMS.index((0.5, 0))
    w.gain[i], w.n[i], w.cost[i], w.seconds = 4.0, 1.0, 1e-6, 1.0
    lm = make_toy_lm(V=64, order=3, seed=0, density=0.5)
    d = make_drafter(name, options=LatticeOptions(k=8), lm=lm, alpha=None, nbest=4, learner=w)
    n = np.arange(1, 33)
    plan = BpdPlan(tree=tree, cost=CostModel(tuple(n.tolist()), tuple((1.0 + 0.05 * (n - 1)).tolist())))
    in_flight = 2 if tree == "auto" else None  # (a continuous batch: rows finish and others join)
    r = bpd_decode(model, ps, d, plan, request=Request(max_new_tokens=24, in_flight=in_flight))
    assert [s.tokens.tolist() for s in r.sequences] == refs
    assert w.steps > 0 and w.drafted_at[i] > 0 and w.n[1:].sum() > 1.0
    own = make_drafter(name, lm=lm, alpha=None)  # without a learner given: a new one, from 0
    assert isinstance(own, NgramDrafter) and own.learner.alpha == 0.0
    assert make_drafter(name, lm=lm, alpha=0.5).learner is None  # a given weight is fixed


def test_a_learning_drafters_record_settles_once_the_row_emitted_the_lattices_depth():
    """``HeadProposer.update``: a step's record waits until the row has emitted as many tokens after
    that step's root as the lattice is deep (the target's own path there, not just the accepted
    tokens and the bonus), or until the row ends (its budget, or ``retire``)."""
    from latticedraft.decoding.proposers.base import Step, StepRows
    from latticedraft.decoding.proposers.heads import Drafter, HeadProposer

    class Recorder(Drafter):
        learns = True

        def __init__(self):
            super().__init__()
            self.settled = []

        def learn(self, sausage, history, paths, tokens, seconds, drafted, tree=None):
            return (len(history), tokens)

        def settle(self, record, target):
            self.settled.append((record, target.tolist()))

    d = Recorder()
    hp = HeadProposer(d)
    hp.start(StepRows([0, 1], [0, 1], [np.array([1]), np.array([1])]))
    lat = sausage([[4, 9], [5, 1], [6, 2]])  # 3 slots deep
    step = lambda hist, rooms: Step([0, 1], [0, 1], hist, rooms)  # noqa: E731

    hp.pending = {0: (lat, np.array([1, 2]), np.array([[4, 5, 6]]), None, None),
                  1: (lat, np.array([1, 3]), np.array([[4, 5, 6]]), None, None)}
    hp.update(step([np.array([1, 2]), np.array([1, 3])], [20, 2]), [np.array([4]), np.array([], np.int64)],
              np.array([5, 8]), None)
    assert d.settled == []  # 2 and 1 tokens after the roots: not yet 3
    hp.update(step([np.array([1, 2, 4, 5]), np.array([1, 3, 8])], [18, 1]), [np.array([7]), np.array([9])],
              np.array([3, 4]), None)
    # row 0 has emitted 4, 5, 7, 3 after its root: its target is the first 3; row 1's budget ends: it settles
    # with what it emitted (8, 9, 4)
    assert sorted(d.settled) == [((2, 1), [8, 9, 4]), ((2, 2), [4, 5, 7])]
    hp.pending = {0: (lat, np.array([1, 2, 4, 5, 7, 3]), np.array([[4, 5, 6]]), None, None)}
    hp.update(step([np.array([1, 2, 4, 5, 7, 3]), np.array([1])], [16, 5]),
              [np.array([], np.int64), np.array([], np.int64)], np.array([6, 6]), None)
    hp.retire([1])  # row 0 finished (its end id): it settles with the one token it emitted
    assert d.settled[-1] == ((6, 1), [6])


def test_the_tree_rates_rescored_tokens_by_the_interpolated_model_and_base_paths_by_the_heads():
    """An n-gram drafter's tokens reach the cost-aware tree rated by the model that ranked them
    (``lattice.interpolated.token_probs``): a token the LM moved up is rated above its head
    probability; at weight 0 (the learner's arm 0) the rates are ``parallel-base``'s, exactly."""
    from latticedraft.decoding.planning.acceptance import AcceptanceModel
    from latticedraft.decoding.proposers.base import Step, StepRows
    from latticedraft.decoding.proposers.heads import HeadProposer, LatticeOptions, draft_probs, make_drafter
    from latticedraft.lattice.interpolated import token_probs
    from tests.lattice.toylm import make_toy_lm

    lm = make_toy_lm(V=16, order=3, seed=1, density=0.6)
    logits = torch.randn(3, 16, generator=torch.Generator().manual_seed(0)) * 2
    history = np.array([2, 5, 7])
    rated = {}
    for name, alpha in (("parallel-base", None), ("parallel", 0.0), ("parallel", 2.0)):
        d = make_drafter(name, options=LatticeOptions(k=4), lm=lm, alpha=alpha, nbest=4)
        hp = HeadProposer(d)
        hp.start(StepRows([0], [0], [history]))
        acc = AcceptanceModel.prior()
        [prop] = hp.propose(Step([0], [0], [history], [8], head_logits=logits[None], acceptance=acc))
        sausage = d.lattice(logits)
        probs = draft_probs(sausage, prop.tokens) if alpha in (None, 0.0) else token_probs(sausage, prop.tokens, lm,
                                                                                          alpha, history)
        np.testing.assert_array_equal(prop.rates, acc.head_rates(probs))
        rated[(name, alpha)] = prop
    base, zero, lm2 = rated[("parallel-base", None)], rated[("parallel", 0.0)], rated[("parallel", 2.0)]
    np.testing.assert_array_equal(zero.tokens, base.tokens)
    np.testing.assert_array_equal(zero.rates, base.rates)
    heads_rates = AcceptanceModel.prior().head_rates(draft_probs(d.lattice(logits), lm2.tokens))
    assert (lm2.rates != heads_rates).any()  # (the LM reweighs this lattice: the rates are not the heads')

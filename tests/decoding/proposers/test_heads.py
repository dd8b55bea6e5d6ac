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


@pytest.mark.parametrize("name,arch", [("parallel", "gpt2"), ("ngram", "llama")])
def test_a_decode_with_a_learned_weight_equals_generate(name, arch, one_torch_thread):
    """The n-gram drafters with a learned weight (``alpha=None``): a learner that believes in 0.5
    drafts with it, probes the others and learns from every step; the output is generate's."""
    from latticedraft.decoding.methods.bpd_loop import bpd_decode
    from latticedraft.decoding.planning.rescore_weight import GRID, AlphaLearner
    from latticedraft.decoding.proposers.heads import LatticeOptions, NgramDrafter, make_drafter
    from latticedraft.decoding.registry import Request
    from tests.decoding.tiny import blockwise, prompts, reference
    from tests.lattice.toylm import make_toy_lm

    model = blockwise(arch, torch.float32, num_heads=5)
    ps = prompts(4, seed=2, lengths=(3, 9, 5, 14))
    refs = [reference(model, p, 24) for p in ps]
    w = AlphaLearner(probe_share=1.0)
    w.gain[GRID.index(0.5)], w.n[GRID.index(0.5)], w.seconds = 4.0, 1.0, 1.0
    lm = make_toy_lm(V=64, order=3, seed=0, density=0.5)
    d = make_drafter(name, options=LatticeOptions(k=8), lm=lm, alpha=None, nbest=4, learner=w)
    r = bpd_decode(model, ps, d, request=Request(max_new_tokens=24))
    assert [s.tokens.tolist() for s in r.sequences] == refs
    assert w.steps > 0 and w.drafted_at[GRID.index(0.5)] > 0 and w.n[1:].sum() > 1.0
    own = make_drafter(name, lm=lm, alpha=None)  # without a learner given: a new one, from 0
    assert isinstance(own, NgramDrafter) and own.learner.alpha == 0.0
    assert make_drafter(name, lm=lm, alpha=0.5).learner is None  # a given weight is fixed

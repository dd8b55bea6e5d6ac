"""The heads' drafts under sampling (``decoding/proposers/heads.py``): the first slot's runner-up."""

import numpy as np

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

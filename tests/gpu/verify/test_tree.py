import numpy as np
import pytest

from latticedraft.errors import InputError
from latticedraft.gpu.verify.tree import build_tree, pack_trees


def test_shared_prefixes_become_one_node():
    t = build_tree(7, np.array([[1, 2, 3], [1, 2, 4], [5, 6, 7]]))
    assert t.tokens.tolist() == [7, 1, 2, 3, 4, 5, 6, 7]
    assert t.parent.tolist() == [-1, 0, 1, 2, 2, 0, 5, 6]
    assert t.depth.tolist() == [0, 1, 2, 3, 3, 1, 2, 3]


def test_ancestors_are_the_path_to_the_root():
    t = build_tree(0, np.array([[1, 2, 3], [1, 9, 9]]))
    for i in range(t.size):
        chain, j = set(), i
        while j >= 0:
            chain.add(j)
            j = int(t.parent[j])
        assert set(np.nonzero(t.ancestors[i])[0].tolist()) == chain


def test_identical_drafts_and_negative_tokens():
    t = build_tree(3, np.array([[4, 5, -1], [4, 5, -1], [4, -1, 6]]))
    assert t.tokens.tolist() == [3, 4, 5]  # -1 ends a draft; duplicates merge


def test_pack_pads_with_self_attending_nodes():
    a, b = build_tree(1, np.array([[2, 3]])), build_tree(1, np.zeros((1, 0), dtype=np.int64))
    p = pack_trees([a, b], pad_token=0)
    assert p.tokens.shape == (2, 3) and p.sizes.tolist() == [3, 1]
    assert p.ancestors[1].tolist() == np.eye(3, dtype=bool).tolist()


def test_bad_shape_raises():
    with pytest.raises(InputError, match="2-D"):
        build_tree(0, np.zeros((2, 2, 2), dtype=np.int64))

"""The accept walk: the longest draft path whose every token is the target's choice at its parent,
then the bonus (``walk``), a choice that ends the walk at a child, and the map from a trie's
nodes to drafts laid out as batch rows (``draft_positions``)."""

import numpy as np

from latticedraft.gpu.verify.tree import build_tree
from latticedraft.gpu.verify.walk import draft_positions, node_of, walk


def test_walk_follows_the_argmax_and_ends_with_the_bonus():
    t = build_tree(7, np.array([[1, 2, 3], [1, 2, 4], [5, 6, 7]]))  # nodes: 7 | 1 2 3 4 | 5 6 7
    argmax = np.array([1, 2, 4, 0, 8, 9, 9, 9])  # after the root 1, after node 1 2, after node 2 4, after node 4 8
    paths, bonus = walk([t, t], lambda rows, nodes: ([argmax[n] if r == 0 else 11 for r, n in zip(rows, nodes)], None))
    assert paths == [[0, 1, 2, 4], [0]] and bonus.tolist() == [8, 11]


def test_a_choice_may_end_the_walk_at_a_child():
    t = build_tree(7, np.array([[1, 2, 3]]))
    paths, bonus = walk([t], lambda rows, nodes: ([[1, 2, 3][nodes[0]]], [nodes[0] == 1]))  # stop after node 1
    assert paths == [[0, 1]] and bonus.tolist() == [2]


def test_draft_positions_name_the_first_draft_of_each_prefix():
    drafts = [[1, 5, -1], [1, 2, 3], [1, 2, 4], [1, 2, 4]]
    seq = np.array([[7, *d] for d in drafts])
    t = build_tree(7, seq[:, 1:])
    at = draft_positions(t, seq)
    node = lambda *prefix: node_of(t, prefix)  # noqa: E731
    assert at[0] == (0, 0) and at[node(1)] == (0, 1) and at[node(1, 5)] == (0, 2)
    assert at[node(1, 2)] == (1, 2) and at[node(1, 2, 3)] == (1, 3) and at[node(1, 2, 4)] == (2, 3)

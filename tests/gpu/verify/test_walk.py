"""The accept walk: the longest draft path whose every token is the target's choice at its parent,
then the bonus; over trees (``walk``) and over drafts laid out as batch rows (``walk_batched``,
greedy by default)."""

import numpy as np
import torch

from latticedraft.gpu.verify.tree import build_tree
from latticedraft.gpu.verify.walk import walk, walk_batched


def test_walk_follows_the_argmax_and_ends_with_the_bonus():
    t = build_tree(7, np.array([[1, 2, 3], [1, 2, 4], [5, 6, 7]]))  # nodes: 7 | 1 2 3 4 | 5 6 7
    argmax = np.array([1, 2, 4, 0, 8, 9, 9, 9])  # after the root 1, after node 1 2, after node 2 4, after node 4 8
    paths, bonus = walk([t, t], lambda rows, nodes: [argmax[n] if r == 0 else 11 for r, n in zip(rows, nodes)])
    assert paths == [[0, 1, 2, 4], [0]] and bonus.tolist() == [8, 11]


def test_greedy_walk_batched_keeps_the_first_longest_draft():
    """Drafts as rows [root, draft...]: the greedy walk keeps the first draft of the longest
    accepted prefix, and the bonus is the argmax after it."""
    target = {(): 1, (1,): 2, (1, 5): 0, (1, 2): 4, (1, 2, 3): 0, (1, 2, 4): 9}  # prefix -> the target's argmax
    drafts = [[1, 5, -1], [1, 2, 3], [1, 2, 4], [1, 2, 4]]
    seq = np.array([[[7, *d] for d in drafts]])  # b = 1, p = 4, 1 + d = 4
    logits = torch.zeros(1, 4, 4, 16)
    for j, d in enumerate(drafts):
        for k in range(4):
            prefix = tuple(d[:k])
            if -1 not in prefix:
                logits[0, j, k, target[prefix]] = 1.0
    best, nacc, bonus = walk_batched(seq, logits)
    assert best.tolist() == [2] and nacc.tolist() == [3] and bonus.tolist() == [9]

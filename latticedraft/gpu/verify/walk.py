"""The accept walk over verified draft trees: from each row's root, follow the child whose token
was chosen (the target's argmax, or an acceptance rule's choice: ``tree_call.TreeCall.walk``)
until none matches; the last choice is the bonus token. Numpy only, given the choices per
visited node."""

from __future__ import annotations

import numpy as np


def walk(trees, pick) -> tuple[list[list[int]], np.ndarray]:
    """Accept walk over all rows at once, level by level: at each level one ``pick(rows, nodes)
    -> (tokens int64[m], stop bool[m] or None)`` call for the rows still matching (at most depth
    + 1 calls): the token chosen after each visited node, and where the walk ends at it even if
    it is a child (a rule ending the step there). Returns (node paths from the root, bonus tokens)."""
    b = len(trees)
    paths = [[0] for _ in range(b)]
    bonus = np.zeros(b, dtype=np.int64)
    live = list(range(b))
    while live:
        chosen, stop = pick(live, [paths[i][-1] for i in live])
        stop = np.zeros(len(live), dtype=bool) if stop is None else np.asarray(stop)
        nxt = []
        for i, a, end in zip(live, np.asarray(chosen).tolist(), stop.tolist()):
            child = None if end else trees[i].children[paths[i][-1]].get(a)
            if child is None:
                bonus[i] = a
            else:
                paths[i].append(child)
                nxt.append(i)
        live = nxt
    return paths, bonus


def prefix_of(tree, node: int) -> tuple:
    """The draft tokens from the root (excluded) down to ``node`` of a ``DraftTree``."""
    out = []
    while node > 0:
        out.append(int(tree.tokens[node]))
        node = int(tree.parent[node])
    return tuple(reversed(out))


def node_of(tree, prefix) -> int:
    """The node of ``tree`` reached by the draft tokens ``prefix`` from the root."""
    node = 0
    for t in prefix:
        node = tree.children[node][int(t)]
    return node


def draft_positions(tree, seq: np.ndarray) -> dict:
    """Tree node -> (the first draft holding that prefix, its position in the draft's row), for
    drafts laid out as rows seq int64[p, 1 + d] (root, draft, -1 after its end) and their trie."""
    at = {0: (0, 0)}
    for j in range(seq.shape[0]):
        node = 0
        for k, tok in enumerate(seq[j, 1:].tolist(), start=1):
            if tok < 0:
                break
            node = tree.children[node][tok]
            at.setdefault(node, (j, k))
    return at

"""Prefix trees of drafts: p drafts that share prefixes become one token tree.

A *draft tree* has a root (node 0, the token the target model already chose, whose KV is
not yet cached) and one node per distinct draft prefix. Verifying the tree in one forward
needs, per node, its token, its depth (position offset from the root) and the set of its
ancestors (what it may attend to). Numpy only; the torch side lives in ``verifier.py``.

Example::

    >>> t = build_tree(7, np.array([[1, 2, 3], [1, 2, 4], [5, 6, 7]]))
    >>> t.tokens.tolist(), t.depth.tolist()
    ([7, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 3, 1, 2, 3])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latticedraft.errors import InputError


@dataclass(frozen=True)
class DraftTree:
    """A token trie over drafts; node 0 is the root.

    tokens:    int64[n]   token of each node (root first)
    parent:    int64[n]   parent node, -1 for the root
    depth:     int64[n]   0 for the root, j + 1 for a draft's j-th token
    ancestors: bool[n, n] ancestors[i, j]: node j is node i or one of its ancestors
    children:  tuple of dict token -> node, one per node
    """

    tokens: np.ndarray
    parent: np.ndarray
    depth: np.ndarray
    ancestors: np.ndarray
    children: tuple

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])


def build_tree(root_token: int, drafts: np.ndarray) -> DraftTree:
    """Merge drafts (int64[p, d]; a negative token ends a draft early) under ``root_token``."""
    drafts = np.asarray(drafts)
    if drafts.ndim == 1:
        drafts = drafts[None, :]
    if drafts.ndim != 2:
        raise InputError(f"drafts must be a 2-D int array [p, d], got shape {drafts.shape}")
    tokens = [int(root_token)]
    parent = [-1]
    depth = [0]
    children: list[dict[int, int]] = [{}]
    for row in drafts.tolist():
        node = 0
        for tok in row:
            if tok < 0:
                break
            nxt = children[node].get(tok)
            if nxt is None:
                nxt = len(tokens)
                tokens.append(tok)
                parent.append(node)
                depth.append(depth[node] + 1)
                children.append({})
                children[node][tok] = nxt
            node = nxt
    n = len(tokens)
    anc = np.zeros((n, n), dtype=bool)
    for i in range(n):  # parents precede children, so each row extends its parent's row
        if parent[i] >= 0:
            anc[i] = anc[parent[i]]
        anc[i, i] = True
    return DraftTree(
        tokens=np.asarray(tokens, dtype=np.int64),
        parent=np.asarray(parent, dtype=np.int64),
        depth=np.asarray(depth, dtype=np.int64),
        ancestors=anc,
        children=tuple(children),
    )


def main_path(tree: DraftTree) -> np.ndarray:
    """The nodes of the first draft (the proposer's best), root first: int64[k + 1]. ``build_tree``
    numbers them 0..k, each the parent of the next."""
    k = 1
    while k < tree.size and tree.parent[k] == k - 1:
        k += 1
    return np.arange(k, dtype=np.int64)


@dataclass(frozen=True)
class PackedTrees:
    """b trees padded to a common node count N (padding nodes attend only to themselves).

    tokens: int64[b, N]; depth: int64[b, N]; ancestors: bool[b, N, N]; sizes: int64[b]
    """

    tokens: np.ndarray
    depth: np.ndarray
    ancestors: np.ndarray
    sizes: np.ndarray


def pack_trees(trees: list[DraftTree], pad_token: int = 0) -> PackedTrees:
    b = len(trees)
    n = max(t.size for t in trees)
    tokens = np.full((b, n), pad_token, dtype=np.int64)
    depth = np.zeros((b, n), dtype=np.int64)
    anc = np.zeros((b, n, n), dtype=bool)
    anc[:, np.arange(n), np.arange(n)] = True
    for i, t in enumerate(trees):
        s = t.size
        tokens[i, :s] = t.tokens
        depth[i, :s] = t.depth
        anc[i, :s, :s] = t.ancestors
    return PackedTrees(tokens, depth, anc, np.asarray([t.size for t in trees], dtype=np.int64))

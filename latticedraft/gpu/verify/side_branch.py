"""Side branches: nodes that ride along in a verify forward but are never accepted.

Lookahead decoding runs its Jacobi window (the *lookahead branch*) in the same forward as the
verification of its n-gram candidates (Fu et al. 2024, Figure 2(b)). The verifier sees that
as a draft tree plus a side branch: extra nodes with their own visibility, whose argmax is
returned and whose KV is dropped. Numpy only; the torch side lives in ``verifier.py``.

One step's nodes are laid out as in Figure 2(b): the root, then the side nodes, then the
tree's other nodes. Every node sees the cache and the root; a side node sees the side nodes
its ``sees`` row names; a tree node sees its tree ancestors; the branches never see each other.

    >>> from latticedraft.gpu.verify.tree import build_tree
    >>> side = SideBranch(np.array([8, 9]), np.array([1, 2]), np.array([[1, 0], [1, 1]], bool), np.array([1]))
    >>> lay = step_layout(build_tree(7, np.array([[4, 5]])), side)
    >>> lay.tokens.tolist(), lay.depth.tolist(), lay.tree_index.tolist()
    ([7, 8, 9, 4, 5], [0, 1, 2, 1, 2], [0, 3, 4])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latticedraft.errors import InputError
from latticedraft.gpu.verify.tree import DraftTree


@dataclass(frozen=True)
class SideBranch:
    """tokens: int64[s]; depth: int64[s] position offset from the root (>= 1); sees: bool[s, s],
    sees[i, j] = side node i attends to side node j (the diagonal set); wanted: int64[w], the
    side nodes whose argmax the verifier returns, in this order."""

    tokens: np.ndarray
    depth: np.ndarray
    sees: np.ndarray
    wanted: np.ndarray

    def __post_init__(self):
        s = len(self.tokens)
        if self.depth.shape != (s,) or self.sees.shape != (s, s) or not np.all(np.diag(self.sees)):
            raise InputError(f"side branch: {s} tokens need depth[{s}] and sees[{s}, {s}] with a true diagonal")
        if s and self.depth.min() < 1:
            raise InputError("side branch nodes sit after the root: every depth must be >= 1")

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    def chain(self, node: int) -> np.ndarray:
        """The side nodes ``node`` sees, ordered by depth: int64[k]. The batched fallback runs
        each wanted node as one causal row, so this must be a chain of depths 1..k."""
        seen = np.flatnonzero(self.sees[node])
        seen = seen[np.argsort(self.depth[seen], kind="stable")]
        if not np.array_equal(self.depth[seen], np.arange(1, len(seen) + 1)):
            raise InputError(f"side node {node} sees nodes at depths {self.depth[seen].tolist()}, not a chain "
                             "1..k: it cannot run as one row of the batched fallback")
        return seen


@dataclass(frozen=True)
class StepLayout:
    """One row's nodes for one forward. tokens, depth: int64[n]; ancestors: bool[n, n]
    (who may attend to whom among the new nodes); tree_index: int64[t], the layout index of
    tree node k; side_index: int64[s], the layout index of side node i (1 + i)."""

    tokens: np.ndarray
    depth: np.ndarray
    ancestors: np.ndarray
    tree_index: np.ndarray
    side_index: np.ndarray

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])


def step_layout(tree: DraftTree, side: SideBranch | None) -> StepLayout:
    """Root, side nodes, then the tree's other nodes, with the Figure 2(b) visibility."""
    s = 0 if side is None else side.size
    t = tree.size
    n = t + s
    tree_index = np.concatenate([[0], np.arange(1 + s, n)]).astype(np.int64)
    side_index = np.arange(1, 1 + s, dtype=np.int64)
    tokens = np.empty(n, dtype=np.int64)
    depth = np.empty(n, dtype=np.int64)
    tokens[tree_index], depth[tree_index] = tree.tokens, tree.depth
    anc = np.zeros((n, n), dtype=bool)
    anc[np.ix_(tree_index, tree_index)] = tree.ancestors
    if s:
        tokens[side_index], depth[side_index] = side.tokens, side.depth
        anc[np.ix_(side_index, side_index)] = side.sees
        anc[side_index, 0] = True
    return StepLayout(tokens, depth, anc, tree_index, side_index)

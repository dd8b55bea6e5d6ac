"""One verify forward's result, between the forward and the commit: what acceptance reads.

``Verifier.forward`` runs the target once over every row's draft tree and returns a ``TreeCall``:
the trees (``tree.DraftTree``), the target's choices at any node on demand (``argmax_at``,
``logits_at``: the output projection runs only at the nodes asked for, ``forward.Forward``) and
the side branches' argmax. Acceptance (``decoding/accept/``) walks the trees with ``walk(choose)``
and hands the node paths to ``Verifier.commit``, which keeps those nodes in the cache and computes
the heads at the last one. The walk itself (``walk.walk``) knows no rule: ``choose`` picks the
token at each visited node (None: the target's argmax).

    >>> call = verifier.forward(state, roots, drafts)          # doctest: +SKIP
    >>> paths, bonus = call.walk(choose)                       # acceptance, outside the verifier
    >>> res = verifier.commit(state, call, paths, bonus)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from latticedraft.gpu.verify.walk import node_of, prefix_of, walk


@dataclass
class TreeCall:
    """trees: one ``DraftTree`` per row (root = the row's root token); out: the call's ``Forward``
    (logits at layout positions); index(row, node) -> (forward row, position) of a tree node;
    side_argmax: per row, the target's argmax at its side branch's wanted nodes (None without);
    start: the first cache slot the call reserved; layouts: tree and split modes' per-row
    ``side_branch.StepLayout``; batched: (q forward rows per row, node -> (draft, position) per
    row, the kept forward rows once committed) where rows were run as one forward row per draft
    (``Verifier``'s batched mode), else None; last: a prompt call's last positions; t_done: when
    the forward ended (the walk's time is counted from it)."""

    trees: list
    out: object
    index: object
    side_argmax: list | None
    start: int
    layouts: list | None = None
    batched: tuple | None = None
    last: object = None
    t_done: float = 0.0

    def _at(self, rows, nodes) -> tuple[list, list]:
        where = [self.index(r, k) for r, k in zip(rows, nodes)]
        return [f for f, _ in where], [p for _, p in where]

    def argmax_at(self, rows, nodes) -> np.ndarray:
        """The target's argmax after tree node ``nodes[j]`` of row ``rows[j]``: int64[m]."""
        return self.out.argmax_at(*self._at(rows, nodes))

    def logits_at(self, rows, nodes):
        """The target's logits after tree node ``nodes[j]`` of row ``rows[j]``: [m, V] (or
        ``SparseLogits`` where the call was asked for a top-k's reads)."""
        return self.out.logits_at(*self._at(rows, nodes))

    @torch.inference_mode()
    def walk(self, choose=None) -> tuple[list[list[int]], np.ndarray]:
        """Each row's accepted node path from the root and its bonus token (``walk.walk``):
        ``choose(rows, logits [m, V], prefixes, logits_at) -> (tokens int64[m], stop bool[m] or
        None)`` picks the token at each visited node (prefixes: the draft tokens from the root to
        it; logits_at(rows, prefixes) the logits at any other node of the same trees; stop: make
        a child token the bonus instead of following it); None: the target's argmax."""
        if choose is None:
            return walk(self.trees, lambda rows, nodes: (self.argmax_at(rows, nodes), None))

        def pick(rows, nodes):
            at_prefix = lambda rs, pres: self.logits_at(  # noqa: E731
                rs, [node_of(self.trees[r], pre) for r, pre in zip(rs, pres)])
            return choose(rows, self.logits_at(rows, nodes), [prefix_of(self.trees[r], k) for r, k in zip(rows, nodes)],
                          at_prefix)

        return walk(self.trees, pick)

    def accepted(self, paths: list[list[int]]) -> list[np.ndarray]:
        """The draft tokens each row accepted along its node path: int64[n_i] per row."""
        return [t.tokens[np.asarray(p[1:], dtype=np.int64)] for t, p in zip(self.trees, paths)]

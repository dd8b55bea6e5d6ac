"""Which draft nodes to verify this step: the cost-aware draft tree.

Candidates are the drafter's paths (the lattice's p best, head drafts) and, optionally, the
context n-gram continuations. They are merged into one token trie under the root. Each node
gets an acceptance probability ``P(node) = P(parent) * rate(token)`` (``acceptance.py``); a
node proposed by several sources keeps the highest. The expected number of tokens a step emits
is ``1 + sum(P)`` over the verified nodes (the bonus token plus every node on the greedy path),
so with the measured step cost ``T(n)`` over n tree nodes (root included, ``cost_model.py``)
the ``auto`` policy verifies the n - 1 most probable nodes (an ancestor-closed set, since P
never grows along a path) for the n that maximises

    (1 + sum of the n - 1 largest P) / (T(n) + overhead)

-- expected tokens per second, the dynamic-tree idea of SpecInfer / Sequoia / EAGLE-2 applied to
the rescored lattice. ``overhead`` is the per-step time that does not grow with n: outside the
verify call (drafting, bookkeeping) and the extra heads inside it, measured by the decode loop
as it runs. In a batched step the rows'
trees are padded to the largest, so one n serves every row (``plan_rows``). The ``fixed`` policy verifies
every candidate path, as given.

    >>> plan = TreePlanner("fixed").plan([Proposal(np.array([[4, 5]]))])
    >>> plan.drafts.tolist(), plan.nodes
    ([[4, 5]], 3)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latticedraft.decoding.planning.acceptance import AcceptanceModel
from latticedraft.errors import InputError

POLICIES = ("auto", "fixed")


@dataclass
class Plan:
    """drafts: int64[p, d] the paths to verify (-1 pads); nodes: tree size with the root;
    expected: the predicted tokens this step emits (1 + sum of P; None for ``fixed``)."""

    drafts: np.ndarray
    nodes: int
    expected: float | None = None


class TreePlanner:
    """policy: "auto" | "fixed"; acceptance and cost: the calibrated rates the proposers rate
    their paths with and the measured ``CostModel`` (``auto`` needs the cost model; acceptance
    defaults to the uncalibrated prior); max_nodes caps the tree (root included)."""

    def __init__(self, policy: str = "auto", acceptance: AcceptanceModel | None = None, cost=None,
                 max_nodes: int = 64):
        if policy not in POLICIES:
            raise InputError(f"--tree {policy!r} is not one of {', '.join(POLICIES)}")
        if policy == "auto" and cost is None:
            raise InputError("--tree auto needs a measured cost model (CostModel.cached(verifier))")
        if max_nodes < 1:
            raise InputError(f"max_nodes must be >= 1, got {max_nodes}")
        self.policy = policy
        self.acceptance = acceptance or AcceptanceModel.prior()
        self.cost, self.max_nodes = cost, max_nodes
        if cost is not None:
            n = np.arange(1, max_nodes + 1)
            self._T = np.asarray(cost.seconds(n), dtype=np.float64)  # _T[n - 1] = T(n)
        self.overhead = 0.0

    def plan(self, proposals: list, room: int | None = None) -> Plan:
        """The paths to verify after the root, at most ``room`` tokens deep, from one step's
        ``Proposal`` s of one row (their order breaks ties). ``auto`` needs each proposal's
        ``rates`` (its proposer fills them when the step carries an acceptance model)."""
        return self.plan_rows([proposals], [room])[0]

    def plan_rows(self, proposals: list[list], rooms: list) -> list[Plan]:
        """``plan`` for the rows of one batched step. The rows' trees are padded to the largest,
        so ``auto`` picks one tree size n for all (the cost model's ``T(n)`` is the step over
        every row at n nodes): the n maximising (sum over rows of 1 + the n - 1 largest P of the
        row) / (T(n) + overhead); every row then verifies its n - 1 most probable nodes (fewer
        only where it has fewer)."""
        tries = [self._trie(props, room) for props, room in zip(proposals, rooms)]
        if self.policy == "fixed":
            return [_as_plan([t for t, _ in cands], None) for cands in tries]
        tries = [_nodes(cands) for cands in tries]
        most = max((len(P) for _, _, P in tries), default=0)
        total = np.zeros(min(most, self.max_nodes - 1) + 1)  # total[m]: every row with m drafted nodes
        gains = []
        for _, _, P in tries:
            g = 1.0 + np.concatenate([[0.0], np.cumsum(np.sort(P)[::-1])])[: len(total)]
            gains.append(g)
            total += np.concatenate([g, np.full(len(total) - len(g), g[-1])])
        sizes = np.arange(1, len(total) + 1)
        m = int(np.argmax(total / (self._T[sizes - 1] + self.overhead)))
        return [_top_paths(parent, token, P, m, float(g[min(m, len(g) - 1)]))
                for (parent, token, P), g in zip(tries, gains)]

    def _trie(self, proposals: list, room) -> list:
        """The candidate paths of one row: [(tokens int64[d], rates float64[d] or None)]."""
        cands = []
        for prop in proposals:
            for r, row in enumerate(np.atleast_2d(prop.tokens)):
                neg = np.flatnonzero(row < 0)
                d = neg[0] if len(neg) else len(row)  # a negative token ends a path
                d = d if room is None else min(d, room)
                rates = None if prop.rates is None else np.asarray(prop.rates[r, :d], dtype=np.float64)
                if self.policy == "auto" and rates is None:
                    rates = np.full(d, 0.5)  # an unrated source: the uncalibrated prior of a context token
                cands.append((row[:d], rates))
        return cands


def _nodes(cands: list) -> tuple[list, list, np.ndarray]:
    """The trie over candidate paths: (parent, token, P) per node after the root (node ids from 1;
    index 0 of parent/token is the root); a node proposed by several paths keeps the highest P."""
    key: dict[tuple[int, int], int] = {}
    parent, token, prob = [-1], [-1], [1.0]
    for toks, rates in cands:
        node, p = 0, 1.0
        for t, r in zip(toks.tolist(), rates.tolist()):
            p *= r
            nxt = key.get((node, t))
            if nxt is None:
                nxt = len(token)
                key[(node, t)] = nxt
                parent.append(node)
                token.append(t)
                prob.append(p)
            elif p > prob[nxt]:
                prob[nxt] = p
            node = nxt
    return parent, token, np.asarray(prob[1:])


def _top_paths(parent: list, token: list, P: np.ndarray, m: int, expected: float) -> Plan:
    """The plan verifying the m most probable nodes (an ancestor-closed set: P never grows along
    a path, and a stable sort keeps parents, which precede children, first on ties)."""
    if len(P) == 0:
        return Plan(np.zeros((1, 0), np.int64), 1, 1.0)
    order = np.argsort(-P, kind="stable")[:m]
    chosen = set((order + 1).tolist())
    chosen = {c for c in chosen if _closed(c, parent, chosen)}
    leaves = chosen - {parent[x] for x in chosen}
    paths = []
    for leaf in sorted(leaves):
        path, node = [], leaf
        while node > 0:
            path.append(token[node])
            node = parent[node]
        paths.append(np.asarray(path[::-1], dtype=np.int64))
    return _as_plan(paths, expected)


def _closed(node: int, parent: list, chosen: set) -> bool:
    """True when every ancestor of ``node`` is chosen (guards exact ties in P)."""
    p = parent[node]
    while p > 0:
        if p not in chosen:
            return False
        p = parent[p]
    return True


def _as_plan(paths: list, expected) -> Plan:
    paths = [p for p in paths if len(p)]
    if not paths:
        return Plan(np.zeros((1, 0), np.int64), 1, expected)
    d = max(len(p) for p in paths)
    out = np.full((len(paths), d), -1, dtype=np.int64)
    for i, p in enumerate(paths):
        out[i, : len(p)] = p
    nodes = 1 + len({tuple(p[: k + 1].tolist()) for p in paths for k in range(len(p))})
    return Plan(out, nodes, expected)

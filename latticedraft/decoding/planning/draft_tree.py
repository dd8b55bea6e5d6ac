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
the rescored lattice. ``overhead`` is the per-step time spent outside the verify call
(drafting, bookkeeping), measured by the decode loop as it runs. The ``fixed`` policy verifies
every candidate path, as given.

    >>> plan = TreePlanner("fixed").plan(None, np.array([[4, 5]]), np.array([1, 2, 3]))
    >>> plan.drafts.tolist(), plan.nodes
    ([[4, 5]], 3)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latticedraft.decoding.planning.acceptance import AcceptanceModel
from latticedraft.decoding.proposers.context import ContextNgrams
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
    """policy: "auto" | "fixed"; context: context n-gram options or None (off); acceptance and
    cost: the calibrated rates and the measured ``CostModel`` (``auto`` needs the cost model;
    acceptance defaults to the uncalibrated prior); max_nodes caps the tree (root included)."""

    def __init__(self, policy: str = "auto", context: ContextNgrams | None = None,
                 acceptance: AcceptanceModel | None = None, cost=None, max_nodes: int = 64):
        if policy not in POLICIES:
            raise InputError(f"--tree {policy!r} is not one of {', '.join(POLICIES)}")
        if policy == "auto" and cost is None:
            raise InputError("--tree auto needs a measured cost model (CostModel.cached(verifier))")
        if max_nodes < 1:
            raise InputError(f"max_nodes must be >= 1, got {max_nodes}")
        self.policy, self.context = policy, context
        self.acceptance = acceptance or AcceptanceModel.prior()
        self.cost, self.max_nodes = cost, max_nodes
        if cost is not None:
            n = np.arange(1, max_nodes + 1)
            self._T = np.asarray(cost.seconds(n), dtype=np.float64)  # _T[n - 1] = T(n)
        self.overhead = 0.0

    def candidates(self, sausage, drafts: np.ndarray, history: np.ndarray, extra: list | None = None,
                   found: list | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """(tokens int64[d], conditional acceptance rates float[d]) per candidate path. extra:
        more paths after the root (lookahead's pool n-grams: int64[d] each), rated as context
        n-grams that matched one token (the root). found: ``self.context.candidates(history)``
        where the caller has searched already (None: searched here)."""
        out = []
        acc, rated = self.acceptance, self.policy == "auto"
        if drafts is not None and drafts.size:
            rates = None
            if rated:
                rates = acc.head_rates(_draft_probs(sausage, drafts)) if sausage is not None else np.full(drafts.shape, 0.5)
            for r, row in enumerate(drafts):
                neg = np.flatnonzero(row < 0)
                d = neg[0] if len(neg) else len(row)  # a negative token ends a draft
                out.append((row[:d], None if rates is None else rates[r, :d]))
        if self.context is not None:
            for c in self.context.candidates(history) if found is None else found:
                rates = acc.context_rates(c.match, len(c.tokens)) if rated else None
                out.append((c.tokens, rates))
        for t in extra or []:
            out.append((t, acc.context_rates(1, len(t)) if rated else None))
        return out

    def plan(self, sausage, drafts: np.ndarray, history: np.ndarray, room: int | None = None,
             extra: list | None = None, found: list | None = None) -> Plan:
        """The paths to verify after the root (the last token of ``history``), at most ``room``
        tokens deep. drafts: int64[p, d] from the drafter (may be empty); extra, found: see
        ``candidates``."""
        drafts = np.zeros((1, 0), np.int64) if drafts is None else np.atleast_2d(np.asarray(drafts, dtype=np.int64))
        cands = self.candidates(sausage, drafts, history, extra, found)
        if room is not None:
            cands = [(t[:room], None if r is None else r[:room]) for t, r in cands]
        if self.policy == "fixed":
            return _as_plan([t for t, _ in cands], None)
        # trie over all candidates: node id -> (parent, token, P); children keyed (parent, token)
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
        P = np.asarray(prob[1:])
        if len(P) == 0:
            return Plan(np.zeros((1, 0), np.int64), 1, 1.0)
        # parents precede children in the node order; a stable sort by -P keeps them first on ties
        order = np.argsort(-P, kind="stable")[: self.max_nodes - 1]
        gain = 1.0 + np.concatenate([[0.0], np.cumsum(P[order])])  # gain[m]: m drafted nodes
        sizes = np.arange(1, len(gain) + 1)
        rate = gain / (self._T[sizes - 1] + self.overhead)
        m = int(np.argmax(rate))
        chosen = set((order[:m] + 1).tolist())
        chosen = {c for c in chosen if _closed(c, parent, chosen)}
        leaves = chosen - {parent[x] for x in chosen}
        paths = []
        for leaf in sorted(leaves):
            path, node = [], leaf
            while node > 0:
                path.append(token[node])
                node = parent[node]
            paths.append(np.asarray(path[::-1], dtype=np.int64))
        return _as_plan(paths, float(gain[m]))


def _closed(node: int, parent: list, chosen: set) -> bool:
    """True when every ancestor of ``node`` is chosen (guards exact ties in P)."""
    p = parent[node]
    while p > 0:
        if p not in chosen:
            return False
        p = parent[p]
    return True


def _draft_probs(sausage, drafts: np.ndarray) -> np.ndarray:
    """The head probability of every draft token: float[p, d] (0 where the slot lacks it)."""
    p, d = drafts.shape
    out = np.zeros((p, d))
    for j in range(min(d, sausage.h)):
        hit = sausage.tokens[j][None, :] == drafts[:, j : j + 1]  # [p, k]
        out[:, j] = np.where(hit, np.exp(sausage.logp[j].astype(np.float64))[None, :], 0.0).max(axis=1)
    return out


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

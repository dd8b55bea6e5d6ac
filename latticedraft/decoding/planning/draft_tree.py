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
as it runs. In a batched step the rows' trees are padded to the largest, so one n serves every
row (``plan_rows``). The rates count earlier greedy steps (``acceptance.py``); a ``RateCorrection``
rescales each source's rates by what verification has kept of them so far in the run
(``observe``), so a tree planned under sampling, or on text unlike what was counted, is sized for
the acceptance that actually comes; T(n) follows the run's own verify calls (``observe_cost``). The ``fixed`` policy verifies every candidate
path, as given.

    >>> plan = TreePlanner("fixed").plan([Proposal(np.array([[4, 5]]))])
    >>> plan.drafts.tolist(), plan.nodes
    ([[4, 5]], 3)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latticedraft.decoding.planning.acceptance import AcceptanceModel, RateCorrection
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
    defaults to the uncalibrated prior); max_nodes caps the tree (root included); correction: a
    ``RateCorrection`` the auto tree corrects every rate with and teaches from what each step
    kept (``observe``; None: the rates as given)."""

    def __init__(self, policy: str = "auto", acceptance: AcceptanceModel | None = None, cost=None,
                 max_nodes: int = 64, correction: RateCorrection | None = None):
        if policy not in POLICIES:
            raise InputError(f"--tree {policy!r} is not one of {', '.join(POLICIES)}")
        if policy == "auto" and cost is None:
            raise InputError("--tree auto needs a measured cost model (CostModel.cached(verifier))")
        if max_nodes < 1:
            raise InputError(f"max_nodes must be >= 1, got {max_nodes}")
        from latticedraft.gpu.verify.cost_model import StepCosts

        self.policy = policy
        self.acceptance = acceptance or AcceptanceModel.prior()
        self.cost, self.max_nodes = cost, max_nodes
        if cost is not None:  # a StepCosts is shared (refined across decode calls); a CostModel, tabled here
            self.costs = cost if isinstance(cost, StepCosts) else StepCosts(cost, max_nodes)
            self._T = self.costs.T[:max_nodes]  # _T[n - 1] = T(n) (a view: refinements reach the shared curve)
        self.overhead = 0.0
        self.correction = correction
        self._chosen: list = []  # with a correction, per row of the last auto plan: (parent, token, raw, chosen ids)

    def observe_cost(self, n: int, seconds: float) -> None:
        """A verify call over ``n`` nodes per row took ``seconds`` (heads left out): T(n) follows it
        (``StepCosts.observe``; nothing without a cost model)."""
        if self.cost is not None:
            self.costs.observe(min(n, len(self._T)), seconds)

    def step_seconds(self, n):
        """Predicted seconds of a step verifying n nodes per row (root included): T(n) and the
        measured per-step overhead (``auto`` only); n an int (a float back) or int[m] (float[m])."""
        t = self._T[np.clip(np.asarray(n, dtype=np.int64), 1, self.max_nodes) - 1] + self.overhead
        return float(t) if t.ndim == 0 else t

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
            return [_as_plan([t for t, _, _ in cands], None) for cands in tries]
        correct = None if self.correction is None else self.correction.corrected
        tries = [_nodes(cands, correct) for cands in tries]
        most = max((len(P) for _, _, P, _ in tries), default=0)
        total = np.zeros(min(most, self.max_nodes - 1) + 1)  # total[m]: every row with m drafted nodes
        gains = []
        for _, _, P, _ in tries:
            g = 1.0 + np.concatenate([[0.0], np.cumsum(np.sort(P)[::-1])])[: len(total)]
            gains.append(g)
            total += np.concatenate([g, np.full(len(total) - len(g), g[-1])])
        m = best_size(total, self._T[: len(total)] + self.overhead)
        plans = []
        self._chosen = []
        for (parent, token, P, raw), g in zip(tries, gains):
            plan, chosen = _top_paths(parent, token, P, m, float(g[min(m, len(g) - 1)]))
            plans.append(plan)
            if self.correction is not None:  # what observe counts
                self._chosen.append((parent, token, raw, chosen))
        return plans

    def observe(self, accepted: list) -> None:
        """Teach the correction what the last ``plan_rows`` kept: accepted[j], the draft tokens row
        j accepted (int[n_j]). Counted: every verified node whose parent was kept (the root or an
        accepted node), kept when it is the next accepted token."""
        if not self._chosen:
            return
        rates, kept, sources = [], [], []
        for (parent, token, raw, chosen), acc in zip(self._chosen, accepted):
            child = {(parent[c], token[c]): c for c in chosen}
            path, node = {0}, 0  # the kept nodes, root included
            for t in np.asarray(acc).tolist():
                node = child.get((node, int(t)))
                if node is None:
                    break  # (a token from outside this plan: a side branch's)
                path.add(node)
            for c in chosen:
                if parent[c] in path:
                    rates.append(raw[c][0])
                    sources.append(raw[c][1])
                    kept.append(c in path)
        self._chosen = []
        if rates:
            self.correction.observe(np.asarray(rates), np.asarray(kept), np.asarray(sources))

    def _trie(self, proposals: list, room) -> list:
        """The candidate paths of one row: [(tokens int64[d], rates float64[d] or None, source: the
        position of the path's proposal in ``proposals``)]."""
        cands = []
        for source, prop in enumerate(proposals):
            for r, row in enumerate(np.atleast_2d(prop.tokens)):
                neg = np.flatnonzero(row < 0)
                d = neg[0] if len(neg) else len(row)  # a negative token ends a path
                d = d if room is None else min(d, room)
                rates = None if prop.rates is None else np.asarray(prop.rates[r, :d], dtype=np.float64)
                if self.policy == "auto" and rates is None:
                    rates = np.full(d, 0.5)  # an unrated source: the uncalibrated prior of a context token
                cands.append((row[:d], rates, source))
        return cands


def best_size(gain: np.ndarray, seconds: np.ndarray) -> int:
    """The m of most expected tokens per second: gain[m] (1 + the m largest P, summed over rows)
    over seconds[m] (the step verifying m nodes besides the root), float[M + 1] each."""
    return int(np.argmax(gain / seconds))


def _nodes(cands: list, correct=None) -> tuple[list, list, np.ndarray, list]:
    """The trie over candidate paths: (parent, token, P, raw) per node after the root (node ids
    from 1; index 0 of parent/token/raw is the root); P multiplies the rates along the path,
    each corrected by ``correct(rates, source)`` (None: as given); a node proposed by several
    paths keeps the highest P, and raw is that path's (uncorrected rate of its token, source)."""
    key: dict[tuple[int, int], int] = {}
    parent, token, prob, raw = [-1], [-1], [1.0], [(1.0, 0)]
    for toks, rates, source in cands:
        node, p = 0, 1.0
        fixed = rates if correct is None else correct(rates, source)
        for t, r, r0 in zip(toks.tolist(), fixed.tolist(), rates.tolist()):
            p *= r
            nxt = key.get((node, t))
            if nxt is None:
                nxt = len(token)
                key[(node, t)] = nxt
                parent.append(node)
                token.append(t)
                prob.append(p)
                raw.append((r0, source))
            elif p > prob[nxt]:
                prob[nxt], raw[nxt] = p, (r0, source)
            node = nxt
    return parent, token, np.asarray(prob[1:]), raw


def _top_paths(parent: list, token: list, P: np.ndarray, m: int, expected: float) -> tuple[Plan, set]:
    """The plan verifying the m most probable nodes (an ancestor-closed set: P never grows along
    a path, and a stable sort keeps parents, which precede children, first on ties), and the
    ids of those nodes."""
    if len(P) == 0:
        return Plan(np.zeros((1, 0), np.int64), 1, 1.0), set()
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
    return _as_plan(paths, expected), chosen


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

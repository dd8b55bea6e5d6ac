"""How likely a draft token is to be accepted: calibrated from the drafters' own probabilities.

A draft tree's expected gain is the sum, over its nodes, of the probability that the node lies
on the target's greedy path. A node's probability is its parent's times the conditional
acceptance rate of its token, which is read from tables fitted on held-out greedy decodes:

- ``head_rate[j, b]``: for the draft-tree nodes at slot j whose token's head probability falls in
  bin b (``HEAD_EDGES``), how often the token equals the greedy token at that place, counted
  where the node's parent is the greedy prefix (the conditional the tree's chain rule
  multiplies: the drafted paths of the calibration decode give the nodes; without them, every
  candidate of slot j where the greedy tokens of slots < j are in the lattice, which
  underestimates deep nodes: a path whose tokens were right so far is right more often next);
- ``ctx_rate[n, d]``: for context n-gram continuations (``context_ngrams``) from a suffix match
  of n tokens, how often token d equals the greedy token given tokens < d did;
- ``lm_rate[d, b]``: for the n-gram LM's greedy continuation (``lm_drafts``), how often token d
  whose LM probability falls in bin b equals the greedy token given tokens < d did.

Counts are smoothed towards a prior (``PRIOR_WEIGHT`` pseudo-observations of the bin's mean
probability), so empty bins fall back to the raw head probability. ``AcceptanceModel.prior()``
is the table before any data: raw head and LM probabilities and a flat 0.5 for context tokens.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from latticedraft.atomic import write_atomic
from latticedraft.decoding.proposers.context import ContextNgrams
from latticedraft.paths import cache_dir

HEAD_EDGES = np.array([0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0 + 1e-6])
PRIOR_WEIGHT = 4.0
CTX_PRIOR = 0.5
FORMAT = 3  # 2: the head table counts tree nodes whose parent is the greedy prefix; 3: lm_rate


def head_bins(probs):
    """The ``HEAD_EDGES`` bin of each head probability (an int array shaped like ``probs``)."""
    return np.clip(np.searchsorted(HEAD_EDGES, probs, side="right") - 1, 0, len(HEAD_EDGES) - 2)


@dataclass
class AcceptanceModel:
    """head_rate: float[slots, bins]; ctx_rate: float[max_match + 1, depth]; lm_rate: float[depth,
    bins]; counts: how many observations went into each table (for the report)."""

    head_rate: np.ndarray
    ctx_rate: np.ndarray
    counts: dict
    lm_rate: np.ndarray

    @classmethod
    def prior(cls, slots: int = 16, max_match: int = 8, depth: int = 16) -> "AcceptanceModel":
        return cls(np.tile(_bin_mid(), (slots, 1)), np.full((max_match + 1, depth), CTX_PRIOR),
                   {"head": 0, "ctx": 0, "lm": 0}, np.tile(_bin_mid(), (depth, 1)))

    def head(self, slot: int, prob: float) -> float:
        """Conditional acceptance rate of a slot-``slot`` candidate with head probability ``prob``."""
        j = min(slot, self.head_rate.shape[0] - 1)
        return float(self.head_rate[j, int(head_bins(prob))])

    def head_rates(self, probs: np.ndarray) -> np.ndarray:
        """``head`` for a whole draft matrix: probs float[p, d] (slot = column) -> float[p, d]."""
        bins = head_bins(probs)
        slots = np.minimum(np.arange(probs.shape[1]), self.head_rate.shape[0] - 1)
        return self.head_rate[slots[None, :], bins]

    def context(self, match: int, depth: int) -> float:
        """Conditional acceptance rate of token ``depth`` of a continuation from an n = ``match`` suffix."""
        return float(self.context_rates(match, depth + 1)[depth])

    def context_rates(self, match: int, length: int) -> np.ndarray:
        """``context(match, d)`` for d = 0 .. length - 1: float[length]."""
        n = min(match, self.ctx_rate.shape[0] - 1)
        return self.ctx_rate[n, np.minimum(np.arange(length), self.ctx_rate.shape[1] - 1)]

    def lm_rates(self, probs: np.ndarray) -> np.ndarray:
        """Conditional acceptance rates of an LM continuation whose tokens have LM probabilities
        ``probs`` float[d] (depth = index): float[d]."""
        depth = np.minimum(np.arange(len(probs)), self.lm_rate.shape[0] - 1)
        return self.lm_rate[depth, head_bins(np.asarray(probs, dtype=np.float64))]

    def to_json(self) -> dict:
        return {"format": FORMAT, "head_edges": HEAD_EDGES.tolist(), "head_rate": self.head_rate.round(5).tolist(),
                "ctx_rate": self.ctx_rate.round(5).tolist(), "lm_rate": self.lm_rate.round(5).tolist(),
                "counts": self.counts}

    @classmethod
    def from_json(cls, d: dict) -> "AcceptanceModel":
        return cls(np.asarray(d["head_rate"], float), np.asarray(d["ctx_rate"], float), dict(d.get("counts", {})),
                   np.asarray(d["lm_rate"], float))


def _bin_mid() -> np.ndarray:
    """The middle probability of each ``HEAD_EDGES`` bin (the prior of a raw probability)."""
    return 0.5 * (HEAD_EDGES[:-1] + np.minimum(HEAD_EDGES[1:], 1.0))


def fit(lattices: list, greedy: list, histories: list, context: ContextNgrams | None,
        max_match: int = 8, depth: int = 16, drafts: list | None = None, lm=None) -> AcceptanceModel:
    """Fit the tables from decode steps on held-out data.

    lattices[i]: the Sausage the heads gave at step i (slot j = token j + 1 after the root; None
    for a step without head drafts, which then feeds the context table only);
    greedy[i]: int64[>= h], the greedy tokens that followed the root; histories[i]: int64[t],
    the text up to and including the root (for the context n-grams); drafts[i]: int64[p, d],
    the paths drafted from that lattice (-1 pads), whose tree nodes the head table counts;
    lm(history) -> (tokens int64[d], probs float[d]): the n-gram LM's continuation (None: the
    LM table keeps its prior).
    """
    prior = AcceptanceModel.prior(max([s.h for s in lattices if s is not None], default=1), max_match, depth)
    nb = len(HEAD_EDGES) - 1
    hit = np.zeros((prior.head_rate.shape[0], nb))
    seen = np.zeros_like(hit)
    c_hit = np.zeros((max_match + 1, depth))
    c_seen = np.zeros_like(c_hit)
    l_hit = np.zeros((depth, nb))
    l_seen = np.zeros_like(l_hit)
    for i, (s, g, hist) in enumerate(zip(lattices, greedy, histories)):
        g = np.asarray(g, dtype=np.int64)
        if s is not None and drafts is not None:
            _count_tree(s, g, drafts[i], hit, seen)
        for j in range(min(s.h, len(g)) if s is not None and drafts is None else 0):
            live = s.tokens[j] >= 0
            probs = np.exp(s.logp[j][live].astype(np.float64))
            bins = head_bins(probs)
            np.add.at(seen[j], bins, 1)
            np.add.at(hit[j], bins, s.tokens[j][live] == g[j])
            if g[j] not in s.tokens[j]:
                break  # no node of a deeper slot can follow the greedy path
        if lm is not None:
            toks, probs = lm(hist)
            for d, (tok, b) in enumerate(zip(toks[: min(depth, len(g))].tolist(), head_bins(probs).tolist())):
                l_seen[d, b] += 1
                if tok != g[d]:
                    break
                l_hit[d, b] += 1
        if context is None:
            continue
        for cand in context.candidates(hist):
            n = min(cand.match, max_match)
            for d, tok in enumerate(cand.tokens[: min(depth, len(g))].tolist()):
                c_seen[n, d] += 1
                if tok != g[d]:
                    break
                c_hit[n, d] += 1
    head = (hit + PRIOR_WEIGHT * prior.head_rate) / (seen + PRIOR_WEIGHT)
    ctx = (c_hit + PRIOR_WEIGHT * prior.ctx_rate) / (c_seen + PRIOR_WEIGHT)
    lm_rate = (l_hit + PRIOR_WEIGHT * prior.lm_rate) / (l_seen + PRIOR_WEIGHT)
    return AcceptanceModel(head, ctx, {"head": int(seen.sum()), "ctx": int(c_seen.sum()), "lm": int(l_seen.sum()),
                                       "steps": len(lattices)}, lm_rate)


def _count_tree(s, g: np.ndarray, drafts: np.ndarray, hit: np.ndarray, seen: np.ndarray) -> None:
    """Add one step's tree to the head table: every node (a distinct prefix of the drafted paths)
    at slot j whose parent is the greedy prefix g[:j] is seen in the bin of its token's head
    probability, and hit when its token is g[j]."""
    nodes = set()
    for row in np.atleast_2d(np.asarray(drafts, dtype=np.int64)):
        d = int(np.argmax(row < 0)) if (row < 0).any() else len(row)
        for j in range(min(d, s.h, len(g), seen.shape[0])):
            nodes.add(tuple(row[: j + 1].tolist()))
    for node in nodes:
        j = len(node) - 1
        if list(node[:j]) != g[:j].tolist():
            continue  # its parent is not on the greedy path: the node is never reached
        at = np.flatnonzero(s.tokens[j] == node[j])
        if not len(at):
            continue  # a token from outside the lattice (another source): no head probability
        b = int(head_bins(np.exp(float(s.logp[j][at[0]]))))
        seen[j, b] += 1
        hit[j, b] += node[j] == g[j]


class RateCorrection:
    """The fitted rates corrected online by what verification kept, per draft source.

    The tables above are fitted once, on held-out greedy decodes. Where a run differs from that
    data -- lossless sampling, where a draft token is kept only when it is the target's argmax
    under the run's Gumbel noise, which a greedy-fitted rate overestimates; chat where the
    calibration prompts were code -- the planner's trees are sized for acceptance that does not
    come. Per source s (the position of its proposal in a step's list: the drafter, context
    n-grams, the LM...; each rated from its own table, each off in its own way) and
    ``HEAD_EDGES`` bin b of the predicted rate r, this keeps ``kept[s, b]`` (tokens verification
    kept) and ``expected[s, b]`` (the sum of r over the nodes tried), counted over verified nodes
    whose parent was kept, both smoothed by ``PRIOR_WEIGHT`` pseudo-observations at the bin's
    middle (ratio 1 before any data): ``corrected(r) = min(r * kept / expected, 1)``. Counts decay
    towards the prior by ``decay`` per step, so the correction follows the text."""

    def __init__(self, decay: float = 0.99, sources: int = 8):
        self.prior = np.tile(PRIOR_WEIGHT * _bin_mid(), (sources, 1))
        self.decay = float(decay)
        self.kept, self.expected = self.prior.copy(), self.prior.copy()

    def corrected(self, rates, source: int = 0) -> np.ndarray:
        """The corrected rates of source ``source``'s predicted rates ``rates`` float[d]: float[d]
        in [0, 1]."""
        r = np.asarray(rates, dtype=np.float64)
        s, b = min(source, len(self.prior) - 1), head_bins(r)
        return np.minimum(r * self.kept[s, b] / self.expected[s, b], 1.0)

    def observe(self, rates: np.ndarray, kept: np.ndarray, sources: np.ndarray | None = None) -> None:
        """One step's verified nodes whose parent was kept: their predicted (uncorrected) rates
        float[n], whether each was kept bool[n], and their sources int[n] (None: all 0)."""
        self.kept = self.decay * self.kept + (1 - self.decay) * self.prior
        self.expected = self.decay * self.expected + (1 - self.decay) * self.prior
        r = np.asarray(rates, dtype=np.float64)
        s = np.zeros(len(r), dtype=np.int64) if sources is None else np.minimum(sources, len(self.prior) - 1)
        b = head_bins(r)
        np.add.at(self.expected, (s, b), r)
        np.add.at(self.kept, (s, b), np.asarray(kept, dtype=np.float64))


def cached(key_parts: dict, build) -> AcceptanceModel:
    """The model stored under a hash of ``key_parts`` in ``cache_dir()/acceptance``, else
    ``build()`` (then stored)."""
    key = hashlib.sha256(json.dumps(key_parts, sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = cache_dir() / "acceptance" / f"{key}.json"
    if path.is_file():
        try:
            d = json.loads(path.read_text())
            if d.get("format") == FORMAT:
                return AcceptanceModel.from_json(d)
        except (OSError, ValueError, KeyError):
            pass  # a damaged entry is fitted again
    model = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({**model.to_json(), "key": key_parts}, indent=1, default=str) + "\n")
    return model

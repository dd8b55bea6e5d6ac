"""How likely a draft token is to be accepted: learned from the session's own decode steps.

A draft tree's expected gain is the sum, over its nodes, of the probability that the node lies
on the target's greedy path. A node's probability is its parent's times the conditional
acceptance rate of its token, which is read from tables of counts over greedy decode steps:

- the heads' table, per slot j and ``HEAD_EDGES`` bin b of a token's head probability: of the
  draft-tree nodes at slot j in bin b whose parent is the greedy prefix (the conditional the
  tree's chain rule multiplies), how many were the greedy token;
- one table per draft source whose rates are counted (``decoding/sources.py``, ``rates="fitted"``),
  per bin b and depth d: of token d of the source's paths in bin b, given tokens < d were right,
  how many were right. A source's bins are its ``DraftSource.bins``: "match" (the suffix match a
  copied continuation came from, 0 .. ``MAX_MATCH``: context n-grams) or "probability" (the
  ``HEAD_EDGES`` bin of the source's own probability for the token: the n-gram LM's).

A rate is the hits smoothed towards a prior by ``PRIOR_WEIGHT`` pseudo-observations: the bin's
middle probability (a raw head or LM probability), a flat ``CTX_PRIOR`` for matches. No decode
runs to fit them: an ``AcceptanceModel`` starts empty (the priors), counts the steps a session
decodes greedily (``counted``: their lattices, paths and what the target chose after each root)
and is stored per model, dtype and settings under ``.cache/acceptance`` (``load`` / ``store``),
where the next session's counts add to it. The planner's ``RateCorrection`` (below) corrects
the rates online meanwhile.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

from latticedraft import learned_state

HEAD_EDGES = np.array([0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0 + 1e-6])
PRIOR_WEIGHT = 4.0
CTX_PRIOR = 0.5
MAX_MATCH = 8  # the longest suffix match a "match" table tells apart
DEPTH = 16  # the deepest token a source table tells apart
SLOTS = 16  # the deepest head slot the heads' table tells apart
FORMAT = 5  # 4: tables per source; 5: counts, added to by every session


def head_bins(probs):
    """The ``HEAD_EDGES`` bin of each head probability (an int array shaped like ``probs``)."""
    return np.clip(np.searchsorted(HEAD_EDGES, probs, side="right") - 1, 0, len(HEAD_EDGES) - 2)


def prior_table(bins: str, depth: int = DEPTH) -> np.ndarray:
    """The rates of a source table before any data: float[bins, depth] (``DraftSource.bins``)."""
    if bins == "match":
        return np.full((MAX_MATCH + 1, depth), CTX_PRIOR)
    return np.tile(_bin_mid()[:, None], (1, depth))


def _zeros(bins: str) -> np.ndarray:
    return np.zeros_like(prior_table(bins))


@dataclass
class AcceptanceModel:
    """Counts: head_hit, head_seen float[SLOTS, bins]; tables: source name -> (bins kind, hit
    float[bins, depth], seen float[bins, depth]). The rates they give are smoothed towards the
    priors (a source without counts reads as its prior)."""

    head_hit: np.ndarray = field(default_factory=lambda: np.zeros((SLOTS, len(HEAD_EDGES) - 1)))
    head_seen: np.ndarray = field(default_factory=lambda: np.zeros((SLOTS, len(HEAD_EDGES) - 1)))
    tables: dict = field(default_factory=dict)

    @classmethod
    def prior(cls) -> "AcceptanceModel":
        return cls()

    @property
    def head_rate(self) -> np.ndarray:
        """float[SLOTS, bins]: the heads' smoothed rates."""
        return (self.head_hit + PRIOR_WEIGHT * _bin_mid()[None]) / (self.head_seen + PRIOR_WEIGHT)

    @property
    def counts(self) -> dict:
        """How many observations went into each table (for reports)."""
        return {"head": int(self.head_seen.sum()), **{k: int(v[2].sum()) for k, v in self.tables.items()}}

    def head(self, slot: int, prob: float) -> float:
        """Conditional acceptance rate of a slot-``slot`` candidate with head probability ``prob``."""
        return float(self.head_rate[min(slot, SLOTS - 1), int(head_bins(prob))])

    def head_rates(self, probs: np.ndarray) -> np.ndarray:
        """``head`` for a whole draft matrix: probs float[p, d] (slot = column) -> float[p, d]."""
        slots = np.minimum(np.arange(probs.shape[1]), SLOTS - 1)
        return self.head_rate[slots[None, :], head_bins(probs)]

    def table(self, name: str) -> np.ndarray:
        """Source ``name``'s rates, float[bins, depth] (its prior where nothing was counted)."""
        kind, hit, seen = self._counts(name)
        return (hit + PRIOR_WEIGHT * prior_table(kind)) / (seen + PRIOR_WEIGHT)

    def _counts(self, name: str, bins: str | None = None) -> tuple:
        if name not in self.tables:
            if bins is None:
                from latticedraft.decoding.sources import by_name

                bins = by_name(name).bins
            self.tables[name] = (bins, _zeros(bins), _zeros(bins))
        return self.tables[name]

    def rates(self, name: str, bins) -> np.ndarray:
        """Conditional acceptance rates float[d] of a path of source ``name`` whose token t (depth
        t after the root) lies in bin ``bins[t]`` (int[d])."""
        t = self.table(name)
        b = np.minimum(np.asarray(bins, dtype=np.int64), t.shape[0] - 1)
        return t[b, np.minimum(np.arange(len(b)), t.shape[1] - 1)]

    def add(self, other: "AcceptanceModel") -> "AcceptanceModel":
        """These counts and ``other``'s together (a new model)."""
        out = AcceptanceModel(self.head_hit + other.head_hit, self.head_seen + other.head_seen, dict(self.tables))
        for name, (kind, hit, seen) in other.tables.items():
            _, h0, s0 = out._counts(name, kind)
            out.tables[name] = (kind, h0 + hit, s0 + seen)
        return out

    def to_json(self) -> dict:
        return {"format": FORMAT, "head_edges": HEAD_EDGES.tolist(), "head_hit": self.head_hit.tolist(),
                "head_seen": self.head_seen.tolist(),
                "tables": {k: {"bins": b, "hit": h.tolist(), "seen": n.tolist()} for k, (b, h, n) in self.tables.items()}}

    @classmethod
    def from_json(cls, d: dict) -> "AcceptanceModel":
        return cls(np.asarray(d["head_hit"], float), np.asarray(d["head_seen"], float),
                   {k: (v["bins"], np.asarray(v["hit"], float), np.asarray(v["seen"], float))
                    for k, v in d["tables"].items()})


def _bin_mid() -> np.ndarray:
    """The middle probability of each ``HEAD_EDGES`` bin (the prior of a raw probability)."""
    return 0.5 * (HEAD_EDGES[:-1] + np.minimum(HEAD_EDGES[1:], 1.0))


def fit(lattices: list, greedy: list, histories: list, drafts: list | None = None,
        paths: dict | None = None) -> AcceptanceModel:
    """The counts of decode steps.

    lattices[i]: the Sausage the heads gave at step i (slot j = token j + 1 after the root; None
    for a step without head drafts, which then feeds the source tables only); greedy[i]:
    int64[>= h], the greedy tokens that followed the root; histories[i]: int64[t], the text up to
    and including the root; drafts[i]: int64[p, d], the paths drafted from that lattice (-1 pads),
    whose tree nodes the head table counts; paths: source name -> (paths(history) -> [(tokens
    int64[d], bins int64[d])], its bins kind) for every source whose table is counted.
    """
    m = AcceptanceModel()
    for i, (s, g) in enumerate(zip(lattices, greedy)):
        if s is not None:
            _count_heads(s, np.asarray(g, dtype=np.int64), None if drafts is None else drafts[i], m.head_hit,
                         m.head_seen)
    for name, (source_paths, bins) in (paths or {}).items():
        _, hit, seen = m._counts(name, bins)
        for g, hist in zip(greedy, histories):
            for toks, b in source_paths(hist):
                _count_path(np.asarray(toks), np.minimum(b, hit.shape[0] - 1), np.asarray(g, dtype=np.int64), hit,
                            seen)
    return m


def _count_heads(s, g: np.ndarray, drafts, hit: np.ndarray, seen: np.ndarray) -> None:
    """Add one step's lattice to the head table: its drafted tree's nodes (``_count_tree``), or
    without drafts every candidate of slot j where the greedy tokens of slots < j are in it."""
    if drafts is not None:
        _count_tree(s, g, drafts, hit, seen)
        return
    for j in range(min(s.h, len(g), SLOTS)):
        live = s.tokens[j] >= 0
        bins = head_bins(np.exp(s.logp[j][live].astype(np.float64)))
        np.add.at(seen[j], bins, 1)
        np.add.at(hit[j], bins, s.tokens[j][live] == g[j])
        if g[j] not in s.tokens[j]:
            break  # no node of a deeper slot can follow the greedy path


def _count_path(toks: np.ndarray, bins: np.ndarray, g: np.ndarray, hit: np.ndarray, seen: np.ndarray) -> None:
    """Token d of one source path is seen in its bin where tokens < d were right, hit where it is right."""
    for d in range(min(len(toks), len(g), seen.shape[1])):
        seen[bins[d], d] += 1
        if toks[d] != g[d]:
            return
        hit[bins[d], d] += 1


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
    """The rates corrected online by what verification kept, per draft source.

    The tables above count greedy steps, across sessions, and start empty. Where a run differs
    from what they counted -- a new model or settings (nothing counted yet); lossless sampling,
    where a draft token is kept only when it is the target's argmax under the run's Gumbel noise,
    which a greedy rate overestimates; text unlike the earlier sessions' -- the planner's trees
    are sized for acceptance that does not come. Per source s (the position of its proposal in a step's list: the drafter, context
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


def _schema(d) -> str | None:
    """None where ``d`` (parsed JSON) holds counts ``from_json`` reads, else why not: this
    ``FORMAT`` and ``HEAD_EDGES``, the heads' counts float[SLOTS, bins] and every table's
    float[bins, DEPTH] finite, >= 0, hits <= seen."""
    S = learned_state
    why = S.fields(d, "format", "head_edges", "head_hit", "head_seen", "tables")
    if why or d["format"] != FORMAT or d["head_edges"] != HEAD_EDGES.tolist():
        return why or "of another format"
    shape = (SLOTS, len(HEAD_EDGES) - 1)
    why = S.numbers(d["head_hit"], shape, "head_hit") or S.numbers(d["head_seen"], shape, "head_seen")
    if why or not isinstance(d["tables"], dict):
        return why or "tables is not an object"
    if (np.asarray(d["head_hit"]) > np.asarray(d["head_seen"])).any():
        return "more head hits than seen"
    for name, t in d["tables"].items():
        why = S.fields(t, "bins", "hit", "seen")
        if why or t["bins"] not in ("match", "probability"):
            return f"table {name}: {why or 'bins is not match or probability'}"
        shape = prior_table(t["bins"]).shape
        why = S.numbers(t["hit"], shape, f"table {name} hit") or S.numbers(t["seen"], shape, f"table {name} seen")
        if why or (np.asarray(t["hit"]) > np.asarray(t["seen"])).any():
            return why or f"table {name}: more hits than seen"
    return None


def _example() -> dict:
    """Counts of two greedy steps (the heads' table and a context table), as ``store`` writes them."""
    from latticedraft.lattice.sausage import Sausage

    s = Sausage(np.array([[3, 4], [5, 6]]), np.log(np.array([[0.7, 0.2], [0.6, 0.3]], dtype=np.float32)))
    m = fit([s] * 2, [np.array([3, 5])] * 2, [np.array([0])] * 2)
    m._counts("context", "match")
    return m.to_json()


KIND = learned_state.kind("acceptance", "acceptance counts", _schema, example=_example)


def _name(key_parts: dict) -> str:
    return hashlib.sha256(json.dumps(key_parts, sort_keys=True, default=str).encode()).hexdigest()[:16] + ".json"


def path_of(key_parts: dict):
    """The real path the counts of ``key_parts`` are stored at (``$LATTICEDRAFT_CACHE`` respected)."""
    return KIND.path(_name(key_parts))


def load(key_parts: dict, note=None) -> AcceptanceModel | None:
    """The counts stored under a hash of ``key_parts`` in ``cache_dir()/acceptance`` (None: none,
    or a file that fails the schema, of which ``note`` hears one line naming it)."""
    d = learned_state.read(KIND, _name(key_parts), note)
    return None if d is None else AcceptanceModel.from_json(d)


def store(key_parts: dict, model: AcceptanceModel):
    """Write ``model``'s counts under a hash of ``key_parts`` (atomically); returns the path (None
    where the cache could not be written: said once on stderr, the decode goes on)."""
    text = json.dumps({**model.to_json(), "key": key_parts}, default=str) + "\n"
    return learned_state.write(KIND, _name(key_parts), text)

"""The n-gram rescorer's weight alpha, learned from what the target keeps.

Parallel BPD drafts the p best paths of ``head_logp + alpha * lm_logp``. Whether the LM helps
depends on the model and the LM (its domain, the heads' strength: docs/rescoring.md), so a fixed
alpha can cost tokens. Any ranking of a step's lattice can be scored against the target without
another target call: the target's own path after the step's root is what the row goes on to
emit. ``kept(paths, target)`` is the longest prefix of the target equal to one of the paths.

An arm is a weight of ``GRID`` (alpha_max = ``GRID[-1]``) and the arcs per slot the LM search
ranks (``WIDTHS``: the best 4, or 0 = all k; the search's time grows with the cube of the width,
so a narrow one can pay where the whole lattice cannot); arm 0 is the heads' own ranking (alpha =
0, ``base_drafts``: the p best head paths, no LM search). At the end of each greedy lattice step
``AlphaLearner.ranked`` ranks the lattice with arm 0 and, while the probes' seconds stay under
``PROBE_SHARE`` of the lattice steps', with one other arm in turn (one that costs more than
``MAX_SHARE`` of a step only every ``REPROBE``-th probe); once the row has emitted the
lattice's depth of tokens after that root, ``observe`` scores the drafted, the probed and arm 0's
rankings against them: the paired differences in kept tokens against arm 0. (Scored against the
accepted tokens and the bonus alone, the ranking drafted with would be favoured: its tree made
what was accepted, and another's could not be credited beyond the bonus.) Under the cost-aware
tree a ranking's paths count as far as the tree ``TreePlanner`` would build from them alone would
verify them: its most probable prefixes, each token rated by its probability under the ranking's
own interpolation (``lattice.interpolated``: a token the LM moved up is rated up), at the size of
most expected tokens per second under the step's predicted seconds. Per arm it keeps decayed
sums of those differences (its gain: their mean shrunk towards 0 by ``PRIOR`` pseudo-observations)
and the median of its measured cost over arm 0 (seconds). The arm drafted with is the one of most
tokens per second, ``(tokens + gain) / (seconds + cost)`` against arm 0's ``tokens / seconds`` (a
lattice step's tokens kept and seconds, measured), among the arms whose cost is at most
``MAX_SHARE`` of a step. So where the LM does not help, or costs more time than its tokens save,
alpha backs off to 0 and the lattice is ranked by the heads alone; where it helps, alpha rises to
the weight that keeps the most.

The learner starts at 0. It only ranks drafts: verification keeps the target's own tokens
whatever the weight, so the output never changes. ``to_json`` / ``from_json`` carry it across
sessions (``.cache/rescore_weight``).

    >>> w = AlphaLearner()
    >>> w.alpha, w.width
    (0.0, 0)
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np

from latticedraft import learned_state
from latticedraft.decoding.planning.draft_tree import best_size

GRID = (0.0, 0.0625, 0.125, 0.25, 0.5, 1.0, 2.0)  # the weights tried; alpha_max = GRID[-1]
WIDTHS = (4, 0)  # arcs per slot the LM search ranks (0: all of the lattice's)
ARMS = ((0.0, 0),) + tuple((a, w) for w in WIDTHS for a in GRID[1:])  # arm 0: the heads' own ranking
PRIOR = 8.0  # pseudo-observations of no gain each arm's mean is shrunk by
DECAY = 0.995  # per observation of an arm: its sums' memory (about 200 lattice steps)
RATE = 0.02  # the step statistics' moving-average rate
COSTS = 15  # measured costs per arm its median is taken over
PROBE_SHARE = 0.01  # probes' rescoring seconds at most this share of the lattice steps' seconds
MAX_SHARE = 0.02  # an arm whose rescoring costs more than this share of a step is never drafted with
REPROBE = 8  # one probe in this many may take such an arm (its cost is measured again)
MAX_DIFF = 64  # tokens: more than any lattice's depth, so more than one step's difference
FORMAT = 2


def kept(paths: np.ndarray, target: np.ndarray, rates: np.ndarray | None = None, nodes: int | None = None,
         seconds: np.ndarray | None = None) -> int:
    """Tokens of ``target`` (int64[m]) the target would keep from ``paths`` (int64[p, d], -1 pads):
    the longest prefix of ``target`` equal to a path's. With ``rates`` (float[p, d], each token's
    conditional acceptance rate, as the cost-aware tree rates it) and ``nodes``, only the prefixes
    a tree of ``nodes`` nodes verifies count: the ``nodes`` most probable (a prefix's chance: the
    product of its rates), as ``TreePlanner`` takes them. With ``seconds`` (float[M + 1]: the step's
    predicted seconds verifying 0 .. M nodes besides the root) instead of ``nodes``, the tree is the
    size ``TreePlanner`` would choose for these paths alone (``draft_tree.best_size``): rated
    higher, a ranking earns a bigger tree."""
    paths = np.asarray(paths)
    n = min(paths.shape[1] if paths.ndim == 2 else 0, len(target))
    if n == 0 or paths.shape[0] == 0 or (nodes is not None and nodes <= 0):
        return 0
    eq = paths[:, :n] == np.asarray(target[:n])[None, :]
    if rates is not None and (nodes is not None or seconds is not None):
        live = paths >= 0
        chance = np.cumprod(np.where(live, rates, 0.0), axis=1)
        levels = np.unique(chance[live])[::-1]  # (equal chances: the same prefix, nearly always)
        if seconds is not None:
            m = min(len(levels), len(seconds) - 1)
            nodes = best_size(1.0 + np.concatenate([[0.0], np.cumsum(levels[:m])]), np.asarray(seconds[: m + 1]))
            if nodes == 0:
                return 0
        if nodes < len(levels):
            eq &= chance[:, :n] >= levels[nodes - 1]
    return int(np.cumprod(eq, axis=1).sum(axis=1).max())


class AlphaLearner:
    """n, gain: float[A] decayed counts and sums of paired kept-token differences against arm 0
    per arm of ``ARMS``; cost: float[A] the median of each arm's last measured costs over arm 0
    (seconds); tokens, seconds: moving averages of a lattice step's tokens kept (accepted + 1) and
    its seconds without rescoring; best: sums of the tokens kept from the drafted best path and
    from the heads' best path, and their count, over the steps scored (``summary``); probe_share:
    the probes' budget."""

    def __init__(self, probe_share: float = PROBE_SHARE):
        self.arms = ARMS
        self.probe_share = float(probe_share)
        self.n, self.gain, self.cost = (np.zeros(len(ARMS)) for _ in range(3))
        self.costs: dict = {}  # arm -> its last COSTS measured costs (this session's, seeded by ``cost``)
        self.tokens, self.seconds = 1.0, 0.0
        self.best = np.zeros(3)
        self.steps = 0
        self.probe_seconds = self.step_seconds = 0.0  # this session's (the probe budget)
        self.drafted_at = np.zeros(len(ARMS), dtype=np.int64)  # this session's lattice steps per arm
        self.probed = self.probes = 0  # the arm probed last (probes take the arms in turn), probes made
        self.reported = None  # the arm last reported (``decode --verbose``)
        self.scored, self.stored = 0, None  # comparisons scored this session; how many at the last store

    # -- the choice ---------------------------------------------------------------------------
    def gains(self) -> np.ndarray:
        """float[A]: each arm's mean kept-token gain over the heads' ranking, shrunk to 0."""
        return self.gain / (self.n + PRIOR)

    def affordable(self) -> np.ndarray:
        """bool[A]: the arms whose measured cost is at most ``MAX_SHARE`` of a step (unmeasured: yes)."""
        return (self.cost <= MAX_SHARE * self.seconds) | (self.cost == 0)

    @property
    def arm(self) -> int:
        """The arm to draft with: the most tokens per second among the affordable arms that gain."""
        g = self.gains()
        if self.seconds <= 0:
            return 0
        speed = np.where((g > 0) & self.affordable() & (self.cost > 0),
                         (self.tokens + g) / (self.seconds + self.cost), 0.0)
        speed[0] = self.tokens / self.seconds
        return int(np.argmax(speed))

    @property
    def alpha(self) -> float:
        return self.arms[self.arm][0]

    @property
    def width(self) -> int:
        return self.arms[self.arm][1]

    # -- learning -----------------------------------------------------------------------------
    def ranked(self, rank, used: int, drafts: np.ndarray, top1: np.ndarray, tokens: int, step_seconds: float,
               rescore_seconds: float, tree=None) -> tuple:
        """One lattice step of one row, at its end: ``rank(alpha, width) -> (paths int64[p, d],
        probs float[p, d], seconds)`` ranks its lattice with another arm (probs: each token's
        probability under that ranking's model, ``lattice.interpolated``); ``used``, ``drafts``: the
        arm drafted with and its paths; ``top1``: the heads' best path int64[d]; ``tokens``: what the
        step kept (accepted + bonus); ``step_seconds``: this row's share of the step's time;
        ``rescore_seconds``: what drafting with ``used`` spent ranking; ``tree``: (``cost(n)``, the
        step's predicted seconds verifying n nodes, root included, for int[m]; the drafted paths'
        rates; ``rate(probs) -> rates``, the cost-aware tree's rate of each token) where a cost-aware
        tree chose them (None: every path was verified). Each ranking is scored in the tree the
        planner would size for it (``kept``'s ``seconds``, of 0 .. p * d nodes besides the root).
        Ranks arm 0 (where not drafted with) and, within the probes' budget, one probed arm; returns
        the record ``observe`` scores once the target's path is known (None where arm 0 drafted and
        nothing was probed: no comparison to make)."""
        cost, rates, rate = tree if tree is not None and tree[2] is not None else (None, None, None)
        base, base_p, base_s = (drafts, None, rescore_seconds) if used == 0 else rank(0.0, 0)
        self.drafted_at[used] += 1
        self.steps += 1
        self.tokens += (RATE if self.steps > 1 else 1.0) * (tokens - self.tokens)
        if step_seconds > 0:  # (the first step of a decode call has no measured time)
            own = max(step_seconds - (rescore_seconds - base_s if used > 0 else 0.0), 1e-9)
            self.seconds += (RATE if self.seconds > 0 else 1.0) * (own - self.seconds)
            self.step_seconds += step_seconds
        probe = self._probe(rank, used, base_s, rate)
        if used == 0 and probe is None:
            return None  # (nothing to compare: arm 0 against itself)
        base = (base, rates if used == 0 else None if rate is None else rate(base_p))
        seconds = None if cost is None else cost(np.arange(1, np.asarray(drafts).size + 2))
        return used, (drafts, rates), rescore_seconds, base, base_s, top1, probe, seconds

    def _probe(self, rank, used: int, base_s: float, rate):
        """Within the probes' budget, rank the lattice with the next arm in turn (but 0 and
        ``used``; a costly one every ``REPROBE``-th probe): (arm, (paths, rates), seconds) or None."""
        if self.probe_seconds > self.probe_share * self.step_seconds:
            return None
        self.probes += 1
        ok = self.affordable() | (self.probes % REPROBE == 0)
        others = [i for i in range(1, len(self.arms)) if i != used and ok[i]]
        if not others:
            return None
        i = next((j for j in others if j > self.probed), others[0])
        paths, probs, secs = rank(*self.arms[i])
        self.probed = i
        # (a first call's compilation counts as a usual call, or two steps where unmeasured)
        self.probe_seconds += min(secs, base_s + self.cost[i] if self.cost[i] > 0 else 2 * self.seconds)
        return i, (paths, None if rate is None else rate(probs)), secs

    def observe(self, record: tuple, target: np.ndarray) -> None:
        """Score a ``ranked`` record against the target's tokens after the step's root int64[m]
        (the lattice's depth of them, or all it emitted before it ended): each ranking's kept
        tokens (in the tree the planner would size for it, where a cost-aware tree chose the step's)
        against arm 0's."""
        used, drafts, spent, base, base_s, top1, probe, seconds = record
        k0 = kept(base[0], target, base[1], seconds=seconds)
        self.best += (kept(drafts[0][:1], target), kept(top1[None], target), 1)
        if used > 0:
            self._add(used, kept(drafts[0], target, drafts[1], seconds=seconds) - k0, spent - base_s)
        if probe is not None:
            i, (paths, rates), secs = probe
            self._add(i, kept(paths, target, rates, seconds=seconds) - k0, secs - base_s)

    def _add(self, i: int, diff: float, cost: float) -> None:
        """Arm ``i``'s kept-token difference over arm 0 on one step and its cost (seconds): ``cost``
        is the median of the last ``COSTS`` (a compilation or a stall does not move it)."""
        self.scored += 1
        self.n[i] = DECAY * self.n[i] + 1.0
        self.gain[i] = DECAY * self.gain[i] + diff
        seen = self.costs.get(i) or ([float(self.cost[i])] if self.cost[i] > 0 else [])
        self.costs[i] = (seen + [max(float(cost), 1e-9)])[-COSTS:]
        self.cost[i] = float(np.median(self.costs[i]))

    # -- reporting and storage ------------------------------------------------------------------
    def summary(self) -> str:
        """One line: the weight, the evidence and the best paths' kept tokens."""
        b, g = self.best, self.gains()
        arms = ", ".join(f"{a:g}{'' if w == 0 else f' top-{w}'}: {g[i]:+.3f} in {self.cost[i] * 1e3:.2f} ms"
                         for i, (a, w) in enumerate(self.arms) if i and self.n[i] > 0)
        kept_line = (f"; drafted best path kept {b[0] / b[2]:.2f}, the heads' best path {b[1] / b[2]:.2f} tokens a "
                     f"step over {int(b[2])} lattice steps scored" if b[2] else "; no lattice step scored yet")
        return (f"{self.alpha:g}{'' if self.width == 0 else f' over the top {self.width} arcs of each slot'} "
                f"(tokens a step kept over the heads' ranking, rescoring cost: {arms or 'none probed yet'}; a "
                f"{self.seconds * 1e3:.2f} ms step keeps {self.tokens:.2f}{kept_line})")

    def to_json(self) -> dict:
        return {"format": FORMAT, "arms": [list(a) for a in self.arms], "n": self.n.tolist(),
                "gain": self.gain.tolist(), "cost": self.cost.tolist(), "tokens": self.tokens,
                "seconds": self.seconds, "best": self.best.tolist(), "steps": self.steps}

    @classmethod
    def from_json(cls, d: dict) -> "AlphaLearner":
        """The learner ``to_json`` wrote (``schema(d)`` is None: checked before)."""
        w = cls()
        w.n, w.gain, w.cost = (np.asarray(d[k], dtype=np.float64) for k in ("n", "gain", "cost"))
        w.tokens, w.seconds = float(d["tokens"]), float(d["seconds"])
        w.best, w.steps = np.asarray(d["best"], dtype=np.float64), int(d["steps"])
        return w


def schema(d) -> str | None:
    """None where ``d`` (parsed JSON) is a learner ``from_json`` reads, else why not."""
    if not isinstance(d, dict):
        return f"a JSON {type(d).__name__}, not an object"
    missing = [k for k in ("format", "arms", "n", "gain", "cost", "tokens", "seconds", "best", "steps") if k not in d]
    if missing:
        return f"no {', '.join(missing)}"
    if d["format"] != FORMAT or d["arms"] != [list(a) for a in ARMS]:
        return "of another format or other arms"
    for name, shape in (("n", len(ARMS)), ("gain", len(ARMS)), ("cost", len(ARMS)), ("best", 3)):
        a = d[name]
        if not (isinstance(a, list) and len(a) == shape and all(_number(x) for x in a)):
            return f"{name} is not {shape} finite numbers"
    if any(x < 0 for x in d["n"] + d["cost"] + d["best"]):
        return "negative counts or costs"
    if not all(_number(d[k]) and d[k] >= 0 for k in ("tokens", "seconds", "steps")):
        return "tokens, seconds or steps is not a finite number >= 0"
    if any(abs(g) > MAX_DIFF * n + 1e-6 for g, n in zip(d["gain"], d["n"])):
        return "a gain larger than its counts allow"
    return None


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


KIND = learned_state.kind("rescore_weight", "the n-gram rescorer's learned weight", schema,
                          example=lambda: AlphaLearner().to_json())


def _name(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16] + ".json"


def path_of(key: dict):
    """Where the learner of ``key`` is stored (``$LATTICEDRAFT_CACHE`` respected)."""
    return KIND.path(_name(key))


def load(key: dict, note=None) -> AlphaLearner | None:
    """The learner stored for ``key`` (None: none yet, or a file that fails ``schema``, of which
    ``note`` hears one line naming it)."""
    d = learned_state.read(KIND, _name(key), note)
    return None if d is None else AlphaLearner.from_json(d)


def store(key: dict, learner: AlphaLearner):
    """Write ``learner`` for ``key`` (atomically); its path, or None where the cache refused (said
    once on stderr; the decode goes on)."""
    return learned_state.write(KIND, _name(key), json.dumps({**learner.to_json(), "key": key}, default=str) + "\n")

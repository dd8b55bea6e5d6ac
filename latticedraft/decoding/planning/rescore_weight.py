"""The n-gram rescorer's weight alpha, learned from what the target keeps.

Parallel BPD drafts the p best paths of ``head_logp + alpha * lm_logp``. Whether the LM helps
depends on the model and the LM (its domain, the heads' strength: docs/rescoring.md), so a
fixed alpha can cost tokens. After each verify call the target's own path after the root is
known for ``m = accepted + 1`` tokens (the accepted drafts and the bonus), so any ranking of
the step's lattice can be scored against it without another target call: ``kept(paths,
target)``, the longest prefix of the target equal to one of the paths (at most m: beyond the
bonus the target is unknown, for every ranking alike).

Per lattice step ``AlphaLearner.observe`` compares the drafted paths (at the current weight)
and, where the time budget allows, one probed weight with the heads' own ranking (alpha = 0,
``base_drafts``: the p best head paths), on the same lattice: the paired difference in kept
tokens. Per weight of ``GRID`` (alpha_max = ``GRID[-1]``) it keeps decayed sums of those
differences; a weight's gain is their mean shrunk towards 0 by ``PRIOR`` pseudo-observations.
The weight used is the one with the largest gain, and only where the gain pays for the
rescoring: ``gain / tokens > rescore_seconds / step_seconds`` (tokens per second, both
measured); otherwise 0, the heads' own ranking (which skips the LM search). So where the LM does
not help alpha backs off to 0, and where it does it rises to the weight that keeps the most.

Probes (a rescoring at a weight not drafted with, to learn its gain) run while their seconds stay
under ``PROBE_SHARE`` of the lattice steps' seconds. The learner starts at 0. It only ranks
drafts: verification keeps the target's own tokens whatever the weight, so the output never
changes. ``to_json`` / ``from_json`` carry it across sessions (``.cache/rescore_weight``).

    >>> w = AlphaLearner()
    >>> w.alpha
    0.0
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np

from latticedraft import learned_state

GRID = (0.0, 0.0625, 0.125, 0.25, 0.5, 1.0, 2.0)  # the weights tried; alpha_max = GRID[-1]
PRIOR = 8.0  # pseudo-observations of no gain each weight's mean is shrunk by
DECAY = 0.995  # per observation of a weight: its sums' memory (about 200 lattice steps)
RATE = 0.02  # the step statistics' moving-average rate
COSTS = 31  # measured rescoring costs the cost's median is taken over
PROBE_SHARE = 0.01  # probes' rescoring seconds at most this share of the lattice steps' seconds
MAX_DIFF = 64  # tokens: more than any lattice's depth, so more than one step's difference
FORMAT = 1


def kept(paths: np.ndarray, target: np.ndarray) -> int:
    """Tokens of ``target`` (int64[m]) the target would keep from ``paths`` (int64[p, d], -1
    pads): the longest prefix of ``target`` equal to a path's."""
    paths = np.asarray(paths)
    n = min(paths.shape[1] if paths.ndim == 2 else 0, len(target))
    if n == 0 or paths.shape[0] == 0:
        return 0
    eq = paths[:, :n] == np.asarray(target[:n])[None, :]
    return int(np.cumprod(eq, axis=1).sum(axis=1).max())


class AlphaLearner:
    """n, gain: float[G] decayed counts and sums of paired kept-token differences against the
    heads' ranking per weight of ``grid`` (``probe_share``: the probes' budget, a share of the
    lattice steps' seconds); tokens, seconds, rescore: moving averages of a lattice
    step's tokens kept (accepted + 1), its seconds without rescoring and what a rescoring costs
    over the heads' own ranking (seconds; the median of the last measured); best: sums of the tokens kept from the rescored best
    path and from the heads' best path, and their count (what ``summary`` reports)."""

    def __init__(self, grid=GRID, probe_share: float = PROBE_SHARE):
        self.grid = tuple(float(a) for a in grid)
        self.probe_share = float(probe_share)
        self.n = np.zeros(len(self.grid))
        self.gain = np.zeros(len(self.grid))
        self.tokens, self.seconds, self.rescore = 1.0, 0.0, 0.0
        self.costs: list = []  # the last COSTS measured costs of a rescoring (seconds)
        self.best = np.zeros(3)
        self.steps = 0
        self.probe_seconds = self.step_seconds = 0.0  # this session's (the probe budget)
        self.drafted_at = np.zeros(len(self.grid), dtype=np.int64)  # this session's lattice steps per weight
        self.reported = None  # the weight last reported (``decode --verbose``)

    # -- the choice ---------------------------------------------------------------------------
    def gains(self) -> np.ndarray:
        """float[G]: each weight's mean kept-token gain over the heads' ranking, shrunk to 0."""
        return self.gain / (self.n + PRIOR)

    @property
    def alpha(self) -> float:
        """The weight to draft with: the largest gain where it pays for its rescoring, else 0."""
        g = self.gains()
        g[0] = 0.0
        i = int(np.argmax(g))
        if g[i] <= 0:
            return 0.0
        if self.seconds > 0 and g[i] / max(self.tokens, 1e-9) <= self.rescore / self.seconds:
            return 0.0  # the LM search costs more time than its extra tokens save
        return self.grid[i]

    def index(self, alpha: float) -> int | None:
        return next((i for i, a in enumerate(self.grid) if a == alpha), None)

    # -- learning -----------------------------------------------------------------------------
    def observe(self, rank, used: float, drafts: np.ndarray, top1: np.ndarray, target: np.ndarray,
                step_seconds: float, rescore_seconds: float) -> None:
        """One lattice step of one row: ``rank(alpha) -> (paths int64[p, d], seconds)`` ranks its
        lattice at another weight; ``used``, ``drafts``: the weight drafted with and its paths;
        ``top1``: the heads' best path int64[d]; ``target``: the target's tokens after the root,
        int64[m] (accepted + bonus); ``step_seconds``: this row's share of the step's time;
        ``rescore_seconds``: what drafting at ``used`` spent ranking (0 at 0)."""
        base, base_s = (drafts, rescore_seconds) if used == 0 else rank(0.0)
        at = self.index(used)
        if at is not None:
            self.drafted_at[at] += 1
        k0 = kept(base, target)
        self.best += (kept(drafts[:1], target), kept(top1[None], target), 1)
        if used > 0:
            self._add(at, kept(drafts, target) - k0)
            self._cost(rescore_seconds - base_s)
        self.steps += 1
        self.tokens += (RATE if self.steps > 1 else 1.0) * (len(target) - self.tokens)
        if step_seconds > 0:  # (the first step of a decode call has no measured time)
            own = max(step_seconds - (rescore_seconds - base_s if used > 0 else 0.0), 1e-9)
            self.seconds += (RATE if self.seconds > 0 else 1.0) * (own - self.seconds)
            self.step_seconds += step_seconds
        if self.probe_seconds <= self.probe_share * self.step_seconds:
            self._probe(rank, used, k0, base_s, target)

    def _probe(self, rank, used: float, k0: int, base_s: float, target: np.ndarray) -> None:
        """Rank the lattice at the least-tried weight other than 0 and ``used``; learn its gain."""
        others = [i for i in range(1, len(self.grid)) if self.grid[i] != used]
        if not others:
            return
        i = min(others, key=lambda j: (self.n[j], j))
        paths, secs = rank(self.grid[i])
        self._add(i, kept(paths, target) - k0)
        self._cost(secs - base_s)
        self.probe_seconds += min(secs, base_s + self.rescore)  # (a first call's compilation counts as a usual one)

    def _add(self, i: int | None, diff: float) -> None:
        if i is not None:
            self.n[i] = DECAY * self.n[i] + 1.0
            self.gain[i] = DECAY * self.gain[i] + diff

    def _cost(self, seconds: float) -> None:
        """One measured cost of a rescoring over the heads' ranking: ``rescore`` is the median of
        the last ``COSTS`` (a first call's compilation or a stall does not move it)."""
        self.costs = (self.costs + [max(float(seconds), 0.0)])[-COSTS:]
        self.rescore = float(np.median(self.costs))

    # -- reporting and storage ------------------------------------------------------------------
    def summary(self) -> str:
        """One line: the weight, the evidence and the best paths' kept tokens."""
        b = self.best
        kept_line = (f"; rescored best path kept {b[0] / b[2]:.2f}, the heads' best path {b[1] / b[2]:.2f} tokens a "
                     f"step over {int(b[2])} lattice steps" if b[2] else "; no lattice step yet")
        gains = ", ".join(f"{a:g}: {g:+.3f}" for a, g in zip(self.grid[1:], self.gains()[1:]))
        return (f"{self.alpha:g} (gain in tokens a step over the heads' ranking per weight: {gains}; rescoring "
                f"{self.rescore * 1e3:.3f} ms against a {self.seconds * 1e3:.3f} ms step{kept_line})")

    def to_json(self) -> dict:
        return {"format": FORMAT, "grid": list(self.grid), "n": self.n.tolist(), "gain": self.gain.tolist(),
                "tokens": self.tokens, "seconds": self.seconds, "rescore": self.rescore,
                "best": self.best.tolist(), "steps": self.steps}

    @classmethod
    def from_json(cls, d: dict) -> "AlphaLearner":
        """The learner ``to_json`` wrote (``schema(d)`` is None: checked before)."""
        w = cls(d["grid"])
        w.n, w.gain = np.asarray(d["n"], dtype=np.float64), np.asarray(d["gain"], dtype=np.float64)
        w.tokens, w.seconds, w.rescore = float(d["tokens"]), float(d["seconds"]), float(d["rescore"])
        w.costs = [w.rescore] if w.rescore > 0 else []
        w.best, w.steps = np.asarray(d["best"], dtype=np.float64), int(d["steps"])
        return w


def schema(d) -> str | None:
    """None where ``d`` (parsed JSON) is a learner ``from_json`` reads, else why not."""
    if not isinstance(d, dict):
        return f"a JSON {type(d).__name__}, not an object"
    missing = [k for k in ("format", "grid", "n", "gain", "tokens", "seconds", "rescore", "best", "steps") if k not in d]
    if missing:
        return f"no {', '.join(missing)}"
    if d["format"] != FORMAT or d["grid"] != list(GRID):
        return "of another format or grid"
    for name, shape in (("n", len(GRID)), ("gain", len(GRID)), ("best", 3)):
        a = d[name]
        if not (isinstance(a, list) and len(a) == shape and all(_number(x) for x in a)):
            return f"{name} is not {shape} finite numbers"
    if any(x < 0 for x in d["n"]) or any(x < 0 for x in d["best"]):
        return "negative counts"
    if not all(_number(d[k]) and d[k] >= 0 for k in ("tokens", "seconds", "rescore", "steps")):
        return "tokens, seconds, rescore or steps is not a finite number >= 0"
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

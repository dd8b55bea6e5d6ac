"""``T(n)``: the measured seconds of one verify step over a draft tree of n nodes.

Drafting decisions (how many nodes to verify) are made from this curve, measured for the
model, device, dtype, thread count and batch size in use, never from constants tuned on one
machine. A step is timed end to end as the decode loop runs it: the tree forward over n nodes
after a cache of ``context`` tokens, the accept walk and the cache commit. The extra heads at
the accepted node are left out: they cost the same at any n, and a gated step does not run
them (the decode loop counts their measured time in the planner's per-step overhead). Curves
are cached as JSON under ``cache_dir()/cost_model``, keyed by a fingerprint of (architecture
config, dtype, device, threads, torch version, batch, heads).

    >>> cm = CostModel.measure(Verifier.for_model(model), batch=1)        # doctest: +SKIP
    >>> cm.seconds(8) / cm.seconds(1)                            # relative cost of 8 nodes
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from dataclasses import dataclass

import numpy as np
import torch

from latticedraft import learned_state
from latticedraft.gpu.models import hf

GRID = (1, 2, 4, 6, 8, 16, 24, 32)  # between: interpolated, beyond 32 the last slope (SmolLM2: within 2%)
MAX_BATCH = 64  # the batch sizes ``for_batch`` looks for among the stored curves
QUANTILE = 0.25
FORMAT = 5  # 5: without the heads (curves of earlier steps are measured again)


@dataclass(frozen=True)
class CostModel:
    """nodes: int[m] the measured tree sizes (ascending, from 1); seconds: float[m] the median
    step time at each. ``seconds(n)`` interpolates linearly (and extrapolates the last slope)."""

    nodes: tuple
    seconds_at: tuple
    key: str = ""
    info: dict | None = None

    def seconds(self, n) -> np.ndarray | float:
        """Seconds of one step over n nodes (root included); n scalar or array."""
        x, y = np.asarray(self.nodes, float), np.asarray(self.seconds_at, float)
        n_arr = np.asarray(n, dtype=float)
        out = np.interp(n_arr, x, y)
        if len(x) > 1:
            slope = (y[-1] - y[-2]) / (x[-1] - x[-2])
            out = np.where(n_arr > x[-1], y[-1] + slope * (n_arr - x[-1]), out)
        return float(out) if out.ndim == 0 else out

    @property
    def max_nodes(self) -> int:
        return int(self.nodes[-1])

    def to_json(self) -> dict:
        return {"format": FORMAT, "key": self.key, "nodes": list(self.nodes),
                "seconds": [float(s) for s in self.seconds_at], "info": self.info}

    @classmethod
    def from_json(cls, d: dict) -> "CostModel":
        return cls(tuple(int(n) for n in d["nodes"]), tuple(float(s) for s in d["seconds"]), d.get("key", ""),
                   d.get("info"))

    # -- measuring ------------------------------------------------------------------------
    @classmethod
    def measure(cls, verifier, batch: int = 1, context: int = 100, grid=GRID, repeats: int = 15,
                max_nodes: int | None = None, budget_s: float = 2.0, min_repeats: int = 1) -> "CostModel":
        """Time ``verifier.verify`` over chains of n nodes (n in ``grid``), each after a cache of
        ``context`` tokens, ``repeats`` times interleaved (fewer, but at least ``min_repeats``, once
        the rounds have taken ``budget_s`` seconds: a 135 M model's round takes a second, the
        bundled model's milliseconds, so SmolLM2's first decode waits one warm-up round and one
        timed round: a second timed round moved its curve by 3% and cost 1.2 s, and the cold start
        is measured by benchmarks/cold_start.py; the decode loop refines the curve's level from its
        own calls, ``StepCosts``); per n the ``QUANTILE`` of the times, then the nondecreasing
        least-squares fit (``monotone``). The model's state is restored after every call, so the
        measurement leaves nothing behind."""
        limit = _position_limit(verifier.model)
        if limit:
            context = max(1, min(context, limit - max(grid) - 1))
        grid = [n for n in grid if max_nodes is None or n <= max_nodes]
        rng = np.random.default_rng(0)
        vocab = hf.model_vocab_size(getattr(verifier.model, "base", verifier.model))
        prompts = [rng.integers(1, vocab, size=context) for _ in range(batch)]
        state, _, _ = verifier.prefill(prompts)
        saved = state.save()
        times = {n: [] for n in grid}
        t_start = time.perf_counter()
        for rep in range(repeats + 1):
            if rep > min_repeats and time.perf_counter() - t_start > budget_s:
                break
            for n in grid:
                roots = rng.integers(1, vocab, size=batch)
                drafts = [rng.integers(1, vocab, size=(1, n - 1)) for _ in range(batch)]
                t0 = time.perf_counter()
                verifier.verify(state, roots, drafts, heads=False)
                dt = time.perf_counter() - t0
                state.restore(saved)
                if rep:  # the first round warms up
                    times[n].append(dt)
        # a low quantile resists bursts of load from other processes; the fit is nondecreasing
        # (a bigger tree never costs less), which also irons out cache and allocator jitter
        raw = [float(np.quantile(times[n], QUANTILE)) for n in grid]
        return cls(tuple(grid), tuple(monotone(raw)), "", {"context": context, "repeats": len(times[grid[0]]),
                                                           "batch": batch,
                                                           "raw_seconds": raw, "quantile": QUANTILE})

    @classmethod
    def stored(cls, verifier, batch: int, described: dict | None = None, note=None) -> "CostModel | None":
        """The curve for this verifier and batch size from the cache, or None (also for an entry that
        fails the schema, which ``note`` hears of: it is measured again). described:
        ``describe(verifier, any batch)``, when the caller has it already."""
        key = fingerprint(verifier, batch, described)
        d = learned_state.read(KIND, f"{key}.json", note, check=lambda d: None if d["key"] == key else "another key")
        return None if d is None else cls.from_json(d)

    @classmethod
    def for_batch(cls, verifier, batch: int, note=None) -> "CostModel":
        """The curve at ``batch`` rows: the one stored for it, else, between the nearest stored
        sizes below and above, their linear interpolation in the number of rows (a decode's
        last, partial batch, between batch 1 and the run's size, which the run's warm-up
        measured); measured and stored when no stored sizes lie on both sides."""
        described = describe(verifier, batch)
        exact = cls.stored(verifier, batch, described, note)
        if exact is not None:
            _say(note, f"step costs T(n) at batch {batch}: read from {KIND.path(exact.key + '.json')}")
            return exact
        lo = next((b for b in range(batch - 1, 0, -1) if cls.stored(verifier, b, described) is not None), None)
        hi = next((b for b in range(batch + 1, MAX_BATCH + 1) if cls.stored(verifier, b, described) is not None), None)
        below = None if lo is None or hi is None else cls.stored(verifier, lo, described)
        above = None if below is None else cls.stored(verifier, hi, described)
        nodes = [] if above is None else [n for n in below.nodes if n in above.nodes]
        if not nodes:  # no stored sizes on both sides (or curves over disjoint sizes)
            return cls._measured(verifier, batch, note)
        _say(note, f"step costs T(n) at batch {batch}: interpolated between the stored batches {lo} and {hi}")
        w = (batch - lo) / (hi - lo)
        secs = [(1 - w) * below.seconds(n) + w * above.seconds(n) for n in nodes]
        return cls(tuple(nodes), tuple(secs), f"{below.key}+{above.key}",
                   {"interpolated": {"batch": batch, "from": [lo, hi]}})

    @classmethod
    def cached(cls, verifier, batch: int = 1, refresh: bool = False, note=None, **measure_kw) -> "CostModel":
        """The curve for this verifier and batch size from the cache, measured and stored if
        absent (or ``refresh``). Measuring takes ~1-3 s on the bundled model."""
        hit = None if refresh else cls.stored(verifier, batch, note=note)
        if hit is not None:
            return hit
        return cls._measured(verifier, batch, note, **measure_kw)

    @classmethod
    def _measured(cls, verifier, batch: int, note=None, **measure_kw) -> "CostModel":
        """The curve measured now and stored in the cache (where it refuses: said once on stderr)."""
        key = fingerprint(verifier, batch)
        cm = cls.measure(verifier, batch=batch, **measure_kw)
        cm = cls(cm.nodes, cm.seconds_at, key, {**(cm.info or {}), **describe(verifier, batch)})
        path = learned_state.write(KIND, f"{key}.json", json.dumps(cm.to_json(), indent=1) + "\n")
        _say(note, f"step costs T(n) at batch {batch}: measured over {len(cm.nodes)} tree sizes, "
                   + (f"stored in {path}" if path is not None else "not stored"))
        return cm


def _say(note, line: str) -> None:
    if note is not None:
        note(line)


def _schema(d) -> str | None:
    """None where ``d`` (parsed JSON) is a curve ``from_json`` reads: this ``FORMAT``, nodes
    int[m] increasing from >= 1, seconds float[m] finite, > 0 and nondecreasing, info an object."""
    S = learned_state
    why = S.fields(d, "format", "key", "nodes", "seconds")
    if why or d["format"] != FORMAT:
        return why or "of another format"
    nodes, secs = d["nodes"], d["seconds"]
    why = S.numbers(nodes, (None,), "nodes", 1, 1 << 20, integer=True) or S.numbers(secs, (None,), "seconds", 1e-12, 1e6)
    if why or not 0 < len(nodes) == len(secs):
        return why or "nodes and seconds differ in length"
    if (np.diff(nodes) <= 0).any() or (np.diff(secs) < 0).any():
        return "nodes not increasing or seconds decreasing"
    return None if isinstance(d.get("info"), (dict, type(None))) and isinstance(d["key"], str) else "info or key mistyped"


KIND = learned_state.kind("cost_model", "step costs T(n)", _schema,
                          example=lambda: {k: v for k, v in CostModel((1, 2, 8), (0.5, 0.75, 1.5), key="k").to_json().items()
                                           if k != "info"})  # (info: optional, any object)


class StepCosts:
    """T(1..max_nodes) of one verifier at one batch size, following the verify calls a decode
    times (``observe``): kept on the verifier (``Verifier.step_costs``), so every decode call of a
    process plans with what the earlier ones measured. The measured curve keeps its shape (what
    n nodes cost against one) and its level follows the calls: T(n) = scale x the measured T(n),
    scale a running mean of observed / measured (each ratio clipped to [1/2, 2], so one call
    slowed by a burst of load moves it little): a curve measured under load, or after a short
    cache while a long decode's calls grow, heals as it is used. T: float64[max_nodes], T[n - 1]
    = T(n), updated in place."""

    def __init__(self, model: "CostModel", max_nodes: int = 64, weight: float = 0.1):
        self.base = np.asarray(model.seconds(np.arange(1, max_nodes + 1)), dtype=np.float64)
        self.T, self.scale, self.weight = self.base.copy(), 1.0, float(weight)

    @property
    def max_nodes(self) -> int:
        return len(self.T)

    def seconds(self, n):
        """T(n) for n scalar or array (capped at ``max_nodes``)."""
        i = np.minimum(np.maximum(np.asarray(n, dtype=np.int64), 1), len(self.T)) - 1
        out = self.T[i]
        return float(out) if np.ndim(out) == 0 else out

    def observe(self, n: int, seconds: float) -> None:
        """A verify call over ``n`` nodes per row took ``seconds``."""
        measured = self.base[min(max(int(n), 1), len(self.base)) - 1]
        ratio = float(np.clip(seconds / max(measured, 1e-12), 0.5, 2.0))
        self.scale += self.weight * (ratio - self.scale)
        np.multiply(self.base, self.scale, out=self.T)


def monotone(y) -> list[float]:
    """The least-squares nondecreasing fit of ``y`` (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight]
    for v in y:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, w1), (m2, w2) = blocks[-2], blocks.pop()
            blocks[-1] = [(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2]
    return [m for m, w in blocks for _ in range(int(w))]


def describe(verifier, batch: int) -> dict:
    """What the curve depends on, as plain values (also hashed into the fingerprint)."""
    model = verifier.model
    base = getattr(model, "base", model)
    cfg = {k: v for k, v in base.config.to_dict().items() if not k.startswith("_") and k not in ("transformers_version",)}
    return {
        "config": json.dumps(cfg, sort_keys=True, default=str),
        "heads": int(getattr(model, "num_heads", 1)), "heads_used": verifier.num_heads,
        "dtype": str(verifier.dtype), "device": str(verifier.device), "threads": torch.get_num_threads(),
        "torch": torch.__version__, "cpu": platform.processor() or platform.machine(), "batch": batch,
        "mode": verifier.mode, "lazy": verifier.lazy, "draft_vocab": getattr(verifier, "draft_vocab_size", None),
        "lean": getattr(verifier, "stack", None) is not None,
    }


def fingerprint(verifier, batch: int, described: dict | None = None) -> str:
    """The cache key: a hash of ``describe(verifier, batch)`` (``described``: that of any batch size)."""
    d = dict(described if described is not None else describe(verifier, batch), batch=batch)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _position_limit(model) -> int | None:
    base = getattr(model, "base", model)
    cfg = getattr(base, "config", None)
    return getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)


"""torch.compile (Inductor's C++ CPU backend) of the self-draft's forward, against the op-by-op
forward and the fused one (``gpu/verify/fused_draft.py``), on SmolLM2.

The draft forward of one token (int4 copy, output projection included, after a 300-token cache the
float model wrote, as the self-draft reads the verifier's) is compiled whole by
``torch.compile(..., dynamic=True)``: its int4 / int8 products stay extern kernels, the norms,
rotary, cache write and attention become Inductor's C++ loops. Recorded: the compile's seconds
(the first call) and a recompile's (a cache grown by 100 slots: ``dynamic`` should leave none), the
milliseconds of each forward (median of repeats, round-robin) and the ATen calls of each under
``torch.profiler`` (a compiled graph's own kernels are no ATen calls; its extern calls are).

    .venv/bin/python benchmarks/compiled_draft.py --out benchmarks/results/compiled_draft.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latticedraft.atomic import write_atomic  # noqa: E402
from latticedraft.cpu import cpu_info  # noqa: E402
from latticedraft.decoding.runs.session import Session  # noqa: E402
from latticedraft.gpu.masks import CAUSAL  # noqa: E402
from latticedraft.gpu.models.quantized import Scheme  # noqa: E402
from latticedraft.gpu.verify.fused_draft import FusedDraft  # noqa: E402
from latticedraft.gpu.verify.kv import KVCache  # noqa: E402
from latticedraft.gpu.verify.lean import LeanStack, stack_for  # noqa: E402


def prefilled(model, context: int):
    fl = stack_for(model)
    ids = torch.randint(100, 20000, (1, context), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(context)[None]
    cache = KVCache(1, fl.num_layers, capacity=1024)
    cache.reserve(context)
    with torch.inference_mode():
        fl.run(fl.embed(ids, pos), 0, fl.num_layers, CAUSAL, pos, cache)
    cache.append_valid(np.ones((1, context), dtype=bool), pos.numpy())
    return cache, ids[:, -1:], torch.full((1, 1), context)


def aten_calls(f) -> int:
    from torch.profiler import ProfilerActivity, profile

    f()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        f()
    return sum(1 for e in prof.events() if e.name.startswith("aten::"))


def main(argv=None) -> int:
    from latticedraft.paths import smollm2_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(smollm2_dir()))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", default="benchmarks/results/compiled_draft.json")
    a = ap.parse_args(argv)
    s = Session(a.model, threads=a.threads)
    stack = LeanStack(s.model, Scheme("int4"))
    fused, why = FusedDraft.of(stack)
    cache, x, p = prefilled(s.model, a.context)
    n = cache.length

    def eager_fn(x, p, cache):
        return stack.unembed(stack.norm(stack.run(stack.embed(x, p), 0, stack.num_layers, None, p, cache)[:, -1])).float()

    compiled_fn = torch.compile(eager_fn, dynamic=True)
    run = {"eager": eager_fn, "compiled": compiled_fn}
    if fused is not None:
        run["fused"] = lambda x, p, cache: fused(stack.embed(x, p)[:, 0], p[:, 0], cache, None)

    def once(name):
        cache.reserve(1)
        with torch.inference_mode():
            out = run[name](x, p, cache)
        cache.truncate(n)
        return out

    t0 = time.perf_counter()
    once("compiled")
    compile_s = time.perf_counter() - t0
    times = {k: [] for k in run}
    for rep in range(a.repeats + 2):
        for k in run:
            t0 = time.perf_counter()
            once(k)
            if rep >= 2:
                times[k].append(time.perf_counter() - t0)
    calls = {k: aten_calls(lambda k=k: once(k)) for k in run}
    for _ in range(100):  # a longer cache: a recompile would show here
        cache.reserve(1)
        cache.append_valid(np.ones((1, 1), dtype=bool), np.full((1, 1), cache.length))
    n, p = cache.length, torch.full((1, 1), cache.length)
    t0 = time.perf_counter()
    once("compiled")
    longer_s = time.perf_counter() - t0
    out = {"benchmark": "compiled_draft", "model": a.model, "context": a.context, "fused": why or "yes",
           "compile_s": round(compile_s, 2), "first_call_after_100_more_slots_s": round(longer_s, 3),
           "ms": {k: round(1000 * statistics.median(v), 3) for k, v in times.items()}, "aten_calls": calls,
           "load_average": os.getloadavg(), "machine": {"cpu": cpu_info(), "torch": torch.__version__,
                                                        "threads": torch.get_num_threads()}}
    write_atomic(Path(a.out), json.dumps(out, indent=1) + "\n")
    print(f"int4 draft forward, 1 row after {a.context} cached tokens, {a.threads} threads, load average "
          f"{out['load_average'][0]:.2f}, {out['machine']['cpu']['model']}:")
    for k in run:
        print(f"  {k:<9} {out['ms'][k]:>7.2f} ms  {calls[k]:>5} ATen calls")
    print(f"  torch.compile: {compile_s:.1f} s to compile; {longer_s * 1000:.1f} ms on a cache 100 slots longer")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

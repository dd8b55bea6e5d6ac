"""Memory of long decodes: the rolling-buffer KV cache against the full cache.

A sliding-window (Mistral) model decodes ``total`` tokens (a prompt of ``total - new`` tokens,
then ``new`` generated ones) with latticedraft's greedy loop on the verifier (``bpd_decode``
without drafts) or lookahead decoding, once with ``kv_cache="rolling"`` (W slots, chunked
prefill) and once with ``kv_cache="full"`` (every position, one-shot prefill). Each run is a
fresh subprocess, configurations interleaved round-robin. Reported per run: the verifier's peak
KV-cache bytes (keys + values of every layer, the step's in-flight tree nodes included), the
process's peak resident memory (``ru_maxrss``) above what it held once the model was loaded and
warmed up (so the one-shot prefill's attention scores count), seconds, and whether the tokens
equal the other cache's. Medians over ``--repeats``; machine and load average are recorded.

The model is the bundled base when it is a sliding-window model with enough positions, else
(``--random``, or no such bundled base) a randomly initialised model of the bundled base's
architecture (``data/build.py`` BASE): memory does not depend on the weights' values.

    .venv/bin/python benchmarks/long_context.py                    # totals 512 1024 2048
    .venv/bin/python benchmarks/long_context.py --totals 2048 --new 512 --method lookahead
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from latticedraft.atomic import write_atomic  # noqa: E402

CACHES = ("rolling", "full")


def _model(random: bool):
    """(model, description): the bundled base, or a random model of its architecture."""
    import torch
    from transformers import AutoModelForCausalLM

    from latticedraft.gpu.verify.modes import position_limit, sliding_window
    from latticedraft.paths import data_dir

    base = data_dir() / "base"
    if not random and (base / "config.json").is_file():
        m = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
        if sliding_window(m) and (position_limit(m) or 0) >= 2048:
            return m, f"bundled base {base}"
    sys.path.insert(0, str(ROOT / "data"))
    from build import BASE, VOCAB  # the bundled base's architecture

    from latticedraft.gpu.train.lm import LMArch

    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(LMArch(**BASE).hf_config(VOCAB)).eval()
    return m, f"random {LMArch(**BASE)} (data/build.py BASE)"


def child(args) -> dict:
    """One run in this process; prints one JSON line."""
    import resource
    import time

    import numpy as np
    import torch

    from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode
    from latticedraft.decoding.registry import Request
    from latticedraft.decoding.methods.lookahead import lookahead_decode
    from latticedraft.gpu.verify.modes import sliding_window

    torch.set_num_threads(1)
    model, desc = _model(args.random)
    prompt = np.random.default_rng(0).integers(1, model.config.vocab_size, size=args.total - args.new)

    def run(p, n):
        if args.method == "lookahead":
            return lookahead_decode(model, [p], max_new_tokens=n, kv_cache=args.cache)
        return bpd_decode(model, [p], None, BpdPlan(kv_cache=args.cache), Request(max_new_tokens=n))

    run(prompt[:32], 4)  # warm-up: allocator, kernels
    base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    res = run(prompt, args.new)
    dt = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"cache": args.cache, "total": args.total, "new": args.new, "method": args.method, "model": desc,
            "window": sliding_window(model), "kv_peak_bytes": res.kv_peak_bytes,
            "rss_growth_mb": round((peak_kb - base_kb) / 1024, 2), "rss_peak_mb": round(peak_kb / 1024, 1),
            "seconds": round(dt, 3), "tokens": res.sequences[0].tokens.tolist()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--totals", type=int, nargs="+", default=[512, 1024, 2048], help="prompt + new tokens per run")
    ap.add_argument("--new", type=int, default=256, help="tokens generated per run (default 256)")
    ap.add_argument("--method", choices=["greedy-loop", "lookahead"], default="greedy-loop")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--random", action="store_true", help="a random model of the bundled base's architecture")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "long_context.json"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cache", choices=CACHES, default="rolling", help=argparse.SUPPRESS)
    ap.add_argument("--total", type=int, default=2048, help=argparse.SUPPRESS)
    from latticedraft.quiet import add_verbose_arg, quiet_libraries

    add_verbose_arg(ap)
    args = ap.parse_args(argv)
    quiet_libraries(args.verbose)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    if any(t <= args.new for t in args.totals):
        ap.error(f"every --totals value must exceed --new {args.new} (the prompt needs a token)")
    load = os.getloadavg()
    runs: dict[tuple, list[dict]] = {}
    for r in range(args.repeats):
        for total in args.totals:
            for cache in CACHES:  # round-robin: rolling and full alternate
                cmd = [sys.executable, __file__, "--child", "--cache", cache, "--total", str(total), "--new",
                       str(args.new), "--method", args.method] + (["--random"] if args.random else [])
                out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                                     env={**os.environ, "OMP_NUM_THREADS": "1"})
                rec = json.loads(out.stdout.strip().splitlines()[-1])
                runs.setdefault((total, cache), []).append(rec)
                print(f"  repeat {r + 1}: total {total} {cache}: {rec['kv_peak_bytes'] / 1e6:.2f} MB KV, "
                      f"+{rec['rss_growth_mb']} MB RSS, {rec['seconds']} s", file=sys.stderr)
    rows = []
    for total in args.totals:
        for cache in CACHES:
            rs = runs[(total, cache)]
            other = runs[(total, "full" if cache == "rolling" else "rolling")][0]["tokens"]
            rows.append({"total": total, "prompt": total - args.new, "new": args.new, "cache": cache,
                         "kv_peak_mb": round(statistics.median(x["kv_peak_bytes"] for x in rs) / 1e6, 3),
                         "rss_growth_mb": statistics.median(x["rss_growth_mb"] for x in rs),
                         "seconds": statistics.median(x["seconds"] for x in rs),
                         "same_tokens": all(x["tokens"] == other for x in rs)})
    first = runs[(args.totals[0], CACHES[0])][0]
    result = {"benchmark": "long_context", "model": first["model"], "window": first["window"], "method": args.method,
              "repeats": args.repeats, "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                                                   "loadavg_start": load, "loadavg_end": os.getloadavg()},
              "rows": rows}
    write_atomic(Path(args.out), json.dumps(result, indent=1) + "\n")
    print(table(result))
    return 0


def table(result: dict) -> str:
    L = [f"Long decodes, {result['method']}, {result['model']}, window {result['window']}; median of "
         f"{result['repeats']}; load average {result['machine']['loadavg_start'][0]:.1f} at start",
         "", "| prompt + new | KV cache | peak KV cache MB | peak RSS growth MB | seconds | same tokens |",
         "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        L.append(f"| {r['prompt']} + {r['new']} | {r['cache']} | {r['kv_peak_mb']:.2f} | {r['rss_growth_mb']:.1f} | "
                 f"{r['seconds']:.1f} | {'yes' if r['same_tokens'] else 'NO'} |")
    return "\n".join(L)


if __name__ == "__main__":
    sys.exit(main())

"""Time loading the bundled models (``data/``) the way the demo and tests do, in fresh processes.

For each of ``data/heads-stern`` and ``data/heads-dynamo``, in a new Python process each repeat:
importing torch + latticedraft (``import_s``), the first ``BlockwiseModel.from_pretrained`` (base +
heads, float32, CPU; includes transformers' lazy imports, ``load_s``), their sum (``cold_total_s``),
the CPU seconds of the same (``cold_total_cpu_s``: what the load costs when the machine is not
shared, up to thread parallelism), the first forward over a 64-token prompt, and a second load
in the same process (``warm_load_s``).
Medians of ``--repeats`` runs; the 1-minute load average before and after is recorded because
the machine is shared.

    .venv/bin/python benchmarks/load_bundled.py [--repeats 5] [--out benchmarks/results/load_bundled.json]
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

from latticedraft.atomic import write_atomic

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
c0 = time.process_time()
t0 = time.perf_counter()
import torch
from latticedraft.gpu.models.blockwise import BlockwiseModel
t1 = time.perf_counter()
bm = BlockwiseModel.from_pretrained(sys.argv[1])
t2 = time.perf_counter()
c2 = time.process_time()
with torch.no_grad():
    bm(torch.arange(64)[None] % 8192)
t3 = time.perf_counter()
bm2 = BlockwiseModel.from_pretrained(sys.argv[1])
t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "cold_total_s": t2 - t0, "cold_total_cpu_s": c2 - c0, "warm_load_s": t4 - t3,
                  "first_forward_s": t3 - t2}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "load_bundled.json"))
    from latticedraft.quiet import add_verbose_arg, quiet_libraries

    add_verbose_arg(ap)
    a = ap.parse_args()
    quiet_libraries(a.verbose)
    res = {"machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "python": platform.python_version()},
           "repeats": a.repeats, "loadavg_before": os.getloadavg()[0], "models": {}}
    for name in ["heads-stern", "heads-dynamo"]:
        runs = []
        for _ in range(a.repeats):
            p = subprocess.run([sys.executable, "-c", CHILD, str(ROOT / "data" / name)], capture_output=True, text=True,
                               cwd=ROOT, check=True)
            runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
        res["models"][name] = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
    res["loadavg_after"] = os.getloadavg()[0]
    out = write_atomic(Path(a.out), json.dumps(res, indent=1) + "\n")
    print(f"{'model':<14} {'import s':>9} {'load s':>8} {'cold total s':>13} {'cold CPU s':>11} {'warm load s':>12} {'1st fwd s':>10}"
          f"   (median of {a.repeats}, {res['machine']['cpu_count']} CPUs, load avg "
          f"{res['loadavg_before']:.1f} → {res['loadavg_after']:.1f})")
    for name, r in res["models"].items():
        print(f"{name:<14} {r['import_s']:>9.2f} {r['load_s']:>8.2f} {r['cold_total_s']:>13.2f} {r['cold_total_cpu_s']:>11.2f} {r['warm_load_s']:>12.2f}"
              f" {r['first_forward_s']:>10.2f}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

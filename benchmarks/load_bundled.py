"""Time loading the bundled models (``data/``) the way the demo and tests do, in fresh processes.

For each of ``data/heads-stern`` and ``data/heads-dynamo``: ``BlockwiseModel.from_pretrained``
(base + heads, float32, CPU) and the first forward over a 64-token prompt, in a new Python
process each repeat (the import of torch/transformers is reported separately). Medians of
``--repeats`` runs.

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

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
from latticedraft.gpu.blockwise import BlockwiseModel
t1 = time.perf_counter()
bm = BlockwiseModel.from_pretrained(sys.argv[1])
t2 = time.perf_counter()
with torch.no_grad():
    bm(torch.arange(64)[None] % 8192)
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "first_forward_s": t3 - t2}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "load_bundled.json"))
    a = ap.parse_args()
    res = {"machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "python": platform.python_version()},
           "repeats": a.repeats, "models": {}}
    for name in ["heads-stern", "heads-dynamo"]:
        runs = []
        for _ in range(a.repeats):
            p = subprocess.run([sys.executable, "-c", CHILD, str(ROOT / "data" / name)], capture_output=True, text=True,
                               cwd=ROOT, check=True)
            runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
        res["models"][name] = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"{'model':<14} {'import s':>9} {'load s':>8} {'1st fwd s':>10}   (median of {a.repeats}, "
          f"{res['machine']['cpu_count']} CPUs)")
    for name, r in res["models"].items():
        print(f"{name:<14} {r['import_s']:>9.2f} {r['load_s']:>8.2f} {r['first_forward_s']:>10.2f}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A first decode on a model against later ones: seconds from launching ``latticedraft decode`` to
the first byte of its answer and to its end, with the measured caches removed (cold: the step cost
T(n) is measured and the acceptance tables start from their priors) and kept (warm), alternated.

    .venv/bin/python benchmarks/cold_start.py --repeats 3 --out benchmarks/results/cold_start.json

The caches it removes are the checkout's (``.cache/cost_model``, ``.cache/acceptance``, or
``$LATTICEDRAFT_CACHE``'s): what the first decode of a new model rebuilds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latticedraft.atomic import write_atomic  # noqa: E402
from latticedraft.paths import cache_dir  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def launch(cmd: list[str]) -> tuple[float, float, str]:
    """(seconds to the first byte on stdout, seconds to the end, the summary line on stderr)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    p.stdout.read(1)
    first = time.perf_counter() - t0
    p.stdout.read()
    err = p.stderr.read().decode().strip().splitlines()
    if p.wait() != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {err[-1] if err else p.returncode}")
    return first, time.perf_counter() - t0, err[-1] if err else ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="data/heads-smollm2")
    ap.add_argument("--prompt", default="How do vaccines train the immune system?")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="JSON file to write")
    a = ap.parse_args(argv)
    cmd = [str(ROOT / ".venv" / "bin" / "latticedraft"), "decode", "--model", a.model, "--chat",
           "--max-new-tokens", str(a.max_new_tokens), "--prompt", a.prompt]
    runs: dict = {"cold": [], "warm": []}
    for mode in ["cold", "warm"] * a.repeats:
        if mode == "cold":
            for name in ("cost_model", "acceptance"):
                shutil.rmtree(cache_dir() / name, ignore_errors=True)
        first, total, summary = launch(cmd)
        runs[mode].append({"first_s": round(first, 2), "total_s": round(total, 2), "summary": summary})
        print(f"{mode:<5} first byte {first:6.2f} s  end {total:6.2f} s  {summary}", file=sys.stderr)
    med = {m: {k: statistics.median(r[k] for r in v) for k in ("first_s", "total_s")} for m, v in runs.items()}
    out = {"benchmark": "cold_start", "command": " ".join(cmd[1:]), "repeats": a.repeats, "runs": runs,
           "median": med, "first_ratio": round(med["cold"]["first_s"] / med["warm"]["first_s"], 2),
           "total_ratio": round(med["cold"]["total_s"] / med["warm"]["total_s"], 2),
           "load_average": os.getloadavg(), "cpu_count": os.cpu_count()}
    print(f"median: cold {med['cold']['first_s']:.2f} / {med['cold']['total_s']:.2f} s, warm "
          f"{med['warm']['first_s']:.2f} / {med['warm']['total_s']:.2f} s (first byte / end): first byte "
          f"{out['first_ratio']}x, end {out['total_ratio']}x")
    if a.out:
        write_atomic(Path(a.out), json.dumps(out, indent=1) + "\n")
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

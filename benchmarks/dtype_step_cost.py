"""The verify step's cost T(n) and HF greedy's speed in each dtype, on this machine.

For each ``--dtypes`` entry the model (``--model``, default the fetched SmolLM2-135M-Instruct) is
loaded in that dtype and measured:

- HF greedy: tokens/s of ``generate(do_sample=False)`` writing ``--new-tokens`` tokens after a
  random ``--context``-token prompt (seeded; one untimed warm-up of 4 tokens first);
- T(n): seconds of one verify call over a chain of n nodes after a ``--context``-token cache
  (``CostModel.measure``, ``--repeats`` interleaved rounds, at most ``--budget`` seconds after the
  first four), its low quantile per n as measured (``raw_ms``) and the nondecreasing fit the planner
  uses (``fit_ms``); ``lean_stack``: whether the verifier ran latticedraft's own layer stack.

Where T(n) is flat in n (bfloat16 on a CPU with AMX), bigger draft trees cost little; where it
steps up (float32 at 4 rows here), the cost-aware tree stays small. docs/smollm2.md quotes it.

    .venv/bin/python benchmarks/dtype_step_cost.py [--model DIR] [--dtypes bfloat16 float32] \\
        [--out benchmarks/results/dtype_step_cost.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latticedraft.atomic import write_atomic  # noqa: E402
from latticedraft.gpu.models import hf  # noqa: E402
from latticedraft.gpu.verify.cost_model import CostModel  # noqa: E402
from latticedraft.gpu.verify.verifier import Verifier  # noqa: E402
from latticedraft.paths import smollm2_dir  # noqa: E402

NODES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


@torch.no_grad()
def hf_greedy_tokens_per_s(model, context: int, new_tokens: int) -> float:
    """Tokens/s of ``generate`` greedy writing exactly ``new_tokens`` after a random prompt."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, hf.model_vocab_size(model), (1, context), generator=g)
    mask = torch.ones_like(x)
    model.generate(x, attention_mask=mask, max_new_tokens=4, do_sample=False)
    t0 = time.perf_counter()
    model.generate(x, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    return new_tokens / (time.perf_counter() - t0)


@torch.no_grad()
def measure(model_dir: Path, dtype: str, a) -> dict:
    """One dtype's row: HF greedy's tokens/s and T(n) of the verify step."""
    model = hf.load_causal_lm(model_dir, dtype=hf.resolve_dtype(dtype))
    rate = hf_greedy_tokens_per_s(model, a.context, a.new_tokens)
    v = Verifier.for_model(model)
    cm = CostModel.measure(v, batch=1, context=a.context, grid=tuple(a.nodes), repeats=a.repeats, budget_s=a.budget)
    return {"dtype": dtype, "hf_greedy_tokens_per_s": round(rate, 1), "lean_stack": v.stack is not None,
            "nodes": list(cm.nodes), "raw_ms": [round(1000 * s, 2) for s in cm.info["raw_seconds"]],
            "fit_ms": [round(1000 * s, 2) for s in cm.seconds_at], "repeats": cm.info["repeats"],
            "context": cm.info["context"]}


def table(rows: list[dict]) -> str:
    """Markdown: one row per dtype, HF greedy's tokens/s and T(n) in ms as measured."""
    nodes = rows[0]["nodes"]
    head = "| dtype | HF greedy tokens/s | lean stack | " + " | ".join(f"T({n}) ms" for n in nodes) + " |"
    lines = [head, "|" + "---|" * (3 + len(nodes))]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['hf_greedy_tokens_per_s']:.1f} | {'yes' if r['lean_stack'] else 'no'} | "
                     + " | ".join(f"{x:.1f}" for x in r["raw_ms"]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF model directory (default: the fetched SmolLM2-135M-Instruct)")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--context", type=int, default=300, help="prompt and cache length in tokens (default 300)")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens HF greedy writes (default 64)")
    ap.add_argument("--nodes", type=int, nargs="+", default=list(NODES), help="verify call sizes n")
    ap.add_argument("--repeats", type=int, default=8, help="interleaved rounds of T(n) (default 8)")
    ap.add_argument("--budget", type=float, default=20.0, help="seconds after which T(n) stops repeating (default 20)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/dtype_step_cost.json")
    from latticedraft.quiet import add_verbose_arg, quiet_libraries

    add_verbose_arg(ap)
    a = ap.parse_args(argv)
    quiet_libraries(a.verbose)
    model_dir = Path(a.model) if a.model else smollm2_dir()
    if not (model_dir / "config.json").is_file():
        print(f"error: {model_dir} holds no model; run `latticedraft fetch smollm2` or pass --model DIR", file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    rows = [measure(model_dir, dt, a) for dt in a.dtypes]
    out = {"model": str(model_dir), "threads": a.threads, "new_tokens": a.new_tokens,
           "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine()},
           "rows": rows}
    write_atomic(Path(a.out), json.dumps(out, indent=1) + "\n")
    print(table(rows))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The cost of one step of latticedraft's loop, by part, beside transformers' ``generate``.

For each batch size (``--batch-sizes``, default 1 and 4) and the same prompts: transformers'
greedy ``generate`` (left-padded batches above 1), latticedraft's greedy loop (no drafts: one
token per row and step, like ``generate``) and the fastest measured decode (``parallel p=8 slots=3 +ctx +lm``).
Reported per step, a step being one forward over every row of the batch (``generate``: its
seconds over the tokens of its longest row, prefill included; ours: the verify calls only,
prefill excluded), in milliseconds:

    forward     the target's layers over every row's tree (``Verifier.timing["forward"]``)
    projection  the output projection and argmax at the nodes the accept walk reads
    cache       the tree layout and masks, and the KV cache commit (in place, or one gather)
    heads       the drafting heads at each row's accepted node
    walk        the accept walk's own Python
    planning    drafting: lattice search, rescoring, context and LM n-grams, the tree planner
    acceptance  after the verify call: emitting tokens, EOS/budget cuts, proposers' updates
    other       the rest of the step (the loop's and the verify call's remaining Python)

and tokens per step and per second. Median over ``--repeats`` runs after one untimed warm-up,
round-robin; wall clock, one thread, load average recorded. Every row is checked equal to
``generate``'s output.

    .venv/bin/python benchmarks/step_cost.py                          # batch 1 and 4
    .venv/bin/python benchmarks/step_cost.py --batch-sizes 1 --repeats 5 --out /tmp/step.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latticedraft.atomic import write_atomic  # noqa: E402
from latticedraft.decoding.methods.bpd import DrafterSpec  # noqa: E402
from latticedraft.decoding.eval import hf_baselines  # noqa: E402
from latticedraft.decoding.runs.loaders import encode  # noqa: E402
from latticedraft.decoding.runs.prompt_set import read_prompts  # noqa: E402
from latticedraft.decoding.runs.session import Session  # noqa: E402
from latticedraft.paths import data_dir  # noqa: E402

OURS = {"greedy loop (latticedraft)": DrafterSpec("none"),
        "parallel p=8 slots=3 +ctx +lm": DrafterSpec("parallel", nbest=8, slots=3).fast()}
PARTS = ("forward", "projection", "cache", "heads", "walk", "planning", "acceptance", "other")


def steps_of(result, batch_size: int) -> int:
    """Verify calls of a decode in batches: per batch, its longest-running row's calls - 1 (prefill)."""
    calls = [q.calls for q in result.sequences]
    return sum(max(calls[i:i + batch_size]) - 1 for i in range(0, len(calls), batch_size))


def parts(result) -> dict:
    """Seconds per part (see the module doc) from a ``DecodeResult``'s timing."""
    t = result.timing
    v = {k[len("verify."):]: x for k, x in t.items() if k.startswith("verify.")}
    out = {"forward": v.get("forward", 0.0), "projection": v.get("project", 0.0),
           "cache": v.get("tree", 0.0) + v.get("cache", 0.0), "heads": v.get("heads", 0.0),
           "walk": v.get("walk", 0.0), "planning": t.get("draft", 0.0) + t.get("lattice", 0.0),
           "acceptance": t.get("accept", 0.0)}
    out["other"] = max(result.seconds - t.get("prefill", 0.0) - sum(out.values()), 0.0)
    return out


@torch.no_grad()  # scoped: a global switch would leak into the caller (tests run main in-process)
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompts", default=str(data_dir() / "prompts.jsonl"))
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default=None, help="torch device (default cpu; e.g. cuda: the parts are then host-side "
                    "times of asynchronous work, the totals are exact)")
    ap.add_argument("--out", default="benchmarks/results/step_cost.json")
    from latticedraft.quiet import add_verbose_arg, quiet_libraries

    add_verbose_arg(ap)
    a = ap.parse_args(argv)
    quiet_libraries(a.verbose)
    s = Session(a.model, None, device=a.device, threads=a.threads)
    ids = encode(s.tokenizer, [r["prompt"] for r in read_prompts(a.prompts, limit=a.num_prompts)])
    rows_out = []
    for B in a.batch_sizes:
        for spec in OURS.values():
            s.prepare("bpd", spec, batch_size=B)

        def hf():
            if B == 1:
                return hf_baselines._one_by_one(s.model, ids, a.max_new_tokens, s.eos)
            return hf_baselines.greedy_batched(s.model, ids, a.max_new_tokens, B, s.eos)

        runs = {"generate (HF)": [], **{name: [] for name in OURS}}
        last = {}
        for rep in range(a.repeats + 1):  # round-robin; round 0 is the warm-up
            for name in runs:
                if name == "generate (HF)":
                    out, sec = hf()
                    res = None
                else:
                    t0 = time.perf_counter()
                    res = s.decode(ids, "bpd", OURS[name], max_new_tokens=a.max_new_tokens, batch_size=B)
                    out, sec = [q.tokens for q in res.sequences], time.perf_counter() - t0
                if rep:
                    runs[name].append((sec, res))
                last[name] = out
        ref = last["generate (HF)"]
        lens = [len(t) for t in ref]
        hf_steps = sum(max(lens[i:i + B]) for i in range(0, len(lens), B))
        for name, rs in runs.items():
            tokens = sum(len(t) for t in last[name])
            sec = statistics.median(r[0] for r in rs)
            row = {"batch": B, "row": name, "tokens": tokens, "seconds_median": round(sec, 4),
                   "tokens_per_s": round(tokens / sec, 1),
                   "exact": all(np.array_equal(x, y) for x, y in zip(last[name], ref))}
            if name == "generate (HF)":
                row.update(steps=hf_steps, tokens_per_step=round(tokens / hf_steps, 2),
                           ms_per_step=round(1000 * sec / hf_steps, 3))
            else:
                mid = sorted(rs, key=lambda r: r[0])[len(rs) // 2][1]  # the median run's own split
                steps = steps_of(mid, B)
                split = parts(mid)
                row.update(steps=steps, tokens_per_step=round(tokens / steps, 2),
                           ms_per_step=round(1000 * sum(split.values()) / steps, 3),
                           ms_per_step_by_part={k: round(1000 * split[k] / steps, 3) for k in PARTS})
            rows_out.append(row)
    for B in a.batch_sizes:
        rows = [r for r in rows_out if r["batch"] == B]
        base = rows[0]["tokens_per_s"]
        for r in rows:
            r["x_generate"] = round(r["tokens_per_s"] / base, 3)
    out = {"benchmark": "step_cost", "model": s.base_dir, "prompts": len(ids), "max_new_tokens": a.max_new_tokens,
           "repeats": a.repeats, "load_average": os.getloadavg(),
           "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                       "cpu_count": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                       "device": a.device or "cpu",
                       "gpu": torch.cuda.get_device_name() if str(a.device).startswith("cuda") else None},
           "rows": rows_out}
    write_atomic(Path(a.out), json.dumps(out, indent=1) + "\n")
    print(f"\n{len(ids)} prompts x {a.max_new_tokens} new tokens, median of {a.repeats}, "
          f"{out['machine']['processor']} {os.cpu_count()} CPUs, load average {out['load_average'][0]:.1f}")
    print("| batch | row | tok/s | x generate | tokens/step | ms/step | " + " | ".join(PARTS) + " | exact |")
    print("|---" * (8 + len(PARTS)) + "|")
    for r in rows_out:
        by = r.get("ms_per_step_by_part")
        cells = " | ".join(f"{by[k]:.3f}" for k in PARTS) if by else " | ".join("-" for _ in PARTS)
        print(f"| {r['batch']} | {r['row']} | {r['tokens_per_s']:.1f} | {r['x_generate']:.2f} | "
              f"{r['tokens_per_step']:.2f} | {r['ms_per_step']:.3f} | {cells} | "
              f"{'yes' if r['exact'] else 'NO'} |")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

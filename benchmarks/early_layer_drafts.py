"""Kangaroo and PPD beside greedy, BPD and lookahead on the bundled model, this CPU.

Same prompts (held-out, data/prompts.jsonl from ``--skip``) for every row, one at a time
(batch 1); rows run round-robin ``--repeats`` times after one untimed warm-up round (this VM's
speed drifts); reported: median seconds, tokens/s, tokens per target call (Kangaroo: per
deep pass; PPD: 1 by construction), speed-up over HF greedy, exactness against it. Kangaroo
also reports the early-exit acceptance rate per draft position; PPD the measured match rate
and Theorem 4.1's predicted latency and compute per token against greedy (on this CPU the
candidates run after the main pass: nothing overlaps, so the measured PPD time is greedy's
plus the candidates' cost).

    nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/early_layer_drafts.py \\
        --out benchmarks/results/self_draft.json
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
from latticedraft.decoding.methods.kangaroo import KangarooOptions, acceptance_by_position  # noqa: E402
from latticedraft.decoding.methods.lookahead import LookaheadOptions  # noqa: E402
from latticedraft.decoding.methods.ppd import PPDOptions  # noqa: E402
from latticedraft.decoding.ppd.model import predicted  # noqa: E402
from latticedraft.decoding.methods.bpd import DrafterSpec
from latticedraft.decoding.runs.session import Session
from latticedraft.decoding.runs.loaders import encode
from latticedraft.decoding.runs.prompt_set import read_prompts  # noqa: E402
from latticedraft.gpu.models.layer_split import LayerSplit  # noqa: E402
from latticedraft.paths import data_dir  # noqa: E402


@torch.no_grad()  # scoped: a global switch would leak into the caller (tests run main in-process)
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--adapter", default=None, help="Kangaroo adapter (default data/adapter-kangaroo)")
    ap.add_argument("--exit-heads", default=None, help="PPD early-exit heads for an extra row (default: data/exit-heads-ppd if built)")
    ap.add_argument("--prompts", default=str(data_dir() / "prompts.jsonl"))
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--skip", type=int, default=10, help="skip the first N prompts (default 10)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gammas", type=int, nargs="+", default=[6], help="Kangaroo rows' gamma (eta from --etas)")
    ap.add_argument("--etas", type=float, nargs="+", default=[0.6, 0.3])
    ap.add_argument("--ppd", nargs="+", default=["2,3", "3,3", "2,1"], help="PPD rows as DBAR,K")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/results/self_draft.json")
    from latticedraft.quiet import add_verbose_arg, quiet_libraries

    add_verbose_arg(ap)
    a = ap.parse_args(argv)
    quiet_libraries(a.verbose)

    s = Session(a.model, threads=a.threads)
    d = LayerSplit(s.model).num_layers
    recs = read_prompts(a.prompts)[a.skip: a.skip + a.num_prompts]
    ids = encode(s.tokenizer, [r["prompt"] for r in recs])
    built = (data_dir() / "exit-heads-ppd" / "exit_heads.json").is_file()
    heads = a.exit_heads or (str(data_dir() / "exit-heads-ppd") if built else None)
    plan = {"HF greedy": ("greedy", None), "BPD top1 (bundled heads, fast settings)": ("bpd", DrafterSpec().fast()),
            "lookahead 7,4,7+ref": ("lookahead", LookaheadOptions(7, 4, 7, prompt_as_reference=True))}
    for g in a.gammas:
        for e in a.etas:
            plan[f"Kangaroo gamma={g} eta={e}"] = ("kangaroo", KangarooOptions(g, e, a.adapter))
    for spec in a.ppd:
        dbar, k = (int(x) for x in spec.split(","))
        plan[f"PPD exit layer {dbar} k={k}"] = ("ppd", PPDOptions(dbar, k))
        if heads:
            plan[f"PPD exit layer {dbar} k={k} trained heads"] = ("ppd", PPDOptions(dbar, k, heads))
    s.prepare("bpd", DrafterSpec().fast())

    def run_once(method, opts):
        t0 = time.perf_counter()
        seqs, mode = [], None
        for p in ids:
            r = s.decode([p], method, opts, max_new_tokens=a.max_new_tokens)
            seqs += r.sequences
            mode = r.verify_mode
        return seqs, time.perf_counter() - t0, mode

    times = {n: [] for n in plan}
    last = {}
    for rep in range(a.repeats + 1):  # round 0: untimed warm-up
        for name, (method, opts) in plan.items():
            last[name] = run_once(method, opts)
            if rep:
                times[name].append(last[name][1])
    ref = [q.tokens for q in last["HF greedy"][0]]
    n_tok = sum(len(t) for t in ref)
    g_sec = statistics.median(times["HF greedy"])
    rows = []
    for name, (method, opts) in plan.items():
        seqs, _, mode = last[name]
        sec = statistics.median(times[name])
        calls = sum(q.calls for q in seqs)
        row = {"row": name, "method": method, "seconds": round(sec, 4), "tokens": n_tok,
               "tokens_per_s": round(n_tok / sec, 1), "speedup": round(g_sec / sec, 3),
               "tokens_per_call": None if method == "greedy" else round(sum(len(q.tokens) for q in seqs) / calls, 3),
               "exact": all(np.array_equal(q.tokens, r) for q, r in zip(seqs, ref)), "verify": mode}
        if method == "kangaroo":
            row["acceptance_per_position"] = acceptance_by_position(seqs)
            row["drafted_per_step"] = round(float(np.mean([n - 1 for q in seqs for n in q.tree_nodes])), 3)
        if method == "ppd":
            row["predicted"] = predicted(seqs, d, opts.dbar, opts.k)
        rows.append(row)
    report = {"model": s.base_dir, "d": d, "prompts": len(ids), "skip": a.skip, "max_new_tokens": a.max_new_tokens,
              "repeats": a.repeats, "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
              "cpu_count": os.cpu_count(), "loadavg": os.getloadavg(), "torch": torch.__version__, "rows": rows}
    write_atomic(Path(a.out), json.dumps(report, indent=1) + "\n")
    print(f"bundled model ({d} layers), {len(ids)} held-out prompts x {a.max_new_tokens} tokens, batch 1, median of "
          f"{a.repeats} round-robin repeats, load average {report['loadavg'][0]:.1f}\n")
    print("| row | tokens/call | tokens/s | vs HF greedy | exact | notes |\n|---|---|---|---|---|---|")
    for r in rows:
        tpc = "-" if r["tokens_per_call"] is None else f"{r['tokens_per_call']:.2f}"
        note = ""
        if "acceptance_per_position" in r:
            note = f"{r['drafted_per_step']:.2f} drafts/step; acceptance by position " + \
                   " ".join(f"{x:.2f}" for x in r["acceptance_per_position"])
        if "predicted" in r:
            p = r["predicted"]
            note = (f"p_correct {p['p_correct']:.3f}; Thm 4.1 latency {p['latency_vs_greedy']:.3f}x, "
                    f"compute {p['compute_vs_greedy']:.3f}x greedy")
        print(f"| {r['row']} | {tpc} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | "
              f"{'yes' if r['exact'] else 'NO'} | {note} |")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

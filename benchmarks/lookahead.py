"""Lookahead decoding vs transformers' greedy ``generate`` and prompt-lookup decoding.

Same model (the bundled one by default) and prompts for every row; prompts one at a time;
rows run round-robin ``--repeats`` times after one untimed warm-up round; reported: median
seconds, tokens/s, tokens per target call, speed-up over HF greedy, whether the output equals
greedy's, and the verify mode. Rows: HF greedy, HF prompt lookup, and lookahead for each
``--configs`` entry ``W,N,G`` (``+ref``: with --prompt-as-reference), plus the setting of a
``tune --method lookahead`` result with ``--lookahead-config``. ``--skip`` starts after the
tuner's prompt split, so a tuned setting is measured on prompts it was not chosen on.

    nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/lookahead.py \\
        --out benchmarks/results/lookahead.json
    nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/lookahead.py --skip 10 \
        --lookahead-config tuned-lookahead.json --configs 15,5,15 --out benchmarks/results/lookahead_tuned.json
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
from latticedraft.decoding.eval import hf_baselines  # noqa: E402
from latticedraft.decoding.methods.greedy import greedy_decode  # noqa: E402
from latticedraft.decoding.methods.lookahead import lookahead_decode  # noqa: E402
from latticedraft.decoding.runs.session import Session
from latticedraft.decoding.runs.loaders import encode
from latticedraft.decoding.runs.prompt_set import read_prompts  # noqa: E402
from latticedraft.paths import data_dir  # noqa: E402

CONFIGS = ("15,5,15", "15,5,15+ref", "7,4,7+ref", "5,3,5+ref", "3,3,3+ref", "1,2,0")


def _parse(cfg: str) -> tuple[int, int, int, bool]:
    ref = cfg.endswith("+ref")
    W, N, G = (int(x) for x in cfg.removesuffix("+ref").split(","))
    return W, N, G, ref


@torch.no_grad()  # scoped: a global switch would leak into the caller (tests run main in-process)
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompts", default=str(data_dir() / "prompts.jsonl"))
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--skip", type=int, default=0, help="skip the first N prompts (the tuning split; default 0)")
    ap.add_argument("--lookahead-config", default=None, help="add the (W, N, G) row of a `tune --method lookahead` file")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), help="W,N,G or W,N,G+ref per lookahead row")
    ap.add_argument("--pld-tokens", type=int, default=10, help="prompt_lookup_num_tokens (default 10)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--out", default="benchmarks/results/lookahead.json")
    from latticedraft.quiet import add_verbose_arg, quiet_libraries

    add_verbose_arg(ap)
    a = ap.parse_args(argv)
    quiet_libraries(a.verbose)

    s = Session(a.model, None, None, None, None, a.threads)
    recs = read_prompts(a.prompts)[a.skip : a.skip + a.num_prompts]
    if a.lookahead_config:
        from latticedraft.decoding.methods.lookahead import read_lookahead_config

        c = read_lookahead_config(a.lookahead_config)
        a.configs = a.configs + [f"{c['W']},{c['N']},{c['G']}" + ("+ref" if c["prompt_as_reference"] else "")]
    ids = encode(s.tokenizer, [r["prompt"] for r in recs])
    rows = ["HF greedy", f"HF prompt lookup ({a.pld_tokens})"] + [f"lookahead {c}" for c in a.configs]

    def run_once(name):
        """(token lists, seconds, target calls or None, verify mode) of one pass over the prompts."""
        if name == "HF greedy":
            r = greedy_decode(s.model, ids, max_new_tokens=a.max_new_tokens, eos_token_id=s.eos)
            return [q.tokens for q in r.sequences], r.seconds, None, "generate"
        if name.startswith("HF prompt lookup"):
            toks, dt = hf_baselines.prompt_lookup(s.model, ids, a.max_new_tokens, a.pld_tokens, s.eos)
            return toks, dt, None, "generate"
        W, N, G, ref = _parse(name.split()[1])
        t0 = time.perf_counter()
        toks, calls, mode = [], 0, None
        for p in ids:
            r = lookahead_decode(s.model, [p], W=W, N=N, G=G, prompt_as_reference=ref,
                                 max_new_tokens=a.max_new_tokens, eos_token_id=s.eos)
            toks.append(r.sequences[0].tokens)
            calls += r.calls
            mode = r.verify_mode
        return toks, time.perf_counter() - t0, calls, mode

    times = {n: [] for n in rows}
    last = {}
    for rep in range(a.repeats + 1):  # round 0: untimed warm-up
        for name in rows:
            out = run_once(name)
            last[name] = out
            if rep:
                times[name].append(out[1])
    ref_toks = last["HF greedy"][0]
    n_tok = sum(len(t) for t in ref_toks)
    g_sec = statistics.median(times["HF greedy"])
    results = []
    for name in rows:
        toks, _, calls, mode = last[name]
        sec = statistics.median(times[name])
        results.append({
            "row": name, "seconds": round(sec, 4), "tokens": int(sum(len(t) for t in toks)),
            "tokens_per_s": round(n_tok / sec, 1), "speedup": round(g_sec / sec, 3),
            "tokens_per_call": None if calls is None else round(sum(len(t) for t in toks) / calls, 3),
            "exact": all(np.array_equal(x, y) for x, y in zip(toks, ref_toks)), "verify": mode,
        })
    report = {"model": s.base_dir, "prompts": len(ids), "skip": a.skip, "lookahead_config": a.lookahead_config, "max_new_tokens": a.max_new_tokens, "repeats": a.repeats,
              "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
              "cpu_count": os.cpu_count(), "loadavg": os.getloadavg(), "torch": torch.__version__, "rows": results}
    write_atomic(Path(a.out), json.dumps(report, indent=1) + "\n")
    print("| row | tokens/call | tokens/s | vs HF greedy | exact |\n|---|---|---|---|---|")
    for r in results:
        tpc = "-" if r["tokens_per_call"] is None else f"{r['tokens_per_call']:.2f}"
        print(f"| {r['row']} | {tpc} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | {'yes' if r['exact'] else 'NO'} |")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Decoding speed: HF greedy, latticedraft's BPD rows, and what a user would run instead.

Rows: transformers' greedy ``generate`` (the baseline), latticedraft's own greedy loop on the
same forward as BPD (so the BPD rows' gain over it is the algorithmic gain alone), context
n-grams alone, the fast BPD configurations (``DrafterSpec.fast``: cost-aware tree, context
n-grams, reduced draft vocabulary) with and without context n-grams, the paper's drafters as
published, the bundled draft model (``--draft-model``) drafting for our loop, and transformers'
prompt-lookup and assisted decoding with the same draft model (batch 1 only; with
``--batch-size`` HF's left-padded batched greedy is the reference instead).

Same model and prompts for every method; the methods run round-robin ``--repeats`` times
after one untimed warm-up round, prompts one at a time (batch 1) unless ``--batch-size``;
the load average is recorded (other processes on a shared CPU skew absolute numbers); reported:
median seconds, tokens/s, block efficiency (tokens per target call), speed-up over greedy,
whether the output equals greedy's, and the time per BPD step split into model (target
forward), lattice (top-k + pruning), drafting (rescoring) and accept (bookkeeping).

    .venv/bin/python benchmarks/decode.py                       # bundled model, 8 held-out prompts
    .venv/bin/python benchmarks/decode.py --num-prompts 16 --max-new-tokens 96 --out decode.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latticedraft.atomic import write_atomic  # noqa: E402
from latticedraft.cli import decode_options  # noqa: E402
from latticedraft.decoding.eval import hf_baselines  # noqa: E402
from latticedraft.decoding.methods.bpd import DrafterSpec
from latticedraft.decoding.runs.session import Session
from latticedraft.decoding.runs.loaders import encode
from latticedraft.decoding.runs.prompt_set import read_prompts  # noqa: E402
from latticedraft.paths import data_dir  # noqa: E402

HEADS = DrafterSpec("parallel-base", nbest=8, slots=3, tree="auto", draft_vocab="auto")  # heads only, fast
DEFAULT_ROW = "bpd top1 +ctx +lm"  # what `latticedraft decode` runs with no options: "(default)" in the tables
RENAMED = {"bpd parallel p=8 slots=3 +ctx +lm (default)": "bpd parallel p=8 slots=3 +ctx +lm"}  # earlier runs' names
DRAFTERS = {
    # the fastest measured configuration
    "bpd parallel p=8 slots=3 +ctx +lm": DrafterSpec("parallel", nbest=8, slots=3).fast(),
    "bpd parallel p=8 slots=3 +ctx (no LM drafts)": replace(DrafterSpec("parallel", nbest=8, slots=3).fast(),
                                                            lm_drafts=0),
    "bpd parallel-base p=8 slots=3 +ctx +lm": DrafterSpec("parallel-base", nbest=8, slots=3).fast(),
    DEFAULT_ROW: decode_options()[1],  # the CLI's default (DrafterSpec.fast on --drafter top1)
    # heads only: no context n-grams
    "bpd parallel-base p=8 slots=3 (heads only)": HEADS,
    "bpd parallel-base p=8 slots=3 full vocab": DrafterSpec("parallel-base", nbest=8, slots=3, tree="auto"),
    "bpd parallel-base p=8 slots=3 tree fixed": DrafterSpec("parallel-base", nbest=8, slots=3, draft_vocab="auto"),
    "bpd top1 slots=3 (heads only)": DrafterSpec("top1", slots=3, tree="auto", draft_vocab="auto"),
    # the paper's drafters as published (tree fixed, full vocabulary, no context n-grams)
    "bpd top1 (paper)": DrafterSpec("top1"),
    "bpd parallel p=4 slots=3 (paper)": DrafterSpec("parallel", nbest=4, slots=3),
    # the bundled draft model (data/rescorer-medium, distilled from the base) drafting 4 tokens a call
    "draft model gamma=4 (latticedraft, rescorer-medium)": DrafterSpec("model", gamma=4),
}
OWN = {  # latticedraft's own loop on the same forward as BPD, without head drafts (--drafter none)
    "greedy loop (latticedraft)": DrafterSpec("none"),
    "context + LM n-grams (latticedraft)": DrafterSpec("none").fast(),
    "context n-grams only (latticedraft)": replace(DrafterSpec("none").fast(), lm_drafts=0),
}
HF_ROWS = ("prompt-lookup (HF)", "assisted (HF, rescorer-medium drafts)")


@torch.no_grad()  # scoped: a global switch would leak into the caller (tests run main in-process)
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--lm", default=None)
    ap.add_argument("--rescorer", default=None)
    ap.add_argument("--draft-model", default=str(data_dir() / "rescorer-medium"),
                    help="draft model of the draft-model rows, ours and HF assisted (default data/rescorer-medium)")
    ap.add_argument("--prompts", default=str(data_dir() / "prompts.jsonl"))
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--alpha", type=float, default=None,
                    help="the n-gram LM's weight (default: the model's tuned.json, as the demo takes it; else 1.0)")
    ap.add_argument("--pld-tokens", type=int, default=10, help="prompt_lookup_num_tokens (default 10)")
    ap.add_argument("--only", nargs="+", default=None, help="run only these rows (earlier runs' names accepted)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--out", default="benchmarks/results/decode.json")
    from latticedraft.quiet import add_verbose_arg, quiet_libraries

    add_verbose_arg(ap)
    a = ap.parse_args(argv)
    quiet_libraries(a.verbose)

    s = Session(a.model, None, a.lm, a.rescorer, a.device, a.threads, a.draft_model)
    if a.alpha is None:
        from latticedraft.decoding.eval.tune import default_alphas_file, read_alphas

        tuned = default_alphas_file(s.model_dir)
        a.alpha = read_alphas(tuned).get("ngram", 1.0) if tuned else 1.0
    recs = read_prompts(a.prompts, limit=a.num_prompts)
    ids = encode(s.tokenizer, [r["prompt"] for r in recs])
    rows = ["greedy", *OWN, *DRAFTERS, *HF_ROWS]
    if a.batch_size > 1:  # BPD rows then decode batches; compare with HF's batched greedy too
        rows.insert(1, f"greedy batch={a.batch_size} (HF, left-padded)")
        rows = [r for r in rows if r not in HF_ROWS]  # transformers' PLD and assisted decoding take batch 1 only
    if a.only:
        only = {RENAMED.get(r, r) for r in a.only}
        rows = [r for r in rows if r in only or r.startswith("greedy")]
    helper = s.draft_model
    for name in rows:  # cost curves and acceptance rates are measured once and cached, before any timing
        spec = DRAFTERS.get(name) or OWN.get(name)
        if spec is not None:
            s.prepare("bpd", spec, batch_size=a.batch_size)

    def run_once(name):
        """(token lists, seconds, DecodeResult or None) of one pass over the prompts."""
        if name == HF_ROWS[0]:
            toks, dt = hf_baselines.prompt_lookup(s.model, ids, a.max_new_tokens, a.pld_tokens, s.eos)
            return toks, dt, None
        if name == HF_ROWS[1]:
            toks, dt = hf_baselines.assisted(s.model, helper, ids, a.max_new_tokens, s.eos)
            return toks, dt, None
        if name.startswith("greedy batch="):
            toks, dt = hf_baselines.greedy_batched(s.model, ids, a.max_new_tokens, a.batch_size, s.eos)
            return toks, dt, None
        spec = None if name == "greedy" else DrafterSpec(**{**{**DRAFTERS, **OWN}[name].__dict__, "alpha": a.alpha})
        t0 = time.perf_counter()
        res = s.decode(ids, "greedy" if spec is None else "bpd", spec, max_new_tokens=a.max_new_tokens,
                       batch_size=a.batch_size)
        return [q.tokens for q in res.sequences], time.perf_counter() - t0, res

    # Round-robin over the methods, so that load from other processes hits every method alike;
    # the first round is the untimed warm-up (numba compilation, first calls).
    times = {n: [] for n in rows}
    last = {}
    for rep in range(a.repeats + 1):
        for name in rows:
            toks, dt, res = run_once(name)
            if rep:
                times[name].append(dt)
            last[name] = (toks, res)
        print(f"round {rep}/{a.repeats} done", file=sys.stderr)
    results, greedy_tokens = [], last["greedy"][0]
    for name in rows:
        toks, res = last[name]
        n_tok = sum(len(t) for t in toks)
        med = statistics.median(times[name])
        row = {"name": name, "seconds_median": round(med, 4), "seconds": [round(t, 4) for t in times[name]],
               "tokens": n_tok, "tokens_per_s": round(n_tok / med, 2),
               "exact": all(np.array_equal(x, y) for x, y in zip(toks, greedy_tokens))}
        if res is not None and name != "greedy":
            steps = res.calls - len(res.sequences)
            nodes = [n for q in res.sequences for n in q.tree_nodes]
            row.update(block_efficiency=round(res.block_efficiency, 4), calls=res.calls, verify=res.verify_mode,
                       ms_per_step={k: round(1000 * v / max(steps, 1), 3) for k, v in res.timing.items()},
                       tree_nodes_mean=round(float(np.mean(nodes)), 2) if nodes else None,
                       tree_nodes_hist={int(k): int(v) for k, v in zip(*np.unique(nodes, return_counts=True))})
        elif name == "greedy":
            row.update(block_efficiency=1.0, calls=n_tok, ms_per_token=round(1000 * med / n_tok, 3))
        results.append(row)
    g = results[0]["tokens_per_s"]
    by_name = {r["name"]: r["tokens_per_s"] for r in results}
    for r in results:
        r["speedup_vs_greedy"] = round(r["tokens_per_s"] / g, 3)
        for key, ref in (("vs_own_greedy_loop", "greedy loop (latticedraft)"), ("vs_prompt_lookup", HF_ROWS[0]),
                         ("vs_batched_greedy", f"greedy batch={a.batch_size} (HF, left-padded)")):
            if ref in by_name:
                r[key] = round(r["tokens_per_s"] / by_name[ref], 3)
    out = {"benchmark": "decode", "model": s.base_dir, "load_average": os.getloadavg(), "prompts": len(ids), "max_new_tokens": a.max_new_tokens,
           "repeats": a.repeats, "batch_size": a.batch_size, "alpha": a.alpha, "cli_default": DEFAULT_ROW,
           "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                       "cpu_count": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                       "device": a.device or "cpu",
                       "gpu": torch.cuda.get_device_name() if str(a.device).startswith("cuda") else None},
           "rows": results}
    write_atomic(Path(a.out), json.dumps(out, indent=1) + "\n")
    print(f"\n{len(ids)} prompts x {a.max_new_tokens} new tokens, median of {a.repeats}, "
          f"{out['machine']['processor']} {os.cpu_count()} CPUs, model {s.base_dir}")
    ref = "vs_prompt_lookup" if a.batch_size == 1 else "vs_batched_greedy"
    print(f"{'method':<46} {'tok/s':>7} {'x greedy':>8} {'x ' + ref[3:10]:>9} {'blk eff':>7} {'nodes':>5} "
          f"{'exact':>5}   ms/step: model lattice draft accept")
    for r in results:
        ms = r.get("ms_per_step")
        split = "  ".join(f"{ms[k]:.2f}" for k in ("model", "lattice", "draft", "accept")) if ms else ""
        be, nodes, x = r.get("block_efficiency"), r.get("tree_nodes_mean"), r.get(ref)
        print(f"{r['name']:<46} {r['tokens_per_s']:>7.1f} {r['speedup_vs_greedy']:>8.2f} "
              f"{(f'{x:.2f}' if x else '-'):>9} {(f'{be:.2f}' if be else '-'):>7} {(f'{nodes:.1f}' if nodes else '-'):>5} "
              f"{('yes' if r['exact'] else 'NO'):>5}   {split}")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark DynaMo sampling: time per sampler step, and generation speed against base top-k sampling.

Measures, on the bundled DynaMo-headed model (or ``--model``):

1. the sampler's own cost per step (Algorithm 1 on one row's head logits: warp, joint, mask,
   thresholds, penalty, back-off), per variant and ε_b, median over real logits of the prompts;
2. generation: tokens per model call, tokens/s and seconds for DynaMo (KV-cached, batched) at
   several ε_b, against the base model's ordinary top-k sampling (``transformers`` ``generate``
   with its KV cache) on the same prompts, median of ``--repeats`` runs.

Writes JSON (``--out``, default ``benchmarks/results/dynamo.json``) and prints a table.
Run: ``.venv/bin/python benchmarks/dynamo.py [--prompts 8 --max-new-tokens 48 --repeats 3]``.
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

from latticedraft.atomic import write_atomic
from latticedraft.decoding.dynamo.config import VARIANTS, DynamoConfig, variant
from latticedraft.decoding.dynamo.evaluate import sample_base
from latticedraft.decoding.dynamo.generate import generate
from latticedraft.decoding.dynamo.sampler import step_distribution
from latticedraft.decoding.runs.prompt_set import read_prompts
from latticedraft.decoding.runs.session import Session
from latticedraft.lm.cooccurrence import resolve_table
from latticedraft.lm.tokenizer import fingerprint
from latticedraft.paths import data_dir


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="DynaMo head checkpoint (default data/heads-dynamo)")
    ap.add_argument("--prompts", type=int, default=8, help="number of prompts from data/prompts.jsonl")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epsilons", type=float, nargs="+", default=[0.0, 0.3, 0.5, 1.0])
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/dynamo.json"))
    from latticedraft.quiet import add_verbose_arg, quiet_libraries

    add_verbose_arg(ap)
    a = ap.parse_args(argv)
    quiet_libraries(a.verbose)
    if a.threads:
        torch.set_num_threads(a.threads)

    session = Session(a.model or data_dir() / "heads-dynamo", threads=None)
    model, tok = session.model, session.tokenizer
    cooc = resolve_table("auto", tok, notify=lambda m: print(m, file=sys.stderr))
    fp = fingerprint(tok)
    eos = session.eos
    prompts = [tok.encode(r["prompt"]).ids for r in read_prompts(data_dir() / "prompts.jsonl", a.prompts)]

    # 1. sampler step cost on real head logits (the last position of each prompt)
    with torch.no_grad():
        logits = [model(input_ids=torch.tensor([p]), heads=True).head_logits[0, -1].double().numpy() for p in prompts]
    steps = []
    for v in VARIANTS:
        for e in a.epsilons:
            cfg = variant(v, e)
            times, ns = [], []
            for _ in range(a.repeats):
                for lg, p in zip(logits, prompts):
                    t0 = time.perf_counter()
                    ns.append(step_distribution(lg, p, cfg, cooc).n)
                    times.append(time.perf_counter() - t0)
            steps.append({"variant": v, "epsilon_b": e, "median_ms": 1000 * statistics.median(times),
                          "mean_n": float(np.mean(ns))})

    # 2. generation speed
    gens = []
    for e in a.epsilons:
        cfg = variant("CO+AT+G3", e)
        runs = []
        for rep in range(a.repeats):
            t0 = time.perf_counter()
            res = generate(model, prompts, cfg, cooc, max_new_tokens=a.max_new_tokens, seed=rep, eos_token_id=eos,
                           tokenizer_fingerprint=fp)
            dt = time.perf_counter() - t0
            runs.append((dt, res.tokens, res.block_efficiency))
        gens.append({"method": f"dynamo CO+AT+G3 ε_b={e}", "seconds": statistics.median(r[0] for r in runs),
                     "tokens_per_s": statistics.median(r[1] / r[0] for r in runs),
                     "tokens_per_call": statistics.median(r[2] for r in runs)})
    runs = []
    for rep in range(a.repeats):
        t0 = time.perf_counter()
        out = sample_base(model.base, prompts, DynamoConfig(), a.max_new_tokens, rep, eos)
        dt = time.perf_counter() - t0
        runs.append((dt, sum(len(g) for g in out)))
    gens.append({"method": "base top-k (transformers generate)", "seconds": statistics.median(r[0] for r in runs),
                 "tokens_per_s": statistics.median(r[1] / r[0] for r in runs), "tokens_per_call": 1.0})

    result = {"model": str(a.model or data_dir() / "heads-dynamo"), "prompts": len(prompts),
              "max_new_tokens": a.max_new_tokens, "repeats": a.repeats, "sampler_steps": steps, "generation": gens,
              "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                          "torch_threads": torch.get_num_threads(), "python": platform.python_version()}}
    write_atomic(a.out, json.dumps(result, indent=2))

    print(f"machine: {result['machine']['platform']}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}")
    print("\nsampler step (one row, V=%d, k=50), median ms and mean n:" % logits[0].shape[-1])
    print(f"{'variant':<14}" + "".join(f"  ε_b={e:<4} ms / n " for e in a.epsilons))
    for v in VARIANTS:
        cells = [s for s in steps if s["variant"] == v]
        print(f"{v:<14}" + "".join(f"  {s['median_ms']:8.2f} / {s['mean_n']:.2f}" for s in cells))
    print(f"\ngeneration ({len(prompts)} prompts × {a.max_new_tokens} tokens, batched; median of {a.repeats}):")
    print(f"{'method':<38} {'tokens/call':>11} {'tokens/s':>9} {'seconds':>8}")
    for g in gens:
        print(f"{g['method']:<38} {g['tokens_per_call']:>11.2f} {g['tokens_per_s']:>9.1f} {g['seconds']:>8.2f}")
    print(f"\nwrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Sampling decoders on the bundled model: tokens per target call, tokens/s and the target's
perplexity of what they sample, at each temperature.

Rows (all at the same temperature, top-k 50 / top-p 1.0, generate's defaults, unless noted):
HF ``generate(do_sample=True)``; HF assisted generation with ``--draft-model`` (sampling);
our lossless sampling (the run's Gumbel noise shared by drafts and verification,
``accept/sampling.py``): what ``decode --do-sample`` runs by default, the heads (top1), the draft
model (gamma 4) and the 4 best paths of the heads' perturbed lattice (parallel-base); MTAD (approximate; the paper's top-20 / top-p 0.9
warping, gamma 4, 8 beams) at tau 0.1 and 0.5; DynaMo (approximate; its own defaults, this
temperature). Prompts one at a time (the first ``--num-prompts`` of data/prompts.jsonl, as
benchmarks/decode.py); rows round-robin ``--repeats`` times after an untimed warm-up round;
seconds are medians. Target calls of HF rows are counted with a forward hook on the target.
Perplexity: exp(mean NLL) of the sampled tokens under the target's raw distribution (T = 1).

    nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sampling.py
"""

from __future__ import annotations

import argparse
import json
import math
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
from latticedraft.decoding.methods.mtad import MtadOptions  # noqa: E402
from latticedraft.decoding.methods.bpd import DrafterSpec
from latticedraft.decoding.runs.session import Session
from latticedraft.decoding.runs.loaders import encode
from latticedraft.decoding.rows import cut_at_end  # noqa: E402
from latticedraft.decoding.eval import hf_baselines  # noqa: E402
from latticedraft.decoding.runs.prompt_set import read_prompts  # noqa: E402
from latticedraft.decoding.accept.sampling import SamplingOptions  # noqa: E402
from latticedraft.paths import data_dir  # noqa: E402

ROWS = ("HF generate(do_sample)", "HF assisted (draft model)", "ours: default (CLI)", "ours: heads (top1)",
        "ours: draft model", "ours: tree (4 head paths)", "MTAD tau=0.1", "MTAD tau=0.5", "DynaMo")


@torch.inference_mode()
def perplexity(base, prompts, outs) -> float:
    """The target's perplexity of the sampled tokens given their prompts (raw logits, T = 1)."""
    nll, n = 0.0, 0
    for p, o in zip(prompts, outs):
        if len(o) == 0:
            continue
        ids = torch.as_tensor(np.concatenate([p, o])[None], device=base.device)
        logp = torch.log_softmax(base(ids).logits[0, len(p) - 1 : -1].double().cpu(), dim=-1)
        nll -= float(logp[torch.arange(len(o)), torch.as_tensor(o)].sum())
        n += len(o)
    return math.exp(nll / max(n, 1))


@torch.no_grad()  # scoped: a global switch would leak into the caller (tests run main in-process)
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="heads checkpoint (default data/heads-stern; its base is the target)")
    ap.add_argument("--draft-model", default=str(data_dir() / "rescorer-medium"))
    ap.add_argument("--dynamo-model", default=None, help="DynaMo heads (default data/heads-dynamo)")
    ap.add_argument("--prompts", default=str(data_dir() / "prompts.jsonl"))
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS, metavar="ROW")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default=None, help="torch device (default cpu; e.g. cuda)")
    ap.add_argument("--out", default="benchmarks/results/sampling.json")
    from latticedraft.quiet import add_verbose_arg, quiet_libraries

    add_verbose_arg(ap)
    a = ap.parse_args(argv)
    quiet_libraries(a.verbose)

    s = Session(a.model, None, None, None, a.device, a.threads, a.draft_model)
    base = getattr(s.model, "base", s.model)
    texts = [r["prompt"] for r in read_prompts(a.prompts, limit=a.num_prompts)]
    ids = encode(s.tokenizer, texts)
    draft = s.draft_model
    target_calls = hf_baselines.CallCounter(base)
    dyn = None
    if "DynaMo" in a.rows:
        from latticedraft.lm.cooccurrence import resolve_table

        dmodel = Session(a.dynamo_model or data_dir() / "heads-dynamo", None, device=a.device, threads=a.threads).model
        dyn = (dmodel, resolve_table("auto", s.tokenizer, notify=lambda m: print(m, file=sys.stderr)))

    def hf(T, assistant=None):
        outs, calls = [], 0
        for i, p in enumerate(ids):
            torch.manual_seed(a.seed * 100003 + i)
            x = torch.as_tensor(p[None], device=base.device)
            before = target_calls.n
            kw = {} if assistant is None else {"assistant_model": assistant}
            g = base.generate(x, attention_mask=torch.ones_like(x), do_sample=True, temperature=T, top_k=50, top_p=1.0,
                              max_new_tokens=a.max_new_tokens, eos_token_id=s.eos, pad_token_id=0, **kw)
            o = cut_at_end(g[0, x.shape[1]:].tolist(), s.eos)
            outs.append(o)
            calls += target_calls.n - before
        return outs, calls

    def ours(T, row):
        smp = SamplingOptions(temperature=T, top_k=50, top_p=1.0, seed=a.seed)
        if row.startswith("MTAD"):
            tau = float(row.split("=")[1])
            smp = SamplingOptions(temperature=T, top_k=20, top_p=0.9, seed=a.seed)
            kw = dict(method="mtad", options=MtadOptions(tau=tau))
        elif row == "ours: draft model":
            kw = dict(method="bpd", options=DrafterSpec(name="model", gamma=4))
        elif row == "ours: default (CLI)":  # what `decode --do-sample` runs: the fast tree, n-grams and gate
            kw = dict(method="bpd", options=None)
        elif row == "ours: heads (top1)":
            kw = dict(method="bpd", options=DrafterSpec(name="top1", draft_vocab="auto"))
        else:
            kw = dict(method="bpd", options=DrafterSpec(name="parallel-base", nbest=4, draft_vocab="auto"))
        outs, calls = [], 0
        for i, p in enumerate(ids):
            r = s.decode([p], max_new_tokens=a.max_new_tokens, sampling=smp, first_row=i, **kw)
            outs.append(r.sequences[0].tokens)
            calls += r.calls
        return outs, calls

    def dynamo_row(T):
        from latticedraft.decoding.dynamo.config import DynamoConfig
        from latticedraft.decoding.dynamo.generate import generate

        res = generate(dyn[0], [p.tolist() for p in ids], DynamoConfig(temperature=T), dyn[1],
                       max_new_tokens=a.max_new_tokens, seed=a.seed, eos_token_id=s.eos)
        return [q.tokens for q in res.sequences], res.calls

    def run_once(T, row):
        t0 = time.perf_counter()
        if row == "HF generate(do_sample)":
            outs, calls = hf(T)
        elif row == "HF assisted (draft model)":
            outs, calls = hf(T, draft)
        elif row == "DynaMo":
            outs, calls = dynamo_row(T)
        else:
            outs, calls = ours(T, row)
        return outs, calls, time.perf_counter() - t0

    configs = [(T, r) for T in a.temperatures for r in a.rows]
    times = {c: [] for c in configs}
    last = {}
    for rep in range(a.repeats + 1):  # round 0: untimed warm-up
        for c in configs:
            last[c] = run_once(*c)
            if rep:
                times[c].append(last[c][2])
            print(f"round {rep} T={c[0]} {c[1]}: {last[c][2]:.1f} s", file=sys.stderr, flush=True)
    results = []
    for (T, row) in configs:
        outs, calls, _ = last[(T, row)]
        n = int(sum(len(o) for o in outs))
        sec = statistics.median(times[(T, row)])
        results.append({"temperature": T, "row": row, "tokens": n, "target_calls": int(calls),
                        "tokens_per_call": round(n / max(calls, 1), 3), "seconds": round(sec, 3),
                        "tokens_per_s": round(n / sec, 1), "perplexity": round(perplexity(base, ids, outs), 3),
                        "exact_distribution": not (row.startswith("MTAD") or row == "DynaMo")})
    report = {"benchmark": "sampling", "model": s.base_dir, "draft_model": a.draft_model, "prompts": len(ids),
              "max_new_tokens": a.max_new_tokens, "repeats": a.repeats, "seed": a.seed,
              "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
              "cpu_count": os.cpu_count(), "load_average": os.getloadavg(), "torch": torch.__version__,
              "device": str(base.device), "gpu": torch.cuda.get_device_name() if base.device.type == "cuda" else None,
              "rows": results}
    write_atomic(Path(a.out), json.dumps(report, indent=1) + "\n")
    print(f"\n{len(ids)} prompts x {a.max_new_tokens} new tokens, median of {a.repeats}, load average "
          f"{report['load_average'][0]:.1f}")
    print("| T | row | tokens/target call | tokens/s | target PPL | output distribution |\n|---|---|---|---|---|---|")
    for r in results:
        kind = "target's (lossless)" if r["exact_distribution"] else "approximate"
        if r["row"].startswith("HF"):
            kind = "target's"
        print(f"| {r['temperature']} | {r['row']} | {r['tokens_per_call']:.2f} | {r['tokens_per_s']:.1f} | "
              f"{r['perplexity']:.2f} | {kind} |")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

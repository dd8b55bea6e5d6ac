"""Decoding speed: greedy, BPD with each drafter, and transformers' prompt-lookup decoding.

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
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latticedraft.atomic import write_atomic  # noqa: E402
from latticedraft.decoding.run import DrafterSpec, Session, encode, read_prompts  # noqa: E402
from latticedraft.paths import data_dir  # noqa: E402

DRAFTERS = {
    "bpd top1": DrafterSpec("top1"),
    "bpd parallel-base p=4": DrafterSpec("parallel-base", nbest=4),
    "bpd parallel-base p=16": DrafterSpec("parallel-base", nbest=16),
    "bpd ngram": DrafterSpec("ngram"),
    "bpd parallel p=4": DrafterSpec("parallel", nbest=4),
    "bpd parallel p=16": DrafterSpec("parallel", nbest=16),
    "bpd neural": DrafterSpec("neural"),
    "bpd top1 slots=3": DrafterSpec("top1", slots=3),
    "bpd parallel p=4 slots=3": DrafterSpec("parallel", nbest=4, slots=3),
}


def prompt_lookup(session: Session, ids, max_new_tokens: int, num_tokens: int):
    """transformers' prompt-lookup decoding on the base model; returns (token lists, seconds)."""
    base = getattr(session.model, "base", session.model)
    out, t0 = [], time.perf_counter()
    for p in ids:
        x = torch.as_tensor(p[None])
        g = base.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new_tokens,
                          prompt_lookup_num_tokens=num_tokens, eos_token_id=session.eos, pad_token_id=0,
                          temperature=None, top_p=None, top_k=None)
        toks = g[0, len(p):].tolist()
        if session.eos in toks:
            toks = toks[: toks.index(session.eos) + 1]
        out.append(np.asarray(toks, dtype=np.int64))
    return out, time.perf_counter() - t0


def greedy_batched(session: Session, ids, max_new_tokens: int, batch_size: int):
    """transformers' greedy ``generate`` on left-padded batches (the batched baseline)."""
    base = getattr(session.model, "base", session.model)
    out, t0 = [], time.perf_counter()
    for s in range(0, len(ids), batch_size):
        chunk = ids[s : s + batch_size]
        n = max(len(p) for p in chunk)
        x = torch.zeros(len(chunk), n, dtype=torch.long)
        mask = torch.zeros_like(x)
        for i, p in enumerate(chunk):
            x[i, n - len(p):] = torch.as_tensor(p)
            mask[i, n - len(p):] = 1
        g = base.generate(x, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                          eos_token_id=session.eos, pad_token_id=0, temperature=None, top_p=None, top_k=None)
        for i in range(len(chunk)):
            toks = g[i, n:].tolist()
            if session.eos in toks:
                toks = toks[: toks.index(session.eos) + 1]
            out.append(np.asarray(toks, dtype=np.int64))
    return out, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--lm", default=None)
    ap.add_argument("--rescorer", default=None)
    ap.add_argument("--prompts", default=str(data_dir() / "prompts.jsonl"))
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--pld-tokens", type=int, default=10, help="prompt_lookup_num_tokens (default 10)")
    ap.add_argument("--only", nargs="+", default=None, help="run only these rows")
    ap.add_argument("--device", default=None)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--out", default="benchmarks/results/decode.json")
    a = ap.parse_args(argv)

    torch.set_grad_enabled(False)
    s = Session(a.model, None, a.lm, a.rescorer, a.device, a.threads)
    recs = read_prompts(a.prompts, limit=a.num_prompts)
    ids = encode(s.tokenizer, [r["prompt"] for r in recs])
    rows = ["greedy", *DRAFTERS, "prompt-lookup (HF)"]
    if a.batch_size > 1:  # BPD rows then decode batches; compare with HF's batched greedy too
        rows.insert(1, f"greedy batch={a.batch_size} (HF, left-padded)")
    if a.only:
        rows = [r for r in rows if r in a.only or r.startswith("greedy")]
    def run_once(name):
        """(token lists, seconds, DecodeResult or None) of one pass over the prompts."""
        if name == "prompt-lookup (HF)":
            toks, dt = prompt_lookup(s, ids, a.max_new_tokens, a.pld_tokens)
            return toks, dt, None
        if name.startswith("greedy batch="):
            toks, dt = greedy_batched(s, ids, a.max_new_tokens, a.batch_size)
            return toks, dt, None
        spec = None if name == "greedy" else DrafterSpec(**{**DRAFTERS[name].__dict__, "alpha": a.alpha})
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
            row.update(block_efficiency=round(res.block_efficiency, 4), calls=res.calls, verify=res.verify_mode,
                       ms_per_step={k: round(1000 * v / max(steps, 1), 3) for k, v in res.timing.items()})
        elif name == "greedy":
            row.update(block_efficiency=1.0, calls=n_tok, ms_per_token=round(1000 * med / n_tok, 3))
        results.append(row)
    g = results[0]["tokens_per_s"]
    for r in results:
        r["speedup_vs_greedy"] = round(r["tokens_per_s"] / g, 3)
    out = {"benchmark": "decode", "model": s.base_dir, "load_average": os.getloadavg(), "prompts": len(ids), "max_new_tokens": a.max_new_tokens,
           "repeats": a.repeats, "batch_size": a.batch_size, "alpha": a.alpha,
           "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                       "cpu_count": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                       "device": a.device or "cpu"},
           "rows": results}
    write_atomic(Path(a.out), json.dumps(out, indent=1) + "\n")
    print(f"\n{len(ids)} prompts x {a.max_new_tokens} new tokens, median of {a.repeats}, "
          f"{out['machine']['processor']} {os.cpu_count()} CPUs, model {s.base_dir}")
    print(f"{'method':<24} {'tok/s':>8} {'x greedy':>8} {'blk eff':>8} {'exact':>6}   ms/step: model lattice draft accept")
    for r in results:
        ms = r.get("ms_per_step")
        split = "  ".join(f"{ms[k]:.2f}" for k in ("model", "lattice", "draft", "accept")) if ms else ""
        be = r.get("block_efficiency")
        print(f"{r['name']:<24} {r['tokens_per_s']:>8.1f} {r['speedup_vs_greedy']:>8.2f} "
              f"{(f'{be:.2f}' if be else '-'):>8} {('yes' if r['exact'] else 'NO'):>6}   {split}")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

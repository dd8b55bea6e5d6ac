"""Which draft model size is fastest? Tokens per target call against the draft model's own step cost.

For each draft model (``--draft-models LABEL=DIR ...``, causal LMs with the base's tokenizer) on the
held-out prompts (``data/prompts.jsonl`` without the tuning split, or ``--prompts``):

- tokens per target call (block efficiency) of ``--drafter model --gamma G`` (fixed tree), every
  output checked against greedy decoding; timing-independent;
- step costs, measured in this process on one thread, interleaved over ``--repeats`` rounds (the
  0.25 quantile of each, as the cost model takes it): ``T_verify(n)``, one verify call of the
  target over n tokens after a 100-token cache (``CostModel.measure``), and ``T_draft``, one
  draft-model forward of one token after a 100-token cache (``IncrementalLM.push``);
- the speed-up they predict over greedy decoding: ``BE * T_verify(1) / (T_verify(G + 1) + G * T_draft)``
  (a call verifies G drafted tokens and drafting them costs G draft forwards);
- measured wall clock (``--hf``): transformers' greedy ``generate`` and assisted generation with
  the draft model (``assistant_model``), round-robin, median seconds over the prompts; every
  assisted output checked against greedy.

Timings depend on the machine's load (recorded); on a shared CPU read them as indications.

    nice -n 5 .venv/bin/python benchmarks/draft_model_speed.py --draft-models s=data/rescorer-small --hf
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from latticedraft.atomic import write_atomic  # noqa: E402
from latticedraft.decoding.eval import hf_baselines  # noqa: E402
from latticedraft.decoding.eval.evaluate import EvalConfig, _run, machine  # noqa: E402
from latticedraft.decoding.runs.prompt_length import fit_prompts  # noqa: E402
from latticedraft.decoding.methods.bpd import DrafterSpec  # noqa: E402
from latticedraft.decoding.runs.loaders import encode  # noqa: E402
from latticedraft.decoding.runs.prompt_set import read_prompts  # noqa: E402
from head_agreement import CALIBRATION_PROMPTS  # noqa: E402
from latticedraft.decoding.runs.session import Session  # noqa: E402
from latticedraft.gpu.verify.incremental import IncrementalLM  # noqa: E402
from latticedraft.gpu.verify.cost_model import QUANTILE, CostModel  # noqa: E402
from latticedraft.gpu.verify.verifier import Verifier  # noqa: E402
from latticedraft.paths import data_dir  # noqa: E402


def draft_step_seconds(draft, context: int = 100, repeats: int = 30, seed: int = 0) -> float:
    """The ``QUANTILE`` of the seconds of one draft forward of one token after ``context`` tokens."""
    vocab = draft.get_output_embeddings().weight.shape[0]
    rng = np.random.default_rng(seed)
    lm = IncrementalLM(draft)
    lm.next_logits(rng.integers(1, vocab, size=context))
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        lm.push(int(rng.integers(1, vocab)))
        times.append(time.perf_counter() - t0)
        lm.rewind()
    return float(np.quantile(times[1:], QUANTILE))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft-models", nargs="+", required=True, metavar="LABEL=DIR")
    ap.add_argument("--model", default=None, help="target (default: the bundled heads' base, data/heads-stern)")
    ap.add_argument("--prompts", type=Path, default=None, help="prompt file (default: bundled held-out prompts)")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="rounds of step-cost (and --hf) timing (default 3)")
    ap.add_argument("--hf", action="store_true", help="also time transformers' greedy and assisted generation")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "draft_model_speed.json")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    drafts = {}
    for it in a.draft_models:
        label, sep, path = it.partition("=")
        if not sep:
            raise SystemExit(f"--draft-models {it!r}: use LABEL=DIR")
        drafts[label] = Path(path)
    if a.prompts is None:
        prompts = read_prompts(data_dir() / "prompts.jsonl")
        calib = range(len(prompts))[CALIBRATION_PROMPTS]
        idx = [i for i in range(len(prompts)) if i not in calib]
    else:
        prompts = read_prompts(a.prompts)
        idx = list(range(len(prompts)))
    cfg = EvalConfig(max_new_tokens=a.max_new_tokens, batch_size=1)
    load0 = os.getloadavg()
    sessions = {label: Session(a.model, draft_model_dir=d, threads=None) for label, d in drafts.items()}
    s0 = next(iter(sessions.values()))
    ids = fit_prompts(s0.model, encode(s0.tokenizer, [prompts[i]["prompt"] for i in idx]), a.max_new_tokens)
    _, res = _run(s0, "greedy", ids, None, "greedy", None, cfg)
    refs = [q.tokens for q in res.sequences]
    rows = {}
    for label, s in sessions.items():
        run, _ = _run(s, "model", ids, refs, "bpd", DrafterSpec("model", gamma=a.gamma), cfg)
        rows[label] = {"dir": str(drafts[label]), "parameters": sum(p.numel() for p in s.draft_model.parameters()),
                       "layers": s.draft_model.config.num_hidden_layers, "width": s.draft_model.config.hidden_size,
                       "tokens_per_call": run.block_efficiency, "exact": run.exact, "draft_seconds": []}
        print(f"{label}: tokens per call {run.block_efficiency:.3f}, exact {run.exact}", file=sys.stderr)
    verifier = Verifier(s0.model)
    verify = {1: [], a.gamma + 1: []}
    hf = {"greedy": [], **{label: [] for label in drafts}} if a.hf else {}
    hf_exact = {label: True for label in drafts}
    for rep in range(a.repeats):
        cm = CostModel.measure(verifier, grid=(1, a.gamma + 1), repeats=10)
        for n, sec in zip(cm.nodes, cm.info["raw_seconds"]):
            verify[n].append(sec)
        for label, s in sessions.items():
            rows[label]["draft_seconds"].append(draft_step_seconds(s.draft_model))
        if a.hf:
            toks, dt = hf_baselines._one_by_one(s0.model, ids, a.max_new_tokens, s0.eos)
            hf["greedy"].append(dt)
            for label, s in sessions.items():
                got, dt = hf_baselines.assisted(s0.model, s.draft_model, ids, a.max_new_tokens, s0.eos)
                hf[label].append(dt)
                hf_exact[label] &= all(np.array_equal(x, y) for x, y in zip(got, toks))
        print(f"timing round {rep + 1}/{a.repeats} done", file=sys.stderr)
    t1, tg = statistics.median(verify[1]), statistics.median(verify[a.gamma + 1])
    for label, r in rows.items():
        td = statistics.median(r["draft_seconds"])
        r.update({"draft_step_s": td, "draft_to_verify_cost": round(td / t1, 3),
                  "predicted_speedup": round(r["tokens_per_call"] * t1 / (tg + a.gamma * td), 3)})
        if a.hf:
            r["hf_assisted_s"] = statistics.median(hf[label])
            r["hf_assisted_speedup"] = round(statistics.median(hf["greedy"]) / r["hf_assisted_s"], 3)
            r["hf_assisted_exact"] = hf_exact[label]
    doc = {"machine": {**machine(), "platform": platform.platform(), "loadavg_before": load0,
                       "loadavg_after": os.getloadavg()},
           "settings": {"model": a.model or "data/heads-stern", "prompts": len(ids), "gamma": a.gamma,
                        "max_new_tokens": a.max_new_tokens, "threads": a.threads, "repeats": a.repeats},
           "verify_s": {"1": t1, str(a.gamma + 1): tg}, "hf_greedy_s": statistics.median(hf["greedy"]) if a.hf else None,
           "draft_models": rows}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(a.out, json.dumps(doc, indent=1) + "\n")
    print(table(doc))
    return 0


def table(doc: dict) -> str:
    s = doc["settings"]
    hf = doc["hf_greedy_s"] is not None
    L = ["| draft model | layers x width | parameters | tokens per call | draft step / verify(1) | predicted speed-up"
         + (" | HF assisted vs HF greedy | HF exact" if hf else "") + " | exact |",
         "|---|---|---:|---:|---:|---:|" + ("---:|---|" if hf else "") + "---|"]
    for label, r in doc["draft_models"].items():
        L.append(f"| {label} | {r['layers']} x {r['width']} | {r['parameters'] / 1e6:.2f} M | {r['tokens_per_call']:.3f} | "
                 f"{r['draft_to_verify_cost']:.2f} | {r['predicted_speedup']:.2f}x"
                 + (f" | {r['hf_assisted_speedup']:.2f}x | {'yes' if r['hf_assisted_exact'] else 'NO'}" if hf else "")
                 + f" | {'yes' if r['exact'] else 'NO'} |")
    m = doc["machine"]
    return "\n".join(L) + (f"\n\n{s['prompts']} prompts x {s['max_new_tokens']} tokens, gamma {s['gamma']}, "
                           f"{s['threads']} thread(s); load average {m['loadavg_before'][0]:.2f} before, "
                           f"{m['loadavg_after'][0]:.2f} after ({m['cpu_count']} CPUs)")


if __name__ == "__main__":
    raise SystemExit(main())

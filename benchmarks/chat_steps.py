"""Whether the CLI default's choices pay on chat: one data-set pass over Spec-Bench questions.

The base model of ``--heads`` (SmolLM2 for ``data/heads-smollm2``) answers the first turn of ``--count`` Spec-Bench questions (drawn
evenly from its six categories, in a seeded order), each row decoding them in one call as a
data-set run does (``Session.decode`` over every prompt, batch 1, prefill included), beside HF
greedy one prompt at a time, in one process:

    HF greedy                          transformers' generate, the reference
    ours: CLI default                  what ``decode --model HEADS --chat`` runs (gated heads, n-grams)
    ours: heads every step             the same, with the head gate overruled (heads computed every step)
    ours: CLI default + suffix drafts  the same with ``--suffix-drafts 4`` (earlier answers of the run)

For each: tokens/s and x HF greedy, tokens per target call, mean verified tree nodes per step
(root included), and per step the milliseconds of the verify call's parts and of drafting.
Every row is checked equal to HF greedy. One pass per row (the suffix row's memory must
start empty), rows in the order above; the machine and load average are recorded.

    .venv/bin/python benchmarks/chat_steps.py --heads data/heads-smollm2 --count 48
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latticedraft.atomic import write_atomic  # noqa: E402
from latticedraft.decoding.eval import hf_baselines  # noqa: E402
from latticedraft.decoding.eval.evaluate import machine  # noqa: E402
from latticedraft.decoding.methods import bpd_session  # noqa: E402
from latticedraft.decoding.planning.head_gate import GATED, HeadGate  # noqa: E402
from latticedraft.decoding.runs.session import Session  # noqa: E402
from latticedraft.quiet import add_verbose_arg, quiet_libraries  # noqa: E402
from spec_bench import CATEGORIES, QUESTIONS, cli_default, sample_questions  # noqa: E402  (benchmarks/)

PARTS = ("forward", "project", "heads", "tree", "walk", "cache")  # Verifier.timing's parts


class HeadsEveryStep(HeadGate):
    """A gate that always computes the heads (never the ``off`` policy)."""

    def choose(self, match: int) -> bool:
        return True

    def _next_block(self) -> None:
        super()._next_block()
        self.policy = GATED  # (the prefill computes heads unless the policy is OFF)


def tree_nodes(drafts: np.ndarray) -> int:
    """Nodes of the trie of the verified paths int64[p, d] (-1 pads), root included."""
    seen = set()
    for path in np.atleast_2d(drafts):
        prefix = ()
        for t in path:
            if t < 0:
                break
            prefix += (int(t),)
            seen.add(prefix)
    return len(seen) + 1


@torch.no_grad()
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", required=True, help="a head directory (its base is the model; what --chat decodes with); "
                                                   "a plain model runs too (no heads for the gate to weigh)")
    ap.add_argument("--questions", default=str(QUESTIONS))
    ap.add_argument("--count", type=int, default=48, help="questions, evenly over the six categories")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/chat_steps.json")
    add_verbose_arg(ap)
    a = ap.parse_args(argv)
    quiet_libraries(a.verbose)
    if a.count < len(CATEGORIES):
        sys.exit(f"error: --count {a.count}: give at least one question per category ({len(CATEGORIES)})")
    sess = Session(a.heads, None, None, None, None, a.threads)
    qs = sample_questions(Path(a.questions), a.count // len(CATEGORIES), a.seed)
    random.Random(a.seed).shuffle(qs)  # a data set's order, not category by category
    template = sess.chat_template()
    ids = [template.ids([{"role": "user", "content": q["turns"][0]}]) for q in qs]
    method, default = cli_default(a.heads)
    rows = {"ours: CLI default": (default, None), "ours: heads every step": (default, HeadsEveryStep()),
            "ours: CLI default + suffix drafts": (replace(default, suffix_drafts=4), None)}
    warm = [template.ids([{"role": "user", "content": "Say hello."}])]  # no benchmark text in any memory
    for spec, _ in rows.values():
        sess.prepare(method, spec, 1)
        sess.decode(warm, method, spec, max_new_tokens=8)
    base = getattr(sess.model, "base", sess.model)
    hf_baselines.greedy(base, warm, 8, sess.eos)

    t0 = time.perf_counter()
    ref = [hf_baselines.greedy(base, [x], a.max_new_tokens, sess.eos)[0][0] for x in ids]
    hf_s = time.perf_counter() - t0
    tokens = sum(len(t) for t in ref)
    out_rows = [{"name": "HF greedy", "tokens": tokens, "seconds": round(hf_s, 3), "tokens_per_s": round(tokens / hf_s, 2),
                 "x_hf_greedy": 1.0, "tokens_per_call": 1.0, "exact": True}]
    for name, (spec, gate) in rows.items():
        old = sess.learned.swap_gate(spec, gate) if gate is not None else None
        t0 = time.perf_counter()
        r = sess.decode(ids, method, spec, max_new_tokens=a.max_new_tokens, record_steps=True)
        sec = time.perf_counter() - t0
        if old is not None:
            sess.learned.swap_gate(spec, old)
        steps = max(len(r.steps), 1)
        per = {p: round(1000 * r.timing.get(f"verify.{p}", 0.0) / steps, 2) for p in PARTS}
        per["drafting"] = round(1000 * (r.timing.get("draft", 0.0) + r.timing.get("lattice", 0.0)) / steps, 2)
        per["prefill (per prompt)"] = round(1000 * r.timing.get("prefill", 0.0) / len(ids), 1)
        out_rows.append({"name": name, "tokens": r.tokens, "seconds": round(sec, 3),
                         "tokens_per_s": round(r.tokens / sec, 2), "x_hf_greedy": round(hf_s / sec * r.tokens / tokens, 3),
                         "tokens_per_call": round(r.block_efficiency, 3),
                         "nodes_per_step": round(float(np.mean([tree_nodes(s.drafts) for s in r.steps])), 2),
                         "ms_per_step": per,
                         "exact": all(np.array_equal(q.tokens, t) for q, t in zip(r.sequences, ref))})
    res = {"benchmark": "chat_steps", "model": sess.base_dir, "heads": a.heads, "questions": len(ids),
           "max_new_tokens": a.max_new_tokens, "threads": a.threads, "load_average": os.getloadavg(),
           "machine": {**machine(), "torch": torch.__version__}, "rows": out_rows}
    write_atomic(Path(a.out), json.dumps(res, indent=1) + "\n")
    print(f"\n{len(ids)} Spec-Bench questions (first turns) x {a.max_new_tokens} new tokens, one pass per row, "
          f"{a.threads} threads, load average {res['load_average'][0]:.2f}")
    print("| row | tok/s | x HF greedy | tokens/call | nodes/step | forward ms | project ms | heads ms | drafting ms "
          "| exact |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in out_rows:
        p = r.get("ms_per_step", {})
        cells = " | ".join(f"{p[k]:.2f}" if k in p else "-" for k in ("forward", "project", "heads", "drafting"))
        print(f"| {r['name']} | {r['tokens_per_s']:.1f} | {r['x_hf_greedy']:.2f} | {r['tokens_per_call']:.2f} | "
              f"{r.get('nodes_per_step', '-')} | {cells} | {'yes' if r['exact'] else 'NO'} |")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

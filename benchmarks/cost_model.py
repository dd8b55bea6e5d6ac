"""The step-cost curve T(n) and what the cost-aware tree makes of it, on this machine.

Measured: T(n), seconds of one verify step over a tree of n nodes (``CostModel.measure``: the
tree forward after a 100-token cache, the accept walk, the cache commit and the heads), for the
bundled model in the default decode settings (heads 1..3, draft vocabulary 1024), next to one
step of transformers' greedy ``generate`` on the same model; the same for random-weight LLaMA
configurations of about 8 M, 30 M and 90 M parameters (with random Stern heads), which cost what
trained ones of that size cost.

Predicted (labelled so): for each curve, the tree the optimiser picks at the bundled heads'
acceptance rates and the tokens/s that follow. The bundled model's held-out prompts are decoded
once (heads only, every drafted path recorded); each recorded step is replayed through
``TreePlanner`` with the model's curve, and the tokens it would accept are counted against the
known greedy continuation. Predicted tokens/s = sum(1 + accepted) / sum(T(nodes) + overhead).

    .venv/bin/python benchmarks/cost_model.py                  # writes results/cost_model.{json,png}
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
from latticedraft.decoding.methods import bpd_session  # noqa: E402
from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode  # noqa: E402
from latticedraft.decoding.registry import Request  # noqa: E402
from latticedraft.decoding.planning.draft_tree import TreePlanner  # noqa: E402
from latticedraft.decoding.proposers.context import ContextNgrams, ContextProposer  # noqa: E402
from latticedraft.decoding.methods.bpd import DrafterSpec
from latticedraft.decoding.runs.session import Session
from latticedraft.decoding.runs.loaders import encode
from latticedraft.decoding.runs.prompt_set import read_prompts  # noqa: E402
from latticedraft.gpu.verify.cost_model import CostModel  # noqa: E402
from latticedraft.gpu.verify.verifier import Verifier  # noqa: E402
from latticedraft.paths import data_dir  # noqa: E402

SPEC = DrafterSpec("parallel-base", nbest=8, slots=3, tree="auto", context_ngrams=3, draft_vocab="auto")
LLAMAS = {  # name: (hidden, layers, intermediate, attention heads); vocabulary 8192 as the bundled model
    "LLaMA 8M (random)": (256, 4, 688, 4),
    "LLaMA 30M (random)": (512, 6, 1376, 8),
    "LLaMA 90M (random)": (768, 11, 2048, 12),
}
GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def greedy_step_seconds(base, context: int = 100, new: int = 32, repeats: int = 5) -> float:
    """Median seconds per token of ``generate`` greedy after a ``context``-token prompt."""
    x = torch.randint(1, base.config.vocab_size, (1, context), generator=torch.Generator().manual_seed(0))
    kw = dict(attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=new, min_new_tokens=new,
              pad_token_id=0, temperature=None, top_p=None, top_k=None)
    base.generate(x, **kw)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        base.generate(x, **kw)
        times.append((time.perf_counter() - t0) / new)
    return statistics.median(times)


def projection_options(model, vocab, nodes=(1, 4, 8, 16), extra: int = 3, repeats: int = 200) -> list[dict]:
    """Median ms of the output projections one step needs, per way of doing them: the verify
    rows n alone (what greedy pays at n = 1), plus the extra heads' rows at the accepted node
    over the full vocabulary in a second matmul, fused into the verify matmul (every node's
    heads, since the accepted node is unknown before the walk), or onto the draft vocabulary."""
    H = int(model.base.config.hidden_size)
    W = model.base.get_output_embeddings().weight
    Wv = W.index_select(0, torch.as_tensor(vocab)).contiguous()
    lin = torch.nn.functional.linear

    def med(f):
        for _ in range(10):
            f()
        t = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
        return round(1000 * statistics.median(t), 4)

    out = []
    for n in nodes:
        v, hd, fused = torch.randn(n, H), torch.randn(extra, H), torch.randn(n * (1 + extra), H)
        out.append({"nodes": n, "verify_rows_ms": med(lambda: lin(v, W)),
                    "two_passes_full_ms": med(lambda: (lin(v, W), lin(hd, W))),
                    "fused_one_pass_ms": med(lambda: lin(fused, W)),
                    "draft_vocab_ms": med(lambda: (lin(v, W), lin(hd, Wv)))})
    return out


def random_llama(hidden, layers, inter, heads, vocab=8192, num_heads=8):
    from transformers import LlamaConfig, LlamaForCausalLM

    from latticedraft.gpu.models.blockwise import BlockwiseModel

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                      num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=1024)
    cfg._attn_implementation = "sdpa"
    base = LlamaForCausalLM(cfg).eval()
    params = sum(p.numel() for p in base.parameters())
    return BlockwiseModel.from_base(base, num_heads, kind="stern", seed=0).eval(), params


def recorded_steps(session: Session, ids, max_new_tokens: int):
    """(sausage, drafts, history, greedy continuation) per step of a heads-only fixed-tree decode."""
    spec = DrafterSpec(SPEC.name, nbest=SPEC.nbest, slots=SPEC.slots)
    res = bpd_decode(session.model, ids, bpd_session.proposer(session, spec),
                     BpdPlan(draft_vocab=bpd_session.draft_vocab(session, "auto")),
                     Request(max_new_tokens=max_new_tokens, eos_token_id=session.eos, record_steps=True))
    out = []
    for st in res.steps:
        seq = res.sequences[st.row]
        at = len(st.history) - len(seq.prompt_ids)
        out.append((st.sausage, st.drafts, st.history, seq.tokens[at:]))
    return out


def proposals(step, acceptance, context) -> list:
    """One recorded step's ``Proposal`` s as the loop builds them: the heads' paths rated by their
    head probabilities, then (``context``: a ``ContextProposer`` or None) the context n-grams'."""
    from latticedraft.decoding.proposers.base import Proposal, rated
    from latticedraft.decoding.proposers.heads import draft_probs

    sausage, drafts, history, _ = step
    out = [Proposal(drafts, rates=acceptance.head_rates(draft_probs(sausage, drafts)), sausage=sausage, heads=True)]
    if context is not None:
        out.append(rated(context.paths(np.asarray(history)), acceptance, "context"))
    return out


def replay(steps, planner: TreePlanner, acceptance, context, overhead: float) -> dict:
    """Tokens per step and predicted seconds when ``planner`` picks every step's tree."""
    toks, secs, nodes = 0, 0.0, []
    for step in steps:
        truth = step[3]
        room = max(len(truth) - 1, 0)
        plan = planner.plan(proposals(step, acceptance, context), room)
        acc = 0
        for row in plan.drafts:
            row = row[row >= 0]
            k = 0
            while k < len(row) and k < len(truth) and row[k] == truth[k]:
                k += 1
            acc = max(acc, k)
        toks += 1 + acc
        secs += planner.step_seconds(plan.nodes)
        nodes.append(plan.nodes)
    return {"tokens_per_step": toks / len(steps), "tokens_per_s": toks / secs, "nodes_mean": float(np.mean(nodes)),
            "nodes_median": float(np.median(nodes))}


def plot(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, c in curves.items():
        n, t = np.asarray(c["nodes"]), np.asarray(c["seconds"]) * 1000
        line = a1.plot(n, t, marker="o", ms=3, label=name)[0]
        a1.plot(n, np.asarray(c["raw_seconds"]) * 1000, ls="none", marker="x", ms=4, color=line.get_color(), alpha=0.5)
        a2.plot(n, t / t[0], marker="o", ms=3, label=name)
        a1.axhline(c["greedy_step_s"] * 1000, color=line.get_color(), ls=":", lw=1)
    a1.set(xscale="log", yscale="log", xlabel="tree nodes n (root included)", ylabel="T(n), ms per verify step",
           title="T(n): x = 25th percentile, line = nondecreasing fit\n(dotted: one HF greedy step)")
    a2.set(xscale="log", xlabel="tree nodes n (root included)", ylabel="T(n) / T(1)", title="relative step cost")
    for ax in (a1, a2):
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xticks([1, 2, 4, 8, 16, 32, 64], ["1", "2", "4", "8", "16", "32", "64"])
    a2.legend(fontsize=8)
    fig.suptitle(f"T(n) on {platform.processor() or platform.machine()}, {torch.get_num_threads()} thread(s), float32")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@torch.no_grad()  # scoped: a global switch would leak into the caller (tests run main in-process)
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=9, help="interleaved timings per tree size (default 9)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-llama", action="store_true", help="the bundled model only")
    ap.add_argument("--out", default="benchmarks/results/cost_model.json")
    from latticedraft.quiet import add_verbose_arg, quiet_libraries

    add_verbose_arg(ap)
    a = ap.parse_args(argv)
    quiet_libraries(a.verbose)
    s = Session(threads=a.threads)
    recs = read_prompts(data_dir() / "prompts.jsonl", limit=a.num_prompts)
    ids = encode(s.tokenizer, [r["prompt"] for r in recs])
    vocab = bpd_session.draft_vocab(s, SPEC.draft_vocab)
    acceptance = bpd_session.acceptance(s, SPEC)
    steps = recorded_steps(s, ids, a.max_new_tokens)
    models = {"bundled GPT-2 (trained)": (s.model, sum(p.numel() for p in s.model.base.parameters()))}
    if not a.skip_llama:
        for name, dims in LLAMAS.items():
            models[name] = random_llama(*dims)
    proj = projection_options(s.model, vocab)
    rows, curves = [], {}
    for name, (model, params) in models.items():
        print(f"measuring {name} ({params / 1e6:.1f} M parameters)", file=sys.stderr)
        ver = Verifier(model, num_heads=SPEC.slots + 1, draft_vocab=vocab)
        cost = CostModel.measure(ver, batch=1, grid=GRID, repeats=a.repeats)
        greedy = greedy_step_seconds(model.base)
        curves[name] = {"nodes": list(cost.nodes), "seconds": list(cost.seconds_at),
                        "raw_seconds": cost.info["raw_seconds"], "greedy_step_s": greedy}
        overhead = 0.0006  # drafting + planning per step on this machine (decode benchmark's lattice + draft)
        pred = {}
        context = ContextProposer(ContextNgrams(max_ngram=SPEC.context_ngrams))
        for label, ctx in (("heads only", None), ("heads + context n-grams", context)):
            planner = TreePlanner("auto", acceptance, cost)
            planner.overhead = overhead
            pred[label] = replay(steps, planner, acceptance, ctx, overhead)
        row = {"model": name, "parameters_m": round(params / 1e6, 1), "measured": {
            "T1_ms": round(cost.seconds(1) * 1000, 3), "greedy_step_ms": round(greedy * 1000, 3),
            "T1_over_greedy": round(cost.seconds(1) / greedy, 3),
            "T_over_T1": {str(n): round(cost.seconds(n) / cost.seconds(1), 3) for n in (2, 4, 8, 16, 32, 64)}},
            "predicted": {k: {**{m: round(x, 3) for m, x in v.items()},
                              "speedup_vs_greedy": round(v["tokens_per_s"] * greedy, 3)} for k, v in pred.items()}}
        rows.append(row)
    png = Path(a.out).with_suffix(".png")
    png.parent.mkdir(parents=True, exist_ok=True)
    plot(curves, png)
    out = {"benchmark": "cost_model", "spec": SPEC.__dict__, "load_average": os.getloadavg(),
           "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                       "cpu_count": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads()},
           "steps_replayed": len(steps), "rows": rows, "curves": curves, "projection_options": proj}
    write_atomic(Path(a.out), json.dumps(out, indent=1) + "\n")
    print(f"\nT(n) measured; tree size and tokens/s PREDICTED from {len(steps)} replayed steps of the bundled heads")
    print(f"{'model':<26} {'params':>7} {'T(1) ms':>8} {'greedy ms':>9} {'T4/T1':>6} {'T16/T1':>6} {'T64/T1':>6} | "
          f"{'pred. nodes':>11} {'pred. tok/step':>14} {'pred. x greedy':>14}  (heads only / + context)")
    for r in rows:
        m, p = r["measured"], r["predicted"]
        h, c = p["heads only"], p["heads + context n-grams"]
        print(f"{r['model']:<26} {r['parameters_m']:>6.1f}M {m['T1_ms']:>8.2f} {m['greedy_step_ms']:>9.2f} "
              f"{m['T_over_T1']['4']:>6.2f} {m['T_over_T1']['16']:>6.2f} {m['T_over_T1']['64']:>6.2f} | "
              f"{h['nodes_mean']:>5.1f}/{c['nodes_mean']:<5.1f} {h['tokens_per_step']:>6.2f}/{c['tokens_per_step']:<7.2f} "
              f"{h['speedup_vs_greedy']:>6.2f}/{c['speedup_vs_greedy']:<7.2f}")
    print(f"\nOne step's output projections on the bundled model (ms, median; {SPEC.slots} extra heads, "
          f"V' = {len(vocab)}): verify rows only | + heads, second full pass | fused one pass | + heads onto V'")
    for r in proj:
        print(f"  n = {r['nodes']:>2}: {r['verify_rows_ms']:.3f} | {r['two_passes_full_ms']:.3f} | "
              f"{r['fused_one_pass_ms']:.3f} | {r['draft_vocab_ms']:.3f}")
    print(f"wrote {a.out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

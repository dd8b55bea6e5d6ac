"""The target's own weights at 4 and 8 bits as its drafter, measured on a real model (SmolLM2).

For each scheme (int4 groups of 32, int8 per channel), the copy the self-draft builds at load
(``LeanStack(model, Scheme)``), measured against the float32 model on HF greedy's answers to
Spec-Bench first turns (teacher-forced, through the chat template):

- build seconds, the bytes it adds (``LeanStack.nbytes``) against the float32 weights' bytes,
  and the process's peak RSS (``resource.getrusage``) before and after building it;
- agreement: the share of answer positions where the copy's argmax equals the float model's,
  over the whole answer, as a draft forward sees it (the float model's own keys and values of
  every earlier token: the self-draft reads the verifier's cache);
- the logits' deviation |z_copy - z_float| at those positions: max, 99.9th and 50th percentile,
  and the same relative to the float logits' standard deviation per position: the stated bound
  of docs/self-draft.md (tests/decoding/test_smollm2.py checks it on other prompts);
- one token's forward (output projection included) at 1 and 4 rows after a 300-token cache:
  float32 against the copy, median of repeats.

    .venv/bin/python benchmarks/quantized_draft.py --questions 8 --out benchmarks/results/quantized_draft.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latticedraft.atomic import write_atomic  # noqa: E402
from latticedraft.decoding.eval import hf_baselines  # noqa: E402
from latticedraft.decoding.eval.evaluate import machine  # noqa: E402
from latticedraft.decoding.runs.session import Session  # noqa: E402
from latticedraft.gpu.models.quantized import Scheme  # noqa: E402
from latticedraft.cpu import cpu_info  # noqa: E402
from latticedraft.gpu.verify.fused_draft import FusedDraft  # noqa: E402
from latticedraft.gpu.verify.kv import KVCache  # noqa: E402
from latticedraft.gpu.verify.lean import LeanStack, stack_for  # noqa: E402
from latticedraft.gpu.masks import CAUSAL  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spec_bench import QUESTIONS, sample_questions  # noqa: E402


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@torch.inference_mode()
def teacher_forced(float_stack, draft, ids: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
    """Float logits and the copy's at positions start..n-1 of ``ids`` (the copy one token at a time
    over the float model's cache, as a draft forward runs): float32[m, V] each."""
    n = len(ids)
    x = torch.as_tensor(ids[None])
    pos = torch.arange(n)[None]
    cache = KVCache(1, float_stack.num_layers)
    cache.reserve(n)
    h = float_stack.run(float_stack.embed(x, pos), 0, float_stack.num_layers, CAUSAL, pos, cache)
    cache.append_valid(np.ones((1, n), dtype=bool), pos.numpy())
    want = float_stack.unembed(float_stack.norm(h[0, start - 1 : n - 1])).float()
    saved = cache.store.clone()
    got = []
    for t in range(start - 1, n - 1):  # the copy reads the float cache of tokens < t, writes its own for t
        cache.truncate(t)
        cache.reserve(1)
        p = torch.full((1, 1), t)
        got.append(draft.token_logits(x[:, t : t + 1], p, None, cache)[0])
        cache.store[..., t : t + 1, :] = saved[..., t : t + 1, :]  # the float keys and values again
    return want.numpy(), torch.stack(got).numpy()


def _one_token(stack, rows: int, context: int = 300):
    """A function running one token's forward of ``stack`` (output projection included) at ``rows``
    rows after ``context`` cached tokens, leaving the cache as it was."""
    cache = KVCache(rows, stack.num_layers)
    ids = torch.randint(100, 20000, (rows, context), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(context)[None].expand(rows, -1)
    cache.reserve(context)
    with torch.inference_mode():
        stack_for(stack.split.lm).run(stack.embed(ids, pos), 0, stack.num_layers, CAUSAL, pos, cache)
    cache.append_valid(np.ones((rows, context), dtype=bool), pos.numpy())
    x, p = ids[:, -1:], torch.full((rows, 1), context)

    def one():
        cache.reserve(1)
        stack.token_logits(x, p, None, cache)
        cache.truncate(context)

    return one


@torch.inference_mode()
def token_ms(stacks: dict, rows: int, repeats: int = 15) -> dict:
    """name -> median ms of one token's forward of each of ``stacks`` (name -> (stack, fused or
    None)), timed round-robin after two untimed rounds, so a busy moment slows them alike."""
    runs = {}
    for name, (stack, fused) in stacks.items():
        stack.fused = fused
        runs[name] = (stack, fused, _one_token(stack, rows))
    times = {name: [] for name in stacks}
    for rep in range(repeats + 2):
        for name, (stack, fused, one) in runs.items():
            stack.fused = fused
            t0 = time.perf_counter()
            one()
            if rep >= 2:
                times[name].append(time.perf_counter() - t0)
    return {name: round(1000 * statistics.median(t), 3) for name, t in times.items()}


@torch.inference_mode()
def breakdown(stack, fused, head_rows: int, repeats: int = 10) -> dict:
    """One token's forward (1 row, 300 cached tokens) under ``torch.profiler``: its ATen calls (all
    levels; a fused forward's loops are not ATen calls) and ms in the layers' products, the output
    projection (the product with ``head_rows`` outputs), attention and the rest."""
    from torch.profiler import ProfilerActivity, profile, record_function

    stack.fused = fused
    one = _one_token(stack, 1)
    one(), one()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(repeats):
            with record_function("forward"):
                one()
    ev = prof.events()
    total = sum(e.cpu_time_total for e in ev if e.name == "forward") / repeats / 1000

    def ms(names, head=None) -> float:
        """ms a forward in the outermost events named ``names`` (head: only / never the output projection's)."""
        picked = [e for e in ev if _outermost(e, names) and (head is None or _is_head(e, head_rows) == head)]
        return sum(e.cpu_time_total for e in picked) / repeats / 1000

    head, prods, attn = ms(PRODUCTS, True), ms(PRODUCTS, False), ms(ATTENTION)
    calls = sum(1 for e in ev if e.name.startswith("aten::")) / repeats
    return {"ms": round(total, 3), "aten_calls": round(calls), "products_ms": round(prods, 3),
            "output_projection_ms": round(head, 3), "attention_ms": round(attn, 3),
            "rest_ms": round(total - prods - head - attn, 3),
            "outside_products_share": round((total - prods - head) / total, 3)}


PRODUCTS = ("aten::_weight_int4pack_mm_for_cpu", "aten::_weight_int8pack_mm", "aten::linear", "aten::addmm")
ATTENTION = ("aten::scaled_dot_product_attention", "fused_draft::attention")


def _outermost(e, names) -> bool:
    """``e`` is named one of ``names`` and no event around it is."""
    if e.name not in names:
        return False
    p = e.cpu_parent
    while p is not None:
        if p.name in names:
            return False
        p = p.cpu_parent
    return True


def _is_head(e, head_rows: int) -> bool:
    """Whether a product event is the output projection's (a weight with ``head_rows`` rows)."""
    shapes = e.input_shapes or []
    return len(shapes) > 1 and len(shapes[1]) >= 1 and shapes[1][0] == head_rows


def main(argv=None) -> int:
    from latticedraft.paths import smollm2_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(smollm2_dir()))
    ap.add_argument("--questions", type=int, default=8, help="Spec-Bench first turns (seeded, all categories)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/quantized_draft.json")
    a = ap.parse_args(argv)
    if not Path(a.model).is_dir():
        sys.exit(f"error: --model {a.model} does not exist; run `.venv/bin/latticedraft fetch smollm2` first")
    s = Session(a.model, threads=a.threads)
    model, template = s.model, s.chat_template()
    qs = sample_questions(QUESTIONS, max(1, -(-a.questions // 6)), a.seed)[: a.questions]
    prompts = [template.ids([{"role": "user", "content": q["turns"][0]}]) for q in qs]
    answers = [hf_baselines.greedy(model, [p], a.max_new_tokens, s.eos)[0][0] for p in prompts]
    float_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    float_stack = stack_for(model)
    vocab = int(model.config.vocab_size)
    ref = {"scheme": "float32", "added_mib": 0.0, "float32_mib": round(float_bytes / 2**20, 1),
           "breakdown": breakdown(float_stack, None, vocab)}
    rows = []
    for scheme in (Scheme("int4"), Scheme("int8")):
        rss0 = peak_rss_mib()
        t0 = time.perf_counter()
        draft = LeanStack(model, scheme)
        built = time.perf_counter() - t0
        fused, why = FusedDraft.of(draft, progress=lambda m: print(m, file=sys.stderr))
        draft.fused = fused
        agree, dev, rel = [], [], []
        for p, ans in zip(prompts, answers):
            ids = np.concatenate([p, np.asarray(ans, dtype=np.int64)])
            want, got = teacher_forced(float_stack, draft, ids, len(p))
            agree += (want.argmax(-1) == got.argmax(-1)).tolist()
            d = np.abs(got - want).max(-1)
            dev += d.tolist()
            rel += (d / want.std(-1)).tolist()
        kinds = {"float32": (float_stack, None), "eager": (draft, None)} | ({"fused": (draft, fused)} if fused else {})
        ms = {str(r): token_ms(kinds, r) for r in (1, 4)}
        row = {"scheme": f"{scheme.kind}" + (f" g{scheme.group}" if scheme.kind == "int4" else ""),
               "fused": why or "yes", "build_s": round(built, 3), "added_mib": round(draft.nbytes() / 2**20, 1),
               "added_share_of_float32": round(draft.nbytes() / float_bytes, 4),
               "peak_rss_mib_before": round(rss0, 1), "peak_rss_mib_after": round(peak_rss_mib(), 1),
               "positions": len(agree), "argmax_agreement": round(float(np.mean(agree)), 4),
               "logit_dev_max": round(float(np.max(dev)), 3), "logit_dev_p999": round(float(np.quantile(dev, 0.999)), 3),
               "logit_dev_median": round(float(np.median(dev)), 3),
               "logit_dev_over_std_max": round(float(np.max(rel)), 3),
               "logit_dev_over_std_p999": round(float(np.quantile(rel, 0.999)), 3),
               "fallbacks": draft.fallbacks, "token_ms": ms,
               "streaming_ms": round(draft.nbytes() / streaming_rate(ref["breakdown"], ms["1"]["float32"], float_bytes), 3),
               "breakdown": {k: breakdown(draft, f, vocab) for k, (_, f) in kinds.items() if k != "float32"}}
        for r in ms:
            for k in ("eager", "fused"):
                if k in ms[r]:
                    row.setdefault("ratio_to_float32", {}).setdefault(r, {})[k] = round(ms[r][k] / ms[r]["float32"], 3)
        rows.append(row)
        draft.fused = None
        del draft, fused
    out = {"benchmark": "quantized_draft", "model": a.model, "questions": [q["question_id"] for q in qs],
           "max_new_tokens": a.max_new_tokens, "load_average": os.getloadavg(),
           "machine": {**machine(), "cpu": cpu_info(), "torch": torch.__version__, "threads": torch.get_num_threads()},
           "float32": ref, "rows": rows}
    write_atomic(Path(a.out), json.dumps(out, indent=1) + "\n")
    report(out, len(prompts), a.max_new_tokens)
    print(f"wrote {a.out}")
    return 0


def streaming_rate(float_breakdown: dict, float_ms: float, float_bytes: int) -> float:
    """Bytes a millisecond the float forward streams its weights at: its bytes over the share of its
    timed forward (``float_ms``, no profiler) that its products take under the profiler."""
    return float_bytes / (float_ms * (1 - float_breakdown["outside_products_share"]))


def report(out: dict, prompts: int, tokens: int) -> None:
    """The table of the copies (agreement, deviation, ms a token) and the forwards' breakdown."""
    cpu = out["machine"]["cpu"]
    print(f"\n{out['model']}: {prompts} Spec-Bench first turns x {tokens} tokens of HF greedy, teacher-forced; "
          f"{out['machine']['threads']} threads, load average {out['load_average'][0]:.2f}; "
          f"CPU {cpu['model']} ({', '.join(cpu['flags'])}), torch {out['machine']['torch']}")
    print(f"{'copy':<10} {'build s':>7} {'+MiB':>6} {'share':>6} {'agree':>6} {'dev max':>8} {'p99.9':>6} "
          f"{'/std max':>8} {'eager@1':>8} {'fused@1':>8} {'x f32':>6} {'fused@4':>8} {'x f32':>6}")
    for r in out["rows"]:
        m1, m4 = r["token_ms"]["1"], r["token_ms"]["4"]
        f1, f4 = (f"{m1['fused']:>8.2f}", f"{m4['fused']:>8.2f}") if "fused" in m1 else (f"{'-':>8}",) * 2
        x1 = r["ratio_to_float32"]["1"].get("fused", r["ratio_to_float32"]["1"]["eager"])
        x4 = r["ratio_to_float32"]["4"].get("fused", r["ratio_to_float32"]["4"]["eager"])
        print(f"{r['scheme']:<10} {r['build_s']:>7.2f} {r['added_mib']:>6.1f} {r['added_share_of_float32']:>6.1%} "
              f"{r['argmax_agreement']:>6.1%} {r['logit_dev_max']:>8.3f} {r['logit_dev_p999']:>6.3f} "
              f"{r['logit_dev_over_std_max']:>8.3f} {m1['eager']:>8.2f} {f1} {x1:>6.3f} {f4} {x4:>6.3f}")
    r0 = out["rows"][0]["token_ms"]
    print(f"float32: {r0['1']['float32']:.2f} ms at 1 row, {r0['4']['float32']:.2f} at 4; "
          f"weights {out['float32']['float32_mib']} MiB")
    print(f"\none token's forward at 1 row after 300 cached tokens (torch.profiler, median of its own run):")
    print(f"{'forward':<16} {'ms':>7} {'ATen calls':>10} {'products':>9} {'output':>7} {'attention':>9} {'rest':>7} "
          f"{'outside products':>16} {'x streaming':>11}")
    lines = [("float32", out["float32"]["breakdown"], None)]
    lines += [(f"{r['scheme']} {k}", b, r["token_ms"]["1"][k] / r["streaming_ms"]) for r in out["rows"]
              for k, b in r["breakdown"].items()]
    for name, b, stream in lines:  # x streaming: the timed forward (no profiler) over its bytes' streaming time
        xs = f"{stream:>11.2f}" if stream else f"{'-':>11}"
        print(f"{name:<16} {b['ms']:>7.2f} {b['aten_calls']:>10} {b['products_ms']:>9.2f} "
              f"{b['output_projection_ms']:>7.2f} {b['attention_ms']:>9.2f} {b['rest_ms']:>7.2f} "
              f"{b['outside_products_share']:>16.1%} {xs}")


if __name__ == "__main__":
    sys.exit(main())

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
        hd = draft.run(draft.embed(x[:, t : t + 1], p), 0, draft.num_layers, None, p, cache)
        got.append(draft.unembed(draft.norm(hd[0, -1])).float())
        cache.store[..., t : t + 1, :] = saved[..., t : t + 1, :]  # the float keys and values again
    return want.numpy(), torch.stack(got).numpy()


@torch.inference_mode()
def token_ms(stack, rows: int, context: int = 300, repeats: int = 15) -> float:
    cache = KVCache(rows, stack.num_layers)
    ids = torch.randint(100, 20000, (rows, context), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(context)[None].expand(rows, -1)
    cache.reserve(context)
    stack.run(stack.embed(ids, pos), 0, stack.num_layers, CAUSAL, pos, cache)
    cache.append_valid(np.ones((rows, context), dtype=bool), pos.numpy())
    x, p = ids[:, -1:], torch.full((rows, 1), context)
    times = []
    for _ in range(repeats + 2):
        t0 = time.perf_counter()
        cache.reserve(1)
        stack.unembed(stack.norm(stack.run(stack.embed(x, p), 0, stack.num_layers, None, p, cache)[:, -1]))
        cache.truncate(context)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times[2:])


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
    rows = []
    for scheme in (Scheme("int4"), Scheme("int8")):
        rss0 = peak_rss_mib()
        t0 = time.perf_counter()
        draft = LeanStack(model, scheme)
        built = time.perf_counter() - t0
        agree, dev, rel = [], [], []
        for p, ans in zip(prompts, answers):
            ids = np.concatenate([p, np.asarray(ans, dtype=np.int64)])
            want, got = teacher_forced(float_stack, draft, ids, len(p))
            agree += (want.argmax(-1) == got.argmax(-1)).tolist()
            d = np.abs(got - want).max(-1)
            dev += d.tolist()
            rel += (d / want.std(-1)).tolist()
        row = {"scheme": f"{scheme.kind}" + (f" g{scheme.group}" if scheme.kind == "int4" else ""),
               "build_s": round(built, 3), "added_mib": round(draft.nbytes() / 2**20, 1),
               "added_share_of_float32": round(draft.nbytes() / float_bytes, 4),
               "peak_rss_mib_before": round(rss0, 1), "peak_rss_mib_after": round(peak_rss_mib(), 1),
               "positions": len(agree), "argmax_agreement": round(float(np.mean(agree)), 4),
               "logit_dev_max": round(float(np.max(dev)), 3), "logit_dev_p999": round(float(np.quantile(dev, 0.999)), 3),
               "logit_dev_median": round(float(np.median(dev)), 3),
               "logit_dev_over_std_max": round(float(np.max(rel)), 3),
               "logit_dev_over_std_p999": round(float(np.quantile(rel, 0.999)), 3),
               "fallbacks": draft.fallbacks,
               "token_ms": {str(r): round(token_ms(draft, r), 2) for r in (1, 4)}}
        rows.append(row)
        del draft
    ref = {"scheme": "float32", "added_mib": 0.0, "float32_mib": round(float_bytes / 2**20, 1),
           "token_ms": {str(r): round(token_ms(float_stack, r), 2) for r in (1, 4)}}
    out = {"benchmark": "quantized_draft", "model": a.model, "questions": [q["question_id"] for q in qs],
           "max_new_tokens": a.max_new_tokens, "load_average": os.getloadavg(),
           "machine": {**machine(), "torch": torch.__version__, "threads": torch.get_num_threads()},
           "float32": ref, "rows": rows}
    write_atomic(Path(a.out), json.dumps(out, indent=1) + "\n")
    print(f"\n{a.model}: {len(prompts)} Spec-Bench first turns x {a.max_new_tokens} tokens of HF greedy, teacher-forced; "
          f"{torch.get_num_threads()} threads, load average {out['load_average'][0]:.2f}")
    print(f"{'copy':<10} {'build s':>7} {'+MiB':>6} {'share':>6} {'agree':>6} {'dev max':>8} {'p99.9':>6} "
          f"{'/std max':>8} {'ms@1':>6} {'ms@4':>6}")
    print(f"{'float32':<10} {'-':>7} {0:>6} {'-':>6} {'-':>6} {'-':>8} {'-':>6} {'-':>8} "
          f"{ref['token_ms']['1']:>6.2f} {ref['token_ms']['4']:>6.2f}")
    for r in rows:
        print(f"{r['scheme']:<10} {r['build_s']:>7.2f} {r['added_mib']:>6.1f} {r['added_share_of_float32']:>6.1%} "
              f"{r['argmax_agreement']:>6.1%} {r['logit_dev_max']:>8.3f} {r['logit_dev_p999']:>6.3f} "
              f"{r['logit_dev_over_std_max']:>8.3f} {r['token_ms']['1']:>6.2f} {r['token_ms']['4']:>6.2f}")
    print(f"float32 weights: {ref['float32_mib']} MiB; peak RSS after the copies: {rows[-1]['peak_rss_mib_after']} MiB")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

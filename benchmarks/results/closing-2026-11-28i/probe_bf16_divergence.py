"""Where the default's bfloat16 decode of SmolLM2 leaves HF greedy in bfloat16, is it a near-tie?

For Spec-Bench first turns (seed 21, two per category, through the chat template, 64 new tokens):
the CLI default (``Session(data/heads-smollm2, dtype="bfloat16")``) against HF ``generate`` greedy
on the same bfloat16 model. At each output's first difference: both tokens' logits in one
bfloat16 forward over the common prefix (and their gap in bfloat16 steps at that magnitude), and
in float32. HF prompt lookup (10 tokens) is probed the same way.

    .venv/bin/python benchmarks/results/closing-2026-11-28i/probe_bf16_divergence.py
"""
import sys

import torch

sys.path.insert(0, "benchmarks")
from spec_bench import QUESTIONS, cli_default, sample_questions  # noqa: E402

from latticedraft.decoding.eval import hf_baselines  # noqa: E402
from latticedraft.decoding.runs.session import Session  # noqa: E402

torch.set_num_threads(2)
s = Session("data/heads-smollm2", dtype="bfloat16", threads=2)
base = s.model.base
m32 = type(base).from_pretrained(s.base_dir, dtype=torch.float32).eval()
method, opts = cli_default(s.model_dir)
qs = sample_questions(QUESTIONS, 2, 21)
tmpl = s.chat_template()
rows = {"ours: default (CLI)": [], "HF prompt lookup": []}
for q in qs:
    ids = tmpl.ids([{"role": "user", "content": q["turns"][0]}])
    ref = hf_baselines.greedy(base, [ids], 64, s.eos)[0][0].tolist()
    outs = {"ours: default (CLI)": s.decode([ids], method, opts, max_new_tokens=64).sequences[0].tokens.tolist(),
            "HF prompt lookup": hf_baselines.prompt_lookup(base, [ids], 64, 10, s.eos)[0][0].tolist()}
    for name, got in outs.items():
        d = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
        if d is None:
            rows[name].append((q["bench_category"], None))
            continue
        x = torch.tensor([list(ids) + ref[:d]])
        with torch.no_grad():
            lb, l32 = base(x).logits[0, -1].float(), m32(x).logits[0, -1]
        a, b = ref[d], got[d]
        ulp = 2.0 ** (torch.floor(torch.log2(lb[a].abs())).item() - 7)  # one bfloat16 step at that magnitude
        rows[name].append((q["bench_category"], dict(at=d, bf16_gap=round(float(lb[a] - lb[b]), 4),
                                                     bf16_steps=round(float(lb[a] - lb[b]) / ulp, 2),
                                                     fp32_gap=round(float(l32[a] - l32[b]), 4))))
for name, rs in rows.items():
    left = [r for _, r in rs if r]
    print(f"{name}: {len(rs) - len(left)}/{len(rs)} equal HF greedy in bfloat16")
    for cat, r in rs:
        if r:
            print(f"  {cat:<15} first difference at token {r['at']:>2}: HF's token leads ours by {r['bf16_gap']:+.4f} "
                  f"in one bfloat16 forward ({r['bf16_steps']:+.2f} bfloat16 steps), {r['fp32_gap']:+.4f} in float32")

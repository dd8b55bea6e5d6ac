"""Spec-Bench on a real model: speed-up over HF greedy per category, through the chat template.

Spec-Bench (Xia et al., 2024; ``../shared/benchmarks/spec-bench/question.jsonl``) has six
categories: MT-bench (80 multi-turn questions), translation, summarization, QA, math reasoning and
RAG (80 each). This samples ``--per-category`` questions of each (seeded), renders each turn with
the model's chat template (``apply_chat_template(..., add_generation_prompt=True)``) and decodes it
with every row below, round-robin, after one untimed warm-up pass. An MT-bench question's second
turn is asked as Spec-Bench asks it: after the first turn and the model's own answer to it (HF
greedy's, which every lossless row reproduces), and counts in MT-bench's tokens and seconds
(``--turns first`` leaves it out):

- greedy (batch 1): HF ``generate`` greedy (the reference), HF prompt lookup, HF assisted
  generation with the model's own int4 copy as ``assistant_model`` (the one the self-draft builds,
  ``gpu.models.quantized.quantized_copy``) and with ``--draft-model``, and latticedraft: the CLI's
  default on ``--model`` (as ``latticedraft decode --model M --chat`` runs it), the self-draft
  alone, heads only, n-gram-rescored heads (``--heads``), context + LM n-grams, lookahead, the
  draft model, and our plain greedy loop;
- ``--batch-size 4`` adds HF left-padded batched greedy against our default at batch 4;
- ``--temperatures 0.7 1.0`` adds HF ``generate(do_sample=True)`` against our lossless sampling:
  the CLI's default (``--do-sample``) and, on the base model, context + LM n-grams without a drafter.

The decoders of these rows are defined once for this benchmark and ``latticedraft demo``
(``latticedraft/decoding/eval/rows.py``).

Reported per category and overall (the mean of the six categories' speed-ups, as Spec-Bench
reports it): tokens/s, the speed-up over HF greedy, and the mean accepted tokens per target call
(tokens / target forward calls, HF's calls counted by a hook). ``--code-count`` held-out code
prompts (plain text, no template) are reported beside, outside the overall mean. Every greedy row is checked equal
to HF greedy token for token (the exact column: yes, or how many questions are; ``--dtype bfloat16``
runs every row, HF's too, in that dtype, where a multi-token verifier may leave HF greedy at a
near-tie, docs/half-precision.md). Median seconds of ``--repeats``; the load average and machine are
recorded; the JSON goes to ``--out``.

    bash scripts/build_smollm2.sh                                # the model and its 4-gram (once)
    .venv/bin/python benchmarks/spec_bench.py --per-category 2 --repeats 1 --batch-size 4 --temperatures 0.7 1.0
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latticedraft.atomic import write_atomic  # noqa: E402
from latticedraft.cpu import cpu_info  # noqa: E402
from latticedraft.cli.args import DTYPES  # noqa: E402
from latticedraft.decoding.accept.sampling import SamplingOptions  # noqa: E402
from latticedraft.decoding.methods.bpd import DrafterSpec  # noqa: E402
from latticedraft.decoding.eval import hf_baselines  # noqa: E402
from latticedraft.decoding.eval.evaluate import machine  # noqa: E402
from latticedraft.decoding.eval.rows import (CATEGORIES, HEADS_ONLY, NGRAMS, RESCORED_HEADS, SELF_DRAFT,  # noqa: E402
                                             bench_category, int4_copy)
from latticedraft.decoding.rows import cut_at_end  # noqa: E402
from latticedraft.decoding.runs.session import Session  # noqa: E402

QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "spec-bench" / "question.jsonl"
CODE = "code"  # held-out code prompts (plain text, no chat template): reported beside, not in the overall mean
CODE_PROMPTS = Path(__file__).resolve().parent / "prompts" / "heldback-code.jsonl"


def sample_questions(path: Path, per_category: int, seed: int) -> list[dict]:
    """``per_category`` questions of each Spec-Bench category (MT-bench's eight as one), seeded,
    in file order within a category; each with ``bench_category``."""
    by_cat: dict[str, list[dict]] = {c: [] for c in CATEGORIES}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            q = json.loads(line)
            cat = bench_category(q["category"])
            by_cat[cat].append({**q, "bench_category": cat})
    rng = random.Random(seed)
    out = []
    for c in CATEGORIES:
        pick = sorted(rng.sample(range(len(by_cat[c])), min(per_category, len(by_cat[c]))))
        out += [by_cat[c][i] for i in pick]
    return out


def later_turns(qs: list[dict], ids: list, template, session, max_new_tokens: int) -> tuple[list[dict], list]:
    """``qs``/``ids`` (first turns) with every later turn added as its own prompt: the conversation so
    far (each earlier turn answered by HF greedy, at most ``max_new_tokens``, as text) and the
    turn's question; a later turn's ``question_id`` is ``<id>-turn<k>``."""
    from latticedraft.decoding.eval import hf_baselines
    from latticedraft.decoding.runs.turns import messages_after

    out_q, out_ids = [], []
    for q, x in zip(qs, ids):
        out_q.append(q)
        out_ids.append(x)
        answers = []
        for k in range(2, len(q["turns"]) + 1):
            answers.append(hf_baselines.greedy(session.model, [x], max_new_tokens, session.eos)[0][0])
            x = template.ids(messages_after(q["turns"], answers, session.tokenizer))
            out_q.append({**q, "question_id": f"{q['question_id']}-turn{k}"})
            out_ids.append(x)
    return out_q, out_ids


def cli_default(model: str, *extra: str):
    """(method, options) that ``latticedraft decode --model MODEL --chat EXTRA...`` runs by default."""
    from latticedraft.cli import decode_options

    m, options = decode_options("--model", model, "--chat", *extra)
    return m.name, options


def greedy_rows(a) -> dict:
    """row name -> (which session: "base" | "heads", method, options); None options: the method's defaults."""
    rows = {"ours: default (CLI)": ("heads" if a.heads else "base", *cli_default(a.heads or a.model)),
            "ours: self-draft alone": ("base", "bpd", SELF_DRAFT)}
    if a.heads:
        rows["ours: heads only"] = ("heads", "bpd", HEADS_ONLY)
        rows["ours: n-gram-rescored heads"] = ("heads", "bpd", RESCORED_HEADS)
    rows["ours: context + LM n-grams"] = ("base", "bpd", NGRAMS)  # also what the n-gram sampled rows run
    rows["ours: context n-grams only"] = ("base", "bpd", replace(NGRAMS, lm_drafts=0))
    rows["ours: lookahead"] = ("base", "lookahead", None)
    if a.draft_model:
        rows["ours: draft model"] = ("base", "bpd", DrafterSpec("model", tree="auto"))  # as HF assisted: no n-grams
    rows["ours: greedy loop"] = ("base", "bpd", DrafterSpec("none"))
    return rows


@torch.no_grad()
def main(argv=None) -> int:
    from latticedraft.paths import smollm2_dir
    from latticedraft.quiet import add_verbose_arg, quiet_libraries

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(smollm2_dir()), help="HF model directory (default: the fetched SmolLM2)")
    ap.add_argument("--heads", default=None, help="a head directory built for --model (adds the heads rows)")
    ap.add_argument("--lm", default=None, help="an n-gram LM build with the model's tokenizer (LM drafts, rescoring; "
                                               "default: the one built with it, e.g. scripts/build_smollm2.sh's)")
    ap.add_argument("--draft-model", default=None, help="a draft model for HF assisted generation and ours")
    ap.add_argument("--questions", default=str(QUESTIONS))
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--code-prompts", default=str(CODE_PROMPTS), help="held-out code prompts (plain, no template)")
    ap.add_argument("--code-count", type=int, default=4, help="how many of them (0: none)")
    ap.add_argument("--seed", type=int, default=0, help="which questions are drawn (and the sampling seeds)")
    ap.add_argument("--turns", choices=("all", "first"), default="all",
                    help="all: MT-bench's later turns too, after the model's greedy answer (Spec-Bench's protocol)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=1, help="> 1 adds HF batched greedy vs our default at that batch")
    ap.add_argument("--temperatures", type=float, nargs="*", default=[], help="add sampled rows (e.g. 0.7 1.0)")
    ap.add_argument("--pld-tokens", type=int, default=10)
    ap.add_argument("--llama-cpp", choices=("on", "off"), default="on",
                    help="the llama.cpp rows (F32 greedy, Q4_1 as shipped; bash benchmarks/install_llama_cpp.sh)")
    ap.add_argument("--only", nargs="+", default=None, help="run only these rows (HF greedy always runs)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="float32", choices=DTYPES,
                    help="the model's weights for every row, HF's included (half precision: a row may leave HF "
                         "greedy at a near-tie; the exact column then counts the questions it equals)")
    ap.add_argument("--out", default="benchmarks/results/spec_bench.json")
    add_verbose_arg(ap)
    a = ap.parse_args(argv)
    quiet_libraries(a.verbose)
    if not Path(a.model).is_dir():
        sys.exit(f"error: --model {a.model} does not exist; run `.venv/bin/latticedraft fetch smollm2` first")

    sb = Session(a.model, None, a.lm, None, a.device, a.threads, a.draft_model, dtype=a.dtype)
    sh = Session(a.heads, None, a.lm, None, a.device, a.threads, a.draft_model, dtype=a.dtype) if a.heads else None
    sb.notify = lambda m: print(m, file=sys.stderr)
    if sh is not None:
        sh.notify = sb.notify
    qs = sample_questions(Path(a.questions), a.per_category, a.seed)
    template = sb.chat_template()
    ids = [template.ids([{"role": "user", "content": q["turns"][0]}]) for q in qs]
    eos = sb.eos
    if a.turns == "all":
        qs, ids = later_turns(qs, ids, template, sb, a.max_new_tokens)
    if a.code_count:
        from latticedraft.decoding.runs.loaders import encode
        from latticedraft.decoding.runs.prompt_set import read_prompts

        code = read_prompts(a.code_prompts, limit=a.code_count)
        qs += [{"question_id": f"code-{k}", "bench_category": CODE} for k in range(len(code))]
        ids += encode(sb.tokenizer, [r["prompt"] for r in code])
    cats = [q["bench_category"] for q in qs]
    base = sb.model
    calls = hf_baselines.CallCounter(base)

    rows = greedy_rows(a)
    default = rows["ours: default (CLI)"]  # also what the sampled and batched rows run
    ngrams = rows["ours: context + LM n-grams"]
    if a.only:
        rows = {k: v for k, v in rows.items() if k in a.only}
    names = (["HF greedy", "HF prompt lookup", "HF assisted (int4 self-draft)"]
             + (["HF assisted (draft model)"] if a.draft_model else []) + list(rows))
    peers = llama_cpp_rows(a)
    names[1:1] = list(peers)
    if a.only:
        names = [n for n in names if n == "HF greedy" or n in a.only]
    if a.batch_size > 1:
        names += [f"HF batched greedy b={a.batch_size}", f"ours: default (CLI) b={a.batch_size}"]
    sampled = {"ours: lossless sampling": (default[0], *cli_default(a.heads or a.model, "--do-sample")),
               "ours: lossless sampling n-grams": ngrams}  # the first as `decode --do-sample`
    for T in a.temperatures:
        names += [f"HF sampling T={T}"] + [f"{k} T={T}" for k in sampled]
    sess = {"base": sb, "heads": sh}
    for n in names:  # T(n) curves and acceptance rates: measured once (cached), before any timing
        key = n.split(" b=")[0]
        key_t = n.split(" T=")[0]
        if key in rows or " b=" in n and key == "ours: default (CLI)" or key_t in sampled:
            who, method, opts = default if " b=" in n else sampled[key_t] if key_t in sampled else rows[key]
            t0 = time.perf_counter()
            sess[who].prepare(method, opts, a.batch_size if " b=" in n else 1)
            print(f"prepared {n} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)

    def one(n, i):
        """(tokens int64[m], target calls) of row ``n`` on question ``i``."""
        x = [ids[i]]
        if n == "HF greedy":
            c0 = calls.n
            return hf_baselines.greedy(base, x, a.max_new_tokens, eos)[0][0], calls.n - c0
        if n == "HF prompt lookup":
            c0 = calls.n
            return hf_baselines.prompt_lookup(base, x, a.max_new_tokens, a.pld_tokens, eos)[0][0], calls.n - c0
        if n in peers:
            toks = peers[n].greedy(ids[i], a.max_new_tokens, eos)
            return toks, len(toks)  # one forward a token (the prompt's prefill the first)
        if n == "HF assisted (int4 self-draft)":
            c0 = calls.n
            return hf_baselines.assisted(base, int4_copy(sb), x, a.max_new_tokens, eos)[0][0], calls.n - c0
        if n == "HF assisted (draft model)":
            c0 = calls.n
            return hf_baselines.assisted(base, sb.draft_model, x, a.max_new_tokens, eos)[0][0], calls.n - c0
        if n.startswith("HF sampling"):
            T = float(n.split(" T=")[1])
            torch.manual_seed(a.seed * 100003 + i)
            c0 = calls.n
            t = torch.as_tensor(ids[i][None])
            g = base.generate(t, attention_mask=torch.ones_like(t), do_sample=True, temperature=T, top_k=50, top_p=1.0,
                              max_new_tokens=a.max_new_tokens, eos_token_id=eos, pad_token_id=0)
            return cut_at_end(g[0, t.shape[1]:].tolist(), eos), calls.n - c0
        if n.split(" T=")[0] in sampled:
            who, method, opts = sampled[n.split(" T=")[0]]
            smp = SamplingOptions(temperature=float(n.split(" T=")[1]), top_k=50, top_p=1.0, seed=a.seed)
            r = sess[who].decode(x, method, opts, max_new_tokens=a.max_new_tokens, sampling=smp, first_row=i)
            return r.sequences[0].tokens, r.calls
        who, method, opts = rows[n]
        r = sess[who].decode(x, method, opts, max_new_tokens=a.max_new_tokens)
        return r.sequences[0].tokens, r.calls

    def batched(n):
        """{i: (tokens, calls)}, seconds of row ``n`` over every question at ``--batch-size``."""
        t0 = time.perf_counter()
        if n.startswith("HF batched"):
            toks, _ = hf_baselines.greedy_batched(base, ids, a.max_new_tokens, a.batch_size, eos)
            return {i: (t, None) for i, t in enumerate(toks)}, time.perf_counter() - t0
        who, method, opts = default
        r = sess[who].decode(ids, method, opts, max_new_tokens=a.max_new_tokens, batch_size=a.batch_size)
        return {i: (q.tokens, q.calls) for i, q in enumerate(r.sequences)}, time.perf_counter() - t0

    # per (row, question): seconds of each timed repeat; the warm-up pass decodes one question per row
    secs = {(n, i): [] for n in names for i in range(len(qs))}
    batch_secs = {n: [] for n in names if " b=" in n}
    out_of: dict = {}
    for rep in range(a.repeats + 1):
        for n in names:
            if " b=" in n:
                res, dt = batched(n)
                if rep:
                    batch_secs[n].append(dt)
                    out_of.update({(n, i): v for i, v in res.items()})
                continue
            for i in (range(len(qs)) if rep else range(1)):
                t0 = time.perf_counter()
                toks, c = one(n, i)
                dt = time.perf_counter() - t0
                if rep:
                    secs[(n, i)].append(dt)
                    out_of[(n, i)] = (np.asarray(toks), c)
        print(f"round {rep}/{a.repeats} done", file=sys.stderr)

    ref = {i: out_of[("HF greedy", i)][0] for i in range(len(qs))}
    results = []
    for n in names:
        row = {"name": n, "categories": {}}
        if n in batch_secs:  # one batched pass: tokens/s over all questions only
            toks = sum(len(out_of[(n, i)][0]) for i in range(len(qs)))
            row["tokens_per_s"] = round(toks / statistics.median(batch_secs[n]), 2)
            row["tokens_per_s_repeats"] = [round(toks / t, 2) for t in batch_secs[n]]
            cs = [out_of[(n, i)][1] for i in range(len(qs))]
            row["tokens_per_call"] = round(toks / sum(cs), 3) if all(c is not None for c in cs) else None
        else:
            for c in (*CATEGORIES, CODE):
                qi = [i for i in range(len(qs)) if cats[i] == c]
                if not qi:
                    continue
                toks = sum(len(out_of[(n, i)][0]) for i in qi)
                sec = sum(statistics.median(secs[(n, i)]) for i in qi)
                ncalls = sum(out_of[(n, i)][1] for i in qi)
                row["categories"][c] = {"tokens": toks, "seconds": round(sec, 4), "tokens_per_s": round(toks / sec, 2),
                                        "tokens_per_call": round(toks / max(ncalls, 1), 3)}
            six = [v for c, v in row["categories"].items() if c != CODE]
            toks = sum(v["tokens"] for v in six)
            row["tokens_per_s"] = round(toks / sum(v["seconds"] for v in six), 2)
            qi6 = [i for i in range(len(qs)) if cats[i] != CODE]
            row["tokens_per_s_repeats"] = [round(toks / sum(secs[(n, i)][r] for i in qi6), 2) for r in range(a.repeats)]
            row["tokens_per_call"] = round(statistics.mean(v["tokens_per_call"] for v in six), 3)
        row["exact"] = row["equal_questions"] = None  # sampled rows: not compared with greedy
        if "sampling" not in n:
            equal = sum(np.array_equal(out_of[(n, i)][0], ref[i]) for i in range(len(qs)))
            row["exact"], row["equal_questions"] = equal == len(qs), int(equal)
        results.append(row)
    g = results[0]
    for r in results:
        if r["categories"]:
            for c, v in r["categories"].items():
                v["speedup"] = round(v["tokens_per_s"] / g["categories"][c]["tokens_per_s"], 3)
            r["speedup_overall"] = round(statistics.mean(v["speedup"] for c, v in r["categories"].items()
                                                         if c != CODE), 3)
    by = {r["name"]: r for r in results}
    for r in results:
        ref_row = (by[f"HF batched greedy b={a.batch_size}"] if " b=" in r["name"] else
                   by["HF sampling T=" + r["name"].split(" T=")[1]] if r["name"].startswith("ours: lossless") else g)
        steady(r, ref_row)
    for r in results:
        if "HF prompt lookup" in by and r.get("speedup_overall"):
            r["vs_prompt_lookup"] = round(r["speedup_overall"] / by["HF prompt lookup"]["speedup_overall"], 3)
        if " b=" in r["name"] and f"HF batched greedy b={a.batch_size}" in by:
            r["vs_batched_greedy"] = round(r["tokens_per_s"] / by[f"HF batched greedy b={a.batch_size}"]["tokens_per_s"], 3)
        if r["name"].startswith("ours: lossless sampling"):
            hf = by["HF sampling T=" + r["name"].split(" T=")[1]]
            r["vs_hf_sampling"] = round(r["speedup_overall"] / hf["speedup_overall"], 3)
    from latticedraft.decoding.runs.loaders import lm_for

    out = {"benchmark": "spec_bench", "model": a.model, "heads": a.heads, "lm": a.lm or str(lm_for(sb.tokenizer)), "draft_model": a.draft_model,
           "questions": [q["question_id"] for q in qs], "turns": a.turns, "per_category": a.per_category, "seed": a.seed,
           "max_new_tokens": a.max_new_tokens, "repeats": a.repeats, "dtype": a.dtype, "load_average": os.getloadavg(),
           "machine": {**machine(), "cpu": cpu_info(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                       "device": a.device or "cpu"},
           "self_draft": [e for s in (sb, sh) if s is not None for e in s.learned.events if e.startswith("--self-draft")],
           "rows": results}
    write_atomic(Path(a.out), json.dumps(out, indent=1) + "\n")
    print(f"\nSpec-Bench, {len(qs)} prompts ({a.per_category} questions per category, turns: {a.turns}, "
          f"seed {a.seed}) x {a.max_new_tokens} new "
          f"tokens, median of {a.repeats}, {torch.get_num_threads()} threads, load average "
          f"{out['load_average'][0]:.2f}, model {a.model} in {a.dtype}")
    head = " ".join(f"{c[:8]:>8}" for c in CATEGORIES)
    print(f"{'row':<34} {head} {'overall':>8} {'tok/call':>8} {'tok/s':>7} {'x HF':>6} {'code':>6} {'exact':>5}")
    for r in results:
        cs = " ".join(f"{r['categories'][c]['speedup']:>7.2f}x" if c in r["categories"] else f"{'-':>8}"
                      for c in CATEGORIES)
        ov = "unsteady" if r.get("unsteady") else f"{r['speedup_overall']:.2f}x" if r.get("speedup_overall") else "-"
        xs = against_hf(r)
        ex = "-" if r["exact"] is None else ("yes" if r["exact"] else f"{r['equal_questions']}/{len(qs)}")
        tpc = f"{r['tokens_per_call']:.2f}" if r.get("tokens_per_call") else "-"
        code = f"{r['categories'][CODE]['speedup']:.2f}x" if CODE in r["categories"] else "-"
        print(f"{r['name']:<34} {cs} {ov:>8} {tpc:>8} {r['tokens_per_s']:>7.1f} "
              f"{(f'{xs:.2f}' if xs else '-'):>6} {code:>6} {ex:>5}")
    print("x HF: each row against what a user would run instead: HF prompt lookup for greedy rows, HF batched "
          "greedy for b= rows, HF sampling at the same T for sampled rows")
    print(f"CPU: {out['machine']['cpu']['model']} ({', '.join(out['machine']['cpu']['flags'])}), torch {torch.__version__}")
    for r in results:
        if r.get("speedup_spread"):
            lo, hi = r["speedup_spread"]
            print(f"  {r['name']}: {lo:.2f}-{hi:.2f}x over its {a.repeats} passes" + (" (unsteady: > 15% apart, "
                  "no figure)" if r.get("unsteady") else ""))
    for e in out["self_draft"]:
        print(f"  {e}")
    print(f"wrote {a.out}")
    return 0


def steady(row: dict, reference: dict, tolerance: float = 0.15) -> None:
    """The row's speed-up over ``reference`` pass by pass (``speedup_spread``: [min, max]);
    ``unsteady`` where two passes disagree by more than ``tolerance``: the ratio is then no figure."""
    mine, theirs = row.get("tokens_per_s_repeats") or [], reference.get("tokens_per_s_repeats") or []
    if len(mine) < 2 or len(mine) != len(theirs):
        return
    ratios = [m / t for m, t in zip(mine, theirs)]
    row["speedup_spread"] = [round(min(ratios), 3), round(max(ratios), 3)]
    row["unsteady"] = max(ratios) > (1 + tolerance) * min(ratios)


def llama_cpp_rows(a) -> dict:
    """row name -> ``LlamaCppPeer`` for llama.cpp's rows, {} (one line saying why) where they cannot run."""
    from latticedraft.paths import smollm2_dir

    if a.llama_cpp == "off":
        return {}
    if Path(a.model).resolve() != smollm2_dir().resolve() or a.dtype != "float32":
        print(f"skipping the llama.cpp rows: their GGUFs are SmolLM2's in float32 ({smollm2_dir()}), "
              f"not {a.model} in {a.dtype}", file=sys.stderr)
        return {}
    from llama_cpp_peer import LlamaCppPeer

    rows = {}
    for kind, name in (("F32", "llama.cpp F32 greedy"), ("Q4_1", "llama.cpp Q4_1 (as shipped)")):
        peer, why = LlamaCppPeer.open(kind, a.threads)
        if peer is None:
            print(f"skipping the llama.cpp rows: {why}", file=sys.stderr)
            return {}
        rows[name] = peer
    return rows


def against_hf(row: dict) -> float | None:
    """The row's speed-up over its own HF baseline: HF sampling for sampled rows, HF batched greedy
    for batched rows, else HF prompt lookup (None where that baseline did not run)."""
    if "sampling" in row["name"]:
        return row.get("vs_hf_sampling")
    if " b=" in row["name"]:
        return row.get("vs_batched_greedy")
    return row.get("vs_prompt_lookup")


if __name__ == "__main__":
    sys.exit(main())

"""Exactness in half precision: every lossless method against ``generate(do_sample=False)`` in the
same dtype, and how far each kept token is from the argmax.

For each model (the bundled base with its heads, adapter and exit heads; SmolLM2 with its heads
where fetched), each dtype (``bfloat16``, ``float16``; ``float32`` as the control) and each
lossless method (``bpd`` with the CLI's defaults, ``greedy``, ``lookahead``, ``kangaroo``,
``ppd``), plus transformers' own prompt lookup (a multi-token verifier a user would run
instead): how many prompts equal HF greedy in that dtype token for token, where the first
difference falls, and the largest *gap* of a kept token: ``max(logits) - logits[kept]`` under
one forward of the model over the prompt and the row's own output, in the same dtype (0 means
every kept token is that forward's argmax). HF greedy's own gap is the floor: a forward over many
positions rounds differently from one-position steps, so even the reference is not the argmax of
that forward everywhere. The row "HF 4-position forward" is no decoder: it is the argmax of
transformers' own forward run over 4 positions at a time with its KV cache, teacher-forced on HF
greedy's output, i.e. what any multi-token verifier (HF's prompt lookup and assisted generation
included) computes where it checks 4 tokens in one call.

    .venv/bin/python benchmarks/half_precision.py                   # bundled model, 8 code prompts
    .venv/bin/python benchmarks/half_precision.py --smollm2 --count 6 --max-new-tokens 48
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latticedraft.atomic import write_atomic  # noqa: E402
from latticedraft.decoding import registry  # noqa: E402
from latticedraft.decoding.runs.prompt_set import read_prompts  # noqa: E402
from latticedraft.decoding.runs.session import Session  # noqa: E402
from latticedraft.errors import LatticedraftError  # noqa: E402
from latticedraft.gpu.models import hf  # noqa: E402
from latticedraft.paths import data_dir, smollm2_dir  # noqa: E402

METHODS = ("bpd", "greedy", "lookahead", "kangaroo", "ppd")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ROOT = Path(__file__).resolve().parent


def session(model_dir: str | None, method: str, dtype: torch.dtype) -> Session:
    """The method's session (its bundled model by default) with every weight cast to ``dtype``."""
    m = registry.get(method)
    md = model_dir if model_dir is not None or m.default_model is None else str(data_dir() / m.default_model)
    s = Session(md)
    s.model.to(dtype)
    return s


def cli_options(model_dir: str | None, method: str):
    """The options ``latticedraft decode --method METHOD`` runs with (the CLI's defaults)."""
    from latticedraft.cli import decode_options

    return decode_options("--method", method, *([] if model_dir is None else ["--model", model_dir]))[1]


def first_difference(got: list, want: list) -> int | None:
    """Index of the first differing token (a shorter row differs where it ends); None if equal."""
    d = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
    return d if d is not None or len(got) == len(want) else min(len(got), len(want))


@torch.no_grad()
def kept_gap(base, prompt: np.ndarray, new: list) -> float:
    """max over the row's tokens of ``max(logits) - logits[kept]`` (nats) under one forward of
    ``base`` over prompt + new, in its own dtype."""
    if not new:
        return 0.0
    ids = torch.as_tensor(np.concatenate([prompt, np.asarray(new, dtype=np.int64)])[None])
    logits = base(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    kept = logits.gather(1, torch.as_tensor(new)[:, None])[:, 0]
    return float((logits.max(-1).values - kept).max())


@torch.no_grad()
def chunked_argmax(base, prompt: np.ndarray, want: list, chunk: int = 4) -> list:
    """The argmax at each of ``want``'s positions when transformers' own forward runs over
    ``chunk`` positions at a time with its KV cache (teacher-forced on ``want``, HF greedy's
    output): what any multi-token verifier computes, with HF's own kernels."""
    from transformers import DynamicCache

    ids = torch.as_tensor(np.concatenate([prompt, np.asarray(want, dtype=np.int64)])[None])
    cache = DynamicCache()
    out = base(input_ids=ids[:, : len(prompt)], use_cache=True, **hf.cache_arg(cache))
    picks = [int(out.logits[0, -1].argmax())]
    for s in range(len(prompt), ids.shape[1] - 1, chunk):
        e = min(s + chunk, ids.shape[1] - 1)
        out = base(input_ids=ids[:, s:e], use_cache=True, **hf.cache_arg(cache))
        picks += out.logits[0].argmax(-1).tolist()
    return picks[: len(want)]


@torch.no_grad()
def hf_rows(base, ids: list, n: int, eos, **kw) -> list[list]:
    out = []
    for i in ids:
        x = torch.as_tensor(i[None])
        g = base.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n, pad_token_id=0,
                          eos_token_id=eos, **kw)
        out.append(g[0, len(i):].tolist())
    return out


def measure(model_dir, label: str, prompts: list, n: int, dtypes: list, methods: list, chat: bool) -> list[dict]:
    from latticedraft.decoding.runs.chat import prompt_ids

    rows = []
    for dname in dtypes:
        dtype = DTYPES[dname]
        ref_session = session(model_dir, "bpd", dtype)
        base = getattr(ref_session.model, "base", ref_session.model)
        ids = prompt_ids(ref_session, prompts, chat)
        want = hf_rows(base, ids, n, ref_session.eos)
        candidates = {"HF greedy (reference)": lambda: want,
                      "HF 4-position forward": lambda: [chunked_argmax(base, i, w) for i, w in zip(ids, want)],
                      "HF prompt lookup": lambda: hf_rows(base, ids, n, ref_session.eos, prompt_lookup_num_tokens=10)}
        for meth in methods:
            candidates[meth] = lambda meth=meth: [list(r.tokens) for r in session(model_dir, meth, dtype).decode(
                ids, meth, cli_options(model_dir, meth), max_new_tokens=n).sequences]
        for name, run in candidates.items():
            t0 = time.perf_counter()
            try:
                got = run()
            except LatticedraftError as e:
                rows.append({"model": label, "dtype": dname, "method": name, "refused": str(e).splitlines()[0]})
                print(f"{label:8s} {dname:9s} {name:22s} refused: {str(e).splitlines()[0][:90]}", flush=True)
                continue
            diffs = [first_difference(g, w) for g, w in zip(got, want)]
            forced = name == "HF 4-position forward"  # per-position picks on greedy's prefixes, not a sequence
            gap = None if forced else round(max(kept_gap(base, i, g) for i, g in zip(ids, got)), 4)
            r = {"model": label, "dtype": dname, "method": name, "prompts": len(ids),
                 "equal": sum(d is None for d in diffs), "first_differences": [d for d in diffs if d is not None],
                 "max_kept_gap": gap, "seconds": round(time.perf_counter() - t0, 1)}
            rows.append(r)
            print(f"{label:8s} {dname:9s} {name:22s} {r['equal']}/{r['prompts']} equal  first differences "
                  f"{r['first_differences']}  max gap {'-' if gap is None else f'{gap:.4f}'}", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default=str(ROOT / "prompts" / "heldback-code.jsonl"))
    ap.add_argument("--count", type=int, default=8)
    ap.add_argument("--first-line", action="store_true", help="cut each code prompt to its first line (short prompts)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16", "float32"], choices=list(DTYPES))
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--smollm2", action="store_true", help="also SmolLM2 (fetched) with data/heads-smollm2, chat")
    ap.add_argument("--chat-prompts", default=str(data_dir() / "chat-prompts.jsonl"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "results" / "half_precision.json"))
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    prompts = [r["prompt"] for r in read_prompts(a.prompts, limit=a.count)]
    if a.first_line:
        prompts = [p.split("\n", 1)[0] + "\n" for p in prompts]
    rows = measure(None, "bundled", prompts, a.max_new_tokens, a.dtypes, a.methods, chat=False)
    if a.smollm2:
        heads = data_dir() / "heads-smollm2"
        if not (smollm2_dir() / "config.json").is_file():
            print("SmolLM2 not fetched (latticedraft fetch smollm2); skipped", file=sys.stderr)
        else:
            chat = [r["prompt"] for r in read_prompts(a.chat_prompts, limit=a.count)]
            rows += measure(str(heads), "smollm2", chat, a.max_new_tokens, a.dtypes,
                            [m for m in a.methods if m in ("bpd", "greedy", "lookahead")], chat=True)
    out = {"benchmark": "half_precision", "prompts": a.prompts, "count": a.count, "first_line": a.first_line,
           "max_new_tokens": a.max_new_tokens,
           "threads": a.threads, "machine": platform.processor() or platform.machine(),
           "torch": torch.__version__, "load_average": list(os.getloadavg()), "rows": rows}
    write_atomic(Path(a.out), json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

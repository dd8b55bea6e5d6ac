"""Do the heads (and draft models) agree with their base? Per head agreement and block efficiency.

For each head checkpoint (``--heads LABEL=DIR ...``; e.g. corpus-trained vs self-distilled) and each
prompt set (``--prompts LABEL=FILE ...``; default the held-back third-party code of
``benchmarks/prompts/heldback-code.jsonl`` and the bundled held-out prompts ``data/prompts.jsonl``
without the tuning split ``CALIBRATION_PROMPTS``, on which acceptance rates were once fitted: left out so
that figures stay comparable):

- agreement: the base's greedy continuation of every prompt (``--max-new-tokens``) is read once by
  the model (teacher forcing); at every continuation position t, head j's top-1 (and top-k,
  ``--topk``) is compared with the base's greedy token t+j. Head 1 is the base itself (1.0 up to
  ties), a check that the texts and offsets line up;
- block efficiency (tokens / target calls, the prefill counted) of the heads-only drafters as the
  issue measures them: ``top1`` and ``parallel-base --nbest 8 --slots 3``, fixed tree, no context
  n-grams, full vocabulary (``--drafters`` adds ``parallel``, the bundled 4-gram with the model's
  tuned alpha); every output checked token for token against greedy decoding.

Draft models (``--draft-models LABEL=DIR ...``): top-1 agreement with the base's greedy next token
on the same texts, and tokens per target call with ``--drafter model --gamma G``.

One process, one torch thread. Nothing here is timed: agreement and block efficiency do not depend
on the machine's load.

    nice -n 5 .venv/bin/python benchmarks/head_agreement.py \\
        --heads corpus=/tmp/heads-corpus self-distilled=data/heads-stern --draft-models small=data/rescorer-small
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from latticedraft.atomic import write_atomic  # noqa: E402
from latticedraft.decoding.eval.evaluate import EvalConfig, _run, machine  # noqa: E402
from latticedraft.decoding.runs.prompt_length import fit_prompts  # noqa: E402
from latticedraft.decoding.methods.bpd import DrafterSpec  # noqa: E402
from latticedraft.decoding.runs.loaders import encode  # noqa: E402
from latticedraft.decoding.runs.prompt_set import read_prompt_set, read_prompts  # noqa: E402
from latticedraft.decoding.runs.session import Session  # noqa: E402
from latticedraft.gpu.models.draft_vocab import load_ranked  # noqa: E402
from latticedraft.paths import data_dir  # noqa: E402

HELDBACK = ROOT / "benchmarks" / "prompts" / "heldback-code.jsonl"


CALIBRATION_PROMPTS = slice(30, 42)  # the tuning split (Appendix E) of data/prompts.jsonl

def drafter_specs(names: list[str], alpha: float, draft_vocab: int | None = None) -> dict[str, DrafterSpec]:
    """The heads-only drafters of the issue (and ``parallel`` with the 4-gram): fixed tree, no
    context n-grams, the full vocabulary or the heads' ``draft_vocab`` most frequent tokens."""
    all_specs = {"top1": DrafterSpec("top1", draft_vocab=draft_vocab),
                 "parallel-base p=8 slots=3": DrafterSpec("parallel-base", nbest=8, slots=3, draft_vocab=draft_vocab),
                 "parallel p=8 slots=3": DrafterSpec("parallel", nbest=8, slots=3, alpha=alpha,
                                                     draft_vocab=draft_vocab)}
    short = {"top1": "top1", "parallel-base": "parallel-base p=8 slots=3", "parallel": "parallel p=8 slots=3"}
    return {short[n]: all_specs[short[n]] for n in names}


def prompt_sets(items: list[str] | None) -> dict[str, tuple[Path, list[int] | None]]:
    """label -> (file, indices or None = all); the bundled file leaves out the tuning split."""
    if not items:
        n = len(read_prompts(data_dir() / "prompts.jsonl"))
        calib = range(n)[CALIBRATION_PROMPTS]
        return {"held-back code": (HELDBACK, None),
                "bundled held-out": (data_dir() / "prompts.jsonl", [i for i in range(n) if i not in calib])}
    out = {}
    for it in items:
        label, sep, path = it.partition("=")
        if not sep:
            raise SystemExit(f"--prompts {it!r}: use LABEL=FILE.jsonl")
        out[label] = (Path(path), None)
    return out


def pairs(items: list[str] | None, flag: str) -> dict[str, Path]:
    out = {}
    for it in items or []:
        label, sep, path = it.partition("=")
        if not sep or not label or not path:
            raise SystemExit(f"{flag} {it!r}: use LABEL=DIR")
        out[label] = Path(path)
    return out


@torch.no_grad()
def head_agreement(model, ids: list[np.ndarray], refs: list[np.ndarray], topk: int,
                   columns: torch.Tensor | None = None) -> dict:
    """Per head j (index j-1): top-1 and top-``topk`` agreement with the greedy token t+j over the
    continuation positions t (the prompt's last token and on), and the positions counted; heads
    2..h choose among the token ids ``columns`` (int64[V']) only where given."""
    h = int(getattr(model, "num_heads", 1))
    top1, topk_hits, n = np.zeros(h), np.zeros(h), np.zeros(h, dtype=np.int64)
    for p, r in zip(ids, refs):
        text = np.concatenate([p, r])
        x = torch.as_tensor(text[None], dtype=torch.long)
        hl = model(x, heads=True).head_logits[0] if h > 1 else model(input_ids=x).logits[0][:, None]
        for j in range(1, h + 1):
            lo, hi = len(p) - 1, len(text) - j  # positions t with a greedy token t+j
            if hi <= lo:
                continue
            target = torch.as_tensor(text[lo + j : hi + j])
            logits = hl[lo:hi, j - 1].float()
            restrict = columns is not None and j > 1  # head 1 is the base: always the whole vocabulary
            if restrict:
                logits = logits[:, columns]
            best, top = logits.argmax(-1), logits.topk(topk, -1).indices
            if restrict:
                best, top = columns[best], columns[top]
            top1[j - 1] += (best == target).sum().item()
            topk_hits[j - 1] += (top == target[:, None]).any(-1).sum().item()
            n[j - 1] += hi - lo
    return {"top1": [round(float(x), 4) for x in top1 / np.maximum(n, 1)],
            "topk": [round(float(x), 4) for x in topk_hits / np.maximum(n, 1)], "positions": n.tolist()}


@torch.no_grad()
def draft_agreement(draft, ids: list[np.ndarray], refs: list[np.ndarray]) -> dict:
    """A draft model's top-1 agreement with the base's greedy next token on the continuations."""
    hits = n = 0
    for p, r in zip(ids, refs):
        text = np.concatenate([p, r])
        logits = draft(input_ids=torch.as_tensor(text[None], dtype=torch.long)).logits[0]
        lo, hi = len(p) - 1, len(text) - 1
        hits += (logits[lo:hi].argmax(-1) == torch.as_tensor(text[lo + 1 : hi + 1])).sum().item()
        n += hi - lo
    return {"top1": round(hits / max(n, 1), 4), "positions": n}


def prompt_ids(session, file: Path, idx: list[int] | None, chat: bool, sample: int, seed: int):
    """(indices, int64[t] ids per prompt): the records ``idx`` of ``file`` (None: all; ``sample`` > 0:
    that many of them drawn with ``seed``), plain text, or chat records (``messages`` or Spec-Bench's
    ``turns``, the first turn) rendered through the model's chat template with ``chat``."""
    prompts = read_prompt_set(file)[0] if chat else read_prompts(file)
    idx = list(range(len(prompts))) if idx is None else idx
    if sample:
        idx = sorted(random.Random(seed).sample(idx, min(sample, len(idx))))
    if not chat:
        return idx, encode(session.tokenizer, [prompts[i]["prompt"] for i in idx])
    template = session.chat_template()
    return idx, [template.ids(prompts[i].messages) if prompts[i].messages is not None
                 else encode(session.tokenizer, [prompts[i].text])[0] for i in idx]


def measure(heads: dict[str, Path], drafts: dict[str, Path], sets: dict, drafters: list[str], cfg: EvalConfig,
            topk: int, gamma: int, alpha: float | None, notify=print, draft_vocab: int | None = None,
            chat: bool = False, sample: int = 0, seed: int = 0) -> dict:
    out: dict = {"sets": {}}
    first = next(iter(heads.values())) if heads else None
    for set_label, (file, idx) in sets.items():
        ref_session = Session(first, threads=None)
        idx, ids = prompt_ids(ref_session, file, idx, chat, sample, seed)
        ids = fit_prompts(ref_session.model, ids, cfg.max_new_tokens)
        greedy, res = _run(ref_session, "greedy", ids, None, "greedy", None, cfg)
        refs = [s.tokens for s in res.sequences]
        row: dict = {"file": str(file), "prompt_indices": idx, "tokens": greedy.tokens, "heads": {}, "draft_models": {}}
        notify(f"{set_label}: {len(ids)} prompts, greedy {greedy.tokens} tokens")
        for label, d in heads.items():
            s = Session(d, threads=None)
            a = alpha if alpha is not None else _tuned_alpha(d)
            kind = getattr(s.model, "kind", None)
            cols = None if not draft_vocab else torch.as_tensor(load_ranked(d, draft_vocab))
            r = {"dir": str(d), "kind": kind, "num_heads": int(getattr(s.model, "num_heads", 1)),
                 "agreement": head_agreement(s.model, ids, refs, topk, cols), "drafters": {}}
            # BPD verifies Stern heads; DynaMo heads decode with their own sampler (agreement only here)
            for name, spec in (drafter_specs(drafters, a, draft_vocab or None) if kind != "dynamo" else {}).items():
                run, _ = _run(s, name, ids, refs, "bpd", spec, cfg)
                r["drafters"][name] = {"block_efficiency": run.block_efficiency, "tokens": run.tokens,
                                       "calls": run.calls, "exact": run.exact, **({"alpha": a} if "parallel " in name
                                                                                   else {})}
                notify(f"  {label} {name}: block efficiency {run.block_efficiency:.3f}, exact {run.exact}")
            row["heads"][label] = r
        for label, d in drafts.items():
            s = Session(first, draft_model_dir=d, threads=None)
            run, _ = _run(s, "model", ids, refs, "bpd", DrafterSpec("model", gamma=gamma), cfg)
            row["draft_models"][label] = {"dir": str(d), "parameters": sum(p.numel() for p in s.draft_model.parameters()),
                                          "agreement": draft_agreement(s.draft_model, ids, refs), "gamma": gamma,
                                          "tokens_per_call": run.block_efficiency, "exact": run.exact}
            notify(f"  draft model {label}: tokens per call {run.block_efficiency:.3f}, exact {run.exact}")
        out["sets"][set_label] = row
    return out


def _tuned_alpha(heads_dir: Path) -> float:
    f = Path(heads_dir) / "tuned.json"
    return float(json.loads(f.read_text())["alphas"]["ngram"]) if f.is_file() else 1.0


def table(doc: dict) -> str:
    s = doc["settings"]
    L = []
    for set_label, row in doc["sets"].items():
        L += [f"### {set_label} ({len(row['prompt_indices'])} prompts x {s['max_new_tokens']} tokens)", ""]
        if row["heads"]:
            h = max(r["num_heads"] for r in row["heads"].values())
            names = next((list(r["drafters"]) for r in row["heads"].values() if r["drafters"]), [])
            L += ["| heads | " + " | ".join(f"head {j} top-1 / top-{s['topk']}" for j in range(2, h + 1)) + " | "
                  + " | ".join(f"BE {n}" for n in names) + " | exact |",
                  "|---|" + "---:|" * (h - 1 + len(names)) + "---|"]
            for label, r in row["heads"].items():
                ag = r["agreement"]
                cells = [f"{ag['top1'][j]:.3f} / {ag['topk'][j]:.3f}" if j < len(ag["top1"]) else "-" for j in range(1, h)]
                be = [f"{r['drafters'][n]['block_efficiency']:.3f}" if n in r["drafters"] else "-" for n in names]
                ok = ("yes" if all(d["exact"] for d in r["drafters"].values()) else "NO") if r["drafters"] else "-"
                L.append(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(be) + f" | {ok} |")
            L.append("")
        if row["draft_models"]:
            L += ["| draft model | parameters | top-1 agreement | tokens per call (gamma) | exact |", "|---|---:|---:|---:|---|"]
            for label, r in row["draft_models"].items():
                L.append(f"| {label} | {r['parameters'] / 1e6:.2f} M | {r['agreement']['top1']:.3f} | "
                         f"{r['tokens_per_call']:.3f} ({r['gamma']}) | {'yes' if r['exact'] else 'NO'} |")
            L.append("")
    vocab = f"the heads' {s['draft_vocab']} most frequent tokens" if s.get("draft_vocab") else "full vocabulary"
    L.append(f"Block efficiency: tokens / target calls, fixed tree, no context n-grams, {vocab}; all outputs "
             f"equal greedy: {'yes' if doc['all_exact'] else 'NO'}.")
    return "\n".join(L)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", nargs="*", default=None, metavar="LABEL=DIR",
                    help="head checkpoints (default: bundled=data/heads-stern; none with a bare --heads)")
    ap.add_argument("--draft-models", nargs="*", default=None, metavar="LABEL=DIR", help="draft models (default none)")
    ap.add_argument("--prompts", nargs="*", default=None, metavar="LABEL=FILE",
                    help="prompt sets (default: held-back code and the bundled held-out prompts)")
    ap.add_argument("--drafters", nargs="+", default=["top1", "parallel-base"],
                    choices=["top1", "parallel-base", "parallel"])
    ap.add_argument("--alpha", type=float, default=None, help="parallel's LM weight (default: each model's tuned.json)")
    ap.add_argument("--topk", type=int, default=8, help="k of the top-k agreement (default 8)")
    ap.add_argument("--gamma", type=int, default=4, help="tokens a draft model drafts per step (default 4)")
    ap.add_argument("--draft-vocab", type=int, default=0, metavar="V",
                    help="heads choose among their V most frequent tokens (draft_vocab.json), as decode's "
                         "--draft-vocab; 0 = the full vocabulary (default)")
    ap.add_argument("--chat", action="store_true",
                    help="prompt files may hold chat records ({\"messages\": ...} or Spec-Bench's {\"turns\": ...}, "
                         "the first turn), rendered through the model's chat template")
    ap.add_argument("--sample", type=int, default=0, metavar="N", help="N prompts of each file, drawn with --seed")
    ap.add_argument("--seed", type=int, default=0, help="which prompts --sample draws (default 0)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "head_agreement.json")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    heads = pairs(a.heads, "--heads") if a.heads is not None else {"bundled": data_dir() / "heads-stern"}
    drafts = pairs(a.draft_models, "--draft-models")
    cfg = EvalConfig(max_new_tokens=a.max_new_tokens, batch_size=1)  # as `latticedraft decode` runs them
    t0 = time.perf_counter()
    res = measure(heads, drafts, prompt_sets(a.prompts), a.drafters, cfg, a.topk, a.gamma, a.alpha,
                  notify=lambda m: print(m, file=sys.stderr), draft_vocab=a.draft_vocab, chat=a.chat,
                  sample=a.sample, seed=a.seed)
    exact = all(d["exact"] for row in res["sets"].values() for r in row["heads"].values() for d in r["drafters"].values())
    exact = exact and all(r["exact"] for row in res["sets"].values() for r in row["draft_models"].values())
    doc = {"machine": {**machine(), "platform": platform.platform()},
           "settings": {"max_new_tokens": a.max_new_tokens, "topk": a.topk, "gamma": a.gamma, "tree": "fixed",
                        "context_ngrams": 0, "draft_vocab": a.draft_vocab or None, "threads": a.threads, "chat": a.chat,
                        "sample": a.sample, "seed": a.seed,
                        "eval": asdict(cfg)},
           "seconds": round(time.perf_counter() - t0, 1), "all_exact": exact, **res}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(a.out, json.dumps(doc, indent=1, default=str) + "\n")
    print(table(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

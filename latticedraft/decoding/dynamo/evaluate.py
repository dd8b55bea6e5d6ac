"""DynaMo's ablation (the paper's Table 8 and Figures 3/10) with a judge-free quality proxy.

For every variant in ``dynamo.VARIANTS`` and every ``ε_b`` of a grid, sample continuations of
the same prompts with the same seeds and record the speed-up (generated tokens per model call)
against the quality proxy of ``latticedraft.decoding.dynamo.metrics``: the base model's perplexity of
the generated tokens, distinct-2/3 and the 4-gram repetition rate. The reference is the base
model's ordinary top-k sampling at the same settings (``transformers``' ``generate`` with
``top_k``, ``temperature`` and ``repetition_penalty``). ``flatness`` summarises each curve by
the least-squares slope of base perplexity against speed-up (flatter = quality holds up better).
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from latticedraft.atomic import atomic_file, write_atomic
from latticedraft.decoding.dynamo.config import VARIANTS, DynamoConfig, variant
from latticedraft.decoding.dynamo.generate import generate
from latticedraft.decoding.dynamo.metrics import continuation_perplexity, distinct_n, repetition_rate
from latticedraft.errors import InputError

EPSILONS = tuple(round(0.1 * i, 1) for i in range(11))


@dataclass
class QualityRow:
    """One (variant, ε_b) cell: speed-up and quality of its generations (pooled over prompts × seeds)."""

    variant: str
    epsilon_b: float | None
    tokens_per_call: float
    base_ppl: float
    distinct_2: float
    distinct_3: float
    repetition_4: float
    tokens: int
    calls: int
    seconds: float
    n_hist: dict[int, int] = field(default_factory=dict)


@dataclass
class AblationResult:
    rows: list[QualityRow]
    baseline: QualityRow
    settings: dict
    machine: dict
    perplexity: dict | None = None


def quality_row(name: str, eps, base_model, prompts, gens, calls, seconds, ns=()) -> QualityRow:
    toks = sum(len(g) for g in gens)
    hist: dict[int, int] = {}
    for n in ns:
        hist[int(n)] = hist.get(int(n), 0) + 1
    return QualityRow(
        variant=name, epsilon_b=eps, tokens_per_call=toks / calls if calls else 0.0,
        base_ppl=continuation_perplexity(base_model, prompts, gens),
        distinct_2=distinct_n(gens, 2), distinct_3=distinct_n(gens, 3), repetition_4=repetition_rate(gens, 4),
        tokens=toks, calls=calls, seconds=seconds, n_hist=dict(sorted(hist.items())),
    )


def sample_base(base_model, prompts: Sequence[Sequence[int]], config: DynamoConfig, max_new_tokens: int,
                seed: int, eos_token_id=None, pad_token_id: int = 0) -> list[list[int]]:
    """The base model's ordinary top-k sampling (``transformers`` ``generate``, left-padded batch);
    eos_token_id: None, an id or a list (each output cut after its first end id)."""
    import torch

    from latticedraft.decoding.rows import cut_at_end

    L = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), L), pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, L - len(p):] = torch.tensor(list(p))
        mask[i, L - len(p):] = 1
    dev = next(base_model.parameters()).device
    torch.manual_seed(seed)
    with torch.no_grad():
        out = base_model.generate(
            input_ids=ids.to(dev), attention_mask=mask.to(dev), do_sample=True, top_k=config.top_k,
            top_p=1.0, temperature=config.temperature, repetition_penalty=config.repetition_penalty,
            max_new_tokens=max_new_tokens, min_new_tokens=0, pad_token_id=pad_token_id,
            eos_token_id=eos_token_id,
        )
    gens = []
    for row in out[:, L:].tolist():
        gens.append(cut_at_end(row, eos_token_id).tolist())
    return gens


def run_ablation(model, prompts: Sequence[Sequence[int]], cooc=None, variants: Sequence[str] = VARIANTS,
                 epsilons: Sequence[float] = EPSILONS, seeds: Sequence[int] = (0,), max_new_tokens: int = 48,
                 base: DynamoConfig | None = None, eos_token_id=None,
                 tokenizer_fingerprint: str | None = None, progress: bool | None = None) -> AblationResult:
    """Every variant × ε_b on ``prompts`` (ids) × ``seeds``; plus the base model's top-k sampling."""
    from tqdm.auto import tqdm

    base = base or DynamoConfig()
    for v in variants:
        variant(v, 0.5)  # validates the names before any work
    if not prompts:
        raise InputError("no prompts to evaluate; pass --prompts FILE.jsonl with a 'prompt' per line")
    base_model = getattr(model, "base", model)
    disable = (not sys.stderr.isatty()) if progress is None else not progress
    rows: list[QualityRow] = []
    cells = [(v, e) for v in variants for e in epsilons]
    for v, e in tqdm(cells, desc="dynamo ablation", disable=disable):
        cfg = variant(v, e, base)
        gens, calls, ns, t0 = [], 0, [], time.perf_counter()
        all_prompts = []
        for s in seeds:
            res = generate(model, prompts, cfg, cooc if cfg.cooccurrence else None, max_new_tokens=max_new_tokens,
                           seed=s, eos_token_id=eos_token_id, tokenizer_fingerprint=tokenizer_fingerprint)
            gens += [q.tokens.tolist() for q in res.sequences]
            calls += res.calls
            ns += [a + 1 for q in res.sequences for a in q.accepted_drafts]  # tokens sampled per call
            all_prompts += [list(p) for p in prompts]
        rows.append(quality_row(v, float(e), base_model, all_prompts, gens, calls, time.perf_counter() - t0, ns))
    gens, t0, all_prompts = [], time.perf_counter(), []
    for s in seeds:
        gens += sample_base(base_model, prompts, base, max_new_tokens, s, eos_token_id)
        all_prompts += [list(p) for p in prompts]
    calls = sum(len(g) for g in gens)  # one call per token
    baseline = quality_row("base top-k", None, base_model, all_prompts, gens, calls, time.perf_counter() - t0)
    settings = {"top_k": base.top_k, "temperature": base.temperature, "repetition_penalty": base.repetition_penalty,
                "unseen_weight": base.unseen_weight, "blur_kernel": base.blur_kernel, "max_new_tokens": max_new_tokens,
                "prompts": len(prompts), "seeds": list(seeds), "variants": list(variants), "epsilons": list(epsilons),
                "num_heads": getattr(model, "num_heads", None)}
    machine = {"platform": platform.platform(), "cpu_count": os.cpu_count(), "python": platform.python_version()}
    return AblationResult(rows, baseline, settings, machine)


def flatness(result: AblationResult) -> dict[str, dict]:
    """Per variant: least-squares slope of base perplexity vs speed-up, and the values at the fastest ε_b."""
    out = {}
    for v in dict.fromkeys(r.variant for r in result.rows):
        rs = [r for r in result.rows if r.variant == v]
        x = np.array([r.tokens_per_call for r in rs])
        y = np.array([r.base_ppl for r in rs])
        slope = float(np.polyfit(x, y, 1)[0]) if np.ptp(x) > 1e-9 else float("nan")
        fast = max(rs, key=lambda r: r.tokens_per_call)
        out[v] = {"slope_ppl_per_speedup": slope, "max_speedup": fast.tokens_per_call, "ppl_at_max": fast.base_ppl,
                  "distinct_2_at_max": fast.distinct_2, "repetition_4_at_max": fast.repetition_4}
    return out


def markdown_table(result: AblationResult) -> str:
    """The ablation as Markdown: one line per (variant, ε_b), the base top-k line first, then the flatness summary."""
    lines = ["| variant | ε_b | tokens/call | base PPL of output | distinct-2 | distinct-3 | rep-4 | n=1/2/3 steps |",
             "|---|---|---|---|---|---|---|---|"]
    b = result.baseline
    lines.append(f"| {b.variant} | – | 1.00 | {b.base_ppl:.2f} | {b.distinct_2:.3f} | {b.distinct_3:.3f} | "
                 f"{b.repetition_4:.3f} | – |")
    for r in result.rows:
        hist = "/".join(str(r.n_hist.get(n, 0)) for n in (1, 2, 3))
        lines.append(f"| {r.variant} | {r.epsilon_b:.1f} | {r.tokens_per_call:.2f} | {r.base_ppl:.2f} | "
                     f"{r.distinct_2:.3f} | {r.distinct_3:.3f} | {r.repetition_4:.3f} | {hist} |")
    lines += ["", "| variant | slope of base PPL vs speed-up | max speed-up | base PPL there | distinct-2 there | rep-4 there |",
              "|---|---|---|---|---|---|"]
    for v, f in flatness(result).items():
        lines.append(f"| {v} | {f['slope_ppl_per_speedup']:.2f} | {f['max_speedup']:.2f} | {f['ppl_at_max']:.2f} | "
                     f"{f['distinct_2_at_max']:.3f} | {f['repetition_4_at_max']:.3f} |")
    if result.perplexity:
        p = result.perplexity
        lines += ["", f"Held-out multi-token perplexity ({p['tokens']} tokens; PPL_d on {p['dynamic_tokens']}):", "",
                  "| model | " + " | ".join(f"PPL_{n}" for n in sorted(p['ppl_n'], key=int)) + " | "
                  + " | ".join(f"PPL_1:{n}" for n in sorted(p['ppl_1n'], key=int)) + " |",
                  "|---|" + "---|" * (len(p['ppl_n']) + len(p['ppl_1n']))]
        lines.append("| DynaMo heads | " + " | ".join(f"{v:.2f}" for _, v in sorted(p['ppl_n'].items(), key=lambda kv: int(kv[0])))
                     + " | " + " | ".join(f"{v:.2f}" for _, v in sorted(p['ppl_1n'].items(), key=lambda kv: int(kv[0]))) + " |")
        lines.append(f"| base alone | {p['base_ppl_1']:.2f} |" + " – |" * (len(p['ppl_n']) + len(p['ppl_1n']) - 1))
        if p.get("dynamic"):
            lines += ["", f"Dynamic PPL_d ({p['dynamic_variant']}, first {p['dynamic_tokens']} held-out tokens; "
                      "ε_b = 1 is PPL_1 on those tokens):", "",
                      "| ε_b | PPL_d | tokens/step |", "|---|---|---|"]
            for e, (ppl, sp) in sorted(p["dynamic"].items(), key=lambda kv: float(kv[0])):
                lines.append(f"| {float(e):.1f} | {ppl:.2f} | {sp:.2f} |")
    return "\n".join(lines) + "\n"


def plot(result: AblationResult, path: str | Path) -> Path:
    """Speed-up vs base-model perplexity of the output (left) and vs distinct-2 (right), one curve per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    marks = dict(zip(VARIANTS, "osD^v"))
    for v in dict.fromkeys(r.variant for r in result.rows):
        rs = sorted((r for r in result.rows if r.variant == v), key=lambda r: r.epsilon_b)
        x = [r.tokens_per_call for r in rs]
        axes[0].plot(x, [r.base_ppl for r in rs], marker=marks.get(v, "o"), ms=4, label=v)
        axes[1].plot(x, [r.distinct_2 for r in rs], marker=marks.get(v, "o"), ms=4, label=v)
    b = result.baseline
    for ax, y in ((axes[0], b.base_ppl), (axes[1], b.distinct_2)):
        ax.axhline(y, color="k", ls="--", lw=1, label="base top-k sampling")
        ax.set_xlabel("speed-up (generated tokens per model call)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("base-model PPL of the output (lower = more fluent)")
    axes[1].set_ylabel("distinct-2 (higher = less repetitive)")
    axes[0].legend(fontsize=8)
    s = result.settings
    fig.suptitle(f"DynaMo ablation: ε_b ∈ [0, 1] per variant; k={s['top_k']}, T={s['temperature']}, "
                 f"rep. penalty {s['repetition_penalty']}, {s['prompts']} prompts × {len(s['seeds'])} seeds, "
                 f"{s['max_new_tokens']} new tokens", fontsize=9)
    fig.tight_layout()
    p = Path(path)
    with atomic_file(p, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    return p


def write_report(result: AblationResult, out_dir: str | Path) -> dict[str, Path]:
    """``results.json``, ``dynamo_ablation.md`` and ``dynamo_ablation.png`` in ``out_dir`` (each written atomically)."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    payload = {"rows": [asdict(r) for r in result.rows], "baseline": asdict(result.baseline),
               "flatness": flatness(result), "settings": result.settings, "machine": result.machine,
               "perplexity": result.perplexity}
    paths = {"json": d / "results.json", "table": d / "dynamo_ablation.md", "plot": d / "dynamo_ablation.png"}
    write_atomic(paths["json"], json.dumps(payload, indent=2, default=_json_default))
    write_atomic(paths["table"], markdown_table(result))
    plot(result, paths["plot"])
    return paths


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, float) and math.isnan(o):
        return None
    raise TypeError(type(o))


def heldout_perplexity(model, tokenizer, corpus: Sequence[str] = ("stdlib:heldout",), tokens: int = 16384,
                       dynamic_tokens: int = 2048, epsilons: Sequence[float] = EPSILONS, config=None, cooc=None,
                       progress: bool | None = None) -> dict:
    """PPL_n, PPL_{1:n} (DynaMo heads and the base alone) and PPL_d per ε_b on the first ``tokens`` held-out tokens."""
    from latticedraft.decoding.dynamo.metrics import multi_token_perplexity
    from latticedraft.lm.corpus import read_text, resolve_corpus

    texts, total = [], 0
    for f in resolve_corpus(list(corpus)):
        ids = tokenizer.encode(read_text(f, "replace"), add_special_tokens=False).ids[: tokens - total]
        texts.append(ids)
        total += len(ids)
        if total >= tokens:
            break
    base = getattr(model, "base", model)
    cfgs = [getattr(base.config, a, None) for a in ("n_positions", "max_position_embeddings")]
    window = min([c for c in cfgs if c] + [256])
    heads = multi_token_perplexity(model, texts, window=window, epsilons=epsilons, config=config, cooc=cooc,
                                   dynamic_tokens=dynamic_tokens, progress=progress)
    plain = multi_token_perplexity(base, texts, window=window, progress=progress)
    return {"corpus": list(corpus), "tokens": heads.tokens, "window": window, "ppl_n": heads.ppl_n,
            "ppl_1n": heads.ppl_1n, "base_ppl_1": plain.ppl_n[1], "dynamic": heads.dynamic,
            "dynamic_tokens": heads.dynamic_tokens,
            "dynamic_variant": "CO+AT+G3"}


def evaluate(model_dir=None, prompts_file=None, out_dir="dynamo-eval", tokenizer_path=None, cooccurrence="auto",
             num_prompts: int | None = 20, seeds: Sequence[int] = (0,), max_new_tokens: int = 48,
             epsilons: Sequence[float] = EPSILONS, variants: Sequence[str] = VARIANTS, heldout_tokens: int = 16384,
             dynamic_tokens: int = 2048, base: DynamoConfig | None = None, device=None,
             progress: bool | None = None, notify=None) -> tuple[AblationResult, dict[str, Path]]:
    """``latticedraft eval --method dynamo``: the ablation + held-out perplexities, written to ``out_dir``."""
    from latticedraft.decoding.dynamo.generate import check_model
    from latticedraft.decoding.runs.prompt_set import read_prompts
    from latticedraft.decoding.runs.session import Session
    from latticedraft.lm.cooccurrence import resolve_table
    from latticedraft.lm.tokenizer import fingerprint
    from latticedraft.paths import data_dir

    for e in epsilons:
        DynamoConfig(epsilon_b=e).validate()
    base = base or DynamoConfig()
    session = Session(model_dir or data_dir() / "heads-dynamo", tokenizer_path, device=device)
    model, tok = session.model, session.tokenizer
    check_model(model, base, str(model_dir or "data/heads-dynamo"))
    texts = [r["prompt"] for r in read_prompts(prompts_file or data_dir() / "prompts.jsonl", num_prompts)]
    prompts = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    needs_co = any(variant(v, 0.5, base).cooccurrence for v in variants)
    cooc = resolve_table(cooccurrence, tok, notify=notify) if needs_co else None
    result = run_ablation(model, prompts, cooc, variants, epsilons, seeds, max_new_tokens, base, session.eos,
                          fingerprint(tok), progress)
    if heldout_tokens > 0:
        result.perplexity = heldout_perplexity(model, tok, tokens=heldout_tokens, dynamic_tokens=dynamic_tokens,
                                               epsilons=epsilons, config=variant("CO+AT+G3", 0.5, base), cooc=cooc,
                                               progress=progress)
    result.settings["model"] = str(model_dir or "data/heads-dynamo")
    result.settings["cooccurrence"] = cooc.meta.get("path") if cooc is not None else None
    return result, write_report(result, out_dir)

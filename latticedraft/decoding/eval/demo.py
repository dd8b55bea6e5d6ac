"""``latticedraft demo``: the bundled model on held-out standard-library prompts (or any model,
e.g. SmolLM2 on chat prompts through its chat template).

HF greedy and HF prompt lookup (the baselines a user would run instead, in this process) vs
latticedraft's fastest measured configuration and its parts (heads only, context and 4-gram
drafts only, no rescoring) and the paper's drafters as published: block efficiency, tokens/s, the
speed-up over both baselines, a picture of one step's lattice (``lattice_step.png``), and a
check that every output equals greedy's token for token. On a model without heads the rows that
draft from heads are left out (said in a note), and so is the lattice picture.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from latticedraft.atomic import write_atomic
from latticedraft.decoding.methods import bpd_session
from latticedraft.decoding.methods.bpd import DrafterSpec
from latticedraft.decoding.eval import hf_baselines
from latticedraft.decoding.planning.head_gate import HeadGate
from latticedraft.decoding.runs.session import Session
from latticedraft.decoding.runs.chat import prompt_ids
from latticedraft.decoding.runs.prompt_set import read_prompt_set
from latticedraft.errors import InputError, ModelError
from latticedraft.paths import data_dir

FAST = DrafterSpec("parallel", nbest=8, slots=3).fast()  # the fastest measured (benchmarks/decode.py)
ROWS = [
    ("greedy", "plain autoregressive (HF generate)", None),
    ("prompt lookup (HF)", "HF generate(prompt_lookup_num_tokens=10)", "prompt-lookup"),
    ("latticedraft (default)", "8 best 4-gram-rescored head paths + context and 4-gram drafts, cost-aware tree",
     FAST),
    ("heads only", "the same without context or 4-gram drafts", FAST.drafter_only()),
    ("context + 4-gram drafts", "--drafter none: prompt lookup and the 4-gram's continuation on latticedraft's "
     "verifier", DrafterSpec("none").fast()),
    ("no n-gram rescoring", "8 best un-rescored head paths + context and 4-gram drafts",
     replace(FAST, name="parallel-base")),
    ("base BPD (paper)", "top-1 of every head, as published", DrafterSpec("top1")),
    ("neural BPD (paper)", "Algorithm 2, small GPT-2 rescorer", DrafterSpec("neural", alpha=1.0)),
]
PICTURE_ROW = "latticedraft (default)"  # its steps are recorded for lattice_step.png


def run_demo(session: Session, prompts_file=None, num_prompts: int = 6, max_new_tokens: int = 48,
             out_dir="out/demo", notify=print, alphas: dict | None = None, chat: bool = False) -> dict:
    """The demo's rows on ``num_prompts`` prompts of ``prompts_file`` (``chat``: through the model's
    chat template); writes ``demo.json`` (and ``lattice_step.png``) into ``out_dir``; the summary."""
    recs = read_prompt_set(prompts_file or data_dir() / "prompts.jsonl", limit=num_prompts)[0]
    ids = prompt_ids(session, recs, chat)
    alphas = alphas or {}
    rows = []
    heads = getattr(session.model, "num_heads", 1) > 1
    for name, what, spec in ROWS:
        if isinstance(spec, DrafterSpec) and spec.name != "none" and not heads:
            notify(f"  skipping {name}: {session.model_dir} has no heads (train them with `latticedraft train heads`)")
            continue
        family = {"parallel": "ngram"}.get(spec.name, spec.name) if isinstance(spec, DrafterSpec) else None
        if family in alphas:
            spec = replace(spec, alpha=alphas[family])
        rows.append((name, what, spec))
    # warm-up (JIT compilation, allocator, first-call costs): one short prompt per method, untimed;
    # a drafter whose LM or rescorer is missing or made for another vocabulary is left out with a note
    usable = []
    for row in rows:
        try:
            if isinstance(row[2], DrafterSpec):
                session.prepare("bpd", row[2])  # also measures T(n) and fits acceptance rates once (cached)
            _run(session, ids[:1], row[2], 8, False)
            usable.append(row)
        except (InputError, ModelError) as e:
            notify(f"  skipping {row[0]}: {e}")
    rows = usable
    results, greedy, step_pic = [], None, None
    for name, what, spec in rows:
        t0 = time.perf_counter()
        toks, res = _run(session, ids, spec, max_new_tokens, False)
        dt = time.perf_counter() - t0
        if greedy is None:
            greedy = toks
        n = sum(len(t) for t in toks)
        exact = all(np.array_equal(t, g) for t, g in zip(toks, greedy))
        row = {"name": name, "what": what, "tokens": n, "seconds": round(dt, 3), "tokens_per_s": round(n / dt, 1),
               "exact": bool(exact), "block_efficiency": None, "calls": None}
        if res is not None:
            nodes = [k for q in res.sequences for k in q.tree_nodes]
            row.update(block_efficiency=round(res.block_efficiency, 3), calls=res.calls, verify=res.verify_mode,
                       tree_nodes_mean=round(float(np.mean(nodes)), 2) if nodes else None,
                       timing={k: round(v, 3) for k, v in res.timing.items()})
            if name == PICTURE_ROW:  # its steps recorded in one more, untimed pass (recording costs time),
                # with a gate of its own: a new gate drafts from the heads, whatever the session's measured
                kept = session.learned.swap_gate(spec, HeadGate())
                steps = _run(session, ids, spec, max_new_tokens, True)[1].steps
                session.learned.swap_gate(spec, kept)
                step_pic = _pick_step(steps, greedy, ids) or step_pic
        results.append(row)
        notify(f"  {name:<24} done: {n} tokens{f' in {res.calls} calls' if res is not None else ''}, {dt:.1f} s")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pic = None
    if step_pic is not None:
        pic = draw_step(session.tokenizer, *step_pic, out / "lattice_step.png")
    summary = {"rows": results, "model": session.base_dir, "prompts": len(ids), "max_new_tokens": max_new_tokens,
               "all_exact": all(r["exact"] for r in results), "lattice_png": str(pic) if pic else None,
               "sample": {"prompt": recs[0].text, "continuation": session.tokenizer.decode(greedy[0].tolist(),
                                                                                            skip_special_tokens=True)}}
    write_atomic(out / "demo.json", json.dumps(summary, indent=1) + "\n")
    return summary


def _run(session: Session, ids, spec, max_new_tokens: int, record: bool):
    """(token lists, DecodeResult or None) of one row: spec None = HF greedy, "prompt-lookup" =
    HF prompt lookup, else BPD."""
    if spec == "prompt-lookup":
        return hf_baselines.prompt_lookup(session.model, ids, max_new_tokens, 10, session.eos)[0], None
    res = session.decode(ids, "greedy" if spec is None else "bpd", spec, max_new_tokens=max_new_tokens,
                         record_steps=record)
    return [q.tokens for q in res.sequences], (None if spec is None else res)


def _in_lattice(sausage, tokens) -> int:
    """How many leading ``tokens`` are candidates of the lattice's slots (slot j = token j)."""
    n = 0
    while n < min(len(tokens), sausage.h) and int(tokens[n]) in sausage.tokens[n]:
        n += 1
    return n


def _pick_step(steps, greedy, ids):
    """The step that accepted the most draft tokens inside the lattice (ties: more accepted in
    all, then more drafts), and the greedy continuation at that point (to colour the lattice)."""
    steps = [st for st in steps if st.sausage is not None]  # (the head gate may skip a step's lattice)
    if not steps:
        return None
    best = max(steps, key=lambda st: (_in_lattice(st.sausage, st.accepted), len(st.accepted), st.drafts.shape[0]))
    row = best.row
    pos = len(best.history) - len(ids[row])  # tokens emitted before this step (root included)
    truth = greedy[row][pos : pos + best.sausage.h]
    return best, truth


def _visible(text: str, space: str = "·") -> str:
    """A token's text with spaces shown as ``space`` and control characters escaped."""
    return "".join(space if c == " " else (c if c.isprintable() else repr(c)[1:-1]) for c in text)


def draw_step(tokenizer, step, truth, path: Path, rows: int = 8) -> Path:
    """The step's sausage: one column per head (slot), candidates best first, shaded by the
    head's probability; green = the greedy continuation, bold outline = accepted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    s = step.sausage
    h, k = s.h, min(s.k, rows)
    fig, ax = plt.subplots(figsize=(1.55 * h + 1.5, 0.55 * k + 1.9))
    acc = len(step.accepted)
    for j in range(h):
        for r in range(k):
            t = int(s.tokens[j, r])
            if t < 0:
                continue
            p = float(np.exp(s.logp[j, r]))
            hit = j < len(truth) and t == int(truth[j])
            face = (0.55, 0.85, 0.55) if hit else (1 - 0.55 * p, 1 - 0.35 * p, 1.0)
            drafted = bool((step.drafts[:, j] == t).any()) if j < step.drafts.shape[1] else False
            lw = 2.6 if (hit and j < acc) else (1.6 if drafted else 0.5)
            edge = "black" if (hit and j < acc) else ("tab:blue" if drafted else "gray")
            ax.add_patch(Rectangle((j, -r - 1), 0.94, 0.9, facecolor=face, edgecolor=edge, lw=lw))
            label = _visible(tokenizer.decode([t]))[:10]
            ax.text(j + 0.47, -r - 0.42, label, ha="center", va="center", fontsize=8, family="monospace")
            ax.text(j + 0.9, -r - 0.85, f"{p:.2f}", ha="right", va="bottom", fontsize=5.5, color="dimgray")
    ax.set_xlim(-0.1, h + 0.05)
    ax.set_ylim(-k - 0.2, 0.9)
    for j in range(h):
        ax.text(j + 0.47, 0.35, f"head {j + 2}", ha="center", fontsize=8)
    ctx = _visible(tokenizer.decode([int(x) for x in step.history[-12:]]), space=" ")
    paths = [row[row >= 0] for row in step.drafts]
    lat = sum(len(p) <= h and _in_lattice(s, p) == len(p) for p in paths)  # the others: context or LM n-grams
    n_ctx = len(paths) - lat
    ax.set_title(f"One BPD step after …{ctx!s:.60}\n{lat} lattice path{'s' if lat != 1 else ''} + {n_ctx} context "
                 f"or 4-gram path{'s' if n_ctx != 1 else ''} "
                 f"verified in one tree (blue = in a path); {acc} draft token{'s' if acc != 1 else ''} accepted "
                 f"+ 1 bonus (green = greedy continuation, bold = accepted); number = head probability", fontsize=8.5)
    ax.axis("off")
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=130, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)
    return path


def table(summary: dict) -> str:
    """Tokens/s of every row against HF greedy and HF prompt lookup (both run in this process)."""
    by = {r["name"]: r for r in summary["rows"]}
    g = by["greedy"]["tokens_per_s"]
    pld = by.get("prompt lookup (HF)", {}).get("tokens_per_s")
    L = [f"{'method':<24} {'block eff.':>10} {'tokens/s':>9} {'vs greedy':>9} {'vs PLD':>7}  equals greedy",
         "-" * 80]
    for r in summary["rows"]:
        be, tps = r["block_efficiency"], r["tokens_per_s"]
        vs_pld = f"{tps / pld:.2f}x" if pld else "-"
        L.append(f"{r['name']:<24} {(f'{be:.2f}' if be else '-'):>10} {tps:>9.1f} {tps / g:>8.2f}x {vs_pld:>7}  "
                 f"{'yes' if r['exact'] else 'NO'}")
    return "\n".join(L)

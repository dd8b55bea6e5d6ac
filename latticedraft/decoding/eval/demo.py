"""``latticedraft demo``: what a user would run instead (HF greedy, HF prompt lookup, HF assisted
generation with the model's own int4 copy) against latticedraft (the CLI's default, the self-draft
alone, n-gram-rescored heads, context + LM n-grams) on a handful of prompts; by default SmolLM2
on chat questions through its chat template, or the bundled toy model (``--model bundled``).

``demo_rows`` chooses the rows (the decoders of ``eval.rows``, the CLI's default as the CLI reads
it, the rows that draft from heads only where the model has heads, the paper's drafters on the
toy); ``run_demo`` warms each up (untimed), then times every row over the same prompts in rounds
until each has made ``MIN_PASSES`` passes and decoded for at least ``min_seconds`` (the spread is
kept; a row whose speed-up over HF greedy differs between passes by more than ``UNSTEADY`` is
flagged and its ratio not shown as a figure), compares every output with HF greedy's token for token,
draws one recorded step of the BPD row (``lattice_step.png``) and writes ``demo.json``:
both through ``write_outputs``, the demo's one writer (``--out`` was claimed before: ``cli/demo.py``).
"""

from __future__ import annotations

import datetime
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from latticedraft.atomic import atomic_dir
from latticedraft.decoding.eval import hf_baselines
from latticedraft.decoding.eval.rows import NGRAMS, RESCORED_HEADS, SELF_DRAFT, bench_category, int4_copy
from latticedraft.decoding.methods.bpd import DrafterSpec
from latticedraft.decoding.planning.head_gate import HeadGate
from latticedraft.decoding.runs.chat import prompt_ids
from latticedraft.decoding.runs.prompt_set import read_prompt_set
from latticedraft.decoding.runs.session import Session
from latticedraft.errors import InputError, ModelError
from latticedraft.paths import data_dir

GREEDY = "HF greedy"
DEFAULT = "latticedraft default (CLI)"
PICTURE_ROW = "BPD: n-gram-rescored heads"  # one of its steps is drawn (lattice_step.png)
HF_KINDS = ("hf-greedy", "hf-prompt-lookup", "hf-assisted-int4")
PLD_TOKENS = 10
MIN_PASSES = 2  # timed passes of every row, HF's too (one pass read 21.2 and then 14.3 tokens/s of HF greedy)
UNSTEADY = 0.15  # a ratio whose passes disagree by more than this is flagged, not printed
PICTURE_PROMPTS = 3  # the picture's step is picked among the steps of the first prompts


@dataclass(frozen=True)
class Row:
    """One decoder of the table. kind: one of ``HF_KINDS`` (transformers' ``generate``) or "ours"
    (``Session.decode(ids, method, options)``); on: the session that decodes it, "heads" (the
    model given, with its heads) or "base" (its base model alone, as ``--model BASE`` runs it)."""

    name: str
    what: str
    kind: str
    method: str | None = None
    options: object = None
    on: str = "base"


def demo_rows(default: tuple, heads: bool, paper: bool = False) -> list[Row]:
    """The demo's rows: ``default`` is (method name, options) that ``latticedraft decode --model M``
    runs (``cli.decode_options``); ``heads``: the model has heads (the rows that draft from them,
    the default on them); ``paper``: add the paper's drafters as published (the bundled model)."""
    rows = [Row(GREEDY, "transformers' generate(do_sample=False): the reference", "hf-greedy"),
            Row("HF prompt lookup", f"generate(prompt_lookup_num_tokens={PLD_TOKENS})", "hf-prompt-lookup"),
            Row("HF assisted (int4 copy)", "generate(assistant_model=the model's own int4 copy)", "hf-assisted-int4"),
            Row(DEFAULT, "what `latticedraft decode --model M` runs with no other option", "ours", *default,
                on="heads" if heads else "base"),
            Row("self-draft alone", "the model's own int4 weights drafting a chain, no other drafts", "ours", "bpd",
                SELF_DRAFT)]
    if heads:
        rows.append(Row(PICTURE_ROW, "the 8 best n-gram-rescored paths of the heads' lattice (3 slots), cost-aware "
                                     "tree", "ours", "bpd", RESCORED_HEADS, on="heads"))
    rows.append(Row("context + LM n-grams", "prompt lookup and the n-gram LM's continuation on latticedraft's "
                                            "verifier, no drafter", "ours", "bpd", NGRAMS))
    if heads and paper:
        rows += [Row("BPD top-1 (paper)", "top-1 of every head, as published", "ours", "bpd", DrafterSpec("top1"),
                     on="heads"),
                 Row("neural BPD (paper)", "Algorithm 2, small GPT-2 rescorer", "ours", "bpd",
                     DrafterSpec("neural", alpha=1.0), on="heads")]
    return rows


def has_heads(session: Session) -> bool:
    return getattr(session.model, "num_heads", 1) > 1


def base_session(session: Session) -> Session:
    """A session on ``session``'s base model alone (its weights shared, not loaded again), for the
    rows a user would run with ``--model BASE``; ``session`` itself when it has no heads."""
    if not has_heads(session):
        return session

    def make():
        b = Session(session.base_dir, lm_dir=session.lm_dir, rescorer_dir=session.rescorer_dir,
                    device=session.device, model=session.model.base)
        b.tokenizer, b.eos, b.notify = session.tokenizer, session.eos, session.notify
        return b

    return session.once(("base session",), make)


def pick_prompts(prompts: list, n: int) -> list:
    """``n`` of ``prompts``, taking Spec-Bench's categories in turn (a record's ``category``;
    MT-bench's kinds count as one), each category's in file order; without categories the first
    ``n``."""
    by: dict = {}
    for p in prompts:
        by.setdefault(bench_category(p.record.get("category")), []).append(p)
    out, k = [], 0
    while len(out) < min(n, len(prompts)):
        out += [q[k] for q in by.values() if k < len(q)][: n - len(out)]
        k += 1
    return out


def run_demo(session: Session, rows: list[Row], prompts_file=None, num_prompts: int = 6, max_new_tokens: int = 48,
             out_dir="out/demo", notify=print, alphas: dict | None = None, chat: bool = False,
             min_seconds: float = 5.0) -> dict:
    """The demo's ``rows`` on ``num_prompts`` prompts of ``prompts_file`` (``pick_prompts``; ``chat``:
    through the model's chat template); writes ``demo.json`` and ``lattice_step.png`` into ``out_dir``
    (``write_outputs``); returns the summary (``table`` prints it)."""
    recs = pick_prompts(read_prompt_set(prompts_file or data_dir() / "prompts.jsonl")[0], num_prompts)
    ids = prompt_ids(session, recs, chat)
    heads = has_heads(session)
    sessions = {"heads": session, "base": base_session(session)}
    counter = hf_baselines.CallCounter(getattr(session.model, "base", session.model))  # HF generate's calls
    skipped: dict = {}  # row name -> why it could not run
    rows = _warm(_choose(rows, session, alphas or {}, notify), sessions, counter, ids, notify, skipped)
    load_before = os.getloadavg()
    passes, outputs, rounds = _time_rows(rows, sessions, counter, ids, max_new_tokens, min_seconds, notify)
    load_after = os.getloadavg()
    greedy = outputs[GREEDY][0]
    results = [_result(row, passes[row.name], outputs[row.name], greedy) for row in rows]
    g = next(r for r in results if r["name"] == GREEDY)
    for r in results:
        r["x_hf_greedy"] = round(r["tokens_per_s"] / g["tokens_per_s"], 3)
        pairs = list(zip(r["tokens_per_s_passes"], g["tokens_per_s_passes"]))
        ratios = [mine / theirs for mine, theirs in pairs]
        r["x_hf_greedy_passes"] = [round(x, 3) for x in ratios]
        r["unsteady"] = len(ratios) > 1 and max(ratios) > (1 + UNSTEADY) * min(ratios)
    step_pic = _picture_step(rows, sessions, ids, greedy, max_new_tokens)
    show = next((r.name for r in rows if r.name == DEFAULT), GREEDY)
    answer = outputs[show][0][0]
    import torch

    summary = {"rows": results, "model": session.base_dir, "heads": str(session.model_dir) if heads else None,
               "prompts": [{"id": p.id, "category": p.record.get("category"), "prompt_tokens": len(x)}
                           for p, x in zip(recs, ids)],
               "chat": chat, "max_new_tokens": max_new_tokens, "min_seconds": min_seconds, "rounds": rounds,
               "all_exact": all(r["exact"] for r in results), "lattice_png": None,
               "no_picture": None if step_pic is not None else _no_picture(heads, skipped),
               "sample": {"id": recs[0].id, "question": recs[0].text, "row": show,
                          "exact": next(r["exact"] for r in results if r["name"] == show),
                          "answer": session.tokenizer.decode([int(t) for t in answer], skip_special_tokens=True),
                          "tokens": len(answer), "cut_at_max_new_tokens": len(answer) >= max_new_tokens},
               "date": datetime.date.today().isoformat(), "load_average": {"before": load_before, "after": load_after},
               "machine": {**_machine(), "torch_threads": torch.get_num_threads()}}
    return write_outputs(out_dir, summary, session.tokenizer, step_pic)


def _choose(rows: list[Row], session: Session, alphas: dict, notify) -> list[Row]:
    """``rows`` the model can run (those on heads need heads), each n-gram-rescored row given its
    ``alphas`` (family name -> alpha, from ``--alphas``; without one each keeps its own: the
    rescored heads learn theirs)."""
    chosen = []
    for row in rows:
        if row.on == "heads" and not has_heads(session):
            notify(f"  skipping {row.name}: {session.model_dir} has no heads (train them with `latticedraft train "
                   "heads`)")
            continue
        family = {"parallel": "ngram"}.get(getattr(row.options, "name", None))
        if row.name != DEFAULT and isinstance(row.options, DrafterSpec) and (family or row.options.name) in alphas:
            row = replace(row, options=replace(row.options, alpha=alphas[family or row.options.name]))
        chosen.append(row)
    return chosen


def _no_picture(heads: bool, skipped: dict) -> str:
    """Why the demo drew no lattice: no heads, the picture's row could not run (``skipped``: row
    name -> why), or none of its steps drafted from the heads."""
    if not heads:
        return "the model has no heads"
    if PICTURE_ROW in skipped:
        return f"its row ({PICTURE_ROW}) could not run: {skipped[PICTURE_ROW]}"
    return f"no step of {PICTURE_ROW} drafted from the heads' lattice"


def _warm(rows: list[Row], sessions: dict, counter, ids: list, notify, skipped: dict | None = None) -> list[Row]:
    """Warm each row up (JIT compilation, allocator, first-call costs, the int4 copy) on one short
    prompt, untimed; a row whose LM or rescorer is missing or made for another vocabulary is left
    out with a note (and its reason in ``skipped``). Returns the rows that ran."""
    usable = []
    for row in rows:
        try:
            if row.kind == "ours":  # also measures T(n) and fits acceptance rates once (cached)
                sessions[row.on].prepare(row.method, row.options)
            _run(row, sessions, counter, ids[:1], 8)
            usable.append(row)
        except (InputError, ModelError) as e:
            notify(f"  skipping {row.name}: {e}")
            if skipped is not None:
                skipped[row.name] = " ".join(str(e).split())
    return usable


def _time_rows(rows: list[Row], sessions: dict, counter, ids: list, max_new_tokens: int, min_seconds: float,
               notify) -> tuple[dict, dict, int]:
    """Time every row over all ``ids`` in rounds until each has decoded for ``min_seconds``: (row
    name -> [(tokens, seconds, target calls)] per pass, row name -> each pass's outputs, rounds)."""
    passes: dict = {r.name: [] for r in rows}
    outputs: dict = {}
    rounds = 0
    while True:
        todo = [r for r in rows if sum(p[1] for p in passes[r.name]) < min_seconds or len(passes[r.name]) < MIN_PASSES]
        if not todo:
            return passes, outputs, rounds
        rounds += 1
        if rounds == 2:
            notify(f"  timing again, until each row has decoded for {min_seconds:g} s: "
                   + ", ".join(r.name for r in todo))
        for row in todo:
            t0 = time.perf_counter()
            toks, calls, _ = _run(row, sessions, counter, ids, max_new_tokens)
            dt = time.perf_counter() - t0
            passes[row.name].append((sum(len(t) for t in toks), dt, calls))
            outputs.setdefault(row.name, []).append(toks)
            if rounds == 1:
                notify(f"  {row.name:<28} {passes[row.name][0][0]} tokens in {calls} target calls, {dt:.1f} s")


def _result(row: Row, ps: list, outs: list, greedy: list) -> dict:
    """One row of the table from its passes ``ps`` and outputs ``outs``, compared with ``greedy``'s."""
    n, sec, calls = (sum(p[i] for p in ps) for i in range(3))
    exact = all(len(o) == len(greedy) and all(np.array_equal(t, g) for t, g in zip(o, greedy)) for o in outs)
    rates = [p[0] / p[1] for p in ps]
    return {"name": row.name, "what": row.what, "settings": _settings(row), "tokens": n,
            "seconds": round(sec, 3), "passes": len(ps), "tokens_per_s": round(n / sec, 2),
            "tokens_per_s_range": [round(min(rates), 2), round(max(rates), 2)],
            "tokens_per_s_passes": [round(x, 2) for x in rates],
            "target_calls": calls, "tokens_per_call": round(n / max(calls, 1), 3), "exact": bool(exact)}


def _picture_step(rows: list[Row], sessions: dict, ids: list, greedy: list, max_new_tokens: int):
    """The step to draw (``_pick_step``), recorded in one more untimed pass of the picture's row
    (recording costs time) over the first ``PICTURE_PROMPTS`` prompts with a gate of its own (a new
    gate drafts from the heads, whatever the session's measured); None without that row."""
    pic_row = next((r for r in rows if r.name == PICTURE_ROW), None)
    if pic_row is None:
        return None
    s = sessions[pic_row.on]
    kept = s.learned.swap_gate(pic_row.options, HeadGate())
    steps = s.decode(ids[:PICTURE_PROMPTS], "bpd", pic_row.options, max_new_tokens=max_new_tokens,
                     record_steps=True).steps
    s.learned.swap_gate(pic_row.options, kept)
    return _pick_step(steps, greedy, ids)


def write_outputs(out_dir, summary: dict, tokenizer, step_pic) -> dict:
    """The demo's one writer: ``lattice_step.png`` (where a step was recorded) and ``demo.json``,
    staged and moved into ``out_dir`` together (``atomic.atomic_dir``); ``summary`` with the
    picture's path, returned."""
    out = Path(out_dir)
    with atomic_dir(out) as stage:
        if step_pic is not None:
            draw_step(tokenizer, *step_pic, stage / "lattice_step.png")
            summary["lattice_png"] = str(out / "lattice_step.png")
        (stage / "demo.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return summary


def _settings(row: Row) -> str | None:
    """A row's settings as text (its options' repr; None for the HF rows)."""
    return None if row.kind in HF_KINDS else f"{row.method}: {row.options!r}"


def _machine() -> dict:
    from latticedraft.decoding.eval.evaluate import machine

    from latticedraft.cpu import cpu_info

    info = cpu_info()
    return {**machine(), "model_name": info["model"], "cpu_flags": info["flags"]}


def _run(row: Row, sessions: dict, counter, ids, max_new_tokens: int):
    """(token lists, target calls, DecodeResult or None) of ``row`` on ``ids``."""
    s = sessions[row.on]
    if row.kind in HF_KINDS:
        base = getattr(s.model, "base", s.model)
        c0 = counter.n
        if row.kind == "hf-greedy":
            toks = hf_baselines.greedy(base, ids, max_new_tokens, s.eos)[0]
        elif row.kind == "hf-prompt-lookup":
            toks = hf_baselines.prompt_lookup(base, ids, max_new_tokens, PLD_TOKENS, s.eos)[0]
        else:
            toks = hf_baselines.assisted(base, int4_copy(s), ids, max_new_tokens, s.eos)[0]
        return [np.asarray(t, dtype=np.int64) for t in toks], counter.n - c0, None
    res = s.decode(ids, row.method, row.options, max_new_tokens=max_new_tokens)
    return [np.asarray(q.tokens, dtype=np.int64) for q in res.sequences], res.calls, res


def _in_lattice(sausage, tokens) -> int:
    """How many leading ``tokens`` are candidates of the lattice's slots (slot j = token j)."""
    n = 0
    while n < min(len(tokens), sausage.h) and int(tokens[n]) in sausage.tokens[n]:
        n += 1
    return n


def _prefix(a, b) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    while n < min(len(a), len(b)) and int(a[n]) == int(b[n]):
        n += 1
    return n


def _pick_step(steps, greedy, ids):
    """The step that accepted the most draft tokens inside the lattice (ties: where the rescored
    best path kept more of them than the heads' own top-1 path, then more accepted in all, then more
    drafts), and the greedy continuation at that point (to colour the lattice)."""
    steps = [st for st in steps if st.sausage is not None]  # (the head gate may skip a step's lattice)
    if not steps:
        return None

    def key(st):
        best = st.best if st.best is not None else st.sausage.tokens[:, 0]
        gain = _prefix(best, st.accepted) - _prefix(st.sausage.tokens[:, 0], st.accepted)
        return _in_lattice(st.sausage, st.accepted), gain, len(st.accepted), st.drafts.shape[0]

    best = max(steps, key=key)
    row = best.row
    pos = len(best.history) - len(ids[row])  # tokens emitted before this step (root included)
    truth = greedy[row][pos : pos + best.sausage.h]
    return best, truth


def _visible(text: str, space: str = "·") -> str:
    """A token's text with spaces shown as ``space`` and control characters escaped."""
    return "".join(space if c == " " else (c if c.isprintable() else repr(c)[1:-1]) for c in text)


def draw_step(tokenizer, step, truth, path: Path, rows: int = 8) -> Path:
    """The step's sausage: one column per head (slot), candidates best first, shaded by the
    head's probability; green = the greedy continuation, bold outline = accepted, blue outline = in
    a verified path, red line = the lattice drafter's best path (``step.best``: the rescored one)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    s = step.sausage
    h, k = s.h, min(s.k, rows)
    fig, ax = plt.subplots(figsize=(1.7 * h + 2.2, 0.55 * k + 2.2))
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
    best = [] if step.best is None else [int(t) for t in step.best[:h]]
    at = []  # the best path's cells (their rows), left to right, while they are on the picture
    for j, t in enumerate(best):
        where = np.flatnonzero(s.tokens[j, :k] == t)
        if not len(where):
            break
        at.append(int(where[0]))
    for j, r in enumerate(at):  # a red frame inside each of its cells, joined across the gaps
        ax.add_patch(Rectangle((j + 0.07, -r - 0.93), 0.8, 0.76, fill=False, edgecolor="tab:red", lw=1.8, zorder=3))
        if j + 1 < len(at):
            ax.plot([j + 0.87, j + 1.07], [-r - 0.55, -at[j + 1] - 0.55], color="tab:red", lw=1.8, zorder=3)
    ax.set_xlim(-0.1, h + 0.05)
    ax.set_ylim(-k - 0.2, 0.9)
    for j in range(h):
        ax.text(j + 0.47, 0.35, f"head {j + 2}", ha="center", fontsize=8)
    ctx = _visible(tokenizer.decode([int(x) for x in step.history[-12:]]), space=" ")
    paths = [row[row >= 0] for row in step.drafts]
    lat = sum(len(p) <= h and _in_lattice(s, p) == len(p) for p in paths)  # the others: other sources' paths
    n_other = len(paths) - lat
    kept = _prefix(best, step.accepted)
    top1 = _prefix(s.tokens[:, 0], step.accepted)
    text_best = " ".join(repr(_visible(tokenizer.decode([t]), space=" ")) for t in best) or "none"
    ax.set_title(f"One BPD step after …{ctx!s:.60}\n"
                 f"red: the n-gram-rescored best path ({text_best}): {kept} of its tokens accepted (the heads' "
                 f"own top-1 path would have kept {top1})\n"
                 f"{lat} lattice path{'s' if lat != 1 else ''}"
                 + (f" + {n_other} other path{'s' if n_other != 1 else ''}" if n_other else "")
                 + f" verified in one tree (blue outline = in a verified path); {acc} draft token"
                 f"{'s' if acc != 1 else ''} accepted + 1 bonus\ngreen = the greedy continuation, bold = accepted, "
                 "number = the head's probability", fontsize=8.5)
    ax.axis("off")
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=130, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)
    return path


def table(summary: dict) -> str:
    """Every row against HF greedy: tokens/s, the speed-up, tokens per target call, whether every
    output equals HF greedy's, and the seconds it was timed over (passes and their spread; an
    unsteady ratio is named, not printed)."""
    L = [f"{'':<28} {'tokens/s':>9} {'x HF greedy':>12} {'tokens/call':>12}  {'equals greedy':<14} timed over",
         "-" * 100]
    for r in summary["rows"]:
        lo, hi = r["tokens_per_s_range"]
        timed = f"{r['seconds']:.1f} s" + (f" ({r['passes']} passes: {lo:.1f}-{hi:.1f} tokens/s)" if r["passes"] > 1
                                           else "")
        x = f"{'unsteady':>12}" if r.get("unsteady") else f"{r['x_hf_greedy']:>11.2f}x"
        L.append(f"{r['name']:<28} {r['tokens_per_s']:>9.1f} {x} {r['tokens_per_call']:>12.2f}  "
                 f"{'yes' if r['exact'] else 'NO':<14} {timed}")
    return "\n".join(L)

"""``latticedraft eval``: every drafter over one prompt set, the paper's tables and figures.

Writes into ``out_dir``: ``results.json`` (every run: block efficiency, tokens/s, exactness
against greedy, time split), ``results.md`` (Table 4: block efficiency per drafter with %
vs Base; Table 3: consecutive repetition of drafts before/after 2-gram rescoring; Table 10:
block efficiency using the first 3, 6, 9 heads), ``fig6_oracle_vs_k.png`` (oracle block
efficiency vs k per head count) and ``fig7_parallel_vs_p.png`` (block efficiency vs p for
Parallel 4-gram BPD and Parallel Base BPD).

Block efficiency = generated tokens / target calls, over all prompts (the prefill call
counts). Every run is checked token for token against plain greedy decoding.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from latticedraft.atomic import atomic_file, write_atomic
from latticedraft.decoding import registry
from latticedraft.decoding.methods.bpd import DrafterSpec
from latticedraft.decoding.methods.kangaroo import KangarooOptions
from latticedraft.decoding.methods.lookahead import LookaheadOptions
from latticedraft.decoding.runs.loaders import encode
from latticedraft.decoding.runs.prompt_length import fit_prompts
from latticedraft.decoding.runs.session import Session
from latticedraft.decoding.methods.ppd import PPDOptions
from latticedraft.errors import InputError, ModelError


@dataclass
class EvalConfig:
    """num_prompts: prompts evaluated, after skipping the first ``skip`` (the tuning split);
    alphas: interpolation weight per drafter family ("ngram", "neural"; None: learned while decoding,
    ``planning/rescore_weight.py``, the n-gram family's default)."""

    num_prompts: int = 20
    skip: int = 0
    max_new_tokens: int = 64
    k: int = 16
    nbest: int = 16
    prune: str = "none"  # lattice pruning of every BPD row (``LatticeOptions``)
    eps: float = 0.001
    backoff: float | None = None
    verify: str = "auto"
    ps: tuple = (1, 2, 4, 8, 16)
    ks: tuple = (1, 2, 4, 8, 16)
    head_counts: tuple = (3, 6, 9)
    alphas: dict = field(default_factory=lambda: {"ngram": None, "neural": 1.0})
    batch_size: int = 4
    lm2: str | None = None  # 2-gram build for Table 3 (default: the 4-gram, labelled so)
    rescorers: dict = field(default_factory=dict)  # label -> dir, for neural rows
    lookahead: LookaheadOptions | None = field(default_factory=LookaheadOptions)  # the lookahead row (None: none)
    kangaroo: KangarooOptions | None = field(default_factory=KangarooOptions)  # the Kangaroo row (None: none)
    ppd: PPDOptions | None = field(default_factory=PPDOptions)  # the PPD row (None: none)
    sampling: object = None  # SamplingOptions: every bpd / lookahead row samples losslessly (--do-sample)
    truncate_left: int | None = None  # keep the last N tokens of each prompt (``prompt_length``)
    sources: dict = field(default_factory=dict)  # dest -> value of each draft source on: a "Base + ..." row each

    def validate(self):
        if self.num_prompts < 1 or self.skip < 0:
            raise InputError(f"--num-prompts must be >= 1 and --skip >= 0, got {self.num_prompts}, {self.skip}")
        if self.max_new_tokens < 1:
            raise InputError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class Run:
    name: str
    spec: dict
    block_efficiency: float
    tokens: int
    calls: int
    seconds: float
    tokens_per_s: float
    exact: bool | None  # equals greedy; None for a sampled run (lossless by the rule, not by equality)
    verify: str
    timing: dict


def machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "python": platform.python_version()}


def _lookahead_name(o: LookaheadOptions) -> str:
    return f"Lookahead (W={o.W}, N={o.N}, G={o.G})"


def _early_layer_name(o) -> str:
    if isinstance(o, KangarooOptions):
        return f"Kangaroo (gamma={o.gamma}, eta={o.eta})"
    return f"PPD (exit layer {o.dbar or 'd/2'}, k={o.k}{', trained exit heads' if o.exit_heads else ''})"


def _early_layer_stats(session: Session, spec, res) -> dict:
    """Kangaroo: the early-exit acceptance rate per draft position; PPD: the measured match
    rate and Theorem 4.1's predicted latency and compute per token against greedy."""
    if isinstance(spec, KangarooOptions):
        from latticedraft.decoding.methods.kangaroo import acceptance_by_position

        drafted = [n - 1 for s in res.sequences for n in s.tree_nodes]
        return {"acceptance_per_position": acceptance_by_position(res.sequences),
                "drafted_per_step": round(float(np.mean(drafted)) if drafted else 0.0, 3),
                "tokens_per_call": round(res.block_efficiency, 4)}
    from latticedraft.decoding.ppd.model import predicted
    from latticedraft.gpu.models.layer_split import LayerSplit

    d = LayerSplit(session.model).num_layers
    return predicted(res.sequences, d, spec.dbar or d // 2, spec.k)


def _early_layer_md(stats: dict) -> list[str]:
    if not stats:
        return []
    L = ["", "## Early-layer self-drafting (Kangaroo, PPD)", ""]
    for name, st in stats.items():
        if "acceptance_per_position" in st:
            L.append(f"- {name}: {st['tokens_per_call']:.2f} tokens per deep pass, {st['drafted_per_step']:.2f} drafts "
                     "per step; acceptance rate per draft position: "
                     + ", ".join(f"{j}: {x:.2f}" for j, x in enumerate(st["acceptance_per_position"], 1)))
        else:
            L.append(f"- {name}: match rate p_correct {st['p_correct']:.3f} over {st['steps']} steps; Theorem 4.1 "
                     f"with d = {st['d']}, exit layer {st['dbar']}, k = {st['k']}, l = {st['l']}: latency "
                     f"{st['latency_vs_greedy']:.3f}x greedy's per token, compute {st['compute_vs_greedy']:.3f}x "
                     "(with k + 1 parallel units; on this CPU the candidates run after the main pass, no overlap)")
    return L


def _run(session: Session, name, ids, refs, method: str, spec, cfg: EvalConfig, record_steps=False):
    """One plan entry: ``method`` (a registry name) with its options object ``spec``."""
    sampling = cfg.sampling if registry.get(method).sampling != "never" else None  # the others decode greedily
    res = session.decode(ids, method, spec, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size,
                         verify=cfg.verify, record_steps=record_steps and sampling is None, sampling=sampling)
    exact = refs is None or all(np.array_equal(s.tokens, r) for s, r in zip(res.sequences, refs))
    run = Run(name, asdict(spec) if spec else {"method": method}, round(res.block_efficiency, 4), res.tokens,
              res.calls, round(res.seconds, 4), round(res.tokens / max(res.seconds, 1e-9), 2),
              None if sampling is not None else bool(exact),
              res.verify_mode, {k: round(v, 4) for k, v in res.timing.items()})
    return run, res


Entry = tuple[str, str, object, str]  # a plan row: (name, method, options, group)


def _bpd_plan(cfg: EvalConfig, head_counts: list[int], rescorers: dict, a_ng: float | None,
              a_nn: float) -> list[Entry]:
    """The BPD rows: Table 4's drafters, Figure 7's p sweep, Table 10's head counts and Figure 6's
    oracle k sweep, all on one top-``cfg.k`` lattice setting (``a_ng`` None: the n-gram rows learn
    their weight)."""
    base = DrafterSpec("top1", k=cfg.k, nbest=cfg.nbest, prune=cfg.prune, eps=cfg.eps, backoff=cfg.backoff)
    plan: list[Entry] = [("Base", "bpd", base, "table4"),
                         ("4-gram", "bpd", replace(base, name="ngram", alpha=a_ng), "table4")]
    for label in rescorers:
        plan.append((label, "bpd", replace(base, name="neural", alpha=a_nn), "table4"))
    plan.append(("Parallel Base BPD", "bpd", replace(base, name="parallel-base", nbest=cfg.nbest), "table4"))
    plan.append(("Parallel 4-gram BPD", "bpd", replace(base, name="parallel", alpha=a_ng, nbest=cfg.nbest), "table4"))
    for k in (2, 16):
        plan.append((f"Oracle (k={k})", "bpd", replace(base, name="oracle", k=k), "table4"))
    plan += _source_plan(base, cfg.sources)
    for p in cfg.ps:
        plan.append((f"parallel p={p}", "bpd", replace(base, name="parallel", alpha=a_ng, nbest=p), "fig7"))
        plan.append((f"parallel-base p={p}", "bpd", replace(base, name="parallel-base", nbest=p), "fig7"))
    for hc in head_counts:
        plan.append((f"top1 h={hc}", "bpd", replace(base, slots=hc - 1), "table10"))
        for k in cfg.ks:
            plan.append((f"oracle h={hc} k={k}", "bpd", replace(base, name="oracle", k=k, slots=hc - 1), "fig6"))
    return plan


def _source_plan(base: DrafterSpec, sources: dict) -> list[Entry]:
    """The draft sources' rows: the Base drafter with each source on (``--self-draft auto``, ...)
    alone, then with all of them where several are on."""
    plan: list[Entry] = [(source_row(dest, value), "bpd", replace(base, **{dest: value}), "sources")
                         for dest, value in sources.items()]
    if len(sources) > 1:
        plan.append(("Base + every source", "bpd", replace(base, **sources), "sources"))
    return plan


def source_row(dest: str, value) -> str:
    """The name of the row of draft source option ``dest`` at ``value``: "Base + --self-draft auto"."""
    return f"Base + --{dest.replace('_', '-')} {value}"


def _other_plan(session: Session, cfg: EvalConfig, notify) -> list[Entry]:
    """The lookahead, Kangaroo and PPD rows; a model that cannot run Kangaroo or PPD gets no row and
    ``notify`` says why."""
    plan: list[Entry] = []
    if cfg.lookahead is not None:
        plan.append((_lookahead_name(cfg.lookahead), "lookahead", cfg.lookahead, "lookahead"))
    if cfg.kangaroo is not None:
        try:  # a model without a matching adapter gets no Kangaroo row, and is told why
            session.prepare("kangaroo", cfg.kangaroo)
            plan.append((_early_layer_name(cfg.kangaroo), "kangaroo", cfg.kangaroo, "early-layer"))
        except (InputError, ModelError) as e:
            notify(f"no Kangaroo row: {e}")
    if cfg.ppd is not None:
        try:  # a one-layer model has no early exit
            session.prepare("ppd", cfg.ppd)
            plan.append((_early_layer_name(cfg.ppd), "ppd", cfg.ppd, "early-layer"))
        except (InputError, ModelError) as e:
            notify(f"no PPD row: {e}")
    return plan


@dataclass
class _Done:
    """What the plan's runs gave: every row's ``Run``, greedy's outputs (the references; None when
    sampling), the Base row's recorded steps (Tables 3 and 5) and the early-layer drafting rows' statistics."""

    runs: dict[str, Run]
    refs: list | None
    base_steps: list | None
    early_layer: dict[str, dict]


def _run_plan(session: Session, plan: list[Entry], ids, cfg: EvalConfig, rescorers: dict, h: int, notify) -> _Done:
    """Every row of ``plan`` in order (greedy first, so later rows are checked against it); rows with
    identical settings run once and share the result."""
    from tqdm import tqdm

    out = _Done({}, None, None, {})
    done: dict[str, Run] = {}  # identical specs run once
    bar = tqdm(plan, desc="eval", unit="run", disable=None)
    for name, method, spec, group in bar:
        bar.set_postfix_str(name)
        kind = getattr(spec, "name", None)
        key = method + json.dumps(asdict(spec) if spec else {"greedy": 1}, sort_keys=True) + (
            name if kind == "neural" else "")
        if kind == "top1" and spec.slots in (None, h - 1) and group != "sources":
            key = "top1-all"
        if key in done:
            out.runs[name] = replace(done[key], name=name)
            continue
        if kind == "neural":
            session.rescorer_dir = rescorers[name]
        run, res = _run(session, name, ids, out.refs, method, spec, cfg, record_steps=(name == "Base"))
        if spec is None:
            out.refs = [s.tokens for s in res.sequences]
        if name == "Base":
            out.base_steps = res.steps
        if group == "early-layer":
            out.early_layer[name] = _early_layer_stats(session, spec, res)
        out.runs[name] = done[key] = run
        if run.exact is False:
            notify(f"warning: {name} differs from greedy decoding")
    return out


def _write(out_dir, results: dict, rescorers: dict, head_counts: list[int], cfg: EvalConfig) -> dict:
    """``results.json``, ``results.md`` and the figures into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": write_atomic(out / "results.json", json.dumps(results, indent=1) + "\n"),
        "table": write_atomic(out / "results.md", markdown(results, rescorers, head_counts)),
        "fig7": plot_fig7(results, cfg.ps, out / "fig7_parallel_vs_p.png"),
    }
    if cfg.sampling is None:  # the oracle rows are greedy-only
        paths["fig6"] = plot_fig6(results, head_counts, cfg.ks, out / "fig6_oracle_vs_k.png")
    return paths


def evaluate(session: Session, prompts: list[dict], cfg: EvalConfig, out_dir, notify=print) -> dict:
    """Run everything; returns the paths written."""
    cfg.validate()
    recs = prompts[cfg.skip : cfg.skip + cfg.num_prompts]
    if not recs:
        raise InputError(f"no prompts left after skipping {cfg.skip}; lower --skip or give more prompts")
    ids = fit_prompts(session.model, encode(session.tokenizer, [r["prompt"] for r in recs]), cfg.max_new_tokens,
                      cfg.truncate_left)
    h = int(getattr(session.model, "num_heads", 1))
    head_counts = sorted({min(c, h) for c in cfg.head_counts if c >= 2})
    if h < 2:
        raise InputError(f"{session.model_dir or 'the model'} has no multi-token heads; eval needs a BPD model")
    a_ng, a_nn = cfg.alphas.get("ngram"), float(cfg.alphas.get("neural", 1.0))
    rescorers = cfg.rescorers or {"neural": session.rescorer_dir}
    plan: list[Entry] = [("greedy", "greedy", None, "greedy"), *_bpd_plan(cfg, head_counts, rescorers, a_ng, a_nn),
                         *_other_plan(session, cfg, notify)]
    if cfg.sampling is not None:  # the oracle drafts the greedy output: nothing to sample
        plan = [e for e in plan if getattr(e[2], "name", None) != "oracle"]
    _warm_up(session, ids[:1], plan, rescorers)
    t0 = time.perf_counter()
    done = _run_plan(session, plan, ids, cfg, rescorers, h, notify)
    table3 = _repetition(session, done.base_steps, cfg, 1.0 if a_ng is None else float(a_ng))
    first = next(iter(rescorers))
    session.rescorer_dir = rescorers[first]
    table5 = _wins(session, done.base_steps, ids, done.refs, a_nn, first)  # both {} when sampling (no greedy steps)
    results = {
        "config": {**asdict(cfg), "model": session.base_dir, "heads": h, "prompts": len(recs)},
        "machine": machine(),
        "seconds": round(time.perf_counter() - t0, 2),
        "runs": {k: asdict(v) for k, v in done.runs.items()},
        "table3": table3,
        "table5": table5,
        "early_layer": done.early_layer,
        "all_exact": all(r.exact for r in done.runs.values() if r.exact is not None),
        "sampling": None if cfg.sampling is None else asdict(cfg.sampling),
    }
    return _write(out_dir, results, rescorers, head_counts, cfg)


def _warm_up(session: Session, ids, plan, rescorers) -> None:
    """One short untimed decode per drafter kind (numba compilation, first-call costs)."""
    seen = set()
    for name, method, spec, group in plan:
        kind = name if group == "sources" else getattr(spec, "name", method)  # a source's first call builds it
        if kind in seen or kind == "oracle":
            continue
        seen.add(kind)
        if kind == "neural":
            session.rescorer_dir = rescorers[name]
        session.decode(ids, method, spec, max_new_tokens=4)


def _repetition(session: Session, steps, cfg: EvalConfig, alpha: float) -> dict:
    """Table 3 over the Base run's lattices: the vanilla (top-1) draft vs the 1-best draft of
    the same top-k lattice rescored with the 2-gram (or, without one, the 4-gram) LM at ``alpha``
    (the paper's 1.0 where the n-gram rows learn theirs)."""
    from latticedraft.decoding.runs.loaders import load_lm
    from latticedraft.lattice.rescoring import rescore
    from latticedraft.lattice.stats import repetition

    if not steps:
        return {}
    lm = load_lm(cfg.lm2, session.tokenizer) if cfg.lm2 else session.lm
    label = f"{lm.order}-gram"
    vanilla, rescored = [], []
    for st in steps:
        if st.sausage is None:
            continue
        vanilla.append(st.sausage.top1())
        rescored.append(rescore(st.sausage, lm, alpha, 1, st.history).tokens[0])
    v, r = repetition(vanilla), repetition(rescored)
    return {"lm": label, "drafts": v.drafts, "alpha": alpha,
            "vanilla": {"pct_consecutive": round(v.pct_consecutive, 2), "max_run": round(v.mean_max_run, 2)},
            "rescored": {"pct_consecutive": round(r.pct_consecutive, 2), "max_run": round(r.mean_max_run, 2)}}


def _repeats(d) -> int:
    """Number of adjacent identical token pairs in a draft."""
    d = np.asarray(d)
    return int((d[1:] == d[:-1]).sum()) if len(d) > 1 else 0


def _wins(session: Session, steps, ids, refs, alpha: float, label: str) -> dict:
    """Table 5 over the Base run's steps: the neural draft vs the vanilla draft of the same
    lattice and history, compared by accepted length against the greedy continuation;
    % Repair = the rescored draft has fewer adjacent repeated tokens than the vanilla one,
    % Regress = more (per step, among the wins and among the losses)."""
    from latticedraft.decoding.proposers.heads import NeuralDrafter
    from latticedraft.lattice.oracle import accepted_length

    if not steps or refs is None:
        return {}
    proto = NeuralDrafter(session.rescorer, alpha)
    drafters = {}
    tally = {"ties": 0, "win": [0, 0, 0], "loss": [0, 0, 0]}  # total, repair, regress
    for st in steps:
        if st.sausage is None:
            continue
        d = drafters.setdefault(st.row, proto.spawn(st.row))
        pos = len(st.history) - len(ids[st.row])
        ref = refs[st.row][pos : pos + st.sausage.h]
        if len(ref) == 0:
            continue
        van = st.sausage.top1()
        neu = d.draft(st.sausage, st.history).tokens[0]
        a, b = accepted_length(van, ref), accepted_length(neu, ref)
        if a == b:
            tally["ties"] += 1
            continue
        t = tally["win" if b > a else "loss"]
        t[0] += 1
        t[1] += int(_repeats(neu) < _repeats(van))
        t[2] += int(_repeats(neu) > _repeats(van))

    def pct(x, n):
        return round(100.0 * x / n, 2) if n else 0.0

    return {"rescorer": label, "alpha": alpha, "ties": tally["ties"],
            **{k: {"total": v[0], "pct_repair": pct(v[1], v[0]), "pct_regress": pct(v[2], v[0])}
               for k, v in (("win", tally["win"]), ("loss", tally["loss"]))}}


def _rel(x: float, base: float) -> str:
    return f"{x:.2f} ({100.0 * (x - base) / base:+.2f}%)" if base else f"{x:.2f}"


def _pruning(c: dict) -> str:
    """", Otsu pruning (eps 0.001), back-off 0.1" for a config that prunes; "" otherwise."""
    parts = []
    if c.get("prune", "none") != "none":
        parts.append(f"{'Otsu' if c['prune'] == 'otsu' else 'static'} pruning (eps {c['eps']})")
    if c.get("backoff") is not None:
        parts.append(f"back-off {c['backoff']}")
    return "".join(", " + p for p in parts)


def markdown(results: dict, rescorers: dict, head_counts) -> str:
    runs = results["runs"]
    base = runs["Base"]["block_efficiency"]
    g = runs["greedy"]
    cols = ["Base", "4-gram", *rescorers.keys(), "Parallel Base BPD", "Parallel 4-gram BPD", "Oracle (k=2)", "Oracle (k=16)"]
    cols = [n for n in cols if n in runs]
    c = results["config"]
    smp = results.get("sampling")
    L = [f"# Parallel BPD evaluation: {c['prompts']} prompts, {c['max_new_tokens']} new tokens, "
         f"k = {c['k']}, p = {c['nbest']}, h = {c['heads']} heads" + _pruning(c),
         "", f"Model `{c['model']}`; alphas {c['alphas']}; machine: {results['machine']['processor']}, "
         f"{results['machine']['cpu_count']} CPUs. " + (
             f"Sampled losslessly (Gumbel-coupled verification) with {smp}: outputs are draws from the target's "
             "distribution, not equal to greedy." if smp else
             f"Every output equals greedy decoding: **{'yes' if results['all_exact'] else 'NO'}**."), "",
         "## Table 4: block efficiency (relative % vs Base)", "",
         "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols),
         "| " + " | ".join(_rel(runs[n]["block_efficiency"], base) if n != "Base" else f"{base:.2f}" for n in cols) + " |",
         "", "Speed, one pass each (indicative only: other processes share this CPU; "
         "`benchmarks/decode.py` measures medians of interleaved repeats). Greedy = plain autoregressive "
         "`generate`:", "",
         "| run | block efficiency | tokens/s | vs greedy | exact |", "|---|---|---|---|---|",
         f"| greedy | 1.00 | {g['tokens_per_s']:.1f} | 1.00x | yes |"]
    look = [n for n in runs if n.startswith(("Base + ", "Lookahead (", "Kangaroo (", "PPD ("))]
    for n in cols + look:
        r = runs[n]
        L.append(f"| {n} | {r['block_efficiency']:.2f} | {r['tokens_per_s']:.1f} | "
                 f"{r['tokens_per_s'] / max(g['tokens_per_s'], 1e-9):.2f}x | "
                 f"{'sampled' if r['exact'] is None else 'yes' if r['exact'] else 'NO'} |")
    t3 = results.get("table3") or {}
    if t3:
        L += ["", f"## Table 3: consecutive repetition in drafts before/after {t3['lm']} rescoring "
              f"of the top-{c['k']} lattice ({t3['drafts']} drafts, alpha {t3.get('alpha', 1.0):g})", "",
              f"| % Consec (vanilla) | % Consec ({t3['lm']}) | Max Run (vanilla) | Max Run ({t3['lm']}) |",
              "|---|---|---|---|",
              f"| {t3['vanilla']['pct_consecutive']:.1f} | {t3['rescored']['pct_consecutive']:.1f} | "
              f"{t3['vanilla']['max_run']:.2f} | {t3['rescored']['max_run']:.2f} |"]
    t5 = results.get("table5") or {}
    if t5:
        w, lo = t5["win"], t5["loss"]
        L += ["", f"## Table 5: {t5['rescorer']} rescored drafts vs vanilla BPD drafts, step by step "
              f"(alpha = {t5['alpha']})", "",
              "| Ties | Win | % Repair | % Regress | Loss | % Repair | % Regress |", "|---|---|---|---|---|---|---|",
              f"| {t5['ties']} | {w['total']} | {w['pct_repair']:.2f} | {w['pct_regress']:.2f} | {lo['total']} | "
              f"{lo['pct_repair']:.2f} | {lo['pct_regress']:.2f} |"]
    L += _early_layer_md(results.get("early_layer") or {})
    L += ["", "## Table 10: block efficiency using the first h heads (vanilla BPD)", "",
          "| " + " | ".join(f"h = {hc}" for hc in head_counts) + " |", "|" + "---|" * len(head_counts),
          "| " + " | ".join(f"{runs[f'top1 h={hc}']['block_efficiency']:.2f}" for hc in head_counts) + " |", ""]
    return "\n".join(L) + "\n"


def _save_png(fig, path: Path) -> Path:
    with atomic_file(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
    return path


def plot_fig6(results: dict, head_counts, ks, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    for hc in head_counts:
        ys = [runs[f"oracle h={hc} k={k}"]["block_efficiency"] for k in ks]
        ax.plot(ks, ys, marker="o", label=f"{hc} heads")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(ks), [str(k) for k in ks])
    ax.set_xlabel("k (candidates per head in the lattice)")
    ax.set_ylabel("oracle block efficiency")
    ax.set_title("Figure 6: oracle top-k block efficiency")
    ax.grid(alpha=0.3)
    ax.legend()
    out = _save_png(fig, path)
    plt.close(fig)
    return out


def plot_fig7(results: dict, ps, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    ax.plot(ps, [runs[f"parallel p={p}"]["block_efficiency"] for p in ps], marker="o", label="Parallel 4-gram BPD")
    ax.plot(ps, [runs[f"parallel-base p={p}"]["block_efficiency"] for p in ps], marker="s", label="Parallel Base BPD")
    ax.axhline(runs["Base"]["block_efficiency"], color="gray", ls=":", label="Base BPD (p = 1)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(ps), [str(p) for p in ps])
    ax.set_xlabel("p (drafts verified in parallel)")
    ax.set_ylabel("block efficiency")
    ax.set_title(f"Figure 7: parallel BPD vs p (top-{results['config']['k']} lattice)")
    ax.grid(alpha=0.3)
    ax.legend()
    out = _save_png(fig, path)
    plt.close(fig)
    return out

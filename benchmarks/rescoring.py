"""Table 4 at the defaults: the heads alone against n-gram-rescored heads, tokens per call and speed.

The BPD paper's Table 4 compares, per task, "Parallel Base BPD" (the p best paths of the heads'
lattice as the heads score them) with "Parallel 4-gram BPD" (the p best after ``head_logp + alpha
* lm_logp``). This measures that comparison as ``latticedraft decode`` runs it, on one model:

- ``heads alone``: ``--drafter parallel-base``;
- ``rescored, learned alpha``: ``--drafter parallel`` (alpha learned while decoding,
  ``decoding/planning/rescore_weight.py``; the session first decodes ``--teach`` prompts of another
  set so that it arrives with what a user's earlier sessions taught it);
- ``rescored, alpha 1``: ``--drafter parallel --alpha 1`` (the fixed weight the CLI used before);

each under three settings (``--settings``): ``defaults`` (every other option at the CLI's default:
context and LM n-grams, the cost-aware tree, the head gate, the self-draft where it pays), ``drafter
alone`` (``--context-ngrams 0 --lm-drafts 0 --self-draft off``: the heads' paths are all the tree
has, as in the paper) and ``drafter alone, every path verified`` (also ``--tree fixed``: all p best
paths are verified, the paper's protocol, where the cost-aware tree verifies the nodes it rates
highest). Prompts: the bundled model on held-back third-party code (``prompts/heldback-code.jsonl``,
teaching on the bundled held-out prompts); ``--smollm2``: SmolLM2 with its heads
(``data/heads-smollm2``) and 4-gram on Spec-Bench's six categories through the chat template
(``--per-category`` first turns each, as ``spec_bench.py`` draws them; teaching on other questions).

Per row: tokens per target call (prefill included), tokens/s (median of ``--repeats``, round-robin
after one untimed pass), whether every output equals HF greedy, the seconds spent in n-gram
rescoring (every ``rescore`` call with alpha > 0: drafting, and the learner's probes) and in the
heads' proposer's ``update`` (learning alpha: probes, rankings, scoring) as shares of the decode's
time, and the learned weight after the run. ``--sweep`` adds a replay: the lattices
of one ``drafter alone`` fixed-tree decode, ranked offline at every weight, k and pruning, scored by
the tokens the target would keep (its greedy path is known), with each ranking's microseconds.
The machine (CPU model and flags, torch threads) and the load average before and after are
recorded; the JSON goes to ``--out``; ``--png`` draws the figure of docs/rescoring.md.

    .venv/bin/python benchmarks/rescoring.py --sweep
    .venv/bin/python benchmarks/rescoring.py --smollm2 --per-category 1 --max-new-tokens 48 \\
        --out benchmarks/results/rescoring_smollm2.json
    .venv/bin/python benchmarks/rescoring.py --png benchmarks/results/rescoring.png --from \\
        benchmarks/results/rescoring.json benchmarks/results/rescoring_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from latticedraft.atomic import write_atomic  # noqa: E402

ROWS = {
    "heads alone (parallel-base)": ("--drafter", "parallel-base"),
    "rescored, learned alpha (parallel)": ("--drafter", "parallel"),
    "rescored, alpha 1 (parallel --alpha 1)": ("--drafter", "parallel", "--alpha", "1"),
}
ALONE = ("--context-ngrams", "0", "--lm-drafts", "0", "--self-draft", "off")
SETTINGS = {"defaults": (), "drafter alone": ALONE, "drafter alone, every path verified": ALONE + ("--tree", "fixed")}
HELDBACK = ROOT / "benchmarks" / "prompts" / "heldback-code.jsonl"


def cpu() -> dict:
    """The CPU's model name and flags (``/proc/cpuinfo``; empty where unreadable), platform, cores."""
    info = {"model": platform.processor() or platform.machine(), "flags": ""}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and info["model"] in ("", platform.machine(), platform.processor()):
                info["model"] = value.strip()
            if key.strip() == "flags" and not info["flags"]:
                info["flags"] = value.strip()
    except OSError:
        pass
    return {**info, "platform": platform.platform(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "threads": torch.get_num_threads()}


class RescoreClock:
    """Seconds spent in n-gram rescoring with alpha > 0 (the LM search and the rescored tokens'
    interpolated probabilities: wraps the ``rescore`` and ``token_probs`` the heads' drafters call) and in the heads' proposer's ``update`` (what learning alpha costs a step:
    its probes, arm 0's ranking where another was drafted with, the scoring)."""

    def __init__(self):
        from latticedraft.decoding.proposers import heads

        self.seconds, self.calls, self.learning, self.heads = 0.0, 0, 0.0, heads
        self.inner, self.update, self.probs = heads.rescore, heads.HeadProposer.update, heads.token_probs

        def timed(sausage, lm, alpha=1.0, *a, **k):
            t0 = time.perf_counter()
            out = self.inner(sausage, lm, alpha, *a, **k)
            if alpha > 0:
                self.seconds += time.perf_counter() - t0
                self.calls += 1
            return out

        def probs(*a, **k):
            t0 = time.perf_counter()
            out = self.probs(*a, **k)
            self.seconds += time.perf_counter() - t0
            return out

        def update(proposer, *a, **k):
            t0 = time.perf_counter()
            self.update(proposer, *a, **k)
            self.learning += time.perf_counter() - t0

        heads.rescore, heads.HeadProposer.update, heads.token_probs = timed, update, probs

    def restore(self) -> None:
        self.heads.rescore, self.heads.HeadProposer.update, self.heads.token_probs = self.inner, self.update, self.probs

    def read(self) -> tuple[float, int, float]:
        out = (self.seconds, self.calls, self.learning)
        self.seconds, self.calls, self.learning = 0.0, 0, 0.0
        return out


def prompts(a, session) -> tuple[list, list, list]:
    """(prompt ids, their categories, teaching prompt ids) for the model under test."""
    from latticedraft.decoding.runs.loaders import encode
    from latticedraft.decoding.runs.prompt_set import read_prompts
    from latticedraft.paths import data_dir

    if not a.smollm2:
        ids = encode(session.tokenizer, [r["prompt"] for r in read_prompts(HELDBACK, limit=a.num_prompts)])
        teach = encode(session.tokenizer, [r["prompt"] for r in read_prompts(data_dir() / "prompts.jsonl",
                                                                            limit=a.teach)]) if a.teach else []
        return ids, ["held-back code"] * len(ids), teach
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from spec_bench import QUESTIONS, sample_questions

    template = session.chat_template()
    qs = sample_questions(Path(a.questions or QUESTIONS), a.per_category, a.seed)
    chosen = {q["question_id"] for q in qs}
    others = [q for q in sample_questions(Path(a.questions or QUESTIONS), a.per_category + 2, a.seed + 1)
              if q["question_id"] not in chosen][: a.teach]
    first = lambda q: template.ids([{"role": "user", "content": q["turns"][0]}])  # noqa: E731
    return [first(q) for q in qs], [q["bench_category"] for q in qs], [first(q) for q in others]


def specs(a) -> dict:
    """(setting, row) -> the options ``latticedraft decode`` runs for it."""
    from latticedraft.cli import decode_options

    model = ("--model", a.heads) if a.heads else ()
    chat = ("--chat",) if a.smollm2 else ()
    return {(s, r): decode_options(*model, *chat, *extra, *flags)[1]
            for s, extra in SETTINGS.items() if s in a.settings for r, flags in ROWS.items()}


def learner_of(session, spec):
    from latticedraft.decoding.methods import bpd_session

    return bpd_session.rescore_weight(session, spec) if bpd_session.learns_alpha(spec) else None


def teach(session, table: dict, ids: list, a) -> dict:
    """Decode the teaching prompts with every row (untimed: the acceptance counts, the learners), as a
    user's earlier sessions would have; what the learners hold after."""
    out = {}
    for key, spec in table.items():
        if ids:
            session.decode(ids, "bpd", spec, max_new_tokens=a.max_new_tokens)
        w = learner_of(session, spec)
        if w is not None:
            out[" / ".join(key)] = {"alpha": w.alpha, "width": w.width, "lattice_steps": w.steps,
                                    "summary": w.summary()}
    return out


def measure(session, table: dict, ids: list, refs: list, a, clock: RescoreClock) -> dict:
    """Every row ``--repeats`` times round-robin after one untimed pass: its tokens per call, tokens/s,
    exactness, rescoring share and learned weight."""
    runs: dict = {k: [] for k in table}
    for rep in range(a.repeats + 1):
        for key, spec in table.items():
            clock.read()
            t0 = time.perf_counter()
            r = session.decode(ids, "bpd", spec, max_new_tokens=a.max_new_tokens)
            dt = time.perf_counter() - t0
            spent, calls, learning = clock.read()
            exact = all(np.array_equal(s.tokens, g) for s, g in zip(r.sequences, refs))
            if rep:  # (the first pass is untimed: T(n), tables, kernels)
                runs[key].append({"seconds": dt, "tokens": r.tokens, "calls": r.calls, "exact": exact,
                                  "rescore_seconds": spent, "rescore_calls": calls, "learning_seconds": learning})
    out = {}
    for key, rs in runs.items():
        w = learner_of(session, table[key])
        sec = statistics.median(x["seconds"] for x in rs)
        out[" / ".join(key)] = {
            "setting": key[0], "row": key[1], "tokens_per_call": statistics.median(x["tokens"] / x["calls"] for x in rs),
            "tokens_per_call_runs": [round(x["tokens"] / x["calls"], 4) for x in rs],
            "tokens_per_s": round(rs[0]["tokens"] / sec, 1), "seconds_median": round(sec, 4),
            "exact": all(x["exact"] for x in rs),
            "rescore_share": round(statistics.median(x["rescore_seconds"] / x["seconds"] for x in rs), 4),
            "update_share": round(statistics.median(x["learning_seconds"] / x["seconds"] for x in rs), 4),
            "rescore_calls": rs[-1]["rescore_calls"], "alpha": None if w is None else w.alpha,
            "width": None if w is None else w.width, "learned": None if w is None else w.summary(),
            "drafted_at": None if w is None else dict(zip(map(str, w.arms), w.drafted_at.tolist()))}
    return out


def sweep(session, ids: list, refs: list, a) -> dict:
    """The replay: one drafter-alone fixed-tree decode's lattices ranked at every weight, p, k and
    pruning; tokens the target would keep per lattice step and microseconds per ranking."""
    from latticedraft.cli import decode_options
    from latticedraft.decoding.planning.rescore_weight import GRID, kept
    from latticedraft.lattice.rescoring import rescore
    from latticedraft.lattice.sausage import Sausage
    from latticedraft.lattice.threshold import prune

    model = ("--model", a.heads) if a.heads else ()
    spec = decode_options(*model, "--drafter", "parallel-base", *SETTINGS["drafter alone, every path verified"])[1]
    r = session.decode(ids, "bpd", spec, max_new_tokens=a.max_new_tokens, record_steps=True)
    steps = [st for st in r.steps if st.sausage is not None]
    lats = {"k=16": lambda s: s, "k=8": lambda s: Sausage(s.tokens[:, :8].copy(), s.logp[:, :8].copy()),
            "k=4": lambda s: Sausage(s.tokens[:, :4].copy(), s.logp[:, :4].copy()),
            "static 0.01": lambda s: prune(s, eps=0.01), "otsu": lambda s: prune(s, eps=0.001, otsu=True),
            "back-off 0.05": lambda s: prune(s, eps_b=0.05)}
    out = {"steps": len(steps), "nbest": spec.nbest, "grid": list(GRID), "lattices": {}}
    for name, cut in lats.items():
        cut_steps = [(cut(st.sausage), st) for st in steps]
        rows = {}
        for p in (1, spec.nbest):
            keep, micro = [], []
            for alpha in GRID:
                total, t = 0, 0.0
                for s, st in cut_steps:
                    start = len(st.history) - len(ids[st.row])  # the root's place in the output
                    target = refs[st.row][start: start + s.h]
                    t0 = time.perf_counter()
                    d = rescore(s, session.lm, alpha, p, st.history)
                    t += time.perf_counter() - t0
                    total += kept(d.tokens, np.asarray(target))
                keep.append(round(total / max(len(steps), 1), 4))
                micro.append(round(t / max(len(steps), 1) * 1e6, 1))
            rows[f"p={p}"] = {"kept": keep, "us": micro}
        out["lattices"][name] = rows
    return out


def fresh_cache() -> Path:
    """Point ``$LATTICEDRAFT_CACHE`` at a new folder holding links to what the current cache built on
    purpose (and the measured step costs T(n), which are the machine's): no learned state."""
    import shutil
    import tempfile

    from latticedraft.paths import cache_dir

    old, new = cache_dir(), Path(tempfile.mkdtemp(prefix="latticedraft-cache-"))
    for name in ("lm", "kenlm", "models", "kernels"):
        if (old / name).exists():
            (new / name).symlink_to((old / name).resolve())
    if (old / "cost_model").is_dir():
        shutil.copytree(old / "cost_model", new / "cost_model")
    os.environ["LATTICEDRAFT_CACHE"] = str(new)
    return new


def table(rows: dict) -> str:
    """The rows as a markdown table."""
    lines = ["| setting | row | tokens/call | tokens/s | rescoring share | update share | alpha after | exact |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows.values():
        alpha = ("1 (fixed)" if r["alpha"] is None and "alpha 1" in r["row"] else "-" if r["alpha"] is None else
                 f"{r['alpha']:g}" + (f" top-{r['width']}" if r["width"] else ""))
        lines.append(f"| {r['setting']} | {r['row']} | {r['tokens_per_call']:.3f} | {r['tokens_per_s']:.1f} | "
                     f"{100 * r['rescore_share']:.1f}% | {100 * r['update_share']:.1f}% | {alpha} | "
                     f"{'yes' if r['exact'] else 'NO'} |")
    return "\n".join(lines)


def plot(paths: list, png: str) -> None:
    """docs/rescoring.md's figure: per result file and setting, the rescored rows' tokens per call
    against the heads alone (left) and, where a sweep was run, the tokens the target keeps per
    lattice step at each alpha against alpha 0 (right), in percent."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [json.loads(Path(p).read_text()) for p in paths]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    groups = [(run, setting) for run in runs for setting in SETTINGS if f"{setting} / {list(ROWS)[0]}" in run["rows"]]
    rescored = list(ROWS)[1:]
    for k, name in enumerate(rescored):
        vals = []
        for run, setting in groups:
            rows = run["rows"]
            base = rows[f"{setting} / {list(ROWS)[0]}"]["tokens_per_call"]
            vals.append(100 * (rows[f"{setting} / {name}"]["tokens_per_call"] / base - 1))
        axes[0].bar(np.arange(len(groups)) + (k - 0.5) * 0.38, vals, 0.38,
                    label=["learned alpha", "alpha 1 (fixed)"][k])
    axes[0].axhline(0, color="black", lw=0.8)
    short = {"drafter alone, every path verified": "every path\nverified"}
    axes[0].set_xticks(range(len(groups)), [f"{run['label'].split(' ')[0].rstrip(',')}\n{short.get(setting, setting)}"
                                            for run, setting in groups], fontsize=8)
    axes[0].set_ylabel("tokens per call against the heads alone (%)")
    axes[0].set_title("rescored heads against the heads alone (the CLI's settings)")
    axes[0].legend(fontsize=8)
    for run in runs:
        sw = run.get("sweep")
        if not sw:
            continue
        for p, style in (("p=1", "--"), (f"p={sw['nbest']}", "-")):
            for lat in ("k=16", "k=4"):
                kept_ = np.asarray(sw["lattices"][lat][p]["kept"])
                axes[1].plot(range(len(sw["grid"])), 100 * (kept_ / kept_[0] - 1), style, marker="o",
                             label=f"{run['label'].split(',')[0]}, {lat}, {p}")
        axes[1].set_xticks(range(len(sw["grid"])), [f"{g:g}" for g in sw["grid"]])
    axes[1].axhline(0, color="black", lw=0.8)
    axes[1].set_xlabel("alpha (the n-gram LM's weight; 0 = the heads' own ranking)")
    axes[1].set_ylabel("tokens kept per lattice step against alpha 0 (%)")
    axes[1].set_title("replay: drafter alone, every path verified")
    axes[1].legend(fontsize=7, ncol=2)
    axes[1].grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smollm2", action="store_true", help="SmolLM2 with data/heads-smollm2 on Spec-Bench")
    ap.add_argument("--heads", default=None, help="head directory (default: the bundled heads; --smollm2: "
                                                  "data/heads-smollm2)")
    ap.add_argument("--lm", default=None, help="n-gram LM build (default: the one built for the model's tokenizer)")
    ap.add_argument("--num-prompts", type=int, default=16, help="held-back code prompts (bundled model)")
    ap.add_argument("--questions", default=None, help="Spec-Bench's question.jsonl (default: ../shared/...)")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--teach", type=int, default=16, help="prompts of another set decoded first (0: none)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS),
                    help="which settings' rows to run (default: both)")
    ap.add_argument("--sweep", action="store_true", help="add the replay over alpha, p, k and pruning")
    ap.add_argument("--fresh-cache", action="store_true", help="learn as a fresh clone does: a new cache (its "
                    "built LMs, KenLM, fetched models and the step costs linked from the current one)")
    ap.add_argument("--out", default=None, help="JSON (default benchmarks/results/rescoring[_smollm2].json)")
    ap.add_argument("--png", default=None, help="draw the figure from --from (or this run's --out)")
    ap.add_argument("--from", dest="sources", nargs="+", default=None, help="result files to draw (--png)")
    a = ap.parse_args(argv)
    if a.smollm2 and a.heads is None:
        from latticedraft.paths import data_dir

        a.heads = str(data_dir() / "heads-smollm2")
    a.out = a.out or f"benchmarks/results/rescoring{'_smollm2' if a.smollm2 else ''}.json"
    return a


@torch.no_grad()  # scoped (tests run main in-process)
def main(argv=None) -> int:
    from latticedraft.decoding.eval import hf_baselines
    from latticedraft.decoding.runs.session import Session

    a = parse(argv)
    if a.png and a.sources:
        plot(a.sources, a.png)
        print(f"wrote {a.png}")
        return 0
    if a.fresh_cache:
        fresh_cache()
    load0 = os.getloadavg()
    s = Session(a.heads, None, a.lm, None, None, a.threads)
    ids, cats, teach_ids = prompts(a, s)
    refs = hf_baselines.greedy(s.model, ids, a.max_new_tokens, s.eos)[0]
    clock = RescoreClock()
    try:
        grid = specs(a)
        for spec in grid.values():
            s.prepare("bpd", spec)
        taught = teach(s, grid, teach_ids, a)
        rows = measure(s, grid, ids, refs, a, clock)
    finally:
        clock.restore()
    out = {"benchmark": "rescoring", "label": "SmolLM2 Spec-Bench" if a.smollm2 else "bundled, held-back code",
           "model": str(s.model_dir or "bundled"), "prompts": len(ids), "categories": sorted(set(cats)),
           "max_new_tokens": a.max_new_tokens, "repeats": a.repeats, "teach": len(teach_ids), "taught": taught,
           "fresh_cache": a.fresh_cache, "machine": cpu(), "load_average": {"start": list(load0), "end": list(os.getloadavg())}, "rows": rows}
    if a.sweep:
        out["sweep"] = sweep(s, ids, refs, a)
    write_atomic(Path(a.out), json.dumps(out, indent=1) + "\n")
    print(table(rows))
    print(f"load average {load0[0]:.2f} -> {os.getloadavg()[0]:.2f}; wrote {a.out}")
    if a.png:
        plot([a.out], a.png)
        print(f"wrote {a.png}")
    return 0 if all(r["exact"] for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

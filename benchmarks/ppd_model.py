"""The PPD model on the bundled base: measured p_correct (Table 2's shape), Theorem 4.1, the
discrete-event simulation against it, and the trade-off curves of Figures 3 and 4 as one PNG.

p_correct[dbar][k]: over the greedy continuations of held-out prompts (data/prompts.jsonl, the
first ``--num-prompts``, ``--max-new-tokens`` each), the fraction of generated positions whose
final greedy token is among the top-k at the output of layer dbar, with the shared LM head
(final norm + head) and with the trained per-layer heads (``--exit-heads``, default
data/exit-heads-ppd where built). Theorem 4.1 and the simulation (``--seeds`` runs of
``--length`` tokens) use those rates. Writes JSON and the PNG, prints the tables. Deterministic:
no timings here (the decode speed is in ``benchmarks/early_layer_drafts.py``).

    nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ppd_model.py \\
        --out benchmarks/results/ppd_model.json --png benchmarks/results/ppd_tradeoff.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latticedraft.atomic import write_atomic  # noqa: E402
from latticedraft.decoding.ppd.model import (expected_compute, expected_latency, match_rates,  # noqa: E402
                                             simulate_mean)
from latticedraft.decoding.runs.session import Session
from latticedraft.decoding.runs.loaders import encode
from latticedraft.decoding.runs.prompt_set import read_prompts  # noqa: E402
from latticedraft.paths import data_dir  # noqa: E402

KS = (1, 3, 5)


def plot(rows: list[dict], d: int, l: int, path: Path) -> None:
    """Figures 3 and 4: for each k, Theorem 4.1's curve over p_correct in [0, 1] at dbar = d/2 (thin
    line), and the points of the measured p_correct per exit layer (circles: shared LM head,
    squares: trained per-layer heads; labelled with dbar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10.5, 4.2))
    colors = {1: "tab:blue", 3: "tab:orange", 5: "tab:green"}
    half = d // 2
    ps = np.linspace(0, 1, 101)
    for k in KS:
        lat = np.array([expected_latency(d, half, p, l) / l for p in ps])
        comp = np.array([expected_compute(d, half, p, k, l) / l for p in ps])
        axes[0].plot(comp / lat, lat / d, color=colors[k], lw=1, alpha=0.6, label=f"k={k}, d̄={half}, p from 0 to 1")
        axes[1].plot(comp / d, lat / d, color=colors[k], lw=1, alpha=0.6, label=f"k={k}, d̄={half}, p from 0 to 1")
    for r in rows:
        lat = r["latency_per_token"] / d
        xs = (r["compute_per_token"] / r["latency_per_token"], r["compute_per_token"] / d)
        for ax, x in zip(axes, xs):
            ax.plot(x, lat, "o" if r["head"] == "shared" else "s", color=colors[r["k"]], ms=6,
                    mfc="none" if r["head"] == "shared" else colors[r["k"]])
            ax.annotate(f"{r['dbar']}", (x, lat), fontsize=7, xytext=(3, 2), textcoords="offset points")
    for ax in axes:
        ax.axhline(1.0, color="gray", ls=":", lw=1)
        ax.set_ylabel("latency per token (x greedy)")
        ax.grid(alpha=0.3)
    axes[0].set_xlabel("average compute units busy per time unit")
    axes[0].set_title("Figure 3 shape", fontsize=10)
    axes[1].set_xlabel("compute per token (x greedy)")
    axes[1].set_title("Figure 4 shape", fontsize=10)
    from matplotlib.lines import Line2D

    marks = [Line2D([], [], marker="o", mfc="none", color="k", ls="", label="measured, shared LM head"),
             Line2D([], [], marker="s", color="k", ls="", label="measured, trained exit heads")]
    h, lab = axes[1].get_legend_handles_labels()
    axes[1].legend(h + marks, lab + [m.get_label() for m in marks], fontsize=7)
    fig.suptitle(f"PPD on the bundled base (d = {d}, l = {l}): Theorem 4.1 with the measured p_correct "
                 "(point labels: exit layer d̄)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory (default: the bundled heads' base)")
    ap.add_argument("--exit-heads", default=None, help="per-layer early-exit heads (default data/exit-heads-ppd if built)")
    ap.add_argument("--prompts", default=str(data_dir() / "prompts.jsonl"))
    ap.add_argument("--num-prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--length", type=int, default=1000, help="l of the simulation check (default 1000)")
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/ppd_model.json"))
    ap.add_argument("--png", type=Path, default=Path("benchmarks/results/ppd_tradeoff.png"))
    from latticedraft.quiet import add_verbose_arg, quiet_libraries

    add_verbose_arg(ap)
    a = ap.parse_args(argv)
    quiet_libraries(a.verbose)

    s = Session(a.model, threads=1)
    from latticedraft.gpu.models.layer_split import LayerSplit

    split = LayerSplit(s.model)
    d = split.num_layers
    texts = [r["prompt"] for r in read_prompts(a.prompts, limit=a.num_prompts)]
    ids = encode(s.tokenizer, texts)
    greedy = s.decode(ids, "greedy", max_new_tokens=a.max_new_tokens)
    seqs = [(np.concatenate([p, q.tokens]), len(p)) for p, q in zip(ids, greedy.sequences)]
    heads_dir = a.exit_heads or (str(data_dir() / "exit-heads-ppd") if (data_dir() / "exit-heads-ppd" /
                                                                         "exit_heads.json").is_file() else None)
    tables = {"shared": match_rates(s.model, seqs, KS)}
    if heads_dir:
        from latticedraft.gpu.models.exit_heads import load_exit_heads

        tables["trained"] = match_rates(s.model, seqs, KS, exit_head=load_exit_heads(heads_dir, split))
    l = a.max_new_tokens
    rows = []
    for head, t in tables.items():
        for dbar, per_k in t["rates"].items():
            for k, p in per_k.items():
                lat, comp = expected_latency(d, dbar, p, l) / l, expected_compute(d, dbar, p, k, l) / l
                sim_lat, sim_comp = simulate_mean(d, dbar, k, a.length, p, seeds=a.seeds)
                f_lat, f_comp = expected_latency(d, dbar, p, a.length), expected_compute(d, dbar, p, k, a.length)
                rows.append({"head": head, "dbar": dbar, "k": k, "p_correct": round(p, 4),
                             "latency_per_token": round(lat, 4), "compute_per_token": round(comp, 4),
                             "latency_vs_greedy": round(lat / d, 4), "compute_vs_greedy": round(comp / d, 4),
                             "theorem_applies": dbar >= d / 2,
                             "sim_latency_rel_err": round(sim_lat / f_lat - 1, 5),
                             "sim_compute_rel_err": round(sim_comp / f_comp - 1, 5)})
    out = {"model": s.base_dir, "d": d, "prompts": len(ids), "max_new_tokens": a.max_new_tokens,
           "positions": tables["shared"]["positions"], "exit_heads": heads_dir, "simulation": {"l": a.length,
                                                                                            "seeds": a.seeds},
           "rows": rows}
    write_atomic(a.out, json.dumps(out, indent=1) + "\n")
    plot(rows, d, l, a.png)
    print(f"p_correct on {out['positions']} generated positions ({len(ids)} held-out prompts x {a.max_new_tokens} "
          f"tokens), bundled base d = {d}:\n")
    print("| exit layer d̄ | head | k=1 | k=3 | k=5 |\n|---|---|---|---|---|")
    for dbar in range(1, d):
        for head in tables:
            print(f"| {dbar} | {head} | " + " | ".join(f"{tables[head]['rates'][dbar][k]:.3f}" for k in KS) + " |")
    print(f"\nTheorem 4.1 per token (l = {l}), relative to greedy (d units); simulation error at l = {a.length}, "
          f"{a.seeds} seeds:\n")
    print("| d̄ | head | k | p_correct | latency | compute | sim. latency err | sim. compute err |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dbar']} | {r['head']} | {r['k']} | {r['p_correct']:.3f} | {r['latency_vs_greedy']:.3f}x | "
              f"{r['compute_vs_greedy']:.3f}x | {100 * r['sim_latency_rel_err']:+.2f}% | "
              f"{100 * r['sim_compute_rel_err']:+.2f}% |")
    print(f"\nwrote {a.out} and {a.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

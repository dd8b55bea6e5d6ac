"""How the training footprint estimate (``gpu/train/footprint.py``, the bound behind ``train``'s
memory refusals) compares with the memory a run really takes (issue 27).

Each configuration trains ``--steps`` steps on CPU in a fresh process, one torch thread, on the
held-out standard library; measured: the peak resident set (``ru_maxrss``) less the resident set
after the imports and before the model is built or the base loaded (so the interpreter, torch
and transformers are not counted; the corpus and its token cache are). The estimate must stay
below the measurement (it is a lower bound: a run it refuses cannot fit); ``ratio`` =
estimate / measured says how much of the real footprint it accounts for.

    .venv/bin/python benchmarks/train_footprint.py          # writes benchmarks/results/train_footprint.json
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIGS = {  # name: (verb, sizes)
    "lm-256x4": ("lm", dict(n_embd=256, n_layer=4, n_positions=256, batch_size=16, seq_len=256)),
    "lm-512x2-b8": ("lm", dict(n_embd=512, n_layer=2, n_positions=128, batch_size=8, seq_len=128)),
    "heads-stern-h4": ("heads", dict(heads=4, kind="stern", batch_size=16, seq_len=256)),
    "heads-dynamo-h3": ("heads", dict(heads=3, kind="dynamo", batch_size=8, seq_len=256)),
    "adapter-l2": ("adapter", dict(batch_size=16, seq_len=256)),
    "exit-heads": ("exit", dict(batch_size=8, seq_len=256)),
}


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def run_one(name: str, steps: int) -> dict:
    """Train configuration ``name`` in this process; returns estimate and measurement (bytes)."""
    import torch
    import transformers  # noqa: F401  (imported before the baseline, as the CLI has it)

    from latticedraft.gpu.train import footprint
    from latticedraft.gpu.train.loop import OptimConfig
    from latticedraft.lm.corpus import stdlib_split
    from latticedraft.lm.tokenizer import load_tokenizer
    from latticedraft.paths import data_dir

    torch.set_num_threads(1)
    verb, s = CONFIGS[name]
    corpus, tok, base_dir = stdlib_split("heldout")[:40], data_dir() / "tokenizer", data_dir() / "base"
    cfg = OptimConfig(steps=steps, lr=1e-3, batch_size=s["batch_size"], seq_len=s["seq_len"], checkpoint_every=10**6)
    vocab = load_tokenizer(tok).get_vocab_size(with_added_tokens=True)
    base = footprint.read_base_shape(base_dir)
    before = _rss()
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out"
        if verb == "lm":
            from latticedraft.gpu.train.lm import LMArch, train_lm

            arch = LMArch(n_embd=s["n_embd"], n_layer=s["n_layer"], n_head=4, n_positions=s["n_positions"])
            est = footprint.lm_bytes(vocab, s["n_embd"], s["n_layer"], s["n_positions"], arch.ffn, s["batch_size"],
                                     s["seq_len"])
            train_lm(tok, corpus, out, arch, cfg)
        elif verb == "heads":
            from latticedraft.gpu.train.heads import train_heads

            est = footprint.heads_bytes(base, s["heads"], s["kind"], 4 * base.hidden, s["batch_size"], s["seq_len"],
                                        False)
            train_heads(base_dir, corpus, out, s["heads"], s["kind"], cfg)
        elif verb == "adapter":
            from latticedraft.gpu.train.early_exit import train_adapter

            est = footprint.adapter_bytes(base, s["batch_size"], s["seq_len"])
            train_adapter(base_dir, corpus, out, 2, cfg)
        else:
            from latticedraft.gpu.train.early_exit import train_exit_heads

            est = footprint.exit_heads_bytes(base, s["batch_size"], s["seq_len"])
            train_exit_heads(base_dir, corpus, out, cfg)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    measured = peak - before
    return {"name": name, "verb": verb, **s, "estimate_bytes": est, "measured_bytes": measured,
            "ratio": round(est / measured, 3), "lower_bound": est <= measured}


def table(rows: list[dict]) -> str:
    from latticedraft.memory import human

    head = "| run | estimate | measured (peak RSS growth) | estimate / measured | lower bound |\n|---|---:|---:|---:|---|"
    return "\n".join([head, *(f"| {r['name']} | {human(r['estimate_bytes'])} | {human(r['measured_bytes'])} | "
                              f"{r['ratio']:.2f} | {'yes' if r['lower_bound'] else 'NO'} |" for r in rows)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "train_footprint.json")
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run_one(a.one, a.steps)))
        return 0
    rows = []
    for name in CONFIGS:
        r = subprocess.run([sys.executable, __file__, "--one", name, "--steps", str(a.steps)], capture_output=True,
                           text=True, check=True, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    from latticedraft.atomic import write_atomic

    write_atomic(a.out, json.dumps({"steps": a.steps, "device": "cpu", "threads": 1, "python": platform.python_version(),
                                    "runs": rows}, indent=1) + "\n")
    print(table(rows))
    return 0 if all(r["lower_bound"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

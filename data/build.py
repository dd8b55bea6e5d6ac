"""Stage-by-stage rebuild of the bundled defaults (run via ``data/build.sh [stage ...]``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parent
ROOT = DATA.parent
sys.path.insert(0, str(ROOT))

from latticedraft.lm.corpus import stdlib_root, stdlib_split  # noqa: E402
from latticedraft.lm.tokenizer import fingerprint, load_tokenizer, train_tokenizer  # noqa: E402

VOCAB = 8192
SEED = 0
# Sized so that every training stage together takes about half an hour on a shared 2-core CPU.
BASE = dict(n_embd=256, n_layer=4, n_head=4, n_positions=256)
BASE_OPT = dict(steps=500, lr=2e-3, batch_size=16, seq_len=256, weight_decay=0.01, checkpoint_every=50)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def stage_tokenizer() -> None:
    out = DATA / "tokenizer"
    out.mkdir(exist_ok=True)
    t0 = time.time()
    tok = train_tokenizer(stdlib_split("train"), VOCAB)
    tmp = out / "tokenizer.json.tmp"
    tok.save(str(tmp))
    os.replace(tmp, out / "tokenizer.json")
    meta = {"vocab_size": tok.get_vocab_size(), "fingerprint": fingerprint(tok), "corpus": "stdlib:train",
            "seconds": round(time.time() - t0, 1)}
    _write_atomic(out / "build.json", json.dumps(meta, indent=1) + "\n")
    print(f"tokenizer: {meta}")


def _rel(p: Path) -> str:
    return p.relative_to(stdlib_root()).as_posix()


def stage_heldout() -> None:
    """data/heldout.txt: the held-out standard-library files (relative paths), one per line."""
    files = stdlib_split("heldout")
    _write_atomic(DATA / "heldout.txt", "".join(_rel(p) + "\n" for p in files))
    print(f"heldout: {len(files)} files")


def stage_prompts(per_file: int = 2, lo: int = 32, hi: int = 64) -> None:
    """data/prompts.jsonl: prompts of lo..hi tokens, whole lines cut from the held-out files."""
    import numpy as np

    from latticedraft.lm.corpus import read_text

    tok = load_tokenizer(DATA / "tokenizer")
    rows = []
    for f in stdlib_split("heldout"):
        lines = read_text(f).splitlines(keepends=True)
        rng = np.random.default_rng([SEED, len(rows)])
        starts = [i for i, ln in enumerate(lines) if ln.strip() and not ln.startswith((" ", "\t"))] or [0]
        used: list[range] = []
        for start in rng.permutation(starts):
            text, end = "", int(start)
            for ln in lines[start:]:
                if len(tok.encode(text + ln).ids) > hi:
                    break
                text, end = text + ln, end + 1
            n = len(tok.encode(text).ids)
            span = range(int(start), end)
            if lo <= n <= hi and not any(set(span) & set(u) for u in used):
                rows.append({"prompt": text, "file": _rel(f), "line": int(start) + 1, "tokens": n})
                used.append(span)
                if len(used) == per_file:
                    break
    _write_atomic(DATA / "prompts.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    print(f"prompts: {len(rows)} prompts of {lo}..{hi} tokens from {len({r['file'] for r in rows})} held-out files")


def _train_lm(name: str, arch: dict, opt: dict) -> None:
    from latticedraft.gpu.train import LMArch, OptimConfig, train_lm

    out = DATA / name
    res = train_lm(DATA / "tokenizer", stdlib_split("train"), out, LMArch(**arch), OptimConfig(seed=SEED, **opt),
                   resume=(out / "checkpoint.pt").is_file(), save_dtype="float16")
    print(f"{name}: {res.steps} steps, {res.tokens} tokens, {res.seconds} s, final loss {res.losses}")


def stage_base() -> None:
    _train_lm("base", BASE, BASE_OPT)


STAGES = {"tokenizer": stage_tokenizer, "heldout": stage_heldout, "prompts": stage_prompts, "base": stage_base}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("stages", nargs="*", help=f"stages to run (default all): {' '.join(STAGES)}")
    args = ap.parse_args(argv)
    for name in args.stages or list(STAGES):
        if name not in STAGES:
            ap.error(f"unknown stage {name!r}; choose from {', '.join(STAGES)}")
        STAGES[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main())

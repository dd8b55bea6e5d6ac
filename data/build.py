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


STAGES = {"tokenizer": stage_tokenizer}


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

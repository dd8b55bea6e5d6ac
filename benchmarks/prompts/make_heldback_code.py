"""Make ``heldback-code.jsonl``: prompts from third-party Python source the project never trains on.

The bundled models are trained on the standard library only (``stdlib:train``; site-packages are
excluded from the corpus by ``latticedraft.lm.corpus``). This script takes one prompt from each of
``--count`` pure-Python packages installed in the virtual environment (``PACKAGES``, in order;
packages not installed are skipped), from a file drawn with a seeded RNG among the package's ``.py``
files of at least 2 kB. A prompt is whole lines starting at an unindented, non-blank line, as long
as it stays within ``lo..hi`` tokens of the bundled tokenizer (``data/build.py``'s ``stage_prompts``
rule). Each record names the package, the file (relative to site-packages) and the line, so the
set can be checked and never trained on.

    .venv/bin/python benchmarks/prompts/make_heldback_code.py          # rewrites heldback-code.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from latticedraft.atomic import write_atomic  # noqa: E402
from latticedraft.lm.tokenizer import load_tokenizer  # noqa: E402

PACKAGES = ("tqdm", "click", "rich", "jinja2", "networkx", "sympy", "packaging", "pygments", "yaml", "idna",
            "dateutil", "pluggy", "markdown_it", "typer", "anyio", "h11", "filelock", "fsspec", "pyparsing",
            "mpmath", "huggingface_hub")
OUT = Path(__file__).resolve().parent / "heldback-code.jsonl"


def cut_prompt(lines: list[str], start: int, tok, hi: int) -> tuple[str, int]:
    """The longest run of whole lines from ``start`` that stays within ``hi`` tokens: (text, tokens)."""
    text = ""
    for ln in lines[start:]:
        if len(tok.encode(text + ln).ids) > hi:
            break
        text += ln
    return text, len(tok.encode(text).ids)


def prompt_from(path: Path, tok, rng: np.random.Generator, lo: int, hi: int) -> tuple[str, int, int] | None:
    """(prompt, 1-based line, tokens) from ``path``, or None when no unindented line gives lo..hi tokens."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    except (UnicodeDecodeError, OSError):
        return None
    starts = [i for i, ln in enumerate(lines) if ln.strip() and not ln.startswith((" ", "\t", "#"))]
    for start in rng.permutation(starts) if starts else []:
        text, n = cut_prompt(lines, int(start), tok, hi)
        if lo <= n <= hi:
            return text, int(start) + 1, n
    return None


def make(site: Path, tok, count: int, lo: int, hi: int, seed: int) -> list[dict]:
    rows = []
    for pkg in PACKAGES:
        root = site / pkg
        if not root.is_dir():
            continue
        files = sorted(f for f in root.rglob("*.py") if f.stat().st_size >= 2000 and "test" not in f.parts
                       and "tests" not in f.parts)
        rng = np.random.default_rng([seed, len(rows)])
        for i in rng.permutation(len(files)):
            got = prompt_from(files[i], tok, rng, lo, hi)
            if got is not None:
                text, line, n = got
                rows.append({"prompt": text, "package": pkg, "file": files[i].relative_to(site).as_posix(),
                             "line": line, "tokens": n})
                break
        if len(rows) == count:
            break
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--site-packages", default=sysconfig.get_paths()["purelib"], help="where the packages are")
    ap.add_argument("--tokenizer", default=str(ROOT / "data" / "tokenizer" / "tokenizer.json"))
    ap.add_argument("--count", type=int, default=16, help="prompts, one per package (default 16)")
    ap.add_argument("--lo", type=int, default=32, help="fewest prompt tokens (default 32)")
    ap.add_argument("--hi", type=int, default=64, help="most prompt tokens (default 64)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-o", "--out", default=str(OUT))
    a = ap.parse_args(argv)
    rows = make(Path(a.site_packages), load_tokenizer(a.tokenizer), a.count, a.lo, a.hi, a.seed)
    if len(rows) < a.count:
        print(f"error: only {len(rows)} of {a.count} packages gave a prompt in {a.site_packages}", file=sys.stderr)
        return 2
    write_atomic(Path(a.out), "".join(json.dumps(r) + "\n" for r in rows))
    print(f"{a.out}: {len(rows)} prompts of {a.lo}..{a.hi} tokens from {', '.join(r['package'] for r in rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fixtures for the lattice tests: a small real n-gram LM built with KenLM's lmplz."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def real_lm(tmp_path_factory):
    """A 3-gram over the bundled tokenizer's ids, from a few standard-library files:
    ``(NgramFst, arpa path, token ids of the held-out text)``."""
    from latticedraft.lm.corpus import read_text, stdlib_split
    from latticedraft.lm.tokenizer import load_tokenizer
    from latticedraft.lm.wfst import NgramFst
    from latticedraft.paths import data_dir, kenlm_tool

    try:
        lmplz = kenlm_tool("lmplz")
    except Exception as e:  # pragma: no cover - set-up problem, not a test result
        pytest.skip(f"KenLM not built: {e}")
    tok = load_tokenizer(data_dir() / "tokenizer")
    d = tmp_path_factory.mktemp("lm3")
    files = stdlib_split("train")[:40]
    lines = []
    for f in files:
        ids = tok.encode(read_text(f, "replace")).ids
        for i in range(0, len(ids), 200):
            lines.append(" ".join(map(str, ids[i:i + 200])))
    (d / "train.txt").write_text("\n".join(lines) + "\n")
    arpa = d / "lm.arpa"
    with open(d / "train.txt") as fin, open(arpa, "w") as fout:
        subprocess.run([str(lmplz), "-o", "3", "-S", "10%", "-T", str(d), "--discount_fallback"],
                       stdin=fin, stdout=fout, stderr=subprocess.DEVNULL, check=True)
    fst = NgramFst.from_arpa(arpa, vocab_size=tok.get_vocab_size())
    held = stdlib_split("heldout")[0]
    ids = np.array(tok.encode(read_text(held, "replace")).ids, dtype=np.int64)
    return fst, arpa, ids

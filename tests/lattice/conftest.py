"""Fixtures for the lattice tests: a small real n-gram LM built with ``latticedraft lm build``
(KenLM's lmplz underneath) over the bundled tokenizer."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def lm_build(tmp_path_factory) -> Path:
    """A 3-gram build directory over 40 standard-library files."""
    from latticedraft.cli import main
    from latticedraft.lm.corpus import stdlib_split
    from latticedraft.paths import data_dir, kenlm_tool

    try:
        kenlm_tool("lmplz")
    except Exception as e:  # pragma: no cover - a set-up problem, not a test result
        pytest.skip(f"KenLM not built: {e}")
    root = tmp_path_factory.mktemp("lm3")
    corpus = root / "corpus"
    corpus.mkdir()
    for i, f in enumerate(stdlib_split("train")[:40]):
        shutil.copy(f, corpus / f"{i:03d}_{f.name}")
    out = root / "build"
    rc = main(["lm", "build", "--corpus", str(corpus), "--out", str(out), "--order", "3",
               "--tokenizer", str(data_dir() / "tokenizer"), "--encoding-errors", "replace"])
    assert rc == 0
    return out


@pytest.fixture(scope="session")
def real_lm(lm_build):
    """``(NgramFst, arpa path, token ids of a held-out file)``."""
    from latticedraft.lm.corpus import read_text, stdlib_split
    from latticedraft.lm.ngram import NgramLM

    lm = NgramLM.load(lm_build)
    held = stdlib_split("heldout")[0]
    ids = np.array(lm.tokenizer.encode(read_text(held, "replace")).ids, dtype=np.int64)
    return lm.fst, lm_build / "lm.arpa", ids

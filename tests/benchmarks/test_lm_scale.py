"""``benchmarks/lm_scale.py`` end to end on a small slice of the real corpus (the full run is too
long for CI): it builds, indexes, measures and writes its JSON and table."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_lm_scale_on_a_slice(tmp_path):
    from latticedraft.lm.corpus import stdlib_split

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, f in enumerate(stdlib_split("train")[:30]):
        shutil.copy(f, corpus / f"{i:03d}_{f.name}")
    out = tmp_path / "scale.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "lm_scale.py"), "--root", str(tmp_path / "b"),
                        "--configs", "o5", "--corpus", str(corpus), "--slice-mb", "0.3", "--memory", "64M",
                        "--lattices", "2", "--warm", "2", "--rounds", "2", "--heldout-files", "2", "--first-runs", "1",
                        "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    row = doc["configs"]["o5"]
    assert row["order"] == 5 and len(row["ngrams"]) == 5
    assert row["build"]["wall_s"] > 0 and row["build"]["peak_rss_bytes"] > 0
    assert row["build"]["peak_tree_rss_bytes"] > 0  # build_binary runs beside the WFST conversion
    assert any("build_binary: KenLM trie" in line for line in row["build"]["stages"])
    assert row["disk_bytes"]["tables"] > 0 and row["disk_bytes"]["lm.bin"] > 0
    assert row["first_rescore"]["median_s"] > 0
    assert 1 < row["heldout"]["perplexity"] < 1e6 and row["heldout"]["tokens"] > 100
    cases = ("8x16_1best", "8x16_16best", "16x16_1best")
    assert set(row["latency"]) == {*cases, *(c + suffix for c in cases for suffix in ("_mean", "_cpu", "_cold")),
                                   "batch32_8x16_4best_per_s"}
    assert doc["machine"]["llc"].startswith("L")
    assert 0 < row["first_rescore"]["to_tables_mapped_median_s"] < row["first_rescore"]["median_s"]
    assert "| o5 |" in r.stdout

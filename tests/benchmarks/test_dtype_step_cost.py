"""``benchmarks/dtype_step_cost.py`` on the bundled base, two dtypes and a small grid: one row per
dtype with T(n) at every n (the fit nondecreasing), HF greedy's speed, the table printed; a model
directory that holds no model is refused in one line."""

from __future__ import annotations

import json

import pytest

from latticedraft.paths import data_dir
from tests.benchmarks.bundled import MARKS  # also puts benchmarks/ on the import path

pytestmark = MARKS


def test_one_row_per_dtype_and_the_table(tmp_path, capsys):
    import dtype_step_cost as b

    out = tmp_path / "d.json"
    assert b.main(["--model", str(data_dir() / "base"), "--dtypes", "bfloat16", "float32", "--context", "24",
                   "--new-tokens", "4", "--nodes", "1", "2", "4", "--repeats", "1", "--budget", "1", "--threads", "1",
                   "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["dtype"] for r in rows] == ["bfloat16", "float32"]
    for r in rows:
        assert r["nodes"] == [1, 2, 4] and len(r["raw_ms"]) == 3 and all(x > 0 for x in r["raw_ms"])
        assert r["fit_ms"] == sorted(r["fit_ms"]) and r["hf_greedy_tokens_per_s"] > 0 and r["context"] == 24
    printed = capsys.readouterr().out
    assert "| dtype | HF greedy tokens/s | lean stack | T(1) ms | T(2) ms | T(4) ms |" in printed
    assert "| bfloat16 |" in printed and "| float32 |" in printed


def test_a_missing_model_is_one_line(tmp_path, capsys):
    import dtype_step_cost as b

    assert b.main(["--model", str(tmp_path), "--out", str(tmp_path / "d.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds no model" in err[0] and not (tmp_path / "d.json").exists()

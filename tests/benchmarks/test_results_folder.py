"""``benchmarks/results/`` holds what the benchmarks recorded and the READMEs that say how, never
scripts: a measurement worth repeating is a benchmark under ``benchmarks/`` (it writes JSON and prints
a table); a one-off probe's code stays in git history, named by its folder's README."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_no_python_under_benchmarks_results():
    scripts = sorted(p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*.py"))
    assert not scripts, f"scripts under benchmarks/results (make them benchmarks or remove them): {scripts}"


def test_the_results_folder_is_there():
    assert (RESULTS / "decode.json").is_file() and any(RESULTS.glob("*/README.md"))

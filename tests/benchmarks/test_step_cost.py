"""``benchmarks/step_cost.py`` on a tiny setting (2 held-out prompts, 8 tokens, 1 repeat, batch 1
and 2): every row equals ``generate``, the parts add up to the step and the table is printed."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.bundled import MARKS  # also puts benchmarks/ on the import path

pytestmark = MARKS


@pytest.mark.slow
def test_parts_add_up_and_every_row_is_exact(tmp_path, capsys):
    import step_cost as b

    out = tmp_path / "step.json"
    assert b.main(["--num-prompts", "2", "--max-new-tokens", "8", "--repeats", "1", "--batch-sizes", "1", "2",
                   "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["batch"], r["row"]) for r in rows] == [(B, name) for B in (1, 2) for name in ("generate (HF)", *b.OURS)]
    assert all(r["exact"] and r["tokens"] == 16 for r in rows)
    for r in rows:
        if r["row"] == "generate (HF)":
            assert r["steps"] == (16 if r["batch"] == 1 else 8)
            continue
        by = r["ms_per_step_by_part"]
        assert set(by) == set(b.PARTS) and by["forward"] > 0
        assert sum(by.values()) == pytest.approx(r["ms_per_step"], abs=0.01)
        assert r["steps"] <= r["tokens"] - r["batch"]  # the prefill's token is not a step
    assert "| 2 | greedy loop (latticedraft) |" in capsys.readouterr().out

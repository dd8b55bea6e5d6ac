"""``benchmarks/custom_generate.py`` on a tiny setting (2 held-out prompts, 8 tokens, 1 repeat):
its JSON holds every row, each equal to greedy, the latticedraft rows with block efficiency >= 1."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.bundled import MARKS  # also puts benchmarks/ on the import path

pytestmark = MARKS


@pytest.mark.slow
def test_every_row_equals_greedy(tmp_path, capsys):
    import custom_generate as b

    out = tmp_path / "cg.json"
    assert b.main(["--num-prompts", "2", "--max-new-tokens", "8", "--repeats", "1", "--out", str(out)]) == 0
    rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == [b.GREEDY, *b.ROWS]
    assert all(r["equal_to_greedy"] and r["tokens"] == 16 for r in rows.values())
    assert rows[b.GREEDY]["block_efficiency"] is None
    assert all(rows[m]["block_efficiency"] >= 1.0 for m in b.ROWS)
    assert "| custom_generate (defaults) |" in capsys.readouterr().out

"""``benchmarks/chat_steps.py`` on a tiny chat model: every row equal to HF greedy, the per-step
profile reported, the gate overruled only for its own row, and the tree sizes counted right."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.benchmarks.bundled import MARKS  # also puts benchmarks/ on the import path
from tests.benchmarks.test_spec_bench import question_file, tiny_chat_model

pytestmark = MARKS


def test_tree_nodes_counts_the_trie_of_the_verified_paths():
    import chat_steps as c

    assert c.tree_nodes(np.array([[4, 5, -1], [4, 6, 7]])) == 5  # root, 4, 4-5, 4-6, 4-6-7
    assert c.tree_nodes(np.zeros((0, 0), dtype=np.int64)) == 1


def test_the_gate_that_computes_heads_every_step_never_turns_them_off():
    import chat_steps as c

    g = c.HeadsEveryStep()
    for step in range(200):
        assert g.choose(step % 4)
        g.update(step % 4, True, tokens=1, seconds=1.0)  # heads never pay here; the gate keeps them anyway


@pytest.mark.slow
def test_every_row_equals_hf_greedy_and_the_table_prints(tmp_path, capsys):
    import chat_steps as c
    import spec_bench as b

    model = tiny_chat_model(tmp_path)
    qs = question_file(tmp_path, ["writing", *b.CATEGORIES[1:]])
    out = tmp_path / "cs.json"
    assert c.main(["--heads", str(model), "--questions", str(qs), "--count", "6", "--max-new-tokens", "6",
                   "--threads", "1", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    rows = {r["name"]: r for r in res["rows"]}
    assert list(rows) == ["HF greedy", "ours: CLI default", "ours: heads every step", "ours: CLI default + suffix drafts"]
    assert all(r["exact"] for r in rows.values()) and res["questions"] == 6
    assert all(rows[n]["nodes_per_step"] >= 1 and rows[n]["ms_per_step"]["forward"] > 0 for n in list(rows)[1:])
    assert "ours: heads every step" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="at least one question per category"):
        c.main(["--heads", str(model), "--questions", str(qs), "--count", "3", "--out", str(out)])

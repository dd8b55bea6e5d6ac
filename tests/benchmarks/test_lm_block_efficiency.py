"""``benchmarks/lm_block_efficiency.py`` on a tiny setting (the bundled 4-gram under two labels,
2 held-out prompts, 8 tokens): its JSON, its table, block efficiency >= 1 and every output equal
to greedy. The real run (the big LMs under /work/biglm) is too long for CI."""

from __future__ import annotations

import json

from latticedraft.paths import default_lm_dir
from tests.benchmarks.bundled import MARKS  # also puts benchmarks/ on the import path

pytestmark = MARKS


def test_default_lms_takes_complete_builds_only(tmp_path):
    import lm_block_efficiency as b

    (tmp_path / "o4" / "tables").mkdir(parents=True)
    (tmp_path / "o4" / "manifest.json").write_text("{}")
    (tmp_path / "o4" / "tables" / "meta.json").write_text("{}")
    (tmp_path / "o5").mkdir()
    (tmp_path / "o5" / "manifest.json").write_text("{}")  # still writing its tables
    assert list(b.default_lms(tmp_path)) == ["bundled", "o4"]


def test_heldout_prompts_leave_out_the_tuning_split():
    import lm_block_efficiency as b

    assert b.heldout_indices(10, (2, 5), 0, None) == [0, 1, 5, 6, 7, 8, 9]
    assert b.heldout_indices(10, (2, 5), 1, 3) == [1, 5, 6]
    assert b.heldout_indices(4, None, 0, 2) == [0, 1]


def test_arpa_unigrams_reads_the_1gram_section_only(tmp_path):
    import lm_block_efficiency as b

    arpa = tmp_path / "lm.arpa"
    arpa.write_text("\\data\\\nngram 1=4\nngram 2=1\n\n\\1-grams:\n-9\t<unk>\t0\n0\t<s>\t-0.5\n"
                    "-0.3\t</s>\t0\n-0.6\t7\t-0.2\n\n\\2-grams:\n-0.1\t7 9\n\n\\end\\\n")
    assert b.arpa_unigrams(arpa) == {7}


def test_lm_block_efficiency_tiny(tmp_path, capsys):
    import lm_block_efficiency as b

    out = tmp_path / "lmbe.json"
    assert b.main(["--lms", "bundled=default", f"again={default_lm_dir()}", "--num-prompts", "2",
                   "--max-new-tokens", "8", "--batch-size", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    s = doc["settings"]
    assert len(s["prompt_indices"]) == 2 and s["max_new_tokens"] == 8 and s["alpha"] > 0
    if s["tuning_split"] is not None:
        lo, hi = s["tuning_split"]
        assert not any(lo <= i < hi for i in s["prompt_indices"])
    assert len(doc["machine"]["loadavg_before"]) == 3
    assert set(doc["baseline"]) == {"greedy", "top1", "parallel-base"}
    assert doc["baseline"]["greedy"]["block_efficiency"] == 1.0
    assert list(doc["lms"]) == ["bundled", "again"]
    for row in doc["lms"].values():
        assert row["order"] == 4 and len(row["ngram_counts"]) == 4 and row["ngrams_total"] > 0
        assert row["newline_ids"] > 0 and 0 <= row["unseen_newline_ids"] <= row["newline_ids"]
        assert row["unseen_ids"] >= row["unseen_newline_ids"]
        assert set(row["runs"]) == {"ngram", "parallel"}
        for name, r in row["runs"].items():
            assert r["exact"] is True, name
            assert r["block_efficiency"] >= 1.0 and r["tokens"] == doc["baseline"]["greedy"]["tokens"]
            assert r["spec"]["alpha"] == s["alpha"] and r["spec"]["name"] == name
    assert doc["lms"]["bundled"]["runs"]["parallel"]["spec"]["nbest"] == 16
    assert doc["lms"]["bundled"]["runs"]["ngram"]["block_efficiency"] == \
        doc["lms"]["again"]["runs"]["ngram"]["block_efficiency"]  # same LM, same prompts: same drafts
    assert doc["all_exact"] is True
    table = capsys.readouterr().out
    assert "| bundled | 4 |" in table and "| again | 4 |" in table and "NO" not in table

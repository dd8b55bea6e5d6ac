"""``benchmarks/own_text_agreement.py``: own text made by ``scripts/own_text.py`` agrees in full
with our loop's greedy answers; an answer changed in the file agrees only up to the change."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[2]


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_own_text_agrees_and_a_changed_answer_does_not(chat_base, tmp_path, capsys):
    own = tmp_path / "own.txt.gz"
    args = ["--model", str(chat_base), "--rows", "3", "--seq-len", "28", "--question-tokens", "4",
            "--batch-size", "3", "--seed", "2", "--engine", "plain", "--cache", str(tmp_path / "c"), "-o", str(own)]
    assert _load("own_text_script", ROOT / "scripts" / "own_text.py").main(args) == 0
    bench = _load("own_text_agreement", ROOT / "benchmarks" / "own_text_agreement.py")
    from latticedraft.decoding.runs.chat import ChatTemplate

    before, after = ChatTemplate.load(chat_base).around_user_text()
    assert (before, after) == ("<|endoftext|>user\n", "\n<|endoftext|>assistant\n")
    pairs = bench.questions_and_answers(own, before, after)
    assert len(pairs) == 3

    out = tmp_path / "agree.json"
    assert bench.main(["--model", str(chat_base), "--text", str(own), "--rows", "3", "--tokens", "4",
                       "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["rows"] == 3 and got["rows_agreeing_fully"] == 3 and got["tokens_agreeing"] == 12
    assert "3 of 3 rows agree" in capsys.readouterr().out

    # one answer changed after its first word: that row agrees up to there, not in full
    text = gzip.decompress(own.read_bytes()).decode()
    q, answer = pairs[0]
    i = text.index(q + after) + len(q + after)
    changed = text[:i] + "\u2603" + text[i:]
    bad = tmp_path / "bad.txt.gz"
    bad.write_bytes(gzip.compress(changed.encode()))
    assert bench.main(["--model", str(chat_base), "--text", str(bad), "--rows", "3", "--tokens", "4",
                       "--out", str(out)]) == 0
    rows = {r["agreeing_tokens"] for r in json.loads(out.read_text())["per_row"]}
    assert json.loads(out.read_text())["rows_agreeing_fully"] == 2 and 0 in rows

"""``scripts/own_text.py``: a chat model's own questions and answers as gzip text, from the
continuation cache, with one-line refusals and nothing half-written."""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest

from latticedraft.gpu.train.continuations import ContinuationSpec, continuations

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("own_text_script", ROOT / "scripts" / "own_text.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_writes_the_chat_rows_as_text(chat_base, tmp_path, capsys):
    from latticedraft.decoding.runs.continuations import LoopDecoder
    from latticedraft.lm.tokenizer import load_tokenizer

    out = tmp_path / "own.txt.gz"
    args = ["--model", str(chat_base), "--rows", "3", "--seq-len", "20", "--question-tokens", "6", "--batch-size", "2",
            "--seed", "5", "--cache", str(tmp_path / "cache"), "-o", str(out)]
    assert _script().main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == 3 and report["tokens"] == 60 and report["generated_rows"] == 3
    tok = chat_base / "tokenizer.json"
    spec = ContinuationSpec(prompts=3, prompt_len=19, seq_len=20, sample_fraction=0.0, seed=5, batch_size=2,
                            chat_fraction=1.0, question_tokens=6)
    rows = continuations(chat_base, np.zeros(0, np.int32), spec, tok, LoopDecoder(chat_base, tok),
                         root=tmp_path / "cache")
    assert rows.generated == 0 and rows.greedy_rows == 3  # served by the cache the script filled; all greedy
    text = gzip.decompress(out.read_bytes()).decode()
    t = load_tokenizer(tok)
    assert text == "".join(t.decode(r.tolist(), skip_special_tokens=False) + "\n" for r in rows.rows)
    assert text.count("<|endoftext|>assistant\n") >= 3  # each row answers through the template
    assert _script().main(args + ["--force"]) == 0
    assert json.loads(capsys.readouterr().out)["generated_rows"] == 0  # the cache serves a second run
    assert gzip.decompress(out.read_bytes()).decode() == text


@pytest.mark.parametrize("case, message", [
    ("name", r"name it \*\.txt\.gz"),
    ("exists", "exists; pass --force to replace it"),
    ("model", "holds no config.json"),
    ("template", "--model: .* has no chat template"),
    ("rows", "--rows 0 must be at least 1"),
    ("batch", "--batch-size 0 must be at least 1"),
    ("device", "--device 'nowhere' is not a torch device"),
])
def test_bad_input_is_refused_in_one_line(chat_base, saved_bases, tmp_path, capsys, case, message):
    out = tmp_path / ("own.txt" if case == "name" else "own.txt.gz")
    if case == "exists":
        out.write_text("earlier")
    model = {"model": tmp_path / "nowhere", "template": saved_bases["llama"]}.get(case, chat_base)
    rows, batch = ("0" if case == "rows" else "2"), ("0" if case == "batch" else "2")
    device = ["--device", "nowhere"] if case == "device" else []
    assert _script().main(["--model", str(model), "--rows", rows, "--batch-size", batch, "--seq-len", "20",
                           "-o", str(out), "--cache", str(tmp_path / "cache"), *device]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and re.search(message, err) and "\n" not in err
    assert (out.read_text() == "earlier") if case == "exists" else not out.exists()
    assert not list(tmp_path.glob(".own*"))  # no temporary file left behind


def test_the_plain_engine_writes_the_loops_greedy_text(chat_base, tmp_path, capsys):
    """``--engine plain`` (the model's forward over a padded batch, for a GPU) writes, on the CPU,
    the same rows as the decode loop, in a cache of its own."""
    outs = {}
    for engine in ("loop", "plain"):
        outs[engine] = tmp_path / f"{engine}.txt.gz"
        args = ["--model", str(chat_base), "--rows", "3", "--seq-len", "20", "--question-tokens", "6",
                "--batch-size", "3", "--seed", "5", "--engine", engine, "--cache", str(tmp_path / "cache"),
                "-o", str(outs[engine])]
        assert _script().main(args) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["engine"] == engine and report["generated_rows"] == 3
    from latticedraft.decoding.runs.continuations import LoopDecoder, PlainDecoder
    from latticedraft.lm.tokenizer import load_tokenizer

    tok = chat_base / "tokenizer.json"
    spec = ContinuationSpec(prompts=3, prompt_len=19, seq_len=20, sample_fraction=0.0, seed=5, batch_size=3,
                            chat_fraction=1.0, question_tokens=6)
    rows = continuations(chat_base, np.zeros(0, np.int32), spec, tok, PlainDecoder(chat_base, tok),
                         root=tmp_path / "cache")
    assert rows.generated == 0  # served by the cache the plain run filled
    t = load_tokenizer(tok)
    text = "".join(t.decode(r.tolist(), skip_special_tokens=False) + "\n" for r in rows.rows)
    assert gzip.decompress(outs["plain"].read_bytes()).decode() == text
    chat, loop = PlainDecoder(chat_base).chat(), LoopDecoder(chat_base, tok)
    questions = json.loads((Path(rows.where) / "questions.json").read_text())
    for r, q in enumerate(questions):  # each answer is the loop's greedy answer to its question
        p = chat.render(q)
        assert np.array_equal(rows.rows[r, :len(p)], p)
        assert np.array_equal(rows.rows[r, len(p):], loop([p], 20 - len(p), None, 0, 0)[0]), r


def _prompt_file(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": t, "kind": "test"}) + "\n" for t in texts))
    return path


def test_answers_given_prompts_in_their_order_cut_after_the_end(chat_base, tmp_path, capsys):
    """``--prompts``: each row is the prompt through the template, then the loop's greedy answer to
    it alone, cut after its first end id; batches go by length and a second run is served by the cache."""
    from latticedraft.decoding.runs.chat import ChatTemplate
    from latticedraft.decoding.runs.continuations import LoopDecoder
    from latticedraft.lm.tokenizer import load_tokenizer

    texts = ["def f(x):", "a much longer prompt than the others, with more words in it", "import os"]
    out = tmp_path / "answers.txt.gz"
    args = ["--model", str(chat_base), "--prompts", str(_prompt_file(tmp_path / "p.jsonl", texts)),
            "--answer-tokens", "12", "--batch-size", "2", "--cache", str(tmp_path / "cache"), "-o", str(out)]
    assert _script().main(args) == 0
    assert json.loads(capsys.readouterr().out)["generated_batches"] == 2
    tok = chat_base / "tokenizer.json"
    template, loop, t = ChatTemplate.load(chat_base), LoopDecoder(chat_base, tok), load_tokenizer(tok)
    ends = set(loop.end_ids())
    want = []
    for text in texts:
        p = template.ids([{"role": "user", "content": text}])
        a = loop([p], 12, None, 0, 0)[0].tolist()
        cut = next((j + 1 for j, x in enumerate(a) if x in ends), len(a))
        want.append(t.decode(p.tolist() + a[:cut], skip_special_tokens=False) + "\n")
    assert gzip.decompress(out.read_bytes()).decode() == "".join(want)
    assert _script().main(args + ["--force"]) == 0
    assert json.loads(capsys.readouterr().out)["generated_batches"] == 0


@pytest.mark.parametrize("content, message", [
    ('{"text": "no prompt field"}\n', r"p\.jsonl line 1: no string 'prompt' \(nor chat 'messages' or 'turns'\)"),
    ("\n", "p\\.jsonl holds no usable prompts"),
])
def test_a_bad_prompt_file_is_refused_in_one_line(chat_base, tmp_path, capsys, content, message):
    (tmp_path / "p.jsonl").write_text(content)
    out = tmp_path / "answers.txt.gz"
    assert _script().main(["--model", str(chat_base), "--prompts", str(tmp_path / "p.jsonl"),
                           "--cache", str(tmp_path / "cache"), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and re.search(message, err) and "\n" not in err
    assert not out.exists()

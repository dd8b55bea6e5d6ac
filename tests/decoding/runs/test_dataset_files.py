"""The files of a data-set run (issue 27): OUT is never the prompt file, a file of another kind is
named for what it is (and never appended to or cut), `eval --records` names the cause it found
with advice for that path (only a torn last line advises --resume), a resume with nothing left says
so, ids appear as written, an interrupt names what was kept, and the draft-model drafter runs."""

import io
import json
import sys

import pytest

from latticedraft.cli import main
from latticedraft.paths import data_dir
from tests.contract import refused
from tests.decoding.tiny import save_bpd_bundle

TOKENIZER = data_dir() / "tokenizer" / "tokenizer.json"
pytestmark = [pytest.mark.skipif(not TOKENIZER.is_file(), reason="bundled tokenizer missing (run scripts/setup.sh)"),
              pytest.mark.usefixtures("one_torch_thread")]
TEXTS = ["def f(x):\n    return", "import os\n", "x = 1", "for i in range(3):", "print('hi')", "while True:\n"]
VARYING = ("seconds", "share_seconds", "rank", "world_size")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return save_bpd_bundle(tmp_path_factory.mktemp("bundle"), TEXTS)


def _decode(bundle, *args) -> list:
    return ["decode", "--model", bundle / "heads", "--max-new-tokens", "6", "--tree", "fixed", *args]


@pytest.fixture(scope="module")
def full(bundle, tmp_path_factory):
    out = tmp_path_factory.mktemp("full") / "out.jsonl"
    assert main([str(a) for a in _decode(bundle, "--prompts", bundle / "prompts.jsonl", "--output", out)]) == 0
    return out


def _comparable(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [{k: v for k, v in json.loads(x).items() if k not in VARYING} for x in f]


@pytest.mark.parametrize("resume", [[], ["--resume"]])
def test_the_prompt_file_is_never_the_output(tmp_path, capsys, bundle, resume):
    src = tmp_path / "in.jsonl"
    src.write_bytes((bundle / "prompts.jsonl").read_bytes())
    refused(capsys, _decode(bundle, "--prompts", src, "--output", src, *resume),
            f"--output {src} is the --prompts file itself", watch=[tmp_path])


@pytest.mark.parametrize("content, looks_like", [
    ('{"prompt": "a"}\n{"prompt": "b"}\n', "a --prompts file"),
    ('{"id": 1, "prompt": "a"}', "a --prompts file"),  # one line, no newline: must not be cut as a torn record
    ('{"prompt": "a", "tokens": [1], "calls": 1}\n', "the output of `decode --json`"),
    ("def f(x):\n    return x\n", "text that is not JSON lines"),
])
@pytest.mark.parametrize("resume", [[], ["--resume"]])
def test_an_output_of_another_kind_is_named_and_kept(tmp_path, capsys, bundle, content, looks_like, resume):
    out = tmp_path / "other.jsonl"
    out.write_text(content)
    line = refused(capsys, _decode(bundle, "--prompts", bundle / "prompts.jsonl", "--output", out, *resume),
                   f"--output {out} is not a record file of `latticedraft decode --output`: it looks like {looks_like}",
                   "choose another --output", watch=[tmp_path])
    assert "--resume" not in line and "remove" not in line


def test_records_of_an_earlier_run_need_resume(tmp_path, capsys, bundle, full):
    out = tmp_path / "out.jsonl"
    out.write_bytes(full.read_bytes())
    refused(capsys, _decode(bundle, "--prompts", bundle / "prompts.jsonl", "--output", out),
            "already holds records of a `decode --output` run; pass --resume", watch=[tmp_path])


def test_a_resume_with_nothing_left_says_so(tmp_path, capsys, bundle, full):
    out = tmp_path / "out.jsonl"
    out.write_bytes(full.read_bytes())
    capsys.readouterr()
    assert main([str(a) for a in _decode(bundle, "--prompts", bundle / "prompts.jsonl", "--output", out,
                                         "--resume")]) == 0
    err = capsys.readouterr().err
    assert f"nothing left to decode: all 6 prompts already have complete records in {out}" in err
    assert "block efficiency" not in err and out.read_bytes() == full.read_bytes()


def _records_with(full, tmp_path, line3: bytes | None = None, tail: bytes = b"") -> str:
    lines = full.read_bytes().splitlines(keepends=True)
    if line3 is not None:
        lines[2] = line3 + b"\n"
    p = tmp_path / "records.jsonl"
    p.write_bytes(b"".join(lines) + tail)
    return p


def test_eval_records_names_what_it_found_instead(tmp_path, capsys, bundle, full):
    prompts = bundle / "prompts.jsonl"
    line = refused(capsys, ["eval", "--records", prompts], f"--records {prompts} is not a record file",
                   "it looks like a --prompts file", f"decode --prompts {prompts} --output OUT.jsonl",
                   watch=[bundle])
    assert "--resume" not in line and "torn" not in line
    line = refused(capsys, ["eval", "--records", TOKENIZER], "it looks like a tokenizer (tokenizer.json)",
                   "give the OUT.jsonl")
    assert "--resume" not in line and "line 1" not in line
    capsys.readouterr()
    assert main([str(a) for a in _decode(bundle, "--prompts", prompts, "--json")]) == 0
    json_out = tmp_path / "json.jsonl"
    json_out.write_text(capsys.readouterr().out)
    line = refused(capsys, ["eval", "--records", json_out], "it looks like the output of `decode --json`",
                   "--output OUT.jsonl")
    assert "--resume" not in line
    garbage = _records_with(full, tmp_path, b"garbage")
    line = refused(capsys, ["eval", "--records", garbage], f"--records {garbage} line 3 is not JSON",
                   "though the line(s) before it are records", "remove line 3")
    assert "--resume" not in line and "line 1" not in line
    torn = _records_with(full, tmp_path, tail=b'{"id": 7, "fingerp')
    refused(capsys, ["eval", "--records", torn], f"--records {torn} ends with a torn line (line 7",
            f"--output {torn}` command with --resume")
    assert "--records" in refused(capsys, ["eval", "--records", tmp_path / "missing.jsonl"], "does not exist")


def test_eval_records_out_replaces_only_its_own_files_with_force(tmp_path, capsys, full):
    out = tmp_path / "summary"
    capsys.readouterr()
    assert main(["eval", "--records", str(full), "--out", str(out)]) == 0
    refused(capsys, ["eval", "--records", full, "--out", out], f"--out {out} already holds a records summary "
            "(records.json + records.md); pass --force", watch=[tmp_path])
    (out / "NOTES.md").write_text("mine")
    assert main(["eval", "--records", str(full), "--out", str(out), "--force"]) == 0
    assert (out / "NOTES.md").read_text() == "mine" and json.loads((out / "records.json").read_text())["total"]
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    refused(capsys, ["eval", "--records", full, "--out", notes, "--force"], f"--out {notes} holds 1 entry (todo.txt)",
            "not a records summary", watch=[tmp_path])
    refused(capsys, ["eval", "--records", full, "--force"], "--force does not apply here")


def test_an_interrupt_names_the_records_kept_and_resume_completes(tmp_path, capsys, bundle, full, monkeypatch):
    from latticedraft.decoding.runs.session import Session

    real, calls = Session.decode, []

    def stop_at_third_batch(self, *a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(Session, "decode", stop_at_third_batch)
    out = tmp_path / "out.jsonl"
    argv = [str(a) for a in _decode(bundle, "--prompts", bundle / "prompts.jsonl", "--output", out)]
    capsys.readouterr()
    assert main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"error: interrupted; 2 of 6 prompts have complete records in {out}; rerun the same command with "
                   "--resume to decode the other 4"), err
    monkeypatch.setattr(Session, "decode", real)
    assert main(argv + ["--resume"]) == 0
    assert _comparable(out) == _comparable(full)


def test_the_draft_model_drafter_runs_a_data_set(tmp_path, capsys, bundle, full):
    out = tmp_path / "out.jsonl"
    assert main([str(a) for a in _decode(bundle, "--prompts", bundle / "prompts.jsonl", "--output", out, "--drafter",
                                         "model", "--draft-model", bundle / "base", "--batch-size", "2")]) == 0
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in recs] == list(range(1, 7))
    assert {r["settings"]["draft_model"] for r in recs} == {str((bundle / "base").resolve())}
    assert [r["tokens"] for r in recs] == [r["tokens"] for r in _comparable(full)]  # lossless: greedy's tokens


def test_bad_ids_are_shown_as_written(tmp_path, capsys, bundle, monkeypatch):
    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "a"}\n{"prompt": "b", "id": null}\n')
    refused(capsys, _decode(bundle, "--prompts", src, "--output", tmp_path / "o.jsonl"),
            f"--prompts {src} line 2: 'id' null is neither a string nor an integer", watch=[tmp_path])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'{"prompt": "a", "id": true}\n')))
    refused(capsys, _decode(bundle, "--prompts", "-", "--output", tmp_path / "o.jsonl"), "'id' true is neither",
            watch=[tmp_path])


def test_a_run_that_fails_before_its_first_record_leaves_no_output(tmp_path, capsys, bundle, monkeypatch):
    from latticedraft.decoding.runs.session import Session
    from latticedraft.errors import InputError

    def refuse(self, *a, **k):
        raise InputError("--max-new-tokens: this prompt does not fit (a refusal found while decoding)")

    monkeypatch.setattr(Session, "decode", refuse)
    refused(capsys, _decode(bundle, "--prompts", bundle / "prompts.jsonl", "--output", tmp_path / "sub" / "o.jsonl"),
            "--max-new-tokens", watch=[tmp_path])

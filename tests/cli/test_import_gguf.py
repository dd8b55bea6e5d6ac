"""``latticedraft import gguf FILE -o DIR [--force]``: one summary line; the one overwrite rule
(a model, another command's output, a foreign directory and FILE's own directory refused even with
--force; its own output refused without --force, replaced with it); a missing file, a file that is
not GGUF, an architecture transformers cannot read and a truncated file each give one ``error:``
line, exit 2 and leave nothing behind."""

import json

import pytest

from latticedraft.cli import main
from tests.gpu.models.tiny_gguf import write_tiny_gguf

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("src") / "tiny.gguf").path


def _refused(capsys, argv, needle):
    rc = main(argv)
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert rc == 2 and cap.out == "" and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], cap.err
    return lines[0]


def _tree(d):
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*"))


def test_transformers_bars_stay_off_stderr_unless_verbose(gguf_file, tmp_path, capsys):
    """Issue 59, class D: only latticedraft's messages reach stderr; --verbose shows the libraries' own."""
    assert main(["import", "gguf", str(gguf_file), "-o", str(tmp_path / "quiet")]) == 0
    assert capsys.readouterr().err == ""
    assert main(["import", "gguf", str(gguf_file), "-o", str(tmp_path / "loud"), "--verbose"]) == 0
    assert "Converting and de-quantizing GGUF tensors" in capsys.readouterr().err
    main(["import", "gguf", str(gguf_file), "-o", str(tmp_path / "again")])  # quiet again (the process's setting)
    assert capsys.readouterr().err == ""


def test_import_prints_one_summary_line_and_follows_the_overwrite_rule(gguf_file, tmp_path, capsys):
    out = tmp_path / "model"
    assert main(["import", "gguf", str(gguf_file), "-o", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    assert "\n" not in line and "39.1 k parameters (llama, float32)" in line and f"decode with --model {out}" in line
    _refused(capsys, ["import", "gguf", str(gguf_file), "-o", str(out)],
             "already holds a model imported from GGUF (gguf_import.json); pass --force")
    (out / "vocab.json").write_text("{}")  # written by an earlier import (owned), not by this one: removed
    (out / "NOTES.md").write_text("mine")  # not the command's: kept
    before = (out / "model.safetensors").stat().st_mtime_ns
    assert main(["import", "gguf", str(gguf_file), "-o", str(out), "--force"]) == 0
    assert not (out / "vocab.json").exists() and (out / "NOTES.md").read_text() == "mine"
    assert (out / "model.safetensors").stat().st_mtime_ns != before
    assert json.loads((out / "gguf_import.json").read_text())["source"]["file"] == "tiny.gguf"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging directory left


@pytest.mark.parametrize("names, held", [
    (("config.json", "model.safetensors"), "holds a model (config.json, model.safetensors)"),
    (("heads_config.json",), "holds multi-token heads (heads_config.json"),
    (("training.json", "config.json"), "holds a trained LM"),
    (("notes.txt",), "holds 1 entry (notes.txt)"),
])
def test_anything_else_is_refused_even_with_force(gguf_file, tmp_path, capsys, names, held):
    d = tmp_path / "d"
    d.mkdir()
    for n in names:
        (d / n).write_text("{}")
    for force in ([], ["--force"]):
        line = _refused(capsys, ["import", "gguf", str(gguf_file), "-o", str(d), *force], held)
        assert "choose a new or empty directory" in line
    assert sorted(p.name for p in d.iterdir()) == sorted(names)


def test_the_files_own_directory_is_refused(gguf_file, capsys):
    d = gguf_file.parent
    before = _tree(d)
    for force in ([], ["--force"]):
        _refused(capsys, ["import", "gguf", str(gguf_file), "-o", str(d), *force], "never writes into its input")
    assert _tree(d) == before


def test_bad_input_is_one_line_and_leaves_nothing_behind(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "notes.gguf").write_text("not a gguf at all\n")
    write_tiny_gguf(src / "odd.gguf", arch="nosucharch")
    (src / "cut.gguf").write_bytes(write_tiny_gguf(tmp_path / "whole.gguf").path.read_bytes()[:5000])
    (src / "v9.gguf").write_bytes(b"GGUF" + b"\xff" * 500)  # transformers names the path it read: a temporary link
    out = tmp_path / "out"
    for name, needle in (("missing.gguf", "does not exist; pass the path of a .gguf file"),
                         ("notes.gguf", "is not a GGUF file (it starts with b'not ', not b'GGUF')"),
                         ("odd.gguf", "architecture nosucharch is not supported"),
                         ("cut.gguf", "check the file: download or convert it again"),
                         ("v9.gguf", "(ValueError: v9.gguf is GGUF v4294967295; this reader handles v2 and v3.)")):
        line = _refused(capsys, ["import", "gguf", str(src / name), "-o", str(out)], needle)
        assert str(src / name) in line and "latticedraft-gguf-" not in line, line  # no path that is gone
    assert "upgrade transformers" in _refused(capsys, ["import", "gguf", str(src / "odd.gguf"), "-o", str(out)], "odd")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src", "whole.gguf"]


def test_a_missing_gguf_package_is_named_with_the_fix(gguf_file, tmp_path, capsys, monkeypatch):
    from latticedraft.gpu.models import gguf_import

    monkeypatch.setattr(gguf_import, "find_spec", lambda name: None if name == "gguf" else object())
    _refused(capsys, ["import", "gguf", str(gguf_file), "-o", str(tmp_path / "out")],
             "the gguf package is not installed, and transformers needs it to read GGUF files; run "
             "`.venv/bin/pip install gguf`")
    assert list(tmp_path.iterdir()) == []

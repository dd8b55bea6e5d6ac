"""`latticedraft train heads --self-distill` and `train draft-model`: thin commands; user errors print
one line, exit 2 and write nothing."""

import json
from pathlib import Path

import pytest

from latticedraft.cli import main
from latticedraft.lm.corpus import stdlib_split

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = ["--distill-prompts", "8", "--prompt-len", "8", "--gen-batch-size", "4", "--steps", "2", "--batch-size", "2",
         "--seq-len", "24"]


@pytest.fixture(scope="module")
def files():
    return [str(p) for p in stdlib_split("heldout")[:3]]


def _one_line_error(capsys, match):
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert cap.out == "" and len(err) == 1 and err[0].startswith("error: ") and match in err[0], err
    return err[0]


def test_help_offers_self_distill_and_the_draft_model_verb(capsys):
    with pytest.raises(SystemExit):
        main(["train", "heads", "--help"])
    out = capsys.readouterr().out
    assert "--self-distill" in out and "--distill-loss {kl,hard}" in out and "--distill-text" in out
    with pytest.raises(SystemExit):
        main(["train", "draft-model", "--help"])
    out = capsys.readouterr().out
    assert "--base" in out and "--n-embd" in out and "--self-distill" not in out


def test_heads_self_distill_then_draft_model_end_to_end(saved_bases, own_cache, tmp_path, files, capsys):
    base = str(saved_bases["llama"])
    rc = main(["train", "heads", "--base", base, "--corpus", *files, "--heads", "3", "--self-distill",
               "--out", str(tmp_path / "h"), *SMALL])
    out = capsys.readouterr().out
    assert rc == 0 and "trained 2 steps" in out and "a3=" in out
    info = json.loads((tmp_path / "h" / "training.json").read_text())
    assert info["self_distill"] == {"text": "continuations", "loss": "kl", "continuation": {
        "prompts": 8, "prompt_len": 8, "seq_len": 24, "sample_fraction": 0.5, "temperature": 1.0, "seed": 0,
        "batch_size": 4}}
    rc = main(["train", "draft-model", "--base", base, "--corpus", *files, "--out", str(tmp_path / "d"),
               "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--stop-after", "1", *SMALL])
    assert rc == 0 and "stopped at step 1; continue with --resume" in capsys.readouterr().out
    rc = main(["train", "draft-model", "--base", base, "--corpus", *files, "--out", str(tmp_path / "d"),
               "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--resume", *SMALL])
    out = capsys.readouterr().out
    assert rc == 0 and "kl=" in out and (tmp_path / "d" / "config.json").is_file()
    assert json.loads((tmp_path / "d" / "config.json").read_text())["hidden_size"] == 16


def test_heads_self_distill_with_the_plain_engine(saved_bases, own_cache, tmp_path, files, capsys):
    """--distill-engine plain: the base's forward over a padded batch makes the rows; its greedy rows
    are the loop's, and the engine is part of the recorded settings (the loop's is not)."""
    import numpy as np

    base = str(saved_bases["llama"])
    for engine in ("loop", "plain"):
        rc = main(["train", "heads", "--base", base, "--corpus", *files, "--heads", "3", "--self-distill",
                   "--distill-engine", engine, "--out", str(tmp_path / engine), *SMALL])
        assert rc == 0 and "trained 2 steps" in capsys.readouterr().out
    info = {e: json.loads((tmp_path / e / "training.json").read_text()) for e in ("loop", "plain")}
    assert info["plain"]["self_distill"]["engine"] == "plain" and "engine" not in info["loop"]["self_distill"]
    rows = {e: np.concatenate([np.load(f) for f in sorted(Path(info[e]["continuation_cache"]).glob("batch-*.npy"))])
            for e in ("loop", "plain")}
    assert rows["loop"].shape == rows["plain"].shape == (8, 24)
    assert np.array_equal(rows["loop"][:4], rows["plain"][:4])  # the greedy half, token for token


@pytest.mark.parametrize("args, match", [
    (["--distill-loss", "hard"], "--distill-loss does not apply here: it refines --self-distill"),
    (["--prompt-len", "16"], "--prompt-len does not apply here"),
    (["--self-distill", "--prompt-len", "24", "--seq-len", "24"], "--seq-len 24 must exceed --prompt-len 24"),
    (["--self-distill", "--sample-fraction", "2"], "--sample-fraction 2.0 is not a fraction"),
    (["--self-distill", "--distill-text", "corpus", "--distill-prompts", "9"],
     "--distill-prompts does not apply here: --distill-text corpus makes no continuations"),
    (["--early-exit", "--self-distill"], "--self-distill does not apply here"),
    (["--distill-chat", "0.5"], "--distill-chat does not apply here: it refines --self-distill"),
    (["--self-distill", "--distill-text", "corpus", "--distill-chat", "0.5"], "--distill-chat does not apply here"),
    (["--self-distill", "--distill-chat", "1.5"], "--distill-chat 1.5 is not a fraction in"),
    (["--self-distill", "--distill-chat", "0.5", "--seq-len", "32", "--prompt-len", "8"], "has no chat template"),
    (["--self-distill", "--question-tokens", "0"], "--question-tokens 0 must be at least 1"),
    (["--distill-engine", "plain"], "--distill-engine does not apply here: it refines --self-distill"),
    (["--self-distill", "--distill-text", "corpus", "--distill-engine", "plain"],
     "--distill-engine does not apply here: --distill-text corpus makes no continuations"),
])
def test_heads_bad_distill_options_are_one_line(saved_bases, tmp_path, files, capsys, args, match):
    argv = ["train", "heads", "--base", str(saved_bases["llama"]), "--corpus", files[0], "--out", str(tmp_path / "h")]
    if "--early-exit" not in args:
        argv += ["--heads", "3"]
    assert main(argv + args) == 2
    _one_line_error(capsys, match)
    assert not (tmp_path / "h" / "heads.safetensors").exists()


@pytest.mark.parametrize("args, match", [
    (["--n-embd", "30", "--n-head", "4"], "--n-embd 30 is not divisible by --n-head 4"),
    (["--n-layer", "0"], "--n-layer 0 must be at least 1"),
    (["--base", "{tmp}/missing"], "does not exist"),
    (["--resume"], "--resume given but"),
    (["--assistant-tokens", "0"], "--assistant-tokens 0 must be at least 1"),
    (["--init", "zeros"], None),
])
def test_draft_model_bad_input_is_one_line(saved_bases, tmp_path, files, capsys, args, match):
    argv = ["train", "draft-model", "--corpus", files[0], "--out", str(tmp_path / "d")]
    if "--base" not in args:
        argv += ["--base", str(saved_bases["llama"])]
    if match is None:  # a choice argparse refuses
        with pytest.raises(SystemExit) as e:
            main(argv + args)
        assert e.value.code == 2 and "invalid choice: 'zeros'" in capsys.readouterr().err
        return
    assert main(argv + [a.replace("{tmp}", str(tmp_path)) for a in args]) == 2
    _one_line_error(capsys, match)
    assert not (tmp_path / "d" / "config.json").exists()


def test_heads_self_distill_resume_redoes_no_continuations_or_tokenizing(saved_bases, own_cache, tmp_path, files,
                                                                          capsys, monkeypatch):
    """A resumed run reads the first run's continuations and token stream from the cache: it decodes
    nothing and tokenizes nothing (issue 37: the work is counted, never timed)."""
    import latticedraft.gpu.train.data as data
    from latticedraft.decoding.runs.continuations import LoopDecoder

    calls = {"decode": 0, "encode": 0}

    def counting(name, real):
        def wrapped(*a, **k):
            calls[name] += 1
            return real(*a, **k)
        return wrapped

    monkeypatch.setattr(LoopDecoder, "__call__", counting("decode", LoopDecoder.__call__))
    monkeypatch.setattr(data, "_encode", counting("encode", data._encode))
    argv = ["train", "heads", "--base", str(saved_bases["llama"]), "--corpus", *files, "--heads", "3", "--self-distill",
            "--out", str(tmp_path / "h"), *SMALL]
    assert main(argv + ["--stop-after", "1"]) == 0
    assert "stopped at step 1" in capsys.readouterr().out
    assert calls == {"decode": 2, "encode": 1}  # 8 prompts in batches of 4
    calls.update(decode=0, encode=0)
    assert main(argv + ["--resume"]) == 0
    assert "trained 2 steps" in capsys.readouterr().out
    assert calls == {"decode": 0, "encode": 0}
    info = json.loads((tmp_path / "h" / "training.json").read_text())
    assert info["resumed_from"] == 1

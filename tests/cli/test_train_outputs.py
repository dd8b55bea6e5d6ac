"""`train lm | heads | adapter` and `train heads --early-exit` (issue 27): one overwrite rule
(outputs.py), size bounds from the base and from memory, checks before any model loads, and an
interrupt that names the checkpoint it kept. Every refusal: exit 2, one `error:` line naming the
option or directory, nothing on stdout, no traceback, the directories byte for byte as before."""

import json
import shutil

import pytest

from latticedraft.cli import main
from latticedraft.lm.corpus import stdlib_split
from latticedraft.paths import data_dir
from tests.contract import refused

TOK = data_dir() / "tokenizer"
FAST = ["--steps", "2", "--batch-size", "2", "--seq-len", "16", "--checkpoint-every", "1"]
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def corpus():
    return [str(p) for p in stdlib_split("heldout")[:2]]


@pytest.fixture(scope="module")
def base(tmp_path_factory, corpus):
    """A 2-layer GPT-2 of context 64 trained for one step (`train lm` output: training.json + config.json)."""
    out = tmp_path_factory.mktemp("train") / "base"
    assert main(["train", "lm", "--tokenizer", str(TOK), "--corpus", *corpus, "--out", str(out), "--n-embd", "16",
                 "--n-layer", "2", "--n-head", "2", "--n-positions", "64", "--steps", "1", "--batch-size", "2",
                 "--seq-len", "16"]) == 0
    return out


def _heads(base, corpus, out, *extra):
    return ["train", "heads", "--base", base, "--corpus", *corpus, "--heads", "3", "--out", out, *FAST, *extra]


def _adapter(base, corpus, out, *extra):
    return ["train", "adapter", "--base", base, "--corpus", *corpus, "--exit-layer", "1", "--out", out, *FAST, *extra]


def _exits(base, corpus, out, *extra):
    return ["train", "heads", "--early-exit", "--base", base, "--corpus", *corpus, "--out", out, *FAST, *extra]


def _lm(base, corpus, out, *extra):
    return ["train", "lm", "--tokenizer", TOK, "--corpus", *corpus, "--out", out, "--n-embd", "16", "--n-layer", "1",
            "--n-head", "2", "--n-positions", "64", *FAST, *extra]


def _fake_output(d, *names):
    d.mkdir()
    for n in names:
        (d / n).write_text("{}")
    return d


@pytest.mark.parametrize("command, markers, what", [
    (_heads, ("heads_config.json", "heads.safetensors"), "multi-token heads (heads_config.json)"),
    (_adapter, ("adapter.json", "adapter.safetensors"), "a Kangaroo adapter (adapter.json)"),
    (_exits, ("exit_heads.json", "exit_heads.safetensors"), "early-exit heads (exit_heads.json)"),
    (_lm, ("training.json", "config.json", "model.safetensors"), "a trained LM (training.json + config.json)"),
])
def test_an_earlier_output_needs_force(tmp_path, capsys, base, corpus, command, markers, what):
    out = _fake_output(tmp_path / "out", *markers)
    refused(capsys, command(base, corpus, out), f"--out {out} already holds {what}; pass --force", watch=[tmp_path])


@pytest.mark.parametrize("command", [_heads, _adapter, _exits, _lm])
def test_a_checkpoint_is_never_discarded_without_force(tmp_path, capsys, base, corpus, command):
    out = _fake_output(tmp_path / "out", "checkpoint.pt")
    refused(capsys, command(base, corpus, out), "holds checkpoint.pt, an unfinished", "--resume", "--force",
            watch=[tmp_path])


@pytest.mark.parametrize("command", [_heads, _adapter, _exits, _lm])
def test_force_never_replaces_another_commands_output_or_a_model(tmp_path, capsys, base, corpus, command):
    model = tmp_path / "model"
    shutil.copytree(base, model)  # a model directory: config.json, model.safetensors, tokenizer.json
    (model / "training.json").unlink()
    refused(capsys, command(base, corpus, model, "--force"), f"--out {model} holds a model (config.json, "
            "model.safetensors)", "choose a new or empty directory", watch=[tmp_path, base])
    other = _fake_output(tmp_path / "other", "adapter.json" if command is not _adapter else "heads_config.json",
                         "weights.safetensors")
    refused(capsys, command(base, corpus, other, "--force"), "--force replaces only that command's own output",
            watch=[tmp_path, base])


def test_force_and_resume_contradict_and_resume_needs_a_checkpoint(tmp_path, capsys, base, corpus):
    out = _fake_output(tmp_path / "h", "heads_config.json")
    refused(capsys, _heads(base, corpus, out, "--force", "--resume"), "--force and --resume contradict",
            watch=[tmp_path])
    refused(capsys, _heads(base, corpus, out, "--resume"), "holds finished multi-token heads", "nothing to resume",
            watch=[tmp_path])
    refused(capsys, _heads(base, corpus, tmp_path / "new", "--resume"), "--resume given but", watch=[tmp_path])


def test_force_replaces_only_what_train_heads_wrote(tmp_path, capsys, base, corpus):
    """Over an earlier output that an --unfreeze run would have left base/ in, a forced run that
    stops early leaves that output untouched; the next forced run discards its checkpoint (starts
    at step 0), replaces the heads, removes the stale base/ and keeps the user's README."""
    out = tmp_path / "h"
    run = lambda *extra: main([str(a) for a in _heads(base, corpus, out, *extra)])  # noqa: E731
    assert run() == 0
    (out / "base").mkdir()
    (out / "base" / "config.json").write_text("{}")
    (out / "README").write_text("mine")
    before = {n: (out / n).read_bytes() for n in ("heads.safetensors", "heads_config.json", "training.json")}
    assert run("--force", "--stop-after", "1") == 0 and (out / "checkpoint.pt").is_file()
    assert {n: (out / n).read_bytes() for n in before} == before  # unfinished: the old output stays whole
    capsys.readouterr()
    assert run("--force") == 0
    assert "trained 2 steps" in capsys.readouterr().out
    names = sorted(p.name for p in out.iterdir())
    assert names == ["README", "heads.safetensors", "heads_config.json", "training.json"], names
    assert (out / "README").read_text() == "mine"
    assert json.loads((out / "training.json").read_text())["resumed_from"] == 0  # the checkpoint was discarded
    assert json.loads((out / "heads_config.json").read_text())["base"] == "../../" + base.parent.name + "/base"


@pytest.mark.parametrize("args, needles", [
    (["--seq-len", "65"], ("--seq-len 65 exceeds the base model's context of 64 tokens", "config.json")),
    (["--heads", "16", "--seq-len", "16"], ("--heads 16 must be smaller than --seq-len 16",)),
    (["--warmup-frac", "2"], ("--warmup-frac 2.0 must lie in [0, 1]",)),
    (["--lr", "nan"], ("--lr nan must be a finite number > 0",)),
    (["--seed", "-1"], ("--seed -1 is outside 0..9223372036854775807",)),
    (["--seed", str(2**64)], ("--seed 18446744073709551616 is outside 0..",)),
    (["--lambdas", "1", "1"], ("--lambdas needs 3 finite non-negative weights",)),
])
def test_heads_options_are_bounded_before_the_base_loads(tmp_path, capsys, base, corpus, args, needles):
    refused(capsys, _heads(base, corpus, tmp_path / "h", *args), *needles, watch=[tmp_path, base])


def test_adapter_exit_layer_is_bounded_by_the_base_config(tmp_path, capsys, base, corpus, monkeypatch):
    import latticedraft.gpu.models.hf as hf

    monkeypatch.setattr(hf, "load_causal_lm", lambda *a, **k: pytest.fail("the base was loaded before the check"))
    for layer in ("2", "99", "0"):
        refused(capsys, ["train", "adapter", "--base", base, "--corpus", *corpus, "--exit-layer", layer,
                         "--out", tmp_path / "a", *FAST],
                f"--exit-layer {layer} must lie in [1, 1] for a base of 2 layers", watch=[tmp_path, base])


@pytest.mark.parametrize("args, flag", [
    (["--n-positions", str(10**12), "--seq-len", "16"], "--n-positions"),
    (["--n-embd", str(2**40), "--n-head", "1"], "--n-embd"),
])
def test_lm_sizes_are_bounded_by_memory(tmp_path, capsys, corpus, args, flag):
    argv = ["train", "lm", "--tokenizer", TOK, "--corpus", *corpus, "--out", tmp_path / "lm", "--steps", "1", *args]
    line = refused(capsys, argv, f"{flag} ", "would need about", "is available on this machine",
                   f"the largest {flag} that fits is", watch=[tmp_path])
    assert int(line.split(f"the largest {flag} that fits is ")[1].split()[0]) >= 1


def test_heads_batch_is_bounded_by_the_memory_there_is(tmp_path, capsys, base, corpus, monkeypatch):
    """Under a 64 MiB budget (a memory cap), a batch whose logits alone need 512 MiB is refused with the
    largest --batch-size that fits; the bisection's answer fits and one more does not."""
    import latticedraft.memory as mem
    from latticedraft.gpu.train import footprint

    monkeypatch.setattr(mem, "available_bytes", lambda device=None: 64 * 2**20)
    line = refused(capsys, _heads(base, corpus, tmp_path / "h", "--batch-size", "256"), "--batch-size 256",
                   "64 MiB is available", watch=[tmp_path])
    best = int(line.split("the largest --batch-size that fits is ")[1].split()[0])
    shape = footprint.read_base_shape(base)
    assert footprint.heads_bytes(shape, 3, "stern", 64, best, 16, False) <= 64 * 2**20
    assert footprint.heads_bytes(shape, 3, "stern", 64, best + 1, 16, False) > 64 * 2**20


def test_an_interrupt_names_the_checkpoint_and_resume_finishes(tmp_path, capsys, base, corpus, monkeypatch):
    import latticedraft.gpu.train.heads as th

    real, calls = th.head_losses, []

    def stop_at_third(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(th, "head_losses", stop_at_third)
    out = tmp_path / "h"
    argv = _heads(base, corpus, out, "--steps", "4", "--checkpoint-every", "2")
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"error: interrupted; the checkpoint of step 2 of 4 is kept in {out / 'checkpoint.pt'}; rerun "
                   "the same command with --resume to continue"), err
    monkeypatch.setattr(th, "head_losses", real)
    assert main([str(a) for a in argv] + ["--resume"]) == 0
    assert json.loads((out / "training.json").read_text())["resumed_from"] == 2


def test_an_interrupt_before_the_first_checkpoint_says_nothing_was_kept(tmp_path, capsys, base, corpus, monkeypatch):
    import latticedraft.gpu.train.heads as th

    monkeypatch.setattr(th, "head_losses", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main([str(a) for a in _heads(base, corpus, tmp_path / "h")]) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: interrupted; no checkpoint had been written yet") and "rerun" in err
    assert not (tmp_path / "h").exists()  # the directory the run made is gone with it


def test_an_interrupt_while_saving_keeps_the_last_checkpoint_and_resume_writes(tmp_path, capsys, base, corpus,
                                                                                monkeypatch):
    from latticedraft.gpu.models.blockwise import BlockwiseModel

    real = BlockwiseModel.save_pretrained
    monkeypatch.setattr(BlockwiseModel, "save_pretrained", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    out = tmp_path / "h"
    argv = [str(a) for a in _heads(base, corpus, out)]
    assert main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"error: interrupted; training finished and its checkpoint is kept in {out / 'checkpoint.pt'}; "
                   "rerun the same command with --resume to write the output"), err
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt"]  # no half-written output
    monkeypatch.setattr(BlockwiseModel, "save_pretrained", real)
    assert main(argv + ["--resume"]) == 0
    assert json.loads((out / "training.json").read_text())["resumed_from"] == 2  # no step trained again
    assert sorted(p.name for p in out.iterdir()) == ["heads.safetensors", "heads_config.json", "training.json"]


@pytest.mark.parametrize("args, needle", [
    (["--lr", "0.001"], "--lr 0.002 (checkpoint) vs 0.001 (now)"),
    (["--n-embd", "32"], "--n-embd 16 (checkpoint) vs 32 (now)"),
])
def test_resume_with_other_settings_names_the_options_and_both_values(tmp_path, capsys, base, corpus, args, needle):
    out = tmp_path / "lm"
    assert main([str(a) for a in _lm(base, corpus, out, "--stop-after", "1")]) == 0
    line = refused(capsys, _lm(base, corpus, out, "--resume", *args), "was made with other settings: " + needle,
                   "rerun with the checkpoint's settings", watch=[tmp_path])
    assert "optim" not in line and "arch" not in line


def test_draft_model_ffn_dim_is_bounded_by_memory_naming_it(tmp_path, capsys, base, corpus):
    line = refused(capsys, ["train", "draft-model", "--base", base, "--corpus", *corpus, "--out", tmp_path / "d",
                            "--distill-text", "corpus", "--ffn-dim", str(10**9), *FAST], "--ffn-dim 1000000000",
                   "the largest --ffn-dim that fits is", watch=[tmp_path])
    assert int(line.split("the largest --ffn-dim that fits is ")[1].split()[0]) >= 1

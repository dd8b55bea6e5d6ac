"""The one overwrite rule (``outputs.claim_dir``, issues 37 and 38) for every command that writes an
output directory: each refuses, even with --force, a model directory, another command's output, a
non-empty foreign directory and its own input; refuses its own earlier output without --force and
replaces it with --force, keeping what the user added. Every refusal: exit 2, one ``error:`` line,
nothing on stdout, the directories byte for byte as before (``tests/contract.py``). The earlier
outputs are their command's markers only; each forced run writes a real output that its command
then owns (``outputs.is_own``)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import pytest
import torch
from safetensors.torch import save_file

from latticedraft import outputs as o
from latticedraft.cli import build_parser, main
from latticedraft.cli.parser import commands
from latticedraft.lm.corpus import stdlib_split
from latticedraft.paths import data_dir
from tests.contract import refused

TOK = data_dir() / "tokenizer"
FAST = ["--steps", "1", "--batch-size", "2", "--seq-len", "16"]
# report directories (demo.json; results.json, results.md, figures): a real forced run decodes, so their
# refusals are run by tests/cli/test_output_options.py only, as every declared output's are
REPORTS = {("demo",), ("eval",)}
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@dataclass(frozen=True)
class Cmd:
    """A command that writes an output directory: its output kind, its argv (given the fixtures
    ``w`` and the output), its inputs (label, path) that must never be its output."""

    name: tuple
    kind: o.OutputKind
    argv: Callable
    inputs: Callable = lambda w: []

    def __str__(self):
        return " ".join(self.name)


def _train(verb, *extra):
    return lambda w, out: ["train", verb, "--base", w.base, "--corpus", *w.corpus, "-o", out, *FAST, *extra]


COMMANDS = [
    Cmd(("train", "lm"), o.TRAINED_LM,
        lambda w, out: ["train", "lm", "--tokenizer", w.tok, "--corpus", *w.corpus, "-o", out, "--n-embd", "16",
                        "--n-layer", "1", "--n-head", "2", "--n-positions", "64", *FAST],
        lambda w: [("--tokenizer", w.tok)]),
    Cmd(("train", "heads"), o.HEADS, _train("heads", "--heads", "2"), lambda w: [("--base", w.base)]),
    Cmd(("train", "heads", "--early-exit"), o.EXIT_HEADS, _train("heads", "--early-exit"),
        lambda w: [("--base", w.base)]),
    Cmd(("train", "adapter"), o.ADAPTER, _train("adapter", "--exit-layer", "1"), lambda w: [("--base", w.base)]),
    Cmd(("train", "draft-model"), o.DRAFT_MODEL,
        _train("draft-model", "--n-embd", "16", "--n-head", "2", "--distill-text", "corpus"),
        lambda w: [("--base", w.base)]),
    Cmd(("lm", "build"), o.LM_BUILD,
        lambda w, out: ["lm", "build", "--corpus", w.text, "--train-tokenizer", "300", "--order", "2", "--memory",
                        "64M", "-o", out],
        lambda w: [("--corpus", w.text)]),
    Cmd(("import", "medusa"), o.MEDUSA_IMPORT,
        lambda w, out: ["import", "medusa", w.medusa, "--base", w.base, "-o", out],
        lambda w: [("SRC", w.medusa), ("--base", w.base)]),
    Cmd(("export", "medusa"), o.MEDUSA_EXPORT, lambda w, out: ["export", "medusa", "--model", w.heads, "-o", out],
        lambda w: [("--model", w.heads)]),
    Cmd(("export", "custom-generate"), o.CUSTOM_GENERATE, lambda w, out: ["export", "custom-generate", "-o", out]),
    Cmd(("import", "gguf"), o.GGUF_IMPORT, lambda w, out: ["import", "gguf", w.gguf, "-o", out],
        lambda w: [("FILE", w.gguf.parent)]),
]


def fake_output(d, kind: o.OutputKind):
    """Directory ``d`` holding ``kind``'s markers only (a tagged first marker with its "kind")."""
    d.mkdir()
    for i, m in enumerate(kind.markers):
        (d / m).write_text(json.dumps({"kind": kind.tag[0]}) if i == 0 and kind.tag else "{}")
    return d


def _medusa_checkpoint(d, base):
    """2 Medusa heads of one block in vLLM's layout for ``base`` (own LM heads)."""
    cfg = json.loads((base / "config.json").read_text())
    H, V = cfg.get("hidden_size", cfg.get("n_embd")), cfg["vocab_size"]  # GPT-2 says n_embd
    g = torch.Generator().manual_seed(0)
    t = {f"blocks.{i}.layers.0.weight": torch.randn(H, H, generator=g) * 0.05 for i in range(2)}
    t.update({f"lm_heads.{i}.weight": torch.randn(V, H, generator=g) for i in range(2)})
    d.mkdir()
    save_file(t, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"model_type": "medusa", "hidden_size": H, "vocab_size": V,
                                               "num_heads": 2, "num_hidden_layers": 1}))
    return d


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """The inputs every command reads, made once: a tiny `train lm` output (the base), a plain model
    directory, a tokenizer directory, a text directory, a Medusa checkpoint and its import, a GGUF file."""
    from tests.gpu.models.tiny_gguf import write_tiny_gguf
    from tests.lm.conftest import synthetic_text

    root = tmp_path_factory.mktemp("rule")
    corpus = [str(p) for p in stdlib_split("heldout")[:2]]
    tok = root / "tok"
    shutil.copytree(TOK, tok)
    base = root / "base"
    assert main(["train", "lm", "--tokenizer", str(tok), "--corpus", *corpus, "-o", str(base), "--n-embd", "16",
                 "--n-layer", "2", "--n-head", "2", "--n-positions", "64", *FAST]) == 0
    model = root / "model"  # an HF model directory no latticedraft command wrote
    shutil.copytree(base, model, ignore=shutil.ignore_patterns("training.json"))
    trained = root / "trained"  # a `train lm` output that is no command's input here
    shutil.copytree(base, trained)
    legacy = root / "legacy"  # a `train lm` output from before it recorded its kind, as the bundled data/base
    shutil.copytree(base, legacy)
    info = json.loads((legacy / "training.json").read_text())
    del info["kind"]
    (legacy / "training.json").write_text(json.dumps(info))
    (root / "text").mkdir()
    (root / "text" / "train.txt").write_text(synthetic_text(100, seed=1))
    medusa = _medusa_checkpoint(root / "medusa", base)
    heads = root / "heads"
    assert main(["import", "medusa", str(medusa), "--base", str(base), "-o", str(heads)]) == 0
    foreign = root / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    (foreign / "config.json").write_text("{}")
    (root / "gguf").mkdir()
    gguf = write_tiny_gguf(root / "gguf" / "tiny.gguf").path
    return SimpleNamespace(root=root, corpus=corpus, tok=tok, base=base, model=model, trained=trained, legacy=legacy,
                           text=root / "text", medusa=medusa, heads=heads, foreign=foreign, gguf=gguf)


def test_every_command_that_writes_a_directory_is_here():
    found = {name for name, p in commands(build_parser()) for x in p._actions
             if x.dest == "out" and "directory" in (x.help or "")}
    assert found == {c.name[:2] for c in COMMANDS} | REPORTS
    for name, p in commands(build_parser()):
        if name in {c.name[:2] for c in COMMANDS}:
            assert "--force" in p._option_string_actions, name


@pytest.mark.parametrize("cmd", COMMANDS, ids=str)
@pytest.mark.parametrize("force", [False, True])
def test_a_model_another_commands_output_and_a_foreign_directory_are_refused(w, tmp_path, capsys, cmd, force):
    draft = fake_output(tmp_path / "draft", o.DRAFT_MODEL)  # train lm's files with train draft-model's kind
    inputs = [p for _, p in cmd.inputs(w)]
    for d in [w.model, w.foreign, w.trained, w.legacy, w.heads, draft]:
        if o.is_own(d, cmd.kind) or d in inputs:
            continue
        line = refused(capsys, cmd.argv(w, d) + ["--force"] * force, f"--out {d} holds",
                       f"not {cmd.kind.what} from `{cmd.kind.command}`", "choose a new or empty directory",
                       watch=[tmp_path, w.root])
        assert "pass --force" not in line


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if c.name != ("export", "custom-generate")], ids=str)
def test_its_own_input_is_never_its_output(w, tmp_path, capsys, cmd):
    for label, path in cmd.inputs(w):
        refused(capsys, cmd.argv(w, path) + ["--force"], f"--out {path}", f"the input {label}",
                "never writes into its input", watch=[tmp_path, w.root])


@pytest.mark.parametrize("cmd", COMMANDS, ids=str)
def test_its_own_earlier_output_needs_force_which_replaces_only_that(w, tmp_path, capsys, cmd):
    out = fake_output(tmp_path / "out", cmd.kind)
    (out / "NOTES.md").write_text("mine")
    refused(capsys, cmd.argv(w, out), f"--out {out} already holds {cmd.kind.what} ({cmd.kind.marker_text}); "
            "pass --force", watch=[tmp_path, w.root])
    capsys.readouterr()
    assert main([str(a) for a in cmd.argv(w, out) + ["--force"]]) == 0, capsys.readouterr().err
    assert o.is_own(out, cmd.kind) and (out / "NOTES.md").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging directory left

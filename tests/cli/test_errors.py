"""Every bad input gets one clear line (issue 17): one test per class of bad input.

Each case runs ``latticedraft`` in-process and checks the contract: exit status 2, the last
stderr line starts ``error:`` and names the option or file, no stdout when no work could
start, and nothing left behind in the output paths.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from latticedraft.cli import main
from latticedraft.gpu.models.blockwise import BlockwiseModel
from latticedraft.paths import data_dir, default_lm_dir

TOKENIZER = data_dir() / "tokenizer" / "tokenizer.json"
pytestmark = [pytest.mark.skipif(not TOKENIZER.is_file(), reason="bundled tokenizer missing (run scripts/setup.sh)"),
              pytest.mark.usefixtures("one_torch_thread")]
needs_lm = pytest.mark.skipif(not default_lm_dir().exists(), reason="bundled 4-gram missing (run scripts/setup.sh)")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A tiny 4-head model saved like the bundled one (heads + base with its tokenizer), and prompts."""
    d = tmp_path_factory.mktemp("bundle")
    torch.manual_seed(0)
    base = GPT2LMHeadModel(GPT2Config(vocab_size=8192, n_positions=128, n_embd=16, n_layer=1, n_head=2)).eval()
    base.save_pretrained(d / "base")
    shutil.copy(TOKENIZER, d / "base" / "tokenizer.json")
    BlockwiseModel.from_base(base, 4, seed=0).save_pretrained(d / "heads", base_ref="../base")
    (d / "prompts.jsonl").write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ["def f(x):", "import os\n",
                                                                                         "class A:"]))
    return d


def _run(capsys, *args):
    """``(status, stdout, last stderr line)`` of ``latticedraft ARGS``."""
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    return rc, cap.out, lines[-1] if lines else ""


def _refused(capsys, *args, needle: str):
    rc, out, last = _run(capsys, *args)
    assert rc == 2 and last.startswith("error: ") and needle in last, last
    assert out == "" and "Traceback" not in last
    return last


def _copy_tree(src, dst):
    shutil.copytree(src, dst)
    return dst


# -- tracebacks where a one-line error belongs ------------------------------------------------------


@pytest.mark.parametrize("where", ["base", "heads"])
def test_corrupt_safetensors_in_model_or_heads(bundle, tmp_path, capsys, where):
    d = _copy_tree(bundle, tmp_path / "b")
    f = d / where / ("model.safetensors" if where == "base" else "heads.safetensors")
    f.write_bytes(f.read_bytes()[:50])
    last = _refused(capsys, "decode", "--model", d / "heads", "--prompt", "x", needle=str(f if where == "heads" else d))
    assert "corrupt" in last or "cannot be loaded" in last


def test_corrupt_rescorer_weights(bundle, tmp_path, capsys):
    d = _copy_tree(bundle / "base", tmp_path / "resc")
    (d / "model.safetensors").write_bytes(b"\x00" * 12)
    _refused(capsys, "decode", "--model", bundle / "heads", "--prompt", "x", "--drafter", "neural",
             "--rescorer", d, needle=str(d))


def test_config_whose_sizes_do_not_match_the_weights(bundle, tmp_path, capsys):
    d = _copy_tree(bundle / "base", tmp_path / "base")
    cfg = json.loads((d / "config.json").read_text())
    cfg["n_embd"] = 32
    (d / "config.json").write_text(json.dumps(cfg))
    last = _refused(capsys, "decode", "--model", d, "--prompt", "x", "--method", "greedy", needle=str(d))
    assert len(last) < 400


@needs_lm
def test_corrupt_lm_npz_for_decode_and_score(tmp_path, capsys):
    lm = tmp_path / "lm"
    lm.mkdir()
    for f in ("manifest.json", "tokenizer.json"):
        shutil.copy(default_lm_dir() / f, lm / f)
    (lm / "lm.npz").write_bytes(b"PK\x03\x04 truncated")
    _refused(capsys, "lm", "score", "--lm", lm, "--ids", "1", "2", needle="lm.npz")
    (lm / "lm.npz").write_bytes(np.random.default_rng(0).bytes(300))
    last = _refused(capsys, "lm", "score", "--lm", lm, "--ids", "1", needle="lm.npz")
    assert "allow_pickle" not in last


def test_non_utf8_prompts_and_prompt(bundle, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"prompt": "caf\xe9"}\n')
    _refused(capsys, "decode", "--model", bundle / "heads", "--prompts", bad, needle=str(bad))
    bad.write_bytes(np.random.default_rng(1).bytes(200))
    _refused(capsys, "decode", "--model", bundle / "heads", "--prompts", bad, needle=str(bad))
    _refused(capsys, "decode", "--model", bundle / "heads", "--prompt", "caf\udce9", needle="--prompt")


def test_k_larger_than_the_vocabulary(bundle, capsys):
    _refused(capsys, "decode", "--model", bundle / "heads", "--prompt", "x", "--k", 10**9, needle="--k 1000000000")


@pytest.mark.parametrize("device,needle", [("bogus", "--device 'bogus'"), ("cuda:99", "--device cuda:99"),
                                           ("tpu", "--device 'tpu'")])
def test_devices_that_do_not_exist(bundle, capsys, device, needle):
    _refused(capsys, "decode", "--model", bundle / "heads", "--prompt", "x", "--device", device, needle=needle)


@pytest.mark.parametrize("cmd", [["eval"], ["tune"], ["tune", "--method", "lookahead"], ["demo"],
                                 ["lm", "build", "--corpus", "stdlib", "--train-tokenizer", "300"]])
def test_out_under_a_file_is_refused_before_any_work(tmp_path, capsys, cmd):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    # a model that does not exist: the --out check must come first
    extra = [] if cmd[0] == "lm" else ["--model", tmp_path / "no-model"]
    _refused(capsys, *cmd, *extra, "--out", blocker / "sub" / "out", needle="--out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


# -- accepted silently --------------------------------------------------------------------------------


@pytest.mark.parametrize("args,needle", [
    (["--drafter", "top1", "--lm", "/nonexistent", "--lm-drafts", "0"], "--lm"),
    (["--drafter", "parallel-base", "--rescorer", "/nonexistent"], "--rescorer"),
    (["--temperature", "0.3"], "--temperature"),
    (["--top-k", "5"], "--top-k"),
    (["--seed", "3"], "--seed"),
    (["--batch-size", "4"], "--batch-size"),
    (["--method", "greedy", "--k", "4"], "--k"),
    (["--method", "dynamo", "--drafter", "ngram"], "--drafter"),
    (["--eps", "0.1"], "--eps"),
])
def test_options_that_do_not_apply_are_refused_before_loading(tmp_path, capsys, args, needle):
    last = _refused(capsys, "decode", "--model", tmp_path / "no-model", "--prompt", "x", *args, needle=needle)
    assert "does not apply" in last or "applies to" in last


def test_slots_beyond_the_heads(bundle, capsys):
    _refused(capsys, "decode", "--model", bundle / "heads", "--prompt", "x", "--slots", 99, needle="--slots 99")


def test_tokenizer_with_other_ids_is_refused(bundle, tmp_path, capsys):
    from tokenizers import Tokenizer

    tj = json.loads(TOKENIZER.read_text())
    vocab = tj["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size, two ids swapped
    other = tmp_path / "tokenizer.json"
    other.write_text(json.dumps(tj))
    Tokenizer.from_file(str(other))
    last = _refused(capsys, "decode", "--model", bundle / "heads", "--prompt", "x", "--tokenizer", other,
                    needle=str(other))
    assert "trained with" in last and str(bundle / "base" / "tokenizer.json") in last


@pytest.mark.parametrize("args,needle", [
    (["lm", "score", "--ids", "1", "--unk-cost", "nan"], "--unk-cost nan"),
    (["lm", "score", "--ids", "1", "--unk-cost", "-5"], "--unk-cost -5"),
    (["lm", "build", "--corpus", "stdlib", "--train-tokenizer", "300", "--out", "{tmp}/b", "--unk-cost", "-1"],
     "--unk-cost -1"),
    (["lm", "build", "--corpus", "stdlib", "--train-tokenizer", "300", "--out", "{tmp}/b", "--memory", "bogus"],
     "--memory 'bogus'"),
    (["lm", "build", "--corpus", "stdlib", "--train-tokenizer", "300", "--out", "{tmp}/b", "--memory", "150%"],
     "--memory 150%"),
])
def test_numbers_validated_at_the_edge(tmp_path, capsys, args, needle):
    _refused(capsys, *[a.format(tmp=tmp_path) for a in args], needle=needle)
    assert not (tmp_path / "b").exists() and not list(tmp_path.iterdir())


@needs_lm
def test_rescore_applies_the_checks_of_lm_score(tmp_path, capsys):
    from latticedraft.lattice.sausage import Sausage

    good = Sausage.from_ragged([[5, 9], [7]], [[-0.5, -1.0], [-0.1]])
    cases = {
        "vocab": (dict(tokens=np.array([[5, 10**6], [7, -1]]), logp=good.logp), "outside the LM's vocabulary"),
        "positive": (dict(tokens=good.tokens, logp=np.abs(good.logp)), "positive"),
        "float": (dict(tokens=good.tokens.astype(np.float64) + 0.5, logp=good.logp), "not integer"),
    }
    for name, (arrays, needle) in cases.items():
        f = tmp_path / f"{name}.npz"
        np.savez(f, **arrays)
        _refused(capsys, "rescore", "--lm", default_lm_dir(), "--lattice", f, needle=needle)
    f = good.save(tmp_path / "good.npz")
    _refused(capsys, "rescore", "--lm", default_lm_dir(), "--lattice", f, "--history", "1", str(10**7),
             needle="--history id 10000000")


def test_decode_json_keeps_the_records_of_finished_prompts(bundle, capsys, monkeypatch):
    from latticedraft.decoding.runs.session import Session

    real, done = Session.decode, []

    def interrupt_at_the_second_prompt(self, *a, on_done=None, **kw):
        def first_only(i, res):
            done.append(i)
            if len(done) == 2:  # Ctrl-C while the second prompt's record is due
                raise KeyboardInterrupt
            on_done(i, res)

        return real(self, *a, on_done=None if on_done is None else first_only, **kw)

    monkeypatch.setattr(Session, "decode", interrupt_at_the_second_prompt)
    rc = main(["decode", "--model", str(bundle / "heads"), "--prompts", str(bundle / "prompts.jsonl"), "--json",
               "--max-new-tokens", "4", "--tree", "fixed"])  # (--tree auto warms up with one decode first)
    cap = capsys.readouterr()
    assert rc == 130 and cap.err.strip().splitlines()[-1].startswith("error:")
    recs = [json.loads(x) for x in cap.out.splitlines()]
    assert len(recs) == 1 and recs[0]["prompt"] == "def f(x):"


# -- misleading messages ------------------------------------------------------------------------------


def test_file_where_a_directory_belongs_and_back(bundle, tmp_path, capsys):
    f = tmp_path / "f.txt"
    f.write_text("x")
    assert "is a file, not a directory" in _refused(capsys, "decode", "--model", f, "--prompt", "x", needle=str(f))
    assert "is a file, not a directory" in _refused(capsys, "lm", "score", "--lm", f, "--ids", "1", needle=str(f))
    assert "is a directory" in _refused(capsys, "decode", "--model", bundle / "heads", "--prompts", tmp_path,
                                        needle=str(tmp_path))
    assert "is a directory" in _refused(capsys, "rescore", "--lm", tmp_path, "--lattice", tmp_path,
                                        needle=str(tmp_path))


def test_random_bytes_as_npz(tmp_path, capsys):
    f = tmp_path / "lat.npz"
    f.write_bytes(np.random.default_rng(2).bytes(500))
    last = _refused(capsys, "rescore", "--lm", tmp_path, "--lattice", f, needle="not a lattice written by Sausage.save")
    assert "allow_pickle" not in last and "unsafe" not in last


def test_dynamo_top_k_named_as_typed(capsys, tmp_path):
    # 0 means "off" for DynaMo as for every method (the whole vocabulary); a negative K is refused
    _refused(capsys, "decode", "--method", "dynamo", "--model", tmp_path / "none", "--prompt", "x", "--top-k", "-1",
             needle="--top-k -1")


def test_version():
    r = subprocess.run([sys.executable, "-m", "latticedraft", "--version"], capture_output=True, text=True)
    from latticedraft import __version__

    assert r.returncode == 0 and r.stdout.strip() == f"latticedraft {__version__}"


# -- also expected by users ---------------------------------------------------------------------------


def _stdin(monkeypatch, data: bytes):
    import io

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


def test_prompts_and_prompt_from_stdin(bundle, capsys, monkeypatch):
    _stdin(monkeypatch, b'{"prompt": "def f(x):"}\n{"prompt": "import os\\n"}\n')
    rc, out, _ = _run(capsys, "decode", "--model", bundle / "heads", "--prompts", "-", "--json", "--max-new-tokens", 3)
    assert rc == 0 and [json.loads(x)["prompt"] for x in out.splitlines()] == ["def f(x):", "import os\n"]
    _stdin(monkeypatch, "def g(y):".encode())
    rc, out, _ = _run(capsys, "decode", "--model", bundle / "heads", "--prompt", "-", "--max-new-tokens", 3)
    assert rc == 0 and out.startswith("def g(y):")
    _stdin(monkeypatch, b"caf\xe9")
    _refused(capsys, "decode", "--model", bundle / "heads", "--prompt", "-", needle="--prompt standard input")


def test_corpus_from_stdin_with_a_sentence_unit_by_corpus_kind(tmp_path, capsys, monkeypatch):
    from latticedraft.paths import kenlm_tool

    try:
        kenlm_tool("lmplz")
    except Exception as e:  # pragma: no cover - a set-up problem, not a test result
        pytest.skip(f"KenLM not built: {e}")
    lines = [f"And the {w} said unto {v}" for w in ("lord", "king", "man") for v in ("them", "him", "her")]
    text = "\n".join(lines[:4]) + "\n\n" + "\n".join(lines[4:]) + "\n"
    for unit, want in ((None, ("lines", len(lines))), ("paragraphs", ("paragraphs", 2)), ("files", ("files", 1))):
        _stdin(monkeypatch, text.encode())
        out = tmp_path / f"lm-{unit}"
        rc, _, last = _run(capsys, "lm", "build", "--corpus", "-", "--train-tokenizer", 300, "--order", 2, "-o", out,
                           *(["--sentences", unit] if unit else []))
        assert rc == 0, last
        corpus = json.loads((out / "manifest.json").read_text())["corpus"]
        assert (corpus["sentences"], corpus["chunks"]) == want
        assert ("corpus kind" in corpus["sentences_chosen_by"]) == (unit is None)


def test_history_spellings_agree(capsys):
    if not default_lm_dir().exists():
        pytest.skip("bundled 4-gram missing")
    outs = []
    for hist in (["5,6", "7"], ["5", "6", "7"], ["5 6,7"]):
        rc, out, _ = _run(capsys, "lm", "score", "--ids", "9,10", "--history", *hist, "--compact")
        assert rc == 0
        outs.append(json.loads(out)["tokens"])
    assert outs[0] == outs[1] == outs[2]


def test_the_advice_on_a_bad_prompt_line_names_only_options_that_apply(tmp_path, capsys, monkeypatch):
    """Issue 59, class C: for every command that reads --prompts, in each of decode's modes, every
    option the refusal advises is the command's own, and a switch it advises, added, is taken (never
    "does not apply"): the run gets past the bad line to the model load (stopped here)."""
    import re

    from latticedraft.cli import build_parser
    from latticedraft.cli.parser import commands
    from latticedraft.decoding.runs import session
    from latticedraft.errors import InputError
    from tests.contract import refused

    def no_load(*a, **k):
        raise InputError("the model would load now")

    monkeypatch.setattr(session, "load_model", no_load)
    monkeypatch.chdir(tmp_path)  # eval and demo write to ./out by default
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"prompt": ""}\n')
    checked = []
    for name, p in commands(build_parser()):
        if "--prompts" not in p._option_string_actions:
            continue
        modes = [["--json"], ["--output", str(tmp_path / "o.jsonl")], []] if name == ("decode",) else [[]]
        for mode in modes:
            argv = [*name, "--prompts", bad, *mode]
            advice = refused(capsys, argv, f"--prompts {bad} line 2: an empty prompt").split("line 2:", 1)[1]
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]+", advice):
                action = p._option_string_actions.get(flag)
                assert action is not None, f"`{' '.join(name)}` advises {flag}, which it does not have"
                if action.nargs == 0:
                    line = refused(capsys, argv + [flag], "the model would load now")
                    assert "does not apply" not in line
                    checked.append((name, flag))
    assert checked == [(("decode",), "--skip-bad")]  # the one switch advised, where it applies

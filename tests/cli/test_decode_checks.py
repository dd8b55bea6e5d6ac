"""A model the method cannot run is refused by the method's cheap checks (``Method.check``) before
any expensive work: no co-occurrence counting (DynaMo), no acceptance fitting or T(n) measuring
(BPD), nothing written under the cache. One ``error:`` line, exit 2, nothing on stdout."""

from __future__ import annotations

import json
import shutil

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from latticedraft.cli import main
from latticedraft.gpu.models.blockwise import BlockwiseModel
from tests.gpu.conftest import make_tiny

pytestmark = pytest.mark.usefixtures("one_torch_thread")
WORDS = ["<|endoftext|>"] + [f"w{i}" for i in range(31)]  # a vocabulary of 32, not the bundled tokenizer's


def _save_tokenizer(path) -> None:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    """``llama/``: a plain tiny Llama with a 32-word tokenizer; ``dynamo/``: DynaMo heads on it."""
    d = tmp_path_factory.mktemp("checks")
    make_tiny("llama", vocab=len(WORDS)).save_pretrained(d / "llama")
    _save_tokenizer(d / "llama" / "tokenizer.json")
    BlockwiseModel.from_base(make_tiny("llama", vocab=len(WORDS)), 3, kind="dynamo").save_pretrained(
        d / "dynamo", base_ref="../llama")
    return d


@pytest.fixture
def no_expensive_work(monkeypatch, own_cache):
    """Fail the test on co-occurrence counting, acceptance counting or T(n) measuring."""
    from latticedraft.decoding.planning import calibrate
    from latticedraft.gpu.verify.cost_model import CostModel
    from latticedraft.lm.cooccurrence import CooccurrenceStats

    def forbidden(*a, **k):
        raise AssertionError("expensive work before the cheap checks")

    monkeypatch.setattr(CooccurrenceStats, "from_files", classmethod(forbidden))
    monkeypatch.setattr(calibrate, "counted", forbidden)
    monkeypatch.setattr(CostModel, "measure", classmethod(forbidden))
    return own_cache


def _refused(capsys, cache, *args, needle: str) -> None:
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], cap.err
    assert cap.out == ""
    written = sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*")) if cache.exists() else []
    assert written == [], written


def test_dynamo_refuses_a_model_without_heads_before_counting(models_dir, no_expensive_work, capsys):
    _refused(capsys, no_expensive_work, "decode", "--method", "dynamo", "--model", models_dir / "llama",
             "--prompt", "w1 w2", "--max-new-tokens", "4", needle="no multi-token heads")


def test_bpd_refuses_dynamo_heads_before_fitting(models_dir, no_expensive_work, capsys):
    _refused(capsys, no_expensive_work, "decode", "--model", models_dir / "dynamo", "--prompt", "w1 w2",
             "--max-new-tokens", "4", needle="BPD verification runs Stern heads")


@pytest.mark.parametrize("method, model, needle", [("dynamo", "llama", "no multi-token heads"),
                                                   ("bpd", "dynamo", "Stern heads")])
def test_session_decode_checks_first_too(models_dir, no_expensive_work, method, model, needle):
    """The library path (``Session.decode`` without ``prepare``) passes the same checks first."""
    import numpy as np

    from latticedraft.decoding.runs.session import Session
    from latticedraft.errors import ModelError

    s = Session(models_dir / model)
    options = s.configure(method, {"tree": "auto"} if method == "bpd" else {})
    with pytest.raises(ModelError, match=needle):
        s.decode([np.array([1, 2], dtype=np.int64)], method, options, max_new_tokens=4)
    assert not no_expensive_work.exists() or not any(no_expensive_work.rglob("*"))


@pytest.mark.parametrize("args", [["--drafter", "model"], ["--method", "mtad"]])
def test_a_draft_model_method_without_one_names_where_each_model_gets_its_own(models_dir, no_expensive_work, capsys,
                                                                              args):
    """The hint does not send a SmolLM2 user to the bundled model's draft model (another vocabulary)."""
    _refused(capsys, no_expensive_work, "decode", "--model", models_dir / "llama", "--prompt", "w1 w2",
             "--max-new-tokens", "4", *args,
             needle="needs an auxiliary draft model: pass --draft-model DIR, a causal LM with the model's tokenizer")
    from latticedraft.decoding.runs.loaders import DRAFT_MODEL_HINT

    assert "build_smollm2.sh --draft" in DRAFT_MODEL_HINT and "train draft-model --base" in DRAFT_MODEL_HINT


@pytest.fixture(scope="module")
def neox(tmp_path_factory):
    """A tiny GPT-NeoX (an architecture the lean path does not write out) with the 32-word tokenizer."""
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    d = tmp_path_factory.mktemp("neox")
    torch.manual_seed(0)
    GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=32, max_position_embeddings=64)).save_pretrained(d)
    _save_tokenizer(d / "tokenizer.json")
    return d


@pytest.fixture
def no_load(monkeypatch):
    """Fail the test where a model's weights load."""
    from latticedraft.decoding.runs import session

    def forbidden(*a, **k):
        raise AssertionError("the weights loaded before the refusal")

    monkeypatch.setattr(session, "load_model", forbidden)


@pytest.mark.parametrize("value", ["int4", "int8"])
@pytest.mark.parametrize("command", ["decode", "eval"])
def test_a_self_draft_the_lean_path_cannot_run_is_refused_from_config_json_before_the_load(
        neox, no_load, own_cache, capsys, command, value):
    args = ["--prompt", "w1 w2"] if command == "decode" else ["--out", own_cache.parent / "e"]
    _refused(capsys, own_cache, command, "--model", neox, "--self-draft", value, *args,
             needle=f"--self-draft {value}: gpt_neox layers are not written out")


def test_auto_and_off_are_never_refused_from_config_json(neox, capsys, own_cache):
    for value in ("auto", "off"):
        assert main(["decode", "--model", str(neox), "--prompt", "w1 w2", "--max-new-tokens", "3", "--json",
                     "--self-draft", value, "--lm-drafts", "0"]) == 0, capsys.readouterr().err


def test_greedy_takes_the_value_that_means_none(models_dir, capsys, own_cache):
    """``--self-draft off`` (or ``--context-ngrams 0``) changes nothing for --method greedy, so it goes;
    ``--self-draft int4`` is refused before any model loads."""
    for flags in (["--self-draft", "off"], ["--context-ngrams", "0"], ["--suffix-drafts", "0"]):
        assert main(["decode", "--method", "greedy", "--model", str(models_dir / "llama"), "--prompt", "w1 w2",
                     "--max-new-tokens", "3", "--json", *flags]) == 0, capsys.readouterr().err
    capsys.readouterr()
    shutil.rmtree(own_cache, ignore_errors=True)
    _refused(capsys, own_cache, "decode", "--method", "greedy", "--model", models_dir / "llama", "--prompt", "w1",
             "--self-draft", "int4", needle="--self-draft int4 does not apply to --method greedy (it applies to")


@pytest.mark.parametrize("method", [[], ["--method", "greedy"], ["--method", "lookahead"]])
def test_too_many_new_tokens_names_the_real_maximum_for_the_prompt_which_decodes(models_dir, capsys, own_cache,
                                                                                   method):
    """64 positions, a 5-token prompt: the refusal names --max-new-tokens 59, and 59 decodes."""
    model = ["--model", str(models_dir / "llama"), "--prompt", "w0 w1 w2 w8 w4", "--json", *method]  # (no end id in 59)
    for too_many in ("10000000000", "64", "60"):
        _refused(capsys, own_cache, "decode", *model, "--max-new-tokens", too_many,
                 needle="lower --max-new-tokens to 59 at most")
    assert main(["decode", *model, "--max-new-tokens", "59", "--lm-drafts", "0", "--self-draft", "off"]
                if not method else ["decode", *model, "--max-new-tokens", "59"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert len(json.loads(out)["tokens"]) == 59


def test_a_torch_without_the_kernels_refuses_int4_before_the_load(models_dir, no_load, own_cache, capsys, monkeypatch):
    from latticedraft.gpu.models import quantized

    monkeypatch.setattr(quantized, "kernels_missing", lambda device: f"torch has no int4 kernels for {device}")
    _refused(capsys, own_cache, "decode", "--model", models_dir / "llama", "--prompt", "w1", "--self-draft", "int4",
             needle="--self-draft int4: torch has no int4 kernels for cpu")


LM_NEEDED = [["--drafter", "parallel"], ["--drafter", "ngram", "--lm-drafts", "0"], ["--lm-drafts", "3"],
             ["--lm-drafts", "auto", "--lm", "{cache}/lm/mine"]]  # auto reads an LM --lm names: it must be there


@pytest.mark.parametrize("args", LM_NEEDED)
def test_a_missing_lm_the_options_read_is_refused_before_the_load(models_dir, no_load, own_cache, capsys, args):
    """An empty cache: ``--drafter ngram / parallel``, ``--lm-drafts N`` and an LM named with ``--lm``
    are refused in one line naming the path and the fix before any weights load (``no_load``)."""
    args = [a.format(cache=own_cache) for a in args]
    missing = args[-1] if "--lm" in args else own_cache / "lm" / "stdlib-4gram"
    _refused(capsys, own_cache, "decode", "--model", models_dir / "llama", "--prompt", "w1", *args,
             needle=f"n-gram LM {missing} not found; run `bash scripts/setup.sh`")


def test_a_missing_lm_names_what_reads_it_and_how_to_decode_without_it(models_dir, no_load, own_cache, capsys):
    assert main(["decode", "--model", str(models_dir / "llama"), "--prompt", "w1", "--drafter", "parallel",
                 "--lm-drafts", "2"]) == 2
    err = capsys.readouterr().err
    assert err.rstrip().endswith("or decode without it (read by --drafter parallel and --lm-drafts 2): "
                                 "--drafter top1 / parallel-base with --lm-drafts 0"), err


def test_a_data_set_run_is_refused_before_the_load_and_writes_nothing(models_dir, no_load, own_cache, capsys, tmp_path):
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out.jsonl"
    prompts.write_text('{"prompt": "w1 w2"}\n')
    _refused(capsys, own_cache, "decode", "--model", models_dir / "llama", "--prompts", prompts, "--output", out,
             "--lm-drafts", "3", needle=f"n-gram LM {own_cache / 'lm' / 'stdlib-4gram'} not found")
    assert not out.exists()


def test_lm_drafts_auto_stays_off_without_the_default_lm(models_dir, own_cache, capsys):
    """The CLI's default ``--lm-drafts auto`` drafts from the LM where it is built: an empty cache decodes."""
    assert main(["decode", "--model", str(models_dir / "llama"), "--prompt", "w1 w2", "--max-new-tokens", "3", "--json",
                 "--self-draft", "off"]) == 0, capsys.readouterr().err
    assert len(json.loads(capsys.readouterr().out)["tokens"]) == 3


def test_the_library_refuses_a_missing_lm_in_the_cli_words_before_building(models_dir, own_cache, capsys,
                                                                           monkeypatch):
    """``Session.prepare`` and ``Session.decode`` refuse what the CLI refuses, with its message, before
    any LM table, source (the self-draft) or tree is built."""
    import numpy as np

    from latticedraft.decoding import sources
    from latticedraft.decoding.methods import bpd_session
    from latticedraft.decoding.runs.session import Session
    from latticedraft.errors import InputError

    assert main(["decode", "--model", str(models_dir / "llama"), "--prompt", "w1", "--drafter", "parallel"]) == 2
    cli = capsys.readouterr().err.strip().removeprefix("error: ")

    def forbidden(*a, **k):
        raise AssertionError("built before the missing LM was refused")

    monkeypatch.setattr(bpd_session, "load", forbidden)
    monkeypatch.setattr(sources, "build_all", forbidden)
    s = Session(models_dir / "llama")
    spec = s.configure("bpd", {"drafter": "parallel"})
    with pytest.raises(InputError) as prepared:
        s.prepare("bpd", spec)
    with pytest.raises(InputError) as decoded:
        s.decode([np.array([1, 2], dtype=np.int64)], "bpd", spec, max_new_tokens=3)
    assert str(prepared.value) == str(decoded.value) == cli

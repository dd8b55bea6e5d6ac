"""A model the method cannot run is refused by the method's cheap checks (``Method.check``) before
any expensive work: no co-occurrence counting (DynaMo), no acceptance fitting or T(n) measuring
(BPD), nothing written under the cache. One ``error:`` line, exit 2, nothing on stdout."""

from __future__ import annotations

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

"""What ``--lm-drafts`` resolves to (auto where the LM fits the model), and the session's dtype."""

import numpy as np
import pytest

from latticedraft.decoding.methods.bpd import DrafterSpec
from latticedraft.decoding.proposers.lm_ngrams import AUTO_DEPTH, build
from latticedraft.decoding.runs.session import Session
from latticedraft.errors import InputError
from latticedraft.paths import default_lm_dir
from tests.decoding.tiny import tiny_model

pytestmark = pytest.mark.skipif(not default_lm_dir().is_dir(), reason="the bundled LM is built by scripts/setup.sh")


def test_auto_drafts_from_the_bundled_lm_where_it_fits_the_model():
    s = Session()
    got = build(s, DrafterSpec("none").fast().lm_drafts)
    assert got is not None and got.ngrams.depth == AUTO_DEPTH
    toks, probs = got.ngrams.continuation(got.arrays, np.array(s.tokenizer.encode("    def __init__(self").ids))
    assert len(toks) == AUTO_DEPTH and ((0 < probs) & (probs <= 1)).all()
    assert build(s, 5).ngrams.depth == 5
    assert DrafterSpec("none").lm_drafts == 0  # the library's default: off


def test_auto_is_off_without_the_bundled_lm_but_a_named_lm_must_load(tmp_path, monkeypatch):
    import latticedraft.paths as paths

    s = Session(model=tiny_model("llama", vocab=8192))
    monkeypatch.setattr(paths, "default_lm_dir", lambda: tmp_path / "none")
    assert build(s, "auto") is None
    s.lm_dir = str(tmp_path / "missing")
    with pytest.raises(InputError, match="missing not found"):
        build(s, "auto")


def test_auto_with_a_named_lm_of_another_vocabulary_is_refused(monkeypatch):
    """The bundled LM built with another tokenizer turns auto off; a named one is an error."""
    from latticedraft.errors import ModelError

    def another_vocabulary(self):
        raise ModelError("the LM was built with another vocabulary")

    s = Session(model=tiny_model("llama", vocab=8192))
    monkeypatch.setattr(Session, "lm", property(another_vocabulary))
    assert build(s, "auto") is None
    s.lm_dir = str(default_lm_dir())
    with pytest.raises(ModelError, match="another vocabulary"):
        build(s, "auto")


def test_the_dtype_applies_to_the_base_its_heads_and_the_draft_model(tmp_path):
    import torch

    from tests.decoding.tiny import save_bpd_bundle

    d = save_bpd_bundle(tmp_path, ["def f(x):\n"], rescorer=True)
    s = Session(d / "heads", draft_model_dir=d / "resc", dtype="bfloat16", threads=1)
    assert {p.dtype for p in s.model.parameters()} == {torch.bfloat16}  # the base and the heads
    assert {p.dtype for p in s.draft_model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in Session(d / "heads", threads=1).model.parameters()} == {torch.float32}
    with pytest.raises(InputError, match="unknown dtype"):
        Session(d / "heads", dtype="int8", threads=1)


@pytest.mark.parametrize("method", ["greedy", "lookahead", "ppd", "mtad"])
def test_configure_refuses_what_the_cli_refuses_in_the_same_words(method, capsys):
    """Issue 63, class C: ``Session.configure`` passes the method's own option check, as the CLI does:
    an option the method does not read is refused in the CLI's line; its "none" value goes."""
    from tests.contract import refused

    s = Session(model=tiny_model("llama", vocab=8192))
    s.draft_model_dir = "DIR" if method == "mtad" else None
    with pytest.raises(InputError) as e:
        s.configure(method, {"self_draft": "int4"})
    extra = ["--draft-model", "DIR"] if method == "mtad" else []
    line = refused(capsys, ["decode", "--method", method, "--self-draft", "int4", "--prompt", "x", *extra])
    assert line == f"error: {e.value}" and "--self-draft int4 does not apply to --method" in line
    if method != "mtad":
        options = s.configure(method, {"self_draft": "off", "context_ngrams": 0})
        assert len(s.decode([np.array([5, 6, 7])], method, options, max_new_tokens=3).sequences[0].tokens) == 3

"""``lm_for``: without ``--lm`` a model decodes with the LM build made with its own tokenizer (the
bundled 4-gram for the bundled tokenizer, e.g. ``smollm2-4gram`` for SmolLM2's)."""

from __future__ import annotations

import json

import pytest

from latticedraft.decoding.runs.loaders import lm_for
from latticedraft.lm.tokenizer import fingerprint, load_tokenizer
from latticedraft.paths import data_dir

TOKENIZER = data_dir() / "tokenizer" / "tokenizer.json"
pytestmark = pytest.mark.skipif(not TOKENIZER.is_file(), reason="bundled tokenizer missing (run scripts/setup.sh)")


def _build(d, fp):
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps({"tokenizer": {"fingerprint": fp}}))


def test_the_lm_built_with_the_models_tokenizer_is_chosen(tmp_path, monkeypatch):
    monkeypatch.setenv("LATTICEDRAFT_CACHE", str(tmp_path))
    tok = load_tokenizer(TOKENIZER)
    lm = tmp_path / "lm"
    bundled = lm / "stdlib-4gram"
    assert lm_for(tok) == bundled  # nothing built: the bundled path (its load says how to build it)
    _build(bundled, "another vocabulary")
    assert lm_for(tok) == bundled  # nothing fits: the bundled one, whose load names the mismatch
    _build(lm / "b-4gram", "also another")
    _build(lm / "c-4gram", fingerprint(tok))
    _build(lm / "d-4gram", fingerprint(tok))
    assert lm_for(tok) == lm / "c-4gram"  # the first that fits, in name order
    (bundled / "manifest.json").write_text(json.dumps({"tokenizer": {"fingerprint": fingerprint(tok)}}))
    assert lm_for(tok) == bundled  # the bundled one first where it fits
    (lm / "c-4gram" / "manifest.json").write_text("{not json")
    (bundled / "manifest.json").unlink()
    assert lm_for(tok) == bundled  # a missing bundled build stays the default (set-up builds it)


def test_a_rescorer_of_another_vocabulary_is_refused_by_name():
    """The default rescorer was made for the bundled model: with another model's tokenizer the
    error names the rescorer and how to make one, not the (right) tokenizer."""
    from tokenizers import Tokenizer, models

    from latticedraft.decoding.runs.loaders import default_rescorer_dir, load_rescorer
    from latticedraft.errors import ModelError

    if not (default_rescorer_dir() / "config.json").is_file():
        pytest.skip("bundled rescorer missing (run scripts/setup.sh)")
    other = Tokenizer(models.WordLevel({f"w{i}": i for i in range(300)}, unk_token="w0"))
    with pytest.raises(ModelError, match=r"the tokenizer has 300 tokens but --rescorer .*rescorer-small \(the default "
                                         r"neural rescorer.*\) has a vocabulary of 8192; pass --rescorer DIR"):
        load_rescorer(tokenizer=other)
    assert load_rescorer(tokenizer=load_tokenizer(TOKENIZER)).config.vocab_size == 8192


def test_the_demos_name_for_smollm2_is_no_directory_and_the_error_says_what_is(tmp_path, monkeypatch):
    from latticedraft.decoding.runs.loaders import load_model
    from latticedraft.errors import InputError

    monkeypatch.chdir(tmp_path)  # no directory called smollm2 here
    with pytest.raises(InputError) as e:
        load_model("smollm2")
    msg = str(e.value)
    assert "--model data/heads-smollm2" in msg and "latticedraft fetch smollm2" in msg and "\n" not in msg
    with pytest.raises(InputError) as e:
        load_model(tmp_path / "elsewhere")
    assert "smollm2" not in str(e.value)  # other missing directories get no SmolLM2 hint


def test_an_empty_model_path_is_named_as_empty_not_as_the_current_directory():
    from latticedraft.decoding.runs.loaders import check_model_dir
    from latticedraft.errors import InputError

    with pytest.raises(InputError, match=r"--model '' is empty; pass --model DIR"):
        check_model_dir("")


def test_the_base_of_a_head_directory_is_read_from_its_files(tmp_path):
    from latticedraft.decoding.runs.loaders import base_dir_from_files

    heads, plain = tmp_path / "heads", tmp_path / "plain"
    heads.mkdir()
    plain.mkdir()
    (heads / "heads_config.json").write_text(json.dumps({"base": "../plain"}))
    assert base_dir_from_files(heads) == plain.resolve() and base_dir_from_files(plain) == plain

"""``outputs.py``: the one overwrite rule (claim_dir / claim_file), which kind owns a directory, inputs that are
never outputs, and what a forced replacement removes."""

import json

import pytest

from latticedraft import outputs
from latticedraft.errors import InputError
from latticedraft.outputs import (ADAPTER, DRAFT_MODEL, HEADS, LM_BUILD, MEDUSA_IMPORT, TRAINED_LM, claim_dir,
                                  claim_file, describe_dir, is_own, stale)


def _dir(root, *names):
    root.mkdir()
    for n in names:
        (root / n).write_text("x")
    return root


def test_new_and_empty_directories_are_free(tmp_path):
    assert not claim_dir(tmp_path / "new" / "deeper", HEADS).existing
    assert not claim_dir(_dir(tmp_path / "empty"), HEADS).existing
    assert not (tmp_path / "new").exists()  # claiming creates nothing


def test_an_earlier_output_needs_force_and_then_is_claimed(tmp_path):
    d = _dir(tmp_path / "h", "heads_config.json", "heads.safetensors", "README")
    with pytest.raises(InputError, match=r"already holds multi-token heads \(heads_config.json\); pass --force"):
        claim_dir(d, HEADS)
    c = claim_dir(d, HEADS, force=True)
    assert c.existing and not c.discard_checkpoint


@pytest.mark.parametrize("names, held", [
    (("config.json", "model.safetensors"), "a model (config.json, model.safetensors)"),
    (("adapter.json", "adapter.safetensors"), "a Kangaroo adapter (adapter.json"),
    (("notes.txt",), "1 entry (notes.txt)"),
    (("a", "b", "c", "d"), "4 entries (a, b, c and 1 more)"),
])
def test_anything_else_is_refused_even_with_force(tmp_path, names, held):
    d = _dir(tmp_path / "x", *names)
    for force in (False, True):
        with pytest.raises(InputError, match="not multi-token heads") as e:
            claim_dir(d, HEADS, force=force)
        assert f"holds {held}" in str(e.value) and "choose a new or empty directory" in str(e.value)


def test_a_plain_model_is_not_a_trained_lm_although_train_lm_writes_the_same_files(tmp_path):
    d = _dir(tmp_path / "m", "config.json", "model.safetensors", "tokenizer.json")
    with pytest.raises(InputError, match="holds a model"):
        claim_dir(d, TRAINED_LM, force=True)
    (d / "training.json").write_text("{}")
    assert claim_dir(d, TRAINED_LM, force=True).existing


def test_checkpoints_need_resume_or_force(tmp_path):
    d = _dir(tmp_path / "h", "checkpoint.pt")
    with pytest.raises(InputError, match=r"holds checkpoint.pt, an unfinished .*--resume .*--force"):
        claim_dir(d, HEADS)
    assert claim_dir(d, HEADS, force=True).discard_checkpoint
    assert claim_dir(d, HEADS, resume=True).existing
    with pytest.raises(InputError, match="contradict"):
        claim_dir(d, HEADS, force=True, resume=True)
    with pytest.raises(InputError, match="does not apply"):
        claim_dir(d, LM_BUILD, resume=True)
    with pytest.raises(InputError, match="--resume given but"):
        claim_dir(tmp_path / "none", HEADS, resume=True)


def test_a_file_is_not_a_directory(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(InputError, match="is a file; give a directory path"):
        claim_dir(f, HEADS, force=True)


def test_stale_lists_what_the_command_wrote_before_and_no_longer_writes(tmp_path):
    d = _dir(tmp_path / "h", "heads_config.json", "heads.safetensors", "training.json", "README", "checkpoint.pt")
    (d / "base").mkdir()
    assert [p.name for p in stale(d, HEADS, {"heads_config.json", "heads.safetensors", "training.json"})] == ["base"]
    assert stale(d, ADAPTER, set()) == [d / "training.json"]  # another kind's files are not its own


def test_claim_file(tmp_path):
    f = tmp_path / "out.bin"
    claim_file(f, force=False, is_own=lambda p: True, what="X", command="c")
    f.write_text("x")
    with pytest.raises(InputError, match=r"--out .*out.bin already holds X; pass --force"):
        claim_file(f, force=False, is_own=lambda p: True, what="X", command="c")
    claim_file(f, force=True, is_own=lambda p: True, what="X", command="c")
    with pytest.raises(InputError, match="exists and is not X written by `c`; --force replaces only that"):
        claim_file(f, force=True, is_own=lambda p: False, what="X", command="c")


def test_a_registered_kind_is_named_by_other_commands(tmp_path, monkeypatch):
    monkeypatch.setattr(outputs, "KINDS", list(outputs.KINDS))
    draft = outputs.register(outputs.OutputKind("a draft model", "latticedraft train draft-model", ("draft.json",),
                                                ("draft.json",), resumable=True))
    d = _dir(tmp_path / "d", "draft.json")
    assert describe_dir(d).startswith("a draft model (draft.json")
    with pytest.raises(InputError, match="holds a draft model"):
        claim_dir(d, HEADS, force=True)
    assert claim_dir(d, draft, force=True).existing


def _kind_dir(root, kind):
    """A directory holding ``kind``'s markers only (a tagged first marker with its "kind")."""
    root.mkdir()
    for i, m in enumerate(kind.markers):
        (root / m).write_text(json.dumps({"kind": kind.tag[0]}) if i == 0 and kind.tag else "{}")
    return root


def test_every_kind_owns_only_its_own_markers(tmp_path):
    for i, k in enumerate(outputs.KINDS):
        d = _kind_dir(tmp_path / str(i), k)
        assert [x.command for x in outputs.KINDS if is_own(d, x)] == [k.command]
        assert describe_dir(d).startswith(f"{k.what} (")


@pytest.mark.parametrize("record, kind", [('{"kind": "lm"}', TRAINED_LM), ("{}", TRAINED_LM),
                                          ('{"kind": "draft-model"}', DRAFT_MODEL), ("not json", None)])
def test_train_lm_and_draft_model_are_told_apart_by_training_json(tmp_path, record, kind):
    """Both write training.json + config.json; a record without "kind" is an older `train lm` output
    (the bundled data/base), one that cannot be read is neither's."""
    d = _dir(tmp_path / "m", "config.json", "model.safetensors")
    (d / "training.json").write_text(record)
    assert outputs.owner(d) is kind
    for k in (TRAINED_LM, DRAFT_MODEL):
        if k is kind:
            assert claim_dir(d, k, force=True).existing
        else:
            with pytest.raises(InputError, match=f"not {k.what} from"):
                claim_dir(d, k, force=True)
    if kind is DRAFT_MODEL:
        with pytest.raises(InputError, match=r'already holds a draft model \(training.json \("kind": "draft-model"\)'):
            claim_dir(d, DRAFT_MODEL)


def test_an_import_is_not_the_output_of_the_command_whose_files_it_writes(tmp_path):
    d = _kind_dir(tmp_path / "imported", MEDUSA_IMPORT)
    assert outputs.owner(d) is MEDUSA_IMPORT
    with pytest.raises(InputError, match="holds imported Medusa heads .*not multi-token heads"):
        claim_dir(d, HEADS, force=True)


def test_an_input_is_never_the_output(tmp_path):
    base = _dir(tmp_path / "base", "config.json")
    src = tmp_path / "src" / "model.gguf"
    src.parent.mkdir()
    src.write_text("x")
    for out, needle in ((base, f"is the input --base {base}"), (tmp_path, f"holds the input --base {base}"),
                        (src.parent, f"holds the input FILE {src}")):
        with pytest.raises(InputError, match=f"--out {out} {needle}; a command never writes into its input"):
            claim_dir(out, HEADS, force=True, inputs={"--base": base, "FILE": src})
    with pytest.raises(InputError, match="the input --corpus"):
        claim_dir(base, HEADS, inputs={"--corpus": ["-", "stdlib", str(base)]})
    assert not claim_dir(tmp_path / "new", HEADS, inputs={"--base": base, "--tokenizer": None}).existing

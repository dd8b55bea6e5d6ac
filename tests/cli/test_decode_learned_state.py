"""What a decode learns and keeps under the cache never fails it (issue 63, classes A and B): a clean
decode into an empty ``LATTICEDRAFT_CACHE`` writes its learned state; every file it wrote is of a
kind ``learned_state`` declares (so none escapes the loader), and each is then damaged in several
ways, and each folder and the cache itself made unwritable without permissions (a file where a
folder belongs, a directory where a file belongs; ``chattr +i`` where it works): every decode
prints the clean run's records, with no traceback, nothing more on stderr for a damaged entry and
one line naming the cache for one it could not save; ``--verbose`` names the real file."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from latticedraft import learned_state
from latticedraft.cli import main
from tests.cli.test_decode import TOKENIZER
from tests.decoding.tiny import save_bpd_bundle

pytestmark = [pytest.mark.skipif(not TOKENIZER.is_file(), reason="bundled tokenizer missing (run scripts/setup.sh)"),
              pytest.mark.usefixtures("one_torch_thread")]
# the bundle's drafter and cost-aware tree (which read and write the learned state), no LM or int4 copy
FLAGS = ["--max-new-tokens", "10", "--json", "--batch-size", "2", "--lm-drafts", "0", "--self-draft", "off"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return save_bpd_bundle(tmp_path_factory.mktemp("learned"), ["def f(x):\n    return", "import os\n", "class A:\n"])


def decode(bundle, cache: Path, capsys, *extra) -> tuple[list, list]:
    """(the records' texts and tokens, the stderr lines) of a decode with ``cache`` as the cache."""
    learned_state._told.clear()  # once per process: each decode here is a process of its own
    capsys.readouterr()
    rc = main(["decode", "--model", str(bundle / "heads"), "--prompts", str(bundle / "prompts.jsonl"), *FLAGS, *extra])
    cap = capsys.readouterr()
    assert rc == 0 and "Traceback" not in cap.err, cap.err
    records = [json.loads(line) for line in cap.out.splitlines()]
    return [(r["text"], r["tokens"]) for r in records], cap.err.strip().splitlines()


@pytest.fixture
def clean(bundle, tmp_path, monkeypatch, capsys):
    """(records, stderr lines, the cache) of a first decode into an empty cache."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("LATTICEDRAFT_CACHE", str(cache))
    records, err = decode(bundle, cache, capsys)
    assert len(records) == 3
    return records, err, cache


def learned_files(cache: Path) -> list[Path]:
    return sorted(p for p in cache.rglob("*") if p.is_file() and p.parts[len(cache.parts)] not in learned_state.ARTIFACTS)


def test_every_file_a_decode_keeps_is_a_declared_kind(clean):
    _, _, cache = clean
    folders = {p.relative_to(cache).parts[0] for p in learned_files(cache)}
    assert {"acceptance", "cost_model"} <= folders
    assert folders <= set(learned_state.KINDS), f"{folders - set(learned_state.KINDS)}: declare a learned_state.kind"


def _every(d, leaf=None, cut=False):
    """JSON value ``d`` with every number replaced by ``leaf(number)`` or every list cut in half."""
    if isinstance(d, dict):
        return {k: _every(v, leaf, cut) for k, v in d.items()}
    if isinstance(d, list):
        return [_every(v, leaf, cut) for v in (d[: len(d) // 2] if cut else d)]
    is_number = isinstance(d, (int, float)) and not isinstance(d, bool)
    return leaf(d) if is_number and leaf is not None else d


DAMAGE = {  # name -> what becomes of a learned JSON entry
    "a list": lambda d: "[1, 2, 3]",
    "null": lambda d: "null",
    "NaN counts": lambda d: json.dumps(_every(d, lambda x: float("nan"))),
    "negative numbers": lambda d: json.dumps(_every(d, lambda x: -1 - x)),
    "arrays cut short": lambda d: json.dumps(_every(d, cut=True)),
    "numbers as text": lambda d: json.dumps(_every(d, str)),
    "cut mid-file": lambda d: json.dumps(d)[: len(json.dumps(d)) // 2],
    "garbage bytes": lambda d: "\x00\xff garbage",
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_entry_is_absent_and_the_decode_prints_the_same_records(bundle, clean, capsys, damage):
    records, err, cache = clean
    for f in learned_files(cache):
        f.write_text(DAMAGE[damage](json.loads(f.read_text())))
    again, err2 = decode(bundle, cache, capsys)
    assert again == records and set(err2) <= set(err), err2
    for f in learned_files(cache):  # measured and counted again, and stored whole
        assert learned_state.read(learned_state.KINDS[f.relative_to(cache).parts[0]], f.name) is not None, f


def test_verbose_names_each_damaged_file_by_its_real_path(bundle, clean, capsys):
    records, _, cache = clean
    files = learned_files(cache)
    for f in files:
        f.write_text("[1, 2, 3]")
    again, err = decode(bundle, cache, capsys, "--verbose")
    assert again == records
    for f in files:
        assert sum(str(f) in line and "not used" in line for line in err) == 1, err
    assert not any("read from .cache/" in line for line in err)
    assert any(f"stored in {cache / 'cost_model'}" in line for line in err), err  # measured again, said where
    again, err = decode(bundle, cache, capsys, "--verbose")
    assert any(f"read from {cache / 'cost_model'}" in line for line in err)
    assert any(f"read from {cache / 'acceptance'}" in line for line in err), err


REFUSALS = {  # name -> make the cache refuse its entries, needing no permissions (root passes those)
    "a file where each folder belongs": lambda cache, files: [
        (shutil.rmtree(cache / d), (cache / d).write_text("x")) for d in {f.relative_to(cache).parts[0] for f in files}],
    "a directory where each file belongs": lambda cache, files: [(f.unlink(), f.mkdir()) for f in files],
    "a file where the cache belongs": lambda cache, files: (shutil.rmtree(cache), cache.write_text("x")),
}


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
def test_learned_state_that_cannot_be_saved_is_one_line_and_the_same_records(bundle, clean, capsys, refusal):
    records, err, cache = clean
    REFUSALS[refusal](cache, learned_files(cache))
    again, err2 = decode(bundle, cache, capsys)
    new = [line for line in err2 if line not in err]
    assert again == records
    assert len(new) == 1 and "could not be saved" in new[0] and str(cache) in new[0] and ".tmp" not in new[0], new


def test_an_immutable_folder_is_one_line_and_the_same_records(bundle, clean, capsys):
    records, err, cache = clean
    folders = sorted({cache / f.relative_to(cache).parts[0] for f in learned_files(cache)})
    for d in folders:
        shutil.rmtree(d)
        d.mkdir()
    if subprocess.run(["chattr", "+i", *map(str, folders)], capture_output=True).returncode:
        pytest.skip("chattr +i is not available here")
    try:
        again, err2 = decode(bundle, cache, capsys)
    finally:
        subprocess.run(["chattr", "-i", *map(str, folders)])
    new = [line for line in err2 if line not in err]
    assert again == records and len(new) == 1 and "could not be saved" in new[0], new

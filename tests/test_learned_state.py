"""``learned_state.py``: every kind of file the package keeps under the cache reads as absent when it
is damaged in any way (one note naming the real file), and a write the file system refuses is one
line on stderr, never an error. The kinds are walked from the registry (each must have a sample
here), and the package's source is scanned, so that no new folder under the cache escapes the loader."""

from __future__ import annotations

import copy
import importlib
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from latticedraft import learned_state as ls

ROOT = Path(ls.__file__).resolve().parent
DECLARES = re.compile(r"learned_state\.kind\(\s*\"([\w-]+)\"")
DIRECT = re.compile(r"cache_dir\(\)\)?\s*/\s*\"([\w-]+)\"")


def _owners() -> dict[str, str]:
    """folder -> the module that declares its kind, read from the source."""
    out = {}
    for f in ROOT.rglob("*.py"):
        for folder in DECLARES.findall(f.read_text()):
            out[folder] = ".".join(f.relative_to(ROOT.parent).with_suffix("").parts)
    return out


@pytest.fixture(scope="module")
def kinds() -> dict:
    for module in set(_owners().values()):
        importlib.import_module(module)
    return dict(ls.KINDS)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LATTICEDRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(ls, "_told", set())  # "once per process" starts again for each test
    return tmp_path / "cache"


NAMES = {"continuations": "key/batch-00000-00002.npy", "cooccurrence": "c.npz"}  # beside "e.json" / "e.npy"
CHECKS = {folder: (lambda d: None if d["key"] == "k" else "another key")
          for folder in ("cost_model", "self_draft")}  # what the callers add


def _name(k) -> str:
    example = k.example()
    return NAMES.get(k.folder, "e" + (".json" if isinstance(example, dict) else ".npy"))


def _write(path: Path, content) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if callable(content):
        content(path)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))


def _leaves(d, at=()):
    """(path, value) of every leaf and every list of a JSON value."""
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _leaves(v, (*at, k))
    elif isinstance(d, list):
        yield at, d
        for i, v in enumerate(d):
            yield from _leaves(v, (*at, i))
    else:
        yield at, d


def _set(d, at, value):
    out = copy.deepcopy(d)
    node = out
    for k in at[:-1]:
        node = node[k]
    node[at[-1]] = value
    return out


def json_damage(d: dict) -> list:
    """Damaged variants of a valid JSON entry: not JSON, JSON that is no object, every field
    dropped, every list cut short, every leaf NaN, negative, infinite, of another type."""
    out = ["", "{not json", "[1, 2, 3]", "null", "3", '"text"', json.dumps([d])]
    out += [{k: v for k, v in d.items() if k != drop} for drop in d]
    for at, v in _leaves(d):
        if isinstance(v, list):
            out.append(_set(d, at, v[: len(v) // 2]))
        else:
            out += [_set(d, at, bad) for bad in (float("nan"), -1, float("inf"), "x", None, True, [v], {"v": v})
                    if bad != v]
    return [x if isinstance(x, str) else json.dumps(x) for x in out]


def file_damage(write) -> list:
    """Damaged variants of a binary entry: empty, garbage, cut in half, another array type."""
    def cut(p):
        write(p)
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])

    def saved(a):
        def save(p):
            with open(p, "wb") as f:  # at this very name (np.save would add .npy)
                np.save(f, a)
        return save

    return [lambda p: p.write_bytes(b""), lambda p: p.write_bytes(b"\x93NUMPY garbage" * 9), cut,
            saved(np.full((2, 5), -1.5)), saved(np.array([{"a": 1}], dtype=object)), saved(-np.ones((2, 5), np.int32))]


def test_every_kind_is_declared_with_an_example(kinds):
    assert set(kinds) == set(_owners())
    missing = [f for f, k in kinds.items() if k.example is None]
    assert not missing, f"declare an example entry of {missing} (learned_state.kind(..., example=...))"


def test_every_valid_entry_is_read_and_every_damaged_one_is_absent_with_one_note(kinds, cache):
    for folder, k in kinds.items():
        if k.example is not None:  # (one without fails the test above)
            _damage_every_way(folder, k)


def _damage_every_way(folder: str, k) -> None:
    name, valid = _name(k), k.example()
    path = k.path(name)
    _write(path, valid)
    assert ls.read(k, name, check=CHECKS.get(folder)) is not None, folder
    damaged = json_damage(valid) if isinstance(valid, dict) else file_damage(valid)
    for bad in damaged:
        path.unlink()
        _write(path, bad)
        notes = []
        assert ls.read(k, name, notes.append, check=CHECKS.get(folder)) is None, (folder, bad)
        assert len(notes) == 1 and str(path) in notes[0], (folder, bad, notes)
    path.unlink()
    path.mkdir()  # a directory where the file belongs
    notes = []
    assert ls.read(k, name, notes.append) is None and len(notes) == 1 and str(path) in notes[0]


def test_a_missing_entry_is_absent_without_a_note(kinds, cache):
    notes = []
    assert all(ls.read(k, "missing.json", notes.append) is None for k in kinds.values()) and notes == []
    cache.parent.joinpath("cache").write_text("a file where the cache belongs")
    assert all(ls.read(k, "missing.json", notes.append) is None for k in kinds.values())


def _refused_writes(cache: Path, k) -> list:
    """Ways the file system refuses an entry of ``k`` that need no permissions (root passes those)."""
    def folder_is_a_file():
        cache.mkdir(parents=True, exist_ok=True)
        k.where.write_text("a file where the folder belongs")

    def entry_is_a_directory():
        k.path("e.json").mkdir(parents=True)

    def cache_is_a_file():
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text("a file where the cache belongs")

    return [folder_is_a_file, entry_is_a_directory, cache_is_a_file]


@pytest.mark.parametrize("case", range(3))
def test_a_refused_write_is_one_line_naming_the_cache_once_and_never_an_error(kinds, cache, case, capsys):
    for k in kinds.values():
        _refused_writes(cache, k)[case]()
        assert ls.write(k, "e.json", "{}\n") is None
        assert ls.write(k, "e.json", lambda p: p.write_text("{}")) is None
        if cache.is_file():
            cache.unlink()
        elif k.where.is_file():
            k.where.unlink()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "could not be saved" in err[0] and str(cache) in err[0], err
    assert ".tmp" not in err[0] and "Traceback" not in err[0]


def test_an_immutable_folder_is_one_line_too(kinds, cache, capsys):
    k = kinds["acceptance"]
    k.where.mkdir(parents=True)
    if subprocess.run(["chattr", "+i", str(k.where)], capture_output=True).returncode:
        pytest.skip("chattr +i is not available here")
    try:
        assert ls.write(k, "e.json", "{}\n") is None
    finally:
        subprocess.run(["chattr", "-i", str(k.where)])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(k.where) in err[0]


def test_writes_and_reads_respect_latticedraft_cache(kinds, cache):
    k = kinds["acceptance"]
    assert ls.write(k, "e.json", json.dumps(k.example())) == cache / "acceptance" / "e.json"
    assert ls.read(k, "e.json") == k.example()


def test_no_module_reaches_a_learned_folder_past_the_loader():
    """Every folder the source names under ``cache_dir()`` is a declared kind (reached through
    ``read`` / ``write``, which ``learned_state`` alone does) or an artifact; no other module reads
    ``LATTICEDRAFT_CACHE`` itself."""
    declared = set(_owners())
    for f in ROOT.rglob("*.py"):
        rel, text = f.relative_to(ROOT).as_posix(), f.read_text()
        for folder in DIRECT.findall(text):
            assert folder in ls.ARTIFACTS, f"{rel} writes cache_dir()/{folder} past learned_state (declare a kind)"
            assert folder not in declared
        if rel not in ("paths.py",):
            assert "LATTICEDRAFT_CACHE\")" not in text and "LATTICEDRAFT_CACHE']" not in text, rel
    assert DIRECT.findall('Path(cache or cache_dir()) / "downloads"') == ["downloads"]  # the scan sees paths.py's


def test_the_continuations_seconds_and_questions_read_as_absent_when_damaged(tmp_path):
    from latticedraft.gpu.train import continuations as c

    for bad in ("[1]", '{"seconds": NaN}', '{"seconds": -1}', '{"seconds": "x"}', "null", "{"):
        (tmp_path / "seconds.json").write_text(bad)
        assert c._seconds(tmp_path) == 0.0

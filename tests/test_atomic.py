"""``atomic.py``: outputs appear whole or not at all, and a failure leaves no directory it made."""

from __future__ import annotations

import pytest

from latticedraft.atomic import atomic_dir, new_dirs


def test_new_dirs_removes_the_empty_directories_it_made_when_the_block_fails(tmp_path):
    (tmp_path / "cache").mkdir()
    with pytest.raises(RuntimeError):
        with new_dirs(tmp_path / "cache" / "downloads" / "deeper"):
            raise RuntimeError("the download failed")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["cache"]  # the one that was there stays
    with new_dirs(tmp_path / "cache" / "downloads") as d:
        (d / "kept.whl").write_text("x")
    assert (tmp_path / "cache" / "downloads" / "kept.whl").is_file()


def test_new_dirs_keeps_a_directory_that_holds_something(tmp_path):
    with pytest.raises(RuntimeError):
        with new_dirs(tmp_path / "a" / "b") as d:
            (d.parent / "mine.txt").write_text("x")
            raise RuntimeError("failed")
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["a", "a/mine.txt"]


def test_a_failed_atomic_dir_leaves_neither_its_stage_nor_the_parents_it_made(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_dir(tmp_path / "models" / "m") as stage:
            (stage / "config.json").write_text("{}")
            raise RuntimeError("the import failed")
    assert list(tmp_path.iterdir()) == []
    with atomic_dir(tmp_path / "models" / "m") as stage:
        (stage / "config.json").write_text("{}")
    assert [p.name for p in (tmp_path / "models" / "m").iterdir()] == ["config.json"]

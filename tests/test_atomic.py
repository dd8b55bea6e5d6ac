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


def test_unwritable_names_the_directory_at_fault_without_creating_anything(tmp_path):
    from latticedraft.atomic import unwritable

    (tmp_path / "f").write_text("x")
    assert unwritable(tmp_path / "f" / "out", directory=True) == (tmp_path / "f", "a file, not a directory")
    assert unwritable(tmp_path / "new" / "deeper", directory=True) is None
    assert unwritable(tmp_path / "f", directory=False) is None  # replaced by a rename beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def _run(*cmd) -> bool:
    import subprocess

    return subprocess.run(list(map(str, cmd)), capture_output=True).returncode == 0


def test_an_immutable_output_is_unwritable(tmp_path):
    from latticedraft.atomic import unwritable

    (tmp_path / "d").mkdir()
    (tmp_path / "file").write_text("x")
    if not _run("chattr", "+i", tmp_path / "d", tmp_path / "file"):
        pytest.skip("chattr +i is not available here")
    try:
        assert "chattr" in unwritable(tmp_path / "d", directory=True)[1]
        assert "chattr" in unwritable(tmp_path / "file", directory=False)[1]
        assert unwritable(tmp_path / "d" / "sub", directory=True)[0] == tmp_path / "d"
    finally:
        _run("chattr", "-i", tmp_path / "d", tmp_path / "file")


def test_a_mount_point_is_staged_inside_itself_and_a_read_only_one_is_unwritable(tmp_path):
    """An existing output directory on another file system than its parent (a mount point) is staged
    in itself, so that the renames never cross file systems (``Invalid cross-device link``)."""
    from latticedraft.atomic import stage_parent, unwritable

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if not _run("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt):
        pytest.skip("no tmpfs mount here")
    try:
        assert stage_parent(mnt) == mnt and stage_parent(tmp_path / "other") == tmp_path
        with atomic_dir(mnt) as stage:
            (stage / "demo.json").write_text("{}")
        assert [p.name for p in mnt.iterdir()] == ["demo.json"]
        assert _run("mount", "-o", "remount,ro", mnt)
        assert unwritable(mnt, directory=True)[0] == mnt and unwritable(mnt / "sub", directory=True)[0] == mnt
    finally:
        _run("umount", mnt)

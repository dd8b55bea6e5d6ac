"""Stale numba caches are dropped when any module of the package is newer than them."""

import os

from latticedraft.lattice._numba_cache import drop_stale


def _touch(path, mtime):
    path.write_text("x")
    os.utime(path, (mtime, mtime))


def test_caches_older_than_any_source_are_dropped(tmp_path):
    (tmp_path / "__pycache__").mkdir()
    _touch(tmp_path / "a.py", 1000)
    _touch(tmp_path / "b.py", 3000)  # edited after the caches were written
    _touch(tmp_path / "__pycache__" / "a._k-10.py311.nbi", 2000)
    _touch(tmp_path / "__pycache__" / "a._k-10.py311.1.nbc", 2000)
    _touch(tmp_path / "__pycache__" / "b._j-5.py311.nbi", 4000)
    _touch(tmp_path / "__pycache__" / "a.cpython-311.pyc", 500)  # not numba's: kept
    assert drop_stale(tmp_path) == 2
    assert sorted(p.name for p in (tmp_path / "__pycache__").iterdir()) == ["a.cpython-311.pyc", "b._j-5.py311.nbi"]
    assert drop_stale(tmp_path) == 0


def test_missing_cache_dir_or_sources_is_fine(tmp_path):
    assert drop_stale(tmp_path) == 0
    _touch(tmp_path / "a.py", 1000)
    assert drop_stale(tmp_path) == 0

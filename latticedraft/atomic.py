"""Write files and directories under a temporary name and rename them when complete."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def publish_mode(path: Path, directory: bool = False) -> None:
    """Give a file made by ``mkstemp``/``mkdtemp`` (mode 0600/0700) the usual umask mode."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


@contextlib.contextmanager
def atomic_file(path: str | Path, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it to ``path`` if the block succeeds, else delete it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    tmp_p = Path(tmp)
    try:
        yield tmp_p
        publish_mode(tmp_p)
        os.replace(tmp_p, path)
    except BaseException:
        tmp_p.unlink(missing_ok=True)
        raise


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` via ``atomic_file``, creating the parent directory; returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
    return path


@contextlib.contextmanager
def new_dirs(path: str | Path) -> Iterator[Path]:
    """Create directory ``path`` and its missing parents for the block; when the block fails, remove
    again those it created that are still empty (a failed download leaves no empty ``downloads/``)."""
    path = Path(path)
    made = [p for p in [path, *path.parents] if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield path
    except BaseException:
        for d in made:  # deepest first
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty staging directory beside ``path``; when the block succeeds its files (given the
    usual umask modes) become ``path`` (renamed whole if ``path`` does not exist, else moved in one by one, replacing files of
    the same name); when it fails the staging directory is removed and ``path`` is untouched."""
    path = Path(path)
    with new_dirs(path.parent):  # a failure leaves no empty parent behind either
        stage = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent))
        with _staged(stage, path):
            yield stage


@contextlib.contextmanager
def _staged(stage: Path, path: Path) -> Iterator[None]:
    """``atomic_dir``'s publication of ``stage`` as ``path`` when the block succeeds, its removal when not."""
    import shutil

    try:
        yield
        publish_mode(stage, directory=True)
        for f in stage.rglob("*"):
            publish_mode(f, directory=f.is_dir())
        if not path.exists():
            os.replace(stage, path)
            return
        for f in sorted(stage.iterdir()):
            target = path / f.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(f, target)
        stage.rmdir()
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise

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
    """Yield an empty staging directory beside ``path`` (``stage_parent``); when the block succeeds its files (given the
    usual umask modes) become ``path`` (renamed whole if ``path`` does not exist, else moved in one by one, replacing files of
    the same name); when it fails the staging directory is removed and ``path`` is untouched."""
    path = Path(path)
    with new_dirs(path.parent):  # a failure leaves no empty parent behind either
        stage = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=stage_parent(path)))
        with _staged(stage, path):
            yield stage


def stage_parent(path: Path) -> Path:
    """Where ``atomic_dir`` stages ``path``: beside it, or inside it where ``path`` is an existing
    directory on another file system than its parent (a mount point), so that every rename stays on
    one file system."""
    path = Path(path)
    try:
        if path.is_dir() and path.stat().st_dev != path.absolute().parent.stat().st_dev:
            return path
    except OSError:
        pass
    return path.parent


IMMUTABLE, APPEND_ONLY = 0x10, 0x20  # Linux inode flags (chattr +i, +a)


def _inode_flags(path: Path) -> int:
    """``path``'s Linux inode flags (``lsattr``), 0 where they cannot be read (another OS, no permission)."""
    import struct

    try:
        import fcntl

        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ImportError):
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(fd, 0x80086601, bytes(8))[:4])[0]  # FS_IOC_GETFLAGS
    except OSError:
        return 0
    finally:
        os.close(fd)


def unwritable(path: str | Path, directory: bool) -> tuple[Path, str] | None:
    """Why the writers above could not publish ``path`` (a ``directory``, else a file): None where
    they can, else (the directory or file at fault, why): a directory that cannot be written (its
    mode, a read-only mount, ``chattr +i``), an existing file that cannot be replaced (``chattr +i``
    or ``+a``). Creates nothing. The staging place is the one the writers use (``stage_parent``)."""
    p = Path(path).absolute()
    if p.exists() and _inode_flags(p) & (IMMUTABLE | APPEND_ONLY):
        return p, "immutable or append-only (chattr +i / +a)"
    anc = p.parent
    while not anc.exists():
        anc = anc.parent
    places = [anc] if not (directory and p.is_dir()) else list(dict.fromkeys([p, stage_parent(p)]))
    for d in places:
        if not d.is_dir():
            return d, "a file, not a directory"
        if not os.access(d, os.W_OK | os.X_OK):
            return d, "not writable (its permissions, a read-only file system or chattr +i)"
        if _inode_flags(d) & IMMUTABLE:
            return d, "immutable (chattr +i)"
    return None


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

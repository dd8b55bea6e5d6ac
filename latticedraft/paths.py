"""Where latticedraft finds its bundled data, its cache and KenLM's tools.

- ``repo_root()``: the checkout this package was installed from (editable install).
- ``cache_dir()``: ``$LATTICEDRAFT_CACHE``, else ``<repo>/.cache`` (set-up builds KenLM
  and the bundled 4-gram there), else ``~/.cache/latticedraft``.
- ``data_dir()``: ``$LATTICEDRAFT_DATA``, else ``<repo>/data`` (the bundled models).
- ``smollm2_dir()``: the real pretrained model ``latticedraft fetch smollm2`` writes into the cache;
  ``smollm2_lm_dir()``: its 4-gram (``fetch smollm2 --lm``).
- ``kenlm_tool(name)``: ``lmplz`` / ``build_binary`` from ``$LATTICEDRAFT_KENLM_BIN``,
  the cache, or ``PATH``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from latticedraft.errors import BuildError


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    env = os.environ.get("LATTICEDRAFT_CACHE")
    if env:
        return Path(env)
    if (repo_root() / "pyproject.toml").exists():
        return repo_root() / ".cache"
    return Path.home() / ".cache" / "latticedraft"


def data_dir() -> Path:
    env = os.environ.get("LATTICEDRAFT_DATA")
    return Path(env) if env else repo_root() / "data"


def default_lm_dir() -> Path:
    """The bundled 4-gram build that ``scripts/setup.sh`` makes."""
    return cache_dir() / "lm" / "stdlib-4gram"


def downloads_dir(cache=None) -> Path:
    """Where ``fetch`` keeps what it downloaded (wheels), so a rerun does not download again;
    under ``cache`` (default ``cache_dir()``)."""
    return Path(cache or cache_dir()) / "downloads"


def smollm2_dir(cache=None) -> Path:
    """SmolLM2-135M-Instruct as a float32 HF directory, written by ``latticedraft fetch smollm2``
    (it exists only after that command ran); under ``cache`` (default ``cache_dir()``)."""
    return Path(cache or cache_dir()) / "models" / "smollm2-135m-instruct"


def smollm2_lm_dir(cache=None) -> Path:
    """SmolLM2's own 4-gram (its tokenizer; ``fetch smollm2 --lm``, ``scripts/build_smollm2.sh``, the
    demo's first run), under ``cache`` (default ``cache_dir()``)."""
    return Path(cache or cache_dir()) / "lm" / "smollm2-4gram"


def kenlm_tool(name: str) -> Path:
    """Absolute path of KenLM's ``lmplz`` or ``build_binary``."""
    candidates = []
    env = os.environ.get("LATTICEDRAFT_KENLM_BIN")
    if env:
        candidates.append(Path(env) / name)
    candidates.append(cache_dir() / "kenlm" / "bin" / name)
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    found = shutil.which(name)
    if found:
        return Path(found)
    raise BuildError(
        f"KenLM's {name} not found in {', '.join(str(c.parent) for c in candidates)} or PATH; "
        "run `bash scripts/setup.sh` to build it, or set LATTICEDRAFT_KENLM_BIN"
    )


def describe(path: Path) -> str:
    """What is at ``path``, for error messages: "a file", "a directory", "missing" …"""
    p = Path(path)
    if p.is_dir():
        return "a directory"
    if p.is_file():
        return "a file"
    if p.exists():
        return "not a regular file"
    return "missing"


def require_file(path, what: str, fix: str) -> Path:
    """``path`` if it is a readable file, else ``InputError`` saying what is there instead and ``fix``."""
    return _require(path, what, fix, "a file")


def require_dir(path, what: str, fix: str) -> Path:
    """``path`` if it is a directory, else ``InputError`` saying what is there instead and ``fix``."""
    return _require(path, what, fix, "a directory")


def _require(path, what: str, fix: str, want: str) -> Path:
    from latticedraft.errors import InputError

    p = Path(path)
    found = describe(p)
    if found == want:
        return p
    if found == "missing":
        raise InputError(f"{what} {p} does not exist; {fix}")
    raise InputError(f"{what} {p} is {found}, not {want}; {fix}")


def check_writable(path, flag: str, kind: str) -> Path:
    """Check, before any work, that output ``path`` (``kind`` "file" or "directory") can be made.

    ``path`` must not be the other kind, and the writers (``atomic.py``) must be able to publish it:
    the nearest existing ancestor, or an existing output directory and the place it is staged in,
    writable (not read-only, not immutable), an existing file replaceable (``atomic.unwritable``).
    Creates nothing; ``InputError`` in one line names ``flag``, the directory at fault and the fix.
    """
    from latticedraft.atomic import unwritable
    from latticedraft.errors import InputError

    p = Path(path)
    if kind == "file" and p.is_dir():
        raise InputError(f"{flag} {p} is a directory; give a file path")
    if kind == "directory" and p.exists() and not p.is_dir():
        raise InputError(f"{flag} {p} is a file; give a directory path")
    bad = unwritable(p, kind == "directory")
    if bad is not None:
        at, why = bad
        where = "it" if at == p.absolute() else str(at)
        raise InputError(f"{flag} {p} cannot be written: {where} is {why}; choose another path")
    return p

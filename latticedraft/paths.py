"""Where latticedraft finds its bundled data, its cache and KenLM's tools.

- ``repo_root()``: the checkout this package was installed from (editable install).
- ``cache_dir()``: ``$LATTICEDRAFT_CACHE``, else ``<repo>/.cache`` (set-up builds KenLM
  and the bundled 4-gram there), else ``~/.cache/latticedraft``.
- ``data_dir()``: ``$LATTICEDRAFT_DATA``, else ``<repo>/data`` (the bundled models).
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

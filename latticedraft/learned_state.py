"""What latticedraft keeps under its cache (``paths.cache_dir()``): advisory, never why a command fails.

The cache makes commands faster (the acceptance counts and step costs a session learns, the
co-occurrence counts, token streams and continuations it derived), never different. Every kind of
file the package writes there is declared once as a ``Kind`` (its folder, what it holds, how it is
parsed, its schema check) and goes through the two functions below, so no reader or writer of the
cache can fail a command:

- ``read(kind, name, note)``: the entry's checked content, or None. None for a missing entry
  (silently), and for one that cannot be read, parsed, or fails its kind's check (types, shapes,
  finite values in range): then ``note`` hears one line naming the real file and why
  (``decode --verbose`` prints it) and the caller falls back (the priors, a new measurement, a new
  count).
- ``write(kind, name, save)``: writes the entry under a temporary name and renames it into place
  (``atomic.atomic_file``). Where the file system refuses (a directory where the file belongs, a
  file where a folder belongs, an immutable file, a read-only mount...), nothing is raised: one
  line on stderr, once per process and cache, says that the learned state could not be saved and
  where, and the command goes on; its output is the same.

What is built on purpose under the cache (``ARTIFACTS``: KenLM, n-gram LMs, fetched models and their
downloads, compiled kernels) is no learned state: what uses them checks them.

    >>> counts = read(ACCEPTANCE, "83c0.json", note=print)   # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from latticedraft.atomic import atomic_file
from latticedraft.paths import cache_dir

# folders under the cache that commands build on purpose (not learned state): who writes them
ARTIFACTS = {"kenlm": "scripts/setup.sh", "lm": "scripts/setup.sh, lm build, fetch smollm2 --lm",
             "models": "fetch smollm2", "downloads": "fetch", "kernels": "gpu/verify/fused_draft.py (compiled once)"}


@dataclass(frozen=True)
class Kind:
    """One kind of cache entry: ``folder`` under the cache, ``what`` it holds (for messages),
    ``parse(path)`` -> the content (raising on a damaged file), ``check(content)`` -> None where
    the content is valid, else why not (one phrase); ``example()`` -> one valid entry (its JSON
    value, or ``write(path)`` making the file), from which tests/test_learned_state.py makes damaged
    ones (a kind without one fails that test)."""

    folder: str
    what: str
    parse: Callable
    check: Callable
    example: Callable | None = None

    def path(self, name: str, root=None) -> Path:
        """The real path of entry ``name`` (under ``root``, default ``where``)."""
        return Path(root if root is not None else self.where) / name

    @property
    def where(self) -> Path:
        """This kind's folder in the cache (``$LATTICEDRAFT_CACHE`` respected)."""
        return cache_dir() / self.folder


KINDS: dict[str, Kind] = {}  # folder -> kind: every kind the package writes (its modules register them)


def kind(folder: str, what: str, check: Callable, parse: Callable | None = None, example: Callable | None = None) -> Kind:
    """Declare (and register) the kind of entry kept in ``folder`` (``parse`` default: JSON)."""
    k = Kind(folder, what, parse or read_json, check, example)
    KINDS[folder] = k
    return k


def read_json(path: Path):
    return json.loads(Path(path).read_text(encoding="utf-8"))


def read(k: Kind, name: str, note: Callable | None = None, check: Callable | None = None, root=None):
    """Entry ``name`` of kind ``k`` parsed and checked (``check``: a further check of this
    caller's, such as the entry's key), or None (see the module doc); ``note(line)`` hears why a
    file that is there is not used; ``root``: the folder in place of ``k.where``."""
    path = k.path(name, root)
    if not os.path.lexists(path):
        return None
    try:
        content = k.parse(path)
    except FileNotFoundError:
        return None
    except Exception as e:  # noqa: BLE001  (damaged in any way: the entry is absent)
        _note(note, k, path, _why(e))
        return None
    try:
        why = k.check(content) or (check(content) if check is not None else None)
    except Exception as e:  # noqa: BLE001  (a check that trips over a shape it did not expect)
        why = _why(e)
    if why:
        _note(note, k, path, why)
        return None
    return content


def _why(e: Exception) -> str:
    return (getattr(e, "strerror", None) or " ".join(str(e).split()) or type(e).__name__)[:200]


def _note(note: Callable | None, k: Kind, path: Path, why: str) -> None:
    if note is not None:
        note(f"{k.what}: {path} not used ({why}); as if absent")


_told: set = set()  # the caches whose failed save this process has reported (one line each)


def write(k: Kind, name: str, save, root=None) -> Path | None:
    """Write entry ``name`` of kind ``k`` (under ``root``, default ``k.where``): ``save`` is text,
    bytes, or ``save(tmp_path)`` writing the file; returns its path, or None where the file system
    refused (reported once on stderr)."""
    path = k.path(name, root)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path, suffix=path.suffix or ".tmp") as tmp:
            if isinstance(save, str):
                tmp.write_text(save, encoding="utf-8")
            elif isinstance(save, bytes):
                tmp.write_bytes(save)
            else:
                save(tmp)
        return path
    except OSError as e:
        unsaved(k, path, e)
        return None


def unsaved(k: Kind, path: Path, e: OSError) -> None:
    """Say once per process and cache, in one line on stderr, that learned state could not be saved."""
    root = str(cache_dir())
    if root in _told:
        return
    _told.add(root)
    print(f"latticedraft: the learned state could not be saved in {path.parent} ({k.what}, {path.name}: {_why(e)}); "
          "the output is unaffected (set LATTICEDRAFT_CACHE to a writable directory to keep it)",
          file=sys.stderr, flush=True)


# -- schema checks shared by the kinds ------------------------------------------------------------------
def fields(obj, *names) -> str | None:
    """None where ``obj`` is a dict holding ``names``, else why not."""
    if not isinstance(obj, dict):
        return f"a JSON {type(obj).__name__}, not an object"
    missing = [n for n in names if n not in obj]
    return f"no {', '.join(missing)}" if missing else None


def numbers(value, shape: tuple, what: str, low: float = 0.0, high: float = 2.0**53, integer: bool = False) -> str | None:
    """None where ``value`` is a nested list of ``shape`` (None: any length) of finite numbers in
    [``low``, ``high``] (``integer``: whole numbers), else why not."""
    import numpy as np

    if not _plain_numbers(value):
        return f"{what} holds something other than numbers"
    try:
        a = np.asarray(value, dtype=float)
    except (ValueError, TypeError):
        return f"{what} is ragged"
    if a.ndim != len(shape):
        return f"{what} is not {'x'.join('n' if s is None else str(s) for s in shape)} numbers"
    if any(s is not None and s != n for s, n in zip(shape, a.shape)):
        return f"{what} has shape {list(a.shape)}, not {[s if s is not None else 'n' for s in shape]}"
    if a.size and not (np.isfinite(a).all() and a.min() >= low and a.max() <= high):
        return f"{what} holds values outside [{low:g}, {high:g}] or not finite"
    if integer and a.size and not (a == np.round(a)).all():
        return f"{what} holds fractions"
    return None


def _plain_numbers(value) -> bool:
    """Whether ``value`` is a number (not a bool) or a list of such, nested to any depth."""
    if isinstance(value, list):
        return all(_plain_numbers(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite(x, low: float = 0.0) -> bool:
    """Whether ``x`` is a finite number (not a bool) >= ``low``."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= low

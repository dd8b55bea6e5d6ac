"""Corpus files: the Python standard library's source, user files (plain, ``.gz`` or ``.xz``), held-out splits.

A corpus *spec* is a path (file or directory, searched for ``*.py``, ``*.txt``, ``*.gz``, ``*.xz``)
or one of the names ``stdlib``, ``stdlib:train`` and ``stdlib:heldout``: the ``.py`` files of
this interpreter's standard library (test suites excluded), split by file, 5% held out.
"""

from __future__ import annotations

import gzip
import hashlib
import lzma
import sysconfig
from pathlib import Path
from typing import Iterable, Iterator

from latticedraft.errors import InputError

HELDOUT_FRACTION = 0.05
_SKIP_PARTS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list[Path]:
    """All ``.py`` files of the standard library but test suites, sorted by relative path."""
    root = stdlib_root()
    files = [p for p in root.rglob("*.py") if not (_SKIP_PARTS & set(p.relative_to(root).parts))]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def is_heldout(relpath: str, fraction: float = HELDOUT_FRACTION) -> bool:
    """Deterministic by-file split: sha1 of the relative path, first 4 bytes, below ``fraction``."""
    h = int.from_bytes(hashlib.sha1(relpath.encode()).digest()[:4], "big")
    return h < fraction * 2**32


def stdlib_split(which: str) -> list[Path]:
    """``which`` is ``"all"``, ``"train"`` or ``"heldout"``."""
    root = stdlib_root()
    files = stdlib_files()
    if which == "all":
        return files
    held = [is_heldout(p.relative_to(root).as_posix()) for p in files]
    if which == "heldout":
        return [p for p, h in zip(files, held) if h]
    if which == "train":
        return [p for p, h in zip(files, held) if not h]
    raise InputError(f"unknown stdlib split {which!r}; use stdlib, stdlib:train or stdlib:heldout")


def resolve_corpus(specs: Iterable[str | Path]) -> list[Path]:
    """Expand corpus specs into an ordered, de-duplicated list of existing, readable files."""
    out: list[Path] = []
    for spec in specs:
        s = str(spec)
        if s == "stdlib" or s.startswith("stdlib:"):
            out.extend(stdlib_split(s.split(":", 1)[1] if ":" in s else "all"))
            continue
        p = Path(s)
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.is_file() and q.suffix in {".py", ".txt", ".gz", ".xz"})
            if not found:
                raise InputError(f"corpus directory {p} holds no .py, .txt, .gz or .xz files; pass the files themselves")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise InputError(f"corpus file {p} does not exist; check the path given to --corpus")
    seen: set[Path] = set()
    uniq = [p for p in out if not (p in seen or seen.add(p))]
    if not uniq:
        raise InputError("no corpus files given; pass --corpus FILE [FILE ...] or --corpus stdlib")
    return uniq


_DECOMPRESS = {".gz": gzip.decompress, ".xz": lzma.decompress}


def read_text(path: Path, encoding_errors: str = "strict") -> str:
    """Read a UTF-8 text file (``.gz`` and ``.xz`` transparently).

    ``encoding_errors="strict"`` raises ``InputError`` naming the file and byte offset of the
    first invalid byte; ``"replace"`` substitutes U+FFFD.
    """
    try:
        raw = _DECOMPRESS.get(path.suffix, bytes)(path.read_bytes())
    except PermissionError as e:
        raise InputError(f"corpus file {path} is not readable ({e.strerror}); fix its permissions") from e
    except (OSError, EOFError, lzma.LZMAError) as e:
        raise InputError(f"corpus file {path} cannot be read ({e}); is it a valid file, .gz or .xz archive?") from e
    try:
        return raw.decode("utf-8", errors=encoding_errors)
    except UnicodeDecodeError as e:
        raise InputError(
            f"corpus file {path} is not UTF-8: invalid byte 0x{raw[e.start]:02x} at byte offset {e.start}; "
            "convert it to UTF-8 or pass --encoding-errors replace"
        ) from e


def iter_sentences(text: str, unit: str = "paragraphs") -> Iterator[str]:
    """The n-gram LM's "sentences" of ``text``: ``lines`` (KenLM's convention: each non-blank line,
    without its newline), ``paragraphs`` (``iter_chunks``) or ``files`` (the whole text at once)."""
    if unit == "lines":
        return (ln for ln in text.splitlines() if ln.strip())
    if unit == "paragraphs":
        return iter_chunks(text)
    if unit == "files":
        return iter([text] if text.strip() else [])
    raise InputError(f"--sentences {unit!r}: use lines, paragraphs or files")


def iter_chunks(text: str) -> Iterator[str]:
    """Split text into paragraphs at blank lines; each chunk keeps its newlines (code layout is data).

    Chunks are the "sentences" of the n-gram LM (one lmplz line each). Blank lines
    themselves are folded into the preceding chunk so no text is lost.
    """
    buf: list[str] = []
    for line in text.splitlines(keepends=True):
        buf.append(line)
        if line.strip() == "" and any(b.strip() for b in buf):
            yield "".join(buf)
            buf = []
    if buf and any(b.strip() for b in buf):
        yield "".join(buf)

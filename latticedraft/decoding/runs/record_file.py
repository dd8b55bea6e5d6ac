"""The JSONL record files of ``decode --output``: settings fingerprint, scanning, appending, merging.

One line per prompt, ``{"id": ..., "fingerprint": ..., "settings": {...}, "tokens": [...], ...}``.
A line is complete when it ends with a newline: each record is written with its newline in one
``write_all`` after the previous one finished, so a crash (even SIGKILL during a write) can only
leave one torn line, at the end. ``scan`` finds the complete records and where the torn tail
starts; ``RecordWriter`` cuts that tail off before it appends (the torn prompt is decoded again,
never duplicated). Every complete line is kept byte for byte: merging reorders lines, it never
re-encodes them.

Files of one output ``OUT``: ``OUT`` itself, and ``OUT.part-R-of-W`` written by rank R of a
W-process run (``shards.py``) until rank 0 merges them into ``OUT``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from latticedraft.atomic import atomic_file
from latticedraft.decoding.runs import line_kinds as lk
from latticedraft.errors import InputError

TIMING_FIELDS = ("seconds", "share_seconds")  # differ between runs of the same settings
PLACEMENT_FIELDS = ("rank", "world_size")  # which process decoded the prompt


def fingerprint(settings: dict) -> str:
    """16 hex digits of SHA-256 over the canonical JSON of ``settings``."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def describe_difference(old: dict, new: dict) -> str:
    """``"max_new_tokens 12 there, 16 now"`` for every setting that differs (sorted by name)."""
    keys = sorted(set(old) | set(new))
    diffs = [f"{k} {json.dumps(old.get(k))} there, {json.dumps(new.get(k))} now" for k in keys if old.get(k) != new.get(k)]
    return "; ".join(diffs) or "settings recorded differently"


def part_path(out: Path, rank: int, world_size: int) -> Path:
    return out.with_name(f"{out.name}.part-{rank}-of-{world_size}")


def part_files(out: Path) -> list[Path]:
    """Every ``OUT.part-R-of-W`` beside ``out`` (from this run or an earlier one), sorted."""
    pat = re.compile(re.escape(out.name) + r"\.part-(\d+)-of-(\d+)$")
    if not out.parent.is_dir():
        return []
    found = [(tuple(map(int, m.groups())), p) for p in out.parent.iterdir() if (m := pat.match(p.name))]
    return [p for _, p in sorted(found)]


@dataclass
class Scan:
    """The complete records of one file: ``lines[id]`` is the record's line (bytes, newline
    included), ``order`` the ids in file order; ``complete_bytes`` is where a torn tail begins
    (``torn`` says whether there is one)."""

    path: Path
    lines: dict = field(default_factory=dict)
    order: list = field(default_factory=list)
    records: dict = field(default_factory=dict)
    complete_bytes: int = 0
    torn: bool = False


def not_records(flag: str, path, line: int, why: str, data: bytes, foreign_fix: str, line_fix: str) -> str:
    """The refusal for a file that should hold ``decode --output`` records but whose line ``line``
    is ``why`` instead: a file of another kind when that is its first line (named by
    ``line_kinds.describe_file``; ``foreign_fix``), else a record file that was edited or joined
    with another (``line_fix``, formatted with ``line``)."""
    if line == 1:
        kind = lk.describe_file(data)
        return (f"{flag} {path} is not a record file of `latticedraft decode --output`: it looks like {kind}"
                f"{'' if kind in lk.WHOLE_FILE_KINDS else f' (line 1 is {why})'}; {foreign_fix}")
    return (f"{flag} {path} line {line} is {why}, not a record, though the line(s) before it are records (the file "
            f"was edited or joined with another); {line_fix.format(line=line)}")


def scan(path: Path, settings: dict, flag: str = "--output") -> Scan:
    """The complete records of ``path`` (missing: none). ``InputError`` when a line is no record
    of ``decode --output`` (naming what it is instead), repeats an id, or was written with other
    settings (naming them). Bytes after the last newline are a torn record to cut off only when
    they start as a record does; anything else there is refused, never cut."""
    fp = fingerprint(settings)
    s = Scan(Path(path))
    if not s.path.exists():
        return s
    data = s.path.read_bytes()
    end = data.rfind(b"\n") + 1
    s.complete_bytes, s.torn = end, end < len(data)
    lines = data[:end].split(b"\n")[:-1]
    foreign_fix = f"choose another {flag} (a run appends its records to it)"
    if s.torn and not lk.is_torn_tail(data[end:]):
        n = len(lines) + 1
        raise InputError(not_records(flag, path, n, lk.describe_line(data[end:]) or "a record without its newline",
                                     data, foreign_fix, "remove line {line} or write to another " + flag))
    for n, raw in enumerate(lines, 1):
        rec, why = lk.parse_line(raw)
        if why is not None:
            raise InputError(not_records(flag, path, n, why, data, foreign_fix,
                                         "remove line {line} or write to another " + flag))
        if rec["fingerprint"] != fp:
            raise InputError(f"{flag} {path} line {n} was written with other settings "
                             f"({describe_difference(rec.get('settings') or {}, settings)}); "
                             "rerun with the same settings to --resume, or write to another --output")
        if rec["id"] in s.lines:
            raise InputError(f"{flag} {path} line {n} repeats the record of prompt id {lk.show_id(rec['id'])}; "
                             "remove one of the two lines")
        s.lines[rec["id"]] = raw + b"\n"
        s.records[rec["id"]] = rec
        s.order.append(rec["id"])
    return s


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte of ``data`` is written."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class RecordWriter:
    """Appends records to one file, first cutting off the torn tail that ``scan`` found. The file
    (and its directory) is opened on the first record, so a run that fails before its first
    record leaves no output behind and a torn tail as it was."""

    def __init__(self, path: Path, scanned: Scan | None = None):
        self.path = Path(path)
        self.keep = scanned.complete_bytes if scanned is not None else 0
        self.fd = None

    def _open(self) -> int:
        if self.fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o666)
            os.ftruncate(self.fd, self.keep)
            os.lseek(self.fd, 0, os.SEEK_END)
        return self.fd

    def append(self, rec: dict) -> None:
        _write_all(self._open(), (json.dumps(rec, ensure_ascii=False) + "\n").encode())

    def sync(self) -> None:
        if self.fd is not None:
            os.fsync(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = None


def merge(out: Path, scans: list[Scan], order: list) -> tuple[int, list]:
    """Write every complete record of ``scans`` into ``out`` (atomically): ids in ``order`` first,
    then records of ids outside it in the order found (never dropped). The first file holding an
    id wins (the others hold the same record, left by a crash between rename and clean-up).
    Removes the part files among ``scans``. Returns (records written, ids outside ``order``)."""
    lines, found = {}, []
    for s in scans:
        for i in s.order:
            if i not in lines:
                lines[i] = s.lines[i]
                found.append(i)
    known = set(order)
    extra = [i for i in found if i not in known]
    body = [lines[i] for i in order if i in lines] + [lines[i] for i in extra]
    current = scans[0] if scans and scans[0].path == Path(out) else None
    if not (current is not None and len(scans) == 1 and not current.torn and current.order == [i for i in order
                                                                                              if i in lines] + extra):
        with atomic_file(out) as tmp:
            tmp.write_bytes(b"".join(body))
    for s in scans:
        if s.path != Path(out):
            s.path.unlink(missing_ok=True)
    return len(body), extra

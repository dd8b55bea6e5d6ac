"""The CLI's contract for a refused run, checked the same way by every test that needs it:
exit 2, the last stderr line ``error: ...`` naming the option or file, nothing on stdout, no
traceback, and nothing created, changed or removed under the watched directories (hashed before
and after, hidden files included)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def snapshot(*roots) -> dict[str, str]:
    """``{path: sha256 of its bytes, or "dir"}`` for every entry under ``roots`` (the roots included)."""
    out = {}
    for root in map(Path, roots):
        if not root.exists():
            out[str(root)] = "missing"
            continue
        for p in sorted([root, *root.rglob("*")]):
            out[str(p)] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def refused(capsys, argv: list, *needles: str, watch=()) -> str:
    """Run ``latticedraft argv`` in this process and check the refusal contract; returns the error line.

    Every string of ``needles`` must be in the last stderr line; ``watch``: directories that must
    come out byte for byte as they went in (put the run's output's parent here, so a file left
    behind is caught too)."""
    from latticedraft.cli import main

    before = snapshot(*watch)
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert rc == 2, (rc, cap.err)
    assert lines and lines[-1].startswith("error: "), cap.err
    for n in needles:
        assert n in lines[-1], (n, lines[-1])
    assert cap.out == "", cap.out
    assert "Traceback" not in cap.err, cap.err
    assert snapshot(*watch) == before, "a refused run changed the watched directories"
    return lines[-1]

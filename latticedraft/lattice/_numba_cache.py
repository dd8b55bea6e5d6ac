"""Drop stale numba caches of this package's compiled kernels.

numba's on-disk cache (``njit(cache=True)``) checks only the source file that defines a kernel,
but the exact search kernels inline ``njit`` functions from sibling modules (``lm_tables._step``
into ``triple_dp``, ``state_dp`` and ``batched``). After an edit to one module the cached
machine code of the others would still run the old version. ``drop_stale`` removes every cache
file older than the newest source file of the package, so numba compiles afresh (once) instead.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# sources outside the package whose njit functions the kernels inline (the arc hash)
INLINED = (PACKAGE_DIR.parent / "lm" / "search_tables.py",)


def drop_stale(package_dir: Path = PACKAGE_DIR, inlined=None) -> int:
    """Delete ``__pycache__/*.nbi|*.nbc`` older than the newest ``*.py`` in ``package_dir`` (or
    than ``inlined``, default ``INLINED`` for the package itself); returns how many were deleted.
    Never raises (a read-only install keeps its caches)."""
    if inlined is None:
        inlined = INLINED if package_dir == PACKAGE_DIR else ()
    try:
        newest = max(p.stat().st_mtime for p in [*package_dir.glob("*.py"), *(Path(f) for f in inlined)])
        stale = [f for f in (package_dir / "__pycache__").glob("*.nb[ic]") if f.stat().st_mtime < newest]
    except (OSError, ValueError):
        return 0
    dropped = 0
    for f in stale:
        try:
            f.unlink()
            dropped += 1
        except OSError:
            pass
    return dropped

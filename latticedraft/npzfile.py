"""Reading ``.npz`` archives that latticedraft wrote, with one clear error for anything else.

``np.load`` on bytes that are not a zip archive falls back to unpickling and then advises
loading "unsafely" with ``allow_pickle=True``; that advice is never right for these files.
``read_npz`` checks the zip signature first and turns every reading error into one line
that names the file, what it should have been and how to make one.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from latticedraft.errors import InputError

_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")


def read_npz(path, what: str, fix: str, error=InputError) -> dict[str, np.ndarray]:
    """All arrays of the ``.npz`` at ``path`` (no pickles), or ``error`` naming ``what`` and ``fix``.

    >>> read_npz("lat.npz", "a lattice written by Sausage.save", "write one with Sausage.save")  # doctest: +SKIP
    """
    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(4)
    except IsADirectoryError:
        raise error(f"{p} is a directory, not {what}; {fix}") from None
    except OSError as e:
        raise error(f"{p} cannot be read ({e.strerror}); {fix}") from e
    if head not in _ZIP_MAGIC:
        raise error(f"{p} is not {what} (not an .npz archive); {fix}")
    try:
        with np.load(p, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, KeyError, RuntimeError) as e:
        reason = " ".join(str(e).split())[:120]
        raise error(f"{p} is truncated or corrupt, not {what} ({reason}); {fix}") from e

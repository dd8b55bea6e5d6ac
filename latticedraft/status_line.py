"""One progress line of our own for a long step that has no bar: on a terminal it stands while the
step runs and is erased when the step ends, so what stays is the step's result or its one-line
error; where stderr is no terminal (a log, a pipe) nothing is written, as latticedraft's bars do.

    >>> with status("importing SmolLM2-135M-Instruct.Q4_1.gguf (about half a minute)"):   # doctest: +SKIP
    ...     import_gguf(...)
"""

from __future__ import annotations

import contextlib
import sys


@contextlib.contextmanager
def status(text: str, file=None):
    """Show ``text`` (with " ...") on ``file`` (default stderr) while the block runs, if it is a terminal."""
    f = file or sys.stderr
    shown = bool(getattr(f, "isatty", lambda: False)())
    if shown:
        f.write(f"{text} ...")
        f.flush()
    try:
        yield
    finally:
        if shown:
            f.write("\r\033[K")  # back to the line's start and clear it
            f.flush()

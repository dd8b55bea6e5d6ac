"""What an interrupted command (Ctrl-C, SIGINT) kept, and how to continue: its last line.

A command that writes as it goes says, while it works, what an interrupt would leave behind::

    with interrupts.keeping(lambda: f"{n} complete records are kept in {out}; rerun the same "
                                    "command with --resume to decode the rest"):
        ...

``describe`` is called when the interrupt passes through the block (so it reports the state at
that moment) and attached to the ``KeyboardInterrupt``; the innermost block that sees it wins.
The CLI then ends with ``error: interrupted; <that description>`` (``message``), exit 130.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

NOTHING_KEPT = "no output file was left half-written (files appear only when complete); rerun the command"


@contextlib.contextmanager
def keeping(describe: Callable[[], str]) -> Iterator[None]:
    """Attach ``describe()`` to a ``KeyboardInterrupt`` raised inside the block, unless an inner block did."""
    try:
        yield
    except KeyboardInterrupt as e:
        if getattr(e, "kept", None) is None:
            try:
                e.kept = describe()
            except Exception:  # a broken description must not hide the interrupt
                e.kept = None
        raise


def message(e: KeyboardInterrupt) -> str:
    """The CLI's last line for interrupt ``e``: what was kept and how to continue."""
    return "interrupted; " + (getattr(e, "kept", None) or NOTHING_KEPT)

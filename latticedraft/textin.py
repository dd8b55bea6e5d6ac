"""Text the user hands in: files or ``-`` (standard input), and command-line strings, as UTF-8.

``read_text_arg`` reads a file (or stdin for ``-``) and decodes it strictly, naming the option,
the file and the byte offset of the first invalid byte. ``check_text_value`` refuses a
command-line string that held non-UTF-8 bytes (Python keeps them as lone surrogates, which
tokenizers reject with a ``TypeError``).
"""

from __future__ import annotations

import sys

from latticedraft.errors import InputError

STDIN = "-"


def read_bytes_arg(value, flag: str, fix: str) -> bytes:
    """The bytes of file ``value``, or of standard input when ``value`` is ``-``."""
    if str(value) == STDIN:
        return sys.stdin.buffer.read()
    from latticedraft.paths import require_file

    p = require_file(value, f"{flag}", fix)
    try:
        return p.read_bytes()
    except OSError as e:
        raise InputError(f"{flag} {p} cannot be read ({e.strerror}); {fix}") from e


def read_text_arg(value, flag: str, fix: str) -> str:
    """UTF-8 text of file ``value`` (or stdin for ``-``); ``InputError`` names ``flag`` and the first bad byte."""
    raw = read_bytes_arg(value, flag, fix)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        where = "standard input" if str(value) == STDIN else str(value)
        raise InputError(f"{flag} {where} is not UTF-8 text: invalid byte 0x{raw[e.start]:02x} at byte offset "
                         f"{e.start}; convert it to UTF-8") from None


def check_text_value(text: str | None, flag: str) -> str | None:
    """``text`` unchanged, or ``InputError`` when it holds bytes that were not UTF-8 on the command line."""
    if text is None:
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(f"{flag} holds bytes that are not UTF-8 (at character {e.start}); "
                         "pass UTF-8 text, or use a file with --prompts / stdin with -") from None
    return text

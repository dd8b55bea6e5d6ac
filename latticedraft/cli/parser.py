"""The argument parser of every command: help that shows defaults, one-line usage errors."""

from __future__ import annotations

import argparse
import sys


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default (unless the text already states one)."""

    def _get_help_string(self, action):
        h = action.help or ""
        if (not action.option_strings or action.required or action.default is argparse.SUPPRESS
                or "default" in h.lower()):
            return h
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return f"{h} (default: {'off' if action.default is False else 'on'})"
        d = action.default
        shown = "none" if d is None else " ".join(map(str, d)) if isinstance(d, (list, tuple)) else str(d)
        return f"{h} (default: {shown.replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """``ArgumentParser`` whose help shows defaults; sub-command parsers inherit it."""

    def __init__(self, *args, **kw):
        kw.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kw)

    def error(self, message):
        """Usage, then one last line ``error: ...`` naming the option and where the help is (exit 2)."""
        self.print_usage(sys.stderr)
        self.exit(2, f"error: {message}; see `{self.prog} --help`\n")


def commands(parser: argparse.ArgumentParser, path=()):
    """``(("lm", "build"), parser)`` for every leaf command under ``parser``."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, p in subs[0].choices.items():
        yield from commands(p, (*path, name))

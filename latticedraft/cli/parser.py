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


def finish(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give every command under ``parser`` its ``--verbose`` and record its options' defaults and
    longest flags (``_defaults``, ``_flags``: what ``checks.given`` compares against); returns it."""
    from latticedraft.quiet import add_verbose_arg

    for _, p in commands(parser):
        add_verbose_arg(p)
        opts = [x for x in p._actions if x.option_strings and x.dest not in ("help", "verbose")]
        p.set_defaults(_defaults={x.dest: p.get_default(x.dest) for x in opts},
                       _flags={x.dest: max(x.option_strings, key=len) for x in opts})
    return parser

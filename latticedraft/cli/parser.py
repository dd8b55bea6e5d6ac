"""The argument parser of every command: help that shows defaults, usage errors in one line
(``error: <what>``) and one hint (``see: latticedraft <command> --help``), empty values refused."""

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

    def error(self, message, prog: str | None = None):
        """``error: <what>`` naming the option, then one hint line, where the help is (``prog``'s; default
        this parser's) (exit 2); never argparse's usage block."""
        self.exit(2, f"error: {' '.join(str(message).split())}\nsee: {prog or self.prog} --help\n")

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but words no command takes are named with the help of the command given
        (its parser's ``prog``, which ``build_parser`` stores as ``_prog``), not of the top level."""
        ns, extra = self.parse_known_args(args, namespace)
        if extra:
            self.error(f"unrecognized arguments: {' '.join(extra)}", getattr(ns, "_prog", None))
        return ns


def record_typed(action: argparse.Action) -> None:
    """Make ``action`` add its dest to the namespace's ``_typed`` set when its option is typed
    (argparse keeps no trace of an option given at its default value)."""
    base = type(action)

    class Typed(base):
        def __call__(self, parser, namespace, values, option_string=None):
            super().__call__(parser, namespace, values, option_string)
            namespace._typed = getattr(namespace, "_typed", frozenset()) | {self.dest}

    Typed.__name__ = base.__name__
    action.__class__ = Typed


class NonEmpty:
    """An option's ``type`` that refuses an empty value (``--model ''`` would name the current
    directory) naming what to give, then converts with the option's own type."""

    def __init__(self, inner, what: str):
        self.inner, self.what = inner, what
        self.__name__ = getattr(inner, "__name__", "value")  # argparse names the type in its messages

    def __call__(self, text: str):
        if text == "":
            raise argparse.ArgumentTypeError(f"the value is empty; give {self.what}")
        return text if self.inner is None else self.inner(text)


def refuse_empty_values(parser: argparse.ArgumentParser) -> None:
    """Give every text or path option of ``parser`` (lists of ids aside) the ``NonEmpty`` type."""
    from pathlib import Path

    for a in parser._actions:
        if (a.nargs in (None, "?", "+") and a.type in (None, str, Path) and not a.choices and a.default != ""
                and isinstance(a, argparse._StoreAction)):
            a.type = NonEmpty(a.type, _what(a))


def _what(action) -> str:
    """What an option takes, for ``NonEmpty``'s message: "a directory path", "a file path" ..."""
    m = action.metavar or ""
    if "DIR" in m or action.dest in ("base", "cache"):
        return "a directory path"
    if m.startswith(("FILE", "OUT", "LATTICE", "LM.")) or "." in m:
        return "a file path"
    return "a path" if "PATH" in m else "a non-empty value"


def commands(parser: argparse.ArgumentParser, path=()):
    """``(("lm", "build"), parser)`` for every leaf command under ``parser``."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, p in subs[0].choices.items():
        yield from commands(p, (*path, name))


def finish(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give every command under ``parser`` its ``--verbose``, refuse empty option values, record
    which options were typed, and record each command's defaults, longest flags and positionals'
    names (``_prog``, ``_defaults``, ``_flags``: what ``checks.given`` compares against)."""
    from latticedraft.quiet import add_verbose_arg

    for _, p in commands(parser):
        add_verbose_arg(p)
        refuse_empty_values(p)
        opts = [x for x in p._actions if x.option_strings and x.dest not in ("help", "verbose")]
        for x in opts:
            record_typed(x)
        named = {x.dest: x.metavar or x.dest.upper() for x in p._actions if not x.option_strings}  # positionals
        p.set_defaults(_prog=p.prog, _defaults={x.dest: p.get_default(x.dest) for x in opts},
                       _flags={**named, **{x.dest: max(x.option_strings, key=len) for x in opts}})
    return parser

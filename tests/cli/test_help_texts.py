"""``--help`` says what each command does (issue 57): every description is written for the user,
not a module docstring; the top level lists every command on one line at 80 columns; ``decode``'s
names the lossless and the approximate methods as the registry declares them."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import re

import pytest

import latticedraft.cli
from latticedraft.cli import build_parser
from latticedraft.decoding import registry


def parsers(parser: argparse.ArgumentParser, path=()):
    """``(path, parser)`` of the top level, every group and every command."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, (*path, name))


PARSERS = list(parsers(build_parser()))
DOCSTRINGS = [" ".join((importlib.import_module(m.name).__doc__ or "").split())
              for m in pkgutil.iter_modules(latticedraft.cli.__path__, "latticedraft.cli.")] + [
    " ".join(latticedraft.cli.__doc__.split())]


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("path,parser", PARSERS, ids=[" ".join(p) or "latticedraft" for p, _ in PARSERS])
def test_every_description_is_written_for_the_user(path, parser):
    text = _words(parser.description or "")
    assert len(text) > 20, f"`latticedraft {' '.join(path)}` has no description"
    first = re.split(r"(?<=[.;:])\s", text)[0]
    assert not any(first in doc for doc in DOCSTRINGS), f"`{' '.join(path)}` shows a module docstring: {first!r}"


def test_the_top_level_lists_every_command_on_one_line(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    parser = build_parser()
    text = parser.format_help()
    assert "Faster language-model decoding" in text
    groups = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    listing = text.split("<group>\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [line.split()[0] for line in listing] == list(groups.choices), listing
    assert all(len(line.split(None, 1)) == 2 for line in listing)  # a name and its line, no continuation


def test_decode_names_the_lossless_and_the_approximate_methods_from_the_registry():
    decode = dict(PARSERS)[("decode",)]
    text = _words(decode.description)
    lossless, rest = text.split("The lossless methods (", 1)
    named, after = rest.split(")", 1)
    assert named.split(", ") == [m.name for m in registry.methods().values() if m.lossless]
    lossy = [m.name for m in registry.methods().values() if not m.lossless]
    assert lossy and f"{' and '.join(lossy)} sample approximately (not lossless)" in after
    assert "parallel BPD" not in text and "equals greedy decoding." not in text

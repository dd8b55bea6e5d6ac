"""``--help`` of every command: a description, and every option's default stated (issue 17)."""

from __future__ import annotations

import argparse

import pytest

from latticedraft.cli import build_parser
from latticedraft.cli.parser import commands as _commands

COMMANDS = list(_commands(build_parser()))


@pytest.mark.parametrize("path,parser", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_verb_has_a_description_and_every_option_its_default(path, parser):
    assert parser.description and len(parser.description) > 20, f"`{' '.join(path)}` has no description"
    fmt = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or action.required or isinstance(action, (argparse._HelpAction,
                                                                               argparse._VersionAction)):
            continue
        text = fmt._expand_help(action) if action.help else ""
        assert "default" in text.lower(), f"`{' '.join(path)} {action.option_strings[-1]}` states no default: {text!r}"


def test_out_is_spelled_the_same_everywhere_and_says_file_or_directory():
    for path, parser in COMMANDS:
        outs = [a for a in parser._actions if "--out" in a.option_strings]
        for a in outs:
            assert "-o" in a.option_strings, f"`{' '.join(path)} --out` has no -o"
            assert "file" in a.help or "directory" in a.help, f"`{' '.join(path)} --out` does not say what it is"


def test_history_is_one_spelling_everywhere():
    from latticedraft.cli.args import parse_ids as _ids

    for path, parser in COMMANDS:
        for a in parser._actions:
            if "--history" in a.option_strings:
                assert a.nargs == "*" and a.type is None, " ".join(path)
    assert _ids(["1,2", "3"]) == _ids(["1 2 3"]) == _ids("1, 2, 3") == [1, 2, 3]


@pytest.mark.parametrize("argv", [["--version"], ["decode", "--help"], ["train", "heads", "--help"]])
def test_help_and_version_load_no_torch(argv):
    """Building the parser and printing help or the version imports neither torch nor transformers
    (each method module loads its decoder when it runs): the reason they start in well under a second."""
    import subprocess
    import sys

    code = ("import sys\nfrom latticedraft.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
            "assert not heavy, heavy\n")
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

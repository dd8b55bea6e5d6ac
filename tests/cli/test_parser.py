"""Usage errors (issue 59, class D): for every command and every kind of bad usage argparse finds (an
unknown option, a value outside the choices, a number that is not one, an empty text or path, a
missing required argument, two options that exclude each other, an unknown verb), stderr is exactly
``error: <what>`` naming the option, then one hint ``see: latticedraft <command> --help``; exit 2;
never argparse's usage block."""

from __future__ import annotations

import argparse

import pytest

from latticedraft.cli import build_parser, main
from latticedraft.cli.parser import NonEmpty, commands

COMMANDS = list(commands(build_parser()))


def _required(p) -> list[str]:
    """Placeholder words for ``p``'s required arguments (the first of a required exclusive group)."""
    first = {g._group_actions[0].dest for g in p._mutually_exclusive_groups if g.required}
    words = []
    for a in p._actions:
        if not a.option_strings and a.nargs not in ("?", "*") and not isinstance(a, argparse._SubParsersAction):
            words.insert(0, "x")  # positionals first
        elif a.option_strings and (a.required or a.dest in first):
            words += [a.option_strings[-1], "1"]
    return words


def _bad_usages():
    """(argv, what the error line must name) for every option of every command that argparse checks."""
    for name, p in COMMANDS:
        need = _required(p)
        yield [*name, *need, "--no-such-option"], "--no-such-option"
        for a in p._actions:
            if not a.option_strings or isinstance(a, (argparse._StoreTrueAction, argparse._HelpAction)):
                continue
            flag = max(a.option_strings, key=len)
            t = getattr(a.type, "inner", a.type)
            if a.choices:
                yield [*name, *need, flag, "bogus-choice"], flag
            elif t in (int, float):
                yield [*name, *need, flag, "abc"], flag
            elif isinstance(a.type, NonEmpty):
                yield [*name, *need, flag, ""], flag
        for g in p._mutually_exclusive_groups:
            x, y = g._group_actions[:2]
            if x.option_strings and y.option_strings and not isinstance(x, argparse._StoreTrueAction):
                yield [*name, *need, x.option_strings[-1], "1", y.option_strings[-1], "1"], "not allowed with"
        if any(a.required or (not a.option_strings and a.nargs not in ("?", "*")) for a in p._actions):
            yield list(name), "required"
    yield ["fetch", "llama"], "invalid choice: 'llama'"
    yield ["no-such-group"], "invalid choice"


CASES = list(_bad_usages())


@pytest.mark.parametrize("argv, named", CASES, ids=[" ".join(map(repr, c[0])) for c in CASES])
def test_a_usage_error_is_one_line_and_one_hint(capsys, argv, named):
    with pytest.raises(SystemExit) as e:
        main(argv)
    cap = capsys.readouterr()
    lines = cap.err.splitlines()
    command = " ".join(next((name for name, _ in COMMANDS if tuple(argv[:len(name)]) == name), argv[:1]))
    assert e.value.code == 2 and cap.out == ""
    assert len(lines) == 2 and lines[0].startswith("error: ") and named in lines[0], lines
    hint = "see: latticedraft --help" if argv == ["no-such-group"] else f"see: latticedraft {command} --help"
    assert lines[1] == hint, lines


@pytest.mark.parametrize("argv", [["decode", "--model", ""], ["decode", "--chat", "--prompt", ""],
                                  ["train", "heads", "--base", "", "--corpus", "x", "-o", "y"]])
def test_an_empty_path_or_text_is_named_as_empty(capsys, argv):
    with pytest.raises(SystemExit):
        main(argv)
    first = capsys.readouterr().err.splitlines()[0]
    assert "the value is empty" in first and "config.json" not in first, first

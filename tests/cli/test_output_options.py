"""The overwrite rule holds for every command that writes (issue 59, class A): the test walks the
parser, finds every declared output (``output_options``) and runs the rule's cases on each:

- its own earlier output is refused without ``--force`` (``--resume`` where the command appends),
  and with it the command is let through;
- ``--force`` onto another command's output is refused;
- ``--force`` onto its own input is refused;
- ``--force`` into a foreign directory (non-empty, not ours), or onto a foreign file, is refused.

Every refusal keeps the contract (``tests/contract.py``: exit 2, one ``error:`` line, nothing on
stdout, the directories byte for byte as before). The commands themselves never run here: the rule
runs before any of them starts (``main`` claims the outputs first), so each case takes milliseconds
and loads no model."""

from __future__ import annotations

import argparse
import json
import re
import struct
import zipfile
from pathlib import Path

import pytest

from latticedraft import cli
from latticedraft import outputs as o
from latticedraft.cli.output_options import DIRECTORY, FILE, IN_PLACE, declared
from latticedraft.cli.parser import commands
from tests.contract import refused

WRITERS = [(name, out) for name, p in commands(cli.build_parser()) for out in declared(p)]
PARSERS = dict(commands(cli.build_parser()))


def _png_drawn(path: Path) -> None:
    text = b"Software\0latticedraft lattice draw"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(text)) + b"tEXt" + text + b"\0" * 4)


def _npz(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for n in ("version.npy", "state_offsets.npy", "arc_label.npy"):
            z.writestr(n, b"")


SAMPLES = {  # FileKind.what -> a writer of a minimal file that kind recognises as its own
    "tuned settings (tune's JSON)": lambda p: p.write_text(json.dumps({"alphas": {}, "sweep": {}})),
    "a lattice picture": _png_drawn,
    "an OpenFst LM (lm.fst)": lambda p: p.write_bytes(struct.pack("<i", 2125659606) + b"\0" * 16),
    "the CSR cache of an LM (lm.npz)": _npz,
    "records of `decode --output`": lambda p: p.write_text('{"id": 1, "fingerprint": "ab", "tokens": []}\n'),
}
FILE_KINDS = {k.what: k for _, out in WRITERS if out.form == FILE for k in out.kinds}


def fake_output(d: Path, kind: o.OutputKind) -> Path:
    """Directory ``d`` holding ``kind``'s markers only (a tagged first marker with its "kind")."""
    d.mkdir(parents=True)
    for i, m in enumerate(kind.markers):
        (d / m).write_text(json.dumps({"kind": kind.tag[0]}) if i == 0 and kind.tag else "{}")
    return d


def _placeholder(a: argparse.Action, where: Path) -> str:
    if a.choices:
        return str(next(iter(a.choices)))
    t = getattr(a.type, "inner", a.type)
    return "1" if t is int else "0.5" if t is float else str(where / "placeholder")


def argv(name: tuple, out, value, where: Path, **given) -> list[str]:
    """``latticedraft NAME ...`` with ``out``'s option set to ``value``, the inputs in ``given`` (dest ->
    value) and every other required argument a placeholder."""
    p = PARSERS[name]
    first = {g._group_actions[0].dest for g in p._mutually_exclusive_groups if g.required}
    opts, pos = [], []
    for a in p._actions:
        if a.dest == out.dest:
            v = value
        elif a.dest in given:
            v = given[a.dest]
        elif (not a.option_strings and a.nargs not in ("?", "*")) or a.required or a.dest in first:
            v = _placeholder(a, where)
        else:
            continue
        words = [str(x) for x in (v if isinstance(v, list) else [v])]
        if a.option_strings:
            opts += [max(a.option_strings, key=len), *words]
        else:
            pos += words
    return [*name, *pos, *opts]


def target(name: tuple, out, value) -> Path:
    """Where ``out`` writes when its option is ``value`` (``fetch --cache C``: C's model directory)."""
    return out.path(cli.build_parser().parse_args(argv(name, out, value, Path("/nowhere"))))


@pytest.fixture
def ran(monkeypatch):
    """The commands that started: none may, unless the rule let them through (they return 0 at once)."""
    started, real = [], cli.build_parser

    def parser():
        p = real()
        for name, sub in commands(p):
            sub.set_defaults(func=lambda a, name=name: started.append(name) or 0)
        return p

    monkeypatch.setattr(cli, "build_parser", parser)
    return started


def _own(path: Path, kind) -> None:
    if isinstance(kind, o.FileKind):
        path.parent.mkdir(parents=True, exist_ok=True)
        SAMPLES[kind.what](path)
    else:
        fake_output(path, kind)


def _foreign_dir(d: Path) -> Path:
    d.mkdir(parents=True)
    (d / "notes.txt").write_text("mine")
    return d


def _cases_existing(name, out, case, capsys, ran) -> None:
    """Its own earlier output: refused without the force flag, let through with it."""
    value = case / "out"
    kind = out.kind(cli.build_parser().parse_args(argv(name, out, value, case)))
    _own(target(name, out, value), kind)
    line = refused(capsys, argv(name, out, value, case), watch=[case])
    assert out.force in line, line
    from latticedraft.cli import main

    assert main(argv(name, out, value, case) + [out.force]) == 0 and ran == [name], capsys.readouterr().err
    ran.clear()


def _cases_others(name, out, case, capsys) -> None:
    """``--force`` onto what another command wrote: refused."""
    value = case / "out"
    kind = out.kind(cli.build_parser().parse_args(argv(name, out, value, case)))
    if out.form == FILE:
        others = [k for k in FILE_KINDS.values() if k is not kind]
    else:
        others = [k for k in o.KINDS if k is not kind]
    for i, other in enumerate(others):
        value = case / str(i) / "out"
        _own(target(name, out, value), other)
        if out.form != FILE and o.is_own(target(name, out, value), kind):
            continue
        line = refused(capsys, argv(name, out, value, case) + [out.force], watch=[case])
        assert "pass --force" not in line, line


def _cases_inputs(name, out, case, capsys) -> None:
    """``--force`` onto (or around) one of its own inputs: refused, naming the input."""
    for dest in out.inputs:
        d = case / dest
        d.mkdir(parents=True)
        given = d / "given"
        given.write_text("an input")
        value = given if out.form == FILE else d
        line = refused(capsys, argv(name, out, value, case, **{dest: str(given)}) + [out.force], watch=[case])
        assert "input" in line, line


def _cases_foreign(name, out, case, capsys) -> None:
    """``--force`` into a foreign directory, or (a file output) onto a foreign file or a directory: refused."""
    if out.form in (DIRECTORY, IN_PLACE):
        value = case / "foreign"
        _foreign_dir(target(name, out, value) if out.form == DIRECTORY else value)
        refused(capsys, argv(name, out, value, case) + [out.force], watch=[case])
        return
    refused(capsys, argv(name, out, _foreign_dir(case / "dir"), case) + [out.force], "directory", watch=[case])
    value = case / "notes.txt"
    t = target(name, out, value)
    t.write_text("mine")
    refused(capsys, argv(name, out, value, case) + [out.force], watch=[case])


@pytest.mark.parametrize("name, out", WRITERS, ids=[f"{' '.join(n)} {out.flag}" for n, out in WRITERS])
def test_every_command_that_writes_keeps_the_overwrite_rule(name, out, tmp_path, capsys, ran):
    assert out.force in PARSERS[name]._option_string_actions, f"{' '.join(name)} has no {out.force}"
    if out.form != IN_PLACE:
        _cases_existing(name, out, tmp_path / "existing", capsys, ran)
        _cases_inputs(name, out, tmp_path / "inputs", capsys)
    _cases_others(name, out, tmp_path / "others", capsys)
    _cases_foreign(name, out, tmp_path / "foreign", capsys)
    assert ran == []


WRITES = re.compile(r"\boutput (head |model )?(file|directory)\b|\bwrites? .*\binto\b|^output\b", re.I)


def test_every_option_that_writes_is_declared():
    """An option spelled or described as an output is declared (so the rule runs for it)."""
    for name, p in commands(cli.build_parser()):
        mine = {out.dest for out in declared(p)}
        for a in p._actions:
            looks = "-o" in a.option_strings or a.dest in ("out", "output", "cache") or WRITES.search(a.help or "")
            if looks and not isinstance(a, argparse._StoreTrueAction):
                assert a.dest in mine, f"`{' '.join(name)} {a.option_strings}` writes but is not declared"


def _chattr(flag: str, *paths: Path) -> bool:
    import subprocess

    return subprocess.run(["chattr", flag, *map(str, paths)], capture_output=True).returncode == 0


@pytest.mark.parametrize("name, out", WRITERS, ids=[f"{' '.join(n)} {out.flag}" for n, out in WRITERS])
def test_every_writer_checks_its_destination_can_be_written_before_any_work(name, out, tmp_path, capsys, ran):
    """Issue 63, class D: a destination under a file (a file where its directory belongs) is refused
    before the command starts, in one line naming the option; where ``chattr`` works, an immutable
    destination directory too (root writes past permissions, not past ``chattr +i``)."""
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a directory belongs")
    value = blocked / "out"
    line = refused(capsys, argv(name, out, value, tmp_path) + [out.force], watch=[tmp_path])
    if out.form == IN_PLACE:  # (into an input, which must be there: refused as not there)
        assert ran == []
        return
    assert out.flag.split("'")[0].split()[-1] in line, line
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    value = frozen if out.form == DIRECTORY and out.target is None else frozen / "out"
    if not _chattr("+i", frozen):
        pytest.skip("chattr +i is not available here")
    try:
        line = refused(capsys, argv(name, out, value, tmp_path) + [out.force])
    finally:
        _chattr("-i", frozen)
    assert "cannot be written" in line and str(frozen) in line and "chattr" in line, line
    assert ran == []

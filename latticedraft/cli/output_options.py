"""Every option by which a command writes is declared as an output, and the one overwrite rule
(``latticedraft/outputs.py``) runs for each before the command starts: ``main`` calls
``claim_outputs(args)`` ahead of every command function, so no command can write outside the rule.

A command adds its output option through ``out_dir`` / ``out_file`` (``-o/--out`` and its rule), or
adds an option of its own and ``declare``s it with a ``claim`` of its own (``decode --output``
resumes, ``fetch --cache`` is idempotent, ``lm index DIR`` writes into an LM build)::

    out_dir(p, HEADS, inputs=("base", "tokenizer", "corpus"), required=True, help="output directory")
    out_file(p, TUNED, inputs=("model", "prompts"), default=None, help="output file (default ./tuned.json)")

``declared(parser)`` lists a parser's outputs: the tests walk every command with it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from latticedraft.outputs import FileKind, OutputKind, check_not_input, claim_dir, claim_output_file

DIRECTORY, FILE, IN_PLACE = "directory", "file", "in-place"  # an output's form; in-place: a file inside an input


@dataclass(frozen=True)
class Output:
    """One output option of a command.

    ``flag``: as messages name it ("--out", "DIR"); ``dest``: its argparse destination; ``form``:
    ``DIRECTORY``, ``FILE`` or ``IN_PLACE``; ``kinds``: what it may write (``OutputKind`` for a
    directory, ``FileKind`` for a file, the kind of directory it writes into for ``IN_PLACE``);
    ``pick(args)``: which of ``kinds`` this run writes, None when it writes nothing (default: the
    first); ``inputs``: dests of the command's inputs, never its output; ``target(args)``: the path
    it writes (default: the option's value; None: nothing); ``claim(args)``: a rule of its own in
    place of ``claim_dir`` / ``claim_output_file``; ``force``: the flag that replaces an earlier
    output ("--resume" where the command appends instead)."""

    flag: str
    dest: str
    form: str
    kinds: tuple
    inputs: tuple[str, ...] = ()
    pick: Callable | None = None
    target: Callable | None = None
    claim: Callable | None = None
    force: str = "--force"

    def kind(self, a):
        return self.kinds[0] if self.pick is None else self.pick(a)

    def path(self, a) -> Path | None:
        v = getattr(a, self.dest, None) if self.target is None else self.target(a)
        return None if v is None else Path(v)

    def input_paths(self, a) -> dict:
        """flag as typed -> the value of each input (``claim_dir``'s ``inputs``)."""
        flags = getattr(a, "_flags", {})
        return {flags.get(d, d.upper()): getattr(a, d, None) for d in self.inputs}

    def check(self, a) -> None:
        """Run the rule for this output of the parsed command ``a`` (``InputError`` on a refusal)."""
        if self.claim is not None:
            not_an_input(self, a)
            self.claim(a)
            return
        kind, path = self.kind(a), self.path(a)
        if kind is None or path is None:
            return
        force, inputs = bool(getattr(a, "force", False)), self.input_paths(a)
        if self.form == DIRECTORY:
            claim_dir(path, kind, force=force, resume=bool(getattr(a, "resume", False)), flag=self.flag,
                      inputs=inputs)
        else:
            claim_output_file(path, kind, force=force, flag=self.flag, inputs=inputs)


def declare(p: argparse.ArgumentParser, out: Output) -> Output:
    """Record ``out`` among ``p``'s outputs (``claim_outputs`` checks them before the command runs)."""
    p.set_defaults(_outputs=(*declared(p), out))
    return out


def declared(p: argparse.ArgumentParser) -> tuple[Output, ...]:
    """The outputs declared on parser ``p``."""
    return tuple(p.get_default("_outputs") or ())


def _out_option(p, kind, form: str, inputs, pick, target, flags, **kw) -> Output:
    a = p.add_argument(*flags, **kw)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return declare(p, Output(max(flags, key=len), a.dest, form, kinds, tuple(inputs), pick, target))


def out_dir(p, kind: OutputKind | tuple, *, inputs=(), pick=None, target=None, flags=("-o", "--out"), **kw) -> Output:
    """Add the output directory option (``-o/--out``; ``kw``: ``add_argument``'s) writing ``kind``
    (several: ``pick`` chooses per run) under ``claim_dir``."""
    kw.setdefault("type", Path)
    kw.setdefault("metavar", "DIR")
    return _out_option(p, kind, DIRECTORY, inputs, pick, target, flags, **kw)


def out_file(p, kind: FileKind | tuple, *, inputs=(), pick=None, target=None, flags=("-o", "--out"), **kw) -> Output:
    """Add the output file option (``-o/--out``) writing ``kind`` under ``claim_output_file``."""
    kw.setdefault("type", Path)
    return _out_option(p, kind, FILE, inputs, pick, target, flags, **kw)


def claim_outputs(a) -> None:
    """Run the rule for every output the parsed command ``a`` declared, before the command starts."""
    for out in getattr(a, "_outputs", ()):
        out.check(a)


def not_an_input(out: Output, a) -> None:
    """``check_not_input`` ahead of a custom ``claim``: the output is none of the command's inputs."""
    path = out.path(a)
    if path is not None and str(path) != "-":
        check_not_input(path, out.input_paths(a), out.flag)


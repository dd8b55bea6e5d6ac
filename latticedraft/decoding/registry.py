"""Every decoding method as one registry entry: its options, their checks, its label, the
settings that decide its output, and how it runs.

The CLI, ``eval``, ``tune``, ``demo``, the benchmarks and data-set runs read this registry; none
of them switches on method names. Adding a method touches its own module (which defines its
``METHOD``, ``decoding/methods/<name>.py``) and one name in ``MODULES``. A method module imports
no torch at import time (its decoder's modules load when it runs), so ``--help`` stays quick.

Options are named by their ``argparse`` destination (``--top-k`` is ``top_k``). An option a
method lists (``Method.options``) belongs to the methods that list it; ``SAMPLING`` ones to the
methods that sample; every other option of a command (where to decode, what, how much, how to
report) applies to every method. ``Method.configure(values, given)`` turns option values (dest ->
value, ``None`` where the method's own default applies) into the method's options object,
refusing bad values in one line; ``given`` (the dests the user set) lets it refuse options that
do not apply to a sub-choice (a ``--drafter`` that reads no ``--lm``). Every call of ``configure``
first refuses a given option the method does not read (``refuse_unread``), so the CLI, ``Session``
and ``custom_generate`` follow one rule.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from latticedraft.errors import InputError

MODULES = ("bpd", "greedy", "lookahead", "mtad", "kangaroo", "ppd", "dynamo")  # decoding/methods/<name>.py


@dataclass(frozen=True)
class Request:
    """What a decode call asks of any method. rows: the run-wide id of each prompt (row r of seed s
    samples with the noise of ``default_rng([s, r, t])`` at position t, whatever batch it lands in;
    None: first_row, first_row + 1, ...); first_row: the position of the call's first prompt in
    the caller's prompt list (what proposers key per-call state by, such as the oracle's references);
    sampling: ``SamplingOptions`` (None: greedy; a method that always samples uses its own
    defaults); on_tokens(i, new_ids) streams row i's tokens; record_steps keeps per-step records."""

    max_new_tokens: int = 64
    eos_token_id: Any = None
    sampling: Any = None
    verify: str = "auto"
    rows: list | None = None
    on_tokens: Callable | None = None
    record_steps: bool = False
    in_flight: int | None = None  # a continuous batch of this many rows over the call's prompts (``Method.continuous``)
    on_done: Callable | None = None  # on_done(i, DecodeResult of row i alone) as it finishes (continuous runs)
    first_row: int = 0


@dataclass(frozen=True)
class Method:
    """name: the ``--method`` value; summary: one line for help texts; lossless: the output
    equals greedy decoding (or, sampling, has the target's distribution); sampling: "never" |
    "optional" (``--do-sample``) | "always"; options: the method-specific option dests it reads
    (beside ``SAMPLING`` where it samples, and every option no method lists); batched: decodes
    several prompts per call.

    configure(values, given) -> options object; label(options, sampling) -> str (the records'
    ``method``); settings(options, sampling) -> dict (plain values that decide the output: the
    data-set runs' fingerprint); check(session, options): the cheap checks of the options against
    the loaded model (no loading, counting, fitting or measuring), which ``Session`` runs before
    ``prepare`` and ``run``; check_files(options, files, tokenizer=None): refuse a missing file the
    options cannot decode without (files: file option dest -> the path given, None: its default;
    tokenizer: the session's, None where the CLI checks before the model loads), which the CLI runs
    before the model loads and ``Session.check`` before anything is built, in the same words;
    prepare(session, options, batch_size): load and check what the method
    needs against the model, before any output; run(session, prompts, options, request)
    -> ``DecodeResult`` for one batch (or, where ``continuous(options)``, for all of a call's prompts
    in one continuous batch of ``Request.in_flight`` rows)."""

    name: str
    summary: str
    lossless: bool
    sampling: str
    options: tuple
    configure: Callable
    label: Callable
    settings: Callable
    run: Callable
    prepare: Callable | None = None
    check: Callable | None = None
    check_files: Callable | None = None
    defaults: dict = field(default_factory=dict)  # sampling defaults where they differ from generate's
    files: Callable = lambda options: ()  # noqa: E731  the file options (dests) these options read
    default_model: str | None = None  # the bundled model directory under data/ (None: data/heads-stern)
    continuous: Callable = lambda options: False  # noqa: E731  run takes all prompts at once with Request.in_flight

    def __post_init__(self):
        if not isinstance(self.configure, _Checked):  # every caller passes the one rule (``refuse_unread``)
            object.__setattr__(self, "configure", _Checked(self, self.configure))

    def one_batch(self, options, batch_size: int, prompts: int) -> bool:
        """Whether ``prompts`` prompts in batches of ``batch_size`` run as one continuous batch."""
        return batch_size > 1 and prompts > batch_size and self.continuous(options)

    def reads(self, dest: str) -> bool:
        """Whether option ``dest`` applies to this method: one it lists, a sampling option where it
        samples, or one that no method lists (an option of every method)."""
        if dest in self.options or (self.sampling != "never" and dest in SAMPLING):
            return True
        return dest not in SAMPLING and dest not in method_options()

    def uses_file(self, dest: str, options) -> bool:
        """Whether file option ``dest`` (``lm``, ``rescorer``, ``draft_model``...) decides the output."""
        return dest in self.files(options)


class _Checked:
    """``Method.configure`` as every entry point calls it (the CLI, ``Session``, ``custom_generate``,
    ``eval``): ``refuse_unread`` first, then the method's own ``configure(values, given)``."""

    def __init__(self, method: "Method", own: Callable):
        self.method, self.own = method, own

    def __call__(self, values: dict, given=()):
        given = set(given)
        refuse_unread(self.method, values, given)
        return self.own(values, given)


OFF = ("off", "none")  # option values that ask for nothing, beside None, False and 0


def inert(value) -> bool:
    """Whether an option value asks for nothing (None, False, 0, "off", "none": a source off, no drafter)."""
    if value is None or value is False or (isinstance(value, str) and value in OFF):
        return True
    return isinstance(value, int) and not isinstance(value, bool) and value == 0


def refuse_unread(method: "Method", values: dict, given) -> None:
    """The one rule of every entry point: an option given (``given``: the dests the user set) that
    ``method`` does not read is refused in one line naming it, its value and the methods that read
    it, unless its value asks for nothing (``inert``: ``--self-draft off`` goes with any method)."""
    for dest in sorted(given):
        value = values.get(dest)
        if method.reads(dest) or inert(value):
            continue
        users = readers(dest)
        where = f"it applies to --method {' / '.join(users)}" if users else "no method reads it here"
        flag = "--" + dest.replace("_", "-")
        shown = flag if isinstance(value, bool) else f"{flag} {value}"
        raise InputError(f"{shown} does not apply to --method {method.name} ({where}); drop {flag}")


_SAME = object()


@dataclass(frozen=True)
class Flag:
    """The command-line side of an options field (``option``): flag, help, the group it is listed
    in, the CLI's default (where it differs from the library's), argparse's keywords, whether
    the acceptance rates fitted for a drafter depend on it (``fit``: part of their cache key), and
    which sub-choices read it (``only``: e.g. the ``--drafter`` values; empty: all)."""

    flag: str
    help: str
    group: str
    cli: Any
    argparse: dict
    fit: bool = True
    only: tuple = ()


def option(default, help: str, *, group: str, flag: str | None = None, cli=_SAME, fit: bool = True,
           only: tuple = (), **argparse):
    """A field of a method's options dataclass that declares its command-line option once: ``--flag``
    (default: the field name with dashes; its dest is the flag's), ``help``, ``group`` (which
    ``add_options`` call lists it), ``cli``: the CLI's default where it differs from the library's
    ``default``; ``only``: the sub-choices that read it (the method refuses it for the others);
    ``argparse``: ``type``, ``choices``, ``metavar``."""
    return field(default=default, metadata={"cli": Flag(flag, help, group, cli, argparse, fit, tuple(only))})


def flags(cls) -> list[tuple[str, dataclasses.Field, Flag]]:
    """(dest, field, ``Flag``) of every field of options dataclass ``cls`` declared with ``option``."""
    out = []
    for f in dataclasses.fields(cls):
        fl = f.metadata.get("cli")
        if fl is not None:
            out.append(((fl.flag or "--" + f.name.replace("_", "-"))[2:].replace("-", "_"), f, fl))
    return out


def dests(cls) -> tuple:
    """The option dests of the fields of ``cls`` declared with ``option``."""
    return tuple(dest for dest, _, _ in flags(cls))


def configure(cls, values: dict):
    """An options object of ``cls`` from option values (dest -> value, None: the field's default):
    a field declared with ``option`` reads its flag's dest, any other field the dest of its own
    name (an option several methods share, such as ``--gamma``, each with its own default)."""
    declared = {f.name: dest for dest, f, _ in flags(cls)}
    given = {f.name: values.get(declared.get(f.name, f.name)) for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in given.items() if v is not None})


def _cli_default(f: dataclasses.Field, fl: Flag):
    return f.default if fl.cli is _SAME else fl.cli


def default_of(f: dataclasses.Field):
    """The CLI's default of a field declared with ``option``."""
    return _cli_default(f, f.metadata["cli"])


def cli_defaults(cls, changed_only: bool = True, by_dest: bool = False) -> dict:
    """field name (``by_dest``: option dest) -> the CLI's default, for the fields of ``cls`` whose
    CLI default differs from the library's (all declared fields with ``changed_only=False``)."""
    return {dest if by_dest else f.name: _cli_default(f, fl) for dest, f, fl in flags(cls)
            if not changed_only or fl.cli is not _SAME}


def add_options(group, cls, name: str, notes: dict | None = None, only: tuple | None = None) -> None:
    """Add the options of ``cls`` declared in group ``name`` to an argparse (group) ``group``;
    notes: dest -> text appended to the help (where defaults differ by method); only: these dests
    alone (None: all)."""
    notes = notes or {}
    for dest, f, fl in flags(cls):
        if fl.group == name and (only is None or dest in only):
            group.add_argument("--" + dest.replace("_", "-"), dest=dest, help=fl.help + notes.get(dest, ""),
                               default=_cli_default(f, fl), **fl.argparse)


def methods() -> dict[str, Method]:
    """name -> Method, in ``MODULES`` order."""
    out = {}
    for name in MODULES:
        m = importlib.import_module(f"latticedraft.decoding.methods.{name}").METHOD
        out[m.name] = m
    return out


@functools.cache
def method_options() -> frozenset:
    """Every option dest some method lists (``Method.options``): the method-specific ones."""
    return frozenset(dest for m in methods().values() for dest in m.options)


def get(name: str) -> Method:
    table = methods()
    if name not in table:
        raise InputError(f"--method {name!r} is not one of {', '.join(table)}")
    return table[name]


def readers(dest: str) -> list[str]:
    """The methods that read option ``dest``."""
    return [m.name for m in methods().values() if m.reads(dest)]


@dataclass(frozen=True)
class SamplingSettings:
    """generate's sampling settings, each field its flag (group "sampling"): temperature > 0; top_k
    >= 0 (0 = off); 0 < top_p <= 1 (1 = off); repetition_penalty > 0 (1 = off); seed: row r's
    noise at position t is a counter-based hash of (seed, r, t, token) (``accept.sampling.GumbelNoise``).
    The CLI's default of every flag but ``--seed`` is None: the method's default, which is generate's (the field's)
    unless ``Method.defaults`` says otherwise. ``accept.sampling.SamplingOptions`` adds what turns
    logits into p."""

    temperature: float = option(1.0, cli=None, group="sampling", type=float, help="softmax temperature")
    top_k: int = option(50, cli=None, group="sampling", type=int, metavar="K",
                        help="keep the K most likely tokens, 0 = off")
    top_p: float = option(1.0, cli=None, group="sampling", type=float, metavar="P", help="nucleus filter, 1 = off")
    seed: int = option(0, group="sampling", type=int, metavar="S",
                       help="sampling seed; row r's noise at position t is a hash of (S, r, t, token) (default 0)")
    repetition_penalty: float = option(1.0, cli=None, group="sampling", type=float,
                                       help="generate's repetition penalty, 1 = off")

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise InputError(f"--temperature {self.temperature} must be a finite number > 0")
        if self.top_k < 0:
            raise InputError(f"--top-k {self.top_k} must be >= 0 (0 = no top-k filter)")
        if not 0.0 < self.top_p <= 1.0:
            raise InputError(f"--top-p {self.top_p} must be in (0, 1] (1 = no nucleus filter)")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise InputError(f"--repetition-penalty {self.repetition_penalty} must be a finite number > 0 (1 = off)")
        check_seed(self.seed)


def check_seed(seed) -> None:
    """A seed numpy's generators take: an integer in [0, 2**63)."""
    if isinstance(seed, bool) or not hasattr(seed, "__index__") or not 0 <= int(seed) < 2**63:
        raise InputError(f"--seed {seed} must be an integer in [0, 2**63); e.g. --seed 0")


def method_defaults(method: Method) -> dict:
    """field -> the sampling default of ``method``: generate's, or the method's own."""
    return {**{f.name: f.default for f in dataclasses.fields(SamplingSettings)}, **method.defaults}


def settings_for(method: Method, values: dict) -> dict | None:
    """The sampling settings of ``--do-sample`` and generate's flags (``values``: dest -> value, None
    = the method's default) as ``SamplingSettings`` keywords, or None for greedy decoding; a method
    that always samples needs no ``--do-sample``; one that never samples gets None. (Checked when
    ``SamplingOptions`` is built from them.)"""
    if method.sampling == "never" or not (values.get("do_sample") or method.sampling == "always"):
        return None
    return {k: d if values.get(k) is None else values[k] for k, d in method_defaults(method).items()}


SAMPLING = ("do_sample", *dests(SamplingSettings))  # generate's flags


def sampling_label(sampling) -> str:
    """`` sampling T=.. top-k=.. top-p=.. seed=..`` (empty for greedy), for every method's label."""
    if sampling is None:
        return ""
    return (f" sampling T={sampling.temperature} top-k={sampling.top_k} top-p={sampling.top_p} seed={sampling.seed}"
            + ("" if sampling.repetition_penalty == 1.0 else f" rep={sampling.repetition_penalty}"))

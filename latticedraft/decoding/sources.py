"""Every draft source beside the drafter, registered once.

A source is a proposer module ``decoding/proposers/<name>.py`` that defines ``SOURCE``, a
``DraftSource``: its one option (a ``registry.option`` field: flag, library and CLI defaults,
help, whether fitted rates depend on it), its range check, how a session builds its proposer for
a value, the file options it reads, whether it drafts under sampling, and which rate table rates
its paths. From that one declaration come:

- ``--method bpd``'s option (``bpd.DrafterSpec`` gains one field per source) and its range check;
- the settings fingerprint of data-set runs and ``custom_generate``'s keywords (the field);
- the acceptance rates' cache key (the field, unless ``fit=False``) and the rate table keyed by
  the source's name (``planning/acceptance.py``), fitted where the source has one
  (``rates="fitted"``: its proposer's ``paths(history)``);
- the online rate correction per source name (``planning/acceptance.RateCorrection``);
- the table of sources in docs/architecture.md (``markdown_table``; a test keeps them equal).

Adding a source touches its own module and one name in ``MODULES`` (docs/architecture.md, "Add a
draft source", walks through it).

    >>> [s.name for s in sources()]
    ['context', 'lm', 'suffix', 'self_draft']
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from dataclasses import dataclass
from typing import Any, Callable

from latticedraft.errors import InputError

MODULES = ("context", "lm_ngrams", "suffix", "self_draft")  # decoding/proposers/<name>.py, each with SOURCE
RATES = ("fitted", "online", "context")  # a fitted table of its own; its own online estimate; the context table


@dataclass(frozen=True)
class DraftSource:
    """name: the source's key (rate tables, corrections, timings, records); dest: its option's
    dest and ``DrafterSpec`` field; option: the ``registry.option(...)`` field (group "tree");
    build(session, value) -> a ``Proposer`` or None (nothing to draft for this value and model),
    called once per session and value (the proposer may learn across calls); summary: one line
    for the docs; check(value) -> the value as the spec keeps it (``InputError`` for a bad one:
    one line naming the flag and the fix); files: the file options it reads; sampling: it drafts
    under lossless sampling; sampled_default: its value under ``--do-sample`` where the option
    is not given (None: the CLI's default, as in greedy decoding); if_present: the values at which it
    reads its files only where they exist unless a file option names them (``--lm-drafts auto``:
    off without the default LM), so only its other values refuse a missing file before the model
    loads (``bpd``'s ``check_files``); rates: how the cost-aware tree rates its paths (``RATES``); bins:
    what a token's row of its fitted table is, "match" (the suffix match length of a copied
    continuation) or "probability" (the source's probability for it, ``acceptance.HEAD_EDGES``);
    shares_cache: it drafts over the verifier's own KV cache (``Step.cache``), which only tree
    verification keeps (refused under ``--verify batched``); lean: the values that run the model's
    layers on the lean forward path (``gpu/verify/archs.py``), refused from the model's config.json
    before its weights load where the path does not cover its architecture (``check_config``)."""

    name: str
    dest: str
    option: Any
    build: Callable
    summary: str
    check: Callable = lambda value: value  # noqa: E731
    files: tuple = ()
    if_present: tuple = ()
    sampling: bool = True
    sampled_default: Any = None
    rates: str = "fitted"
    bins: str = "probability"
    shares_cache: bool = False
    lean: tuple = ()

    def __post_init__(self):
        if self.rates not in RATES:
            raise ValueError(f"source {self.name}: rates {self.rates!r} is not one of {RATES}")

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")

    def on(self, spec) -> bool:
        """Whether ``spec`` (a ``DrafterSpec``) turns this source on."""
        return self.is_on(getattr(spec, self.dest))

    @staticmethod
    def is_on(value) -> bool:
        """Whether an option value turns a source on (0, None and "off" do not)."""
        return bool(value) and value != "off"


@functools.cache
def sources() -> tuple[DraftSource, ...]:
    """The registered sources, in ``MODULES`` order (the order their paths join a step's tree)."""
    return tuple(importlib.import_module(f"latticedraft.decoding.proposers.{m}").SOURCE for m in MODULES)


def by_name(name: str) -> DraftSource:
    for s in sources():
        if s.name == name:
            return s
    raise KeyError(name)


def spec_fields() -> list[tuple[str, type, dataclasses.Field]]:
    """The sources' options as dataclass fields (name, type, field) of ``bpd.DrafterSpec``."""
    return [(s.dest, Any, s.option) for s in sources()]


def checked(values: dict) -> dict:
    """dest -> value of every source, each passed through its ``check`` (values: dest -> value)."""
    return {s.dest: s.check(values[s.dest]) for s in sources()}


def build_all(session, spec, fresh: bool = False) -> tuple:
    """The proposers of the sources ``spec`` turns on, in ``MODULES`` order: each built once per
    session and value (``session.learned.source``; ``fresh``: new ones that teach the session
    nothing, for warm-ups). Sources that cannot draft under sampling are left out when ``sampling``."""
    out = []
    for s in sources():
        if not s.on(spec):
            continue
        value = getattr(spec, s.dest)
        p = s.build(session, value) if fresh else session.learned.source(s.name, value, lambda: s.build(session, value))
        if p is not None:
            out.append(p)
    return tuple(out)


def check_config(spec, model_dir, device=None) -> None:
    """Before the model of ``model_dir`` (None: the bundled heads) loads: every source ``spec`` turns
    on at a ``lean`` value needs an architecture the lean path covers, read from its base's
    config.json, and torch's weight-only kernels for ``device`` (None: cpu) (``ModelError`` in one
    line naming the option, its value and why)."""
    import json

    from latticedraft.decoding.runs.loaders import base_dir_from_files
    from latticedraft.errors import ModelError
    from latticedraft.gpu.verify.archs import config_support

    wanted = [s for s in sources() if hasattr(spec, s.dest) and s.on(spec) and getattr(spec, s.dest) in s.lean]
    if not wanted:
        return
    from latticedraft.gpu.models.quantized import kernels_missing  # (torch: only where a lean value asks)

    try:
        config = json.loads((base_dir_from_files(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = None  # no readable config.json: the load refuses the directory in its own words
    why = (config_support(config) if config is not None else None) or kernels_missing(device or "cpu")
    if why is not None:
        s = wanted[0]
        raise ModelError(f"{s.flag} {getattr(spec, s.dest)}: {why}")


def longest_match(flag: str):
    """A ``check`` for an option that is the longest suffix a source matches: an int >= 0 (0: off)."""

    def check(value) -> int:
        if int(value) < 0:
            raise InputError(f"{flag} {value}: give the longest suffix to match (>= 1), or 0 for off")
        return int(value)

    return check


def markdown_table() -> str:
    """The docs' table of sources: option, CLI default, what it reads, how it is rated, sampling."""
    from latticedraft.decoding.registry import default_of

    rows = ["| source | option | CLI default | reads | rated by | under sampling |", "|---|---|---|---|---|---|"]
    for s in sources():
        rows.append(f"| {s.name}: {s.summary} | `{s.flag}` | `{default_of(s.option)}` | {', '.join(s.files) or '-'} | {s.rates} | "
                    f"{_under_sampling(s)} |")
    return "\n".join(rows)


def _under_sampling(s: DraftSource) -> str:
    if not s.sampling:
        return "no"
    return "yes" if s.sampled_default is None else f"yes (default `{s.sampled_default}`)"

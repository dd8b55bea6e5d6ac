"""Overwrite protection: one rule for every command that writes an output directory or file.

- A path that does not exist yet, or an empty directory, is written freely.
- An existing output is refused without ``--force`` (or ``--resume`` where the command resumes).
- ``--force`` replaces only what that command itself wrote. A directory is recognised as the
  command's own by its markers, unique to each command (an LM build by ``manifest.json``, heads by
  ``heads_config.json``, an adapter by ``adapter.json``, exit heads by ``exit_heads.json``, a
  trained LM by ``training.json`` + ``config.json``, a draft model by the same files with
  ``"kind": "draft-model"`` in ``training.json``, an import or export by its own JSON file beside
  what it writes: ``medusa_import.json``, ``medusa_export.json``, ``gguf_import.json``,
  ``latticedraft_generate.json``; a report by its JSON and table: ``demo.json``, ``results.json`` +
  ``results.md``, ``records.json`` + ``records.md``); where several kinds' markers are present the
  directory is the kind's with the most (``is_own``). Anything else is refused even with ``--force``, naming what the
  directory holds and the fix. Files the command does not write (a README, ``draft_vocab.json``
  beside heads) survive a forced replacement.
- A command never writes into its own input (``--base``, ``--model``, SRC …: ``claim_dir``'s
  ``inputs``), nor into a directory holding one, even with ``--force``.
- A training checkpoint (``checkpoint.pt``) is never discarded silently: without ``--resume`` it is
  refused naming ``--resume`` and ``--force``; ``--force`` discards it when training starts.

What a command writes is an ``OutputKind`` (a directory; add one below for a new command) or a
``FileKind`` (a file, recognised by its content). The CLI declares every output option with its kind
(``cli/output_options.py``) and ``main`` runs ``claim_dir`` / ``claim_output_file`` for each before
the command starts; library functions that write repeat the claim for their own callers. Writers
stage under a temporary name and rename (``atomic.py``); ``stale`` lists what a forced replacement
removes because the new output no longer writes it.

Example::

    claim_dir(Path("out/heads"), HEADS, force=False)   # InputError if out/heads holds anything
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from latticedraft.errors import InputError

CHECKPOINT = "checkpoint.pt"
STAGING = ".partial"  # the training loop's staging directory inside its output (finish_dir)


@dataclass(frozen=True)
class OutputKind:
    """What one command writes into its output directory.

    ``what``: a noun phrase for messages ("multi-token heads"); ``command``: the command that
    writes it ("train heads"); ``markers``: the files that together identify a finished output;
    ``owned``: glob patterns of every entry the command writes (markers included), the only
    entries ``--force`` may replace; ``resumable``: the command keeps ``checkpoint.pt`` there
    while it runs (``--resume`` continues it); ``tag``: where two commands write the same files,
    the values the first marker's JSON ``"kind"`` may take (None: absent, as outputs written before
    the field was recorded), empty when any will do."""

    what: str
    command: str
    markers: tuple[str, ...]
    owned: tuple[str, ...]
    resumable: bool = False
    tag: tuple[str | None, ...] = ()

    def recognises(self, d: Path) -> bool:
        d = Path(d)
        if not all((d / m).exists() for m in self.markers):
            return False
        return not self.tag or _json_kind(d / self.markers[0]) in self.tag

    def owns(self, name: str) -> bool:
        if self.resumable and name in (STAGING, CHECKPOINT):
            return True
        return any(fnmatch.fnmatchcase(name, pat) for pat in self.owned)

    @property
    def marker_text(self) -> str:
        """``training.json ("kind": "draft-model") + config.json``; a tag that may be absent is not shown."""
        first = self.markers[0]
        if self.tag and None not in self.tag:
            first += " (" + " or ".join(f'"kind": "{t}"' for t in self.tag) + ")"
        return " + ".join((first, *self.markers[1:]))


_UNREADABLE = object()


def _json_kind(f: Path):
    """The ``"kind"`` field of JSON file ``f`` (None when absent; a sentinel matching no tag when unreadable)."""
    try:
        obj = json.loads(f.read_text())
    except (OSError, ValueError):
        return _UNREADABLE
    return obj.get("kind") if isinstance(obj, dict) else _UNREADABLE


LM_BUILD = OutputKind("an LM build", "latticedraft lm build", ("manifest.json",),
                      ("manifest.json", "lm.arpa", "lm.bin", "lm.fst", "lm.npz", "tables", "tokenizer.json",
                       "cooccurrence.npz", "corpus.ids"))
# train lm and train draft-model write the same files; training.json's "kind" tells them apart (train lm's
# outputs written before it recorded "lm", like the bundled data/base, have none)
TRAINED_LM = OutputKind("a trained LM", "latticedraft train lm", ("training.json", "config.json"),
                        ("training.json", "config.json", "generation_config.json", "model.safetensors",
                         "model-*.safetensors", "model.safetensors.index.json", "tokenizer.json"), resumable=True,
                        tag=("lm", None))
DRAFT_MODEL = OutputKind("a draft model", "latticedraft train draft-model", ("training.json", "config.json"),
                         TRAINED_LM.owned, resumable=True, tag=("draft-model",))
HEADS = OutputKind("multi-token heads", "latticedraft train heads", ("heads_config.json",),
                   ("heads_config.json", "heads.safetensors", "training.json", "base"), resumable=True)
ADAPTER = OutputKind("a Kangaroo adapter", "latticedraft train adapter", ("adapter.json",),
                     ("adapter.json", "adapter.safetensors", "training.json"), resumable=True)
EXIT_HEADS = OutputKind("early-exit heads", "latticedraft train heads --early-exit", ("exit_heads.json",),
                        ("exit_heads.json", "exit_heads.safetensors", "training.json"), resumable=True)
MARKER_CUSTOM_GENERATE = "latticedraft_generate.json"
CUSTOM_GENERATE = OutputKind("a custom_generate method", "latticedraft export custom-generate", (MARKER_CUSTOM_GENERATE,),
                             (MARKER_CUSTOM_GENERATE, "custom_generate", "README.md"))
MARKER_GGUF_IMPORT = "gguf_import.json"
GGUF_IMPORT = OutputKind("a model imported from GGUF", "latticedraft import gguf", (MARKER_GGUF_IMPORT,),
                         (MARKER_GGUF_IMPORT, "config.json", "generation_config.json", "model.safetensors",
                          "model-*.safetensors", "model.safetensors.index.json", "tokenizer.json",
                          "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "vocab.json",
                          "merges.txt", "added_tokens.json", "tokenizer.model"))
MARKER_MEDUSA_IMPORT = "medusa_import.json"
MEDUSA_IMPORT = OutputKind("imported Medusa heads", "latticedraft import medusa",
                           (MARKER_MEDUSA_IMPORT, "heads_config.json"),
                           (MARKER_MEDUSA_IMPORT, "heads_config.json", "heads.safetensors"))
MARKER_MEDUSA_EXPORT = "medusa_export.json"
MEDUSA_EXPORT = OutputKind("Medusa heads in vLLM's layout", "latticedraft export medusa",
                           (MARKER_MEDUSA_EXPORT, "config.json"),
                           (MARKER_MEDUSA_EXPORT, "config.json", "model.safetensors"))
# the report directories: each recognised by its JSON and table (eval's two methods write the same results.json)
DEMO = OutputKind("a demo report", "latticedraft demo", ("demo.json",), ("demo.json", "lattice_step.png"))
EVAL_REPORT = OutputKind("an eval report", "latticedraft eval", ("results.json", "results.md"),
                         ("results.json", "results.md", "fig6_oracle_vs_k.png", "fig7_parallel_vs_p.png"))
DYNAMO_EVAL = OutputKind("a DynaMo ablation report", "latticedraft eval --method dynamo",
                         ("results.json", "dynamo_ablation.md"),
                         ("results.json", "dynamo_ablation.md", "dynamo_ablation.png"))
EVAL_RECORDS = OutputKind("a records summary", "latticedraft eval --records", ("records.json", "records.md"),
                          ("records.json", "records.md"))
# every kind, to name what a directory holds
KINDS = [LM_BUILD, HEADS, ADAPTER, EXIT_HEADS, TRAINED_LM, DRAFT_MODEL, CUSTOM_GENERATE, GGUF_IMPORT, MEDUSA_IMPORT,
         MEDUSA_EXPORT, DEMO, EVAL_REPORT, DYNAMO_EVAL, EVAL_RECORDS]


def register(kind: OutputKind) -> OutputKind:
    """Add a command's output kind (so other commands can name it in their refusals); returns it."""
    if kind not in KINDS:
        KINDS.append(kind)
    return kind


def _entries(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def is_own(d: Path, kind: OutputKind) -> bool:
    """True when directory ``d`` is ``kind``'s output: ``kind`` recognises it and no other kind that
    does has as many markers (an import's own marker beside the files of the command it mimics
    makes it the import's, not that command's)."""
    return kind.recognises(d) and all(len(k.markers) < len(kind.markers) for k in KINDS
                                      if k is not kind and k.recognises(d))


def owner(d: Path) -> OutputKind | None:
    """The kind whose output directory ``d`` is (``is_own``), or None."""
    return next((k for k in KINDS if is_own(d, k)), None)


def describe_dir(d: Path) -> str:
    """What directory ``d`` holds, for messages: a known output ("multi-token heads
    (heads_config.json)"), a model ("a model (config.json)"), else its first entries."""
    d = Path(d)
    k = owner(d) if d.is_dir() else None
    if k is not None:
        return f"{k.what} ({k.marker_text}, written by `{k.command}`)"
    names = _entries(d)
    if not names:
        return "nothing (an empty directory)"
    if "config.json" in names:
        weights = [n for n in names if n.endswith((".safetensors", ".bin"))][:2]
        return f"a model ({', '.join(['config.json', *weights])})"
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"{len(names)} entr{'y' if len(names) == 1 else 'ies'} ({shown})"


@dataclass
class Claim:
    """The outcome of ``claim_dir``: ``existing``: the directory already held something (an
    earlier output of the same command, or a checkpoint); ``discard_checkpoint``: ``--force``
    was given over a checkpoint, which the command removes when its work starts."""

    path: Path
    existing: bool = False
    discard_checkpoint: bool = False


def claim_dir(path, kind: OutputKind, *, force: bool = False, resume: bool = False, flag: str = "--out",
              inputs: dict | None = None) -> Claim:
    """Check, before any work, that ``kind``'s command may write directory ``path``.

    Creates and removes nothing. ``InputError`` (naming ``flag``, what the directory holds and the
    fix) when: ``path`` is a file; it is one of the command's ``inputs`` (``check_not_input``) or
    holds one; it is not empty and is neither ``kind``'s output (``is_own``) nor holds
    only its checkpoint (even with ``force``: a model, another command's output, anything else); it
    holds ``kind``'s output or checkpoint and neither ``force`` nor ``resume`` was given; ``resume``
    finds no checkpoint; ``force`` and ``resume`` are both given.
    """
    from latticedraft.paths import check_writable

    p = Path(path)
    check_writable(p, flag, "directory")
    check_not_input(p, inputs or {}, flag)
    if force and resume:
        raise InputError(f"{flag} {p}: --force and --resume contradict each other (--resume continues "
                         f"{CHECKPOINT}, --force starts afresh); give one of them")
    names = _entries(p) if p.is_dir() else []
    ckpt = kind.resumable and CHECKPOINT in names
    if resume:
        if not kind.resumable:
            raise InputError(f"--resume does not apply to `{kind.command}`; drop --resume")
        if ckpt:
            return Claim(p, existing=True)
        if is_own(p, kind):
            raise InputError(f"--resume: {flag} {p} holds finished {kind.what} ({kind.marker_text}) and no "
                             f"{CHECKPOINT}, so there is nothing to resume; use it as it is, or pass --force "
                             "(without --resume) to train again")
        raise InputError(f"--resume given but {p / CHECKPOINT} does not exist; drop --resume to start afresh")
    if not names:
        return Claim(p)
    unfinished = kind.resumable and set(names) <= {CHECKPOINT, STAGING}  # a first run stopped before its output
    if not (is_own(p, kind) or unfinished):
        raise InputError(f"{flag} {p} holds {describe_dir(p)}, not {kind.what} from `{kind.command}`; "
                         f"--force replaces only that command's own output, so choose a new or empty directory")
    if not force:
        if ckpt:
            raise InputError(f"{flag} {p} holds {CHECKPOINT}, an unfinished `{kind.command}` run; pass --resume "
                             "to continue it (same settings), or --force to discard it and start afresh")
        raise InputError(f"{flag} {p} already holds {kind.what} ({kind.marker_text}); pass --force to replace it, "
                         f"or choose another {flag}")
    return Claim(p, existing=True, discard_checkpoint=ckpt)


def check_not_input(path, inputs: dict, flag: str = "--out") -> None:
    """``InputError`` when output ``path`` is one of ``inputs`` (option -> a path or a list of them;
    None and ``-`` skipped), or holds one (an input file's own directory included): a command never
    writes into its input."""
    out = Path(path).resolve()
    pairs = [(opt, g) for opt, v in inputs.items() for g in (v if isinstance(v, (list, tuple)) else [v])]
    for opt, given in pairs:
        if given is None or str(given) == "-":
            continue
        src = Path(given).resolve()
        if out == src or out in src.parents:
            raise InputError(f"{flag} {path} {'is' if out == src else 'holds'} the input {opt} {given}; a command "
                             f"never writes into its input, so choose another {flag}")


def stale(d: Path, kind: OutputKind, written: set[str]) -> list[Path]:
    """Entries of ``d`` that ``kind``'s command wrote earlier and the new output no longer has
    (``written``: the names it has now), to remove when a forced replacement completes."""
    d = Path(d)
    if not d.is_dir():
        return []
    return [d / n for n in _entries(d) if n not in written and n not in (CHECKPOINT, STAGING) and kind.owns(n)]


def remove_stale(d: Path, kind: OutputKind, written: set[str]) -> None:
    """Remove ``stale(d, kind, written)``: what a forced replacement no longer writes."""
    import shutil

    for old in stale(d, kind, written):
        shutil.rmtree(old) if old.is_dir() else old.unlink()


def claim_file(path, *, force: bool, is_own, what: str, command: str, flag: str = "--out") -> None:
    """Check, before any work, that ``command`` may write file ``path``: a new path is free; an
    existing one needs ``force`` and must be ``command``'s own output (``is_own(path)`` True,
    ``what`` names it for the message); ``InputError`` otherwise, naming ``flag``."""
    from latticedraft.paths import check_writable

    p = Path(path)
    check_writable(p, flag, "file")
    if not p.exists():
        return
    other = flag.split()[-1]  # the option to change ("--out" of "the .npz beside --out")
    if not is_own(p):
        raise InputError(f"{flag} {p} exists and is not {what} written by `{command}`; --force replaces only "
                         f"that, so choose another {other}")
    if not force:
        raise InputError(f"{flag} {p} already holds {what}; pass --force to replace it, or choose another {other}")


@dataclass(frozen=True)
class FileKind:
    """What one command writes as a single file: ``what`` names it ("tuned settings"), ``command``
    writes it, ``is_own(path)`` recognises one it wrote (by content, never by name)."""

    what: str
    command: str
    is_own: Callable[[Path], bool]


def claim_output_file(path, kind: FileKind, *, force: bool = False, flag: str = "--out",
                      inputs: dict | None = None) -> None:
    """The rule for a command that writes file ``path``: a creatable file path (``check_writable``),
    never one of the command's ``inputs`` (``check_not_input``), and an existing file replaced only
    with ``force`` and only when ``kind`` wrote it (``claim_file``)."""
    from latticedraft.paths import check_writable

    check_writable(path, flag, "file")
    check_not_input(path, inputs or {}, flag)
    claim_file(path, force=force, is_own=kind.is_own, what=kind.what, command=kind.command, flag=flag)

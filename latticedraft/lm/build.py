"""``latticedraft lm build``: corpus → tokenizer → token-id text → lmplz → ARPA → WFST and KenLM trie.

The trie (``build_binary``, a child process) is built while this process converts the same ARPA
to the WFST and its search tables.

A build directory holds ``lm.arpa``, ``lm.bin`` (KenLM trie), ``lm.fst`` (OpenFst binary),
``lm.npz`` (the same automaton as CSR arrays, for fast loading), ``tables/`` (the exact
searches' arrays as ``.npy``, memory-mapped at load: ``lm/search_tables.py``), ``tokenizer.json``
and ``manifest.json``. Everything is built in a temporary sibling directory which is renamed into
place only when complete, so ``manifest.json`` is written last and a failed build leaves the
target untouched: a directory without a manifest is not a build.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from latticedraft.errors import InputError
from latticedraft.atomic import atomic_file, publish_mode
from latticedraft.lm.corpus import resolve_corpus
from latticedraft.lm.tokenizer import fingerprint, load_tokenizer, train_tokenizer
from latticedraft.outputs import LM_BUILD, claim_dir

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from latticedraft.lm.corpus_ids import CorpusStats
    from latticedraft.lm.kenlm_tools import LmplzResult
    from latticedraft.lm.wfst import NgramFst

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
MIN_ORDER, MAX_ORDER = 2, 6
SENTENCES = ("lines", "paragraphs", "files")
MIN_TRAIN_VOCAB, MAX_VOCAB = 257, 2**31 - 2  # 256 bytes + end-of-text; FST labels (id + 1) are int32


@dataclass
class BuildOptions:
    corpus: Sequence[str]
    out: Path
    order: int = 3
    prune: list[int] | None = None
    tokenizer: str | None = None  # tokenizer.json or a directory holding one
    train_tokenizer: int | None = None  # vocab size of a byte-level BPE trained on the corpus
    memory: str = "512M"  # lmplz / build_binary sorting memory (GNU sort syntax: 512M, 2G, 10%)
    temp_dir: Path | None = None
    force: bool = False
    encoding_errors: str = "strict"
    unk_cost: float = 1000.0
    sentences: str | None = None  # lines | paragraphs | files; None: by corpus kind (default_sentences)
    progress: bool | None = None
    timings: dict = field(default_factory=dict)


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([bkmgtpezy%]?)$", re.IGNORECASE)


def parse_memory(value: str, flag: str = "--memory") -> str:
    """KenLM's sorting-memory size (``512M``, ``4G``, ``20%``, ``1048576``), checked and normalised here so a
    bad value never reaches lmplz; ``InputError`` names ``flag``."""
    m = _SIZE.match(str(value).strip())
    if not m:
        raise InputError(f"{flag} {value!r} is not a size; give a number with an optional unit, e.g. 512M, 4G or 20%")
    number, unit = float(m.group(1)), m.group(2)
    if number <= 0 or (unit == "%" and number > 100):
        raise InputError(f"{flag} {value} is out of range; give a positive size, or a percentage in (0, 100]")
    return m.group(1) + (unit if unit in ("b", "%") else unit.upper())


def default_sentences(files: Sequence[Path]) -> str:
    """The n-gram "sentence" unit for a corpus: ``paragraphs`` when ``.py`` source is most of it
    (by bytes; blank lines separate blocks, and the newlines inside a block stay in the text),
    ``lines`` otherwise (KenLM's one sentence per line). A code corpus with a few ``.txt`` files
    (licences, package metadata) stays ``paragraphs``: as ``lines`` its LM would never see a
    newline token, and every draft that crosses a line end would cost the unseen-id penalty."""
    code = total = 0
    for p in files:
        size = p.stat().st_size
        total += size
        code += size if p.name.endswith((".py", ".py.gz")) else 0
    if total == 0:
        return "paragraphs" if all(p.name.endswith((".py", ".py.gz")) for p in files) else "lines"
    return "paragraphs" if 2 * code >= total else "lines"


def validate(opts: BuildOptions) -> None:
    from latticedraft.lm.wfst import check_unk_cost
    from latticedraft.paths import check_writable

    opts.memory = parse_memory(opts.memory)
    check_unk_cost(opts.unk_cost)
    if opts.sentences is not None and opts.sentences not in SENTENCES:
        raise InputError(f"--sentences {opts.sentences!r}: use one of {', '.join(SENTENCES)}")
    check_writable(opts.out, "--out", "directory")
    if not MIN_ORDER <= opts.order <= MAX_ORDER:
        raise InputError(f"--order {opts.order} is outside {MIN_ORDER}..{MAX_ORDER}; pick an n-gram order in that range")
    if (opts.tokenizer is None) == (opts.train_tokenizer is None):
        raise InputError("give exactly one of --tokenizer PATH (share a model's vocabulary) or --train-tokenizer VOCAB_SIZE")
    if opts.prune is not None:
        p = list(opts.prune)
        if not p or p[0] != 0 or any(x < 0 for x in p) or any(b < a for a, b in zip(p, p[1:])):
            raise InputError(f"--prune {' '.join(map(str, p))} is invalid: thresholds are per order, start with 0 "
                             "(unigrams cannot be pruned) and never decrease, e.g. --prune 0 0 1 3")
        if len(p) > opts.order:
            raise InputError(f"--prune gives {len(p)} thresholds for an order-{opts.order} model; give at most {opts.order}")
    if opts.encoding_errors not in ("strict", "replace"):
        raise InputError(f"--encoding-errors {opts.encoding_errors!r}: use strict or replace")
    if opts.temp_dir is not None and not Path(opts.temp_dir).is_dir():
        raise InputError(f"--temp-dir {opts.temp_dir} is not an existing directory; create it or pick another")
    if opts.train_tokenizer is not None and not MIN_TRAIN_VOCAB <= opts.train_tokenizer <= MAX_VOCAB:
        raise InputError(f"--train-tokenizer {opts.train_tokenizer} is outside {MIN_TRAIN_VOCAB}..{MAX_VOCAB}: byte-level "
                         "BPE needs 256 bytes + end-of-text, and token ids label the WFST as int32 (id + 1)")
    _check_memory(opts.memory)
    claim_dir(opts.out, LM_BUILD, force=opts.force,
              inputs={"--corpus": list(opts.corpus), "--tokenizer": opts.tokenizer})


def _check_memory(memory: str) -> None:
    """An absolute ``--memory`` must fit the machine: lmplz allocates it up front and fails late."""
    from latticedraft.memory import available_bytes, human

    m = _SIZE.match(memory)
    number, unit = float(m.group(1)), m.group(2).lower()
    if unit == "%":
        return
    scale = 1024 ** ("bkmgtpezy".index(unit) if unit else 1)  # lmplz reads a bare number as KiB
    want, have = int(number * scale), available_bytes()
    if have is not None and want > have:
        raise InputError(f"--memory {memory} asks lmplz and build_binary for {human(want)}, but {human(have)} is "
                         f"available on this machine; give at most {have // 2**20}M (or a percentage, e.g. 50%)")


def _versions() -> dict:
    v = {}
    for pkg in ("kenlm", "tokenizers", "pynini", "numpy", "numba", "latticedraft"):
        try:
            v[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            v[pkg] = None
    from latticedraft.paths import kenlm_tool

    for tool in ("lmplz", "build_binary"):
        p = kenlm_tool(tool)
        v[tool] = str(p)
    v["python"] = platform.python_version()
    return v


def build(opts: BuildOptions) -> dict:
    """Run the whole pipeline; returns the manifest (also written to ``out/manifest.json``)."""
    validate(opts)
    out = Path(opts.out).resolve()
    files = resolve_corpus(opts.corpus)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        manifest = _build_into(work, files, opts)
        _install(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return manifest


def _install(work: Path, out: Path) -> None:
    """Swap the finished build into ``out``. What an earlier build wrote there is removed after;
    anything else in ``out`` (files the user put beside the build) is moved into the new one."""
    old = None
    if out.exists():
        for f in out.iterdir():
            if not LM_BUILD.owns(f.name) and not (work / f.name).exists():
                os.replace(f, work / f.name)
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
    publish_mode(work, directory=True)
    os.replace(work, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@dataclass
class _Tokenized:
    """Steps 1-2: the tokenizer (``source``: the manifest's tokenizer fields), its vocabulary size,
    the corpus as token ids in ``ids_path``, the sentence unit and the counts (``CorpusStats``)."""

    tok: Tokenizer
    source: dict
    vocab_size: int
    ids_path: Path
    sentences: str
    stats: CorpusStats


@dataclass
class _Built:
    """Steps 3-6: lmplz's result, the unseen-id cost as set in the ARPA (``unk_log10``, ``unk_cost``;
    ``lmplz_unk_log10``: what lmplz had written), the WFST, n-grams per order and the tables' meta."""

    lmplz: LmplzResult
    unk_log10: float
    unk_cost: float
    lmplz_unk_log10: float
    fst: NgramFst
    counts: list[int]
    tables_meta: dict


def _tokenize(work: Path, files: list[Path], opts: BuildOptions, stage: StageLog) -> _Tokenized:
    """Steps 1 and 2: load or train the tokenizer (saved as ``tokenizer.json``), then stream the
    corpus to ``corpus.ids``; refuses a corpus with no text or fewer tokens than ``--order``."""
    from latticedraft.lm.corpus_ids import write_token_ids

    t = opts.timings
    t0 = time.perf_counter()
    if opts.tokenizer is not None:
        tok = load_tokenizer(opts.tokenizer)
        tok_src = {"source": str(Path(opts.tokenizer).resolve()), "trained": False}
    else:
        tok = train_tokenizer(files, int(opts.train_tokenizer), opts.encoding_errors)
        tok_src = {"source": None, "trained": True, "train_vocab_size": int(opts.train_tokenizer)}
    tok.save(str(work / "tokenizer.json"))
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    t["tokenizer_s"] = time.perf_counter() - t0
    stage(f"tokenizer: {vocab_size} tokens, {len(files)} corpus file(s)", t["tokenizer_s"])

    ids_path = work / "corpus.ids"  # streamed to disk
    sentences = opts.sentences or default_sentences(files)
    stats = write_token_ids(files, tok, ids_path, opts.encoding_errors, opts.progress, sentences)
    t["tokenize_s"] = stats.seconds
    stage(f"tokenized: {stats.tokens} tokens, {stats.chunks} {sentences}, {stats.bytes} bytes", stats.seconds)
    if stats.tokens == 0:
        raise InputError(f"the corpus ({len(files)} file(s), first {files[0]}) holds no text; give a non-empty corpus")
    if stats.tokens < opts.order:
        raise InputError(f"the corpus has only {stats.tokens} tokens, fewer than --order {opts.order} needs; "
                         "give more text or a lower --order")
    return _Tokenized(tok, tok_src, vocab_size, ids_path, sentences, stats)


def _estimate(work: Path, text: _Tokenized, opts: BuildOptions, stage: StageLog) -> _Built:
    """Steps 3-6: lmplz -> ``lm.arpa`` (``corpus.ids`` removed after); then, while a child process
    builds the KenLM trie ``lm.bin``, the WFST (``lm.fst`` + ``lm.npz``) and the search tables.
    KenLM's temporary files go to a private directory (under ``--temp-dir``, else the build),
    removed after."""
    from latticedraft.lm.kenlm_tools import BuildBinaryJob, run_lmplz
    from latticedraft.lm.arpa import float32_exact_unk, set_unk_log10

    t = opts.timings
    tmp_dir = Path(tempfile.mkdtemp(prefix="latticedraft-kenlm-", dir=opts.temp_dir or work))
    try:
        arpa = work / "lm.arpa"
        t0 = time.perf_counter()
        lr = run_lmplz(text.ids_path, arpa, opts.order, opts.prune, opts.memory, tmp_dir)
        t["lmplz_s"] = time.perf_counter() - t0
        stage(f"lmplz: order {opts.order} ARPA, {arpa.stat().st_size} bytes", t["lmplz_s"])
        text.ids_path.unlink()
        # Appendix D: unseen ids cost unk_cost; KenLM's <unk> gets the same so lm.bin agrees with lm.fst
        # (snapped to a float32 pair, see float32_exact_unk)
        unk_log10, unk_cost = float32_exact_unk(opts.unk_cost)
        lmplz_unk_log10 = set_unk_log10(arpa, unk_log10)

        # the KenLM trie, in a child process while this one does the WFST and the tables (all three only read the ARPA)
        trie = BuildBinaryJob(arpa, work / "lm.bin", opts.memory, tmp_dir)
        try:
            fst, counts, tables_meta = _fst_and_tables(work, arpa, text.vocab_size, unk_cost, t, stage)
            t["build_binary_s"] = trie.wait()
            stage(f"build_binary: KenLM trie, {(work / 'lm.bin').stat().st_size} bytes (beside the WFST)",
                  t["build_binary_s"])
        finally:
            trie.stop()
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return _Built(lr, unk_log10, unk_cost, lmplz_unk_log10, fst, counts, tables_meta)


def _fst_and_tables(work: Path, arpa: Path, vocab_size: int, unk_cost: float, t: dict,
                    stage: StageLog) -> tuple[NgramFst, list[int], dict]:
    """Steps 5 and 6: ARPA -> WFST (+ CSR cache), then the search tables memory-mapped at load
    (``lm/search_tables.py``); returns (the ``NgramFst``, n-grams per order, the tables' meta)."""
    from latticedraft.lm.search_tables import save_tables
    from latticedraft.lm.wfst import arpa_to_fst

    t0 = time.perf_counter()
    fst = arpa_to_fst(arpa, work / "lm.fst", vocab_size=vocab_size, unk_cost=unk_cost)
    t["arpa_to_fst_s"] = time.perf_counter() - t0
    counts = _arpa_counts(arpa)
    stage(f"WFST: {fst.num_states} states, {fst.num_arcs} arcs; n-grams per order {counts}", t["arpa_to_fst_s"])
    t0 = time.perf_counter()
    tables = save_tables(fst, work)
    t["tables_s"] = time.perf_counter() - t0
    tables_meta = json.loads((tables / "meta.json").read_text())
    stage(f"search tables: {tables_meta['bytes'] / 2**20:.0f} MiB", t["tables_s"])
    return fst, counts, tables_meta


def _manifest(work: Path, opts: BuildOptions, text: _Tokenized, built: _Built) -> dict:
    """The build's ``manifest.json`` content: what was built from what, with which tools, how long each step took."""
    stats, fst, unk_cost, vocab_size = text.stats, built.fst, built.unk_cost, text.vocab_size
    return {
        "format": "latticedraft-ngram",
        "manifest_version": MANIFEST_VERSION,
        "order": opts.order,
        "vocab_size": vocab_size,
        "ngram_counts": built.counts,
        "corpus": {
            "tokens": stats.tokens,
            "chunks": stats.chunks,
            "sentences": text.sentences,
            "sentences_chosen_by": "--sentences" if opts.sentences else "corpus kind (paragraphs when .py code "
                                                                        "is most of its bytes, else lines)",
            "bytes": stats.bytes,
            "encoding_errors": opts.encoding_errors,
            "files": stats.files,
        },
        "tokenizer": {"file": "tokenizer.json", "fingerprint": fingerprint(text.tok), "vocab_size": vocab_size,
                      **text.source},
        "lmplz": {"prune": opts.prune, "memory": opts.memory, "discount_fallback": built.lmplz.discount_fallback,
                  "smoothing": "interpolated modified Kneser-Ney (lmplz)",
                  "unk_log10_from_lmplz": built.lmplz_unk_log10},
        "unk": {"requested_cost": opts.unk_cost, "cost": unk_cost, "log10": built.unk_log10,
                "note": "ids absent from the corpus, and KenLM's <unk> in lm.arpa/lm.bin, cost `cost` nats "
                        "(the requested cost snapped so float32 log10 and float32 cost agree)"},
        "fst": {"file": "lm.fst", "npz": "lm.npz", "states": fst.num_states, "arcs": fst.num_arcs,
                "bytes": (work / "lm.fst").stat().st_size, "start": fst.start, "unigram": fst.unigram,
                "unk_cost": unk_cost, "final_weights": "zero (prefix scores)"},
        "files": {"arpa": "lm.arpa", "kenlm_binary": "lm.bin", "fst": "lm.fst", "npz": "lm.npz",
                  "tables": "tables/", "tokenizer": "tokenizer.json"},
        "tables": {"dir": "tables", "bytes": built.tables_meta["bytes"], "version": built.tables_meta["version"]},
        "tools": _versions(),
        "timings_s": {k: round(v, 4) for k, v in opts.timings.items()},
        "built_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
    }


def _build_into(work: Path, files: list[Path], opts: BuildOptions) -> dict:
    """Build everything into ``work``: tokenizer and token ids, lmplz, the trie beside the WFST and
    tables, then ``manifest.json`` (written last); returns the manifest."""
    t_all = time.perf_counter()
    stage = StageLog(opts.progress, t_all)
    text = _tokenize(work, files, opts, stage)
    built = _estimate(work, text, opts, stage)
    opts.timings["total_s"] = time.perf_counter() - t_all
    manifest = _manifest(work, opts, text, built)
    write_manifest(work, manifest)
    return manifest


class StageLog:
    """One line per finished stage on stderr (what, counts, its seconds, elapsed) when stderr is
    not a terminal, so a build piped to a log shows progress; on a terminal the tqdm bars do.
    ``progress=False`` silences it, ``True`` forces it."""

    def __init__(self, progress: bool | None, t_start: float):
        import sys

        self.on = (not sys.stderr.isatty()) if progress is None else bool(progress)
        self.t_start = t_start

    def __call__(self, what: str, seconds: float) -> None:
        if self.on:
            import sys

            print(f"lm build: {what} ({seconds:.1f} s; elapsed {time.perf_counter() - self.t_start:.1f} s)",
                  file=sys.stderr, flush=True)


def _arpa_counts(arpa: Path) -> list[int]:
    counts = []
    with open(arpa, "rb") as f:
        for line in f:
            line = line.strip()
            if line.startswith(b"ngram "):
                counts.append(int(line.split(b"=")[1]))
            elif line.startswith(b"\\1-grams"):
                break
    return counts


def write_manifest(d: Path, manifest: dict) -> None:
    with atomic_file(d / MANIFEST) as tmp, open(tmp, "w") as f:
        json.dump(manifest, f, indent=2, default=_json_default)
        f.write("\n")


def _json_default(o):
    if isinstance(o, float) and math.isnan(o):
        return None
    if isinstance(o, Path):
        return str(o)
    raise TypeError(type(o))


def read_manifest(d: str | Path) -> dict:
    d = Path(d)
    m = d / MANIFEST
    if d.exists() and not d.is_dir():
        raise InputError(f"LM directory {d} is a file, not a directory; pass the directory `latticedraft lm build` "
                         "wrote (it holds manifest.json)")
    if not d.is_dir():
        raise InputError(f"LM directory {d} does not exist; build one with `latticedraft lm build --out {d}`")
    if not m.is_file():
        from latticedraft.outputs import describe_dir

        names = [p.name for p in d.iterdir()]
        what = ("not an LM build (the directory is empty)" if not names
                else "not a complete LM build (a build writes it last)" if all(LM_BUILD.owns(n) for n in names)
                else f"not an LM build (it holds {describe_dir(d)})")
        raise InputError(f"{d} holds no {MANIFEST}, so it is {what}; pass a directory written by `latticedraft lm "
                         "build`, or build one into a new directory with `latticedraft lm build --corpus FILES "
                         "--tokenizer TOKENIZER --out NEW_DIR`")
    try:
        return json.loads(m.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{m} cannot be read ({e}); rebuild the LM") from e

"""The n-gram LM as the arrays the exact searches read (``LMArrays``), built once and memory-mapped.

``LMArrays`` holds an ``NgramFst``'s CSR arrays in the dtypes the compiled kernels take
(``lattice/lm_tables.py``, ``lattice/state_dp.py``), plus ``arc_hash``: an open-addressing
table (int32 arc ids, -1 empty) over the arcs of every CSR row longer than 16 arcs, so a single
look-up in a long row costs one or two probes (``_find``: the history's walk). The lattice
search itself reads rows whole or binary-searches them (``state_dp``).

**On disk.** ``save_tables`` writes them, with the FST's final costs, as uncompressed ``.npy``
files in ``DIR/tables/`` (a directory renamed into place when complete; ``meta.json`` names the
build they belong to). ``load_tables`` maps them with ``np.load(mmap_mode="c")``: a process
starts in milliseconds, pages are shared between processes (copy-on-write, never written),
and RSS grows only with what a search touches. ``latticedraft lm build`` writes them;
``latticedraft lm index DIR`` adds them to an older build; ``NgramLM`` adds them once, with a
notice on stderr, on first use of a build without them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
from numba import njit

from latticedraft.atomic import publish_mode
from latticedraft.errors import ModelError

UNSEEN_COST = 1000.0  # -ln p of an id the LM has never seen (the paper's Appendix D convention)
TABLES_DIR = "tables"
TABLES_VERSION = 1
HASH_MIN_ROW = 16  # rows with more arcs than this are looked up through arc_hash


@dataclass
class LMArrays:
    """The CSR arrays of an ``NgramFst`` in the dtypes the kernels take, plus the arc hash.

    ``offsets int64[S+1]``, ``labels int32[A]`` (token+1, ascending per row), ``costs
    float32[A]`` (-ln p), ``nexts int32[A]``, ``bo_next int32[S]`` (-1: none), ``bo_cost
    float32[S]``, ``arc_hash int32[2^m]``.
    """

    vocab_size: int
    offsets: np.ndarray
    labels: np.ndarray
    costs: np.ndarray
    nexts: np.ndarray
    bo_next: np.ndarray
    bo_cost: np.ndarray
    unigram: int
    start: int
    unk_cost: float
    arc_hash: np.ndarray
    order: int = 0

    def lm_args(self) -> tuple:
        return (self.offsets, self.labels, self.costs, self.nexts, self.bo_next, self.bo_cost,
                self.unigram, self.vocab_size, self.unk_cost, self.arc_hash)

    @property
    def nbytes(self) -> int:
        """Bytes of every array held (the memory-mapped size when loaded from disk)."""
        arrs = [getattr(self, f.name) for f in fields(self)]
        return int(sum(a.nbytes for a in arrs if isinstance(a, np.ndarray)))


def _fingerprint(fst) -> tuple:
    return (id(fst.state_offsets), id(fst.arc_label), id(fst.arc_cost), id(fst.arc_next),
            id(fst.backoff_next), id(fst.backoff_cost), int(fst.start), int(fst.unigram),
            float(getattr(fst, "unk_cost", UNSEEN_COST)))


def lm_arrays(fst) -> LMArrays:
    """``LMArrays`` for an ``NgramFst``, cached on the object (seconds for millions of arcs; a
    build's ``tables/`` attach theirs through ``attach``, see ``NgramLM.fst``).

    The cache is rebuilt when any of the FST's arrays is replaced (e.g. ``set_unk_cost``).
    """
    key = _fingerprint(fst)
    cached = getattr(fst, "_lattice_search_arrays", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    arr = build_arrays(fst)
    attach(fst, arr)
    return arr


def attach(fst, arrays: LMArrays) -> None:
    """Cache ``arrays`` on ``fst`` for ``lm_arrays`` (they must have been built from it)."""
    try:
        object.__setattr__(fst, "_lattice_search_arrays", (_fingerprint(fst), arrays))
    except (AttributeError, TypeError):
        pass


def build_arrays(fst) -> LMArrays:
    """``LMArrays`` of an ``NgramFst`` (its CSR arrays and the arc hash)."""
    V = int(fst.vocab_size)
    off = np.ascontiguousarray(fst.state_offsets, dtype=np.int64)
    lab = np.ascontiguousarray(fst.arc_label, dtype=np.int32)
    cost = np.ascontiguousarray(fst.arc_cost, dtype=np.float32)
    nxt = np.ascontiguousarray(fst.arc_next, dtype=np.int32)
    bon = np.ascontiguousarray(fst.backoff_next, dtype=np.int32)
    boc = np.ascontiguousarray(fst.backoff_cost, dtype=np.float32)
    S = len(bon)
    uni = int(fst.unigram)
    if len(off) != S + 1 or off[-1] != len(lab):
        raise ModelError(f"NgramFst arrays disagree: {S} states, {len(off)} offsets, {len(lab)} arcs")
    ulo, uhi = off[uni], off[uni + 1]
    if uhi - ulo != V or not np.array_equal(lab[ulo:uhi], np.arange(1, V + 1, dtype=np.int32)):
        raise ModelError(
            f"the n-gram FST's unigram state has {uhi - ulo} arcs, expected one for every label 1..{V}; "
            "rebuild the LM with `latticedraft lm build`"
        )
    return LMArrays(V, off, lab, cost, nxt, bon, boc, uni, int(fst.start),
                    float(getattr(fst, "unk_cost", UNSEEN_COST)), _build_hash(off, lab, uni), int(fst.order))


# --------------------------------------------------------------------------------------------
# the arc hash (its probe sequence is inlined into the lattice kernels' _find)


@njit(cache=True, inline="always")
def _hash(s, label, mask):
    x = s * 2654435761 + label * 40503
    x ^= x >> 15
    x *= 0x2C1B3C6D
    x ^= x >> 12
    return x & mask


@njit(cache=True)
def _build_hash(off, lab, skip_row):
    """Open-addressing table (int32 arc ids, -1 empty) over the arcs of every row longer than
    ``HASH_MIN_ROW`` but ``skip_row`` (shorter rows are scanned in place by ``_find``)."""
    n = 0
    for r in range(off.shape[0] - 1):
        if r != skip_row and off[r + 1] - off[r] > 16:
            n += off[r + 1] - off[r]
    size = 16
    while size < 2 * n + 16:
        size *= 2
    mask = size - 1
    tab = np.full(size, -1, np.int32)
    for r in range(off.shape[0] - 1):
        if r == skip_row or off[r + 1] - off[r] <= 16:
            continue
        for a in range(off[r], off[r + 1]):
            slot = _hash(r, lab[a], mask)
            while tab[slot] >= 0:
                slot = (slot + 1) & mask
            tab[slot] = a
    return tab


# --------------------------------------------------------------------------------------------
# on disk

_CORE = ("offsets", "labels", "costs", "nexts", "bo_next", "bo_cost", "arc_hash")


def tables_present(build_dir: str | Path, expect: dict | None = None) -> bool:
    """Whether ``build_dir/tables`` holds complete tables (matching ``expect``'s meta keys)."""
    meta = Path(build_dir) / TABLES_DIR / "meta.json"
    if not meta.is_file():
        return False
    try:
        m = json.loads(meta.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    if m.get("version") != TABLES_VERSION:
        return False  # another layout
    return all(m.get(k) == v for k, v in (expect or {}).items())


def fst_meta(fst) -> dict:
    """What identifies the automaton the tables were built from (checked on load)."""
    return {"order": int(fst.order), "vocab_size": int(fst.vocab_size), "states": int(len(fst.backoff_next)),
            "arcs": int(len(fst.arc_label)), "start": int(fst.start), "unigram": int(fst.unigram),
            "unk_cost": float(fst.unk_cost)}


def save_tables(fst, build_dir: str | Path, arrays: LMArrays | None = None) -> Path:
    """Write ``build_dir/tables/`` for ``fst`` (the ``NgramFst`` of that build): every array
    of ``LMArrays`` and the FST's final costs as ``.npy``, then ``meta.json``. Written in a
    temporary sibling directory renamed into place, so an interrupted write leaves nothing."""
    d = Path(build_dir)
    arrays = arrays if arrays is not None else build_arrays(fst)
    work = Path(tempfile.mkdtemp(prefix=f".{TABLES_DIR}.writing-", dir=d))
    try:
        for name in _CORE:
            np.save(work / f"{name}.npy", getattr(arrays, name))
        np.save(work / "final_cost.npy", np.ascontiguousarray(fst.final_cost, dtype=np.float32))
        meta = {"version": TABLES_VERSION, **fst_meta(fst), "unk_arpa_cost": float(fst.unk_arpa_cost),
                "bytes": int(sum(p.stat().st_size for p in work.glob("*.npy")))}
        (work / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        publish_mode(work, directory=True)
        out = d / TABLES_DIR
        old = None
        if out.exists():
            old = d / f".{TABLES_DIR}.old-{os.getpid()}"
            os.replace(out, old)
        os.replace(work, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return d / TABLES_DIR


def load_tables(build_dir: str | Path):
    """``(fst, arrays)``: the build's ``NgramFst`` and ``LMArrays`` over memory-mapped ``tables/``
    (copy-on-write maps: shared page cache, never written back). ``arrays`` is attached to
    ``fst`` so ``lm_arrays(fst)`` returns it."""
    from latticedraft.lm.wfst import NgramFst

    d = Path(build_dir) / TABLES_DIR
    try:
        m = json.loads((d / "meta.json").read_text())
        a = {n: np.load(d / f"{n}.npy", mmap_mode="c", allow_pickle=False) for n in (*_CORE, "final_cost")}
        fst = NgramFst(order=m["order"], vocab_size=m["vocab_size"], state_offsets=a["offsets"],
                       arc_label=a["labels"], arc_cost=a["costs"], arc_next=a["nexts"], backoff_next=a["bo_next"],
                       backoff_cost=a["bo_cost"], start=m["start"], unigram=m["unigram"],
                       final_cost=a["final_cost"], unk_cost=m["unk_cost"], unk_arpa_cost=m["unk_arpa_cost"])
        arrays = LMArrays(m["vocab_size"], a["offsets"], a["labels"], a["costs"], a["nexts"], a["bo_next"],
                          a["bo_cost"], m["unigram"], m["start"], m["unk_cost"], a["arc_hash"], m["order"])
    except (OSError, KeyError, ValueError, json.JSONDecodeError) as e:
        raise ModelError(f"{d} cannot be read ({e}); rebuild the tables with `latticedraft lm index "
                         f"{Path(build_dir)}`") from e
    attach(fst, arrays)
    return fst, arrays

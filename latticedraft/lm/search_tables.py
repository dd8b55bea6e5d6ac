"""The n-gram LM as the arrays the exact searches read (``LMArrays``), built once and memory-mapped.

``LMArrays`` holds an ``NgramFst``'s CSR arrays in the dtypes the compiled kernels take
(``lattice/lm_tables.py``, ``lattice/triple_dp.py``, ``lattice/state_dp.py``), plus:

- ``arc_hash``: an open-addressing table (int32 arc ids, -1 empty) over the arcs of every CSR
  row longer than 16 arcs, so a look-up in a long row costs one or two probes (``_find``);
- ``state_rec``: per state, its arc range, back-off state and back-off cost packed in 16 bytes,
  so the state program reads one cache line per state where three arrays cost three;
- *triple tables* (order <= 4): the states of two and three tokens, addressable by their
  tokens, packed with their arc range and back-off (``_triple_tables``). Orders above 4 need
  nothing beyond the CSR arrays and ``state_rec`` (``state_dp`` reads the states' own rows).

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
TABLES_VERSION = 2  # 2: state_rec
HASH_MIN_ROW = 16  # rows with more arcs than this are looked up through arc_hash
# packed context entries of the order <= 4 tables (see _triple_tables); arc indices are int32
P2_ENTRY = np.dtype([("lo", "i4"), ("hi", "i4"), ("xlo", "i4"), ("xhi", "i4"), ("bo", "i4"), ("boc", "f4")],
                    align=True)
X3_ENTRY = np.dtype([("lo", "i4"), ("hi", "i4"), ("boc", "f4")], align=True)
_TRIPLE_NAMES = ("ctx1x", "p2_off", "p2_lab", "p2", "x_lab", "x3")


@dataclass
class LMArrays:
    """The CSR arrays of an ``NgramFst`` in the dtypes the kernels take, plus search tables.

    ``offsets int64[S+1]``, ``labels int32[A]`` (token+1), ``costs float32[A]`` (-ln p),
    ``nexts int32[A]``, ``bo_next int32[S]``, ``bo_cost float32[S]``; ``uni_logp float64[V]``:
    the null state's ln p; ``ctx1 int64[V]``: the state of the one-token context ``(a)`` (-1
    if the model keeps none); ``state_rec int32[4S]``: state ``s`` at ``4s .. 4s+3`` (arc range
    ``lo``, ``hi``, back-off state, back-off cost as float32 bits: ``state_args``).
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
    uni_logp: np.ndarray
    ctx1: np.ndarray
    state_rec: np.ndarray
    order: int = 0
    triple: tuple | None = None  # exact (x, b, a) context tables when order <= 4, see _triple_tables

    def lm_args(self) -> tuple:
        return (self.offsets, self.labels, self.costs, self.nexts, self.bo_next, self.bo_cost,
                self.unigram, self.vocab_size, self.unk_cost, self.arc_hash)

    def state_args(self) -> tuple:
        """``(state_rec, the same memory as float32)``: what the state program takes."""
        return self.state_rec, self.state_rec.view(np.float32)

    @property
    def nbytes(self) -> int:
        """Bytes of every array held (the memory-mapped size when loaded from disk)."""
        arrs = [getattr(self, f.name) for f in fields(self)] + list(self.triple or ())
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


def _structure(off, lab, nxt, bon, uni, start, V):
    """Per-state facts the tables need: ``last`` token of each state (-1: null/<s>), ``code``
    (``last`` with ``<s>`` = V), ``ctx1``, ``long_state`` (two or more tokens), ``prev`` (the
    second-to-last token of a long state, -1 unknown) and ``arc_state`` (the source of each arc)."""
    S = len(bon)
    last = np.full(S, -1, dtype=np.int64)
    last[nxt] = lab.astype(np.int64) - 1
    last[uni] = -1
    arc_state = np.repeat(np.arange(S, dtype=np.int64), np.diff(off))
    ulo = off[uni]
    ctx1 = nxt[ulo:ulo + V].astype(np.int64)
    ctx1[ctx1 == uni] = -1
    is_ctx1 = np.zeros(S, dtype=bool)
    is_ctx1[ctx1[ctx1 >= 0]] = True
    long_state = (last >= 0) & ~is_ctx1
    long_state[uni] = False
    code = last.copy()
    code[int(start)] = V  # <s>
    prev = np.full(S, -1, dtype=np.int64)
    into_long = long_state[nxt]
    prev[nxt[into_long]] = code[arc_state[into_long]]
    return last, ctx1, long_state, prev, arc_state


def build_arrays(fst) -> LMArrays:
    """``LMArrays`` of an ``NgramFst`` (CSR, arc hash, and the triple tables when order <= 4)."""
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
    uni_logp = -cost[ulo:uhi].astype(np.float64)
    ctx1 = nxt[ulo:uhi].astype(np.int64)
    ctx1[ctx1 == uni] = -1
    arrays = LMArrays(V, off, lab, cost, nxt, bon, boc, uni, int(fst.start),
                      float(getattr(fst, "unk_cost", UNSEEN_COST)), _build_hash(off, lab, uni), uni_logp,
                      ctx1, _state_records(off, bon, boc), int(fst.order))
    if int(fst.order) <= 4:  # the per-state facts (an int64 per arc among them) only the triple tables need
        last, ctx1, long_state, prev, arc_state = _structure(off, lab, nxt, bon, uni, int(fst.start), V)
        arrays.triple = _triple_tables(V, int(fst.start), uni, off, nxt, bon, boc, last, long_state, prev, ctx1,
                                       arc_state)
    return arrays


def _state_records(off, bon, boc) -> np.ndarray:
    """``int32[4S]``: per state ``lo, hi, back-off state, back-off cost (float32 bits)``."""
    if off[-1] >= 2 ** 31:
        raise ModelError(f"the n-gram FST has {off[-1]} arcs; the search tables index arcs with int32 "
                         f"(at most {2 ** 31 - 1}); prune the LM (--prune) or lower its order")
    rec = np.empty((len(bon), 4), np.int32)
    rec[:, 0] = off[:-1]
    rec[:, 1] = off[1:]
    rec[:, 2] = bon
    rec.view(np.float32)[:, 3] = boc
    return rec.reshape(-1)


def _triple_tables(V, start, uni, off, nxt, bon, boc, last, long_state, prev, ctx1, arc_state) -> tuple | None:
    """The states of two and three tokens, addressable by their tokens (order <= 4 only).

    Returns ``(ctx1x, p2_off, p2_lab, p2, x_lab, x3)``: ``ctx1x[a]`` the one-token state of
    ``a`` (``a = V``: ``<s>``, the start state); a CSR over ``b`` (0..V) with labels ``a+1``
    whose entry ``r`` is the context ``(b, a)``: ``p2[r]`` (``P2_ENTRY``) holds its state's arc
    range ``lo:hi``, its back-off state and cost, and the range ``xlo:xhi`` of its three-token
    contexts ``(x, b, a)`` in ``x_lab`` (labels ``x+1``, ascending; ``x = V``: ``<s>``) and
    ``x3`` (``X3_ENTRY``: arc range and back-off cost; they back off to ``(b, a)``). The packing
    saves the chained look-ups state -> offsets -> back-off (~16 bytes per context, ~20 MB for
    the bundled 4-gram). ``None`` when arc indices exceed int32 (the state search is used).
    """
    S = len(bon)
    if off[-1] >= 2 ** 31:
        return None
    ctx1x = np.concatenate([ctx1, [start]]).astype(np.int64)
    three = long_state & (bon >= 0)
    three &= long_state[np.maximum(bon, 0)]
    two = long_state & ~three & (prev >= 0)
    # third-to-last token of a three-token state = second-to-last of a state with an arc into it
    third = np.full(S, -1, dtype=np.int64)
    into3 = three[nxt]
    src = arc_state[into3]
    third[nxt[into3]] = np.where(long_state[src], prev[src], -1)
    three &= third >= 0
    s2 = np.nonzero(two)[0]
    key2 = prev[s2] * (V + 1) + last[s2]
    o = np.argsort(key2, kind="stable")
    s2, key2 = s2[o], key2[o]
    p2_off = np.searchsorted(key2 // (V + 1), np.arange(V + 2)).astype(np.int64)
    p2_lab = (key2 % (V + 1) + 1).astype(np.int32)
    s3 = np.nonzero(three)[0]
    # parent two-token entry of each three-token state: its back-off state
    pos = np.full(S, -1, dtype=np.int64)
    pos[s2] = np.arange(len(s2))
    par = pos[bon[s3]]
    ok = par >= 0
    s3, par = s3[ok], par[ok]
    o = np.lexsort((third[s3], par))
    s3, par = s3[o], par[o]
    x_off = np.searchsorted(par, np.arange(len(s2) + 1)).astype(np.int64)
    x_lab = (third[s3] + 1).astype(np.int32)
    # packed entries: a context's arc range and back-off next to each other (one cache line)
    p2 = np.empty(len(s2), P2_ENTRY)
    p2["lo"], p2["hi"] = off[s2], off[s2 + 1]
    p2["xlo"], p2["xhi"] = x_off[:-1], x_off[1:]
    p2["bo"], p2["boc"] = bon[s2], boc[s2]
    x3 = np.empty(len(s3), X3_ENTRY)
    x3["lo"], x3["hi"], x3["boc"] = off[s3], off[s3 + 1], boc[s3]
    return (ctx1x, p2_off, p2_lab, p2, x_lab, x3)


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

_CORE = ("offsets", "labels", "costs", "nexts", "bo_next", "bo_cost", "arc_hash", "uni_logp", "ctx1", "state_rec")


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
        if arrays.triple is not None:
            for name, a in zip(_TRIPLE_NAMES, arrays.triple):
                np.save(work / f"{name}.npy", a)
        meta = {"version": TABLES_VERSION, **fst_meta(fst), "unk_arpa_cost": float(fst.unk_arpa_cost),
                "triple": arrays.triple is not None,
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
        names = (*_CORE, "final_cost", *(_TRIPLE_NAMES if m["triple"] else ()))
        a = {n: np.load(d / f"{n}.npy", mmap_mode="c", allow_pickle=False) for n in names}
        triple = tuple(a[n] for n in _TRIPLE_NAMES) if m["triple"] else None
        fst = NgramFst(order=m["order"], vocab_size=m["vocab_size"], state_offsets=a["offsets"],
                       arc_label=a["labels"], arc_cost=a["costs"], arc_next=a["nexts"], backoff_next=a["bo_next"],
                       backoff_cost=a["bo_cost"], start=m["start"], unigram=m["unigram"],
                       final_cost=a["final_cost"], unk_cost=m["unk_cost"], unk_arpa_cost=m["unk_arpa_cost"])
        arrays = LMArrays(m["vocab_size"], a["offsets"], a["labels"], a["costs"], a["nexts"], a["bo_next"],
                          a["bo_cost"], m["unigram"], m["start"], m["unk_cost"], a["arc_hash"], a["uni_logp"],
                          a["ctx1"], a["state_rec"], m["order"], triple)
    except (OSError, KeyError, ValueError, json.JSONDecodeError) as e:
        raise ModelError(f"{d} cannot be read ({e}); rebuild the tables with `latticedraft lm index "
                         f"{Path(build_dir)}`") from e
    attach(fst, arrays)
    return fst, arrays

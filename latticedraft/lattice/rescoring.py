"""Rescoring a sausage with an n-gram LM: the p best distinct drafts.

``score = head_logp + alpha * lm_logp`` (natural log), the LM conditioned on the last
``n-1`` emitted tokens (``history``). Two methods:

- ``"exact"`` (default): the exact p best under true back-off semantics (``search.py``,
  compiled with numba: for n-gram orders <= 4 an exact backward dynamic program over the
  lattice's candidate triples, then best-first enumeration of distinct paths (``triple_dp``);
  above order 4 (``state_dp``) a dynamic program over the LM states each slot reaches, closed
  under back-off). Equal scores are ordered deterministically.
- ``"wfst"``: as the paper does with OpenFST: lattice acceptor ∘ n-gram WFST (from the
  history's state) then ``shortestpath(nshortest=…)``, read until ``p`` distinct strings.
  The WFST's back-off arcs are epsilons, so a string's WFST score is the best over all its
  derivations, which can exceed its true score when backing off "undercuts" the proper
  n-gram; then ``wfst`` may rank differently from ``exact``. ``scores`` are the WFST's.

``rescore_batch`` rescores one lattice per prompt of a batch (a ``SausageBatch`` [B,h,k] or a
list of ``Sausage``); for ``exact`` both it and ``rescore`` run the compiled batch kernels
(``batched.py``), so the drafts of a lattice do not depend on its batch.

``lm`` may be an ``NgramLM`` (uses ``lm.fst``) or an ``NgramFst``; ``lm=None`` or
``alpha=0`` ranks by the head scores alone (the "parallel-base" drafter: ``base_drafts``).
"""

from __future__ import annotations

import math
import os
import struct
from typing import Sequence

import numpy as np

from latticedraft.errors import InputError, ModelError
from latticedraft.lm.wfst import NgramFst
from latticedraft.lattice.batched import pbest_batch
from latticedraft.lattice.lm_tables import _fingerprint, lm_arrays
from latticedraft.lattice.sausage import Drafts, Sausage, SausageBatch
from latticedraft.lattice.search import exact_pbest, history_state

METHODS = ("exact", "wfst")


def _fst_of(lm):
    if lm is None:
        return None
    fst = getattr(lm, "fst", lm)
    for attr in ("state_offsets", "arc_label", "backoff_next", "order", "vocab_size"):
        if not hasattr(fst, attr):
            raise ModelError(f"{type(lm).__name__} is not an NgramLM/NgramFst (no {attr}); load one with NgramLM.load(dir)")
    return fst


def _history_state(fst, history) -> tuple[int, list[int]]:
    """(LM state after the last n-1 history ids, those ids)."""
    hist = [int(t) for t in (history if history is not None else ())]
    keep = max(int(fst.order) - 1, 0)
    hist = hist[-keep:] if keep else []
    if any(t < 0 for t in hist):
        raise InputError(f"history ids must be >= 0, got {hist}")
    V = int(fst.vocab_size)
    if any(t >= V for t in hist):
        # unknown to the LM: the context restarts at the null state, like KenLM's <unk>
        cut = max(i for i, t in enumerate(hist) if t >= V)
        state = int(fst.unigram)
        for t in hist[cut + 1:]:
            state = int(fst.arc_lookup(state, t)[0])
        return state, hist
    if isinstance(fst, NgramFst):  # the same walk as NgramFst.state_for_history, compiled
        return history_state(lm_arrays(fst), int(fst.order), hist), hist
    return int(fst.state_for_history(hist)), hist


def _check_args(alpha: float, nbest: int, method: str) -> None:
    if method not in METHODS:
        raise InputError(f"method {method!r} is unknown; use one of {', '.join(METHODS)}")
    if not math.isfinite(alpha) or alpha < 0:
        raise InputError(f"alpha = {alpha} must be a finite weight >= 0 (the paper sweeps 0.1..10)")
    if int(nbest) < 1:
        raise InputError(f"nbest = {nbest} must be >= 1")


def _check(sausage: Sausage, alpha: float, nbest: int, method: str) -> None:
    if not isinstance(sausage, Sausage):
        raise InputError(f"rescore expects a Sausage, got {type(sausage).__name__}; build one with Sausage.from_logits")
    _check_args(alpha, nbest, method)


def rescore(sausage: Sausage, lm, alpha: float = 1.0, nbest: int = 1, history: Sequence[int] = (),
            method: str = "exact") -> Drafts:
    """The ``nbest`` best distinct paths of ``sausage`` under ``head_logp + alpha * lm_logp``.

    Returns ``Drafts(tokens int64[p, h], scores float32[p])`` best first, ``p = min(nbest,
    sausage.num_paths())`` (``Drafts.truncated`` says when fewer than asked exist).
    ``history``: the emitted token ids so far (only the last ``order - 1`` matter).
    Token ids the LM does not know cost 1000 nats (unseen unigram), never an error.
    """
    _check(sausage, alpha, nbest, method)
    fst = _fst_of(lm)
    if fst is None or alpha == 0.0:
        return base_drafts(sausage, nbest)
    if method == "exact":  # the batch kernel, B = 1
        return _exact_batch(sausage.tokens[None], sausage.logp[None], sausage.widths[None], [history],
                            lm_arrays(fst), float(alpha), int(nbest), 1)[0]
    start, _ = _history_state(fst, history)
    return _wfst_pbest(sausage, fst, start, float(alpha), int(nbest))


def rescore_batch(lattices: SausageBatch | Sequence[Sausage], lm, alpha: float = 1.0, nbest: int = 1,
                  histories=None, method: str = "exact", workers: int | None = None) -> list[Drafts]:
    """``rescore`` for many lattices (one per prompt of a batch); ``histories[b]`` for lattice b.

    ``lattices``: a ``SausageBatch`` (``tokens int64[B,h,k]``, ``logp float32[B,h,k]``: what a
    decoder with a batch of prompts has) or a list of ``Sausage`` (any shapes). ``histories``:
    one id sequence per lattice, or an int array ``[B, L]``; ``None``: all empty (``<s>``).
    Results are in input order and equal ``rescore``'s lattice by lattice. ``method="exact"``
    runs one compiled call per thread over parts of the batch (``workers``, default: the CPU
    count); ``wfst`` maps ``rescore``.
    """
    _check_args(alpha, nbest, method)
    batch = isinstance(lattices, SausageBatch)
    if not batch:
        lattices = list(lattices)
        for s in lattices:
            if not isinstance(s, Sausage):
                raise InputError(f"rescore_batch expects a SausageBatch or Sausages, got {type(s).__name__}; "
                                 "build them with SausageBatch.from_logits")
    B = len(lattices)
    if histories is None:
        histories = [()] * B
    if len(histories) != B:
        raise InputError(f"{B} lattices but {len(histories)} histories; give one history per lattice")
    workers = max(1, min(B, workers or os.cpu_count() or 1))
    fst = _fst_of(lm)
    arrays = lm_arrays(fst) if method == "exact" and fst is not None and alpha != 0.0 else None
    if arrays is not None and B:
        if batch:
            tok, lp, wid = lattices.tokens, lattices.logp, lattices.widths
        else:
            tok, lp, wid = _stack(lattices)
        return _exact_batch(tok, lp, wid, histories, arrays, float(alpha), int(nbest), workers)
    if batch:
        lattices = list(lattices)
    return [rescore(s, lm, alpha, nbest, h, method) for s, h in zip(lattices, histories)]


def _stack(sausages: list[Sausage]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Padded ``tokens [B, h, k]``, ``logp``, ``widths [B, h]`` (0 in slots past a lattice's depth)."""
    shapes = {s.tokens.shape for s in sausages}
    if len(shapes) == 1:
        return (np.stack([s.tokens for s in sausages]), np.stack([s.logp for s in sausages]),
                np.stack([s.widths for s in sausages]))
    H = max(s.h for s in sausages)
    K = max(s.k for s in sausages)
    tok = np.full((len(sausages), H, K), -1, np.int64)
    lp = np.full((len(sausages), H, K), -np.inf, np.float32)
    wid = np.zeros((len(sausages), H), np.int64)
    for b, s in enumerate(sausages):
        tok[b, :s.h, :s.k] = s.tokens
        lp[b, :s.h, :s.k] = s.logp
        wid[b, :s.h] = s.widths
    return tok, lp, wid


def _pack_histories(histories, B: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The last ``n`` ids of each history: ``(int64[B, n], lengths int64[B])``."""
    if isinstance(histories, np.ndarray) and histories.ndim == 2:
        m = min(n, histories.shape[1])
        hist = np.zeros((B, n), np.int64)
        hist[:, :m] = histories[:, histories.shape[1] - m:]
        lens = np.full(B, m, np.int64)
    else:
        hist = np.zeros((B, n), np.int64)
        lens = np.zeros(B, np.int64)
        for b, h in enumerate(histories):
            h = np.asarray(h if h is not None else (), dtype=np.int64).ravel()
            m = min(n, h.shape[0])
            if m:
                hist[b, :m] = h[h.shape[0] - m:]
            lens[b] = m
    if (hist < 0).any():
        b = int(np.argwhere(hist < 0)[0][0])
        raise InputError(f"history ids must be >= 0, got {hist[b, :lens[b]].tolist()} (lattice {b})")
    return hist, lens


def _exact_batch(tok, lp, wid, histories, arrays, alpha: float, nbest: int, workers: int) -> list[Drafts]:
    B = tok.shape[0]
    hist, lens = _pack_histories(histories, B, max(int(arrays.order) - 1, 0))
    depth = (wid > 0).sum(axis=1)
    pool = _pool(workers) if workers > 1 and B >= 4 else None
    chunks = min(B // 2, 2 * workers) if pool is not None else 1
    out, scores, found = pbest_batch(tok, lp, wid, depth, hist, lens, arrays, alpha, nbest, pool, chunks)
    full = bool((depth == tok.shape[1]).all())
    return [Drafts(out[b, :found[b]] if full else np.ascontiguousarray(out[b, :found[b], :depth[b]]),
                   scores[b, :found[b]], nbest) for b in range(B)]


_POOLS: dict = {}


def _pool(n: int):
    from concurrent.futures import ThreadPoolExecutor

    if n not in _POOLS:
        _POOLS[n] = ThreadPoolExecutor(max_workers=n, thread_name_prefix="rescore")
    return _POOLS[n]


def base_drafts(sausage: Sausage, nbest: int = 1) -> Drafts:
    """The p best paths of the un-rescored lattice (head log-probability only, no LM)."""
    if int(nbest) < 1:
        raise InputError(f"nbest = {nbest} must be >= 1")
    cand, scores = exact_pbest(sausage.tokens, sausage.logp, sausage.widths, None, 0, 0.0, int(nbest))
    return _drafts(sausage, cand, scores, nbest)


def _drafts(s: Sausage, cand: np.ndarray, scores: np.ndarray, nbest: int) -> Drafts:
    toks = s.tokens[np.arange(s.h)[None, :], cand] if len(cand) else np.zeros((0, s.h), np.int64)
    return Drafts(np.ascontiguousarray(toks, dtype=np.int64), scores.astype(np.float32), int(nbest))


# ---------------------------------------------------------------------------------------------
# WFST composition (OpenFST through pynini's pywrapfst)

_MAGIC = 2125659606
_HEADER_HEAD = struct.pack("<i", _MAGIC) + struct.pack("<i", 6) + b"vector" + struct.pack("<i", 8) + b"standard"
_ARC = np.dtype([("il", "<i4"), ("ol", "<i4"), ("w", "<f4"), ("next", "<i4")])
_PROPS = 0x3  # kExpanded | kMutable; OpenFST computes the rest on demand


def _lm_fst(fst):
    """The LM as a ``pywrapfst`` FST, built once and cached on the ``NgramFst`` object."""
    key = _fingerprint(fst)
    cached = getattr(fst, "_lattice_pywrapfst", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    G = fst.to_pywrapfst()
    try:
        object.__setattr__(fst, "_lattice_pywrapfst", (key, G))
    except (AttributeError, TypeError):
        pass
    return G


def lattice_fst_bytes(s: Sausage, weight_scale: float = 1.0) -> bytes:
    """OpenFST binary ``VectorFst<StdArc>`` of the sausage acceptor, written from numpy.

    States 0..h, arcs ``i -> i+1`` labelled ``token+1`` with cost ``-logp * weight_scale``;
    state h final. ``pywrapfst.Fst.read_from_string`` reads it (≈20 µs vs ≈300 µs of add_arc).
    """
    h = s.h
    widths = s.widths
    n_arcs = int(widths.sum())
    parts = [_HEADER_HEAD, struct.pack("<iiQqqq", 2, 0, _PROPS, 0, h + 1, n_arcs)]
    for i in range(h):
        w = int(widths[i])
        arcs = np.empty(w, dtype=_ARC)
        arcs["il"] = s.tokens[i, :w] + 1
        arcs["ol"] = arcs["il"]
        arcs["w"] = -s.logp[i, :w] * np.float32(weight_scale)
        arcs["next"] = i + 1
        parts.append(struct.pack("<fq", np.inf, w))
        parts.append(arcs.tobytes())
    parts.append(struct.pack("<fq", 0.0, 0))
    return b"".join(parts)


_MAX_NSHORTEST = 4096


def _wfst_pbest(s: Sausage, fst, start: int, alpha: float, p: int) -> Drafts:
    """n-shortest on lattice ∘ G, asking for 4x more paths until ``p`` distinct strings appear
    (epsilon back-off makes one string appear many times); at most 4096 paths are read, so in
    a pathological case fewer than ``p`` distinct drafts come back."""
    import pywrapfst

    G = _lm_fst(fst)
    G.set_start(start)
    L = pywrapfst.Fst.read_from_string(lattice_fst_bytes(s, 1.0 / alpha))
    C = pywrapfst.compose(L, G, connect=True)
    total = s.num_paths()
    want = min(p, total)
    n = want
    while True:
        best = _distinct_paths(pywrapfst.shortestpath(C, nshortest=n), alpha)
        if len(best) >= want or n >= _MAX_NSHORTEST:
            break
        n = min(4 * n, _MAX_NSHORTEST)
    items = sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))[:want]
    toks = np.array([list(t) for t, _ in items], dtype=np.int64).reshape(len(items), s.h)
    scores = np.array([v for _, v in items], dtype=np.float32)
    return Drafts(toks, scores, p)


def _distinct_paths(sp, alpha: float) -> dict:
    """{token tuple: best score} over the paths of a shortestpath result (a tree; DFS)."""
    out: dict = {}
    root = sp.start()
    if root == -1:
        return out
    stack = [(root, (), 0.0)]
    while stack:
        state, labels, cost = stack.pop()
        fin = float(sp.final(state))
        if np.isfinite(fin):
            score = -alpha * (cost + fin)
            if score > out.get(labels, -np.inf):
                out[labels] = score
        for arc in sp.arcs(state):
            lab = labels + (arc.ilabel - 1,) if arc.ilabel != 0 else labels
            stack.append((arc.nextstate, lab, cost + float(arc.weight)))
    return out


def load_lm(build_dir):
    """``NgramLM.load(build_dir)`` (the n-gram build of ``latticedraft lm build``)."""
    from latticedraft.lm.ngram import NgramLM

    return NgramLM.load(build_dir)


def check_ids(sausage: Sausage, history, lm, lattice_path) -> list[int]:
    """The checks ``lm score`` applies, for lattices read from files: every lattice id and every
    history id (integers) must be inside the LM's vocabulary. Returns the history as ints."""
    V = lm.vocab_size
    live = sausage.tokens[sausage.tokens >= 0]
    if live.size and int(live.max()) >= V:
        raise InputError(f"lattice {lattice_path} holds token id {int(live.max())}, outside the LM's vocabulary "
                         f"0..{V - 1}; use the LM built with the lattice's tokenizer")
    hist = np.asarray(history)
    if hist.size and hist.dtype.kind not in "iu":
        raise InputError(f"history {hist.tolist()} holds non-integer ids; give integer token ids")
    bad = [int(t) for t in hist.ravel() if not 0 <= int(t) < V]
    if bad:
        raise InputError(f"--history id {bad[0]} is outside the LM's vocabulary 0..{V - 1}; give ids in that range")
    return [int(t) for t in hist.ravel()]


def rescore_file(lattice_path, lm_dir, alpha: float = 1.0, nbest: int = 1, history=None,
                 method: str = "exact") -> dict:
    """Rescore a saved lattice; a JSON-ready dict ``{"paths", "scores", "method", "ms", ...}``.

    ``history`` defaults to the file's ``history`` array, else empty (``<s>``). ``ms`` is the
    wall time of one ``rescore`` call after a warm-up call (LM loading, table building and
    numba's compiled-code load are excluded and reported as ``setup_ms``).
    """
    import time

    from latticedraft.lattice.sausage import load_npz

    s, extra = load_npz(lattice_path)
    if history is None:
        history = extra.get("history", np.zeros(0, np.int64)).tolist()
    t0 = time.perf_counter()
    lm = load_lm(lm_dir)
    history = check_ids(s, history, lm, lattice_path)
    rescore(s, lm, alpha, nbest, history, method)
    t1 = time.perf_counter()
    d = rescore(s, lm, alpha, nbest, history, method)
    t2 = time.perf_counter()
    return {"paths": d.tokens.tolist(), "scores": [float(x) for x in d.scores], "method": method,
            "ms": round((t2 - t1) * 1e3, 4), "setup_ms": round((t1 - t0) * 1e3, 1), "alpha": float(alpha),
            "nbest": int(nbest), "truncated": bool(d.truncated), "history": [int(t) for t in history]}

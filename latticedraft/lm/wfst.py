"""The n-gram LM as a weighted finite-state acceptor (tropical semiring, back-off by epsilon).

States are n-gram contexts (the null context is ``unigram``, ``<s>`` is ``start``); an arc
``label = token_id + 1`` with cost ``-ln p(token | context)`` (= ``-ln(10) * log10 p``) leads to
the state of the longest suffix of ``context + token`` that the model keeps; each state but the
null one has a back-off arc (epsilon, label 0) with cost ``-ln(back-off weight)``. Every
label 1..V leaves the null state; ids that never occurred cost ``unk_cost`` (1000 by default,
Appendix D of the BPD paper), so every lattice path has a finite score.

**Epsilon back-off versus exact back-off.** The ARPA model means *phi* (failure) semantics: the
back-off arc may be taken only when the state has no arc for the next token. ``arc_lookup``,
``arc_lookup_many`` and ``exact_cost`` implement that and equal KenLM. An OpenFst composition
treats the back-off arc as an ordinary epsilon, so a path may back off although the explicit
n-gram exists, and the tropical shortest path takes such a path whenever it is cheaper.
``epsilon_cost`` returns what composition + shortest path computes for a token string (the
minimum over all back-off choices); it is never above ``exact_cost``. Where they differ:

* one token from the exact state: for lmplz's *interpolated* modified Kneser-Ney the explicit
  probability already contains ``bo(h) * p(w | h')``, so backing off never wins (measured: 0 of
  20 886 held-out tokens on the bundled 4-gram, pruned or not). A Katz (non-interpolated) model,
  as in the BPD paper, or a hand-edited ARPA can differ here (``tests/lm/fixtures/tiny.arpa``).
* several tokens: backing off early forgets context, and the shorter context can predict the
  *following* tokens better, so the path is cheaper overall although its first step is dearer
  (measured on the bundled 4-gram: 6.7% of 8-token held-out segments, mean 0.29 nats, max 2.2;
  ``benchmarks/lm_build.py`` reports it, ``tests/lm/test_wfst.py`` measures it on a test LM).

So n-best lists from composition can be ordered by scores a little too optimistic; rescoring
that must be exact re-scores paths with ``exact_cost`` or searches with the state API.

Final weights: ``lm.fst`` makes every state final with weight 0 (drafts are continuations, not
sentences); ``save(path, eos_final=True)`` writes the exact ``-ln p(</s> | state)`` instead.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from latticedraft.errors import BuildError, InputError, ModelError
from latticedraft.lm import openfst_binary as ob
from latticedraft.atomic import atomic_file

NPZ_VERSION = 1


@dataclass
class NgramFst:
    """The n-gram LM as CSR arrays; ``save`` writes it as an OpenFst binary ``lm.fst``.

    order: n; vocab_size: V (token ids 0..V-1, labels 1..V);
    state_offsets: int64[S+1], arcs of state s are ``[state_offsets[s], state_offsets[s+1])``;
    arc_label: int32[A] token_id + 1, strictly ascending within a state (no epsilon);
    arc_cost: float32[A] ``-ln p(token | context)``; arc_next: int32[A] destination state;
    backoff_next: int32[S] (-1 for the null state); backoff_cost: float32[S] ``-ln bo``;
    start: the ``<s>`` state; unigram: the null-context state (an arc for every label);
    final_cost: float32[S] exact ``-ln p(</s> | state)`` (back-off resolved; inf if no ``</s>``);
    unk_cost: the cost of ids absent from the training data (their null-state arcs);
    unk_arpa_cost: KenLM's ``-ln p(<unk>)`` from the ARPA (nan if absent).
    """

    order: int
    vocab_size: int
    state_offsets: np.ndarray
    arc_label: np.ndarray
    arc_cost: np.ndarray
    arc_next: np.ndarray
    backoff_next: np.ndarray
    backoff_cost: np.ndarray
    start: int
    unigram: int
    final_cost: np.ndarray = field(default=None)  # type: ignore[assignment]
    unk_cost: float = 1000.0
    unk_arpa_cost: float = math.nan

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def from_arpa(cls, path: str | Path, vocab_size: int | None = None, unk_cost: float = 1000.0) -> "NgramFst":
        """Convert an ARPA file over token ids (see ``latticedraft.lm.arpa``).

        ``vocab_size`` defaults to the largest id in the file + 1; ids absent from the file get
        null-state arcs of cost ``unk_cost``. Raises ``InputError`` (with the line) on a
        malformed or truncated file.
        """
        from latticedraft.lm.arpa import read_arpa
        from latticedraft.lm.fst_convert import arpa_arrays_to_csr

        arpa = read_arpa(path)
        d = arpa_arrays_to_csr(arpa, vocab_size=vocab_size, unk_cost=unk_cost, consume=True)
        del arpa
        d.pop("counts")
        return cls(**d)

    @property
    def num_states(self) -> int:
        return len(self.backoff_next)

    @property
    def num_arcs(self) -> int:
        """Labelled arcs plus back-off (epsilon) arcs, as in ``lm.fst``."""
        return len(self.arc_label) + int((self.backoff_next >= 0).sum())

    # ---- exact (phi) semantics ----------------------------------------------------------------
    def _find(self, state: int, label: int) -> int:
        lo, hi = int(self.state_offsets[state]), int(self.state_offsets[state + 1])
        i = lo + int(np.searchsorted(self.arc_label[lo:hi], label))
        return i if i < hi and self.arc_label[i] == label else -1

    def arc_lookup(self, state: int, token_id: int) -> tuple[int, float]:
        """(next state, cost) of ``token_id`` from ``state`` under exact back-off: the back-off
        arc is followed (adding its cost) only while the state has no arc for the token."""
        label = int(token_id) + 1
        if not 1 <= label <= self.vocab_size:
            raise InputError(f"token id {token_id} is outside the LM vocabulary 0..{self.vocab_size - 1}")
        cost = 0.0
        s = int(state)
        while True:
            i = self._find(s, label)
            if i >= 0:
                return int(self.arc_next[i]), cost + float(self.arc_cost[i])
            nxt = int(self.backoff_next[s])
            if nxt < 0:  # cannot happen: the null state has every label
                raise ModelError(f"LM state {s} has no arc for token {token_id} and no back-off")
            cost += float(self.backoff_cost[s])
            s = nxt

    def arc_lookup_many(self, states, token_ids) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised ``arc_lookup``: states, token_ids broadcast to one shape (int arrays).

        Returns (next int32[...], cost float32[...]) with exact back-off semantics: a vectorised
        binary search in every state's label range, repeated on the back-off state for the
        pairs that found no arc (at most n-1 rounds). No Python loop per pair.
        """
        st, tk = np.broadcast_arrays(np.asarray(states, dtype=np.int64), np.asarray(token_ids, dtype=np.int64))
        shape = st.shape
        s = st.ravel().copy()
        lab = tk.ravel() + 1
        if lab.size and (lab.min() < 1 or lab.max() > self.vocab_size):
            bad = int(tk.ravel()[(lab < 1) | (lab > self.vocab_size)][0])
            raise InputError(f"token id {bad} is outside the LM vocabulary 0..{self.vocab_size - 1}")
        cost = np.zeros(s.size, dtype=np.float64)
        nxt = np.empty(s.size, dtype=np.int32)
        A = len(self.arc_label)
        pending = np.arange(s.size)
        while pending.size:
            ss, ll = s[pending], lab[pending]
            lo, end = self.state_offsets[ss], self.state_offsets[ss + 1]
            hi = end.copy()
            while True:
                active = lo < hi
                if not active.any():
                    break
                mid = np.minimum((lo + hi) >> 1, A - 1)
                right = active & (self.arc_label[mid] < ll)
                lo = np.where(right, mid + 1, lo)
                hi = np.where(active & ~right, mid, hi)
            found = (lo < end) & (self.arc_label[np.minimum(lo, A - 1)] == ll)
            hit = pending[found]
            nxt[hit] = self.arc_next[lo[found]]
            cost[hit] += self.arc_cost[lo[found]]
            miss = pending[~found]
            cost[miss] += self.backoff_cost[s[miss]]
            s[miss] = self.backoff_next[s[miss]]
            pending = miss
        return nxt.reshape(shape), cost.astype(np.float32).reshape(shape)

    def exact_cost(self, state: int, ids: Iterable[int]) -> tuple[float, int]:
        """(total cost, end state) of the token string ``ids`` from ``state`` (exact back-off)."""
        total = 0.0
        s = int(state)
        for t in ids:
            s, c = self.arc_lookup(s, t)
            total += c
        return total, s

    def state_for_history(self, history_ids: Sequence[int]) -> int:
        """The state after the last n-1 ids of ``history_ids`` (with ``<s>`` before a shorter history).

        Equals KenLM's state after scoring the same history: the longest suffix of the history
        (at most n-1 tokens) that the model keeps as a context.
        """
        if self.order == 1:
            return self.unigram
        h = list(history_ids)[-(self.order - 1):]
        s = self.start if len(h) < self.order - 1 else self.unigram
        for t in h:
            s, _ = self.arc_lookup(s, t)
        return s

    def end_cost(self, state: int) -> float:
        """Exact ``-ln p(</s> | state)``."""
        return float(self.final_cost[state])

    # ---- epsilon semantics (what composition + shortest path computes) -------------------------
    def epsilon_cost(self, state: int, ids: Iterable[int]) -> float:
        """Cheapest cost of ``ids`` from ``state`` when back-off arcs are plain epsilons.

        Dynamic programme over states: before each token, extend every reachable state by its
        back-off chain; then take each state's explicit arc. Never above ``exact_cost``.
        """
        frontier = {int(state): 0.0}
        for t in ids:
            label = int(t) + 1
            closure: dict[int, float] = {}
            for s, c in frontier.items():
                while s >= 0:
                    if c < closure.get(s, math.inf):
                        closure[s] = c
                    c += float(self.backoff_cost[s])
                    s = int(self.backoff_next[s])
            frontier = {}
            for s, c in closure.items():
                i = self._find(s, label)
                if i >= 0:
                    n, cc = int(self.arc_next[i]), c + float(self.arc_cost[i])
                    if cc < frontier.get(n, math.inf):
                        frontier[n] = cc
        return min(frontier.values()) if frontier else math.inf

    # ---- persistence ------------------------------------------------------------------------------
    def save(self, path: str | Path, eos_final: bool = False) -> int:
        """Write an OpenFst binary (vector, standard/tropical, arc-sorted acceptor); returns bytes.

        Back-off arcs are epsilon arcs (label 0) placed first in each state. Written to a
        temporary name in the same directory and renamed when complete.
        """
        path = Path(path)
        final = self.final_cost if eos_final else np.zeros(self.num_states, dtype=np.float32)
        props = ob.acceptor_properties(
            ilabels_sorted=True,
            has_epsilons=bool((self.backoff_next >= 0).any()),
            weighted=True,
            deterministic=True,
        )
        with atomic_file(path) as tmp, open(tmp, "wb") as f:
            n = ob.write_acceptor(
                f, start=self.start, final=final, state_offsets=self.state_offsets,
                labels=self.arc_label, costs=self.arc_cost, nexts=self.arc_next,
                eps_next=self.backoff_next, eps_cost=self.backoff_cost, properties=props,
            )
        return n

    def save_npz(self, path: str | Path) -> None:
        """The CSR arrays, uncompressed (``load`` maps them back in well under a second)."""
        path = Path(path)
        with atomic_file(path, suffix=".tmp.npz") as tmp:
            np.savez(
                tmp, version=np.int64(NPZ_VERSION), order=np.int64(self.order), vocab_size=np.int64(self.vocab_size),
                start=np.int64(self.start), unigram=np.int64(self.unigram), unk_cost=np.float64(self.unk_cost),
                unk_arpa_cost=np.float64(self.unk_arpa_cost), state_offsets=self.state_offsets,
                arc_label=self.arc_label, arc_cost=self.arc_cost, arc_next=self.arc_next,
                backoff_next=self.backoff_next, backoff_cost=self.backoff_cost, final_cost=self.final_cost,
            )

    @classmethod
    def load(cls, path: str | Path, unk_cost: float | None = None) -> "NgramFst":
        """Load ``lm.npz`` (the CSR cache) if ``path`` is one or sits beside ``path``; else read the
        OpenFst binary ``lm.fst`` with pywrapfst (slower). ``unk_cost`` re-prices unseen ids."""
        path = Path(path)
        npz = path if path.suffix == ".npz" else path.with_suffix(".npz")
        if npz.is_file():
            fst = cls._load_npz(npz)
        elif path.is_file():
            fst = cls._from_openfst(path)
        else:
            raise InputError(f"LM automaton {path} not found; build one with `latticedraft lm build`")
        if unk_cost is not None and unk_cost != fst.unk_cost:
            fst.set_unk_cost(unk_cost)
        return fst

    @classmethod
    def _load_npz(cls, npz: Path) -> "NgramFst":
        from latticedraft.npzfile import read_npz

        z = read_npz(npz, "an LM automaton written by `latticedraft lm build`",
                     "rebuild the LM with `latticedraft lm build --force`", ModelError)
        try:
            if int(z["version"]) != NPZ_VERSION:
                raise ModelError(f"{npz} has format version {int(z['version'])}, expected {NPZ_VERSION}; rebuild the LM")
            return cls(
                order=int(z["order"]), vocab_size=int(z["vocab_size"]), state_offsets=z["state_offsets"],
                arc_label=z["arc_label"], arc_cost=z["arc_cost"], arc_next=z["arc_next"],
                backoff_next=z["backoff_next"], backoff_cost=z["backoff_cost"], start=int(z["start"]),
                unigram=int(z["unigram"]), final_cost=z["final_cost"], unk_cost=float(z["unk_cost"]),
                unk_arpa_cost=float(z["unk_arpa_cost"]),
            )
        except (OSError, KeyError, ValueError) as e:
            raise ModelError(f"{npz} cannot be read ({e}); rebuild the LM with `latticedraft lm build --force`") from e

    def set_unk_cost(self, unk_cost: float) -> None:
        """Re-price the null-state arcs of ids absent from the training data (in place)."""
        unk_cost = check_unk_cost(unk_cost)
        lo, hi = int(self.state_offsets[self.unigram]), int(self.state_offsets[self.unigram + 1])
        seg = self.arc_cost[lo:hi]
        unseen = (seg == np.float32(self.unk_cost)) & (self.arc_next[lo:hi] == self.unigram)
        if not self.arc_cost.flags.writeable:
            self.arc_cost = self.arc_cost.copy()
        self.arc_cost[lo:hi][unseen] = unk_cost
        self.unk_cost = float(unk_cost)

    @classmethod
    def _from_openfst(cls, path: Path) -> "NgramFst":
        """Read an OpenFst binary back (any arc-sorted back-off acceptor written by ``save``)."""
        import pywrapfst

        try:
            f = pywrapfst.Fst.read(str(path))
        except Exception as e:  # pywrapfst raises FstIOError / FstOpError
            raise ModelError(f"{path} is not a readable OpenFst file ({e})") from e
        S = f.num_states()
        offs = [0]
        lab, cost, nxt = [], [], []
        bn = np.full(S, -1, dtype=np.int32)
        bc = np.zeros(S, dtype=np.float32)
        fin = np.zeros(S, dtype=np.float32)
        for s in range(S):
            fin[s] = float(f.final(s))
            for a in f.arcs(s):
                if a.ilabel == 0:
                    bn[s], bc[s] = a.nextstate, float(a.weight)
                else:
                    lab.append(a.ilabel); cost.append(float(a.weight)); nxt.append(a.nextstate)
            offs.append(len(lab))
        uni = int(np.nonzero(bn < 0)[0][0])
        V = int(offs[uni + 1] - offs[uni])
        order = _depth(bn, uni) + 1
        return cls(order=order, vocab_size=V, state_offsets=np.array(offs, dtype=np.int64),
                   arc_label=np.array(lab, dtype=np.int32), arc_cost=np.array(cost, dtype=np.float32),
                   arc_next=np.array(nxt, dtype=np.int32), backoff_next=bn, backoff_cost=bc,
                   start=int(f.start()), unigram=uni, final_cost=fin)

    def to_pywrapfst(self, eos_final: bool = False):
        """A ``pywrapfst.VectorFst`` of this automaton (written with ``save`` and read back)."""
        import pywrapfst

        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "lm.fst"
            self.save(p, eos_final=eos_final)
            return pywrapfst.Fst.read(str(p))


def _depth(backoff_next: np.ndarray, root: int) -> int:
    """Longest back-off chain length (= order - 1 for an n-gram automaton)."""
    depth = np.full(len(backoff_next), -1)
    depth[root] = 0
    best = 0
    for s in range(len(backoff_next)):
        chain = []
        t = s
        while depth[t] < 0:
            chain.append(t)
            t = backoff_next[t]
        d = depth[t]
        for u in reversed(chain):
            d += 1
            depth[u] = d
        best = max(best, depth[s])
    return int(best)


def check_unk_cost(unk_cost, flag: str = "--unk-cost") -> float:
    """``unk_cost`` as a float if it is a finite cost >= 0 (nats, -ln p of an unseen id), else ``InputError``."""
    try:
        c = float(unk_cost)
    except (TypeError, ValueError):
        raise InputError(f"{flag} {unk_cost!r} is not a number; give a cost in nats, e.g. {flag} 1000") from None
    if not math.isfinite(c) or c < 0:
        raise InputError(f"{flag} {unk_cost} must be a finite cost >= 0 (nats, -ln p of an unseen id), "
                         f"e.g. {flag} 1000")
    return c


def arpa_to_fst(arpa_path: str | Path, fst_path: str | Path, vocab_size: int | None = None,
                unk_cost: float = 1000.0, npz: bool = True) -> NgramFst:
    """ARPA → ``NgramFst`` → ``fst_path`` (OpenFst binary) and, if ``npz``, the CSR cache beside it."""
    unk_cost = check_unk_cost(unk_cost)
    fst = NgramFst.from_arpa(arpa_path, vocab_size=vocab_size, unk_cost=unk_cost)
    try:
        fst.save(fst_path)
        if npz:
            fst.save_npz(Path(fst_path).with_suffix(".npz"))
    except OSError as e:
        raise BuildError(f"writing {fst_path} failed ({e}); check free disk space and permissions") from e
    return fst


BYTES_PER_ID = 56  # peak memory of arpa_to_fst per vocabulary id (its unigram state is dense), measured


def fst_bytes(vocab_size: int) -> int:
    """A lower bound on the memory ``arpa_to_fst`` takes for a ``vocab_size``-id LM (bytes; the
    n-grams add to it). Measured: peak RSS grows by about 58.6 bytes per id (V = 20 M → 40 M)."""
    return BYTES_PER_ID * int(vocab_size)


def is_fst_file(path: str | Path) -> bool:
    """Whether ``path`` starts as an OpenFst binary does (its magic number), without reading it."""
    import struct

    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return len(head) == 4 and struct.unpack("<i", head)[0] == ob.FST_MAGIC


def is_fst_npz(path: str | Path) -> bool:
    """Whether ``path`` is the CSR cache ``save_npz`` writes (an .npz holding its arrays), without reading them."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False
    return {"version.npy", "state_offsets.npy", "arc_label.npy"} <= names

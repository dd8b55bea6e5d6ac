"""``NgramLM``: query a build directory of ``latticedraft lm build`` over token ids (natural log).

Scores equal KenLM's (``kenlm.Model(D/lm.bin)``) times ln 10 for every id. Ids the corpus never
had (unseen byte tokens, special tokens) cost the build's ``unk_cost`` (1000 nats unless built
with ``--unk-cost``; the BPD paper's Appendix D), and ``lm build`` writes the same value into
the ARPA's ``<unk>``, so KenLM charges them identically. ``NgramLM.load(..., unk_cost=x)``
re-prices them for this query object only (then KenLM differs on those ids); ``"kenlm"`` takes
the ARPA's ``<unk>`` (useful for ARPA files from elsewhere).

The state API follows KenLM's in/out convention: ``begin(history)`` gives the state after a
history (``<s>`` is prepended to one shorter than n-1 tokens), ``advance(state, token)`` returns
``(next_state, logprob)``; states are small hashable values, equal whenever the model's
contexts are equal, so a search can merge hypotheses by state.

>>> lm = NgramLM.load(".cache/lm/stdlib-4gram")              # doctest: +SKIP
>>> s = lm.begin([]); s, lp = lm.advance(s, 42)              # doctest: +SKIP
>>> lm.score([42, 7], history=[]) .sum()                     # doctest: +SKIP
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from latticedraft.errors import InputError, ModelError
from latticedraft.lm.build import read_manifest
from latticedraft.lm.search_tables import fst_meta, load_tables, save_tables, tables_present
from latticedraft.lm.wfst import NgramFst


@dataclass(frozen=True, slots=True)
class LMState:
    """An LM context: the automaton state id (equal contexts ⇒ equal states)."""

    id: int


class NgramLM:
    """An n-gram LM over token ids, loaded from a build directory (see module docstring)."""

    def __init__(self, build_dir: Path, manifest: dict, unk_cost: float | str | None = None):
        self.build_dir = Path(build_dir)
        self.manifest = manifest
        self.order = int(manifest["order"])
        self.vocab_size = int(manifest["vocab_size"])
        self._unk_cost = unk_cost
        self._fst: NgramFst | None = None
        self._tokenizer = None

    @classmethod
    def load(cls, build_dir: str | Path, tokenizer=None, unk_cost: float | str | None = None) -> "NgramLM":
        """Open ``build_dir`` (reads only the manifest; the automaton loads on first use).

        tokenizer: a ``tokenizers.Tokenizer`` or a path; its vocabulary must be the one the LM was
        built with (``ModelError`` otherwise). unk_cost: None = the build's (1000 by default).
        """
        d = Path(build_dir)
        if unk_cost is not None and unk_cost != "kenlm":
            from latticedraft.lm.wfst import check_unk_cost

            unk_cost = check_unk_cost(unk_cost)
        m = read_manifest(d)
        if m.get("format") != "latticedraft-ngram":
            raise ModelError(f"{d}/manifest.json is not a latticedraft n-gram build; rebuild with `latticedraft lm build`")
        lm = cls(d, m, unk_cost)
        if tokenizer is not None:
            lm.check_tokenizer(tokenizer)
        return lm

    def check_tokenizer(self, tokenizer) -> None:
        from latticedraft.lm.tokenizer import fingerprint, load_tokenizer

        tok = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) else tokenizer
        fp = fingerprint(tok)
        want = self.manifest["tokenizer"]["fingerprint"]
        if fp != want:
            v = tok.get_vocab_size(with_added_tokens=True)
            raise ModelError(
                f"the LM in {self.build_dir} was built with a different vocabulary ({self.vocab_size} tokens, "
                f"fingerprint {want[:12]}) than the given tokenizer ({v} tokens, fingerprint {fp[:12]}); "
                f"rebuild the LM with `latticedraft lm build --tokenizer <that tokenizer>`"
            )

    @property
    def fst(self) -> NgramFst:
        """The automaton, loaded on first use: memory-mapped from the build's ``tables/`` (with
        the search tables attached, see ``lm.search_tables``), or from ``lm.npz`` when the
        query re-prices unseen ids. A build without tables gets them once (``ensure_tables``)."""
        if self._fst is None:
            fst = None
            if self._unk_cost is None and (ensure_tables(self.build_dir, self.manifest) or
                                           tables_present(self.build_dir, _expected_meta(self.manifest))):
                fst, _ = load_tables(self.build_dir)
            else:
                fst = NgramFst.load(self.build_dir / "lm.fst")
                if self._unk_cost == "kenlm":
                    if math.isnan(fst.unk_arpa_cost):
                        raise ModelError(f"the ARPA of {self.build_dir} has no <unk>; pass a numeric unk_cost")
                    fst.set_unk_cost(fst.unk_arpa_cost)
                elif float(self._unk_cost) != fst.unk_cost:
                    fst.set_unk_cost(float(self._unk_cost))
            if fst.vocab_size != self.vocab_size:
                raise ModelError(f"{self.build_dir}/lm.npz has {fst.vocab_size} labels but the manifest says "
                                 f"{self.vocab_size}; rebuild the LM")
            self._fst = fst
        return self._fst

    @property
    def tokenizer(self):
        """The ``tokenizers.Tokenizer`` stored with the build."""
        if self._tokenizer is None:
            from latticedraft.lm.tokenizer import load_tokenizer

            self._tokenizer = load_tokenizer(self.build_dir / self.manifest["tokenizer"]["file"])
        return self._tokenizer

    @property
    def vocab(self) -> list[str]:
        """Token strings by id (``vocab[i]`` is the token of id i)."""
        inv = {i: t for t, i in self.tokenizer.get_vocab(with_added_tokens=True).items()}
        return [inv.get(i, "") for i in range(self.vocab_size)]

    # ---- scoring ---------------------------------------------------------------------------------
    def _check(self, token_id: int) -> int:
        t = int(token_id)
        if not 0 <= t < self.vocab_size:
            raise InputError(f"token id {t} is outside this LM's vocabulary 0..{self.vocab_size - 1}")
        return t

    def begin(self, history_ids: Sequence[int] = ()) -> LMState:
        """The state after ``history_ids`` (only the last n-1 matter; ``<s>`` before a shorter one)."""
        return LMState(self.fst.state_for_history([self._check(t) for t in history_ids]))

    def advance(self, state: LMState, token_id: int) -> tuple[LMState, float]:
        """(next state, natural-log p(token | state)) under exact back-off."""
        nxt, cost = self.fst.arc_lookup(state.id, self._check(token_id))
        return LMState(nxt), -cost

    def logprob(self, history_ids: Sequence[int], token_id: int) -> float:
        """Natural-log p(token_id | history), history as in ``begin``."""
        return self.advance(self.begin(history_ids), token_id)[1]

    def score(self, ids: Sequence[int], history: Sequence[int] = ()) -> np.ndarray:
        """float32[len(ids)]: natural-log p(ids[i] | history + ids[:i])."""
        s = self.begin(history)
        out = np.empty(len(ids), dtype=np.float32)
        for i, t in enumerate(ids):
            s, out[i] = self.advance(s, t)
        return out

    def end_logprob(self, state: LMState) -> float:
        """Natural-log p(</s> | state) (end of a chunk/sentence)."""
        return -self.fst.end_cost(state.id)

    def __repr__(self) -> str:
        return f"NgramLM({str(self.build_dir)!r}, order={self.order}, vocab_size={self.vocab_size})"


def _expected_meta(manifest: dict) -> dict:
    f = manifest.get("fst", {})
    return {"order": int(manifest["order"]), "vocab_size": int(manifest["vocab_size"]), "states": f.get("states")}


def ensure_tables(build_dir: str | Path, manifest: dict | None = None, force: bool = False,
                  notice: bool = True) -> bool:
    """Write ``build_dir/tables/`` from ``lm.npz`` unless present and matching the manifest
    (``force``: always). Returns whether they were written. With ``notice`` (first use by
    ``NgramLM``) one line on stderr says so, since it takes seconds to a minute for tens of
    millions of n-grams, and an unwritable directory falls back to tables in memory (False);
    without it (``lm index``) that is a ``ModelError``."""
    import sys
    import time

    d = Path(build_dir)
    manifest = manifest if manifest is not None else read_manifest(d)
    if not force and tables_present(d, _expected_meta(manifest)):
        return False
    if notice:
        print(f"latticedraft: {d} has no search tables of this version (an older build); writing {d}/tables "
              f"once (`latticedraft lm index {d}` does this ahead of time)", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    fst = NgramFst.load(d / "lm.fst")
    want = _expected_meta(manifest)
    got = fst_meta(fst)
    if any(want[k] is not None and want[k] != got[k] for k in want):
        raise ModelError(f"{d}/lm.npz does not match its manifest ({got} vs {want}); rebuild the LM")
    try:
        save_tables(fst, d)
    except PermissionError as e:
        if not notice:
            raise ModelError(f"cannot write the search tables into {d} ({e.strerror}); run `latticedraft lm "
                             f"index {d}` as a user who may write there") from e
        print(f"latticedraft: cannot write {d}/tables ({e.strerror}); this process builds them in memory",
              file=sys.stderr, flush=True)
        return False
    if notice:
        print(f"latticedraft: wrote {d}/tables in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return True

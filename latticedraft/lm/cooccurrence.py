"""Token co-occurrence statistics for DynaMo's co-occurrence weighted masking (Eq. 3 and 6).

The mask for an ``n``-token grid (``n`` = 2 or 3) is::

    mask(x_1..x_n) = ( p̂(x_1..x_n) / Π_i p̂(x_i) ) ** alpha_c

with the history ignored (the paper's Eq. 3): ``p̂(x_i)`` are unigram frequencies and
``p̂(x_1..x_n)`` the frequency of the contiguous n-gram, both counted on token ids of a corpus
(n-grams never cross a file boundary). Counts are stored sparse:

- ``unigram``: int64 ``[V]``;
- ``pairs[d]``: ``scipy.sparse.csr_array`` ``[V, V]`` int64, counts of ``(x_t, x_{t+d})``
  for offsets ``d = 1, 2`` (``d = 1`` is the bigram used by the two-token mask);
- triples: sorted unique int64 keys ``(a * V + b) * V + c`` with int64 counts (``V ≤ 2**21``).

Unseen n-grams (a query-time parameter, ``unseen_weight`` δ ∈ [0, 1]): the ratio above is
used only for n-grams the corpus contains. An n-gram of seen tokens that never occurs gets the
mask ``δ ** alpha_c`` ("δ times as likely as independence"; δ = 0 is the paper's literal hard
masking, since p̂ = 0); an n-gram with a token the corpus never contains (e.g. ``<|endoftext|>``
when documents carry no end marker) gets 1: no evidence, no reweighting. A pseudo-count floor on
the joint (``max(c, δ)``) would not do: for rare tokens the floor exceeds the expected count
``N Π p̂(x_i)`` and rewards exactly the combinations never seen, by factors up to ``N / δ``.
Default δ = 0.5.

The statistics remember the tokenizer's ``fingerprint`` and vocabulary size; ``check``
refuses a model or tokenizer from another vocabulary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import scipy.sparse as sp

from latticedraft import learned_state
from latticedraft.atomic import atomic_file
from latticedraft.errors import InputError, ModelError

FORMAT_VERSION = 1
FILE_NAME = "cooccurrence.npz"
DEFAULT_UNSEEN_WEIGHT = 0.5
MAX_ORDER = 3
_MAX_VOCAB = 2**21  # (a * V + b) * V + c must fit in int64


@dataclass
class CooccurrenceStats:
    """Counts of tokens, pairs (offsets 1 and 2) and contiguous triples over a tokenized corpus.

    ``n_tokens[n-1]`` is the number of n-gram positions counted (the normaliser of p̂ for order n).
    """

    vocab_size: int
    fingerprint: str
    unigram: np.ndarray  # int64 [V]
    pairs: dict[int, sp.csr_array]  # offset -> int64 [V, V]
    triple_keys: np.ndarray  # int64 [M], sorted, unique
    triple_counts: np.ndarray  # int64 [M]
    n_tokens: tuple[int, int, int]
    meta: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ building
    @classmethod
    def from_sequences(
        cls,
        sequences: Iterable[Sequence[int] | np.ndarray],
        vocab_size: int,
        fingerprint: str,
        meta: dict | None = None,
        progress: bool | None = None,
    ) -> "CooccurrenceStats":
        """Count over token-id sequences (one per document; n-grams stay inside a sequence)."""
        if not 0 < vocab_size <= _MAX_VOCAB:
            raise InputError(f"vocab_size {vocab_size} is outside 1..{_MAX_VOCAB}; triple keys need V ≤ 2**21")
        V = int(vocab_size)
        uni = np.zeros(V, dtype=np.int64)
        rows = {1: [], 2: []}
        cols = {1: [], 2: []}
        tri: list[np.ndarray] = []
        totals = [0, 0, 0]
        for seq in _progress(sequences, progress, "counting co-occurrences"):
            ids = np.asarray(seq, dtype=np.int64).ravel()
            if ids.size == 0:
                continue
            if ids.min() < 0 or ids.max() >= V:
                bad = int(ids[(ids < 0) | (ids >= V)][0])
                raise InputError(f"token id {bad} is outside the vocabulary 0..{V - 1}; tokenize with the same tokenizer")
            uni += np.bincount(ids, minlength=V)
            totals[0] += ids.size
            for d in (1, 2):
                if ids.size > d:
                    rows[d].append(ids[:-d])
                    cols[d].append(ids[d:])
            if ids.size > 1:
                totals[1] += ids.size - 1
            if ids.size > 2:
                totals[2] += ids.size - 2
                tri.append((ids[:-2] * V + ids[1:-1]) * V + ids[2:])
        pairs = {}
        for d in (1, 2):
            r = np.concatenate(rows[d]) if rows[d] else np.zeros(0, np.int64)
            c = np.concatenate(cols[d]) if cols[d] else np.zeros(0, np.int64)
            m = sp.coo_array((np.ones(r.size, dtype=np.int64), (r, c)), shape=(V, V)).tocsr()
            m.sum_duplicates()
            pairs[d] = m
        keys = np.concatenate(tri) if tri else np.zeros(0, np.int64)
        tkeys, tcounts = np.unique(keys, return_counts=True)
        return cls(V, fingerprint, uni, pairs, tkeys.astype(np.int64), tcounts.astype(np.int64), tuple(totals), dict(meta or {}))

    @classmethod
    def from_files(cls, files: Sequence[Path], tokenizer, encoding_errors: str = "strict",
                   progress: bool | None = None) -> "CooccurrenceStats":
        """Tokenize ``files`` with an HF ``tokenizers.Tokenizer`` and count (one sequence per file)."""
        from latticedraft.lm.corpus import read_text
        from latticedraft.lm.tokenizer import fingerprint

        files = [Path(f) for f in files]

        def seqs():
            batch: list[str] = []
            for f in files:
                batch.append(read_text(f, encoding_errors))
                if len(batch) == 64:
                    yield from (e.ids for e in tokenizer.encode_batch(batch))
                    batch = []
            if batch:
                yield from (e.ids for e in tokenizer.encode_batch(batch))

        meta = {"files": [str(f) for f in files]}
        return cls.from_sequences(seqs(), tokenizer.get_vocab_size(with_added_tokens=True), fingerprint(tokenizer),
                                  meta=meta, progress=progress)

    # ------------------------------------------------------------------ queries
    def check(self, vocab_size: int | None = None, fingerprint: str | None = None, where: str = "the model") -> None:
        """Raise ``ModelError`` unless the statistics were counted with this vocabulary."""
        src = self.meta.get("path", "the co-occurrence table")
        if vocab_size is not None and int(vocab_size) != self.vocab_size:
            raise ModelError(
                f"co-occurrence table {src} has vocabulary size {self.vocab_size} but {where} has {vocab_size}; "
                "rebuild it with `latticedraft lm cooccurrence` using the model's tokenizer"
            )
        if fingerprint is not None and fingerprint != self.fingerprint:
            raise ModelError(
                f"co-occurrence table {src} was counted with tokenizer {self.fingerprint[:12]} but {where} uses "
                f"{fingerprint[:12]}; rebuild it with `latticedraft lm cooccurrence` using the model's tokenizer"
            )

    def counts(self, tokens: Sequence[np.ndarray]) -> np.ndarray:
        """Joint counts on the grid spanned by ``tokens`` (n arrays of ids, n = 1..3, lengths k_i).

        Returns int64 ``[k_1, ..., k_n]``: ``out[i, j, l] = count(tokens[0][i], tokens[1][j], tokens[2][l])``.
        """
        toks = [np.asarray(t, dtype=np.int64).ravel() for t in tokens]
        n = len(toks)
        for t in toks:
            if t.size and (t.min() < 0 or t.max() >= self.vocab_size):
                raise InputError(f"token id outside 0..{self.vocab_size - 1} in the co-occurrence query")
        if n == 1:
            return self.unigram[toks[0]]
        if n == 2:
            m = self.pairs[1]
            return _grid_counts(m.indptr[toks[0]], m.indptr[toks[0] + 1], m.indices, m.data, 0, toks[1], self.vocab_size)
        if n == 3:
            V = self.vocab_size
            ab = (toks[0][:, None] * V + toks[1][None, :]).ravel() * V
            lo = np.searchsorted(self.triple_keys, ab)
            hi = np.searchsorted(self.triple_keys, ab + V)
            out = _grid_counts(lo, hi, self.triple_keys, self.triple_counts, ab, toks[2], V)
            return out.reshape(toks[0].size, toks[1].size, toks[2].size)
        raise InputError(f"co-occurrence order {n} is not stored; use n between 1 and {MAX_ORDER}")

    def mask(self, tokens: Sequence[np.ndarray], alpha_c: float = 1.0,
             unseen_weight: float = DEFAULT_UNSEEN_WEIGHT) -> np.ndarray:
        """The co-occurrence weights ``(p̂(joint) / Π p̂(marginal)) ** alpha_c`` on a top-k grid.

        ``tokens``: n ≥ 2 id arrays (the top-k ids of heads 1..n). Returns float64 ``[k_1, ..., k_n]``.
        ``alpha_c = 0`` gives all ones (no masking); unseen n-grams: see the module docstring.
        """
        n = len(tokens)
        if not 2 <= n <= MAX_ORDER:
            raise InputError(f"co-occurrence masks cover 2..{MAX_ORDER} tokens, not {n}")
        if alpha_c < 0:
            raise InputError(f"alpha_c {alpha_c} must be ≥ 0")
        if not 0.0 <= unseen_weight <= 1.0:
            raise InputError(f"unseen_weight {unseen_weight} must be in [0, 1] (0: unseen n-grams masked out, 1: no penalty)")
        toks = [np.asarray(t, dtype=np.int64).ravel() for t in tokens]
        shape = tuple(t.size for t in toks)
        if alpha_c == 0:
            return np.ones(shape, dtype=np.float64)
        joint = self.counts(toks).astype(np.float64)
        margs = [self.unigram[t].astype(np.float64) for t in toks]
        seen_tok = np.ones([1] * n, dtype=bool)
        denom = np.ones([1] * n, dtype=np.float64)
        for i, m in enumerate(margs):
            axis_shape = [-1 if a == i else 1 for a in range(n)]
            seen_tok = seen_tok & (m > 0).reshape(axis_shape)
            denom = denom * (m / max(self.n_tokens[0], 1)).reshape(axis_shape)
        ratio = np.where(seen_tok, unseen_weight, 1.0) * np.ones(shape)
        seen = joint > 0
        ratio[seen] = (joint[seen] / max(self.n_tokens[n - 1], 1)) / np.broadcast_to(denom, shape)[seen]
        if alpha_c != 1.0:
            ratio **= alpha_c
        return ratio

    # ------------------------------------------------------------------ storage
    def save(self, path: str | Path) -> Path:
        """Write ``cooccurrence.npz`` (into ``path`` if it is a directory), atomically."""
        p = Path(path)
        if p.is_dir():
            p = p / FILE_NAME
        p.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(p, suffix=".npz") as tmp:
            self.write(tmp)
        return p

    def write(self, path: Path) -> None:
        """Write the table to file ``path`` as it is (``save``'s content)."""
        meta = dict(self.meta)
        meta.pop("path", None)
        header = {
            "format": FORMAT_VERSION, "vocab_size": self.vocab_size, "fingerprint": self.fingerprint,
            "n_tokens": list(self.n_tokens), "meta": meta,
        }
        arrays = {"header": np.frombuffer(json.dumps(header).encode(), dtype=np.uint8),
                  "unigram": self.unigram, "triple_keys": self.triple_keys, "triple_counts": self.triple_counts}
        for d, m in self.pairs.items():
            m = sp.csr_array(m)
            arrays[f"pair{d}_data"] = m.data.astype(np.int64)
            arrays[f"pair{d}_indices"] = m.indices.astype(np.int64)
            arrays[f"pair{d}_indptr"] = m.indptr.astype(np.int64)
        np.savez_compressed(path, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> "CooccurrenceStats":
        """Read a table written by ``save`` (a file, or a build directory holding ``cooccurrence.npz``)."""
        p = Path(path)
        if p.is_dir():
            p = p / FILE_NAME
        if not p.is_file():
            raise InputError(f"co-occurrence table {p} not found; build it with `latticedraft lm cooccurrence --lm DIR`")
        from latticedraft.npzfile import read_npz

        z = read_npz(p, "a co-occurrence table", "build one with `latticedraft lm cooccurrence --lm DIR`", ModelError)
        try:
            header = json.loads(bytes(z["header"]).decode())
            V = int(header["vocab_size"])
            pairs = {}
            for d in (1, 2):
                pairs[d] = sp.csr_array((z[f"pair{d}_data"], z[f"pair{d}_indices"], z[f"pair{d}_indptr"]), shape=(V, V))
            stats = cls(V, header["fingerprint"], z["unigram"], pairs, z["triple_keys"], z["triple_counts"],
                        tuple(int(x) for x in header["n_tokens"]), dict(header.get("meta", {})))
        except (KeyError, ValueError, OSError, json.JSONDecodeError) as e:
            raise ModelError(f"co-occurrence table {p} is unreadable or not a latticedraft table ({e}); rebuild it") from e
        if header.get("format") != FORMAT_VERSION:
            raise ModelError(f"co-occurrence table {p} has format {header.get('format')}, expected {FORMAT_VERSION}; rebuild it")
        stats.meta["path"] = str(p)
        return stats


def _is_table(p: Path) -> bool:
    """Whether ``p`` is an ``.npz`` with a co-occurrence header (what ``save`` writes), without reading it."""
    import zipfile

    try:
        with zipfile.ZipFile(p) as z:
            return "header.npy" in z.namelist() and "unigram.npy" in z.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def cooccurrence_output(lm_dir: str | Path, force: bool = False) -> Path:
    """``lm_dir/cooccurrence.npz`` if ``lm cooccurrence`` may write it (checked before counting):
    the directory exists, and an existing table is replaced only with ``force`` (a file there that
    is no co-occurrence table never is)."""
    from latticedraft.outputs import claim_file

    from latticedraft.paths import require_dir

    d = require_dir(lm_dir, "LM build directory", "pass --lm DIR, a directory `latticedraft lm build` wrote")
    out = d / FILE_NAME
    claim_file(out, force=force, is_own=_is_table, what="a co-occurrence table", command="latticedraft lm cooccurrence",
               flag="--lm")
    return out


def build_for_lm_dir(lm_dir: str | Path, tokenizer_path: str | Path | None = None, corpus: Sequence[str] | None = None,
                     encoding_errors: str = "strict", force: bool = False) -> Path:
    """Count co-occurrences for an LM build directory and write ``<lm_dir>/cooccurrence.npz``.

    The corpus and tokenizer default to those named in ``<lm_dir>/manifest.json`` (the n-gram
    build's), so the statistics share the LM's vocabulary; ``corpus`` / ``tokenizer_path``
    override them (corpus specs as in ``latticedraft.lm.corpus.resolve_corpus``).
    """
    from latticedraft.lm.corpus import resolve_corpus
    from latticedraft.lm.tokenizer import load_tokenizer

    d = Path(lm_dir)
    out = cooccurrence_output(d, force)
    manifest = {}
    if (d / "manifest.json").is_file():
        manifest = json.loads((d / "manifest.json").read_text())
    if tokenizer_path is None:
        tokenizer_path = _manifest_tokenizer(d, manifest)
    if corpus is None:
        corpus = _manifest_corpus(manifest)
        if not corpus:
            raise InputError(f"{d}/manifest.json names no corpus files; pass --corpus FILES")
    tok = load_tokenizer(tokenizer_path)
    files = resolve_corpus(corpus)
    stats = CooccurrenceStats.from_files(files, tok, encoding_errors=encoding_errors)
    stats.meta["tokenizer"] = str(tokenizer_path)
    return stats.save(out)


def _manifest_tokenizer(d: Path, manifest: dict) -> Path:
    """The tokenizer of an ``lm build`` directory: ``manifest["tokenizer"]["file"]``, else ``tokenizer.json``."""
    t = manifest.get("tokenizer")
    name = t.get("file") if isinstance(t, dict) else (t if isinstance(t, str) else None)
    for c in ([name] if name else []) + ["tokenizer.json"]:
        p = Path(c) if Path(c).is_absolute() else d / c
        if p.is_file():
            return p
    raise InputError(f"no tokenizer found in LM build {d}; pass --tokenizer PATH")


def _manifest_corpus(manifest: dict) -> list[str]:
    """The corpus files of an ``lm build`` manifest (``manifest["corpus"]["files"][i]["path"]``)."""
    corpus = manifest.get("corpus")
    files = corpus.get("files", []) if isinstance(corpus, dict) else []
    return [str(f["path"]) if isinstance(f, dict) else str(f) for f in files if f]


def _grid_counts(lo: np.ndarray, hi: np.ndarray, keys: np.ndarray, counts: np.ndarray, base, last: np.ndarray,
                 V: int) -> np.ndarray:
    """Counts on a ``[len(lo), len(last)]`` grid from sorted runs: row ``r`` owns ``keys[lo[r]:hi[r]]``,
    whose last component is ``keys - base[r]``; only entries whose last id is in ``last`` are kept."""
    col_of = np.full(V, -1, dtype=np.int64)
    col_of[last[::-1]] = np.arange(last.size)[::-1]  # first occurrence wins for duplicate ids
    out = np.zeros((lo.size, last.size), dtype=np.int64)
    lens = (hi - lo).astype(np.int64)
    total = int(lens.sum())
    if total == 0:
        return out
    row = np.repeat(np.arange(lo.size), lens)
    starts = np.repeat(lo - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
    pos = starts + np.arange(total)
    base_r = np.broadcast_to(np.asarray(base, dtype=np.int64), lo.shape)[row]
    col = col_of[keys[pos] - base_r]
    ok = col >= 0
    out[row[ok], col[ok]] = counts[pos[ok]]
    if np.unique(last).size != last.size:  # duplicated ids in ``last``: copy the counts to every copy
        out = out[:, col_of[last]]
    return out


def _progress(it, enabled: bool | None, desc: str):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return it
    import sys
    disable = (not sys.stderr.isatty()) if enabled is None else not enabled
    return tqdm(it, desc=desc, unit="seq", disable=disable)


def _schema(s: "CooccurrenceStats") -> str | None:
    """None where a loaded table's arrays fit its vocabulary (``load`` checks the pairs), else why not."""
    arrays = (s.unigram, s.triple_keys, s.triple_counts)
    if any(a.dtype.kind not in "iu" for a in arrays) or s.unigram.shape != (s.vocab_size,):
        return "unigram counts of another vocabulary or type"
    if s.triple_keys.shape != s.triple_counts.shape or min((a.min() for a in arrays if a.size), default=0) < 0:
        return "triples misshapen or negative counts"
    return None


KIND = learned_state.kind("cooccurrence", "co-occurrence counts", _schema, parse=lambda p: CooccurrenceStats.load(p),
                          example=lambda: CooccurrenceStats.from_sequences([[0, 1, 2, 1, 0, 3]], 5, "f" * 64).write)


def resolve_table(spec: str | Path | None, tokenizer, corpus: Sequence[str] = ("stdlib:train",),
                  notify=None) -> "CooccurrenceStats":
    """The co-occurrence table for ``tokenizer``: a path (file or LM build dir), or ``None``/``"auto"``.

    ``auto``: the bundled n-gram build's ``cooccurrence.npz`` if it was counted with this tokenizer,
    else ``<cache>/cooccurrence/<corpus>-<fingerprint[:12]>.npz``, counted now (about 20 s for the
    standard library) when missing. Refuses a table from another vocabulary (``ModelError``).
    """
    from latticedraft.lm.tokenizer import fingerprint
    from latticedraft.paths import default_lm_dir

    fp = fingerprint(tokenizer)
    V = tokenizer.get_vocab_size(with_added_tokens=True)
    if spec is not None and str(spec) != "auto":
        stats = CooccurrenceStats.load(spec)
        stats.check(vocab_size=V, fingerprint=fp, where="the tokenizer")
        return stats
    bundled = default_lm_dir() / FILE_NAME
    if bundled.is_file():
        stats = CooccurrenceStats.load(bundled)
        if stats.fingerprint == fp and stats.vocab_size == V:
            return stats
    name = "-".join(str(c).replace(":", "_").replace("/", "_") for c in corpus) + f"-{fp[:12]}.npz"
    stats = learned_state.read(KIND, name, notify, check=lambda s: s.check(vocab_size=V, fingerprint=fp))
    if stats is not None:
        return stats
    from latticedraft.lm.corpus import resolve_corpus

    if notify:
        notify(f"counting co-occurrences of {', '.join(corpus)} into {KIND.path(name)} (once)")
    stats = CooccurrenceStats.from_files(resolve_corpus(list(corpus)), tokenizer)
    stats.meta["corpus"] = list(corpus)
    if learned_state.write(KIND, name, stats.write) is not None:
        stats.meta["path"] = str(KIND.path(name))
    return stats

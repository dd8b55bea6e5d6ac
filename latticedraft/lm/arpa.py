"""Read an ARPA n-gram file over token ids into numpy arrays (a numba parser, no Python per line).

The ARPA files here are written by ``lmplz`` on token-id text: words are decimal token ids
(``"0"`` .. ``"V-1"``) plus KenLM's ``<s>``, ``</s>`` and ``<unk>``. Words are stored as *codes*:
``token_id + 1`` (the FST label) for tokens, and ``BOS``/``EOS``/``UNK`` (negative) for the three
specials. Probabilities and back-offs stay log10 float32 exactly as written.

Malformed input (truncated file, a count that disagrees with ``\\data\\``, a field that is not a
number, a word that is not a token id, a missing section) raises ``InputError`` naming the file and
the line number.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
import gzip

import numpy as np

from latticedraft.errors import InputError

BOS, EOS, UNK = -1, -2, -3
SPECIAL_NAMES = {BOS: "<s>", EOS: "</s>", UNK: "<unk>"}
MAX_ORDER = 6
_BLOCK_BYTES = 1 << 23  # parse in 8 MiB slices so the raw text is never held whole

# error codes of the numba kernel
_OK, _E_FIELDS, _E_NUMBER, _E_WORD, _E_TOO_MANY = 0, 1, 2, 3, 4
_ERR_TEXT = {
    _E_FIELDS: "wrong number of fields (want: log10-prob, {k} words, optional back-off)",
    _E_NUMBER: "a probability or back-off that is not a number",
    _E_WORD: "a word that is neither a token id nor <s>, </s>, <unk>",
    _E_TOO_MANY: "more {k}-grams than the \\data\\ header announces",
}


@dataclass
class ArpaOrder:
    """The n-grams of one order, in file order.

    words: int32[n, k] word codes; logprob: float32[n] log10 p; backoff: float32[n] log10 back-off
    (0 where the file gives none); first_line: 1-based line number of the first n-gram (errors).
    """

    words: np.ndarray
    logprob: np.ndarray
    backoff: np.ndarray
    first_line: int


@dataclass
class Arpa:
    path: Path
    orders: list[ArpaOrder]  # orders[k-1] holds the k-grams

    @property
    def order(self) -> int:
        return len(self.orders)

    @property
    def counts(self) -> list[int]:
        return [len(o.logprob) for o in self.orders]


def _kernel():
    """The numba block parser (compiled on first use, then loaded from numba's disk cache)."""
    from latticedraft.lm._numba_kernels import parse_block

    return parse_block


class _Lines:
    """Reads a (possibly gzipped) text file in large blocks that end on a line boundary."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.f = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
            self.f.peek(1) if hasattr(self.f, "peek") else None
        except FileNotFoundError as e:
            raise InputError(f"ARPA file {path} does not exist; check the path") from e
        except (OSError, EOFError) as e:
            raise InputError(f"ARPA file {path} cannot be read ({e})") from e
        self.buf = b""
        self.eof = False
        self.line = 1  # line number of the first byte of self.buf

    def close(self):
        self.f.close()

    def fill(self) -> bool:
        """Append the next block (ending at a newline unless at EOF); False when nothing is left."""
        if self.eof:
            return False
        try:
            chunk = self.f.read(_BLOCK_BYTES)
        except (OSError, EOFError) as e:
            raise InputError(f"ARPA file {self.path} is truncated or corrupt near line {self.line} ({e})") from e
        if not chunk:
            self.eof = True
            return False
        if not chunk.endswith(b"\n"):
            try:
                rest = self.f.readline()
            except (OSError, EOFError) as e:
                raise InputError(f"ARPA file {self.path} is truncated or corrupt near line {self.line} ({e})") from e
            chunk += rest
            if not rest.endswith(b"\n"):
                self.eof = True
        self.buf = self.buf + chunk if self.buf else chunk
        return True

    def consume(self, n: int):
        self.line += self.buf.count(b"\n", 0, n)
        self.buf = self.buf[n:]

    def readline(self) -> bytes | None:
        """One line without its newline, or None at end of file."""
        while b"\n" not in self.buf:
            if not self.fill():
                if not self.buf:
                    return None
                line, self.buf = self.buf, b""
                self.line += 1
                return line.rstrip(b"\r")
        k = self.buf.index(b"\n")
        line = self.buf[:k]
        self.buf = self.buf[k + 1 :]
        self.line += 1
        return line.rstrip(b"\r")


def _fail(path: Path, line: int, what: str) -> InputError:
    return InputError(f"ARPA file {path}, line {line}: {what}; is the file complete and written by lmplz?")


def read_arpa(path: str | Path) -> Arpa:
    """Parse ``path`` (ARPA text, ``.gz`` allowed) into per-order arrays.

    Cost: one pass over the file, O(n-grams) memory (13 + 4k bytes per k-gram).
    """
    path = Path(path)
    rd = _Lines(path)
    try:
        return _read(rd, path)
    finally:
        rd.close()


def _read(rd: _Lines, path: Path) -> Arpa:
    # header: skip to \data\, then "ngram k=count" lines
    while True:
        line = rd.readline()
        if line is None:
            raise _fail(path, rd.line, "no \\data\\ section (empty or not an ARPA file)")
        if line.strip() == b"\\data\\":
            break
    counts: list[int] = []
    while True:
        line = rd.readline()
        if line is None:
            raise _fail(path, rd.line, "file ends inside the \\data\\ header")
        s = line.strip()
        if not s:
            if counts:
                break
            continue
        if not s.startswith(b"ngram "):
            raise _fail(path, rd.line - 1, f"expected 'ngram k=count' in the header, got {s[:40]!r}")
        try:
            k_s, c_s = s[6:].split(b"=")
            k, c = int(k_s), int(c_s)
        except ValueError:
            raise _fail(path, rd.line - 1, f"malformed header line {s[:40]!r}") from None
        if k != len(counts) + 1 or c < 0:
            raise _fail(path, rd.line - 1, f"header line {s[:40]!r} out of sequence")
        counts.append(c)
    if not 1 <= len(counts) <= MAX_ORDER:
        raise _fail(path, rd.line, f"order {len(counts)} is outside 1..{MAX_ORDER}")
    parse = _kernel()
    orders: list[ArpaOrder] = []
    for k, n in enumerate(counts, start=1):
        # find the "\k-grams:" marker
        while True:
            line = rd.readline()
            if line is None:
                raise _fail(path, rd.line, f"file ends before the \\{k}-grams: section (truncated?)")
            s = line.strip()
            if not s:
                continue
            if s == b"\\%d-grams:" % k:
                break
            raise _fail(path, rd.line - 1, f"expected \\{k}-grams:, got {s[:40]!r}")
        words = np.zeros((n, k), dtype=np.int32)
        logprob = np.zeros(n, dtype=np.float32)
        backoff = np.zeros(n, dtype=np.float32)
        first = rd.line
        row = 0
        while True:
            if not rd.buf and not rd.fill():
                break
            arr = np.frombuffer(rd.buf, dtype=np.uint8)
            used, row, ended, err, at = parse(arr, len(arr), k, words, logprob, backoff, row)
            if err:
                bad_line = rd.line + rd.buf.count(b"\n", 0, at)
                text = rd.buf[at : rd.buf.find(b"\n", at) if b"\n" in rd.buf[at:] else len(rd.buf)]
                raise _fail(path, bad_line, _ERR_TEXT[err].format(k=k) + f" in {text[:60].decode('utf-8', 'replace')!r}")
            rd.consume(used)
            if ended:
                break
        if row != n:
            raise _fail(path, first + row - 1, f"{k}-grams section ends after {row} entries but \\data\\ announces {n} (truncated?)")
        orders.append(ArpaOrder(words, logprob, backoff, first))
    while True:
        line = rd.readline()
        if line is None:
            raise _fail(path, rd.line, "no \\end\\ marker (truncated?)")
        s = line.strip()
        if not s:
            continue
        if s == b"\\end\\":
            break
        raise _fail(path, rd.line - 1, f"expected \\end\\, got {s[:40]!r}")
    return Arpa(path, orders)


def set_unk_log10(path: str | Path, log10_prob: float) -> float:
    """Rewrite the ``<unk>`` unigram of the ARPA at ``path`` to ``log10_prob``; returns the old value.

    Appendix D of the BPD paper gives unseen vocabulary a fixed cost (-ln p = 1000); writing the
    same value into the ARPA makes KenLM's ``<unk>`` (``lm.bin``) agree with the WFST's arcs for
    ids the corpus never had. Streams the file (temporary name, renamed when complete).
    """
    import shutil

    from latticedraft.atomic import atomic_file

    path = Path(path)
    old = None
    with open(path, "rb") as src, atomic_file(path) as tmp, open(tmp, "wb") as dst:
        in_unigrams = False
        for lineno, line in enumerate(iter(src.readline, b""), start=1):
            s = line.strip()
            if s == b"\\1-grams:":
                in_unigrams = True
            elif in_unigrams and (not s or s.startswith(b"\\")):
                break
            elif in_unigrams:
                f = s.split()
                if len(f) >= 2 and f[1] == b"<unk>":
                    old = float(f[0])
                    f[0] = repr(float(log10_prob)).encode()
                    dst.write(b"\t".join([f[0], f[1], *f[2:]]) + b"\n")
                    shutil.copyfileobj(src, dst, 1 << 22)
                    break
            dst.write(line)
        if old is None:
            raise InputError(f"ARPA file {path} has no <unk> unigram (line {lineno}); was it written by lmplz?")
    return old


def float32_exact_unk(cost: float, window: int = 400, tol: float = 1e-6) -> tuple[float, float]:
    """(log10, cost) with ``-ln(10) * log10 == cost`` to ``tol`` where both are float32 numbers.

    KenLM keeps log10 values as float32 and our arcs keep costs as float32; an unseen-id cost
    of exactly 1000 would disagree by up to 3.5e-5 nats between the two. Searching the float32
    grid around ``-cost / ln 10`` finds a pair that agrees (1000 becomes 1000.00073).
    """
    x0 = np.float32(-cost / np.log(10.0))
    grid = (np.array([x0]).view(np.int32) + np.arange(-window, window + 1, dtype=np.int32)).view(np.float32)
    log10 = grid.astype(np.float64)
    c = -log10 * np.log(10.0)
    c32 = c.astype(np.float32).astype(np.float64)
    ok = np.flatnonzero(np.abs(c - c32) < tol)
    if not ok.size:
        return float(x0), float(np.float32(-float(x0) * np.log(10.0)))
    j = ok[np.argmin(np.abs(c[ok] - cost))]
    return float(log10[j]), float(c32[j])

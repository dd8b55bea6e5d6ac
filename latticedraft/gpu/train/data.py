"""Token streams for training and evaluation: corpus files → one flat id array → fixed windows.

``encode_files(files, tokenizer)`` returns ``int32[N]``: every file is preceded by the
end-of-text id (0 for the bundled tokenizer), so windows never silently glue two files
together without a separator. ``TokenWindows`` cuts the stream into non-overlapping windows of
``seq_len`` tokens and serves deterministic shuffled batches (``int64[batch, seq_len]``): batch
``i`` depends only on ``(seed, i)``, which is what makes ``--resume`` continue exactly.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm import tqdm

from latticedraft import learned_state
from latticedraft.errors import InputError
from latticedraft.lm.corpus import read_text
from latticedraft.lm.tokenizer import EOS_TOKEN


def progress_enabled() -> bool:
    """Progress bars only when stderr is a terminal."""
    return sys.stderr.isatty()


def quiet_hf_progress() -> None:
    """Turn transformers' own bars ("Writing model shards", "Loading weights") off unless stderr is a terminal."""
    if not progress_enabled():
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def _stream_schema(a) -> str | None:
    """None where a cached stream is int32[N] of ids >= 0, else why not."""
    if not isinstance(a, np.ndarray) or a.dtype != np.int32 or a.ndim != 1:
        return "not a one-dimensional int32 array"
    return "negative token ids" if a.size and a.min() < 0 else None


TOKENS = learned_state.kind("tokens", "a tokenized corpus", _stream_schema, parse=lambda p: np.load(p),
                            example=lambda: lambda p: np.save(p, np.arange(7, dtype=np.int32)))


def _cache_file(files: Sequence[Path], tokenizer, encoding_errors: str) -> str:
    """The stream's entry name in ``TOKENS``: a hash of the tokenizer and every file's path, size and mtime."""
    from latticedraft.lm.tokenizer import fingerprint

    h = hashlib.sha256(f"{fingerprint(tokenizer)}\n{encoding_errors}\n".encode())
    for f in files:
        st = Path(f).stat()
        h.update(f"{Path(f).resolve()}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
    return f"{h.hexdigest()[:24]}.npy"


def encode_files(files: Sequence[Path], tokenizer, encoding_errors: str = "strict", batch: int = 32,
                 cache: bool = True) -> np.ndarray:
    """Tokenize ``files`` into one ``int32[N]`` stream, each file prefixed by the end-of-text id.

    With ``cache`` the stream is kept in ``<cache_dir>/tokens/`` keyed by the tokenizer's
    fingerprint and every file's path, size and mtime, so repeated training runs skip tokenizing.
    """
    eos = tokenizer.token_to_id(EOS_TOKEN)
    if eos is None:
        raise InputError(f"the tokenizer has no {EOS_TOKEN!r} token; train it with latticedraft's train_tokenizer")
    files = list(files)
    cfile = _cache_file(files, tokenizer, encoding_errors) if cache and files else None
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    fits = lambda a: "token ids beyond the vocabulary" if a.size and a.max() >= vocab else None  # noqa: E731
    hit = None if cfile is None else learned_state.read(TOKENS, cfile, check=fits)
    if hit is not None:
        return hit
    out = _encode(files, tokenizer, eos, encoding_errors, batch)
    if cfile is not None:
        learned_state.write(TOKENS, cfile, lambda tmp: np.save(tmp, out))
    return out


def _encode(files: list[Path], tokenizer, eos: int, encoding_errors: str, batch: int) -> np.ndarray:
    parts: list[np.ndarray] = []
    with tqdm(total=len(files), desc="tokenize", unit="file", disable=not progress_enabled()) as bar:
        for i in range(0, len(files), batch):
            chunk = files[i : i + batch]
            texts = [read_text(Path(f), encoding_errors) for f in chunk]
            encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
            for enc in encode(texts, add_special_tokens=False):
                parts.append(np.asarray([eos] + enc.ids, dtype=np.int32))
            bar.update(len(chunk))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


@dataclass
class TokenWindows:
    """Non-overlapping ``seq_len`` windows of a token stream, served in seeded shuffled batches.

    tokens: int32[N]; windows: int64[num_windows, seq_len] (the tail shorter than a window is dropped).
    """

    tokens: np.ndarray
    seq_len: int
    batch_size: int
    seed: int = 0
    source: str = "the corpus"

    def __post_init__(self) -> None:
        if self.seq_len < 2:
            raise InputError(f"sequence length {self.seq_len} is too short; use at least 2 tokens")
        n = len(self.tokens) // self.seq_len
        if n < self.batch_size:
            raise InputError(
                f"{self.source} has {len(self.tokens)} tokens: {n} windows of {self.seq_len}, fewer than one batch of "
                f"{self.batch_size}; give more text or lower --batch-size / --seq-len"
            )
        self.windows = np.asarray(self.tokens[: n * self.seq_len], dtype=np.int64).reshape(n, self.seq_len)
        self.batches_per_epoch = n // self.batch_size

    def batch(self, index: int) -> np.ndarray:
        """Batch ``index`` (``int64[batch_size, seq_len]``): epoch ``index // batches_per_epoch``, seeded order."""
        epoch, j = divmod(index, self.batches_per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.windows))
        return self.windows[order[j * self.batch_size : (j + 1) * self.batch_size]]

    def sequential(self, limit: int | None = None) -> np.ndarray:
        """The windows in corpus order, at most ``limit`` of them (for evaluation)."""
        return self.windows if limit is None else self.windows[:limit]

"""Corpus files → token-id text for ``lmplz``: one sentence (line, paragraph or file) per line, ids space-separated.

Streams to disk: files are read one at a time, split (``corpus.iter_sentences``), encoded with
``Tokenizer.encode_batch`` in batches and written immediately, so memory is O(one file).
"""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from tokenizers import Tokenizer
from tqdm import tqdm

from latticedraft.lm.corpus import iter_sentences, read_text

BATCH_CHUNKS = 4096


@dataclass
class CorpusStats:
    """What went into the id file: token and chunk counts, per-file size and sha256, timing."""

    tokens: int = 0
    chunks: int = 0
    bytes: int = 0
    seconds: float = 0.0
    files: list[dict] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")


def write_token_ids(files: Sequence[Path], tok: Tokenizer, out: Path, encoding_errors: str = "strict",
                    progress: bool | None = None, sentences: str = "paragraphs") -> CorpusStats:
    """Tokenize ``files`` into ``out`` (one line per sentence, ``corpus.iter_sentences``). Returns counts
    and file fingerprints.

    ``progress=None`` shows a tqdm bar (bytes) only when stderr is a terminal.
    """
    disable = (not sys.stderr.isatty()) if progress is None else not progress
    total = sum(p.stat().st_size for p in files)
    stats = CorpusStats()
    table = [str(i) for i in range(tok.get_vocab_size(with_added_tokens=True))]
    # encode_batch_fast (tokenizers >= 0.21) skips character offsets, which we do not need
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    pending: list[str] = []

    def flush(f) -> None:
        lines = []
        for e in encode(pending, add_special_tokens=False):
            ids = e.ids
            if ids:
                lines.append(" ".join([table[t] for t in ids]))
                stats.tokens += len(ids)
        if lines:
            f.write("\n".join(lines))
            f.write("\n")
        stats.chunks += len(lines)
        pending.clear()

    t0 = time.perf_counter()
    with open(out, "w", encoding="ascii") as f, tqdm(total=total, unit="B", unit_scale=True,
                                                     desc="tokenizing", disable=disable) as bar:
        for p in files:
            raw_size = p.stat().st_size
            text = read_text(p, encoding_errors)
            stats.files.append({"path": str(p.resolve()), "bytes": raw_size,
                                "sha256": hashlib.sha256(p.read_bytes()).hexdigest()})
            pending.extend(iter_sentences(text, sentences))
            if len(pending) >= BATCH_CHUNKS:  # batches span files so the tokenizer's threads stay busy
                flush(f)
            stats.bytes += raw_size
            bar.update(raw_size)
        if pending:
            flush(f)
    stats.seconds = time.perf_counter() - t0
    return stats

"""Tokenizers shared by the target model and the n-gram LM (HF ``tokenizers``).

``load_tokenizer(path)`` accepts a ``tokenizer.json`` or a directory holding one.
``train_tokenizer(files, vocab_size)`` trains a byte-level BPE (GPT-2 style, ``<|endoftext|>``
is id 0) deterministically on the given files. ``fingerprint(tok)`` identifies a vocabulary.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from latticedraft.errors import InputError, ModelError
from latticedraft.lm.corpus import read_text

EOS_TOKEN = "<|endoftext|>"


def load_tokenizer(path: str | Path) -> Tokenizer:
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise InputError(f"tokenizer {p} not found; pass a tokenizer.json or a directory that holds one")
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
        raise ModelError(f"tokenizer {p} cannot be loaded ({e}); is it a HF tokenizer.json?") from e


def train_tokenizer(files: Iterable[Path], vocab_size: int, encoding_errors: str = "strict") -> Tokenizer:
    """Byte-level BPE with ``vocab_size`` entries (≥ 257: 256 bytes + end-of-text)."""
    if vocab_size < 257:
        raise InputError(f"--train-tokenizer {vocab_size} is too small; byte-level BPE needs at least 257")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = (read_text(f, encoding_errors) for f in files)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def fingerprint(tok: Tokenizer) -> str:
    """sha256 of the vocabulary (token → id), stable across tokenizer JSON formatting."""
    vocab = tok.get_vocab(with_added_tokens=True)
    blob = "\n".join(f"{i}\t{t}" for t, i in sorted(vocab.items(), key=lambda kv: kv[1]))
    return hashlib.sha256(blob.encode()).hexdigest()

"""Is the tokenizer given the one the model was trained with? Checked by vocabulary fingerprint.

A tokenizer with the model's vocabulary size but other ids decodes to garbage without any
error, so a size check is not enough. The model's own tokenizer is known from its training
record (``training.json``: ``"tokenizer": <fingerprint>``) or a ``tokenizer.json`` beside it,
in the model directory or, for a head checkpoint, the base directory.
"""

from __future__ import annotations

import json
from pathlib import Path

from latticedraft.errors import ModelError


def model_tokenizer_fingerprint(*dirs) -> tuple[str, str] | None:
    """``(fingerprint, where it came from)`` of the first directory in ``dirs`` that records one, else None."""
    from latticedraft.lm.tokenizer import fingerprint, load_tokenizer

    for d in dirs:
        if not d:
            continue
        d = Path(d)
        rec = d / "training.json"
        if rec.is_file():
            try:
                fp = json.loads(rec.read_text()).get("tokenizer")
            except (OSError, ValueError, AttributeError):
                fp = None
            if isinstance(fp, str) and len(fp) == 64:
                return fp, str(rec)
        tj = d / "tokenizer.json"
        if tj.is_file():
            return fingerprint(load_tokenizer(tj)), str(tj)
    return None


def check_model_tokenizer(tok, tokenizer_path, *dirs) -> None:
    """``ModelError`` naming both when ``tok`` (loaded from ``tokenizer_path``) is not the tokenizer
    recorded for the model in ``dirs`` (model directory first, then its base)."""
    from latticedraft.lm.tokenizer import fingerprint

    ref = model_tokenizer_fingerprint(*dirs)
    if ref is None:
        return
    want, where = ref
    got = fingerprint(tok)
    if got != want:
        raise ModelError(f"tokenizer {tokenizer_path} (vocabulary fingerprint {got[:12]}) is not the one the model "
                         f"was trained with ({where}: fingerprint {want[:12]}); pass that tokenizer with --tokenizer "
                         "or drop --tokenizer")

"""The draft vocabulary: token ids ranked by frequency in the heads' training corpus.

The extra heads may project onto the V' most frequent tokens only (FR-Spec, EAGLE-3), which
makes their projection and the lattice's log-softmax/top-k V/V' times cheaper. The ranking is
stored as ``draft_vocab.json`` beside a head checkpoint (``{"corpus", "tokens", "ranked"}``),
written by ``write_ranked`` (``data/build.sh draft-vocab`` for the bundled heads, ``train heads
--draft-vocab`` beside heads trained on the V' most frequent tokens only, which it records as
``"trained"``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from latticedraft.atomic import write_atomic
from latticedraft.errors import InputError

FILE = "draft_vocab.json"


def rank_tokens(stream: np.ndarray, vocab_size: int) -> np.ndarray:
    """Token ids that occur in ``stream`` (int[N]), most frequent first (ties: lower id first)."""
    counts = np.bincount(np.asarray(stream, dtype=np.int64), minlength=vocab_size)[:vocab_size]
    order = np.argsort(-counts, kind="stable")
    return order[counts[order] > 0].astype(np.int64)


def write_ranked(model_dir: str | Path, stream: np.ndarray, vocab_size: int, corpus: str,
                 trained: int | None = None) -> Path:
    """``model_dir/draft_vocab.json`` ranking the tokens of ``stream`` (int[N]); ``trained``: the V' most
    frequent tokens the heads were trained to draft among (``train heads --draft-vocab``), if any."""
    ranked = rank_tokens(stream, vocab_size)
    out = Path(model_dir) / FILE
    info = {"corpus": corpus, "tokens": int(len(stream)), **({} if trained is None else {"trained": int(trained)})}
    write_atomic(out, json.dumps({**info, "ranked": ranked.tolist()}) + "\n")
    return out


def trained_size(model_dir: str | Path) -> int | None:
    """The V' the heads in ``model_dir`` were trained to draft among (None: the whole vocabulary, or no ranking)."""
    path = Path(model_dir) / FILE
    try:
        trained = json.loads(path.read_text()).get("trained")
    except (OSError, ValueError, AttributeError):
        return None  # load_ranked names what is wrong with the file
    return trained if isinstance(trained, int) and trained > 0 else None


def load_ranked(model_dir: str | Path, size: int) -> np.ndarray:
    """The ``size`` most frequent ids (int64[size]) from ``model_dir/draft_vocab.json``."""
    path = Path(model_dir) / FILE
    if size < 1:
        raise InputError(f"--draft-vocab {size}: give the number of most frequent tokens the heads draft from (>= 1)")
    if not path.is_file():
        raise InputError(f"--draft-vocab needs {path} (token ids ranked by corpus frequency); write it with "
                         "latticedraft.gpu.models.draft_vocab.write_ranked, or drop --draft-vocab")
    try:
        ranked = np.asarray(json.loads(path.read_text())["ranked"], dtype=np.int64)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{path} is not a draft vocabulary file ({e}); rewrite it with write_ranked") from e
    if size > len(ranked):
        raise InputError(f"--draft-vocab {size} exceeds the {len(ranked)} tokens ranked in {path}; give at most {len(ranked)}")
    return ranked[:size]

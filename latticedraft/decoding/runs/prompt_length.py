"""Prompts against the model's positions: one check, one refusal line, one left truncation.

A prompt of n tokens decoded for ``max_new_tokens`` needs ``n + max_new_tokens`` positions. Past
the model's limit (GPT-2's ``n_positions``, ``max_position_embeddings``) every decoder refuses
before any work, naming the length, the limit and the fix: ``--truncate-left N`` keeps the last
N tokens of every prompt (the context nearest the continuation, as code completion wants).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from latticedraft.errors import InputError
from latticedraft.gpu.verify.modes import position_limit


def truncate_left(prompts: Sequence, keep: int | None) -> list[np.ndarray]:
    """The last ``keep`` tokens of every prompt (all of it when shorter; ``None`` = unchanged)."""
    out = [np.asarray(p, dtype=np.int64).reshape(-1) for p in prompts]
    if keep is None:
        return out
    if keep < 1:
        raise InputError(f"--truncate-left {keep} must keep at least 1 token")
    return [p[-keep:] for p in out]


def check_fits(limit: int | None, lengths: Sequence[int], max_new_tokens: int, names: Sequence[str] | None = None) -> None:
    """Refuse (``InputError``) when the longest prompt + ``max_new_tokens`` exceeds ``limit``; ``names``
    (one per prompt) says which prompt in the message."""
    if not limit or not len(lengths):
        return
    at = int(np.argmax(lengths))
    longest = int(lengths[at])
    if longest + max_new_tokens <= limit:
        return
    room, most = limit - max_new_tokens, limit - longest  # the prompt tokens that fit; the new tokens that fit
    lower = f"lower --max-new-tokens to {most} at most (the most this prompt leaves room for)"
    if room >= 1:
        fix = f"pass --truncate-left {room} to keep the last {room} tokens of each prompt" + (f", or {lower}"
                                                                                                if most >= 1 else "")
    else:
        fix = lower if most >= 1 else (f"lower --max-new-tokens below {limit} and pass --truncate-left to leave "
                                       "room for the new tokens")
    which = f"{names[at]}: " if names is not None else ""
    raise InputError(f"{which}a prompt of {longest} tokens + --max-new-tokens {max_new_tokens} exceeds the model's "
                     f"{limit} positions; {fix}")


def fit_prompts(model, prompts: Sequence, max_new_tokens: int, keep: int | None = None,
                names: Sequence[str] | None = None) -> list[np.ndarray]:
    """``truncate_left`` then ``check_fits`` against ``model``'s positions: call before decoding any prompt."""
    out = truncate_left(prompts, keep)
    check_fits(position_limit(model), [len(p) for p in out], max_new_tokens, names)
    return out


def checked_prompts(model, prompts: Sequence, max_new_tokens: int) -> list[np.ndarray]:
    """Every decoder's first step: ``max_new_tokens >= 1``, prompts as int64 arrays of at least one
    token, and prompt + new tokens within the model's positions (``check_fits``)."""
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    prompts = [np.asarray(p, dtype=np.int64).reshape(-1) for p in prompts]
    if not prompts or any(len(p) == 0 for p in prompts):
        raise InputError("every prompt must have at least one token")
    check_fits(position_limit(model), [len(p) for p in prompts], max_new_tokens)
    return prompts

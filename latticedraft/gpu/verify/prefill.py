"""Chunked prefill into a rolling-buffer cache (Mistral 7B, section 2, "Pre-fill and chunking").

A prompt longer than the window W runs in chunks of W tokens. Chunk ``c`` attends to the rolling
buffer (the W positions before it, i.e. the previous chunk) and causally to itself, each key
only within the window: key ``k`` is visible to query ``q`` iff ``k <= q`` and ``k > q - W``
(the paper's Figure 3). After each chunk its keys/values are rolled into the buffer
(``kv.KVCache.roll_in``), so memory stays at W + chunk slots per layer whatever the prompt's
length, and every position's logits equal those of one full-context forward.
"""

from __future__ import annotations

import numpy as np
import torch

from latticedraft.gpu.masks import causal, visible


def chunk_mask(state, valid: np.ndarray, pos: np.ndarray, window: int | None) -> np.ndarray:
    """bool[b, C, L + C]: which cache slots and chunk tokens each chunk token sees. valid: bool[b, C]
    (False = left padding), pos: int64[b, C]. Padding queries see themselves (no all-masked row)."""
    return visible(state.valid, state.pos, pos, causal(valid), window)


def chunked_prefill(run, state, ids: torch.Tensor, valid: torch.Tensor, window: int, chunk: int | None = None):
    """Prefill left-padded ``ids`` (int64[b, n], ``valid`` bool[b, n]) into ``state``, an empty
    rolling cache of W = ``window`` slots, ``chunk`` tokens (default W) per call.

    run(ids [b, C], allowed bool[b, C, L + C] (numpy), pos int64[b, C]) -> the call's result (a
    ``forward.Forward``; it writes the chunk's keys and values after the cache's slots). Returns
    the last chunk's result; earlier results are dropped as soon as the next chunk runs, so their
    logits never pile up."""
    b, n = ids.shape
    chunk = chunk or window
    pos = (torch.cumsum(valid.long(), dim=1) - 1).clamp(min=0)
    valid_h, pos_h = valid.cpu().numpy(), pos.cpu().numpy()
    out = None
    for c0 in range(0, n, chunk):
        v, p = valid_h[:, c0:c0 + chunk], pos_h[:, c0:c0 + chunk]
        start = state.length
        out = None  # release the previous chunk's logits before the next call
        out = run(ids[:, c0:c0 + chunk], chunk_mask(state, v, p, window), pos[:, c0:c0 + chunk])
        state.roll_in(start, np.where(v, p, -1))
    return out

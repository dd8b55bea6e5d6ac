"""Chunked prefill into a rolling-buffer cache (Mistral 7B, section 2, "Pre-fill and chunking").

A prompt longer than the window W runs in chunks of W tokens. Chunk ``c`` attends to the rolling
buffer (the W positions before it, i.e. the previous chunk) and causally to itself, each key
only within the window: key ``k`` is visible to query ``q`` iff ``k <= q`` and ``k > q - W``
(the paper's Figure 3). After each chunk its keys/values are rolled into the buffer
(``SlotCache.roll_in``), so memory stays at W + chunk slots per layer whatever the prompt's
length, and every position's logits equal those of one full-context forward.
"""

from __future__ import annotations

import torch

from latticedraft.gpu.verify.kvcache import SlotCache


def window_mask(allowed: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """bool[b, N, K] restricted to keys inside the window: ``k_pos > q_pos - window``."""
    if window is None:
        return allowed
    return allowed & (k_pos[:, None, :] > q_pos[:, :, None] - window)


def chunk_mask(state: SlotCache, valid: torch.Tensor, pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """bool[b, C, L + C]: which cache slots and chunk tokens each chunk token sees. valid: bool[b, C]
    (False = left padding), pos: int64[b, C]. Padding queries see themselves (no all-masked row)."""
    b, c = valid.shape
    dev = valid.device
    causal = torch.ones(c, c, dtype=torch.bool, device=dev).tril()
    own = causal[None] & valid[:, None, :]
    cached = state.valid[:, None, :].expand(b, c, state.length)
    allowed = window_mask(torch.cat([cached, own], dim=2), pos, torch.cat([state.pos, pos], dim=1), window)
    allowed[:, :, state.length:] |= torch.eye(c, dtype=torch.bool, device=dev)[None]
    return allowed


def chunked_prefill(run, ids: torch.Tensor, valid: torch.Tensor, window: int, chunk: int | None = None):
    """Prefill left-padded ``ids`` (int64[b, n], ``valid`` bool[b, n]) into a rolling cache of W =
    ``window`` slots, ``chunk`` tokens (default W) per call.

    run(ids [b, C], allowed bool[b, C, L + C], pos int64[b, C], cache) -> the call's result (a
    ``verify.Forward``). Returns (the ``SlotCache``, the last chunk's result); earlier results are
    dropped as soon as the next chunk runs, so their logits never pile up."""
    b, n = ids.shape
    chunk = chunk or window
    state = SlotCache.empty(b, ids.device, window=window)
    pos = (torch.cumsum(valid.long(), dim=1) - 1).clamp(min=0)
    out = None
    for c0 in range(0, n, chunk):
        v, p = valid[:, c0:c0 + chunk], pos[:, c0:c0 + chunk]
        start = state.length
        out = None  # release the previous chunk's logits before the next call
        out = run(ids[:, c0:c0 + chunk], chunk_mask(state, v, p, window), p, state.cache)
        state.roll_in(start, torch.where(v, p, torch.full_like(p, -1)))
    return state, out

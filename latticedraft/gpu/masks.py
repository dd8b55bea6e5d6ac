"""Attention masks, in one place: which keys each query may see, and the additive form the models take.

A call's queries are N new tokens at positions ``q_pos`` [b, N]; its keys are the K slots already
in the cache (``key_valid`` bool[b, K]: False = padding or a dropped slot; ``key_pos`` [b, K])
followed by the N new tokens themselves, whose mutual visibility the caller gives (``new``
bool[b, N, N]: causal for a prompt, the ancestors of a draft tree, the diagonal for independent
candidates). Mistral's sliding window hides a key at position ``k`` from a query at ``q`` unless
``k > q - W`` (transformers' rule). A padding query sees at least itself, so no row is empty (no
NaN). The bool masks are numpy or torch alike (the verifier builds them on the host, the split
runners on the device); ``attention_bias`` turns one into the float mask [b, 1, N, K + N].
"""

from __future__ import annotations

import numpy as np
import torch

CAUSAL = "causal"  # a prompt into an empty cache (K = N), no padding, inside the window: attention's own causal kernel


def causal_only(allowed: np.ndarray) -> bool:
    """Whether allowed bool[b, N, K] is ``CAUSAL``: K = N and query i sees exactly slots 0..i in
    every row (then ``LeanStack.run`` takes ``CAUSAL`` instead of the mask)."""
    b, n, k = allowed.shape
    return n == k and n > 1 and bool((allowed == np.tri(n, dtype=bool)).all())


def attention_bias(allowed, dtype: torch.dtype, device=None) -> torch.Tensor:
    """bool[b, N, K] (True = may attend) -> additive float mask [b, 1, N, K] (0 or dtype min); a
    host (numpy) mask crosses to ``device`` once."""
    if isinstance(allowed, np.ndarray):
        allowed = torch.from_numpy(allowed).to(device)
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    bias.masked_fill_(~allowed, torch.finfo(dtype).min)
    return bias[:, None]


def window_mask(allowed, q_pos, k_pos, window: int | None):
    """bool[b, N, K] restricted to keys inside the window, ``k_pos > q_pos - window`` (in place;
    ``q_pos`` [b, N], ``k_pos`` [b, K]; numpy or torch)."""
    if window is not None:
        allowed &= k_pos[:, None, :] > q_pos[:, :, None] - window
    return allowed


def visible(key_valid, key_pos, q_pos, new, window: int | None, self_visible: bool = True):
    """bool[b, N, K + N]: the cached slots each new token sees (valid ones, inside the window) and
    the new tokens it sees (``new``, inside the window); with ``self_visible`` every query sees
    itself (padding rows). numpy or torch, as the inputs."""
    b, n = q_pos.shape
    K = key_valid.shape[1]
    if isinstance(new, torch.Tensor):
        allowed = torch.empty(b, n, K + n, dtype=torch.bool, device=new.device)
        cat, rows = torch.cat, torch.arange(n, device=new.device)
    else:
        allowed = np.empty((b, n, K + n), dtype=bool)
        cat, rows = np.concatenate, np.arange(n)
    allowed[:, :, :K] = key_valid[:, None, :]
    allowed[:, :, K:] = new
    if window is not None:
        window_mask(allowed, q_pos, cat([key_pos, q_pos], 1), window)
    if self_visible:
        allowed[:, rows, rows + K] = True
    return allowed


def causal(valid):
    """bool[b, n, n]: query t sees the valid new tokens s <= t (``valid`` bool[b, n]; numpy or torch)."""
    n = valid.shape[1]
    if isinstance(valid, torch.Tensor):
        return torch.ones(n, n, dtype=torch.bool, device=valid.device).tril()[None] & valid[:, None, :]
    return np.tril(np.ones((n, n), dtype=bool))[None] & valid[:, None, :]


def causal_mask(start: int, n: int, window: int | None, device) -> torch.Tensor | str | None:
    """One sequence whose slot = position: which of slots 0..start+n-1 the n tokens at positions
    start.. see, bool[1, 1, n, start + n], causal and inside the window; None where every slot is
    visible (the models' default); ``CAUSAL`` for a first call (start 0) inside the window."""
    if n == 1 and (window is None or start < window):
        return None
    if start == 0 and (window is None or n <= window):
        return CAUSAL
    k = torch.arange(start + n, device=device)[None]  # [1, start + n]
    q = k[:, start:]  # [1, n]
    return window_mask(k[:, None, :] <= q[:, :, None], q, k, window)[:, None]

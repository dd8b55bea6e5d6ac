"""The output projection's k largest logits, screened in bfloat16 and settled in float32.

Sampling with a top-k (``generate``'s default k = 50) reads only the logits that can be among
the k largest: every other token gets probability 0 before the softmax. ``TopKProjection``
runs the bfloat16 product of ``screened_argmax.BF16Screen`` and its proven bound
``|z~_v - z_v| <= A ||h|| ||w_v|| + B |z~_v|``, which gives each token an interval
[lo_v, hi_v] holding its float32 logit. With L the k-th largest lo_v, at least k tokens have
a float32 logit >= L, so the k-th largest float32 logit is >= L and every token that reaches it
(ties included) has hi_v >= L: those are the candidates, and only their logits are computed in
float32. The result is the logits [m, V] with the candidates' float32 logits and -inf
elsewhere: a top-k of k (then any top-p, temperature or softmax, which act on the k largest)
gives what it gives on the whole float32 projection.

Not for a repetition penalty, which runs before the top-k and can lower a token of the k
largest below one outside them (``SamplingOptions.top_k_reads``).
"""

from __future__ import annotations

import numpy as np
import torch

from latticedraft.gpu.verify.screened_argmax import BF16Screen, cached_projection
from latticedraft.gpu.verify.sparse_logits import SparseLogits

MAX_SHARE = 0.25  # candidates per row, as a share of the vocabulary, above which the float32 projection decides


class TopKProjection(BF16Screen):
    """``__call__(h [m, H])``: the logits of the output projection ``unembed`` that can be among
    each row's ``k`` largest (ties included), as ``SparseLogits`` of their float32 values, through
    the bfloat16 screen (module doc) where it applies and is faster (up to ``max_rows``); else the
    whole float32 projection, a tensor [m, V] (which a top-k of k reads the same way)."""

    def __init__(self, unembed, k: int):
        super().__init__(unembed)
        self.k = int(k)
        if self.screens and self.k >= self.vocab:  # a top-k of the whole vocabulary: nothing to screen
            self.screens = False
        if self.screens:
            self.flat_norms = self.norms.reshape(-1).astype(np.float32)  # sorted positions

    def full(self, h: torch.Tensor) -> torch.Tensor:
        """The float32 projection: logits [m, V]."""
        return self.unembed(h)

    def timed_full(self, h: torch.Tensor):
        """What the float32 path costs a top-k reader: the projection and its k largest."""
        return self.unembed(h).topk(self.k, dim=-1)

    def screen_rows(self, rows, screened, full) -> float:
        """The most rows screened: up to the last row count of an unbroken run, from the
        first, where the screen is faster (inf: all of them), and one row where two are; none
        where it loses at the first. Its [m, V] bound arithmetic grows with the rows, and past
        some size costs more than the float32 projection's top-k."""
        wins = np.asarray(screened) < np.asarray(full)
        if wins.all():
            return float("inf")
        return 0 if not wins[0] else int(rows[int(np.argmin(wins)) - 1])

    def screened(self, h: torch.Tensor):
        """The candidates' float32 logits through the bfloat16 screen: ``SparseLogits`` (or the
        float32 logits [m, V] where the screen cannot decide: non-finite or flat logits).

        The bounds are computed in float32: their own rounding (relative 2^-24 per operation)
        is far inside the quarter of margin on A and B."""
        m, V, k = len(h), self.vocab, self.k
        z, a = self.screened_logits(h)
        z = z.reshape(m, -1).numpy()  # [m, blocks * BLOCK], sorted positions; padding -inf (ours to overwrite)
        width = z.shape[1]
        if np.isnan(np.sum(z)):  # NaN (or +inf beside -inf) logits: the float32 projection decides
            return self.full(h)
        # in place, two [m, width] buffers: fresh multi-megabyte temporaries cost page faults
        slack = a.astype(np.float32)[:, None] * self.flat_norms
        work = np.abs(z)
        work *= np.float32(self.b)
        slack += work
        np.subtract(z, slack, out=work)  # the float32 logit at each position is >= this (padding: -inf)
        work.partition(width - k, axis=1)
        floor = work[:, width - k]  # L: the k-th largest lower bound
        if not np.isfinite(floor).all():
            return self.full(h)
        with np.errstate(invalid="ignore"):  # padding: -inf + inf is NaN, never a hit
            z += slack
            hit = np.flatnonzero(z >= floor[:, None])  # the upper bound reaches L
        if len(hit) > MAX_SHARE * V * m:  # a flat distribution: the float32 projection is cheaper
            return self.full(h)
        rows, pos = np.divmod(hit, width)
        tokens = self.order[pos]
        return SparseLogits(rows, tokens, self.exact_logits(h, rows, tokens), (m, V))


def topk_projection(unembed, k: int) -> TopKProjection:
    """The ``TopKProjection`` of an output projection module for ``k`` (``cached_projection``)."""
    return cached_projection(unembed, ("top_k", int(k)), lambda u: TopKProjection(u, k))

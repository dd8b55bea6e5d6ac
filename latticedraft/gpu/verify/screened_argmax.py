"""The output projection's argmax, screened in bfloat16 and settled in float32.

Greedy verification reads only the argmax of each walked node's logits, and on a CPU with
bfloat16 dot products (AVX512-BF16, AMX) a bfloat16 projection of m rows costs a fraction of
the float32 one (bundled base, 16 rows: ~110 us against ~440 us with the argmax).
``ArgmaxProjection`` runs the bfloat16 product, keeps per row every token whose float32 logit
could still be the largest under a proven bound on the bfloat16 error, and computes only those
tokens' logits in float32: the argmax is the float32 projection's, with its tie rule (lowest
token id first).

The bound. With u = 2^-8 (bfloat16's unit roundoff, round to nearest), rounding h and the
weight row w_v to bfloat16, multiplying (exact in float32), summing H products in float32
(gamma_H = H 2^-24) and rounding the sum to bfloat16 give a screened logit z~_v with

    |z~_v - z_v| <= (2u + u^2 + 2 gamma_H) |h| . |w_v| + u / (1 - u) |z~_v|
                 <= A ||h|| ||w_v|| + B |z~_v|                 (Cauchy-Schwarz)

where z_v is the float32 logit (itself within gamma_H |h| . |w_v| of the exact dot product);
A and B are those coefficients with a quarter more. Token v can be the argmax only if

    z~_v + B |z~_v| + A ||h|| ||w_v||  >=  z~_top - B |z~_top| - A ||h|| ||w_top||,

and x + B|x| is increasing, so each token has one threshold on z~_v. The vocabulary is kept
in blocks of ``BLOCK`` tokens sorted by ||w_v||: a block whose largest screened logit is under
the threshold of its largest-norm token holds no candidate; the candidate blocks' tokens are
tested one by one, and only the candidates' logits are computed in float32.

The bound needs the bfloat16 product to accumulate in float32; ``screening_ok`` checks that on
this device once (a sum that bfloat16 accumulation gets visibly wrong). Only CPU devices are
screened: CUDA's bfloat16 GEMMs may reduce in reduced precision.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from latticedraft.gpu.verify.sparse_logits import SparseLogits
from latticedraft.memo import kept, weights_key

U = 2.0 ** -8  # bfloat16's unit roundoff (8 significant bits)
MARGIN = 1.25  # the bound's coefficients with a quarter more
BLOCK = 64  # tokens per block of the screen
MAX_CANDIDATES = 16  # mean candidates per row above which the float32 projection decides
_OK: dict = {}  # device type -> whether bfloat16 products accumulate in float32 there


def screening_ok(device) -> bool:
    """Whether a bfloat16 matmul on ``device`` accumulates in float32 (checked once per device
    type; CPU only): 1 + 127 * 2^-8 is 1.496 in float32 and 1.0 summed in bfloat16."""
    dev = torch.device(device)
    if dev.type != "cpu":
        return False
    if dev.type not in _OK:
        try:
            h = torch.full((1, 128), 2.0 ** -8, dtype=torch.bfloat16, device=dev)
            h[0, 0] = 1.0
            z = F.linear(h, torch.ones(3, 128, dtype=torch.bfloat16, device=dev)).float()
            _OK[dev.type] = bool(((z - 1.496).abs() < 0.01).all())
        except RuntimeError:  # no bfloat16 matmul in this build
            _OK[dev.type] = False
    return _OK[dev.type]


class ScreenTables:
    """What every screen of an output projection ``nn.Linear`` ``W`` [V, H] (float32) reads, made
    once per module (``cached_projection``) and shared by its argmax and top-k screens: the
    bound's coefficients ``a`` and ``b``; ``order`` (sorted position -> token id, by ||w_v||
    descending); ``weight`` (float32 [V, H], token order) and ``weight16`` (bfloat16 [blocks *
    BLOCK, H], sorted order, zero padding); ``norms`` [blocks, BLOCK] (||w|| per sorted position)
    and ``block_norm`` [blocks] (each block's largest)."""

    def __init__(self, unembed):
        w = unembed.weight.detach()
        V, H = w.shape
        gamma = H * 2.0 ** -24
        self.a, self.b = MARGIN * (2 * U + U * U + 2 * gamma), MARGIN * U / (1 - U)
        norms = w.norm(dim=-1).double()
        self.order = torch.argsort(norms, descending=True).numpy()
        self.vocab, self.blocks = V, -(-V // BLOCK)
        self.weight = w.numpy()
        self.weight16 = w.new_zeros(self.blocks * BLOCK, H, dtype=torch.bfloat16)
        self.weight16[:V] = w[torch.from_numpy(self.order)]
        sorted_norms = np.zeros(self.blocks * BLOCK)
        sorted_norms[:V] = norms.numpy()[self.order]
        self.norms = sorted_norms.reshape(self.blocks, BLOCK)
        self.block_norm = self.norms[:, 0]


class BF16Screen:
    """The shared part of the screened projections of an output projection ``W`` [V, H]: the
    module's ``ScreenTables`` (its bfloat16 copy, vocabulary sorted by ||w_v|| in blocks of
    ``BLOCK``, the norms and the bound's coefficients), and ``calibrate``, which decides how many
    rows the screen takes (``max_rows``: where it is faster than float32).
    ``screens``: whether the screen applies at all (an ``nn.Linear`` without bias, float32, on a
    CPU whose bfloat16 products accumulate in float32). Subclasses define ``screened(h)`` and
    ``full(h)`` (the same result through the float32 projection)."""

    def __init__(self, unembed):
        self.unembed = unembed
        w = getattr(unembed, "weight", None)
        self.screens = (isinstance(unembed, torch.nn.Linear) and unembed.bias is None
                        and w.dtype == torch.float32 and screening_ok(w.device))
        self.max_rows = float("inf")  # the most rows the screen takes (``calibrate``; more: float32)
        self._calibrated = None
        if self.screens:
            t = cached_projection(unembed, "tables", ScreenTables)  # one bfloat16 copy per module
            self.a, self.b, self.order, self.vocab, self.blocks = t.a, t.b, t.order, t.vocab, t.blocks
            self.weight, self.weight16, self.norms, self.block_norm = t.weight, t.weight16, t.norms, t.block_norm

    def calibrate(self, states: torch.Tensor, rows=(2, 4, 8, 16, 32, 64), repeats: int = 5) -> None:
        """Sets ``max_rows`` (``screen_rows``) from the screen's and the float32 path's times at
        each of ``rows``, timed back to back once per thread count on ``states`` [k, H] (a model's
        final states: how many candidates the screen keeps depends on how peaked they are),
        repeated to each row count; on a machine without bfloat16 dot products the screen loses
        and is switched off."""
        threads = torch.get_num_threads()
        if not self.screens or self._calibrated == threads:
            return
        xs = [states[torch.arange(r) % len(states)] for r in rows]
        screened = [median_seconds(self.screened, x, repeats) for x in xs]
        self.max_rows = self.screen_rows(rows, screened, [median_seconds(self.timed_full, x, repeats) for x in xs])
        self._calibrated = threads

    def screen_rows(self, rows, screened, full) -> float:
        """The most rows screened, from the times (seconds) at each of ``rows``: any number where
        the screen's summed time is less than float32's, else none. Where it is faster, a single
        row is screened too: timed back to back one row costs about the same either way (~75 us
        float32, ~100 us screened on the bundled model), but in a decode the projection's weights
        come back from memory every step, and the screen reads half the bytes (one row per step,
        screened against float32 in one process: the greedy loop 1.43x -> 1.56x HF greedy on
        held-out prompts, 1.41x -> 1.62x on held-back code)."""
        return float("inf") if sum(screened) < sum(full) else 0

    def timed_full(self, h: torch.Tensor):
        """The float32 path as ``calibrate`` times it (default: ``full``)."""
        return self.full(h)

    def use_screen(self, h: torch.Tensor) -> bool:
        """Whether ``__call__`` screens these states (else the float32 projection decides)."""
        return self.screens and len(h) <= self.max_rows and h.dtype == torch.float32

    def __call__(self, h: torch.Tensor):
        return self.screened(h) if self.use_screen(h) else self.full(h)

    def screened_logits(self, h: torch.Tensor):
        """The bfloat16 logits z~ [m, blocks, BLOCK] (float32 tensor, sorted order; the last
        block's padding -inf) and each row's A ||h|| (float64[m])."""
        m = len(h)
        z = F.linear(h.detach().to(torch.bfloat16), self.weight16).float()  # [m, blocks * BLOCK], sorted
        if self.blocks * BLOCK > self.vocab:
            z[:, self.vocab:] = float("-inf")
        hn = h.detach().numpy()
        return z.view(m, self.blocks, BLOCK), self.a * np.sqrt(np.einsum("mh,mh->m", hn, hn, dtype=np.float64))

    def exact_logits(self, h: torch.Tensor, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """float32 logits of ``tokens[j]`` at state ``h[rows[j]]``: float32[k]."""
        return np.einsum("kh,kh->k", self.weight[tokens], h.detach().numpy()[rows])


class ArgmaxProjection(BF16Screen):
    """``argmax(h @ W.T)`` for an output projection ``W`` [V, H]: ``__call__(h [m, H]) ->
    int64[m]`` (numpy), through the bfloat16 screen (see the module doc) where it applies and is
    faster (``calibrate``); else, or for a module the screen does not apply to (not an
    ``nn.Linear``, a bias, not float32, not on a CPU, no float32 accumulation), through the
    float32 projection."""

    def full(self, h: torch.Tensor) -> np.ndarray:
        """The float32 projection's argmax: int64[m]."""
        return self.unembed(h).argmax(dim=-1).cpu().numpy()

    def _floor(self, y: np.ndarray) -> np.ndarray:
        """The least z~ with z~ + B|z~| >= y (x + B|x| is increasing)."""
        return np.where(y >= 0, y / (1 + self.b), y / (1 - self.b))

    def candidates(self, z: torch.Tensor, best: np.ndarray, a: np.ndarray, y: np.ndarray):
        """The tokens whose float32 logit can be >= y (float64[m]) per row, from the screened
        logits z [m, blocks, BLOCK] (``screened_logits``), their blocks' maxima best [m, blocks]
        and a = A ||h|| [m]: (rows int64[c], sorted positions int64[c]), by row (token ids:
        ``order[positions]``). A block whose maximum is under the threshold of its largest-norm
        token holds none; the others' tokens are tested one by one."""
        r, blk = np.nonzero(best >= self._floor(y[:, None] - a[:, None] * self.block_norm[None]))
        ci, j = np.nonzero(z.numpy()[r, blk] >= self._floor(y[r, None] - a[r, None] * self.norms[blk]))
        return r[ci], blk[ci] * BLOCK + j

    def screened(self, h: torch.Tensor) -> np.ndarray:
        """The argmax through the bfloat16 screen (any number of rows): int64[m]."""
        m = len(h)
        z, a = self.screened_logits(h)
        best = z.amax(dim=2).numpy()  # [m, blocks]
        top_block = best.argmax(axis=1)
        top = best[np.arange(m), top_block].astype(np.float64)
        if not np.isfinite(top).all():  # NaN or infinite logits: the float32 projection decides
            return self.full(h)
        y = top - self.b * np.abs(top) - a * self.block_norm[top_block]  # the top's float32 logit is >= y
        rows, pos = self.candidates(z, best, a, y)
        tok = self.order[pos]
        if len(tok) == m:  # one candidate per row (each row keeps at least its top): the argmax
            return tok.astype(np.int64)
        if len(tok) > MAX_CANDIDATES * m:  # a flat distribution: the float32 projection is cheaper
            return self.full(h)
        # the candidates' float32 logits: per row the largest, then the lowest token id
        return SparseLogits(rows, tok, self.exact_logits(h, rows, tok), (m, self.vocab)).argmax()


def median_seconds(f, x: torch.Tensor, repeats: int = 5) -> float:
    """The median wall-clock seconds of ``f(x)`` over ``repeats`` calls, after one untimed call."""
    f(x)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(x)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def cached_projection(unembed, kind, make):
    """One screened projection (or, for ``kind`` "tables", the ``ScreenTables`` they share) per
    output projection module and ``kind``, kept on the module (``memo.kept``) and made again when its
    weights change: ``make(unembed)`` builds it. A function (a model's own unembed) is never
    screened and gets a new one each call."""
    if not isinstance(unembed, torch.nn.Module):
        return make(unembed)
    return kept(unembed, "projections", kind, weights_key(unembed), lambda: make(unembed))


def argmax_projection(unembed) -> ArgmaxProjection:
    """The ``ArgmaxProjection`` of an output projection module (``cached_projection``)."""
    return cached_projection(unembed, "argmax", ArgmaxProjection)

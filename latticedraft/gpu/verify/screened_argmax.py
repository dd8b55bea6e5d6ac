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
import weakref

import numpy as np
import torch
import torch.nn.functional as F

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


class ArgmaxProjection:
    """``argmax(h @ W.T)`` for an output projection ``W`` [V, H]: ``__call__(h [m, H]) ->
    int64[m]`` (numpy), through the bfloat16 screen (see the module doc) where it applies and is
    ``faster``; else, or for a module the screen does not apply to (not an ``nn.Linear``, a bias,
    not float32, not on a CPU, no float32 accumulation), through the float32 projection."""

    def __init__(self, unembed):
        self.unembed = unembed
        w = getattr(unembed, "weight", None)
        self.screens = (isinstance(unembed, torch.nn.Linear) and unembed.bias is None
                        and w.dtype == torch.float32 and screening_ok(w.device))
        self.faster = True  # whether the screen beats the float32 projection here (``calibrate``)
        self._calibrated = None
        if self.screens:
            w = w.detach()
            V, H = w.shape
            gamma = H * 2.0 ** -24
            self.a, self.b = MARGIN * (2 * U + U * U + 2 * gamma), MARGIN * U / (1 - U)
            norms = w.norm(dim=-1).double()
            self.order = torch.argsort(norms, descending=True).numpy()  # sorted position -> token id
            self.vocab, self.blocks = V, -(-V // BLOCK)
            self.weight = w.numpy()  # float32, token order
            self.weight16 = w.new_zeros(self.blocks * BLOCK, H, dtype=torch.bfloat16)  # sorted order
            self.weight16[:V] = w[torch.from_numpy(self.order)]
            sorted_norms = np.zeros(self.blocks * BLOCK)
            sorted_norms[:V] = norms.numpy()[self.order]
            self.norms = sorted_norms.reshape(self.blocks, BLOCK)  # ||w|| per sorted position
            self.block_norm = self.norms[:, 0]  # each block's largest (sorted descending)

    def calibrate(self, states: torch.Tensor, rows=(2, 4, 8, 16, 32, 64), repeats: int = 5) -> None:
        """Sets ``faster``: whether the screen, summed over ``rows``, takes less time than the
        float32 projection on this machine (no bfloat16 dot products: it does not), timed back to
        back once per thread count on ``states`` [k, H] (a model's final states: how many
        candidates the screen keeps depends on how peaked they are), repeated to each row count.
        Where it is faster, a single row is screened too: timed back to back one row costs about
        the same either way (~75 us float32, ~100 us screened on the bundled model), but in a
        decode the projection's weights come back from memory every step, and the screen reads
        half the bytes (one row per step, screened against float32 in one process: the greedy loop
        1.43x -> 1.56x HF greedy on held-out prompts, 1.41x -> 1.62x on held-back code)."""
        threads = torch.get_num_threads()
        if not self.screens or self._calibrated == threads:
            return
        xs = [states[torch.arange(r) % len(states)] for r in rows]
        screened = sum(median_seconds(self.screened, x, repeats) for x in xs)
        self.faster = screened < sum(median_seconds(self.full, x, repeats) for x in xs)
        self._calibrated = threads

    def full(self, h: torch.Tensor) -> np.ndarray:
        """The float32 projection's argmax: int64[m]."""
        return self.unembed(h).argmax(dim=-1).cpu().numpy()

    def __call__(self, h: torch.Tensor) -> np.ndarray:
        if not (self.screens and self.faster) or h.dtype != torch.float32:
            return self.full(h)
        return self.screened(h)

    def _floor(self, y: np.ndarray) -> np.ndarray:
        """The least z~ with z~ + B|z~| >= y (x + B|x| is increasing)."""
        return np.where(y >= 0, y / (1 + self.b), y / (1 - self.b))

    def screened(self, h: torch.Tensor) -> np.ndarray:
        """The argmax through the bfloat16 screen (any number of rows): int64[m]."""
        m = len(h)
        z = F.linear(h.detach().to(torch.bfloat16), self.weight16).float()  # [m, blocks * BLOCK], sorted
        if self.blocks * BLOCK > self.vocab:
            z[:, self.vocab:] = float("-inf")  # the last block's padding
        z = z.view(m, self.blocks, BLOCK)
        best = z.amax(dim=2).numpy()  # [m, blocks]
        z = z.numpy()
        top_block = best.argmax(axis=1)
        top = best[np.arange(m), top_block].astype(np.float64)
        if not np.isfinite(top).all():  # NaN or infinite logits: the float32 projection decides
            return self.full(h)
        hn = h.detach().numpy()
        a = self.a * np.sqrt(np.einsum("mh,mh->m", hn, hn, dtype=np.float64))  # [m]
        y = top - self.b * np.abs(top) - a * self.block_norm[top_block]  # the top's float32 logit is >= y
        r, blk = np.nonzero(best >= self._floor(y[:, None] - a[:, None] * self.block_norm[None]))
        ci, j = np.nonzero(z[r, blk] >= self._floor(y[r, None] - a[r, None] * self.norms[blk]))
        rows, tok = r[ci], self.order[blk[ci] * BLOCK + j]
        if len(tok) == m:  # one candidate per row (each row keeps at least its top): the argmax
            return tok.astype(np.int64)
        if len(tok) > MAX_CANDIDATES * m:  # a flat distribution: the float32 projection is cheaper
            return self.full(h)
        exact = np.einsum("kh,kh->k", self.weight[tok], hn[rows])  # the candidates' float32 logits
        first = np.lexsort((tok, -exact, rows))  # per row: the largest logit, then the lowest token id
        keep = np.ones(len(first), dtype=bool)
        keep[1:] = rows[first][1:] != rows[first][:-1]
        return tok[first][keep].astype(np.int64)


def median_seconds(f, x: torch.Tensor, repeats: int = 5) -> float:
    """The median wall-clock seconds of ``f(x)`` over ``repeats`` calls, after one untimed call."""
    f(x)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(x)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


_PROJECTIONS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def argmax_projection(unembed) -> ArgmaxProjection:
    """One ``ArgmaxProjection`` per output projection module (its bfloat16 copy made once, again
    when the weights change)."""
    if not isinstance(unembed, torch.nn.Module):  # a function (a model's own unembed): never screened
        return ArgmaxProjection(unembed)
    w = getattr(unembed, "weight", None)
    key = None if w is None else (w.data_ptr(), w._version)
    hit = _PROJECTIONS.get(unembed)
    if hit is None or hit[0] != key:
        hit = (key, ArgmaxProjection(unembed))
        _PROJECTIONS[unembed] = hit
    return hit[1]

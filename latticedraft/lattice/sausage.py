"""The sausage lattice (confusion network) of ``h`` multi-token heads, and ``Drafts``.

A ``Sausage`` has ``h`` slots; slot ``i`` holds up to ``k`` candidate tokens for position
``t + 1 + i`` with their natural-log probabilities under head ``i`` (log-softmax over the
full vocabulary, then top-k). Widths may be ragged after pruning: the arrays stay
rectangular ``[h, k]`` and unused cells hold token ``-1`` and logp ``-inf``. Within a slot
the candidates are distinct and sorted best first; every slot keeps at least one arc.

Example::

    >>> s = Sausage.from_logits(np.log([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]]), k=2)
    >>> s.tokens.tolist(), s.top1().tolist(), s.num_paths()
    ([[0, 1], [2, 1]], [0, 2], 4)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from latticedraft.atomic import atomic_file
from latticedraft.errors import InputError

PAD_TOKEN = -1


def _as_numpy(x) -> np.ndarray:
    """numpy array from numpy, lists, or torch tensors (duck-typed: no torch import)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu()
        if str(getattr(x, "dtype", "")) == "torch.bfloat16":
            x = x.float()
        x = x.numpy()
    return np.asarray(x)


def _check_finite(logits: np.ndarray, what: str) -> None:
    bad = ~np.isfinite(logits)
    if bad.any():
        idx = np.argwhere(bad)[0]
        where = ", ".join(str(int(i)) for i in idx[:-1])
        kind = "NaN" if np.isnan(logits[tuple(idx)]) else "inf"
        raise InputError(
            f"{what} has {kind} at slot ({where}) token {int(idx[-1])}: the heads produced non-finite "
            "logits; check the model's dtype (fp16 overflow) or the head weights"
        )


def _topk_sorted(logp: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k along the last axis, best first; ties broken by lower token id. -> (int64, float32)."""
    V = logp.shape[-1]
    if k < V:
        part = np.argpartition(-logp, k - 1, axis=-1)[..., :k]
    else:
        part = np.broadcast_to(np.arange(V), logp.shape).copy()
    vals = np.take_along_axis(logp, part, axis=-1)
    # sort by (-value, token id) so the order is deterministic
    order = np.lexsort((part, -vals), axis=-1)
    tok = np.take_along_axis(part, order, axis=-1).astype(np.int64)
    return tok, np.take_along_axis(vals, order, axis=-1).astype(np.float32)


def _where(idx) -> str:
    """'slot i of the sausage' (one lattice) or 'slot i of lattice b' (a batch)."""
    idx = [int(i) for i in idx]
    return f"slot {idx[-1]} of the sausage" if len(idx) == 1 else f"slot {idx[-1]} of lattice {idx[0]}"


def _validated(tokens, logp, ndim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(tokens int64, logp float32, widths int64[..., h])`` of a sausage (``ndim`` 2: ``[h, k]``)
    or a batch of them (``ndim`` 3: ``[B, h, k]``), checked with whole-array operations."""
    t = np.ascontiguousarray(_as_numpy(tokens), dtype=np.int64)
    lp = np.ascontiguousarray(_as_numpy(logp), dtype=np.float32)
    if t.ndim != ndim or lp.shape != t.shape:
        want = "[h,k]" if ndim == 2 else "[B,h,k]"
        raise InputError(f"a sausage{'' if ndim == 2 else ' batch'} needs tokens{want} and logp{want} of the same "
                         f"shape, got {t.shape} and {lp.shape}")
    if t.shape[-2] == 0:
        raise InputError("a sausage needs at least one slot (h = 0 given); ask the heads for h >= 1")
    if t.shape[-1] == 0:
        raise InputError("a sausage needs at least one candidate per slot (k = 0 given); use k >= 1")
    live = t != PAD_TOKEN
    if (t < PAD_TOKEN).any():
        raise InputError(f"token ids must be >= 0 (or {PAD_TOKEN} for padding), got {int(t.min())}")
    if not (lp < np.inf).all():  # NaN and +inf both fail
        raise InputError("sausage logp holds NaN or +inf; logp must be log-probabilities <= 0")
    if not live[..., 0].all():
        raise InputError(f"{_where(np.argwhere(~live[..., 0])[0])} is empty; every slot must keep at least one arc")
    k = t.shape[-1]
    if k > 1:
        # live arcs first in each slot (padding at the end), padding has logp -inf
        if (live[..., 1:] > live[..., :-1]).any():
            raise InputError("padding (token -1) must follow the live arcs of a slot, not precede them")
        if (~live & (lp > -np.inf)).any():
            raise InputError("padding cells (token -1) must have logp -inf")
        srt = np.sort(np.where(live, t, -2 - np.arange(k)), axis=-1)
        dup = (srt[..., 1:] == srt[..., :-1]).any(axis=-1)
        if dup.any():
            i = tuple(np.argwhere(dup)[0])
            raise InputError(f"{_where(i)} lists a token twice: {t[i][live[i]].tolist()}")
    return t, lp, live.sum(axis=-1).astype(np.int64)


@dataclass
class Sausage:
    """A sausage lattice: ``tokens int64[h,k]`` and ``logp float32[h,k]`` (natural log).

    Padding cells (ragged widths) hold ``PAD_TOKEN`` (-1) and ``-inf``. Use ``widths`` for the
    number of live arcs per slot.
    """

    tokens: np.ndarray
    logp: np.ndarray

    def __post_init__(self) -> None:
        self.tokens, self.logp, widths = _validated(self.tokens, self.logp, 2)
        self._widths = (self.tokens, widths)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_logits(cls, logits, k: int) -> "Sausage":
        """Top-``k`` sausage from head logits ``[h, V]`` (numpy or torch, any float dtype).

        The log-softmax is taken over the full vocabulary first, so ``logp`` are true head
        log-probabilities. Raises ``InputError`` for NaN/inf (naming the slot), ``h = 0`` or
        ``k`` outside ``1..V``.
        """
        x = _as_numpy(logits)
        if x.ndim != 2:
            raise InputError(f"from_logits expects logits of shape [h, V], got {x.shape}; use from_logits_batch for [b, h, V]")
        tok, lp = _sausage_arrays(x, k, "logits")
        return cls(tok, lp)

    @classmethod
    def from_logits_batch(cls, logits, k: int) -> list["Sausage"]:
        """One sausage per batch row from logits ``[b, h, V]``; one vectorised top-k."""
        x = _as_numpy(logits)
        if x.ndim != 3:
            raise InputError(f"from_logits_batch expects logits of shape [b, h, V], got {x.shape}")
        tok, lp = _sausage_arrays(x, k, "logits")
        return [cls(tok[b], lp[b]) for b in range(x.shape[0])]

    @classmethod
    def from_ragged(cls, tokens: list, logp: list) -> "Sausage":
        """From per-slot lists of tokens and logps (any widths >= 1); sorts each slot best first."""
        if len(tokens) == 0:
            raise InputError("a sausage needs at least one slot (h = 0 given)")
        if len(tokens) != len(logp):
            raise InputError(f"{len(tokens)} token slots but {len(logp)} logp slots")
        k = max(len(r) for r in tokens)
        T = np.full((len(tokens), max(k, 1)), PAD_TOKEN, dtype=np.int64)
        L = np.full(T.shape, -np.inf, dtype=np.float32)
        for i, (tr, lr) in enumerate(zip(tokens, logp)):
            tr, lr = np.asarray(tr, dtype=np.int64), np.asarray(lr, dtype=np.float32)
            if tr.shape != lr.shape:
                raise InputError(f"slot {i}: {tr.shape[0]} tokens but {lr.shape[0]} logps")
            order = np.lexsort((tr, -lr))
            T[i, : len(tr)] = tr[order]
            L[i, : len(tr)] = lr[order]
        return cls(T, L)

    # -- queries ------------------------------------------------------------------------------
    @property
    def h(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def k(self) -> int:
        """The padded width (the widest slot)."""
        return int(self.tokens.shape[1])

    @property
    def widths(self) -> np.ndarray:
        """int64[h]: live arcs per slot (computed at validation; recomputed if tokens were replaced)."""
        cached = getattr(self, "_widths", None)
        if cached is not None and cached[0] is self.tokens:
            return cached[1]
        return (self.tokens != PAD_TOKEN).sum(axis=1).astype(np.int64)

    def top1(self) -> np.ndarray:
        """int64[h]: the best token of every slot (the vanilla BPD draft)."""
        return self.tokens[:, 0].copy()

    def num_paths(self) -> int:
        """Number of distinct paths, the product of the widths (a Python int: no overflow)."""
        n = 1
        for w in self.widths.tolist():
            n *= int(w)
        return n

    def truncate(self, d: int) -> "Sausage":
        """The first ``d`` slots (``1 <= d``; ``d > h`` keeps all)."""
        if d < 1:
            raise InputError(f"cannot truncate a sausage to depth {d}; depth must be >= 1")
        return Sausage(self.tokens[:d].copy(), self.logp[:d].copy())

    def compact(self) -> "Sausage":
        """Drop the padding columns no slot uses."""
        kmax = int(self.widths.max())
        return Sausage(self.tokens[:, :kmax].copy(), self.logp[:, :kmax].copy())

    def path_logp(self, cand: np.ndarray) -> float:
        """Head log-probability (float64) of the path choosing candidate ``cand[i]`` in slot i."""
        cand = np.asarray(cand)
        return float(self.logp[np.arange(len(cand)), cand].astype(np.float64).sum())

    # -- files --------------------------------------------------------------------------------
    def save(self, path: str | Path, **extra) -> Path:
        """Write ``tokens``, ``logp`` (and any extra arrays, e.g. ``reference``) to ``.npz``, atomically."""
        path = Path(path)
        if path.suffix != ".npz":
            raise InputError(f"{path}: a sausage is saved as .npz; give a name ending in .npz")
        arrays = {"tokens": self.tokens, "logp": self.logp}
        arrays.update({k: np.asarray(v) for k, v in extra.items()})
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path, suffix=".npz") as tmp:
            np.savez(tmp, **arrays)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Sausage":
        """Read a sausage written by ``save`` (arrays ``tokens`` and ``logp``)."""
        s, _ = load_npz(path)
        return s

    def to_fst_text(self, weight_scale: float = 1.0) -> str:
        """OpenFST text form of the acceptor: states 0..h, arcs ``i i+1 label label cost``.

        Labels are ``token_id + 1`` (0 is epsilon); costs are ``-logp * weight_scale``
        (tropical). ``fstcompile --acceptor`` reads it (the label is written once).
        """
        lines = []
        for i in range(self.h):
            for t, lp in zip(self.tokens[i], self.logp[i]):
                if t == PAD_TOKEN:
                    break
                lines.append(f"{i}\t{i + 1}\t{int(t) + 1}\t{repr(float(-lp * weight_scale) + 0.0)}")
        lines.append(f"{self.h}")
        return "\n".join(lines) + "\n"


@dataclass
class SausageBatch:
    """``B`` sausages of one shape (one per prompt of a batch): ``tokens int64[B,h,k]``,
    ``logp float32[B,h,k]``, each row following ``Sausage``'s conventions (padding -1 / -inf
    after a slot's live arcs, so widths may be ragged). Validated with whole-array operations
    (no per-lattice Python work); ``rescore_batch`` takes it as is. ``widths``: int64[B, h].
    """

    tokens: np.ndarray
    logp: np.ndarray
    widths: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.tokens, self.logp, self.widths = _validated(self.tokens, self.logp, 3)

    @classmethod
    def from_logits(cls, logits, k: int) -> "SausageBatch":
        """Top-``k`` sausages from head logits ``[B, h, V]`` (numpy or torch): one vectorised top-k."""
        x = _as_numpy(logits)
        if x.ndim != 3:
            raise InputError(f"SausageBatch.from_logits expects logits of shape [B, h, V], got {x.shape}")
        return cls(*_sausage_arrays(x, k, "logits"))

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def __getitem__(self, b: int) -> Sausage:
        return Sausage(self.tokens[b], self.logp[b])

    def __iter__(self):
        return (self[b] for b in range(len(self)))


def load_npz(path: str | Path) -> tuple[Sausage, dict]:
    """``(Sausage, extra arrays)`` from an ``.npz`` written by ``Sausage.save``."""
    from latticedraft.npzfile import read_npz
    from latticedraft.paths import require_file

    path = require_file(path, "lattice file", "give a .npz written by Sausage.save(path)")
    data = read_npz(path, "a lattice written by Sausage.save", "write one with Sausage.save(path)")
    if "tokens" not in data or "logp" not in data:
        raise InputError(f"{path} lacks the arrays 'tokens' and 'logp' (has {sorted(data)}); write it with Sausage.save")
    tok, lp = data.pop("tokens"), data.pop("logp")
    if tok.dtype.kind not in "iu":
        raise InputError(f"{path}: 'tokens' holds {tok.dtype} values, not integer token ids; "
                         "write it with Sausage.save")
    if lp.dtype.kind != "f":
        raise InputError(f"{path}: 'logp' holds {lp.dtype} values, not floats; write it with Sausage.save")
    if (lp > 0).any():
        raise InputError(f"{path}: 'logp' holds positive values (up to {float(lp.max()):g}); log-probabilities are <= 0")
    try:
        return Sausage(tok, lp), data
    except InputError as e:
        raise InputError(f"{path}: {e}") from e


def _sausage_arrays(x: np.ndarray, k: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    if x.shape[-2] == 0:
        raise InputError(f"{what} have h = 0 slots; a sausage needs at least one head")
    V = x.shape[-1]
    if not isinstance(k, (int, np.integer)) or k < 1 or k > V:
        raise InputError(f"k = {k} is outside 1..{V} (the vocabulary size of the {what}); choose k <= {V}")
    _check_finite(x, what)
    x = x.astype(np.float32, copy=False) if x.dtype != np.float64 else x
    tok, top = _topk_sorted(x, int(k))
    # log-softmax only where needed: top-k logits minus the row's log-sum-exp (float64 sum)
    m = x.max(axis=-1, keepdims=True)
    lse = m.astype(np.float64) + np.log(np.exp(x - m).sum(axis=-1, keepdims=True, dtype=np.float64))
    return tok, (top.astype(np.float64) - lse).astype(np.float32)


@dataclass
class Drafts:
    """``p`` distinct drafts, best first: ``tokens int64[p, d]``, ``scores float32[p]``.

    ``scores`` are ``head_logp + alpha * lm_logp`` (natural log). ``requested`` is the p that
    was asked for; ``len(scores) < requested`` when the lattice has fewer paths. ``probs``
    float64[p, d]: each token's probability under the model that ranked them, where the drafter
    computed it (``lattice.interpolated.token_probs``; None: the heads' own).
    """

    tokens: np.ndarray
    scores: np.ndarray
    requested: int = 0
    probs: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def truncated(self) -> bool:
        """True when fewer drafts than requested exist (the lattice has fewer paths)."""
        return len(self) < self.requested

"""Lossless speculative sampling over a draft tree (Leviathan et al. 2023; SpecInfer's
multi-step speculative sampling, Miao et al. 2024), one-hot drafts as the special case.

At a walked node the target's distribution is p (float64[V]); the node's *attempts* are the
draft tokens tried there, in order, each with the distribution q it was drawn from (None:
one-hot, a deterministic draft such as a lookahead n-gram or a rescored lattice path). Starting
from the residual r = p, attempt (x, q) is accepted with probability min(1, r(x) / q(x)); on
rejection r <- norm(max(0, r - q)) and the next attempt is tried; when all are rejected the
token is drawn from r. Each attempt is one step of ordinary speculative sampling with target r,
so the emitted token is distributed exactly as p whenever every attempt x_i was drawn from its
q_i independently of the attempts before it: i.i.d. samples of one q (p sampled paths of a
drafter) or distinct deterministic tokens (q = one-hot(x): accept with r(x), residual = r with
x removed, Algorithm 4 of Fu et al. 2024). A one-hot attempt whose token has no residual mass
is skipped without a draw (a repeat of a rejected token).

Where the walk goes: an accepted token that is a child of the node moves the walk there, and
that child's attempts are the next tokens of the drafts through it (still i.i.d. from q(. |
prefix) for sampled paths: their continuations never influenced the decision above). The
bonus token after the last accepted node is the residual draw, or a draw from p after a fully
accepted path. So every emitted token has the target's sampling distribution.

p is the target's distribution after the logits processing ``generate(do_sample=True)``
applies (transformers' own processors, in its order: repetition penalty, temperature, top-k,
top-p; top_k = 0, top_p = 1 and repetition_penalty = 1 switch those off), in float64.

Randomness comes from a ``draws`` object with ``bernoulli(row, prob) -> bool`` and
``categorical(row, probs) -> int``; ``SeededDraws`` gives row r of a run with seed s its own
``numpy.random.default_rng([s, r])``, so outputs repeat and do not depend on the batch. Tests
pass a source that enumerates every outcome to get exact output distributions.

    >>> p = np.array([0.5, 0.3, 0.2])
    >>> accept(p, [(1, None), (0, None)], row=0, draws=SeededDraws(0))    # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from latticedraft.errors import InputError
from latticedraft.gpu.verify.sparse_logits import SparseLogits


@dataclass(frozen=True)
class SamplingOptions:
    """generate's sampling settings and defaults: temperature > 0; top_k >= 0 (0 = off);
    0 < top_p <= 1 (1 = off); repetition_penalty > 0 (1 = off); seed: row r draws from
    ``default_rng([seed, r])``."""

    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    seed: int = 0
    repetition_penalty: float = 1.0

    def __post_init__(self):
        if not (np.isfinite(self.temperature) and self.temperature > 0):
            raise InputError(f"--temperature {self.temperature} must be a finite number > 0")
        if self.top_k < 0:
            raise InputError(f"--top-k {self.top_k} must be >= 0 (0 = no top-k filter)")
        if not 0.0 < self.top_p <= 1.0:
            raise InputError(f"--top-p {self.top_p} must be in (0, 1] (1 = no nucleus filter)")
        if not (np.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise InputError(f"--repetition-penalty {self.repetition_penalty} must be a finite number > 0 (1 = off)")
        check_seed(self.seed)

    def processors(self):
        """transformers' processors and warpers that ``generate(do_sample=True)`` builds for
        these settings, in its order."""
        from transformers import (LogitsProcessorList, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                                  TopKLogitsWarper, TopPLogitsWarper)

        procs = LogitsProcessorList()
        if self.repetition_penalty != 1.0:
            procs.append(RepetitionPenaltyLogitsProcessor(self.repetition_penalty))
        if self.temperature != 1.0:
            procs.append(TemperatureLogitsWarper(self.temperature))
        if self.top_k != 0:
            procs.append(TopKLogitsWarper(top_k=self.top_k, min_tokens_to_keep=1))
        if self.top_p < 1.0:
            procs.append(TopPLogitsWarper(top_p=self.top_p, min_tokens_to_keep=1))
        return procs

    def probs(self, logits, contexts=None) -> np.ndarray:
        """Distributions from raw logits [m, V] (a tensor, or ``SparseLogits``: listed entries,
        the rest -inf) -> float64 [m, V] (rows sum to 1). contexts: m token-id sequences, the text
        each row continues (prompt + output so far + draft prefix); needed only with a repetition
        penalty.

        transformers' processors, in generate's order; with a top-k, top-k and top-p run on the
        k candidates (``_top_k_p``) instead of sorting the whole vocabulary, which keeps the same
        tokens (rows with a tie at the k-th score go through transformers' own warpers).
        ``SparseLogits`` are read entry by entry (``_sparse_probs``) where that keeps the same
        tokens, else as their dense tensor."""
        if isinstance(logits, SparseLogits):
            p = self._sparse_probs(logits)
            if p is not None:
                return p
            logits = logits.dense()
        x = self._scaled(logits, contexts)
        fast = self._top_k_p(x) if 0 < self.top_k < x.shape[-1] else None
        if fast is None:
            x = self._warp(x)
        else:
            vals, idx, keep = fast
            x = torch.full_like(x, -float("inf")).scatter_(1, idx, vals.masked_fill(~keep, -float("inf")))
        return torch.softmax(x, dim=-1).cpu().numpy()

    def top_k_reads(self) -> int | None:
        """k where p reads only each row's k largest logits (ties included): a top-k is set
        (0 < k) and no repetition penalty (which runs first and can lower a token of the k
        largest below one outside them); else None."""
        return self.top_k if self.top_k > 0 and self.repetition_penalty == 1.0 else None

    def _sparse_probs(self, logits: "SparseLogits") -> np.ndarray | None:
        """``probs`` of ``SparseLogits`` from their entries alone: float64 [m, V]; None where the
        dense path must decide (a repetition penalty; a top-p over a tie, where transformers'
        sort order picks which tied token goes). Per row: temperature, then top-k keeps every
        entry >= the k-th largest (all of them with fewer than k: the unlisted -inf ones have
        probability 0 anyway), then top-p drops, in ascending order, those whose cumulative
        probability is <= 1 - top_p (never the largest), then the softmax."""
        if self.repetition_penalty != 1.0:
            return None
        m, V = logits.shape
        x = logits.values.astype(np.float64)
        if self.temperature != 1.0:
            x = x / self.temperature
        p = np.zeros((m, V))
        e = logits.bounds()
        for i in range(m):
            v, tok = x[e[i]:e[i + 1]], logits.tokens[e[i]:e[i + 1]]
            if 0 < self.top_k < len(v):
                keep = v >= np.partition(v, len(v) - self.top_k)[len(v) - self.top_k]
                v, tok = v[keep], tok[keep]
            if self.top_p < 1.0:
                up = np.argsort(v, kind="stable")
                v, tok = v[up], tok[up]
                if len(v) > 1 and (v[1:] == v[:-1]).any():
                    return None
                w = np.exp(v - v[-1])
                drop = np.cumsum(w / w.sum()) <= 1 - self.top_p
                drop[-1] = False
                v, tok = v[~drop], tok[~drop]
            w = np.exp(v - v.max())
            p[i, tok] = w / w.sum()
        return p

    def kept(self, logits: torch.Tensor, contexts=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``probs`` as its nonzero entries: rows int64[n], tokens int64[n], probs float64[n]
        (each row's sum 1), without a [m, V] softmax where a top-k applies and no row ties at
        its k-th score (then the softmax runs over the k candidates: equal to ``probs`` up to
        rounding in the normaliser)."""
        x = self._scaled(logits, contexts)
        fast = self._top_k_p(x) if 0 < self.top_k < x.shape[-1] else None
        if fast is None:
            p = torch.softmax(self._warp(x), dim=-1).cpu().numpy()
            rows, toks = np.nonzero(p)
            return rows, toks, p[rows, toks]
        vals, idx, keep = fast
        p = torch.softmax(vals.masked_fill(~keep, -float("inf")), dim=-1).cpu().numpy()
        keep = keep.cpu().numpy()
        rows = np.nonzero(keep)[0]
        return rows, idx.cpu().numpy()[keep], p[keep]

    def _scaled(self, logits: torch.Tensor, contexts) -> torch.Tensor:
        """float64 logits [m, V] after the repetition penalty and the temperature (a copy)."""
        x = logits.detach().to(torch.float64, copy=True)  # (the repetition penalty writes in place)
        if self.repetition_penalty != 1.0:
            if contexts is None or len(contexts) != x.shape[0]:
                raise InputError("a repetition penalty needs the context of every row")
            penalty = self._procs()[0]
            x = torch.cat([penalty(torch.as_tensor(np.asarray(c, dtype=np.int64)[None], device=x.device), x[i:i + 1])
                           for i, c in enumerate(contexts)])
        if self.temperature != 1.0:
            x = x / self.temperature
        return x

    def _warp(self, x: torch.Tensor) -> torch.Tensor:
        """transformers' top-k and top-p warpers on scaled scores x [m, V]."""
        ids = torch.zeros(x.shape[0], 0, dtype=torch.long, device=x.device)
        for proc in self._procs()[int(self.repetition_penalty != 1.0) + int(self.temperature != 1.0):]:
            x = proc(ids, x)
        return x

    def _top_k_p(self, x: torch.Tensor):
        """transformers' top-k then top-p warpers on scaled scores x [m, V], computed on the k
        best: (vals [m, k] descending, their token ids [m, k], keep bool [m, k]). top-k keeps
        every score >= the k-th; top-p, on the ascending order of the kept ones (the others
        have probability 0 and are removed already), drops those whose cumulative probability
        is <= 1 - top_p, always keeping the best. None where a row ties at its k-th score with
        a token outside the k (transformers' warpers decide there)."""
        vals, idx = torch.topk(x, self.top_k, dim=-1)  # descending
        if int((x >= vals[:, -1:]).sum(dim=-1).max()) > self.top_k:
            return None
        keep = torch.ones_like(vals, dtype=torch.bool)
        if self.top_p < 1.0:
            drop = torch.softmax(vals.flip(-1), dim=-1).cumsum(dim=-1) <= (1 - self.top_p)
            drop[:, -1] = False
            keep = ~drop.flip(-1)
        return vals, idx, keep

    def _procs(self):
        """``processors()``, built once per options object."""
        if "_built" not in self.__dict__:
            object.__setattr__(self, "_built", self.processors())
        return self.__dict__["_built"]


def check_seed(seed) -> None:
    """A seed numpy's generators take: an integer in [0, 2**63)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2**63:
        raise InputError(f"--seed {seed} must be an integer in [0, 2**63); e.g. --seed 0")


class SeededDraws:
    """Per-row generators ``default_rng([seed, row])``, created on first use."""

    def __init__(self, seed: int):
        self.seed = int(seed)
        self.rngs: dict[int, np.random.Generator] = {}

    def _rng(self, row: int) -> np.random.Generator:
        if row not in self.rngs:
            self.rngs[row] = np.random.default_rng([self.seed, int(row)])
        return self.rngs[row]

    def bernoulli(self, row: int, prob: float) -> bool:
        return bool(self._rng(row).random() < prob)

    def categorical(self, row: int, probs: np.ndarray) -> int:
        # over the support only (a top-k keeps ~50 of V): the same partial sums as over the whole
        # row (adding 0.0 is exact), so the same token for the same uniform draw
        support = np.flatnonzero(probs > 0)
        c = np.cumsum(probs[support])
        i = int(np.searchsorted(c, self._rng(row).random() * c[-1], side="right"))
        return int(support[min(i, len(support) - 1)])


def accept(p: np.ndarray, attempts, row: int, draws) -> int:
    """Multi-step speculative sampling at one node: p float64[V] the target's distribution;
    ``attempts`` the (token, q float64[V] or None = one-hot) tried there, in order. Returns the
    emitted token: an accepted attempt or a draw from the last residual."""
    residual = np.array(p, dtype=np.float64)
    for x, q in attempts:
        x = int(x)
        mass = residual.sum()
        if q is None:
            if residual[x] <= 0:  # a one-hot repeat of a rejected token (or of no mass): nothing to try
                continue
            if draws.bernoulli(row, residual[x] / mass):
                return x
            residual[x] = 0.0
            continue
        r = residual / mass
        if draws.bernoulli(row, min(1.0, r[x] / q[x])):
            return x
        residual = np.maximum(r - q, 0.0)
        if residual.sum() <= 0:  # r == q: rejection had probability 0
            return x
    if residual.sum() <= 0:  # every token with mass was tried and (measure-zero) rejected
        return int(attempts[-1][0])
    return draws.categorical(row, residual / residual.sum())


def attempts_at(drafts: np.ndarray, qs, prefix) -> list:
    """The attempts at the node ``prefix`` (draft tokens from the root, int[t]) of one row's
    drafts int64[p, d] (negative = end): the t-th token of every draft that starts with
    ``prefix``, in draft order, with its q (``qs`` float64[p, d, V], or None: one-hot)."""
    t = len(prefix)
    drafts = np.atleast_2d(np.asarray(drafts, dtype=np.int64))
    if drafts.shape[1] <= t:
        return []
    match = (drafts[:, :t] == np.asarray(prefix, dtype=np.int64)[None]).all(axis=1) & (drafts[:, t] >= 0)
    return [(int(drafts[j, t]), None if qs is None else qs[j, t]) for j in np.flatnonzero(match)]


class SpeculativeRule:
    """Lossless speculative sampling as an acceptance rule (``accept/rule.py``): ``for_step``
    binds one verify call's drafts into the verifier's ``choose`` (see ``gpu/verify/verifier.py``).

    options: ``SamplingOptions`` (what turns the target's logits into p); draws: the random
    source (default ``SeededDraws(options.seed)``)."""

    lossless = True

    def __init__(self, options: SamplingOptions, draws=None):
        self.options = options
        self.draws = draws if draws is not None else SeededDraws(options.seed)

    def for_step(self, rows, drafts=None, qs=None, histories=None):
        """``choose`` for one verify call. rows[i]: the run-wide row id of batch row i (its
        draws); drafts[i]: int64[p, d] verified after its root (None: prefill, no drafts);
        qs[i]: float64[p, d, V] or None (one-hot); histories[i]: the tokens before the node's
        prefix (prompt + output + root), for the repetition penalty."""

        def choose(batch_rows, logits, prefixes, logits_at=None):
            ctx = None
            if self.options.repetition_penalty != 1.0:
                ctx = [np.concatenate([np.asarray(histories[r], dtype=np.int64), np.asarray(pre, dtype=np.int64)])
                       for r, pre in zip(batch_rows, prefixes)]
            p = self.options.probs(logits, ctx)
            out = []
            for j, (r, pre) in enumerate(zip(batch_rows, prefixes)):
                att = [] if drafts is None else attempts_at(drafts[r], None if qs is None else qs[r], pre)
                out.append(accept(p[j], att, rows[r], self.draws))
            return np.asarray(out, dtype=np.int64)

        choose.top_k = self.options.top_k_reads()  # the verifier may screen the rest out
        return choose


class DraftSampler:
    """What a drafter needs to draw sampled drafts for one row: q = ``probs(logits)`` over the
    target's vocabulary (the same processors as p, so that q is close to p), ``draw(q)`` a token
    from the row's random source. vocab_size: V of the target; row: the run-wide row id."""

    def __init__(self, options: SamplingOptions, draws, row: int, vocab_size: int):
        self.options, self.draws, self.row, self.vocab_size = options, draws, int(row), int(vocab_size)

    def probs(self, logits: torch.Tensor, contexts=None, columns=None) -> np.ndarray:
        """logits [m, V'] -> q float64[m, V]; columns: the token id of each of the V' columns
        (a reduced draft vocabulary; the other tokens get probability 0), None: V' = V."""
        if columns is not None:  # the listed columns, every other token -inf: read entry by entry
            m, n = logits.shape
            x = logits.detach().cpu()
            x = x if x.dtype in (torch.float32, torch.float64) else x.float()
            sparse = SparseLogits(np.repeat(np.arange(m), n), np.tile(np.asarray(columns, dtype=np.int64), m),
                                  x.numpy().reshape(-1), (m, self.vocab_size))
            return self.options.probs(sparse, contexts)
        logits = logits.detach().to(torch.float64)
        if logits.shape[-1] != self.vocab_size:
            full = logits.new_full((logits.shape[0], self.vocab_size), -float("inf"))
            n = min(logits.shape[-1], self.vocab_size)
            full[:, :n] = logits[:, :n]
            logits = full
        return self.options.probs(logits, contexts)

    def draw(self, q: np.ndarray) -> int:
        return self.draws.categorical(self.row, q)

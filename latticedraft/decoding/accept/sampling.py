"""Lossless sampling over a draft tree by shared Gumbel noise: the emitted tokens are a function of
the seed, the row, the position and the target alone, whatever was drafted.

Row r of a run with seed s has, at every absolute position t of its sequence, Gumbel(0, 1) noise
g_t[v] for every token v, a counter-based hash of (s, r, t, v) (``GumbelNoise``: any tokens'
noise computed alone, a top-k's support or a draft vocabulary's columns).
At a walked node whose next token sits at position t, the target's distribution is p (float64[V],
after generate's processors) and the token is argmax over p's support of log p + g_t: by the
Gumbel-max theorem a draw from p, independent of the draws before it since g_t is. So the
output is ancestral sampling from the target, exactly, and every lossless decoder emits the same
tokens for the same seed and row: verification is greedy on the perturbed scores (a draft token is
kept where it equals the target's perturbed argmax), and any draft, plan or gate is allowed,
however it was chosen.

Drafters draft with the same noise: a drafter's distribution q for position t is perturbed the
same way (``DraftSampler.scores``: log q + g_t), and its perturbed argmax equals the target's
whenever q is close to p (with probability at least (1 - TV) / (1 + TV), TV the total variation
between them); the heads' lattice is built over perturbed scores, so every greedy drafter (top-1,
rescored, p-best paths) drafts under sampling. Deterministic drafts (n-grams) are kept with
probability p(x), as in speculative sampling's one-hot case.

p is the target's distribution after the logits processing ``generate(do_sample=True)``
applies (transformers' own processors, in its order: repetition penalty, temperature, top-k,
top-p; top_k = 0, top_p = 1 and repetition_penalty = 1 switch those off), in float64. The noise
differs from transformers' own random stream, so the tokens differ from ``generate``'s for the
same seed; their distribution is the same.

    >>> noise = GumbelNoise(seed=0)
    >>> noise.choice(np.array([0.5, 0.3, 0.2]), row=0, position=12)  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from latticedraft.decoding.registry import SamplingSettings, settings_for
from latticedraft.errors import InputError
from latticedraft.gpu.verify.sparse_logits import SparseLogits


@dataclass(frozen=True)
class SamplingOptions(SamplingSettings):
    """generate's sampling settings (``SamplingSettings``: the fields, their ranges and flags) with
    what turns the target's logits into p."""

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


def sampling_options(method, values: dict) -> SamplingOptions | None:
    """``SamplingOptions`` of ``--do-sample`` and generate's flags for ``method`` (a ``registry.Method``;
    values: dest -> value, None = the method's default), or None for greedy decoding."""
    kw = settings_for(method, values)
    return None if kw is None else SamplingOptions(**kw)


class SeededDraws:
    """Per-row generators ``default_rng([seed, row])``, created on first use (MTAD's end tokens)."""

    def __init__(self, seed: int):
        self.seed = int(seed)
        self.rngs: dict[int, np.random.Generator] = {}

    def _rng(self, row: int) -> np.random.Generator:
        if row not in self.rngs:
            self.rngs[row] = np.random.default_rng([self.seed, int(row)])
        return self.rngs[row]

    def categorical(self, row: int, probs: np.ndarray) -> int:
        # over the support only (a top-k keeps ~50 of V): the same partial sums as over the whole
        # row (adding 0.0 is exact), so the same token for the same uniform draw
        support = np.flatnonzero(probs > 0)
        c = np.cumsum(probs[support])
        i = int(np.searchsorted(c, self._rng(row).random() * c[-1], side="right"))
        return int(support[min(i, len(support) - 1)])


_M1, _M2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 values (wrapping arithmetic): a bijection whose outputs of
    nearby inputs look independent."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class GumbelNoise:
    """The run's sampling noise: row r's position t has Gumbel(0, 1) noise g_t[v] for every token
    v, a function of (seed, r, t, v) alone: a counter-based hash (splitmix64's finalizer, twice)
    to a uniform u in (0, 1) with 53 bits, g = -log(-log u). So any tokens' noise is computed
    alone (``of``: a top-k's support, a draft vocabulary's columns), never the whole vocabulary's."""

    def __init__(self, seed: int):
        self.seed = int(seed)

    def of(self, row: int, position: int, tokens) -> np.ndarray:
        """g_t[v] of row ``row`` at position ``position`` for ``tokens`` (int[k]): float64[k]."""
        with np.errstate(over="ignore"):
            key = _mix(np.asarray([self.seed, int(row), int(position)], dtype=np.uint64) * _GOLDEN)
            key = _mix(key[0] ^ _mix(key[1] + key[2] * _GOLDEN))
            h = _mix(key + np.asarray(tokens, dtype=np.uint64) * _GOLDEN)
        u = ((h >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53
        return -np.log(-np.log(u))

    def scores(self, p: np.ndarray, row: int, position: int) -> tuple[np.ndarray, np.ndarray]:
        """(p's support int64[m], log p + g_t there float64[m]) under row ``row``'s noise at
        ``position``, reading the noise of the support alone."""
        support = np.flatnonzero(p > 0)
        return support, np.log(p[support]) + self.of(row, position, support)

    def choice(self, p: np.ndarray, row: int, position: int) -> int:
        """p's token under row ``row``'s noise at ``position``: argmax over p's support of log p +
        g_t (a draw from p, Gumbel-max)."""
        support, s = self.scores(p, row, position)
        return int(support[np.argmax(s)])

    def ranked(self, p: np.ndarray, row: int, position: int, k: int) -> np.ndarray:
        """The k tokens of p's support (fewer where it is smaller) with the largest log p + g_t,
        best first (``choice``'s first): int64[<= k]."""
        support, s = self.scores(p, row, position)
        top = np.argpartition(-s, k - 1)[:k] if k < len(s) else np.arange(len(s))
        return support[top[np.argsort(-s[top], kind="stable")]]


class SpeculativeRule:
    """Lossless sampling as an acceptance rule (``accept/rule.py``): at every walked node the
    target's perturbed argmax (``GumbelNoise.choice``), so a draft token is kept where it equals it.

    options: ``SamplingOptions`` (what turns the target's logits into p); noise: ``GumbelNoise``
    (default: of ``options.seed``)."""

    lossless = True

    def __init__(self, options: SamplingOptions, noise: GumbelNoise | None = None):
        self.options = options
        self.noise = noise if noise is not None else GumbelNoise(options.seed)

    def for_step(self, rows, drafts=None, qs=None, histories=None):
        """``choose`` for one verify call. rows[i]: the run-wide row id of batch row i (its noise);
        histories[i]: the tokens before the node's prefix (prompt + output + root; the prompt at
        the prefill), whose length is the position of a root child. Drafts play no part."""

        def choose(batch_rows, logits, prefixes, logits_at=None):
            ctx = None
            if self.options.repetition_penalty != 1.0:
                ctx = [np.concatenate([np.asarray(histories[r], dtype=np.int64), np.asarray(pre, dtype=np.int64)])
                       for r, pre in zip(batch_rows, prefixes)]
            p = self.options.probs(logits, ctx)
            return np.asarray([self.noise.choice(p[j], rows[r], len(histories[r]) + len(pre))
                               for j, (r, pre) in enumerate(zip(batch_rows, prefixes))], dtype=np.int64), None

        choose.top_k = self.options.top_k_reads()  # the verifier may screen the rest out
        return choose


class DraftSampler:
    """What a drafter needs to draft for one row under sampling: q = ``probs(logits)`` over the
    target's vocabulary (the same processors as p, so that q is close to p) and the row's noise,
    with which ``scores(q, t)`` perturbs q for position t and ``draw(q, t)`` picks its token.
    vocab_size: V of the target; row: the run-wide row id."""

    def __init__(self, options: SamplingOptions, noise: GumbelNoise, row: int, vocab_size: int):
        self.options, self.noise, self.row, self.vocab_size = options, noise, int(row), int(vocab_size)

    def probs(self, logits: torch.Tensor, contexts=None, columns=None) -> np.ndarray:
        """logits [m, V'] -> q float64[m, V]; columns: the token id of each of the V' columns
        (a reduced draft vocabulary; the other tokens get probability 0), None: V' = V."""
        if columns is not None:  # the listed columns, every other token -inf: read entry by entry
            x = logits.detach().cpu()
            x = x if x.dtype in (torch.float32, torch.float64) else x.float()
            rows, cols = self._candidates(x)
            sparse = SparseLogits(rows, np.asarray(columns, dtype=np.int64)[cols], x.numpy()[rows, cols],
                                  (len(x), self.vocab_size))
            return self.options.probs(sparse, contexts)
        logits = logits.detach().to(torch.float64)
        if logits.shape[-1] != self.vocab_size:
            full = logits.new_full((logits.shape[0], self.vocab_size), -float("inf"))
            n = min(logits.shape[-1], self.vocab_size)
            full[:, :n] = logits[:, :n]
            logits = full
        return self.options.probs(logits, contexts)

    def _candidates(self, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """The entries of x [m, V'] that ``probs`` can keep: (rows, columns) int64, row-major;
        with a top-k that reads the k largest alone (``top_k_reads``), each row's entries >= its
        k-th largest (ties included, so the same tokens survive), else all of them."""
        m, n = x.shape
        k = self.options.top_k_reads()
        if k is None or k >= n:
            return np.repeat(np.arange(m), n), np.tile(np.arange(n), m)
        kth = torch.topk(x, k, dim=-1).values[:, -1:]
        rows, cols = torch.nonzero(x >= kth, as_tuple=True)
        return rows.numpy(), cols.numpy()

    def scores(self, q: np.ndarray, position: int, columns=None) -> np.ndarray:
        """log q + the noise of ``position``: float64[V] (or float64[V'] of the token ids
        ``columns``), -inf outside q's support."""
        cols = np.arange(len(q)) if columns is None else np.asarray(columns)
        qc = q[cols]
        live = np.flatnonzero(qc > 0)  # (a top-k's support: the noise of ~k tokens, not of every column)
        out = np.full(len(cols), -np.inf)
        out[live] = np.log(qc[live]) + self.noise.of(self.row, position, cols[live])
        return out

    def ranked(self, q: np.ndarray, position: int, k: int = 2) -> np.ndarray:
        """q's k tokens of the largest perturbed scores at ``position``, best first (``GumbelNoise.ranked``)."""
        return self.noise.ranked(q, self.row, position, k)

    def draw(self, q: np.ndarray, position: int) -> int:
        """q's token for ``position``: its perturbed argmax (the target's wherever q = p)."""
        return self.noise.choice(q, self.row, position)

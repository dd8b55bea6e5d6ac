"""Lookahead decoding (Fu et al. 2024, Algorithms 2-3): greedy, exact, on the shared verifier.

Every step is ONE target call over [root, lookahead branch, verification branch] with the
Figure 2(b) mask (``Verifier.verify`` with a side branch): the lookahead branch is the
row's ``JacobiWindow`` (W x (N-1) guesses, one Jacobi update per step, its n-grams go to the
row's ``NgramPool``); the verification branch is the pool's continuations of the root (at
most G, merged into a trie, which for distinct first tokens is exactly the paper's disjoint
n-grams). The longest continuation the target agrees with is accepted plus one bonus token;
only the accepted nodes' KV is kept. Rows of a batch keep their own window and pool.

With ``sampling`` (``SamplingOptions``: temperature / top-k / top-p / seed) the candidates are
verified by Algorithm 4, the one-hot case of ``spec_sampling.py``: the output then has the target's sampling
distribution, as ``generate(do_sample=True)`` with the same settings; the Jacobi window keeps
taking the target's argmax (its guesses only decide what is drafted, never what is emitted).

Counting as in ``bpd.py``: the prefill emits 1 token, every step emits accepted + 1.
``SequenceResult.tree_nodes`` records the nodes of each step's forward (root + window + trie).

    >>> r = lookahead_decode(model, [ids], W=15, N=5, G=15, max_new_tokens=64)   # doctest: +SKIP
    >>> r.sequences[0].tokens, r.block_efficiency, r.verify_mode
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from latticedraft.decoding.loop import DecodeResult, SequenceResult, _eos_set, checked_prompts
from latticedraft.decoding.proposers.lookahead_pool import JacobiWindow, NgramPool
from latticedraft.decoding.accept.sampling import SpeculativeChooser
from latticedraft.errors import InputError
from latticedraft.gpu.models import hf
from latticedraft.gpu.verify.verifier import Verifier


@dataclass(frozen=True)
class LookaheadOptions:
    """W: window columns (lookahead size); N: n-gram size (N-1 levels); G: candidates per key
    verified per step (and kept in the pool); prompt_as_reference: start the window from prompt
    tokens and seed the pool with the prompt's n-grams; seed: the window's random start."""

    W: int = 15
    N: int = 5
    G: int = 15
    prompt_as_reference: bool = False
    seed: int = 0

    def __post_init__(self):
        if self.W < 1 or self.N < 2 or self.G < 0:
            raise InputError(f"lookahead needs --window >= 1, --ngram >= 2 and --pool >= 0; got W={self.W}, "
                             f"N={self.N}, G={self.G}")

    def start(self, prompt: np.ndarray, vocab: int, row: int) -> tuple[JacobiWindow, NgramPool]:
        """A fresh window and pool for one prompt (int64[T]). The window starts from random
        tokens (the paper's random initial guess; from the prompt's tokens with
        ``prompt_as_reference``), seeded by (seed, row) so runs repeat."""
        rng = np.random.default_rng([self.seed, row])
        if self.prompt_as_reference:
            init = rng.choice(prompt, size=self.W)
        else:
            init = rng.integers(0, vocab, size=self.W)
        pool = NgramPool(self.G)
        if self.prompt_as_reference:
            pool.seed(prompt, self.N)
        return JacobiWindow(self.W, self.N, init), pool


@torch.inference_mode()
def lookahead_decode(
    model,
    prompts: list,
    *,
    W: int = 15,
    N: int = 5,
    G: int = 15,
    max_new_tokens: int = 64,
    eos_token_id=None,
    prompt_as_reference: bool = False,
    seed: int = 0,
    verify: str = "auto",
    on_tokens=None,
    first_row: int = 0,
    sampling=None,
    draws=None,
    kv_cache: str = "auto",
) -> DecodeResult:
    """Greedy lookahead decoding of every prompt; output equals ``generate(do_sample=False)``.

    model: any causal LM (or a BlockwiseModel: only its base head is used). prompts: list of
    int sequences (each >= 1 token). W, N, G: window columns, n-gram size, pool candidates per
    key (paper defaults for 7B models: 15, 5, 15). verify: "auto" | "tree" | "batched" (see
    ``verify.choose_mode``; the result reports it). on_tokens(row, new_ids) streams tokens.
    first_row: index of prompts[0] in the whole prompt set (seeds each row's window and draws).
    sampling: ``SamplingOptions`` for lossless sampling (None: greedy); draws: its random source
    (default ``SeededDraws(sampling.seed)``; see ``spec_sampling``). kv_cache: "auto" | "full" |
    "rolling" (``verify.choose_kv_cache``)."""
    opts = LookaheadOptions(W, N, G, prompt_as_reference, seed)
    prompts = checked_prompts(model, prompts, max_new_tokens)
    eos = _eos_set(eos_token_id)
    timing = {"model": 0.0, "draft": 0.0, "accept": 0.0}
    t_start = time.perf_counter()
    verifier = Verifier(model, verify, num_heads=1, kv_cache=kv_cache)
    vocab = hf.model_vocab_size(getattr(model, "base", model))

    b = len(prompts)
    out: list[list[int]] = [[] for _ in range(b)]
    per_call: list[list[int]] = [[] for _ in range(b)]
    acc_drafts: list[list[int]] = [[] for _ in range(b)]
    nodes: list[list[int]] = [[] for _ in range(b)]
    done_at = [0.0] * b
    rows = [opts.start(prompts[i], vocab, first_row + i) for i in range(b)]

    def emit(i: int, new: list[int]) -> bool:
        """Append tokens to row i (cut at EOS / the budget); True if the row is finished."""
        take = []
        for t in new:
            take.append(t)
            if t in eos or len(out[i]) + len(take) >= max_new_tokens:
                break
        out[i].extend(take)
        per_call[i].append(len(take))
        if on_tokens is not None:
            on_tokens(i, take)
        finished = len(take) < len(new) or take[-1] in eos or len(out[i]) >= max_new_tokens
        if finished:
            done_at[i] = time.perf_counter() - t_start
        return finished

    chooser = None if sampling is None else SpeculativeChooser(sampling, draws)

    def choose_for(live: list[int], drafts=None):
        """The verifier's ``choose`` for the batch rows ``live`` (run-wide rows first_row + i);
        the candidates are one-hot drafts."""
        if chooser is None:
            return None
        hist = [np.concatenate([prompts[i], np.asarray(out[i], dtype=np.int64)]) for i in live]
        return chooser.for_step([first_row + i for i in live], drafts, None, hist)

    t0 = time.perf_counter()
    state, first, _ = verifier.prefill(prompts, choose=choose_for(list(range(b))))
    timing["model"] += time.perf_counter() - t0
    active = [i for i in range(b) if not emit(i, [int(first[i])])]
    roots = [int(first[i]) for i in active]
    if len(active) < b:
        state.select_rows(torch.as_tensor(active, device=state.valid.device))

    while active:
        t0 = time.perf_counter()
        drafts, sides = [], []
        for j, i in enumerate(active):
            window, pool = rows[i]
            room = max(max_new_tokens - len(out[i]) - 1, 0)  # the bonus token takes the last place
            cands = [c[:room] for c in pool.get(roots[j])[: opts.G]] if room else []
            drafts.append(np.stack(cands) if cands else np.zeros((1, 0), np.int64))
            sides.append(window.side())
        t1 = time.perf_counter()
        res = verifier.verify(state, np.asarray(roots, dtype=np.int64), drafts, sides,
                              choose=choose_for(active, drafts))
        t2 = time.perf_counter()
        still, new_roots, live = [], [], []
        for j, i in enumerate(active):
            window, pool = rows[i]
            for g in window.update(res.side_argmax[j]):
                pool.add(g)
            acc = [int(t) for t in res.accepted[j]]
            acc_drafts[i].append(len(acc))
            nodes[i].append(1 + sides[j].size + len({tuple(d[: k + 1]) for d in drafts[j].tolist()
                                                     for k in range(len(d))}))
            if not emit(i, acc + [int(res.bonus[j])]):
                still.append(i)
                new_roots.append(int(res.bonus[j]))
                live.append(j)
        if still and len(still) < len(active):
            state.select_rows(torch.as_tensor(live, dtype=torch.long, device=state.valid.device))
        active, roots = still, new_roots
        timing["draft"] += t1 - t0
        timing["model"] += t2 - t1
        timing["accept"] += time.perf_counter() - t2

    seqs = [
        SequenceResult(prompt_ids=prompts[i], tokens=np.asarray(out[i], dtype=np.int64), calls=len(per_call[i]),
                       tokens_per_call=per_call[i], seconds=done_at[i], accepted_drafts=acc_drafts[i],
                       tree_nodes=nodes[i])
        for i in range(b)
    ]
    reason = f"{verifier.mode_reason}; lookahead W={W} N={N} G={G}" + ("" if sampling is None else
                                                                      f"; sampling {sampling}")
    return DecodeResult(seqs, verifier.mode, reason, time.perf_counter() - t_start, timing,
                        kv_peak_bytes=verifier.peak_cache_bytes)

"""The per-row bookkeeping every decoder shares: emitted tokens, EOS and budget, finished rows.

``Rows`` holds one entry per prompt of a decode call. ``emit(i, tokens)`` appends what a target
call produced for row i, cut after the first EOS or at ``max_new_tokens``, streams it through
``on_tokens(i, tokens)`` and says whether the row is finished; ``live`` lists the rows still
decoding (in batch order, the order of the rows the model still computes). ``result`` builds
the ``DecodeResult``.

    >>> rows = Rows([np.array([5, 6])], max_new_tokens=3, eos_token_id=9)
    >>> rows.emit(0, [7]), rows.emit(0, [8, 9, 4]), rows.out[0]
    (False, True, [7, 8, 9])
"""

from __future__ import annotations

import time

import numpy as np

from latticedraft.decoding.results import DecodeResult, SequenceResult
from latticedraft.errors import InputError


def eos_set(eos_token_id) -> frozenset[int]:
    """The end-of-text ids as a set: None, one id, or a list of ids."""
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, (list, tuple, set, frozenset)):
        return frozenset(int(e) for e in eos_token_id)
    return frozenset({int(eos_token_id)})


def cut_at_end(tokens, eos_token_id) -> np.ndarray:
    """``tokens`` (ints) up to and including the first end id (None, one id or a list), int64[n]."""
    ends = eos_set(eos_token_id)
    toks = [int(t) for t in tokens]
    for i, t in enumerate(toks):
        if t in ends:
            return np.asarray(toks[: i + 1], dtype=np.int64)
    return np.asarray(toks, dtype=np.int64)


class Rows:
    """prompts: int64[t_i] each; max_new_tokens >= 1; eos_token_id: id, ids or None;
    on_tokens(i, new_ids): called as tokens are emitted (streaming); on_done(i, SequenceResult):
    called as each row finishes (``finish``)."""

    def __init__(self, prompts: list[np.ndarray], max_new_tokens: int, eos_token_id=None, on_tokens=None,
                 on_done=None):
        if max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.prompts = [np.asarray(p, dtype=np.int64).reshape(-1) for p in prompts]
        if not self.prompts or any(len(p) == 0 for p in self.prompts):
            raise InputError("every prompt must have at least one token")
        self.max_new, self.eos, self.on_tokens = int(max_new_tokens), eos_set(eos_token_id), on_tokens
        self.on_done = on_done
        b = len(self.prompts)
        self.out: list[list[int]] = [[] for _ in range(b)]
        self.per_call: list[list[int]] = [[] for _ in range(b)]
        self.accepted: list[list[int]] = [[] for _ in range(b)]
        self.nodes: list[list[int]] = [[] for _ in range(b)]
        self.heads: list[list[int]] = [[] for _ in range(b)]
        self.done_at = [0.0] * b
        self.live = list(range(b))
        self.t0 = time.perf_counter()
        self.begun = [self.t0] * b  # when each row started decoding (``admit``: a continuous batch)

    def __len__(self) -> int:
        return len(self.prompts)

    def room(self, i: int) -> int:
        """Draft tokens row i may still accept (the bonus token takes the last place)."""
        return max(self.max_new - len(self.out[i]) - 1, 0)

    def history(self, i: int) -> np.ndarray:
        """Prompt + emitted tokens of row i: int64[t]."""
        return np.concatenate([self.prompts[i], np.asarray(self.out[i], dtype=np.int64)])

    def admit(self, rows: list[int]) -> None:
        """Rows ``rows`` start decoding now, after the live ones (their ``seconds`` count from here)."""
        now = time.perf_counter()
        for i in rows:
            self.begun[i] = now
        self.live = self.live + list(rows)

    def emit(self, i: int, new) -> bool:
        """Append one target call's tokens to row i (cut after EOS / at the budget); True if the
        row is finished."""
        take, stop = [], False
        for t in new:
            take.append(int(t))
            if take[-1] in self.eos or len(self.out[i]) + len(take) >= self.max_new:
                stop = True
                break
        self.out[i].extend(take)
        self.per_call[i].append(len(take))
        if self.on_tokens is not None:
            self.on_tokens(i, take)
        if stop:
            self.done_at[i] = time.perf_counter() - self.begun[i]
        return stop

    def step(self, i: int, accepted: int, nodes: int, heads: int = 0) -> None:
        """Record one verify step of row i: draft tokens accepted, nodes verified (root
        included), whether its drafts came from the heads."""
        self.accepted[i].append(int(accepted))
        self.nodes[i].append(int(nodes))
        self.heads[i].append(int(heads))

    def finish(self, done: list[bool]) -> list[int]:
        """Drop the rows of ``live`` whose ``done`` (one flag per live row) is set; returns the
        batch positions (indices into the old ``live``) of the rows that go on."""
        keep = [j for j, d in enumerate(done) if not d]
        if self.on_done is not None:
            for j, d in enumerate(done):
                if d:
                    self.on_done(self.live[j], self.sequence(self.live[j]))
        self.live = [self.live[j] for j in keep]
        return keep

    def sequence(self, i: int) -> SequenceResult:
        """Row i's decode so far."""
        return SequenceResult(prompt_ids=self.prompts[i], tokens=np.asarray(self.out[i], dtype=np.int64),
                              calls=len(self.per_call[i]), tokens_per_call=self.per_call[i], seconds=self.done_at[i],
                              accepted_drafts=self.accepted[i], tree_nodes=self.nodes[i],
                              heads_per_step=self.heads[i])

    def result(self, mode: str, reason: str, timing: dict, steps=None, kv_peak_bytes: int = 0) -> DecodeResult:
        seqs = [self.sequence(i) for i in range(len(self.prompts))]
        return DecodeResult(seqs, mode, reason, time.perf_counter() - self.t0, timing, steps or [], kv_peak_bytes)

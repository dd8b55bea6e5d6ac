"""What every decoder returns: one ``SequenceResult`` per prompt inside a ``DecodeResult``.

Counting is the same for every method: the prefill call emits 1 token (the base model's
choice after the prompt) and every later target call emits the draft tokens it accepted plus
one bonus token. Block efficiency = tokens / target calls, so plain greedy decoding has 1.0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class SequenceResult:
    """One prompt's decode. tokens: int64[T] generated ids (EOS included if hit);
    tokens_per_call: tokens emitted by each target call (prefill first); seconds: from the
    start of the row's decoding (the call's start; in a continuous batch, the row's admission) to
    its last token."""

    prompt_ids: np.ndarray
    tokens: np.ndarray
    calls: int
    tokens_per_call: list[int]
    seconds: float
    accepted_drafts: list[int] = field(default_factory=list)  # accepted draft tokens per verify step
    tree_nodes: list[int] = field(default_factory=list)  # verified nodes (root included) per step
    heads_per_step: list[int] = field(default_factory=list)  # 1 where the step's drafts came from the heads

    @property
    def block_efficiency(self) -> float:
        return len(self.tokens) / max(self.calls, 1)


@dataclass
class StepRecord:
    """What one verify step of one row saw: the lattice (None without heads), the verified
    paths int64[p, d], what was accepted and the bonus token; best: the lattice drafter's own
    first path int64[d] (its highest-scoring: the rescored best path where it rescores; None
    without a lattice), whether or not the tree kept it."""

    row: int
    history: np.ndarray
    sausage: object
    drafts: np.ndarray
    accepted: np.ndarray | None = None
    bonus: int = -1
    best: np.ndarray | None = None


@dataclass
class DecodeResult:
    """sequences: one per prompt, in order; verify_mode: "tree" | "batched" | "split" |
    "generate"; verify_reason: why (and the method's settings); timing: seconds per part over
    the whole run (the one loop's: prefill, model = the verify calls, lattice, draft, accept, and
    verify.<part> = the verify calls' ``Verifier.timing``); steps: per-step records (only when
    asked for); kv_peak_bytes: the verifier's largest KV cache (0 where not measured)."""

    sequences: list[SequenceResult]
    verify_mode: str
    verify_reason: str
    seconds: float
    timing: dict
    steps: list = field(default_factory=list)
    kv_peak_bytes: int = 0

    @property
    def tokens(self) -> int:
        return sum(len(s.tokens) for s in self.sequences)

    @property
    def calls(self) -> int:
        return sum(s.calls for s in self.sequences)

    @property
    def block_efficiency(self) -> float:
        return self.tokens / max(self.calls, 1)

    @classmethod
    def one(cls, seq: "SequenceResult", verify_mode: str, verify_reason: str, kv_peak_bytes: int) -> "DecodeResult":
        """A result of ``seq`` alone (what ``on_done`` callbacks get): its own seconds, no steps or
        timing."""
        return cls([seq], verify_mode, verify_reason, seq.seconds, {}, [], kv_peak_bytes)

    def alone(self, j: int) -> "DecodeResult":
        """Sequence j by itself (``one``), with this run's verify mode."""
        return DecodeResult.one(self.sequences[j], self.verify_mode, self.verify_reason, self.kv_peak_bytes)


def merge(parts: list[DecodeResult]) -> DecodeResult:
    """One result from the results of consecutive batches (sequences in order, times and
    per-part timings summed, the largest KV cache, every batch's verify mode named once)."""
    if len(parts) == 1:
        return parts[0]
    modes = list(dict.fromkeys(p.verify_mode for p in parts))
    reasons = list(dict.fromkeys(p.verify_reason for p in parts))
    keys = list(dict.fromkeys(k for p in parts for k in p.timing))
    return DecodeResult(
        [q for p in parts for q in p.sequences], "+".join(modes), "; ".join(reasons),
        sum(p.seconds for p in parts), {k: sum(p.timing.get(k, 0.0) for p in parts) for k in keys},
        [st for p in parts for st in p.steps], max(p.kv_peak_bytes for p in parts),
    )


def records(result: DecodeResult, tokenizer, model_dir: str, texts: list[str], dtype: str | None = None) -> list[dict]:
    """The JSON objects of ``decode --json`` and data-set runs, one per prompt (``text`` is the
    tokenizer's decoding of the new tokens, special tokens such as end-of-text left out; ``dtype``:
    the weights' dtype the tokens were decoded in, recorded where given)."""
    out = []
    for text, s in zip(texts, result.sequences):
        out.append({
            "prompt": text,
            "prompt_ids": s.prompt_ids.tolist(),
            "tokens": s.tokens.tolist(),
            "text": tokenizer.decode(s.tokens.tolist(), skip_special_tokens=True),
            "calls": s.calls,
            "block_efficiency": round(s.block_efficiency, 4),
            "accepted_per_step": s.accepted_drafts,
            "tree_nodes_per_step": s.tree_nodes,
            "heads_per_step": s.heads_per_step,
            "tokens_per_call": s.tokens_per_call,
            "seconds": round(s.seconds, 4),
            "verify": result.verify_mode,
            "model": model_dir,
            **({"dtype": dtype} if dtype is not None else {}),
        })
    return out

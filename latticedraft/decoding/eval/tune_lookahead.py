"""``latticedraft tune --method lookahead``: choose (W, N, G) for this model and machine.

On a CPU a lookahead step over 60 nodes costs several 1-node steps, so the paper's 7B
defaults (15, 5, 15) are not the fastest setting everywhere. For each (W, N, G) of a small
grid the tuner decodes the tuning split (never the evaluation prompts), records per step the
tokens emitted and the nodes verified (root + Jacobi window + candidate trie), and predicts

    tokens/s = sum of tokens over steps / sum of T(nodes) over steps

with ``T(n)`` the measured step-cost curve (``gpu.verify.cost_model.CostModel``, batch 1: how
``decode`` runs). The argmax of that table is written as JSON:

    {"lookahead": {"W": 7, "N": 4, "G": 7, "prompt_as_reference": true},
     "predicted_tokens_per_s": 301.2, "table": [{"W", "N", "G", "tokens_per_step",
     "nodes_per_step", "predicted_tokens_per_s"}, ...], "cost_model": {...}, "prompts": 10, ...}

``decode/eval --method lookahead --lookahead-config FILE`` read it (``methods.lookahead.read_lookahead_config``).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from latticedraft.atomic import write_atomic
from latticedraft.errors import InputError

WINDOWS = (3, 7, 15)
NGRAMS = (3, 4, 5)
POOLS = (3, 7, 15)


@dataclass(frozen=True)
class Row:
    """One grid point: what the decode measured and what the cost model predicts."""

    W: int
    N: int
    G: int
    tokens_per_step: float
    nodes_per_step: float
    predicted_tokens_per_s: float

    def to_json(self) -> dict:
        return {"W": self.W, "N": self.N, "G": self.G, "tokens_per_step": round(self.tokens_per_step, 4),
                "nodes_per_step": round(self.nodes_per_step, 2),
                "predicted_tokens_per_s": round(self.predicted_tokens_per_s, 2)}


def predict(result, seconds) -> Row | None:
    """Measured tokens and nodes per step of a lookahead ``DecodeResult`` (the prefill call,
    which verifies nothing, is left out) and the predicted tokens/s under ``seconds(n)``.
    None when no sequence took a step."""
    tokens = [t for q in result.sequences for t in q.tokens_per_call[1:]]
    nodes = [n for q in result.sequences for n in q.tree_nodes]
    if not nodes:
        return None
    total_s = float(np.sum(seconds(np.asarray(nodes, dtype=float))))
    return Row(0, 0, 0, float(np.mean(tokens)), float(np.mean(nodes)), float(np.sum(tokens)) / total_s)


def best(rows: list[Row]) -> Row:
    """The row with the highest predicted tokens/s (ties: fewer nodes per step)."""
    if not rows:
        raise InputError("the lookahead grid produced no decode steps; use longer --max-new-tokens")
    return max(rows, key=lambda r: (r.predicted_tokens_per_s, -r.nodes_per_step))


def check_grid(windows, ngrams, pools) -> None:
    """Every W >= 1, N >= 2, G >= 0, each list non-empty."""
    for name, vals, low in (("--windows", windows, 1), ("--ngrams", ngrams, 2), ("--pools", pools, 0)):
        if not vals or any(int(v) < low for v in vals):
            raise InputError(f"{name} {list(vals)}: give one or more integers >= {low}")


def tune_lookahead(session, prompts: list[dict], out_path, *, windows=WINDOWS, ngrams=NGRAMS, pools=POOLS,
                   num_prompts: int = 10, skip: int = 0, max_new_tokens: int = 48, batch_size: int = 4,
                   prompt_as_reference: bool = True, cost_model=None, verify: str = "auto") -> dict:
    """Decode ``num_prompts`` prompts after the first ``skip`` with every (W, N, G) of the grid,
    predict tokens/s from ``cost_model`` (default: the cached curve of this model and machine
    at batch 1), write the argmax and the table to ``out_path``; returns what was written."""
    from tqdm import tqdm

    from latticedraft.decoding.methods.lookahead import LookaheadOptions
    from latticedraft.decoding.runs.loaders import encode
    from latticedraft.gpu.verify.cost_model import CostModel
    from latticedraft.gpu.verify.verifier import Verifier

    check_grid(windows, ngrams, pools)
    split = prompts[skip : skip + num_prompts]
    if not split:
        raise InputError(f"no tuning prompts after skipping {skip}; lower --skip")
    ids = encode(session.tokenizer, [r["prompt"] for r in split])
    cm = cost_model or CostModel.cached(Verifier.for_model(session.model, verify, num_heads=1), batch=1)
    rows = []
    grid = list(itertools.product(windows, ngrams, pools))
    for W, N, G in tqdm(grid, desc="tune lookahead", unit="setting", disable=None):
        opts = LookaheadOptions(int(W), int(N), int(G), prompt_as_reference)
        res = session.decode(ids, "lookahead", opts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                             verify=verify)
        r = predict(res, cm.seconds)
        if r is not None:
            rows.append(Row(int(W), int(N), int(G), r.tokens_per_step, r.nodes_per_step, r.predicted_tokens_per_s))
    pick = best(rows)
    out = {"lookahead": {"W": pick.W, "N": pick.N, "G": pick.G, "prompt_as_reference": bool(prompt_as_reference)},
           "predicted_tokens_per_s": round(pick.predicted_tokens_per_s, 2), "table": [r.to_json() for r in rows],
           "cost_model": {"key": cm.key, "nodes": list(cm.nodes), "seconds": [float(s) for s in cm.seconds_at]},
           "prompts": len(ids), "skip": skip, "max_new_tokens": max_new_tokens, "model": session.base_dir}
    write_atomic(Path(out_path), json.dumps(out, indent=1) + "\n")
    return out

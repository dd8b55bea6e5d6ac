"""``latticedraft tune``: the interpolation weight alpha per drafter on a held-out split
(paper Appendix E: sweep alpha over {0.1, 0.5, 0.75, 0.9, 1.0, 1.1, 1.5, 2.0, 5.0, 10.0},
keep the alpha with the highest block efficiency; evaluate on the remaining prompts).

Writes ``tuned.json``: ``{"alphas": {"ngram": a, "neural": a}, "sweep": {family: {alpha:
block efficiency}}, "prompts": n}``; ``latticedraft eval --alphas tuned.json`` reads it.
"""

from __future__ import annotations

import json
from pathlib import Path

from latticedraft.atomic import write_atomic
from latticedraft.decoding.methods.bpd import DrafterSpec
from latticedraft.decoding.runs.session import Session
from latticedraft.decoding.runs.loaders import encode
from latticedraft.errors import InputError

GRID = (0.1, 0.5, 0.75, 0.9, 1.0, 1.1, 1.5, 2.0, 5.0, 10.0)
FAMILIES = ("ngram", "neural")


def tune(session: Session, prompts: list[dict], out_path, families=FAMILIES, grid=GRID, num_prompts: int = 10,
         max_new_tokens: int = 48, k: int = 16, batch_size: int = 4, skip: int = 0) -> dict:
    """Sweep alpha for each family on ``num_prompts`` prompts after the first ``skip``; write
    ``out_path``."""
    from tqdm import tqdm

    for f in families:
        if f not in FAMILIES:
            raise InputError(f"cannot tune {f!r}; choose from {', '.join(FAMILIES)}")
    if not grid or any(a < 0 for a in grid):
        raise InputError(f"alpha grid {list(grid)} must be non-empty and >= 0")
    split = prompts[skip : skip + num_prompts]
    if not split:
        raise InputError(f"no tuning prompts after skipping {skip}; lower --skip")
    ids = encode(session.tokenizer, [r["prompt"] for r in split])
    sweep: dict = {}
    jobs = [(f, a) for f in families for a in grid]
    for f, a in tqdm(jobs, desc="tune", unit="run", disable=None):
        res = session.decode(ids, "bpd", DrafterSpec(f, k=k, alpha=a), max_new_tokens=max_new_tokens,
                             batch_size=batch_size)
        sweep.setdefault(f, {})[str(a)] = round(res.block_efficiency, 4)
    best = {f: float(max(sweep[f], key=lambda a: (sweep[f][a], -abs(float(a) - 1.0)))) for f in families}
    out = {"alphas": best, "sweep": sweep, "prompts": len(ids), "skip": skip, "max_new_tokens": max_new_tokens, "k": k,
           "model": session.base_dir}
    write_atomic(Path(out_path), json.dumps(out, indent=1) + "\n")
    return out


def read_alphas(path) -> dict:
    p = Path(path)
    try:
        d = json.loads(p.read_text())
        return {k: float(v) for k, v in d["alphas"].items()}
    except FileNotFoundError:
        raise InputError(f"{p} not found; write it with `latticedraft tune --out {p}`") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise InputError(f"{p} is not a tune result with an 'alphas' object ({e}); rerun `latticedraft tune`") from e


def default_alphas_file(model_dir=None) -> Path | None:
    """``tuned.json`` beside the model (default: the bundled heads), if one was written."""
    from latticedraft.decoding.runs.loaders import default_model_dir

    p = Path(model_dir if model_dir is not None else default_model_dir()) / "tuned.json"
    return p if p.is_file() else None

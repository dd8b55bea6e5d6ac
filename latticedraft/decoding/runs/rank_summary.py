"""``eval --records OUT.jsonl``: block efficiency and tokens/s of a ``decode --output`` run, per
rank and in total.

Per rank: tokens / target calls (block efficiency) and tokens / decoding seconds, where a rank's
decoding seconds are the sum of its records' ``share_seconds`` (each batch's wall time split over
its prompts). In total the ranks ran side by side, so the run's decoding time is the longest
rank's, and total tokens/s = all tokens / that time (model loading and start-up excluded).
"""

from __future__ import annotations

import json
from pathlib import Path

from latticedraft.errors import InputError


def read_records(path) -> list[dict]:
    """The records of a merged OUT file; ``InputError`` names a line that is not one, a second
    fingerprint or a repeated id."""
    from latticedraft.paths import require_file

    p = require_file(path, "--records", "give the OUT.jsonl of `latticedraft decode --output`")
    recs, ids, fp = [], set(), None
    for n, line in enumerate(p.read_text(encoding="utf-8").split("\n"), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            ok = isinstance(r, dict) and {"id", "fingerprint", "tokens", "calls", "share_seconds"} <= set(r)
        except json.JSONDecodeError:
            ok = False
        if not ok:
            raise InputError(f"--records {p} line {n} is not a record of `decode --output` (a torn last line: "
                             "finish the run with --resume first)")
        if fp is not None and r["fingerprint"] != fp:
            raise InputError(f"--records {p} line {n} has fingerprint {r['fingerprint']}, line 1 {fp}: the file "
                             "mixes runs with different settings; summarize one run at a time")
        if r["id"] in ids:
            raise InputError(f"--records {p} line {n} repeats prompt id {r['id']!r}; remove one of the two")
        fp = r["fingerprint"]
        ids.add(r["id"])
        recs.append(r)
    if not recs:
        raise InputError(f"--records {p} holds no records")
    return recs


def _row(recs: list[dict], seconds: float) -> dict:
    tokens, calls = sum(len(r["tokens"]) for r in recs), sum(r["calls"] for r in recs)
    return {"prompts": len(recs), "tokens": tokens, "calls": calls,
            "block_efficiency": round(tokens / max(calls, 1), 4), "seconds": round(seconds, 4),
            "tokens_per_s": round(tokens / seconds, 2) if seconds > 0 else None}


def summarize(recs: list[dict]) -> dict:
    """``{"ranks": {rank: row}, "total": row, "world_size": W, "fingerprint": ...}``."""
    by_rank: dict[int, list] = {}
    for r in recs:
        by_rank.setdefault(int(r.get("rank", 0)), []).append(r)
    ranks = {k: _row(v, sum(r["share_seconds"] for r in v)) for k, v in sorted(by_rank.items())}
    total = _row(recs, max(row["seconds"] for row in ranks.values()))
    total["sum_of_rank_tokens_per_s"] = round(sum(row["tokens_per_s"] or 0.0 for row in ranks.values()), 2)
    return {"ranks": ranks, "total": total, "world_size": max(int(r.get("world_size", 1)) for r in recs),
            "fingerprint": recs[0]["fingerprint"], "settings": recs[0].get("settings")}


def table(summary: dict) -> str:
    """Markdown: one row per rank and the total."""
    head = "| rank | prompts | tokens | target calls | block efficiency | decoding s | tokens/s |\n|---|---:|---:|---:|---:|---:|---:|"
    fmt = lambda name, r: (f"| {name} | {r['prompts']} | {r['tokens']} | {r['calls']} | {r['block_efficiency']:.3f} | "  # noqa: E731
                           f"{r['seconds']:.2f} | {r['tokens_per_s'] if r['tokens_per_s'] is not None else '-'} |")
    rows = [fmt(k, r) for k, r in summary["ranks"].items()]
    rows.append(fmt(f"all ({len(summary['ranks'])} rank(s), longest rank's time)", summary["total"]))
    return "\n".join([head, *rows])


def write(summary: dict, out_dir) -> dict:
    from latticedraft.atomic import write_atomic

    out = Path(out_dir)
    return {"json": write_atomic(out / "records.json", json.dumps(summary, indent=2) + "\n"),
            "table": write_atomic(out / "records.md", table(summary) + "\n")}

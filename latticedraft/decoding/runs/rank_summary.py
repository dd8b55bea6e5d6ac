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


FIELDS = ("id", "fingerprint", "tokens", "calls", "share_seconds")


def read_records(path) -> list[dict]:
    """The records of a merged OUT file; ``InputError`` names what a line that is no record is
    instead (a --prompts file, ``decode --json`` output, a tokenizer …, with advice for that), a torn
    last line (finish that run with ``--resume``), a second fingerprint or a repeated id."""
    from latticedraft.decoding.runs import line_kinds as lk
    from latticedraft.decoding.runs.record_file import not_records
    from latticedraft.paths import require_file

    p = require_file(path, "--records", "give the OUT.jsonl of `latticedraft decode --output`")
    data = p.read_bytes()
    recs, ids, fp = [], set(), None
    lines = data.split(b"\n")
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        r, why = lk.parse_line(raw, FIELDS)
        if why is not None:
            last = n == len(lines)  # no newline after it
            if last and lk.is_torn_tail(raw):
                raise InputError(f"--records {p} ends with a torn line (line {n}: a run was stopped while writing it); "
                                 f"finish that run first: rerun its `latticedraft decode --prompts IN --output {p}` "
                                 "command with --resume")
            raise InputError(not_records("--records", p, n if recs else 1, why, data, _foreign_fix(data, p),
                                         "remove line {line}, or summarize the OUT.jsonl of one run"))
        if fp is not None and r["fingerprint"] != fp:
            raise InputError(f"--records {p} line {n} has fingerprint {r['fingerprint']}, line 1 {fp}: the file "
                             "mixes runs with different settings; summarize one run at a time")
        if r["id"] in ids:
            raise InputError(f"--records {p} line {n} repeats prompt id {lk.show_id(r['id'])}; remove one of the two")
        fp = r["fingerprint"]
        ids.add(r["id"])
        recs.append(r)
    if not recs:
        raise InputError(f"--records {p} is empty (no records); give the OUT.jsonl of a `decode --output` run")
    return recs


def _foreign_fix(data: bytes, p) -> str:
    """Advice for a --records file of another kind."""
    from latticedraft.decoding.runs import line_kinds as lk

    kind = lk.describe_file(data)
    if kind == lk.JSON_OUTPUT:
        return "run `latticedraft decode --prompts IN --output OUT.jsonl` instead and summarize OUT.jsonl"
    if kind == lk.PROMPTS_FILE:
        return (f"decode it first with `latticedraft decode --prompts {p} --output OUT.jsonl`, then summarize "
                "OUT.jsonl")
    return "give the OUT.jsonl that `latticedraft decode --prompts IN --output OUT.jsonl` wrote"


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

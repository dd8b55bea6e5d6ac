"""``benchmarks/rescoring.py`` on a tiny setting (2 held-back code prompts, 8 tokens, one repeat, the
replay sweep): its JSON (every row, the machine and the load), its table and figure, every output
equal to greedy and the learned rows' weight recorded. The real runs' numbers are in
docs/rescoring.md."""

from __future__ import annotations

import json

from tests.benchmarks.bundled import MARKS  # also puts benchmarks/ on the import path

pytestmark = MARKS


def test_a_tiny_run_writes_every_row_and_the_sweep(tmp_path, own_cache, capsys):
    import rescoring as b

    from latticedraft.paths import repo_root

    lm = repo_root() / ".cache" / "lm" / "stdlib-4gram"
    out = tmp_path / "r.json"
    assert b.main(["--num-prompts", "2", "--teach", "1", "--max-new-tokens", "8", "--repeats", "1", "--sweep",
                   "--lm", str(lm), "--out", str(out), "--png", str(tmp_path / "r.png")]) == 0
    d = json.loads(out.read_text())
    assert set(d["rows"]) == {f"{s} / {r}" for s in b.SETTINGS for r in b.ROWS}
    assert all(r["exact"] and r["tokens_per_call"] >= 1 for r in d["rows"].values())
    learned = [r for r in d["rows"].values() if "learned" in r["row"]]
    assert len(learned) == len(b.SETTINGS) and all(r["alpha"] is not None and r["learned"] for r in learned)
    assert {"model", "flags", "threads"} <= set(d["machine"]) and len(d["load_average"]["start"]) == 3
    sw = d["sweep"]
    assert sw["steps"] > 0 and set(sw["lattices"]["k=16"]) == {"p=1", f"p={sw['nbest']}"}
    assert all(len(v["kept"]) == len(sw["grid"]) for v in sw["lattices"]["otsu"].values())
    assert (tmp_path / "r.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert all(f"| {s} | rescored, learned alpha (parallel) |" in printed for s in b.SETTINGS)
    assert (own_cache / "rescore_weight").is_dir()  # the learned rows stored their learner in the cache

"""``scripts/task_prompts.py``: chat prompts of users' task kinds from local text, seeded."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GERMAN = ["Die Datei konnte nicht geöffnet werden, weil sie gesperrt ist.",
          "Bitte geben Sie einen gültigen Namen für die neue Gruppe ein.",
          "Der Server hat die Verbindung nach einer Minute ohne Antwort beendet."]


def _script():
    spec = importlib.util.spec_from_file_location("task_prompts_script", ROOT / "scripts" / "task_prompts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write_mo(path: Path, pairs: dict[str, str]) -> None:
    """A GNU gettext catalogue (little-endian, no hash table) holding ``pairs`` and an empty header."""
    items = sorted({"": "Content-Type: text/plain; charset=UTF-8\n", **pairs}.items())
    keys, values = [k.encode() for k, _ in items], [v.encode() for _, v in items]
    n, start = len(items), 28 + 16 * len(items)
    data, key_table, value_table = b"", [], []
    for table, strings in ((key_table, keys), (value_table, values)):
        for s in strings:
            table.append((len(s), start + len(data)))
            data += s + b"\0"
    head = struct.pack("<7I", 0x950412DE, 0, n, 28, 28 + 8 * n, 0, start)
    path.write_bytes(head + b"".join(struct.pack("<2I", *e) for e in key_table + value_table) + data)


def test_every_kind_from_local_text_and_the_same_for_a_seed(tmp_path, capsys):
    _write_mo(tmp_path / "app.mo", {f"English {i}": g for i, g in enumerate(GERMAN)} | {"Short": "Kurz."})
    out = tmp_path / "p.jsonl"
    args = ["--count", "40", "--seed", "3", "--locale-dir", str(tmp_path), "-o", str(out)]
    assert _script().main(args) == 0
    assert json.loads(capsys.readouterr().out)["kinds"] == {"translate": 12, "summarize": 8, "rag": 8, "math": 8,
                                                            "code": 4}
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by = {k: [r["prompt"] for r in rows if r["kind"] == k] for k in ("translate", "summarize", "rag", "math", "code")}
    assert {p.removeprefix("Translate German to English: ") for p in by["translate"]} == set(GERMAN)  # not "Kurz."
    assert all(p.startswith("Summarize: ") and len(p) > 600 for p in by["summarize"])
    assert all(p.count("\n") == 2 and p.rstrip().endswith((".", "?")) for p in by["rag"])
    assert all(p.endswith("?") and any(c.isdigit() for c in p) for p in by["math"])
    assert all(p.startswith(("Write", "Implement")) and "Python" in p for p in by["code"])
    first = out.read_text()
    assert _script().main(args) == 2 and "exists; pass --force" in capsys.readouterr().err
    assert _script().main(args + ["--force"]) == 0 and out.read_text() == first
    assert _script().main(args[:3] + ["4"] + args[4:] + ["--force"]) == 0 and out.read_text() != first


def test_no_german_catalogue_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "p.jsonl"
    assert _script().main(["--locale-dir", str(tmp_path), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no German sentences under --locale-dir") and "\n" not in err
    assert not out.exists()


def test_too_few_prompts_are_refused(tmp_path, capsys):
    assert _script().main(["--count", "2", "-o", str(tmp_path / "p.jsonl")]) == 2
    assert "--count 2: give at least 5" in capsys.readouterr().err and not (tmp_path / "p.jsonl").exists()

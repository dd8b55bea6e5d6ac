"""The README is a user's guide: at most 300 lines, the two set-up commands (the test one is what
CI runs) in its first 40 lines, and its speed table the one ``benchmarks/readme_table.py`` writes."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text().splitlines()
SETUP = ("bash scripts/setup.sh && .venv/bin/latticedraft demo", "bash scripts/setup.sh && .venv/bin/python -m pytest -q")


def test_short_with_the_two_setup_commands_first():
    assert len(README) <= 300
    head = "\n".join(README[:40])
    assert all(cmd in head for cmd in SETUP)
    ci = (ROOT / ".ci" / "run").read_text()
    assert SETUP[1] in ci  # CI runs exactly the README's test command


def test_measurement_pages_exist_and_speed_tables_are_marked():
    for page in ("decoders", "speed", "ngram-scale", "sampling", "self-drafting"):
        assert f"(docs/{page}.md)" in "\n".join(README) and (ROOT / "docs" / f"{page}.md").is_file()
    for text in ("\n".join(README), (ROOT / "docs" / "speed.md").read_text()):
        assert text.count("<!-- speed-table:begin -->") == 1 and text.count("<!-- speed-table:end -->") == 1

"""The documentation stays readable and connected: every page in ``docs/`` at most 400 lines (logs
of measurements live beside their results in ``benchmarks/results/``), every relative link in the
README, ``docs/`` and the benchmarks' READMEs reaches a file of the repository, and the speed
tables are the generator's, "(default)" marking only what ``latticedraft decode`` runs with no
options."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC_LINES = 400
LINK = re.compile(r"\]\(([^)\s]+)\)")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md")), *sorted((ROOT / "benchmarks").glob("**/*.md"))]


def relative_links(text: str) -> list[str]:
    """The targets of ``[text](target)`` links that name a path (no scheme, no bare ``#anchor``), anchors dropped."""
    out = []
    for target in LINK.findall(text):
        path = target.split("#")[0]
        if path and not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", path):
            out.append(path)
    return out


def test_docs_pages_are_at_most_400_lines():
    long = {p.relative_to(ROOT).as_posix(): n for p in sorted((ROOT / "docs").rglob("*"))
            if p.is_file() and (n := len(p.read_text().splitlines())) > DOC_LINES}
    assert not long, f"docs/ pages over {DOC_LINES} lines (split them, or move a log to benchmarks/results/): {long}"


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve_inside_the_repository(page):
    """Every link names a file of the checkout: a reader who cloned the project has it (the
    workspace around it, ``../shared/`` say, is not theirs)."""
    text = page.read_text()
    broken = [t for t in relative_links(text) if not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(ROOT)} links to missing files: {broken}"
    outside = [t for t in relative_links(text) + re.findall(r"`(\.\./[^`]+)`", text)
               if not (page.parent / t).resolve().is_relative_to(ROOT)]
    assert not outside, f"{page.relative_to(ROOT)} sends readers outside the repository: {outside}"


def test_link_reader():
    text = "[a](docs/x.md) [b](https://example.org/y) [c](#top) [d](../z.md#part) [e](mailto:me@x)"
    assert relative_links(text) == ["docs/x.md", "../z.md"]


def test_speed_tables_are_generated_and_default_is_the_cli_default():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import readme_table

    results = ROOT / "benchmarks" / "results" / "decode.json"
    body = readme_table.rows(results, "vs_prompt_lookup", "HF prompt lookup")
    for page in (ROOT / "README.md", ROOT / "docs" / "speed.md"):
        assert "\n".join(body) in page.read_text(), f"{page.name}'s table is not what benchmarks/readme_table.py writes"
    default = json.loads(results.read_text()).get("cli_default")
    marked = [line.split(" | ")[0][2:] for line in body if " (default) |" in line]
    assert marked == ([f"{default} (default)"] if default else [])
    assert readme_table.label("bpd x (default)", {}) == "bpd x"
    assert readme_table.label("bpd y", {"cli_default": "bpd y"}) == "bpd y (default)"

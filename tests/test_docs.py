"""The documentation stays readable and connected: every page in ``docs/`` at most 400 lines (logs
of measurements live beside their results in ``benchmarks/results/``), and every relative link in
the README, ``docs/`` and the benchmarks' READMEs reaches a file of the repository."""

from __future__ import annotations

import re
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
def test_relative_links_resolve(page):
    broken = [t for t in relative_links(page.read_text()) if not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(ROOT)} links to missing files: {broken}"


def test_link_reader():
    text = "[a](docs/x.md) [b](https://example.org/y) [c](#top) [d](../z.md#part) [e](mailto:me@x)"
    assert relative_links(text) == ["docs/x.md", "../z.md"]

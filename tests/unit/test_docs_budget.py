"""Issue 27, item 10: docs/ stays short enough to read (task guides and reference; history goes to
CHANGELOG.md)."""

from __future__ import annotations

from tests.support.docs import DOCS

BUDGET = 3000  # lines of docs/*.md, every page counted


def test_item10_docs_stay_under_their_line_budget():
    lines = {page.name: len(page.read_text().splitlines()) for page in sorted(DOCS.glob("*.md"))}
    assert sum(lines.values()) < BUDGET, lines

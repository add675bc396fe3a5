"""Issue 27, items 8 and 10: the figures, lists and snippets the docs keep come from their sources.

- docs/benchmarks.md: every table row is one the benchmark's report prints from bench/results.json.
"""

from __future__ import annotations

import json
import re

from bench import report
from tests.support.docs import DOCS, ROOT

RESULTS = ROOT / "bench" / "results.json"


def _generated() -> set[str]:
    data = json.loads(RESULTS.read_text())
    text = report.markdown(data, data["cpu"])
    for name in ("large", "dag", "tenants", "lanes", "semaphore"):
        text += getattr(report, f"{name}_markdown")(data[name])
    return {line for line in text.splitlines() if line.startswith("|")}


def test_item10_every_table_row_of_benchmarks_md_is_printed_by_the_benchmark():
    """The one table written by hand says what each system is; it holds no figure."""
    generated = _generated()
    tables = re.findall(r"^(?:\|.*\n)+", (DOCS / "benchmarks.md").read_text(), flags=re.M)
    rows = [row for t in tables if not t.startswith("| system | what it is |") for row in t.splitlines()]
    assert len(rows) > 50
    assert [row for row in rows if row not in generated] == []

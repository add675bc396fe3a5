"""Write the benchmark's tables into docs/benchmarks.md. Each table of the page is matched with the
table the report prints (``report.markdown`` and the sections' own) that has its header and shares the
most rows with it, or the most labels (a row's leading cells: a target, a workload and a system, whose
figures moved). A page table that shows most of its match's rows is replaced by it whole (new rows
come in); one that shows a few, chosen rows (the fixed30 runs at MAX 100 of three systems) keeps its
choice, each row replaced by the row of the same label. The one table written by hand (``| system |
what it is |``) is left alone, and so is a table the report no longer prints: the docs test names
its rows."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from bench import report

HAND_WRITTEN = "| system | what it is |"
TABLE = re.compile(r"^(?:\|.*\n)+", flags=re.M)
SECTIONS = ("large", "dag", "tenants", "lanes", "semaphore")


def generated(data: dict[str, Any]) -> str:
    """Every table the report prints from the results file ``data``, as Markdown."""
    text = report.markdown(data, data["cpu"])
    for name in SECTIONS:
        if name in data:
            text += getattr(report, f"{name}_markdown")(data[name])
    return text + "\n"


def _rows(table: str) -> list[str]:
    return table.splitlines()[2:]


def _labels(table: str) -> dict[str, str]:
    """Each row of ``table`` by its label: its first cell, or its first two where the first repeats."""
    rows = _rows(table)
    width = 1 if len({r.split("|")[1] for r in rows}) == len(rows) else 2
    return {"|".join(r.split("|")[1 : 1 + width]).strip(): r for r in rows}


def _refreshed(old: str, new: str) -> str:
    """``old`` as ``new`` says it: whole, or its chosen rows each replaced (see the module)."""
    have, fresh = _labels(old), _labels(new)
    if 2 * len(have.keys() & fresh.keys()) >= len(fresh):
        return new
    head = old.splitlines()[:2]
    return "\n".join([*head, *(fresh.get(label, row) for label, row in have.items())]) + "\n"


def sync(page: Path, data: dict[str, Any]) -> int:
    """Write the report's tables into ``page`` (see the module); how many changed."""
    tables = TABLE.findall(generated(data))
    text = page.read_text()
    changed = 0
    for old in TABLE.findall(text):
        if old.startswith(HAND_WRITTEN) or old in tables:
            continue
        header = old.splitlines()[0]
        scored = [
            (len(set(_rows(old)) & set(_rows(new))), len(_labels(old).keys() & _labels(new).keys()), new)
            for new in tables
            if new.splitlines()[0] == header
        ]
        if not scored:
            continue
        same, labels, new = max(scored, key=lambda s: s[:2])
        refreshed = _refreshed(old, new) if same or labels else old
        if refreshed != old:
            text = text.replace(old, refreshed, 1)
            changed += 1
    page.write_text(text)
    return changed

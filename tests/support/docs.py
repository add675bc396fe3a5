"""Reading the docs in tests: pages, their sections and tables, and the stack's parameters and outputs."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def pages() -> dict[str, str]:
    """Every page a user reads: README.md and docs/*.md, by name."""
    found = {"README.md": (ROOT / "README.md").read_text()}
    found.update({p.name: p.read_text() for p in sorted(DOCS.glob("*.md"))})
    return found


def section(doc: str, heading: str) -> str:
    """The text under the line ``heading`` of docs/``doc``, up to the next heading of its level or higher."""
    level = len(heading) - len(heading.lstrip("#"))
    text = ("\n" + (DOCS / doc).read_text()).split(f"\n{heading}\n", 1)[1]
    end = re.search(rf"^#{{1,{level}}} ", text, flags=re.M)
    return text[: end.start()] if end else text


def table(doc: str, after: str, header: str) -> list[list[str]]:
    """The cells of the first table after the line ``after`` whose header row starts with ``header``."""
    text = ("\n" + (DOCS / doc).read_text()).split(f"\n{after}\n", 1)[1]
    lines = text.split(f"\n{header}", 1)[1].split("\n")[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
    assert rows, f"no table {header!r} after {after!r} in {doc}"
    return rows


def names(cell: str) -> set[str]:
    """The names in backquotes in a table cell."""
    return set(re.findall(r"`([^`]+)`", cell))


class _IgnoreTags(yaml.SafeLoader):
    pass


_IgnoreTags.add_multi_constructor("!", lambda loader, suffix, node: None)


def serverless() -> dict:
    """serverless.yml, its CloudFormation tags read as nothing."""
    return yaml.load((ROOT / "serverless.yml").read_text(), Loader=_IgnoreTags)


def stack_parameters() -> set[str]:
    """The stack's parameters: serverless.yml's ``params.default``."""
    return set(serverless()["params"]["default"])

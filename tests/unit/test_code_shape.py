"""The library's shape, read from its source (docs/architecture.md): no function longer than 60
lines, and no ``type: ignore`` outside the adapters and the local tools."""

from __future__ import annotations

import ast
from pathlib import Path

LIB = Path(__file__).resolve().parents[2] / "lib" / "sluice"
LONGEST = 60


def test_no_function_is_longer_than_60_lines():
    long = []
    for path in sorted(LIB.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > LONGEST:
                    long.append(f"{path.relative_to(LIB)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def test_no_type_ignore_in_the_core():
    found = [
        f"{path.relative_to(LIB)}:{n}"
        for path in sorted(LIB.rglob("*.py"))
        if not {"adapters", "local"} & set(path.relative_to(LIB).parts[:-1])
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "type: ignore" in line
    ]
    assert not found, found

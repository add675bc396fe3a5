"""The layers of lib/sluice, read from its source with ``ast``: no import cycle among its modules, the
ports and the errors above no feature module, and no more ``type: ignore`` in the core than today."""

from __future__ import annotations

import ast
from pathlib import Path

LIB = Path(__file__).resolve().parents[2] / "lib"
ROOT = LIB / "sluice"

# What ``ports.py`` and ``errors.py`` may import of Sluice: the records, nothing with rules of its own.
LOW = {"sluice.core.errors", "sluice.core.model", "sluice.core.records", "sluice.core.external"}
# ``type: ignore`` comments outside adapters/ and local/; lower it as they go, never raise it.
CORE_IGNORES = 5


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(LIB).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """Every Sluice module ``name`` imports, wherever the import is: at the top, under
    ``TYPE_CHECKING`` or inside a function (a lazy import that dodges a cycle is still a cycle)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    found.add(f"{base}.{alias.name}")
                elif base in MODULES:
                    found.add(base)
    found.discard(name)
    return found


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            node, rest = work[-1]
            step = next(rest, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on.add(step)
                    work.append((step, iter(sorted(edges[step]))))
                elif step in on:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_sluices_modules():
    assert len(MODULES) > 50, "lib/sluice not found"
    assert _cycles({name: _imports(name) for name in MODULES}) == []


def test_the_ports_and_the_errors_import_no_feature_module():
    for name in ("sluice.core.ports", "sluice.core.errors", "sluice.core.records"):
        assert _imports(name) <= LOW, f"{name} imports {sorted(_imports(name) - LOW)}"


def test_no_more_type_ignores_in_the_core():
    core = [p for p in ROOT.rglob("*.py") if not {"adapters", "local"} & set(p.relative_to(ROOT).parts[:-1])]
    ignores = sum(line.count("type: ignore") for p in core for line in p.read_text().splitlines())
    assert ignores <= CORE_IGNORES

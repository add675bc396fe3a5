"""The packages' order (docs/architecture.md): a lower package imports nothing from a higher one.

    core < primitives < features < semaphore < launch, adapters < runtime, enqueue, concurrency, cli, ops, local

``launch`` and ``adapters`` are side by side: neither imports the other (the runtime joins them).
Read from the source, lazy imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

LIB = Path(__file__).resolve().parents[2] / "lib"
RANK = {"core": 0, "primitives": 1, "features": 2, "semaphore": 3, "launch": 4, "adapters": 4}


def _package(module: str) -> str | None:
    """The ranked package a ``sluice.…`` module is in; "outer" for the rest; None for ``sluice``."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    return parts[1] if parts[1] in RANK else "outer"


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sluice"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("sluice")}
    return found


def test_a_lower_package_imports_nothing_from_a_higher_one():
    wrong = []
    for path in sorted((LIB / "sluice").rglob("*.py")):
        module = ".".join(path.relative_to(LIB).with_suffix("").parts)
        mine = _package(module)
        if mine in (None, "outer"):
            continue
        for imported in _imports(path):
            theirs = _package(imported)
            if theirs is None or theirs == mine:
                continue
            if theirs == "outer" or RANK[theirs] >= RANK[mine]:
                wrong.append(f"{module} ({mine}) imports {imported} ({theirs})")
    assert wrong == []


def test_every_module_is_in_a_package_but_the_entry_points():
    top = sorted(p.stem for p in (LIB / "sluice").glob("*.py"))
    assert top == ["__init__", "concurrency", "enqueue", "runtime"]


def test_rate_limits_plug_in_through_the_gate():
    """The rate limits are a feature package over the core's hooks (``sluice.core.gates``): of the
    core packages, only the settings (its stack parameters) and the composition root name it; the
    launch asks the gate and knows no rate. The adapters, the CLI, ``ops`` and ``local`` are its own
    persistence and commands."""
    feature = "sluice.features.rate_limits"
    naming = []
    for path in sorted((LIB / "sluice").rglob("*.py")):
        module = ".".join(path.relative_to(LIB).with_suffix("").parts)
        if module.startswith(feature) or module.split(".")[1] in ("adapters", "cli", "ops", "local"):
            continue
        if any(m == feature or m.startswith(feature + ".") for m in _imports(path)):
            naming.append(module)
    assert naming == ["sluice.launch.settings", "sluice.runtime"]

"""Issue 26: docs/architecture.md names only modules, functions and files that exist.

Every `lib/sluice/...py` path, every `sluice.x.y` name (a module, or a name in one) and every
bare `x.py` or `adapters/x.py` it names in backquotes must be in the repository, so the page
follows the code when a module moves.
"""

from __future__ import annotations

import importlib
import re

from tests.support.docs import DOCS, ROOT

PAGE = (DOCS / "architecture.md").read_text()
# Where a bare file name may live: the package, its subpackages, the handlers, the tests' folders.
HOMES = [
    ROOT / "lib" / "sluice",
    *sorted(p for p in (ROOT / "lib" / "sluice").rglob("*") if p.is_dir() and p.name != "__pycache__"),
    ROOT / "handlers",
]
# A module by its bare name (`awaits`, `parking`): the package's own before an adapter of the same name.
MODULES: dict[str, str] = {}
for _path in sorted(
    (ROOT / "lib" / "sluice").rglob("*.py"),
    key=lambda p: (
        p.parts[-2] in ("adapters", "ops", "cli", "local") or "adapters" in p.parts,
        len(p.parts),
        str(p),
    ),
):
    if _path.stem != "__init__":
        MODULES.setdefault(_path.stem, ".".join(_path.relative_to(ROOT / "lib").with_suffix("").parts))


def _spans() -> list[str]:
    """The names in backquotes, code blocks left out."""
    return re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", PAGE, flags=re.S))


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


def test_issue26_every_module_path_architecture_md_names_exists():
    paths = set(re.findall(r"\blib/sluice/[\w/]*\.py\b", PAGE))
    assert paths, "architecture.md names no lib/sluice path"
    assert sorted(p for p in paths if not (ROOT / p).is_file()) == []


def test_issue26_every_dotted_sluice_name_architecture_md_names_exists():
    dotted = set(re.findall(r"(?<![\w/-])sluice(?:\.\w+)+", PAGE))
    # A name in a module of the package, as `module.name` (`awaits.gate`, `parking.park`).
    dotted |= {
        f"{MODULES[s.split('.')[0]]}.{s.split('.', 1)[1]}"
        for s in _spans()
        if re.fullmatch(r"\w+(\.\w+)+", s) and not s.endswith(".py") and s.split(".")[0] in MODULES
    }
    assert len(dotted) > 5
    assert sorted(d for d in dotted if not _resolves(d)) == []


def test_issue26_every_file_architecture_md_names_exists():
    files = {m for span in _spans() for m in re.findall(r"(?<![\w/.])((?:[\w]+/)*\w+\.py)\b", span)}
    files -= {f for f in files if f.startswith(("lib/", "handlers/"))}
    assert len(files) > 10
    missing = [
        f
        for f in sorted(files)
        if "*" not in f
        and not any((home / f).is_file() or (home.parent / f).is_file() for home in HOMES)
        and not (ROOT / f).is_file()
    ]
    assert missing == []

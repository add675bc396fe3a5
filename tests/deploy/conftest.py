"""The stack packaged by osls once per parameter set in a run, whichever tests and workers ask."""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from sluice.local.embedded import package_stack


@pytest.fixture(scope="session")
def packaged(tmp_path_factory) -> Callable[..., Path]:
    """``packaged(stage, **params)``: the ``.serverless`` directory of ``osls package --stage stage
    --param=k=v ...``, made the first time a parameter set is asked for and read from the run's cache
    afterwards. Under pytest-xdist the workers share the cache (the run's base temporary directory)
    and a file lock per parameter set, so two workers asking at once package it once.

    ``packaged(stage, commit=C, **params)`` packages the project as it was at commit ``C`` instead
    (``git archive``), with this tree's ``node_modules``."""
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "osls-packages"
    cache.mkdir(exist_ok=True)

    def package(stage: str, commit: str | None = None, **params: str) -> Path:
        key = hashlib.sha256(json.dumps([stage, params, commit], sort_keys=True).encode()).hexdigest()[:16]
        made = cache / f"{key}.done"
        with open(cache / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not made.exists():
                root = _checkout(commit, cache / key / "source") if commit else None
                out = package_stack(cache / key, stage=stage, params=params or None, root=root)
                made.write_text(str(out))
        return Path(made.read_text())

    return package


def _checkout(commit: str, where: Path) -> Path:
    """The project's files at ``commit`` in ``where``, with this tree's ``node_modules``."""
    root = Path(__file__).resolve().parents[2]
    archive = subprocess.run(["git", "-C", str(root), "archive", commit], capture_output=True, check=False)
    if archive.returncode != 0:
        shallow = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--is-shallow-repository"], capture_output=True, text=True
        )
        if shallow.stdout.strip() == "true":  # a CI checkout of one commit: history is not there to package
            pytest.skip(f"commit {commit} is not in this shallow clone: run `git fetch --unshallow`")
        raise RuntimeError(f"commit {commit} is not in this clone: {archive.stderr.decode().strip()}")
    where.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(where, filter="data")
    if (where / "package-lock.json").read_bytes() != (root / "package-lock.json").read_bytes():
        raise RuntimeError(f"commit {commit} locks other npm packages: it needs node_modules of its own")
    (where / "node_modules").symlink_to(root / "node_modules", target_is_directory=True)
    return where

"""The stack packaged by osls once per parameter set in a run, whichever tests and workers ask."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sluice.local.embedded import package_stack


@pytest.fixture(scope="session")
def packaged(tmp_path_factory) -> Callable[..., Path]:
    """``packaged(stage, **params)``: the ``.serverless`` directory of ``osls package --stage stage
    --param=k=v ...``, made the first time a parameter set is asked for and read from the run's cache
    afterwards. Under pytest-xdist the workers share the cache (the run's base temporary directory)
    and a file lock per parameter set, so two workers asking at once package it once."""
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "osls-packages"
    cache.mkdir(exist_ok=True)

    def package(stage: str, **params: str) -> Path:
        key = hashlib.sha256(json.dumps([stage, params], sort_keys=True).encode()).hexdigest()[:16]
        made = cache / f"{key}.done"
        with open(cache / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not made.exists():
                out = package_stack(cache / key, stage=stage, params=params or None)
                made.write_text(str(out))
        return Path(made.read_text())

    return package

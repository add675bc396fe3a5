"""Helpers of the lease contract: MemoryLeases, and DynamoLeases on moto.

``beside`` is a second adapter on the same store (another Lambda container); on moto every adapter
shares the table, on memory they share the one instance.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any

import pytest

from sluice.adapters.dynamo.lease import DynamoLeases
from sluice.adapters.dynamo.store import create_table
from sluice.adapters.memory.lease import MemoryLeases
from sluice.primitives.lease import Busy, Lease

TABLE = "lease-contract"
NOW = 1_800_000_000.0
RETENTION = 86_400


@dataclass
class Harness:
    kind: str
    client: Any = None

    def open(self, seed: int = 0) -> Any:
        if self.kind == "memory":
            return MemoryLeases(retention_seconds=RETENTION, rng=random.Random(seed))
        return DynamoLeases(self.client, TABLE, retention_seconds=RETENTION, rng=random.Random(seed))

    def beside(self, leases: Any, seed: int = 1) -> Any:
        if self.kind == "memory":
            return leases
        return DynamoLeases(self.client, TABLE, retention_seconds=RETENTION, rng=random.Random(seed))


def open_harness(request: pytest.FixtureRequest) -> Harness:
    """For a fixture parametrised over ``memory`` and ``dynamodb`` (moto, the ``session`` fixture)."""
    if request.param == "memory":
        return Harness("memory")
    client = request.getfixturevalue("session").client("dynamodb")
    create_table(client, TABLE)
    return Harness("dynamodb", client)


def try_acquire(leases: Any, *args: Any, **kwargs: Any) -> Lease | Busy:
    """The lease, or the ``Busy`` that refused it."""
    try:
        return leases.acquire(*args, **kwargs)
    except Busy as busy:
        return busy


class Inside:
    """Counts the holders between their acquire and their release, from the holders' own threads;
    ``peak`` is the most ever counted at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.peak = 0
        self.entries = 0

    def enter(self) -> None:
        with self._lock:
            self.now += 1
            self.entries += 1
            self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        with self._lock:
            self.now -= 1

"""Helpers of the semaphore contract: MemorySemaphoreStore, and DynamoSemaphoreStore on moto, both
with MemoryTokens playing Step Functions (tests/integration/test_semaphore_moto.py runs the real
token adapter against moto).

``beside`` is a second store on the same records (another Lambda container): on moto a new adapter on
the shared table, on memory the one instance. ``keys`` lists the semaphore's items left, named as the
table names them, on both.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pytest

from sluice.adapters.dynamo.codec import plain
from sluice.adapters.dynamo.semaphore import DynamoSemaphoreStore
from sluice.adapters.dynamo.store import create_table
from sluice.adapters.memory.semaphore import MemorySemaphoreStore, MemoryTokens
from sluice.core.clock import FakeClock
from sluice.semaphore.model import pool_of
from sluice.semaphore.step import Semaphores

TABLE = "semaphore-contract"
GRACE = 60.0


def arn(name: str) -> str:
    return f"arn:aws:states:us-east-1:123456789012:execution:workflow:{name}"


class CountingTokens(MemoryTokens):
    """Counts the executions between their SendTaskSuccess and their ``leave`` (just before they call
    release): ``peak`` is the most ever inside the section at once."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = 0
        self.peak = 0

    def _on_delivered(self, execution_arn: str) -> None:
        self.inside += 1
        self.peak = max(self.peak, self.inside)

    def leave(self) -> None:
        with self._lock:
            self.inside -= 1


@dataclass
class Harness:
    kind: str
    client: Any = None

    def store(self, seed: int = 0, per_shard: int = 2) -> Any:
        if self.kind == "memory":
            return MemorySemaphoreStore(per_shard=per_shard, rng=random.Random(seed))
        return DynamoSemaphoreStore(
            self.client, TABLE, per_shard=per_shard, rng=random.Random(seed), sleep=lambda _: None
        )

    def beside(self, store: Any, seed: int = 1) -> Any:
        if self.kind == "memory":
            return store
        return DynamoSemaphoreStore(
            self.client, TABLE, per_shard=store.slots.per_shard, rng=random.Random(seed), sleep=lambda _: None
        )

    def keys(self, store: Any) -> set[str]:
        """Semaphore items left (slots items aside)."""
        if self.kind == "memory":
            return store.keys()
        page = self.client.scan(TableName=TABLE, ConsistentRead=True)
        assert "LastEvaluatedKey" not in page
        return {plain(raw)["pk"] for raw in page["Items"] if not plain(raw)["pk"].startswith("SLOTS#")}


def open_harness(request: pytest.FixtureRequest) -> Harness:
    if request.param == "memory":
        return Harness("memory")
    client = request.getfixturevalue("session").client("dynamodb")
    create_table(client, TABLE)
    return Harness("dynamodb", client)


@dataclass
class World:
    """Semaphores on one store, MemoryTokens, one FakeClock."""

    harness: Harness
    store: Any
    tokens: CountingTokens
    clock: FakeClock

    def semaphores(self, seed: int = 0) -> Semaphores:
        store = self.store if seed == 0 else self.harness.beside(self.store, seed)
        return Semaphores(store, self.tokens, self.clock, grace=GRACE, rng=random.Random(seed))

    def holders(self, name: str) -> set[str]:
        """Execution names holding a permit, from the permits and the records."""
        status = self.semaphores().status(name)
        return {h.execution_arn.rsplit(":", 1)[1] for h in status.holders}

    def running(self, name: str) -> int:
        return self.store.slots.occupancy(pool_of(name)).running

    def delivered(self) -> list[str]:
        return [a.rsplit(":", 1)[1] for a in self.tokens.delivered()]

"""Helpers of the slots contract: MemorySlots, and DynamoSlots on moto.

``snapshot`` reads a pool at one instant, to check invariants while threads race: under the memory
adapter's lock, and on moto with a Scan, which the test emulator runs as one operation
(``serialise_dynamodb`` in tests/support/moto_patches.py serialises it with every write).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from sluice.adapters.dynamo.codec import plain
from sluice.adapters.dynamo.slots import DynamoSlots, pool_pk, to_occupancy
from sluice.adapters.dynamo.store import create_table
from sluice.adapters.memory.slots import MemorySlots
from sluice.core.errors import SlotsFull
from sluice.primitives.slots import Occupancy, claim_any

TABLE = "slots-contract"
NOW = 1_800_000_000.0


@dataclass
class Harness:
    kind: str
    client: Any = None
    sleeps: list[float] = field(default_factory=list)

    def open(self, per_shard: int = 2, seed: int = 0) -> Any:
        """An adapter on its own store (memory) or on the shared table (moto)."""
        if self.kind == "memory":
            return MemorySlots(per_shard=per_shard, rng=random.Random(seed))
        return DynamoSlots(
            self.client, TABLE, per_shard=per_shard, rng=random.Random(seed), sleep=self.sleeps.append
        )

    def beside(self, slots: Any, seed: int = 1) -> Any:
        """A second claimer or planner on the same store as ``slots`` (another Lambda container)."""
        if self.kind == "memory":
            return slots
        return DynamoSlots(
            self.client, TABLE, per_shard=slots.per_shard, rng=random.Random(seed), sleep=self.sleeps.append
        )

    def snapshot(self, slots: Any, pool: str) -> Occupancy:
        if self.kind == "memory":
            return slots.occupancy(pool)
        page = self.client.scan(TableName=TABLE, ConsistentRead=True)
        assert "LastEvaluatedKey" not in page  # one page: one instant
        raws = [plain(raw) for raw in page["Items"]]
        meta = next((r for r in raws if r["pk"] == pool_pk(pool)), None)
        shards = [r for r in raws if r["pk"].startswith(pool_pk(pool) + "#")]
        return to_occupancy(pool, meta, shards, int(meta["shards"]) if meta else 0)


def open_harness(request: pytest.FixtureRequest) -> Harness:
    """For a fixture parametrised over ``memory`` and ``dynamodb`` (moto, the ``session`` fixture)."""
    if request.param == "memory":
        return Harness("memory")
    client = request.getfixturevalue("session").client("dynamodb")
    create_table(client, TABLE)
    return Harness("dynamodb", client)


def claim_until_full(slots: Any, pool: str, name: str, seed: int) -> bool:
    """One claimer: try until it holds a slot, or a look shows no room anywhere."""
    rng = random.Random(seed)
    while True:
        try:
            claim_any(slots, pool, name, NOW, rng)
            return True
        except SlotsFull:
            if slots.look(pool).free == 0:
                return False


def in_threads(count: int, work: Callable[[int], Any]) -> list[Any]:
    """Run ``work(i)`` for i < count in threads started together; their results, or raise the first error."""
    start = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = work(i)
        except BaseException as exc:  # surfaced in the test's thread below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return results


def assert_at_rest(view: Occupancy) -> None:
    """Not frozen: caps add up to the limit and no shard holds more than its cap."""
    assert not view.frozen
    assert view.caps == view.limit
    assert all(s.size <= s.cap for s in view.shards), [(s.cap, s.size) for s in view.shards]

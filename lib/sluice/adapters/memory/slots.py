"""Slots (``sluice.primitives.slots``) in memory, for unit tests and benchmarks. One lock makes every operation
atomic, so a change of limit is planned and written at once; it passes the same contract suite as
``DynamoSlots`` (tests/contract/test_slots_contract.py). Not part of the Lambda package."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

from sluice.core.errors import ConditionFailed, SlotsFull
from sluice.primitives.slots import (
    DEFAULT_PER_SHARD,
    Capacity,
    Occupancy,
    Plan,
    Shard,
    check_pool,
    plan_caps,
    sample_shards,
)


@dataclass
class _Shard:
    cap: int = 0
    holders: dict[str, float] = field(default_factory=dict)


@dataclass
class _Pool:
    limit: int
    per_shard: int
    shard_count: int = 0
    frozen: bool = False
    version: int = 0
    shards: dict[int, _Shard] = field(default_factory=dict)
    stamp: tuple[float, ...] = ()


class MemorySlots:
    def __init__(self, *, per_shard: int = DEFAULT_PER_SHARD, rng: random.Random | None = None) -> None:
        if per_shard < 1:
            raise ValueError(f"per_shard must be >= 1, got {per_shard}")
        self.per_shard = per_shard
        self.rng = rng or random.Random()
        self._lock = threading.Lock()
        self._pools: dict[str, _Pool] = {}

    # -- reads ------------------------------------------------------------------------------------

    def look(self, pool: str) -> Occupancy:
        with self._lock:
            found = self._pools.get(check_pool(pool))
            indexes = sample_shards(found.shard_count, self.rng) if found else []
            return self._occupancy(pool, indexes)

    def occupancy(self, pool: str) -> Occupancy:
        with self._lock:
            found = self._pools.get(check_pool(pool))
            return self._occupancy(pool, range(found.shard_count) if found else [])

    def _occupancy(self, pool: str, indexes: range | list[int]) -> Occupancy:
        found = self._pools.get(pool)
        if found is None:
            return Occupancy(pool=pool)
        shards = tuple(
            Shard(i, found.shards[i].cap, dict(found.shards[i].holders)) for i in indexes if i in found.shards
        )
        return Occupancy(
            pool=pool,
            limit=found.limit,
            shard_count=found.shard_count,
            per_shard=found.per_shard,
            frozen=found.frozen,
            version=found.version,
            shards=shards,
            read=len(indexes),
            stamp=found.stamp,
        )

    def _shard(self, pool: str, shard: int) -> _Shard | None:
        found = self._pools.get(check_pool(pool))
        if shard < 0:
            raise ValueError(f"shard index {shard}")
        return found.shards.get(shard) if found else None

    # -- holders ----------------------------------------------------------------------------------

    def claim(self, pool: str, shard: int, name: str, now: float) -> None:
        _check_name(name)
        with self._lock:
            item = self._shard(pool, shard)
            if item is not None and name in item.holders:
                return
            if item is None or len(item.holders) >= item.cap:
                raise SlotsFull(item.cap if item else 0)
            item.holders[name] = now

    def release(self, pool: str, shard: int, name: str) -> bool:
        _check_name(name)
        with self._lock:
            item = self._shard(pool, shard)
            if item is None or name not in item.holders:
                return False
            del item.holders[name]
            return True

    def swap(self, pool: str, shard: int, old: str, new: str, now: float) -> bool:
        if _check_name(old) == _check_name(new):
            raise ValueError(f"swap of {old!r} with itself")
        with self._lock:
            item = self._shard(pool, shard)
            holders = item.holders if item else {}
            if old not in holders:
                return new in holders
            if new in holders:
                raise ConditionFailed(f"{new!r} holds a slot on shard {shard} of {pool!r} already")
            if item is None or len(holders) > item.cap:
                raise SlotsFull(item.cap if item else 0)
            del holders[old]
            holders[new] = now
            return True

    # -- the limit --------------------------------------------------------------------------------

    def set_limit(self, capacity: Capacity) -> Plan | None:
        return self._plan(capacity.pool, capacity)

    def rebalance(self, pool: str) -> Plan | None:
        return self._plan(check_pool(pool), None)

    def restamp(self, pool: str, stamp: tuple[float, ...], replaces: tuple[float, ...]) -> bool:
        with self._lock:
            found = self._pools.get(check_pool(pool))
            if found is None or found.stamp != replaces:
                return False
            found.stamp, found.version = stamp, found.version + 1
            return True

    def _plan(self, pool: str, target: Capacity | None) -> Plan | None:
        with self._lock:
            found = self._pools.get(pool)
            if found is None:
                if target is None:
                    return None
                found = _Pool(limit=target.limit, per_shard=self.per_shard)
            elif target is not None and target.refused_by(self._occupancy(pool, [])):
                return None  # a limit from a newer reading is in force
            limit = found.limit if target is None else target.limit
            loads = [
                (found.shards[i].cap, len(found.shards[i].holders)) if i in found.shards else (0, 0)
                for i in range(found.shard_count)
            ]
            plan = plan_caps(limit, found.per_shard, loads)
            unchanged = (found.limit, found.frozen, found.shard_count) == (
                limit,
                plan.frozen,
                plan.shard_count,
            )
            stamp = found.stamp if target is None else target.stamp
            if found.version and not plan.moves and unchanged and stamp == found.stamp:
                return plan
            for move in plan.moves:
                found.shards.setdefault(move.shard, _Shard()).cap = move.new
            found.limit, found.frozen, found.shard_count = limit, plan.frozen, plan.shard_count
            found.stamp = stamp
            found.version += 1
            self._pools[pool] = found
            return plan


def _check_name(name: str) -> str:
    if not name:
        raise ValueError("a holder needs a name")
    return name

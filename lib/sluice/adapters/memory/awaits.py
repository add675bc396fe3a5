"""``MemoryStore``'s side of awaits (``sluice.features.awaits.AwaitStore``), for tests and the benchmark."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from sluice.adapters.memory.table import MemoryTable
from sluice.features.awaits import Waiter


class MemoryAwaits:
    def __init__(self, table: MemoryTable) -> None:
        self.table = table
        self.waiters_by_id: dict[str, Waiter] = {}
        self.awaited: dict[str, set[str]] = {}  # every key a waiter ever parked on (the flag stays)
        self.awaiting: set[str] = set()

    def is_awaited(self, key: str) -> bool:
        """Called under the lock by a release: a waiter ever parked on ``key``."""
        return key in self.awaited

    def park_waiter(self, waiter: Waiter, missing: Sequence[str]) -> None:
        with self.table.lock:
            existing = self.waiters_by_id.get(waiter.message_id)
            if existing is None or not existing.parked:
                self.waiters_by_id[waiter.message_id] = waiter
            for key in missing:
                self.awaited.setdefault(key, set()).add(waiter.message_id)
            self.awaiting.add(waiter.message_id)

    def waiters_on(self, key: str) -> frozenset[str]:
        with self.table.lock:
            return frozenset(self.awaited.get(key, ()))

    def waiting(self) -> frozenset[str]:
        with self.table.lock:
            return frozenset(self.awaiting)

    def waiters(self, message_ids: Iterable[str]) -> list[Waiter]:
        with self.table.lock:
            found = [self.waiters_by_id[m] for m in set(message_ids) if m in self.waiters_by_id]
        return sorted(found, key=lambda w: (w.parked_at, w.message_id))

    def release_waiter(self, waiter: Waiter, *, how: str, reason: str | None, now: float) -> bool:
        with self.table.lock:
            current = self.waiters_by_id.get(waiter.message_id)
            first = current is not None and current.parked
            if first and current is not None:
                self.waiters_by_id[waiter.message_id] = replace(
                    current, released_at=now, how=how, reason=reason
                )
            for key in waiter.awaits:
                self.awaited.get(key, set()).discard(waiter.message_id)
            self.awaiting.discard(waiter.message_id)
            return first

"""``MemoryStore``'s side of awaits (``sluice.features.awaits.AwaitStore``), for tests and the benchmark."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from sluice.adapters.memory.table import MemoryTable
from sluice.features.awaits import Waiter


class MemoryAwaits:
    def __init__(self, table: MemoryTable) -> None:
        self.table = table
        self.waiters_by_entry: dict[str, Waiter] = {}
        self.awaited: dict[str, set[str]] = {}  # every key a waiter ever parked on (the flag stays)
        self.awaiting: set[str] = set()

    def is_awaited(self, key: str) -> bool:
        """Called under the lock by a release: a waiter ever parked on ``key``."""
        return key in self.awaited

    def park_waiter(self, waiter: Waiter, missing: Sequence[str]) -> Waiter:
        with self.table.lock:
            existing = self.waiters_by_entry.get(waiter.entry)
            if existing is not None and (existing.key, existing.message_id) != (
                waiter.key,
                waiter.message_id,
            ):
                waiter = replace(waiter, by_name=True)  # another key's waiter holds the message id
                existing = self.waiters_by_entry.get(waiter.entry)
            if existing is None or not existing.parked:
                self.waiters_by_entry[waiter.entry] = waiter
            for key in missing:
                self.awaited.setdefault(key, set()).add(waiter.entry)
            self.awaiting.add(waiter.entry)
        return waiter

    def waiters_on(self, key: str) -> frozenset[str]:
        with self.table.lock:
            return frozenset(self.awaited.get(key, ()))

    def waiting(self) -> frozenset[str]:
        with self.table.lock:
            return frozenset(self.awaiting)

    def waiters(self, entries: Iterable[str]) -> list[Waiter]:
        with self.table.lock:
            found = [self.waiters_by_entry[e] for e in set(entries) if e in self.waiters_by_entry]
        return sorted(found, key=lambda w: (w.parked_at, w.message_id))

    def release_waiter(self, waiter: Waiter, *, how: str, reason: str | None, now: float) -> bool:
        with self.table.lock:
            current = self.waiters_by_entry.get(waiter.entry)
            first = current is not None and current.parked
            if first and current is not None:
                self.waiters_by_entry[waiter.entry] = replace(
                    current, released_at=now, how=how, reason=reason
                )
            for key in waiter.awaits:
                self.awaited.get(key, set()).discard(waiter.entry)
            self.awaiting.discard(waiter.entry)
            return first

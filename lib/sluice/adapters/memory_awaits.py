"""``MemoryStore``'s side of awaits (``sluice.awaits.AwaitStore``), for tests and the benchmark."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import replace

from sluice.awaits import Waiter
from sluice.model import PayloadRecord


class MemoryAwaits:
    _lock: threading.Lock
    _payloads: dict[str, PayloadRecord]

    def _await_rooms(self) -> tuple[dict[str, Waiter], dict[str, set[str]], set[str]]:
        if not hasattr(self, "_waiters"):
            self._waiters: dict[str, Waiter] = {}
            self._awaited: dict[str, set[str]] = {}
            self._awaiting: set[str] = set()
        return self._waiters, self._awaited, self._awaiting

    def payloads(self, keys: Iterable[str]) -> dict[str, PayloadRecord]:
        with self._lock:
            return {k: self._payloads[k] for k in set(keys) if k in self._payloads}

    def park_waiter(self, waiter: Waiter, missing: Sequence[str]) -> None:
        with self._lock:
            waiters, awaited, awaiting = self._await_rooms()
            existing = waiters.get(waiter.message_id)
            if existing is None or not existing.parked:
                waiters[waiter.message_id] = waiter
            for key in missing:
                awaited.setdefault(key, set()).add(waiter.message_id)
            awaiting.add(waiter.message_id)

    def waiters_on(self, key: str) -> frozenset[str]:
        with self._lock:
            return frozenset(self._await_rooms()[1].get(key, ()))

    def waiting(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._await_rooms()[2])

    def waiters(self, message_ids: Iterable[str]) -> list[Waiter]:
        with self._lock:
            waiters = self._await_rooms()[0]
            found = [waiters[m] for m in set(message_ids) if m in waiters]
        return sorted(found, key=lambda w: (w.parked_at, w.message_id))

    def release_waiter(self, waiter: Waiter, *, how: str, reason: str | None, now: float) -> bool:
        with self._lock:
            waiters, awaited, awaiting = self._await_rooms()
            current = waiters.get(waiter.message_id)
            first = current is not None and current.parked
            if first and current is not None:
                waiters[waiter.message_id] = replace(current, released_at=now, how=how, reason=reason)
            for key in waiter.awaits:
                awaited.get(key, set()).discard(waiter.message_id)
            awaiting.discard(waiter.message_id)
            return first

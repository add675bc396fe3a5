"""Leases (``sluice.primitives.lease``) in memory, for unit tests and benchmarks. One lock makes each item write
atomic, as DynamoDB's conditional writes are; it passes the same contract suite as ``DynamoLeases``
(tests/contract/test_lease_contract.py). Not part of the Lambda package."""

from __future__ import annotations

import random
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sluice.primitives.lease import (
    DEFAULT_RETENTION,
    Busy,
    Holding,
    LastError,
    Lease,
    LeaseLost,
    LeaseSlot,
    attempt_order,
    check_holder,
    check_key,
    check_limit,
    check_scope,
    check_ttl,
    decode_state,
    encode_state,
)


class MemoryLeases:
    def __init__(
        self, *, retention_seconds: int = DEFAULT_RETENTION, rng: random.Random | None = None
    ) -> None:
        self.retention_seconds = retention_seconds
        self.rng = rng or random.Random()
        self._lock = threading.Lock()
        # (scope, key, slot) -> the item; state kept as JSON text, as the table keeps it
        self._items: dict[tuple[str, str, int], tuple[LeaseSlot, str | None]] = {}

    def _slot(self, scope: str, key: str, slot: int) -> LeaseSlot:
        found = self._items.get((scope, key, slot))
        if found is None:
            return LeaseSlot(slot)
        item, text = found
        return replace(item, state=decode_state(text))

    def acquire(self, scope: str, key: str, holder: str, now: float, ttl: float, limit: int = 1) -> Lease:
        check_scope(scope)
        check_key(key)
        check_holder(holder)
        check_limit(limit)
        until = now + check_ttl(ttl)
        seen = self.inspect(scope, key, limit) if limit > 1 else ()
        busy: list[Holding] = []
        for slot in attempt_order(limit, holder, seen, now, self.rng):
            with self._lock:  # one item write at a time, as one UpdateItem
                old = self._slot(scope, key, slot)
                if not old.admits(holder, now):
                    busy.append(Holding(str(old.holder), old.expires_at, slot))
                    continue
                text = self._items.get((scope, key, slot), (None, None))[1]
                held = replace(old, holder=holder, expires_at=until, acquired_at=now, version=old.version + 1)
                self._items[(scope, key, slot)] = (replace(held, state=None), text)
            previous = Holding(old.holder, old.expires_at, slot) if old.holder not in (None, holder) else None
            return Lease(
                scope=scope,
                key=key,
                slot=slot,
                holder=holder,
                version=held.version,
                acquired_at=now,
                expires_at=until,
                state=old.state,
                last_error=old.last_error,
                previous=previous,
            )
        raise Busy(scope, key, sorted(busy, key=lambda h: h.slot), limit)

    def renew(self, lease: Lease, now: float, ttl: float) -> Lease:
        until = now + check_ttl(ttl)
        with self._lock:
            found = self._items.get((lease.scope, lease.key, lease.slot))
            if found is None or found[0].holder != lease.holder:
                raise LeaseLost(lease)
            self._items[(lease.scope, lease.key, lease.slot)] = (
                replace(found[0], expires_at=until),
                found[1],
            )
        return replace(lease, expires_at=until)

    def release(
        self, lease: Lease, *, state: Mapping[str, Any] | None = None, error: LastError | None = None
    ) -> bool:
        text = None if state is None else encode_state(state)  # checked before anything is written
        with self._lock:
            found = self._items.get((lease.scope, lease.key, lease.slot))
            if found is None or found[0].holder != lease.holder:
                return False
            item, kept = found
            item = replace(
                item,
                holder=None,
                expires_at=lease.expires_at + self.retention_seconds,
                last_error=item.last_error if error is None else error,
            )
            self._items[(lease.scope, lease.key, lease.slot)] = (item, kept if text is None else text)
            return True

    def inspect(self, scope: str, key: str, limit: int = 1) -> tuple[LeaseSlot, ...]:
        check_scope(scope)
        check_key(key)
        with self._lock:
            return tuple(self._slot(scope, key, i) for i in range(check_limit(limit)))

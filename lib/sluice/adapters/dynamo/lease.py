"""Leases (``sluice.primitives.lease``) in the Sluice table (partition key ``pk``).

    LEASE#<scope>#<key>#<i>    holder, expires_at, acquired_at, version, scope, key, slot,
                               state (JSON text), last_error (map)          (i in 0 .. limit - 1)

The scope has no ``#`` and the item index is last, so no two (scope, key, i) share an item key.
Each operation is one UpdateItem on one item, conditioned on that item alone:

    acquire  SET holder, expires_at, acquired_at, version = version + 1      ReturnValues ALL_OLD
             IF attribute_not_exists(holder) OR expires_at <= :now OR holder = :me
    renew    SET expires_at = :until                                         IF holder = :me
    release  REMOVE holder SET expires_at = lease expiry + retention
             [, state] [, last_error]                                        IF holder = :me

A refused acquire returns the item as it was (``ReturnValuesOnConditionCheckFailure``), so ``Busy``
names the holder and its expiry without another read. With limit 1 an acquire is one write; with
limit N it is one consistent BatchGetItem (to find the item this holder holds already, and the free
ones) and at most N conditional writes. An item is well under 1 KB without state: one write unit
(state adds up to ``STATE_MAX_BYTES``, about 4 more).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from botocore.exceptions import ClientError

from sluice.adapters.dynamo.codec import plain, values
from sluice.adapters.dynamo.table import Table
from sluice.adapters.errors import error_code, translated
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

__all__ = ["DynamoLeases", "lease_pk", "to_slot"]

ACQUIRE = (
    "SET holder = :me, expires_at = :until, acquired_at = :now, "
    "version = if_not_exists(version, :zero) + :one, #scope = :scope, #key = :key, #slot = :slot"
)
FREE_OR_MINE = "attribute_not_exists(holder) OR expires_at <= :now OR holder = :me"
NAMES = {"#scope": "scope", "#key": "key", "#slot": "slot"}


def lease_pk(scope: str, key: str, slot: int) -> str:
    if slot < 0:
        raise ValueError(f"lease item index {slot}")
    return f"LEASE#{check_scope(scope)}#{check_key(key)}#{slot}"


def to_slot(slot: int, raw: Mapping[str, Any] | None) -> LeaseSlot:
    """A ``LeaseSlot`` from a plain item (None: never written)."""
    if not raw:
        return LeaseSlot(slot)
    holder = raw.get("holder")
    return LeaseSlot(
        slot=slot,
        holder=None if holder is None else str(holder),
        expires_at=float(raw.get("expires_at", 0)),
        acquired_at=float(raw.get("acquired_at", 0)),
        version=int(raw.get("version", 0)),
        state=decode_state(raw.get("state")),
        last_error=LastError.from_dict(raw.get("last_error")),
    )


class DynamoLeases(Table):
    def __init__(
        self,
        client: Any,
        table_name: str,
        *,
        retention_seconds: int = DEFAULT_RETENTION,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(client, table_name, retention_seconds=retention_seconds, sleep=sleep)
        self.rng = rng or random.Random()

    def acquire(self, scope: str, key: str, holder: str, now: float, ttl: float, limit: int = 1) -> Lease:
        check_scope(scope)
        check_key(key)
        check_holder(holder)
        check_limit(limit)
        until = now + check_ttl(ttl)
        seen = self.inspect(scope, key, limit) if limit > 1 else ()
        busy: list[Holding] = []
        for slot in attempt_order(limit, holder, seen, now, self.rng):
            ok, was = self._acquire_item(scope, key, slot, holder, now, until)
            old = to_slot(slot, was)
            if ok:
                previous = (
                    Holding(old.holder, old.expires_at, slot) if old.holder not in (None, holder) else None
                )
                return Lease(
                    scope=scope,
                    key=key,
                    slot=slot,
                    holder=holder,
                    version=old.version + 1,
                    acquired_at=now,
                    expires_at=until,
                    state=old.state,
                    last_error=old.last_error,
                    previous=previous,
                )
            if old.holder is not None:
                busy.append(Holding(old.holder, old.expires_at, slot))
        raise Busy(scope, key, sorted(busy, key=lambda h: h.slot), limit)

    def _acquire_item(
        self, scope: str, key: str, slot: int, holder: str, now: float, until: float
    ) -> tuple[bool, dict[str, Any]]:
        """One conditional write: (True, the item before) or (False, the item that refused)."""
        request = {
            "TableName": self.table,
            "Key": {"pk": {"S": lease_pk(scope, key, slot)}},
            "UpdateExpression": ACQUIRE,
            "ConditionExpression": FREE_OR_MINE,
            "ExpressionAttributeNames": NAMES,
            "ExpressionAttributeValues": values(
                me=holder, until=until, now=now, zero=0, one=1, scope=scope, key=key, slot=slot
            ),
            "ReturnValues": "ALL_OLD",
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        with translated("UpdateItem"):
            try:
                answer = self.client.update_item(**request)
            except ClientError as exc:
                if error_code(exc) != "ConditionalCheckFailedException":
                    raise
                return False, plain(exc.response.get("Item") or {})
        return True, plain(answer.get("Attributes") or {})

    def renew(self, lease: Lease, now: float, ttl: float) -> Lease:
        until = now + check_ttl(ttl)
        renewed = self._update_if(
            lease_pk(lease.scope, lease.key, lease.slot),
            "SET expires_at = :until",
            "holder = :me",
            values(until=until, me=lease.holder),
            names={},
        )
        if not renewed:
            raise LeaseLost(lease)
        return Lease(
            scope=lease.scope,
            key=lease.key,
            slot=lease.slot,
            holder=lease.holder,
            version=lease.version,
            acquired_at=lease.acquired_at,
            expires_at=until,
            state=lease.state,
            last_error=lease.last_error,
            previous=lease.previous,
        )

    def release(
        self, lease: Lease, *, state: Mapping[str, Any] | None = None, error: LastError | None = None
    ) -> bool:
        sets = ["expires_at = :keep"]
        named: dict[str, Any] = {"me": lease.holder, "keep": lease.expires_at + self.retention_seconds}
        names: dict[str, str] = {}
        if state is not None:
            sets.append("#state = :state")
            named["state"] = encode_state(state)  # checked before anything is written
            names["#state"] = "state"
        if error is not None:
            sets.append("last_error = :error")
            named["error"] = {**error.to_dict(), "at": Decimal(repr(error.at))}
        return self._update_if(
            lease_pk(lease.scope, lease.key, lease.slot),
            "REMOVE holder SET " + ", ".join(sets),
            "holder = :me",
            values(**named),
            names=names,
        )

    def inspect(self, scope: str, key: str, limit: int = 1) -> tuple[LeaseSlot, ...]:
        pks = [lease_pk(scope, key, i) for i in range(check_limit(limit))]
        found = {str(raw["pk"]): raw for raw in self._batch_get(pks)}
        return tuple(to_slot(i, found.get(pk)) for i, pk in enumerate(pks))

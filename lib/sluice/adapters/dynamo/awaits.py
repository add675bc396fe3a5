"""Awaits in the Sluice table (``sluice.features.awaits.AwaitStore``).

    WAIT#<entry>        the waiter: message_id, key, body, group_id, attributes, awaits (list),
                        run_anyway, parked_at; once released: released_at, how, reason, expires_at.
                        The entry (``Waiter.entry``) is its message id, or the name it runs under
                        where a waiter of another key holds that id
    AWAITED#<key>       waiters: string set of the entries of the waiters parked on that key
    AWAITING            waiters: string set of the entries of every parked waiter

    PAYLOAD#<key>       awaited: true, once any waiter parked on the key (never removed)

A park is one transaction (WAIT#, AWAITING, one AWAITED# per missing key: at most 100 items, so
at most 98 awaited keys). The flags on the missing keys' payload records ride in it when they fit
(up to 49 keys: 2 + 2 × 49 = 100 items), else go first in transactions of their own. Its sets are ``ADD``ed, so a redelivered message parks again as a no-op;
a WAIT# item still parked is kept as it is (its ``parked_at`` is the first park's, which the
horizon counts from); one released before is parked afresh. The release marks WAIT# released (conditional on it not being released yet)
and ``DELETE``s it from the sets, in one transaction too. Why the park needs no condition on the
awaited keys: ``sluice.features.awaits``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from sluice.adapters.dynamo.codec import is_payload, opt_float, payload_pk, to_payload, values
from sluice.adapters.dynamo.table import TableRef
from sluice.core.model import PayloadRecord
from sluice.features.awaits import Waiter

AWAITING_PK = "AWAITING"
TRANSACTION_ITEMS = 100  # TransactWriteItems takes at most 100 actions


def wait_pk(entry: str) -> str:
    return f"WAIT#{entry}"


def awaited_pk(key: str) -> str:
    return f"AWAITED#{key}"


class AwaitsTable:
    def __init__(self, db: TableRef) -> None:
        self.db = db

    def payloads(self, keys: Iterable[str]) -> dict[str, PayloadRecord]:
        wanted = sorted(set(keys))
        found = self.db.batch_get([payload_pk(k) for k in wanted])
        records = [to_payload(raw, str(raw["pk"])[len("PAYLOAD#") :]) for raw in found if is_payload(raw)]
        return {r.key: r for r in records}

    def park_waiter(self, waiter: Waiter, missing: Sequence[str]) -> Waiter:
        ids = {"SS": [waiter.entry]}
        awaited = sorted(set(missing))
        items = [
            self._wait_item(waiter),
            *(self._add_item(pk, ids) for pk in [AWAITING_PK, *map(awaited_pk, awaited)]),
        ]
        # Each key it waits for is flagged on its payload record (set once, never removed), so the
        # release of a key's run reads its waiters only when someone ever waited for it. Flagged
        # before the park commits: a release that does not see the flag committed before it, and
        # the launcher's read after the park sees that release's receipt (see the module docstring).
        flags = [self._flag_item(key) for key in awaited]
        if len(items) + len(flags) <= TRANSACTION_ITEMS:
            items.extend(flags)
        else:
            for at in range(0, len(flags), TRANSACTION_ITEMS):
                self.db.transact(flags[at : at + TRANSACTION_ITEMS])
        reasons = self.db.transact(items)
        if reasons is not None:
            held = self.db.get(wait_pk(waiter.entry)) or {}
            if not waiter.by_name and (held.get("key"), held.get("message_id")) != (
                waiter.key,
                waiter.message_id,
            ):
                # Another key's waiter holds the id (parked, or released: its release may still be
                # taking the id off the sets, which would leave this one unindexed).
                return self.park_waiter(replace(waiter, by_name=True), missing)
            # Parked already (a redelivery): add it to the sets alone, which changes nothing if
            # they have it, and mends them if a release was interrupted.
            self.db.transact(items[1:])
        return waiter

    def _wait_item(self, waiter: Waiter) -> dict[str, Any]:
        return {
            "Update": {
                "TableName": self.db.table,
                "Key": {"pk": {"S": wait_pk(waiter.entry)}},
                # Parked afresh unless still parked: a redelivery keeps the first park's time.
                "UpdateExpression": "SET message_id = :m, #key = :key, body = :body, group_id = :group, "
                "attributes = :attributes, awaits = :awaits, run_anyway = :anyway, "
                "parked_at = :now "
                "REMOVE released_at, how, reason, expires_at",
                "ConditionExpression": "attribute_not_exists(pk) OR "
                "(attribute_exists(released_at) AND #key = :key AND message_id = :m)",
                "ExpressionAttributeNames": {"#key": "key"},
                "ExpressionAttributeValues": values(
                    m=waiter.message_id,
                    key=waiter.key,
                    body=waiter.body,
                    group=waiter.group_id,
                    attributes=json.dumps(waiter.attributes, sort_keys=True),
                    awaits=list(waiter.awaits),
                    anyway=waiter.run_anyway,
                    now=waiter.parked_at,
                ),
            }
        }

    def _add_item(self, pk: str, ids: dict[str, Any]) -> dict[str, Any]:
        return {
            "Update": {
                "TableName": self.db.table,
                "Key": {"pk": {"S": pk}},
                "UpdateExpression": "ADD waiters :ids",
                "ExpressionAttributeValues": {":ids": ids},
            }
        }

    def _flag_item(self, key: str) -> dict[str, Any]:
        return {
            "Update": {
                "TableName": self.db.table,
                "Key": {"pk": {"S": payload_pk(key)}},
                "UpdateExpression": "SET awaited = :yes",
                "ExpressionAttributeValues": {":yes": {"BOOL": True}},
            }
        }

    def waiters_on(self, key: str) -> frozenset[str]:
        raw = self.db.get(awaited_pk(key))
        return frozenset(raw.get("waiters", ())) if raw else frozenset()

    def waiting(self) -> frozenset[str]:
        raw = self.db.get(AWAITING_PK)
        return frozenset(raw.get("waiters", ())) if raw else frozenset()

    def waiters(self, entries: Iterable[str]) -> list[Waiter]:
        found = self.db.batch_get([wait_pk(e) for e in sorted(set(entries))])
        waiters = [_to_waiter(raw) for raw in found if "message_id" in raw]
        return sorted(waiters, key=lambda w: (w.parked_at, w.message_id))

    def release_waiter(self, waiter: Waiter, *, how: str, reason: str | None, now: float) -> bool:
        ids = {"SS": [waiter.entry]}
        marked = self.db.update_if(
            wait_pk(waiter.entry),
            "SET released_at = :now, how = :how, reason = :reason, expires_at = :expires",
            "attribute_exists(pk) AND attribute_not_exists(released_at)",
            values(now=now, how=how, reason=reason or "", expires=int(now) + self.db.retention_seconds),
            names={},
        )
        removals = [
            {
                "Update": {
                    "TableName": self.db.table,
                    "Key": {"pk": {"S": pk}},
                    "UpdateExpression": "DELETE waiters :ids",
                    "ExpressionAttributeValues": {":ids": ids},
                }
            }
            for pk in [AWAITING_PK, *(awaited_pk(k) for k in sorted(set(waiter.awaits)))]
        ]
        self.db.transact(removals)
        return marked


def _to_waiter(raw: dict[str, Any]) -> Waiter:
    return Waiter(
        message_id=str(raw["message_id"]),
        key=str(raw.get("key", "")),
        body=str(raw.get("body", "")),
        group_id=str(raw.get("group_id", "")),
        attributes=json.loads(raw.get("attributes") or "{}"),
        awaits=tuple(raw.get("awaits", ())),
        run_anyway=bool(raw.get("run_anyway", False)),
        parked_at=float(raw.get("parked_at", 0)),
        released_at=opt_float(raw.get("released_at")),
        how=raw.get("how"),
        reason=raw.get("reason") or None,
        by_name=raw["pk"] != wait_pk(str(raw["message_id"])),
    )

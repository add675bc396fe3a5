"""The waiting room: deferred duplicates parked in the table instead of held on the queue.

    PARK#<message id>   the message (body, group, attributes), its key and the holder it waits for
    PARKED              holders: string set of the executions that have messages waiting
    EXEC#<holder>       parked: string set of the message ids waiting for it

Parking is one transaction, conditional on the holder's claim still being live, so a message is
never parked behind an execution that has already been released:

    launcher                                   completion / reconciliation
    ────────                                   ───────────────────────────
    park(M behind H): IF EXEC#H live            release(H): EXEC#H ended
      PARK#M, EXEC#H.parked += M, PARKED += H   wake(H): re-send PARK#M to the queue,
    delete M from the queue                       mark PARK#M woken with EXEC#H.parked −= M,
                                                  PARKED −= H IF EXEC#H.parked is empty

A park that commits between the release's read of EXEC#H and its write changes the set the
release read: the release is conditioned on that set's size, fails, reads again and releases with
the park in the set it returns (``sluice.adapters.dynamo.release``). A wake-up lost to a crash
after the release: reconciliation finds H in PARKED with its execution ended and wakes it; if H's
name is claimed again first (its own message, back after a rollback), the new claim keeps the
parked set (``sluice.adapters.dynamo.store._carry_parked``) and its end wakes them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sluice.adapters.dynamo.codec import execution_pk, park_pk, parked_item, to_parked, values
from sluice.adapters.dynamo.table import TableRef
from sluice.core.model import ParkedMessage, PayloadState

PARKED_PK = "PARKED"


class ParkingTable:
    def __init__(self, db: TableRef) -> None:
        self.db = db

    def park(self, parked: ParkedMessage) -> bool:
        """Park ``parked`` behind its holder. True when it is parked (now, or by an earlier delivery
        of the same message); False when the holder is no longer live: run the message instead."""
        put = parked_item(parked)
        items: list[dict[str, Any]] = [
            {
                "Update": {
                    "TableName": self.db.table,
                    "Key": {"pk": {"S": execution_pk(parked.holder)}},
                    "UpdateExpression": "ADD parked :ids",
                    "ConditionExpression": "#state IN (:claimed, :running)",
                    "ExpressionAttributeNames": {"#state": "state"},
                    "ExpressionAttributeValues": {
                        ":ids": {"SS": [parked.message_id]},
                        **values(claimed=PayloadState.CLAIMED.value, running=PayloadState.RUNNING.value),
                    },
                }
            },
            {
                "Put": {
                    "TableName": self.db.table,
                    "Item": put,
                    # A copy woken from an earlier holder may be parked again behind a new one.
                    "ConditionExpression": "attribute_not_exists(pk) OR holder <> :holder OR attribute_exists(woken_at)",
                    "ExpressionAttributeValues": {":holder": put["holder"]},
                }
            },
            {
                "Update": {
                    "TableName": self.db.table,
                    "Key": {"pk": {"S": PARKED_PK}},
                    "UpdateExpression": "ADD holders :holders",
                    "ExpressionAttributeValues": {":holders": {"SS": [parked.holder]}},
                }
            },
        ]
        reasons = self.db.transact(items)
        if reasons is None:
            return True
        return reasons[1].get("Code") == "ConditionalCheckFailed"  # parked already, by a redelivery

    def parked_messages(self, holder: str, message_ids: Iterable[str]) -> list[ParkedMessage]:
        """The messages still waiting for ``holder`` (not woken, not re-parked behind another)."""
        found = self.db.batch_get([park_pk(m) for m in sorted(set(message_ids))])
        waiting = [to_parked(raw) for raw in found if raw.get("holder") == holder and "woken_at" not in raw]
        return sorted(waiting, key=lambda p: (p.parked_at, p.message_id))

    def unpark(self, holder: str, message_ids: Iterable[str], *, now: float) -> None:
        """Mark the re-sent messages woken (TTL removes them later), take them off ``holder``'s
        ``parked`` set, and take ``holder`` off the index once nothing else waits behind it."""
        expires = int(now) + self.db.retention_seconds
        # Only the ids this wake-up read: the holder's name may have been claimed again meanwhile
        # (its own message, back after a rollback), carrying them, and more parked behind the new
        # claim, which that claim's end must wake.
        for message_id in sorted(set(message_ids)):
            self._unpark_one(holder, message_id, expires, now)
        self._leave_the_index(holder)

    def _unpark_one(self, holder: str, message_id: str, expires: int, now: float) -> None:
        """The woken mark and the id's removal from ``parked`` in one transaction: a copy of the
        message parked behind the same holder (live again) can land before it or after it, never
        between, where the removal would take the new park's id out unwoken::

            waker (unpark H, [m])                    another launcher (a copy of m, H live again)
            PARK#m woken                             park m behind H: PARK#m unwoken, parked {m}
            parked −= m   → {} : m parked, unwoken, on no index; nothing wakes it
        """
        remove = self._update(
            execution_pk(holder), "DELETE parked :ids", "attribute_exists(pk)", {":ids": {"SS": [message_id]}}
        )
        mark = self._update(
            park_pk(message_id),
            "SET woken_at = :now, expires_at = :expires",
            "holder = :holder AND attribute_not_exists(woken_at)",
            values(now=now, expires=expires, holder=holder),
        )
        reasons = self.db.transact([mark, remove])
        if reasons is None or reasons[0].get("Code") != "ConditionalCheckFailed":
            return  # woken; or the holder's record is gone, with nothing to take the id out of
        # Not waiting for this holder any more (woken by another, parked behind another, expired):
        # its id leaves ``parked`` unless a copy parked behind the holder again meanwhile.
        waiting_still = {
            "TableName": self.db.table,
            "Key": {"pk": {"S": park_pk(message_id)}},
            "ConditionExpression": "attribute_not_exists(pk) OR holder <> :holder OR attribute_exists(woken_at)",
            "ExpressionAttributeValues": values(holder=holder),
        }
        self.db.transact([{"ConditionCheck": waiting_still}, remove])

    def _update(
        self, pk: str, expression: str, condition: str, named_values: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "Update": {
                "TableName": self.db.table,
                "Key": {"pk": {"S": pk}},
                "UpdateExpression": expression,
                "ConditionExpression": condition,
                "ExpressionAttributeValues": named_values,
            }
        }

    def _leave_the_index(self, holder: str) -> None:
        self.db.transact(
            [
                {
                    "Update": {
                        "TableName": self.db.table,
                        "Key": {"pk": {"S": PARKED_PK}},
                        "UpdateExpression": "DELETE holders :holders",
                        "ExpressionAttributeValues": {":holders": {"SS": [holder]}},
                    }
                },
                {
                    "ConditionCheck": {
                        "TableName": self.db.table,
                        "Key": {"pk": {"S": execution_pk(holder)}},
                        "ConditionExpression": "attribute_not_exists(parked)",
                    }
                },
            ]
        )  # refused: messages wait behind the holder still, and it stays on the index for them

    def parked_holders(self) -> frozenset[str]:
        raw = self.db.get(PARKED_PK)
        return frozenset(raw.get("holders", ())) if raw else frozenset()

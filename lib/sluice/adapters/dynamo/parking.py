"""The waiting room: deferred duplicates parked in the table instead of held on the queue.

    PARK#<entry>        the message (body, group, attributes), its key and the holder it waits for;
                        the entry is the name it runs under (``ParkedMessage.entry``), or its
                        message id for an item an earlier version parked
    PARKED              holders: string set of the executions that have messages waiting
    EXEC#<holder>       parked: string set of the entries waiting for it

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

from collections.abc import Iterable, Sequence
from typing import Any

from sluice.adapters.dynamo.codec import execution_pk, park_pk, parked_item, refused, to_parked, values
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
                        ":ids": {"SS": [parked.entry]},
                        **values(claimed=PayloadState.CLAIMED.value, running=PayloadState.RUNNING.value),
                    },
                }
            },
            {
                "Put": {
                    "TableName": self.db.table,
                    "Item": put,
                    # Refused only to a redelivery of the copy parked here. Another copy is parked
                    # over it: one woken (from an earlier holder, or this one's name claimed again),
                    # or one a wake-up re-sent while it is on its way to mark this item woken, which
                    # its mark, conditional on the copy it re-sent, now leaves parked.
                    "ConditionExpression": (
                        "attribute_not_exists(pk) OR holder <> :holder OR attribute_exists(woken_at) "
                        "OR attribute_not_exists(copy_id) OR copy_id <> :copy"
                    ),
                    "ExpressionAttributeValues": {":holder": put["holder"], ":copy": {"S": parked.copy_id}},
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
        return refused(reasons[1])  # parked already: a redelivery

    def parked_messages(self, holder: str, entries: Iterable[str]) -> list[ParkedMessage]:
        """The messages still waiting for ``holder`` (not woken, not re-parked behind another)."""
        found = self.db.batch_get([park_pk(e) for e in sorted(set(entries))])
        waiting = [to_parked(raw) for raw in found if raw.get("holder") == holder and "woken_at" not in raw]
        return sorted(waiting, key=lambda p: (p.parked_at, p.message_id))

    def unpark(
        self, holder: str, entries: Iterable[str], *, woken: Sequence[ParkedMessage] = (), now: float
    ) -> None:
        """Mark the re-sent copies (``woken``) woken (TTL removes them later), take every id the
        release read that no longer waits for ``holder`` off its ``parked`` set, and take ``holder``
        off the index once nothing else waits behind it."""
        expires = int(now) + self.db.retention_seconds
        copies = {p.entry: p.copy_id for p in woken}
        # Only the ids this wake-up read: the holder's name may have been claimed again meanwhile
        # (its own message, back after a rollback), carrying them, and more parked behind the new
        # claim, which that claim's end must wake.
        for entry in sorted(set(entries)):
            remove = self._update(
                execution_pk(holder),
                "DELETE parked :ids",
                "attribute_exists(pk)",
                {":ids": {"SS": [entry]}},
            )
            if entry not in copies or not self._mark_woken(
                holder, entry, copies[entry], remove, now, expires
            ):
                self._remove_unless_waiting(holder, entry, remove)
        self._leave_the_index(holder)

    def _mark_woken(
        self, holder: str, entry: str, copy_id: str, remove: dict[str, Any], now: float, expires: int
    ) -> bool:
        """The woken mark and the id's removal from ``parked``, in one transaction, conditional on
        the copy re-sent. Apart, or on the id alone, a copy parked behind the same holder (live
        again) between the re-send and the mark is lost::

            waker (unpark H, [m])                    another launcher (H's name claimed again)
            re-send m (copy c2)
                                                     c2 refused by H: park m behind H
            PARK#m woken, parked −= m        → m parked nowhere, or its PARK# marked woken unsent
        """
        same_copy = "copy_id = :copy" if copy_id else "attribute_not_exists(copy_id)"
        named = values(now=now, expires=expires, holder=holder, **({"copy": copy_id} if copy_id else {}))
        mark = self._update(
            park_pk(entry),
            "SET woken_at = :now, expires_at = :expires",
            f"holder = :holder AND attribute_not_exists(woken_at) AND {same_copy}",
            named,
        )
        reasons = self.db.transact([mark, remove])
        # Refused for the mark: another copy parked, or woken by another. Refused for the removal
        # alone: the holder's record is gone, with nothing to take the id out of.
        return reasons is None or not refused(reasons[0])

    def _remove_unless_waiting(self, holder: str, entry: str, remove: dict[str, Any]) -> None:
        """Take the entry off ``parked`` unless a copy waits behind ``holder`` under it (parked again)."""
        waiting_still = {
            "TableName": self.db.table,
            "Key": {"pk": {"S": park_pk(entry)}},
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

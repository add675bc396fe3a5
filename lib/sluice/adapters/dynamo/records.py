"""Records in the Sluice table that are neither slots nor leases: reads of payload and execution
records, a payload's duplicate and invalid marks, and reconciliation's figures in LEDGER.

    PAYLOAD#<key>   duplicates, last_duplicate; already_done, last_already_done (run-once
                    messages of a key that had SUCCEEDED); state INVALID with a reason (only while
                    unleased; with an expiry unless a once-run's success keeps it: ``once_by``)
    EXEC#<name>     read here, written with the slots and leases (sluice.adapters.dynamo.store)
    SIGHT#<message id>  a message refused by a holder that may have ended, sent back for the
                    consistency window: ``key``, ``sighted_at``, the ``receipt`` of the receive that
                    saw it (a digest), an expiry (sluice.launch.message_branches)
    EFFECTS#<name>  read here (the effects an execution's release sent, sluice.features.effects), written by
                    that release (sluice.adapters.dynamo.store)
    LEDGER          external (with external_count and external_from, its listing's numbers),
                    counts (the numbering counter), drift, reconciled_at

Reconciliations number each listing on both sides with ``counts`` (ADD, atomic), and a count is
saved merged with the one saved (``sluice.core.external``: the newer listing, or the larger count when
the two listings overlap), never ordered by a launcher's clock.
"""

from __future__ import annotations

from collections.abc import Iterable

from sluice.adapters.dynamo.codec import (
    effects_pk,
    execution_pk,
    is_payload,
    payload_pk,
    to_effects,
    to_execution,
    to_payload,
    values,
)
from sluice.adapters.dynamo.launch_slots import LEDGER_PK
from sluice.adapters.dynamo.table import TableRef
from sluice.adapters.errors import translated
from sluice.core.errors import ConditionFailed, TransientError
from sluice.core.external import ExternalCount
from sluice.core.model import EffectsLog, ExecutionRecord, PayloadRecord, PayloadState
from sluice.features.receipts import left_released

# The condition of every write that sets ``expires_at`` on ``PAYLOAD#<key>`` (a release, a dead
# letter's ``record_invalid``): a once-key's success is kept without expiry (sluice.features.receipts). A write
# refused on it is made again without the expiry; the race is drawn in
# ``sluice.adapters.dynamo.release.ReleasesTable._release_items`` and in ``record_invalid``.
UNLESS_ONCE_DONE = "attribute_not_exists(once_by)"
# A key a claim dropped unstarted left RELEASED over an earlier end, still unleased.
LEFT_RELEASED = (
    "attribute_not_exists(holder) AND #state = :released AND attribute_exists(receipt_state)"
    " AND attribute_not_exists(once_unknown)"
)
SAVE_ROUNDS = 5  # read-merge-write rounds of a reconciliation's figures when others keep saving


def adds_nothing(merged: ExternalCount, saved: ExternalCount, latest: bool) -> bool:
    """A reconciliation's count merged with the one saved leaves that one as it is, and a count
    numbered higher was saved (drift and time are that one's): there is nothing to write. A slow
    reconciler whose every write was overtaken by a newer save returns here rather than retrying
    until it gives up."""
    return merged == saved and not latest


class RecordsTable:
    def __init__(self, db: TableRef) -> None:
        self.db = db

    def payload(self, key: str) -> PayloadRecord | None:
        raw = self.db.get(payload_pk(key))
        return to_payload(raw) if is_payload(raw) else None

    def execution(self, name: str) -> ExecutionRecord | None:
        raw = self.db.get(execution_pk(name))
        return to_execution(raw) if raw else None

    def effects(self, name: str) -> EffectsLog | None:
        raw = self.db.get(effects_pk(name))
        return to_effects(raw) if raw else None

    def executions(self, names: Iterable[str]) -> dict[str, ExecutionRecord]:
        found = self.db.batch_get([execution_pk(n) for n in sorted(set(names))])
        return {r.name: r for r in map(to_execution, found)}

    # -- small records ----------------------------------------------------------------------------

    def record_duplicate(self, *, key: str, message_id: str, now: float) -> None:
        with translated("UpdateItem"):
            self.db.client.update_item(
                TableName=self.db.table,
                Key={"pk": {"S": payload_pk(key)}},
                UpdateExpression="SET updated_at = :now, last_duplicate = :mid ADD duplicates :one",
                ExpressionAttributeValues=values(now=now, mid=message_id, one=1),
            )

    def first_sighting(self, *, key: str, message_id: str, receipt: str, now: float) -> bool:
        expires = int(now) + self.db.retention_seconds  # cleanup only: a lost sighting is made again
        return self.db.update_if(
            f"SIGHT#{message_id}",
            "SET #key = :key, sighted_at = if_not_exists(sighted_at, :now), expires_at = :expires, receipt = :receipt",
            "attribute_not_exists(pk) OR receipt = :receipt",  # a retry of this receive's write
            values(key=key, now=now, expires=expires, receipt=receipt),
            names={"#key": "key"},
        )

    def record_already_done(
        self, *, key: str, message_id: str, now: float, seen: PayloadRecord | None = None
    ) -> None:
        count = "SET updated_at = :now, last_already_done = :mid ADD already_done :one"
        if seen is not None and left_released(seen):
            # Left RELEASED by a claim dropped unstarted over a recorded success: settled at its
            # receipt's end while still so (the timeline: sluice.features.receipts); a claim taken
            # since keeps its state, and the count is made alone.
            settle = count.replace("SET ", "SET #state = receipt_state, ", 1)
            named = values(now=now, mid=message_id, one=1, released=PayloadState.RELEASED.value)
            if self.db.update_if(payload_pk(key), settle, LEFT_RELEASED, named):
                return
        with translated("UpdateItem"):
            self.db.client.update_item(
                TableName=self.db.table,
                Key={"pk": {"S": payload_pk(key)}},
                UpdateExpression=count,
                ExpressionAttributeValues=values(now=now, mid=message_id, one=1),
            )

    def record_invalid(self, *, key: str, reason: str, now: float) -> None:
        # A live lease keeps its state: the running payload is not the invalid message. A once-key's
        # success keeps its record without expiry (sluice.features.receipts): the mark only, then. Each write
        # names the case it covers, so a lease taken or given up between the two writes leaves
        # the record as one of them would (``once_by`` is never removed):
        #
        #   dead letter of k                                release of once-run e1 of k
        #   ────────────────                                ───────────────────────────
        #   SET …, expires_at IF no holder AND no once_by ✗ (e1 holds k)
        #                                                   SUCCEEDED: once_by = e1, holder removed
        #   SET … (no expiry) IF no holder AND once_by    ✓ INVALID, kept for good
        mark = "SET #key = :key, #state = :invalid, reason = :reason, updated_at = :now"
        named = values(key=key, invalid=PayloadState.INVALID.value, reason=reason, now=now)
        names = {"#key": "key", "#state": "state"}
        if self.db.update_if(
            payload_pk(key),
            mark + ", expires_at = :exp",
            f"attribute_not_exists(holder) AND {UNLESS_ONCE_DONE}",
            {**named, **values(exp=int(now) + self.db.retention_seconds)},
            names=names,
        ):
            return
        self.db.update_if(
            payload_pk(key), mark, "attribute_not_exists(holder) AND attribute_exists(once_by)", named, names
        )

    def next_count(self) -> int:
        with translated("UpdateItem"):
            answer = self.db.client.update_item(
                TableName=self.db.table,
                Key={"pk": {"S": LEDGER_PK}},
                UpdateExpression="ADD counts :one",
                ExpressionAttributeValues=values(one=1),
                ReturnValues="UPDATED_NEW",
            )
        return int(answer["Attributes"]["counts"]["N"])

    def save_reconciliation(
        self, *, external: int, drift: int, now: float, count: int = 0, listed_after: int | None = None
    ) -> bool:
        """The external count merged with LEDGER's (``ExternalCount.merged``). One write when its
        listing began after LEDGER's count was numbered (the usual tick after tick); else read,
        merge, and write while LEDGER still holds the count merged with. Drift and the time are
        written only when no count numbered higher was saved. Overtaken in each of SAVE_ROUNDS
        rounds and still adding to what is saved (six reconcilers on one save), it gives up."""
        mine = ExternalCount(external, count, listed_after)
        newer = "attribute_not_exists(external_count) OR external_count < :began"
        if self._save_figures(mine, drift, now, newer, values(began=mine.began)):
            return True
        for round_ in range(SAVE_ROUNDS + 1):
            seen = self.db.get(LEDGER_PK) or {}
            saved = ExternalCount(
                int(seen.get("external", 0)),
                int(seen.get("external_count", 0)),
                int(seen.get("external_from", 0)),  # absent: unknown
            )
            # Compare-and-set on the figures merged with: a save between the read and this write is
            # merged again, never overwritten.
            same = "external_count = :was_count AND #external = :was_external AND "
            same += (
                "external_from = :was_from"
                if "external_from" in seen
                else "attribute_not_exists(external_from)"
            )
            was = values(was_count=saved.count, was_external=saved.external, was_from=saved.began)
            if "external_from" not in seen:
                was.pop(":was_from")
            if "external_count" not in seen:
                same, was = "attribute_not_exists(external_count)", {}
            latest = count >= saved.count
            merged = mine.merged(saved)
            if adds_nothing(merged, saved, latest):
                return False
            if round_ == SAVE_ROUNDS:
                break  # overtaken in every round, and still adding to what is saved: give up
            if self._save_figures(merged, drift if latest else None, now, same, was):
                return latest
        raise TransientError(
            "UpdateItem: LEDGER's external count kept changing",
            operation="UpdateItem",
            code="ConditionalCheckFailed",
        )

    def _save_figures(
        self, counted: ExternalCount, drift: int | None, now: float, condition: str, condition_values: dict
    ) -> bool:
        """Write LEDGER's external count (and drift and the time, unless ``drift`` is None) IF
        ``condition``; False when it failed."""
        sets = "#external = :external, external_count = :count, external_from = :from_"
        figures = values(external=counted.external, count=counted.count, from_=counted.began)
        if drift is not None:
            sets += ", drift = :drift, reconciled_at = :now"
            figures.update(values(drift=drift, now=now))
        try:
            with translated("UpdateItem"):
                self.db.client.update_item(
                    TableName=self.db.table,
                    Key={"pk": {"S": LEDGER_PK}},
                    UpdateExpression="SET " + sets,
                    ConditionExpression=condition,
                    ExpressionAttributeNames={"#external": "external"},
                    ExpressionAttributeValues={**figures, **condition_values},
                )
        except ConditionFailed:
            return False
        return True

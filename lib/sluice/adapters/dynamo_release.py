"""The end of a holding, in the launcher's table: the release (slot, lease, execution record,
receipt and effects mark in one transaction) and the adoption of an execution running again.

    release(N):  SLOTS#launcher#i  REMOVE holders.N          IF N holds a slot there
                 PAYLOAD#<key>     REMOVE holder, receipt = N IF holder = N (and, unless told,
                                                              not flagged as awaited: then again,
                                                              and its waiters are read)
                                   SET expires_at            IF no once_by (a once-key's success
                                                              is kept: then again, without it)
                                   SET once_unknown, once_by (a once-run that vanished: outcome
                                                              unknown, sluice.receipts)
                 EXEC#N            SET state, ended_at       IF CLAIMED or RUNNING (a fence: and
                                                              the claim version and mark judged)
                                                              and its parked set as read
                 EFFECTS#N         PUT (when effects were sent before it)
                 CKEY#<ckey>       DELETE holders N          (a keyed run: sluice.keys)
                 SLOTS#lane-<l>#j  REMOVE holders.N          (a run in a lane: sluice.lanes)

A repeated or late event finds N no longer holding: the transaction fails and nothing is freed
twice. Mixed into ``sluice.adapters.dynamodb.DynamoStore``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sluice.adapters.dynamo_codec import (
    effects_item,
    execution_pk,
    only_once,
    payload_pk,
    to_execution,
    values,
)
from sluice.adapters.dynamo_lanes import LaneSlots
from sluice.adapters.dynamo_launch_slots import POOL, LaunchSlots
from sluice.adapters.dynamo_slots import pool_pk, swap_item
from sluice.model import (
    EFFECTS_RETENTION_SECONDS,
    ClaimFence,
    ExecutionRecord,
    HandOver,
    PayloadState,
    Successor,
    record_expiry,
)
from sluice.receipts import asked_once
from sluice.records import ReceiptOutput

LIVE = (PayloadState.CLAIMED.value, PayloadState.RUNNING.value)
# The condition of every write that sets ``expires_at`` on ``PAYLOAD#<key>`` (a release here, a dead
# letter's ``record_invalid``): a once-key's success is kept without expiry (sluice.receipts). A write
# refused on it is made again without the expiry; the race is drawn in ``_release_items``.
UNLESS_ONCE_DONE = "attribute_not_exists(once_by)"
PARK_RACE_RETRIES = 3  # a release tried again when messages parked behind it as it was on its way

ADOPT_ROUNDS = 3  # an adoption whose slot conditions failed (the pool moved) is tried again


@dataclass(frozen=True)
class _Ending:
    """How a run ended, as a release writes it down."""

    state: PayloadState
    now: float
    error: str | None
    cause: str | None
    ended_at: float | None
    fence: ClaimFence | None
    confirm: Callable[[ExecutionRecord], bool] | None
    output: Callable[[ExecutionRecord], ReceiptOutput | None]
    started_at: float | None = None
    outcome_unknown: bool = False  # its execution vanished: a run-once one marks its key (sluice.receipts)


def _failed(reason: dict[str, Any]) -> bool:
    return reason.get("Code") == "ConditionalCheckFailed"


def _released_from(reason: dict[str, Any], name: str) -> bool:
    """A swap refused because ``name`` no longer holds a slot on the shard (released by another)."""
    holders = (reason.get("Item") or {}).get("holders", {}).get("M", {})
    return _failed(reason) and "Item" in reason and name not in holders


MARKS = ("awaited", "once_by")  # what refuses a release's lease item while its run still holds it


def marks(reason: dict[str, Any], name: str) -> frozenset[str]:
    """The marks a release's lease item was refused for while ``name`` still holds it: the
    ``awaited`` flag (its waiters must be read), the ``once_by`` mark (no expiry may be set). Empty
    when it was not refused, or refused because ``name`` no longer holds the lease."""
    found = reason.get("Item") or {}
    if not _failed(reason) or found.get("holder", {}).get("S") != name:
        return frozenset()
    return frozenset(m for m in MARKS if m in found)


class ReleasesTable:
    """Release and adoption; the store provides the table, its reads and its transactions."""

    table: str
    retention_seconds: int
    launch_slots: LaunchSlots
    lane_slots: LaneSlots
    execution: Callable[[str], ExecutionRecord | None]
    _transact: Callable[[list[dict[str, Any]]], list[dict[str, Any]] | None]
    _batch_get: Callable[[list[str]], list[dict[str, Any]]]
    _claim_items: Callable[..., list[dict[str, Any]]]
    key_release_item: Callable[[str, str], dict[str, Any]]
    key_adopt_item: Callable[[str, str], dict[str, Any]]

    def release(
        self,
        *,
        name: str,
        state: PayloadState,
        now: float,
        error: str | None = None,
        cause: str | None = None,
        ended_at: float | None = None,
        started_at: float | None = None,
        fence: ClaimFence | None = None,
        confirm: Callable[[ExecutionRecord], bool] | None = None,
        output: Callable[[ExecutionRecord], ReceiptOutput | None] | None = None,
        outcome_unknown: bool = False,
    ) -> ExecutionRecord | None:
        ending = _Ending(
            state,
            now,
            error,
            cause,
            ended_at,
            fence,
            confirm,
            asked_once(output),
            started_at,
            outcome_unknown,
        )
        return self._end(self.execution(name), ending).released

    def hand_over(
        self,
        *,
        name: str,
        state: PayloadState,
        now: float,
        offer: Callable[[ExecutionRecord, bool], Successor | None],
        error: str | None = None,
        cause: str | None = None,
        ended_at: float | None = None,
        started_at: float | None = None,
        confirm: Callable[[ExecutionRecord], bool] | None = None,
        output: Callable[[ExecutionRecord], ReceiptOutput | None] | None = None,
    ) -> HandOver:
        # The record and the pool item in one read: a frozen or paused pool has no slot to pass on,
        # and the caller then receives nothing (no receive spent on a message that cannot start).
        found = {raw["pk"]: raw for raw in self._batch_get([execution_pk(name), pool_pk(POOL)])}
        raw = found.get(execution_pk(name))
        pool = found.get(pool_pk(POOL)) or {}
        room = bool(pool) and not pool.get("frozen") and int(pool.get("limit", 0)) > 0
        ending = _Ending(state, now, error, cause, ended_at, None, confirm, asked_once(output), started_at)
        handed = self._end(to_execution(raw) if raw else None, ending, offer=offer, room=room)
        freed = handed.released
        if freed is not None and not handed.claimed and freed.shard is not None and room:
            self.launch_slots.freed(freed.shard, name, pool)  # the caller's own claim tries it first
        return handed

    def _end(
        self,
        record: ExecutionRecord | None,
        ending: _Ending,
        *,
        offer: Callable[[ExecutionRecord, bool], Successor | None] | None = None,
        room: bool = False,
    ) -> HandOver:
        """Release ``record`` as read (with a successor in the same transaction when ``offer`` gives
        one), trying again as the races below require."""
        awaited = kept = False
        successor: Successor | None = None
        for _ in range(PARK_RACE_RETRIES + 2):
            if record is None or not record.state.holds_lease:
                return HandOver(None)
            if ending.confirm is not None and record.adopted_at is not None and not ending.confirm(record):
                return HandOver(None)
            if offer is not None:
                if ending.state.ended:
                    ending.output(record)  # its effects are sent first, so the offer may receive one
                successor, offer = offer(record, room and record.shard is not None), None
                if successor is not None and successor.key == record.key:
                    successor = None  # one item cannot be written twice in one transaction
                if successor is not None and successor.name == record.name:
                    successor = None  # its own message back: it ran, and is settled its own way
            items = self._release_items(record, ending, awaited=awaited, kept=kept)
            claim_at = len(items)
            if successor is not None:
                assert record.shard is not None
                items[0] = swap_item(self.table, POOL, record.shard, record.name, successor.name, ending.now)
                items.extend(self._successor_items(successor, record.shard, ending.now))
            reasons = self._transact(items)
            if reasons is None:
                if successor is not None:
                    self.launch_slots.took(record.shard, successor.name, ending.now)  # type: ignore[arg-type]
                return HandOver(replace(record, awaited=awaited), claimed=successor is not None)
            name = record.name
            held = marks(reasons[1], name)
            if (_failed(reasons[1]) and not held) or _released_from(reasons[0], name):
                return HandOver(None)  # someone released it first
            if successor is not None and (_failed(reasons[0]) or any(map(_failed, reasons[claim_at:]))):
                successor = None  # no room on the shard, or its lease or record refused: alone
                continue
            if held:
                # A waiter parked on the key: release again, then read its waiters. A once-key's
                # success: release again, setting no expiry.
                awaited, kept = awaited or "awaited" in held, kept or "once_by" in held
                continue
            # A message parked behind it between the read above and the transaction: the record
            # returned must list it, or nothing would wake it. Read again and release again.
            if not _failed(reasons[2]):
                return HandOver(None)
            fresh = self.execution(name)
            if fresh is None or not fresh.state.holds_lease or fresh.parked == record.parked:
                return HandOver(None)  # released by someone else, or renewed (a fence) meanwhile
            record = fresh
        return HandOver(None)

    def _release_items(
        self, record: ExecutionRecord, ending: _Ending, *, awaited: bool, kept: bool = False
    ) -> list[dict[str, Any]]:
        """The release of ``record`` as read: its slot first, its lease second, its record third.
        The lease is refused for a key flagged as awaited unless ``awaited`` (the caller then reads
        its waiters), and for a once-key's success unless ``kept`` (then no expiry is set)."""
        state, now, error, cause = ending.state, ending.now, ending.error, ending.cause
        ended_at, fence, output = ending.ended_at, ending.fence, ending.output
        name = record.name
        expires = int(now) + self.retention_seconds
        ended = ended_at if ended_at is not None else now
        payload_set = "SET #state = :state, updated_at = :now"
        payload_remove = " REMOVE holder"
        payload_condition = "holder = :name" + ("" if awaited else " AND attribute_not_exists(awaited)")
        if record.once and state is PayloadState.SUCCEEDED:
            # A once-key's success is kept: it must never run again (sluice.receipts).
            payload_set += ", once_by = if_not_exists(once_by, :name)"
            payload_remove += ", expires_at"
        elif record.once and ending.outcome_unknown:
            # A once-run that vanished may have SUCCEEDED: no once-claim of the key until the
            # operator says (its claim's condition reads the mark), and the record is kept as a
            # success would be. Written by the holder's own release, so no once-claim got in between.
            payload_set += ", once_unknown = :name, once_by = if_not_exists(once_by, :name)"
            payload_remove += ", expires_at"
        elif kept:
            payload_remove += ", expires_at"
        else:
            # No write may put a once-key's success back under TTL; reading PAYLOAD#<key> first
            # would cost every end a read, so the expiry is set under a condition instead and the
            # release tried again without it when refused (``kept``). Only a run holding the lease
            # writes ``once_by``, and this run holds it: the mark cannot appear after the check.
            #
            #   once-run e1 of k              plain run e2 of k (or any other run, later)
            #   ────────────────              ──────────────────────────────────────────
            #   release(e1) SUCCEEDED:
            #     once_by = e1, no expiry
            #                                 claim(e2): REMOVE expires_at (a live record)
            #                                 release(e2): SET expires_at IF no once_by    ✗
            #                                 release(e2) again, kept: no expiry           ✓
            payload_set += ", expires_at = :expires"
            payload_condition += f" AND {UNLESS_ONCE_DONE}"
        exec_set = "SET #state = :state, ended_at = :ended, expires_at = :expires"
        if ending.started_at is not None:
            exec_set += ", started_at = if_not_exists(started_at, :started)"
        payload_values = values(state=state.value, now=now, name=name, expires=expires)
        if ":expires" not in payload_set:
            del payload_values[":expires"]
        payload_names = {"#state": "state"}
        exec_names = {"#state": "state"}
        kept: ReceiptOutput | None = None
        if state.ended:
            # The receipt (sluice.receipts): in the items this transaction writes anyway.
            payload_set += ", receipt = :name, receipt_state = :state"
            if state is PayloadState.SUCCEEDED:
                payload_set += ", succeeded_by = if_not_exists(succeeded_by, :name)"
            kept = output(record)
        exec_values = values(
            state=state.value,
            ended=ended,
            expires=record_expiry(state, now=now, retention_seconds=self.retention_seconds),
            live0=LIVE[0],
            live1=LIVE[1],
        )
        if ending.started_at is not None:
            exec_values[":started"] = {"N": repr(float(ending.started_at))}
        exec_condition = "#state IN (:live0, :live1)"
        # Its parked messages as read (the set only grows while it is live): see ``release``.
        if record.parked:
            parked_condition = " AND size(parked) = :nparked"
            exec_values[":nparked"] = {"N": str(len(record.parked))}
        else:
            parked_condition = " AND attribute_not_exists(parked)"
        names = exec_names
        if kept is not None:
            exec_set += ", output_size = :osize"
            exec_values[":osize"] = {"N": str(kept.size or 0)}
            if kept.inline is not None:
                exec_set += ", #output = :output"
                exec_values[":output"] = {"S": kept.inline}
                names["#output"] = "output"
            if kept.pointer is not None:
                exec_set += ", output_ref = :oref"
                exec_values[":oref"] = {"S": kept.pointer}
        if error:
            payload_set += ", reason = :reason"
            payload_values[":reason"] = {"S": error}
            exec_set += ", #error = :error"
            exec_values[":error"] = {"S": error}
            names["#error"] = "error"
        if cause:
            exec_set += ", #cause = :cause"
            exec_values[":cause"] = {"S": cause[:4_000]}
            names["#cause"] = "cause"
        if fence is not None:
            # A claim judged unstarted (by reconciliation, or by its own launcher rolling it back):
            # released only if nobody renewed it since (the same mark, the same version).
            exec_condition = "#state = :live0 AND claim_version = :version"
            exec_values.update(values(version=fence.claim_version))
            if fence.suspect_since is not None:
                exec_condition += " AND suspect_since = :suspect"
                exec_values.update(values(suspect=fence.suspect_since))
        items = [
            self.launch_slots.release_item(name, record.shard),
            {
                "Update": {
                    "TableName": self.table,
                    "Key": {"pk": {"S": payload_pk(record.key)}},
                    "UpdateExpression": payload_set + payload_remove,
                    "ConditionExpression": payload_condition,
                    "ExpressionAttributeNames": payload_names,
                    "ExpressionAttributeValues": payload_values,
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            },
            {
                "Update": {
                    "TableName": self.table,
                    "Key": {"pk": {"S": execution_pk(name)}},
                    "UpdateExpression": exec_set,
                    "ConditionExpression": exec_condition + parked_condition,
                    "ExpressionAttributeNames": names,
                    "ExpressionAttributeValues": exec_values,
                }
            },
        ]
        if record.ckey is not None:
            items.append(self.key_release_item(record.ckey, name))
        if record.lane is not None and record.lane_shard is not None:
            items.append(self.lane_slots.release_item(record.lane, record.lane_shard, name))
        if kept is not None and kept.effects is not None:
            # The effects sent before this release (sluice.effects): their durable mark, in its
            # transaction. A separate item, so that a later claim of the same name (a redelivered
            # message, which Puts EXEC#<name> afresh) cannot erase it.
            items.append(
                {
                    "Put": {
                        "TableName": self.table,
                        "Item": effects_item(kept.effects, expires_at=int(now) + EFFECTS_RETENTION_SECONDS),
                    }
                }
            )
        return items

    def _successor_items(self, successor: Successor, shard: int, now: float) -> list[dict[str, Any]]:
        """A claim's lease and record (``_claim_items`` but its slot, which the swap takes)."""
        claim = self._claim_items(
            successor.key,
            successor.name,
            successor.message_id,
            shard,
            now,
            successor.claim_expires_at,
            successor.arn,
        )
        if successor.once:
            only_once(claim)
        return claim[1:]

    def adopt(self, *, name: str, now: float) -> bool:
        """Take a slot and the lease back for ``name``, an ended execution RUNNING again (a redrive).

        It runs already, so it counts against MAX whatever MAX is: a shard with room, else past a
        cap of a pool frozen first (``DynamoSlots.adoption``), so no crash leaves caps that admit
        beside it. Refused when the key's lease is held by another execution (then it counts as
        external). A slot condition that failed (the pool moved since the read) is tried again.
        """
        record = self.execution(name)
        if record is None or record.state.holds_lease:
            return False
        if any(raw.get("holder") for raw in self._batch_get([payload_pk(record.key)])):
            return False  # another run holds the key: refused before any pool is frozen for it
        for _ in range(ADOPT_ROUNDS):
            shard, takes = self.launch_slots.adopt_items(name, now)
            lane_take = (
                self.lane_slots.adopt_items(record.lane, name, now) if record.lane is not None else None
            )
            items = [
                self._adopt_lease(record, name, now),
                self._adopt_record(record, name, now, shard, lane_take),
            ]
            if record.ckey is not None:
                items.append(self.key_adopt_item(record.ckey, name))
            slots = len(items)  # the slot items follow: their conditions alone are retried
            items.extend(takes)
            if lane_take is not None:
                items.extend(lane_take[1])
            reasons = self._transact(items)
            if reasons is None:
                break
            if any(r.get("Code") == "ConditionalCheckFailed" for r in reasons[:slots]):
                return False
        else:
            return False  # the pools kept moving: counted as external this tick, adopted at the next
        if lane_take is not None and record.lane is not None:
            self.lane_slots.rebalance(record.lane)
        # A slot taken past a cap left the pool frozen: thaw it now if the holders fit under the limit
        # (a crash before this leaves it frozen, admitting nothing, until a claim or a tick thaws it).
        self.launch_slots.slots.rebalance(POOL)
        return True

    def _adopt_lease(self, record: ExecutionRecord, name: str, now: float) -> dict[str, Any]:
        return {
            "Update": {
                "TableName": self.table,
                "Key": {"pk": {"S": payload_pk(record.key)}},
                "UpdateExpression": (
                    "SET #key = :key, #state = :running, holder = :name, updated_at = :now "
                    "REMOVE expires_at, redriven DELETE redriven_more :names"
                ),
                "ConditionExpression": "attribute_not_exists(holder)",
                "ExpressionAttributeNames": {"#key": "key", "#state": "state"},
                "ExpressionAttributeValues": {
                    **values(key=record.key, running=PayloadState.RUNNING.value, name=name, now=now),
                    ":names": {"SS": [name]},  # its own mark, if it was one of the key's further marks
                },
            }
        }

    def _adopt_record(
        self,
        record: ExecutionRecord,
        name: str,
        now: float,
        shard: int,
        lane_take: tuple[int, list[dict[str, Any]]] | None,
    ) -> dict[str, Any]:
        sets = "SET #state = :running, adopted_at = :now, #shard = :shard "
        # the end before: a stale DescribeExecution may still answer with it
        earlier = {} if record.ended_at is None else {"earlier": record.ended_at}
        if earlier:
            sets += ", earlier_end_at = :earlier "
        update = {
            "TableName": self.table,
            "Key": {"pk": {"S": execution_pk(name)}},
            "UpdateExpression": sets + "REMOVE expires_at, ended_at, #output, output_ref, output_size",
            "ConditionExpression": "#state = :was",
            "ExpressionAttributeNames": {"#state": "state", "#shard": "shard", "#output": "output"},
            "ExpressionAttributeValues": values(
                running=PayloadState.RUNNING.value, now=now, was=record.state.value, shard=shard, **earlier
            ),
        }
        if lane_take is not None:
            update["UpdateExpression"] = update["UpdateExpression"].replace(
                "#shard = :shard ", "#shard = :shard, lane_shard = :lane_shard ", 1
            )
            update["ExpressionAttributeValues"].update(values(lane_shard=lane_take[0]))
        return {"Update": update}

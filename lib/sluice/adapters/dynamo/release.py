"""The end of a holding, in the launcher's table: the release (slot, lease, execution record,
receipt and effects mark in one transaction), alone or with a successor's claim (the hand-over).

    release(N):  SLOTS#launcher#i  REMOVE holders.N          IF N holds a slot there
                 PAYLOAD#<key>     REMOVE holder, receipt = N IF holder = N (and, unless told,
                                                              not flagged as awaited: then again,
                                                              and its waiters are read)
                                   SET expires_at            IF no once_by (a once-key's success
                                                              is kept: then again, without it)
                                   SET once_unknown, once_by (a run that vanished: outcome
                                                              unknown, sluice.features.receipts)
                 EXEC#N            SET state, ended_at       IF CLAIMED or RUNNING (a fence: and
                                                              the claim version and mark judged)
                                                              and its parked set as read
                 EFFECTS#N         PUT (when effects were sent before it)
                 CKEY#<ckey>       DELETE holders N          (a keyed run: sluice.features.keys)
                 SLOTS#lane-<l>#j  REMOVE holders.N          (a run in a lane: sluice.features.lanes)

A repeated or late event finds N no longer holding: the transaction fails and nothing is freed
twice. A part of ``sluice.adapters.dynamo.store.DynamoStore``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sluice.adapters.dynamo.codec import (
    effects_item,
    execution_pk,
    only_once,
    output_terms,
    payload_pk,
    refused,
    to_execution,
    values,
)
from sluice.adapters.dynamo.lanes import LaneSlots
from sluice.adapters.dynamo.later_success import record_later_success
from sluice.adapters.dynamo.launch_slots import POOL, LaunchSlots
from sluice.adapters.dynamo.records import UNLESS_ONCE_DONE, RecordsTable
from sluice.adapters.dynamo.slots import pool_pk, swap_item
from sluice.adapters.dynamo.table import TableRef
from sluice.core.model import (
    EFFECTS_RETENTION_SECONDS,
    Claim,
    ClaimFence,
    Ending,
    ExecutionRecord,
    HandOver,
    PayloadState,
    record_expiry,
)
from sluice.core.records import ReceiptOutput
from sluice.features.receipts import asked_once, drops_once_claim

if TYPE_CHECKING:
    from sluice.adapters.dynamo.claims import ClaimsTable
    from sluice.adapters.dynamo.keys import KeysTable

LIVE = (PayloadState.CLAIMED.value, PayloadState.RUNNING.value)
PARK_RACE_RETRIES = 3  # a release tried again when messages parked behind it as it was on its way


@dataclass(frozen=True)
class _Release:
    """A release's ``Ending`` with what judges it: the claim's fence, the confirmation of the end
    against the record read, and the run's output (asked once)."""

    end: Ending
    fence: ClaimFence | None
    confirm: Callable[[ExecutionRecord], bool] | None
    output: Callable[[ExecutionRecord], ReceiptOutput | None]

    def drops_once_claim(self, record: ExecutionRecord) -> bool:
        return drops_once_claim(record, self.end.state, self.end.outcome_unknown)


def _successor_of(
    record: ExecutionRecord,
    ending: _Release,
    offer: Callable[[ExecutionRecord, bool], Claim | None],
    room: bool,
) -> Claim | None:
    """What ``offer`` hands the slot of ``record`` to, if the one transaction can take it."""
    if ending.end.state.ended:
        ending.output(record)  # its effects are sent first, so the offer may receive one
    successor = offer(record, room and record.shard is not None)
    if successor is not None and not successor.plain:
        return None  # its key's or lane's items are not in this write: the caller claims it its own way
    if successor is not None and successor.key == record.key:
        return None  # one item cannot be written twice in one transaction
    if successor is not None and successor.name == record.name:
        return None  # its own message back: it ran, and is settled its own way
    return successor


def _released_from(reason: dict[str, Any], name: str) -> bool:
    """A swap refused because ``name`` no longer holds a slot on the shard (released by another)."""
    holders = (reason.get("Item") or {}).get("holders", {}).get("M", {})
    return refused(reason) and "Item" in reason and name not in holders


MARKS = ("awaited", "once_by", "succeeded_by")  # what refuses a release's lease item while its run holds it


def marks(reason: dict[str, Any], name: str, dropped: bool = False) -> frozenset[str]:
    """The marks a release's lease item was refused for while ``name`` still holds it: the
    ``awaited`` flag (its waiters must be read), the ``once_by`` mark (no expiry may be set), and,
    in a ``dropped`` run-once claim's release only, the ``succeeded_by`` mark (it leaves the key at
    its receipt's end). Empty when it was not refused, or refused because ``name`` no longer holds
    the lease."""
    found = reason.get("Item") or {}
    if not refused(reason) or found.get("holder", {}).get("S") != name:
        return frozenset()
    return frozenset(m for m in MARKS if m in found and (dropped or m != "succeeded_by"))


@dataclass(frozen=True)
class ReleaseParts:
    """The parts of the store a release reads and writes beside its own items."""

    records: RecordsTable
    keys: KeysTable
    claims: ClaimsTable


class ReleasesTable:
    """Release and hand-over; the other parts of the store give the records read, the keys' and
    lanes' items and the claim's items a hand-over writes for its successor."""

    def __init__(
        self,
        db: TableRef,
        launch_slots: LaunchSlots,
        lane_slots: LaneSlots,
        parts: ReleaseParts,
    ) -> None:
        self.db = db
        self.launch_slots = launch_slots
        self.lane_slots = lane_slots
        self.records, self.keys, self.claims = parts.records, parts.keys, parts.claims

    def release(
        self,
        name: str,
        ending: Ending,
        *,
        fence: ClaimFence | None = None,
        confirm: Callable[[ExecutionRecord], bool] | None = None,
        output: Callable[[ExecutionRecord], ReceiptOutput | None] | None = None,
    ) -> ExecutionRecord | None:
        judged = _Release(ending, fence, confirm, asked_once(output))
        return self._end(self.records.execution(name), judged).released

    def hand_over(
        self,
        name: str,
        ending: Ending,
        offer: Callable[[ExecutionRecord, bool], Claim | None],
        *,
        confirm: Callable[[ExecutionRecord], bool] | None = None,
        output: Callable[[ExecutionRecord], ReceiptOutput | None] | None = None,
    ) -> HandOver:
        # The record and the pool item in one read: a frozen or paused pool has no slot to pass on,
        # and the caller then receives nothing (no receive spent on a message that cannot start).
        found = {raw["pk"]: raw for raw in self.db.batch_get([execution_pk(name), pool_pk(POOL)])}
        raw = found.get(execution_pk(name))
        pool = found.get(pool_pk(POOL)) or {}
        room = bool(pool) and not pool.get("frozen") and int(pool.get("limit", 0)) > 0
        judged = _Release(ending, None, confirm, asked_once(output))
        handed = self._end(to_execution(raw) if raw else None, judged, offer=offer, room=room)
        freed = handed.released
        if freed is not None and not handed.claimed and freed.shard is not None and room:
            self.launch_slots.freed(freed.shard, name, pool)  # the caller's own claim tries it first
        return handed

    def _end(
        self,
        record: ExecutionRecord | None,
        ending: _Release,
        *,
        offer: Callable[[ExecutionRecord, bool], Claim | None] | None = None,
        room: bool = False,
    ) -> HandOver:
        """Release ``record`` as read (with a successor in the same transaction when ``offer`` gives
        one), trying again as the races below require."""
        known: frozenset[str] = frozenset()  # the marks a refusal showed on the key (MARKS)
        successor: Claim | None = None
        for _ in range(PARK_RACE_RETRIES + 2):
            if record is None or not record.state.holds_lease:
                return HandOver(None)
            if ending.confirm is not None and record.adopted_at is not None and not ending.confirm(record):
                return HandOver(None)
            if offer is not None:
                successor, offer = _successor_of(record, ending, offer, room), None
            items = self._release_items(record, ending, known)
            claim_at = len(items)
            if successor is not None:
                assert record.shard is not None
                items[0] = swap_item(
                    self.db.table, POOL, record.shard, record.name, successor.name, ending.end.now
                )
                items.extend(self._successor_items(successor, record.shard))
            reasons = self.db.transact(items)
            if reasons is None:
                if successor is not None:
                    self.launch_slots.took(record.shard, successor.name, ending.end.now)  # type: ignore[arg-type]
                return HandOver(replace(record, awaited="awaited" in known), claimed=successor is not None)
            name = record.name
            held = marks(reasons[1], name, ending.drops_once_claim(record))
            if (refused(reasons[1]) and not held) or _released_from(reasons[0], name):
                return HandOver(None)  # someone released it first
            if successor is not None and (refused(reasons[0]) or any(map(refused, reasons[claim_at:]))):
                successor = None  # no room on the shard, or its lease or record refused: alone
                continue
            if held:
                # A waiter parked on the key: release again, then read its waiters. A once-key's
                # success: release again, setting no expiry. A success under a dropped run-once claim:
                # release again, leaving the key at its receipt's end.
                known |= held
                continue
            # A message parked behind it between the read above and the transaction: the record
            # returned must list it, or nothing would wake it. Read again and release again.
            fresh = self._moved(record) if refused(reasons[2]) else None
            if fresh is None:
                return HandOver(None)  # released by someone else, or renewed (a fence) meanwhile
            record = fresh  # parked behind, or adopted, meanwhile: judged again above
        return HandOver(None)

    def _moved(self, record: ExecutionRecord) -> ExecutionRecord | None:
        """The record read again after its own condition refused the release: the record still
        holding, with a message parked behind it or an adoption since ``record`` was read; else None."""
        fresh = self.records.execution(record.name)
        if fresh is None or not fresh.state.holds_lease:
            return None
        moved = (fresh.parked, fresh.adopted_at, fresh.adoptions) != (
            record.parked,
            record.adopted_at,
            record.adoptions,
        )
        return fresh if moved else None

    def record_later_success(
        self, record: ExecutionRecord, *, ended_at: float, now: float, receipt: ReceiptOutput | None
    ) -> bool:
        """``Store.record_later_success`` (``sluice.adapters.dynamo.later_success``)."""
        return record_later_success(self.db, record, ended_at=ended_at, now=now, receipt=receipt)

    def _release_items(
        self, record: ExecutionRecord, ending: _Release, known: frozenset[str] = frozenset()
    ) -> list[dict[str, Any]]:
        """The release of ``record`` as read: its slot first, its lease second, its record third.
        The lease is refused on each mark of ``MARKS`` on the key unless ``known`` names it: a key
        flagged as awaited (the caller then reads its waiters), a once-key's success (then no
        expiry is set), a success under a dropped claim (then the key keeps its receipt's end)."""
        name = record.name
        lease = self._lease_release(record, ending, known)
        receipt = ending.output(record) if ending.end.state.ended else None
        items = [
            self.launch_slots.release_item(name, record.shard),
            {"Update": lease},
            {"Update": self._record_release(record, ending, receipt)},
        ]
        if record.ckey is not None:
            items.append(self.keys.key_release_item(record.ckey, name))
        if record.lane is not None and record.lane_shard is not None:
            items.append(self.lane_slots.release_item(record.lane, record.lane_shard, name))
        if receipt is not None and receipt.effects is not None:
            # The effects sent before this release (sluice.features.effects): their durable mark, in its
            # transaction. A separate item, so that a later claim of the same name (a redelivered
            # message, which Puts EXEC#<name> afresh) cannot erase it.
            effects = effects_item(
                receipt.effects, expires_at=int(ending.end.now) + EFFECTS_RETENTION_SECONDS
            )
            items.append({"Put": {"TableName": self.db.table, "Item": effects}})
        return items

    def _lease_release(
        self, record: ExecutionRecord, ending: _Release, known: frozenset[str]
    ) -> dict[str, Any]:
        """PAYLOAD#<key>'s update: the lease given up, the receipt written when the run ended."""
        state, name = ending.end.state, record.name
        sets, removes, condition = _lease_terms(record, ending, known)
        condition = HOLDS_LEASE + ("" if "awaited" in known else f" AND {NOT_AWAITED}") + condition
        expires = int(ending.end.now) + self.db.retention_seconds
        named = values(state=state.value, now=ending.end.now, name=name, expires=expires)
        if ":expires" not in sets:
            del named[":expires"]
        if ":succeeded" in sets:
            named[":succeeded"] = {"S": PayloadState.SUCCEEDED.value}
        if state.ended:
            # The receipt (sluice.features.receipts): in the items this transaction writes anyway.
            sets += ", receipt = :name, receipt_state = :state"
            if state is PayloadState.SUCCEEDED:
                sets += ", succeeded_by = if_not_exists(succeeded_by, :name)"
        if ending.end.error:
            sets += ", reason = :reason"
            named[":reason"] = {"S": ending.end.error}
        return {
            "TableName": self.db.table,
            "Key": {"pk": {"S": payload_pk(record.key)}},
            "UpdateExpression": sets + removes,
            "ConditionExpression": condition,
            "ExpressionAttributeNames": {"#state": "state"},
            "ExpressionAttributeValues": named,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }

    def _record_release(
        self, record: ExecutionRecord, ending: _Release, receipt: ReceiptOutput | None
    ) -> dict[str, Any]:
        """EXEC#<name>'s update: the run's end, its output and error, under the record's conditions."""
        sets = "SET #state = :state, ended_at = :ended, expires_at = :expires"
        expires = record_expiry(
            ending.end.state,
            now=ending.end.now,
            retention_seconds=self.db.retention_seconds,
            ran=ending.end.outcome_unknown,
        )
        ended = ending.end.ended_at if ending.end.ended_at is not None else ending.end.now
        named = values(
            state=ending.end.state.value, ended=ended, expires=expires, live0=LIVE[0], live1=LIVE[1]
        )
        names = {"#state": "state"}
        if ending.end.started_at is not None:
            sets += ", started_at = if_not_exists(started_at, :started)"
            named[":started"] = {"N": repr(float(ending.end.started_at))}
        if receipt is not None:
            sets += output_terms(receipt, named, names)
        if ending.end.error:
            sets += ", #error = :error"
            named[":error"] = {"S": ending.end.error}
            names["#error"] = "error"
        if ending.end.cause:
            sets += ", #cause = :cause"
            named[":cause"] = {"S": ending.end.cause[:4_000]}
            names["#cause"] = "cause"
        if ending.end.outcome_unknown:  # its name is not claimed again (dynamo_claims.NOT_ENDED)
            sets, named[":unknown"] = sets + ", outcome_unknown = :unknown", {"BOOL": True}
        return {
            "TableName": self.db.table,
            "Key": {"pk": {"S": execution_pk(record.name)}},
            "UpdateExpression": sets,
            "ConditionExpression": _record_condition(record, ending.fence, named),
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": named,
        }

    def _successor_items(self, successor: Claim, shard: int) -> list[dict[str, Any]]:
        """A claim's lease and record (``_claim_items`` but its slot, which the swap takes)."""
        claim = self.claims._claim_items(
            successor.key,
            successor.name,
            successor.message_id,
            shard,
            successor.now,
            successor.claim_expires_at,
            successor.arn,
            successor.copy_id,
        )
        if successor.once:
            only_once(claim)
        return claim[1:]


# -- the conditions of a release's items, each with the race it guards ---------------------------------

# A repeated or late event finds N no longer holding the lease: nothing is freed twice.
HOLDS_LEASE = "holder = :name"
# A waiter parked on the key (before the release, or while it was on its way) flags it: the lease
# is refused, and the release goes again knowing it must read the key's waiters (``sluice.features.awaits``).
NOT_AWAITED = "attribute_not_exists(awaited)"
# The record of a run that still holds: CLAIMED or RUNNING.
LIVE_RECORD = "#state IN (:live0, :live1)"
# A claim judged unstarted (by reconciliation, or by its own launcher rolling it back): released
# only if nobody renewed it since (the same version; and the same mark, when it was marked).
FENCED_CLAIM = "#state = :live0 AND claim_version = :version"
SAME_MARK = " AND suspect_since = :suspect"
# Its parked messages as read (the set only grows while it is live): a park that lands between the
# release's read and its write changes the set, the release fails and reads again (``_end``).
PARKED_AS_READ = " AND size(parked) = :nparked"
NONE_PARKED = " AND attribute_not_exists(parked)"
# Its adoption as read: the end was judged against that record (``_Release.confirm``). An adoption that
# lands between the release's read and its write fails the release, which reads again and asks again:
#
#     duplicate check (e1 read as FAILED)        meanwhile
#     read EXEC#e1: not adopted (confirm not asked)
#                                                e1 released, redriven, adopted on its old shard
#     release e1  ✗ (now refused: adopted_at)    → a second run of its key beside e1
NOT_ADOPTED = " AND attribute_not_exists(adopted_at)"
ADOPTED_AS_READ = " AND adopted_at = :adopted"


def adoptions_are(count: int) -> str:
    """The condition that the record was adopted ``count`` times (``:counted``, when any; an adoption
    an older version wrote has no count). A run released, redriven and adopted again by a clock that
    reads the same instant carries the same ``adopted_at``: only the count tells the two apart."""
    return "adoptions = :counted" if count else "attribute_not_exists(adoptions)"


# A dropped run-once claim's key with no success recorded (else it keeps its receipt's end: ``_lease_terms``).
NO_SUCCESS = "attribute_not_exists(succeeded_by)"


def _lease_terms(record: ExecutionRecord, ending: _Release, known: frozenset[str]) -> tuple[str, str, str]:
    """PAYLOAD#<key>'s SET and REMOVE clauses and its condition past the holder's, as the run ended."""
    sets, removes = "SET #state = :state, updated_at = :now", " REMOVE holder"
    condition = ""
    dropped = ending.drops_once_claim(record)
    if dropped and "succeeded_by" in known:
        sets = "SET #state = if_not_exists(receipt_state, :succeeded), updated_at = :now"
    elif dropped:
        # A claim dropped unstarted leaves its key RELEASED: its message is retried. A run-once
        # claim's key with a success, recorded while it held (a redriven run's; before it, the
        # claim is refused), keeps that end instead: its message is already done, and would
        # leave RELEASED for good.
        #
        #   once-claim n2 of k                    redriven run e1 of k (FAILED, released)
        #   ──────────────────                    ───────────────────────────────────────
        #   claim(k): holder = n2
        #                                         SUCCEEDED: succeeded_by = e1, receipt SUCCEEDED
        #   dropped: state = RELEASED IF no succeeded_by  ✗
        #   again: state = receipt_state (SUCCEEDED)      ✓
        #
        # A success recorded after the drop: the already-done count settles it (records.py).
        condition = f" AND {NO_SUCCESS}"
    if record.once and ending.end.state is PayloadState.SUCCEEDED:
        # A once-key's success is kept: it must never run again (sluice.features.receipts).
        return sets + ", once_by = if_not_exists(once_by, :name)", removes + ", expires_at", condition
    if ending.end.outcome_unknown:
        # A run that vanished (a run-once one or not) may have SUCCEEDED: no once-claim of the
        # key until the operator says (its claim's condition reads the mark), and the record is
        # kept as a success would be. Written by the holder's own release, so no once-claim got
        # in between.
        sets += ", once_unknown = :name, once_by = if_not_exists(once_by, :name)"
        return sets, removes + ", expires_at", condition
    if "once_by" in known:
        return sets, removes + ", expires_at", condition
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
    return sets + ", expires_at = :expires", removes, f"{condition} AND {UNLESS_ONCE_DONE}"


def _record_condition(record: ExecutionRecord, fence: ClaimFence | None, named: dict[str, Any]) -> str:
    """EXEC#<name>'s condition, its values added to ``named``."""
    condition = LIVE_RECORD
    if fence is not None:
        condition = FENCED_CLAIM
        named.update(values(version=fence.claim_version))
        if fence.suspect_since is not None:
            condition += SAME_MARK
            named.update(values(suspect=fence.suspect_since))
    if record.adopted_at is None:
        condition += NOT_ADOPTED
    else:
        condition += ADOPTED_AS_READ + " AND " + adoptions_are(record.adoptions)
        named.update(values(adopted=record.adopted_at))
        if record.adoptions:
            named.update(values(counted=record.adoptions))
    if not record.parked:
        return condition + NONE_PARKED
    named[":nparked"] = {"N": str(len(record.parked))}
    return condition + PARKED_AS_READ

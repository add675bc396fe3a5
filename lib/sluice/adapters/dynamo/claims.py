"""The claim and the marks on a live claim, in the launcher's table (``sluice.adapters.dynamo.store``).

A claim is one TransactWriteItems over one slot shard, PAYLOAD#<key> and EXEC#<name>:

    SLOTS#launcher#i  SET holders.name   IF size(holders) < cap AND name not among them
    PAYLOAD#<key>     SET holder = name  IF holder absent AND history not full   (ALL_OLD on failure)
    EXEC#<name>       PUT CLAIMED, arn, claim_expires_at, shard

with, as the message asks, CKEY#<ckey> (``sluice.adapters.dynamo.keys``), a lane's slot
(``sluice.adapters.dynamo.lanes``) and a check that no concurrency key has waiters. Two launchers
claiming the last slot of a shard at once: DynamoDB serialises the transactions, one condition fails.

A resumed claim and reconciliation race on an unstarted claim; the claim's version fences them:

    launcher (resume)                         reconciler
    ─────────────────                         ──────────
                                              DescribeExecution(N): no such execution
                                              suspect(N, v1): suspect_since = t, by me
    renew(N): IF CLAIMED                      …
      claim_version = v2, REMOVE suspect
    StartExecution(N)                         (a claim timeout later, by its own clock)
                                              release(N) IF CLAIMED AND version v1 AND suspect t
                                                → fails: the resume owns N
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice.adapters.dynamo.codec import (
    execution_pk,
    item,
    only_once,
    payload_pk,
    plain,
    refused,
    to_execution,
    to_payload,
    values,
)
from sluice.adapters.dynamo.keys import KeysTable, to_key_state
from sluice.adapters.dynamo.lanes import LaneSlots
from sluice.adapters.dynamo.launch_slots import LaunchSlots
from sluice.adapters.dynamo.table import TableRef
from sluice.core.errors import (
    AlreadyDone,
    AlreadyRan,
    KeyFull,
    LeaseHeld,
    OnceUnknown,
    SlotsFull,
    TransientError,
)
from sluice.core.model import Claim, PayloadState

HISTORY_LIMIT = 20  # execution names kept on a payload record; trimmed to the newest HISTORY_KEEP
HISTORY_KEEP = 10

# -- the conditions of a claim's items, each with the race it guards ----------------------------------

# Two claims of one key: the lease goes to one. A redriven run of the key marks it (``redriven``,
# ``redriven_more``) until it is adopted or ends: no claim beside it.
LEASE_FREE = (
    "attribute_not_exists(holder) AND attribute_not_exists(redriven) AND attribute_not_exists(redriven_more)"
)
# A full history refuses the lease: the claim trims it (``_trim_history``) and claims again.
HISTORY_ROOM = "(attribute_not_exists(executions) OR size(executions) < :history)"
# Never over a record whose parked messages were not woken (``_carry_parked``).
NOT_PARKED_BEHIND = "attribute_not_exists(parked)"
# An execution record that is not of a run that ended (a claim's Put over a name that ran is refused):
# its name may start afresh on another state machine. Nor of one released as vanished: it may have
# run on the machine deleted since, its message back after the release (a delete lost):
#   L: start(n on M1) ✓, dies before the delete     R: n absent, M1 deleted: release(n, unknown)
#   L': receive m again, claim(n) on M2             ✗ here (else n runs twice)
NOT_ENDED = "NOT #state IN (:ended_s, :ended_f, :ended_t, :ended_a) AND attribute_not_exists(outcome_unknown)"
NOT_ENDED_VALUES = values(
    ended_s=PayloadState.SUCCEEDED.value,
    ended_f=PayloadState.FAILED.value,
    ended_t=PayloadState.TIMED_OUT.value,
    ended_a=PayloadState.ABORTED.value,
)
# A trim loses to another trim or a claim: either way the claim looks again.
TRIM_AS_READ = "attribute_not_exists(holder) AND size(executions) = :n"
# A renewal or a start mark: the claim is unstarted and no reconciler blocked it (``block``).
CLAIMED_UNBLOCKED = "#state = :claimed AND attribute_not_exists(blocked_by)"
# A block lands before the start mark or not at all: the start goes ahead or never does.
CLAIMED_UNSTARTED = "#state = :claimed AND attribute_not_exists(starting_at)"
# A renewal lifts a start mark only the same copy of the message wrote. That copy is back only
# once its visibility timeout, longer than the launcher's, has passed: the invocation that marked
# is over. Another copy (the same origin id in another group: the same name) may come meanwhile;
# no clock says when that invocation is over, so it waits for the claim's own copy, or for
# reconciliation to release the claim as abandoned, and then claims it afresh:
#
#   launcher A (copy c1)                 launcher B (copy c2)
#   claim N (starting_at, copy c1)
#                                        renew N IF the mark is c2's ✗ → c2 back a claim timeout later
#   StartExecution(N)                    (were it lifted: c2 yields N to a redriven run, A starts N)
MARK_OURS = "(attribute_not_exists(starting_at) OR attribute_not_exists(copy_id) OR copy_id = :copy)"
# A mark by the copy that renewed last: another copy renewed since may yield the claim.
RENEWED_OURS = "(attribute_not_exists(copy_id) OR copy_id = :copy)"
# The suspicion of reconciliation: the claim as it judged it (its version, its earlier mark).
SUSPECT_VERSION = (
    "#state = :claimed AND (claim_version = :v OR (attribute_not_exists(claim_version) AND :v = :zero))"
)


@dataclass
class _Tries:
    """What a claim on one shard learned from the attempts so far."""

    lane_shards: list[int]
    lane_reads: int = 0
    trims: int = 0
    carried: list[str] = field(default_factory=list)
    carries: int = 0
    landed: bool = False


@dataclass(frozen=True)
class _At:
    """Where the optional items sit in a claim's transaction (-1: absent)."""

    key: int = -1
    lane: int = -1
    waiting: int = -1


class ClaimsTable:
    def __init__(
        self, db: TableRef, launch_slots: LaunchSlots, lane_slots: LaneSlots, keys: KeysTable
    ) -> None:
        self.db = db
        self.launch_slots = launch_slots
        self.lane_slots = lane_slots
        self.keys = keys

    def claim(self, claim: Claim) -> None:
        if self.launch_slots.view is None:
            self.launch_slots.ledger()
        for round_ in range(2):
            if round_:
                self.launch_slots.ledger()  # no shard had room as last read: read the pool again, once
            self.launch_slots.thaw()
            for shard in self.launch_slots.choices():
                if self._claim_on(shard, claim):
                    return
        raise SlotsFull(self.launch_slots.view.limit if self.launch_slots.view else 0)

    def _claim_on(self, shard: int, claim: Claim) -> bool:
        """Claim on ``shard``: True when taken, False when the shard had no room. With a lane, a
        slot of the lane's pool in the same transaction: SlotsFull when no lane shard had room.
        ``fair_newcomer``: KeyFull while any concurrency key has waiters (``KEYS_WAITING``).
        ``uncapped``: its key has no default cap (a claim from a fair lane, ``sluice.features.fair``)."""
        tries = self._first_lane_shards(claim.lane)
        while True:
            items, at = self._attempt_items(shard, claim, tries)
            reasons = self.db.transact(items)
            if reasons is None:
                self.launch_slots.took(shard, claim.name, claim.now)
                if claim.lane is not None:
                    self.lane_slots.took(claim.lane, tries.lane_shards[0], claim.name, claim.now)
                return True
            again = self._refused(shard, claim, tries, reasons, at)
            if again is not None:
                return again

    def _first_lane_shards(self, lane: str | None) -> _Tries:
        tries = _Tries(self.lane_slots.choices(lane) if lane is not None else [])
        if lane is not None and not tries.lane_shards:
            tries.lane_shards, tries.lane_reads = (
                self.lane_slots.choices(lane, fresh=True),
                1,
            )  # read once more
            if not tries.lane_shards:
                raise SlotsFull(0)
        return tries

    def _attempt_items(self, shard: int, claim: Claim, tries: _Tries) -> tuple[list[dict[str, Any]], _At]:
        """The items of one attempt: the slot, the lease and the record, then what the claim asks."""
        c = claim
        items = self._claim_items(
            c.key, c.name, c.message_id, shard, c.now, c.claim_expires_at, c.arn, c.copy_id
        )
        if c.once:
            only_once(items)
        if tries.carried:
            _carry_parked(items, tries.carried)
        put = items[2]["Put"]["Item"]
        key_at = lane_at = waiting_at = -1
        if c.ckey is not None:
            put["ckey"] = {"S": c.ckey}
            items.append(
                self.keys.key_claim_item(
                    c.ckey, c.name, ticket=c.ticket, uncapped=c.uncapped, landed=tries.landed
                )
            )
            key_at = len(items) - 1
        if c.lane is not None:
            put["lane"], put["lane_shard"] = {"S": c.lane}, {"N": str(tries.lane_shards[0])}
            items.append(self.lane_slots.claim_item(c.lane, tries.lane_shards[0], c.name, c.now))
            lane_at = len(items) - 1
        if c.fair_newcomer:
            items.append(self.keys.nobody_waiting_item())
            waiting_at = len(items) - 1
        return items, _At(key_at, lane_at, waiting_at)

    def _refused(
        self, shard: int, claim: Claim, tries: _Tries, reasons: list[dict[str, Any]], at: _At
    ) -> bool | None:
        """Why an attempt was refused, in order: raises, False (the shard had no room) or None (try
        again with what was learned)."""
        if refused(reasons[1]):
            return self._lease_refused(claim, tries, plain(reasons[1].get("Item", {})))
        earlier = plain(reasons[2].get("Item", {})) if refused(reasons[2]) else {}
        if earlier and (
            PayloadState(earlier.get("state", "CLAIMED")).ended or earlier.get("outcome_unknown")
        ):
            raise AlreadyRan(to_execution(earlier))  # before any other refusal: no shard would do
        if at.waiting >= 0 and refused(reasons[at.waiting]):
            raise KeyFull(to_key_state(claim.ckey or "", None))  # someone waits: this one lines up too
        if at.key >= 0 and refused(reasons[at.key]):
            return self._key_refused(claim, tries, plain(reasons[at.key].get("Item", {})) or None)
        if claim.lane is not None and refused(reasons[at.lane]):
            return self._lane_refused(claim.lane, tries, reasons[at.lane].get("Item"))
        if refused(reasons[0]):
            self.launch_slots.full(shard, reasons[0].get("Item"))
            return False
        if refused(reasons[2]) and tries.carries < 2:
            # An earlier claim of this name (its message back after a rollback) still lists
            # messages parked behind it and never woken: they wait for this claim instead.
            tries.carried = sorted(earlier.get("parked", ()))
            tries.carries += 1
            return None
        raise TransientError(f"claim cancelled: {reasons}", operation="TransactWriteItems", code="Cancelled")

    def _lease_refused(self, claim: Claim, tries: _Tries, existing: dict[str, Any]) -> None:
        key = claim.key
        if claim.once and existing.get("succeeded_by") is not None:
            raise AlreadyDone(to_payload(existing, default_key=key))
        if claim.once and existing.get("once_unknown") is not None:
            raise OnceUnknown(to_payload(existing, default_key=key))
        free = (
            existing.get("holder") is None
            and existing.get("redriven") is None
            and not existing.get("redriven_more")
        )
        if free and tries.trims < 1 and self._trim_history(key, existing):
            tries.trims += 1
            return None  # the history was full, not the lease: trimmed, claim again
        raise LeaseHeld(to_payload(existing, default_key=key))

    def _key_refused(self, claim: Claim, tries: _Tries, raw: dict[str, Any] | None) -> None:
        state = to_key_state(claim.ckey or "", raw)
        if claim.ticket is not None and not tries.landed and claim.ticket not in state.inflight:
            # Claimed before the wake that sent it noted its entry (``sluice.features.keys``).
            tries.landed = True
            return None
        raise KeyFull(state)

    def _lane_refused(self, lane: str, tries: _Tries, found: dict[str, Any] | None) -> None:
        # Another launcher took the lane shard's last slot: try the lane's next shard.
        self.lane_slots.full(lane, tries.lane_shards.pop(0), found)
        if not tries.lane_shards and not tries.lane_reads:
            tries.lane_shards, tries.lane_reads = self.lane_slots.choices(lane, fresh=True), 1
        if not tries.lane_shards:
            raise SlotsFull(0)
        return None

    def _claim_items(
        self,
        key: str,
        name: str,
        message_id: str,
        shard: int,
        now: float,
        claim_expires_at: float,
        arn: str | None,
        copy_id: str | None = None,
    ) -> list[dict[str, Any]]:
        return [
            self.launch_slots.claim_item(shard, name, now),
            self._lease_item(key, name, now),
            self._record_item(key, name, message_id, shard, now, claim_expires_at, arn, copy_id),
        ]

    def _lease_item(self, key: str, name: str, now: float) -> dict[str, Any]:
        return {
            "Update": {
                "TableName": self.db.table,
                "Key": {"pk": {"S": payload_pk(key)}},
                "UpdateExpression": (
                    "SET #key = :key, #state = :claimed, holder = :name, updated_at = :now, "
                    "executions = list_append(if_not_exists(executions, :empty), :list) "
                    "ADD attempts :one REMOVE reason, expires_at"
                ),
                "ConditionExpression": f"{LEASE_FREE} AND {HISTORY_ROOM}",
                "ExpressionAttributeNames": {"#key": "key", "#state": "state"},
                "ExpressionAttributeValues": values(
                    key=key,
                    claimed=PayloadState.CLAIMED.value,
                    name=name,
                    now=now,
                    empty=[],
                    list=[name],
                    one=1,
                    history=HISTORY_LIMIT,
                ),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    def _record_item(
        self,
        key: str,
        name: str,
        message_id: str,
        shard: int,
        now: float,
        claim_expires_at: float,
        arn: str | None,
        copy_id: str | None = None,
    ) -> dict[str, Any]:
        record = item(
            pk=execution_pk(name),
            name=name,
            key=key,
            message_id=message_id,
            arn=arn,
            state=PayloadState.CLAIMED.value,
            claimed_at=now,
            claim_expires_at=claim_expires_at,
            claim_version=0,
            shard=shard,
            starting_at=now,  # the start mark, in the claim: a block lands before it or not at all
            copy_id=copy_id,
        )
        return {
            "Put": {
                "TableName": self.db.table,
                "Item": record,
                "ConditionExpression": f"{NOT_PARKED_BEHIND} AND {NOT_ENDED}",
                "ExpressionAttributeNames": {"#state": "state"},
                "ExpressionAttributeValues": dict(NOT_ENDED_VALUES),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    def _trim_history(self, key: str, existing: dict[str, Any]) -> bool:
        history = list(existing.get("executions", ()))
        if len(history) < HISTORY_LIMIT:
            return False
        kept = values(kept=history[-HISTORY_KEEP:], n=len(history))
        self.db.update_if(payload_pk(key), "SET executions = :kept", TRIM_AS_READ, kept, names={})
        return True

    # -- marks on a live claim ----------------------------------------------------------------------

    def renew(
        self,
        *,
        name: str,
        now: float,
        claim_expires_at: float,
        arn: str | None = None,
        copy_id: str | None = None,
    ) -> bool:
        named = values(exp=claim_expires_at, now=now, zero=0, one=1, claimed=PayloadState.CLAIMED.value)
        moved, condition = "", CLAIMED_UNBLOCKED
        if arn is not None:
            moved, named[":arn"] = ", arn = :arn", {"S": arn}
        if copy_id is not None:
            moved, named[":copy"] = moved + ", copy_id = :copy", {"S": copy_id}
            condition += " AND " + MARK_OURS
        return self.db.update_if(
            execution_pk(name),
            "SET claim_expires_at = :exp, renewed_at = :now, "
            "claim_version = if_not_exists(claim_version, :zero) + :one"
            + moved
            + " REMOVE suspect_since, suspect_by, starting_at",
            condition,
            named,
        )

    def block(self, *, name: str, by: str, now: float) -> bool:
        return self.db.update_if(
            execution_pk(name),
            "SET blocked_by = :by, blocked_at = :now",
            CLAIMED_UNSTARTED,
            values(by=by, now=now, claimed=PayloadState.CLAIMED.value),
        )

    def mark_starting(self, *, name: str, now: float, copy_id: str | None = None) -> bool:
        named, condition = values(now=now, claimed=PayloadState.CLAIMED.value), CLAIMED_UNBLOCKED
        if copy_id is not None:
            named[":copy"], condition = {"S": copy_id}, condition + " AND " + RENEWED_OURS
        return self.db.update_if(execution_pk(name), "SET starting_at = :now", condition, named)

    def suspect(
        self, *, name: str, claim_version: int, reconciler: str, now: float, replacing: float | None = None
    ) -> bool:
        condition = SUSPECT_VERSION
        named = values(now=now, by=reconciler, claimed=PayloadState.CLAIMED.value, v=claim_version, zero=0)
        if replacing is None:
            condition += " AND attribute_not_exists(suspect_since)"
        else:
            condition += " AND suspect_since = :old"
            named.update(values(old=replacing))
        return self.db.update_if(
            execution_pk(name),
            "SET suspect_since = :now, suspect_by = :by, claim_version = :v",
            condition,
            named,
        )

    def mark_running(self, *, key: str, name: str, arn: str, started_at: float, now: float) -> bool:
        items = self._mark_items(key, name, arn, started_at, now)
        return self.db.transact(items) is None

    def _mark_items(
        self, key: str, name: str, arn: str, started_at: float, now: float
    ) -> list[dict[str, Any]]:
        running = PayloadState.RUNNING.value
        lease = {
            "TableName": self.db.table,
            "Key": {"pk": {"S": payload_pk(key)}},
            "UpdateExpression": "SET #state = :running, updated_at = :now REMOVE expires_at",
            "ConditionExpression": "holder = :name",
            "ExpressionAttributeNames": {"#state": "state"},
            "ExpressionAttributeValues": values(running=running, now=now, name=name),
        }
        record = {
            "TableName": self.db.table,
            "Key": {"pk": {"S": execution_pk(name)}},
            "UpdateExpression": (
                "SET #state = :running, arn = :arn, started_at = :started "
                "REMOVE expires_at, suspect_since, suspect_by"
            ),
            "ConditionExpression": "#state = :claimed",
            "ExpressionAttributeNames": {"#state": "state"},
            "ExpressionAttributeValues": values(
                running=running, arn=arn, started=started_at, claimed=PayloadState.CLAIMED.value
            ),
        }
        return [{"Update": lease}, {"Update": record}]


def _carry_parked(items: list[dict[str, Any]], parked: list[str]) -> None:
    """Make a claim's items (``_claim_items``) keep the messages parked behind an earlier claim of
    the same name: the earlier one was released and its wake-up lost (a crash, or a park that
    committed while the release was on its way); the new record lists them, so they are woken when
    it ends (``sluice.features.parking``). Nothing parks behind a released record, so the list is as read."""
    put = items[2]["Put"]
    put["Item"]["parked"] = {"SS": parked}
    put["ConditionExpression"] = f"(attribute_not_exists(parked) OR size(parked) = :nparked) AND {NOT_ENDED}"
    put["ExpressionAttributeValues"] = {**NOT_ENDED_VALUES, ":nparked": {"N": str(len(parked))}}

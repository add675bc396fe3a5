"""The launcher's store in one DynamoDB table (partition key ``pk``): the slots it claims, the
payload leases and the execution records, composed into one transaction per claim and per release
(the release and the adoption: ``sluice.adapters.dynamo_release``).

    SLOTS#launcher[#i] the slot pool and its shards (sluice.adapters.dynamo_launch_slots)
    PAYLOAD#<key>     the lease (holder), latest state, the last executions, attempts, duplicates
    EXEC#<name>       one claim / execution: key, message id, ARN, state, times, claim version, shard
    LEDGER, PARK#...  reconciliation's figures, the waiting room (sluice.adapters.dynamo_records,
                      sluice.adapters.dynamo_parking)

A claim is one TransactWriteItems over one slot shard, PAYLOAD#<key> and EXEC#<name>:

    SLOTS#launcher#i  SET holders.name   IF size(holders) < cap AND name not among them
    PAYLOAD#<key>     SET holder = name  IF holder absent AND history not full   (ALL_OLD on failure)
    EXEC#<name>       PUT CLAIMED, arn, claim_expires_at, shard

and a release is the mirror image, conditional on ``name`` still holding both. Two launchers
claiming the last slot of a shard at once: DynamoDB serialises the transactions, one condition fails.

Live records carry no ``expires_at``: TTL can only delete a record once its run has ended.

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

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from sluice.adapters.dynamo_awaits import AWAITING_PK, AwaitsTable
from sluice.adapters.dynamo_codec import (
    TTL_ATTRIBUTE,
    create_table,
    execution_pk,
    item,
    only_once,
    payload_pk,
    plain,
    to_execution,
    to_payload,
    values,
)
from sluice.adapters.dynamo_keys import KEYS_WAITING_PK, KeysTable, to_key_state
from sluice.adapters.dynamo_lanes import LaneSlots
from sluice.adapters.dynamo_launch_slots import LEDGER_PK, LaunchSlots
from sluice.adapters.dynamo_parking import PARKED_PK
from sluice.adapters.dynamo_records import RecordsTable
from sluice.adapters.dynamo_release import ReleasesTable
from sluice.adapters.dynamo_slots import DynamoSlots
from sluice.adapters.dynamo_table import DEFAULT_RETENTION
from sluice.errors import AlreadyDone, AlreadyRan, KeyFull, LeaseHeld, OnceUnknown, SlotsFull, TransientError
from sluice.keys import DEFAULT_KEY_CONCURRENCY
from sluice.model import (
    Ledger,
    LimitSource,
    PayloadState,
    Rooms,
)
from sluice.records import LaneRoom, LaneSetting
from sluice.slots import DEFAULT_PER_SHARD

__all__ = [
    "LEDGER_PK",
    "PARKED_PK",
    "TTL_ATTRIBUTE",
    "DynamoStore",
    "create_table",
    "execution_pk",
    "payload_pk",
]

HISTORY_LIMIT = 20  # execution names kept on a payload record; trimmed to the newest HISTORY_KEEP
HISTORY_KEEP = 10


class DynamoStore(ReleasesTable, RecordsTable, AwaitsTable, KeysTable):
    def __init__(
        self,
        client: Any,
        table_name: str,
        *,
        retention_seconds: int = DEFAULT_RETENTION,
        sleep: Callable[[float], None] = time.sleep,
        slots_per_shard: int = DEFAULT_PER_SHARD,
        rng: random.Random | None = None,
        key_concurrency: int = DEFAULT_KEY_CONCURRENCY,
    ) -> None:
        super().__init__(client, table_name, retention_seconds=retention_seconds, sleep=sleep)
        self.key_concurrency = key_concurrency
        slots = DynamoSlots(client, table_name, per_shard=slots_per_shard, rng=rng, sleep=sleep)
        self.launch_slots = LaunchSlots(slots, rng=rng)
        self.lane_slots = LaneSlots(slots, rng=rng)

    # -- reads ---------------------------------------------------------------------------------

    def rooms(self) -> Rooms:
        found = {raw["pk"]: raw for raw in self._batch_get([PARKED_PK, AWAITING_PK, KEYS_WAITING_PK])}
        return Rooms(
            parked_holders=frozenset(found.get(PARKED_PK, {}).get("holders", ())),
            awaiting=frozenset(found.get(AWAITING_PK, {}).get("waiters", ())),
            keys_waiting=frozenset(found.get(KEYS_WAITING_PK, {}).get("keys", ())),
        )

    def ledger(self) -> Ledger:
        return self.launch_slots.ledger()

    def look(self, shards: Sequence[int] | None = None) -> Ledger:
        return self.launch_slots.look(shards)

    # -- the claim ------------------------------------------------------------------------------

    def set_limit(self, source: LimitSource) -> int | None:
        return self.launch_slots.set_limit(source)

    def claim(
        self,
        *,
        key: str,
        name: str,
        message_id: str,
        now: float,
        claim_expires_at: float,
        arn: str | None = None,
        once: bool = False,
        ckey: str | None = None,
        ticket: str | None = None,
        lane: str | None = None,
        fair_newcomer: bool = False,
        uncapped: bool = False,
    ) -> None:
        if self.launch_slots.view is None:
            self.launch_slots.ledger()
        for round_ in range(2):
            if round_:
                self.launch_slots.ledger()  # no shard had room as last read: read the pool again, once
            self.launch_slots.thaw()
            for shard in self.launch_slots.choices():
                if self._claim_on(
                    shard,
                    key,
                    name,
                    message_id,
                    now,
                    claim_expires_at,
                    arn,
                    once,
                    ckey,
                    ticket,
                    lane,
                    fair_newcomer,
                    uncapped,
                ):
                    return
        raise SlotsFull(self.launch_slots.view.limit if self.launch_slots.view else 0)

    def _claim_on(
        self,
        shard: int,
        key: str,
        name: str,
        message_id: str,
        now: float,
        claim_expires_at: float,
        arn: str | None,
        once: bool = False,
        ckey: str | None = None,
        ticket: str | None = None,
        lane: str | None = None,
        fair_newcomer: bool = False,
        uncapped: bool = False,
    ) -> bool:
        """Claim on ``shard``: True when taken, False when the shard had no room. With ``lane``, a
        slot of the lane's pool in the same transaction: SlotsFull when no lane shard had room.
        ``fair_newcomer``: KeyFull while any concurrency key has waiters (``KEYS_WAITING``).
        ``uncapped``: its key has no default cap (a claim from a fair lane, ``sluice.fair``)."""
        lane_shards = self.lane_slots.choices(lane) if lane is not None else []
        lane_reads = 0
        if lane is not None and not lane_shards:
            lane_shards, lane_reads = self.lane_slots.choices(lane, fresh=True), 1  # read once more
            if not lane_shards:
                raise SlotsFull(0)
        trims = 0
        carried: list[str] = []
        carries = 0
        landed = False
        while True:
            items = self._claim_items(key, name, message_id, shard, now, claim_expires_at, arn)
            if once:
                only_once(items)
            if carried:
                _carry_parked(items, carried)
            key_at = lane_at = -1
            if ckey is not None:
                items[2]["Put"]["Item"]["ckey"] = {"S": ckey}
                items.append(self.key_claim_item(ckey, name, ticket=ticket, uncapped=uncapped, landed=landed))
                key_at = len(items) - 1
            if lane is not None:
                items[2]["Put"]["Item"]["lane"] = {"S": lane}
                items[2]["Put"]["Item"]["lane_shard"] = {"N": str(lane_shards[0])}
                items.append(self.lane_slots.claim_item(lane, lane_shards[0], name, now))
                lane_at = len(items) - 1
            waiting_at = -1
            if fair_newcomer:
                items.append(self.nobody_waiting_item())
                waiting_at = len(items) - 1
            reasons = self._transact(items)
            if reasons is None:
                self.launch_slots.took(shard, name, now)
                if lane is not None:
                    self.lane_slots.took(lane, lane_shards[0], name, now)
                return True
            slot_reason, lease_reason = reasons[0], reasons[1]
            if lease_reason.get("Code") == "ConditionalCheckFailed":
                existing = plain(lease_reason.get("Item", {}))
                if once and existing.get("succeeded_by") is not None:
                    raise AlreadyDone(to_payload(existing, default_key=key))
                if once and existing.get("once_unknown") is not None:
                    raise OnceUnknown(to_payload(existing, default_key=key))
                free = (
                    existing.get("holder") is None
                    and existing.get("redriven") is None
                    and not existing.get("redriven_more")
                )
                if free and trims < 1 and self._trim_history(key, existing):
                    trims += 1
                    continue  # the history was full, not the lease: trimmed, claim again
                raise LeaseHeld(to_payload(existing, default_key=key))
            earlier = (
                plain(reasons[2].get("Item", {}))
                if reasons[2].get("Code") == "ConditionalCheckFailed"
                else {}
            )
            if earlier and PayloadState(earlier.get("state", PayloadState.CLAIMED.value)).ended:
                raise AlreadyRan(to_execution(earlier))  # before any other refusal: no shard would do
            if waiting_at >= 0 and reasons[waiting_at].get("Code") == "ConditionalCheckFailed":
                raise KeyFull(to_key_state(ckey or "", None))  # someone waits: this one lines up too
            if key_at >= 0 and reasons[key_at].get("Code") == "ConditionalCheckFailed":
                state = to_key_state(ckey or "", plain(reasons[key_at].get("Item", {})) or None)
                if ticket is not None and not landed and ticket not in state.inflight:
                    # Claimed before the wake that sent it noted its entry (``sluice.keys``).
                    landed = True
                    continue
                raise KeyFull(state)
            if lane is not None and reasons[lane_at].get("Code") == "ConditionalCheckFailed":
                # Another launcher took the lane shard's last slot: try the lane's next shard.
                self.lane_slots.full(lane, lane_shards.pop(0), reasons[lane_at].get("Item"))
                if not lane_shards and not lane_reads:
                    lane_shards, lane_reads = self.lane_slots.choices(lane, fresh=True), 1
                if not lane_shards:
                    raise SlotsFull(0)
                continue
            if slot_reason.get("Code") == "ConditionalCheckFailed":
                self.launch_slots.full(shard, slot_reason.get("Item"))
                return False
            if reasons[2].get("Code") == "ConditionalCheckFailed" and carries < 2:
                # An earlier claim of this name (its message back after a rollback) still lists
                # messages parked behind it and never woken: they wait for this claim instead.
                carried = sorted(plain(reasons[2].get("Item", {})).get("parked", ()))
                carries += 1
                continue
            raise TransientError(
                f"claim cancelled: {reasons}", operation="TransactWriteItems", code="Cancelled"
            )

    def _claim_items(
        self,
        key: str,
        name: str,
        message_id: str,
        shard: int,
        now: float,
        claim_expires_at: float,
        arn: str | None,
    ) -> list[dict[str, Any]]:
        return [
            self.launch_slots.claim_item(shard, name, now),
            {
                "Update": {
                    "TableName": self.table,
                    "Key": {"pk": {"S": payload_pk(key)}},
                    "UpdateExpression": (
                        "SET #key = :key, #state = :claimed, holder = :name, updated_at = :now, "
                        "executions = list_append(if_not_exists(executions, :empty), :list) "
                        "ADD attempts :one REMOVE reason, expires_at"
                    ),
                    "ConditionExpression": (
                        "attribute_not_exists(holder) AND attribute_not_exists(redriven) AND attribute_not_exists(redriven_more) AND "
                        "(attribute_not_exists(executions) OR size(executions) < :history)"
                    ),
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
            },
            {
                "Put": {
                    "TableName": self.table,
                    "Item": item(
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
                    ),
                    # Never over a record whose parked messages were not woken (``_carry_parked``),
                    # nor over a run that ended: its name may start afresh on another state machine.
                    "ConditionExpression": f"attribute_not_exists(parked) AND {NOT_ENDED}",
                    "ExpressionAttributeNames": {"#state": "state"},
                    "ExpressionAttributeValues": dict(NOT_ENDED_VALUES),
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            },
        ]

    def _trim_history(self, key: str, existing: dict[str, Any]) -> bool:
        history = list(existing.get("executions", ()))
        if len(history) < HISTORY_LIMIT:
            return False
        # Lost to another trim or a claim: either way the caller looks again.
        self._update_if(
            payload_pk(key),
            "SET executions = :kept",
            "attribute_not_exists(holder) AND size(executions) = :n",
            values(kept=history[-HISTORY_KEEP:], n=len(history)),
            names={},
        )
        return True

    def renew(self, *, name: str, now: float, claim_expires_at: float, arn: str | None = None) -> bool:
        named = values(exp=claim_expires_at, now=now, zero=0, one=1, claimed=PayloadState.CLAIMED.value)
        moved = ""
        if arn is not None:
            moved, named[":arn"] = ", arn = :arn", {"S": arn}
        return self._update_if(
            execution_pk(name),
            "SET claim_expires_at = :exp, renewed_at = :now, "
            "claim_version = if_not_exists(claim_version, :zero) + :one"
            + moved
            + " REMOVE suspect_since, suspect_by, starting_at",
            "#state = :claimed AND attribute_not_exists(blocked_by)",
            named,
        )

    def block(self, *, name: str, by: str, now: float) -> bool:
        return self._update_if(
            execution_pk(name),
            "SET blocked_by = :by, blocked_at = :now",
            "#state = :claimed AND attribute_not_exists(starting_at)",
            values(by=by, now=now, claimed=PayloadState.CLAIMED.value),
        )

    def mark_starting(self, *, name: str, now: float) -> bool:
        return self._update_if(
            execution_pk(name),
            "SET starting_at = :now",
            "#state = :claimed AND attribute_not_exists(blocked_by)",
            values(now=now, claimed=PayloadState.CLAIMED.value),
        )

    # -- lanes (sluice.lanes) ------------------------------------------------------------------------

    def lane_rooms(self, lanes: Sequence[str], *, whole: bool = False) -> dict[str, LaneRoom]:
        return self.lane_slots.rooms(lanes, whole=whole)

    def lane_settings(self, lanes: Sequence[str]) -> dict[str, LaneSetting]:
        return self.lane_slots.settings(lanes)

    def set_lane_limit(self, lane: str, limit: int, stamp: float) -> int | None:
        return self.lane_slots.set_limit(lane, limit, stamp)

    def write_lane_setting(self, setting: LaneSetting) -> None:
        self.lane_slots.write_setting(setting)

    def thaw_lane(self, lane: str) -> None:
        self.lane_slots.rebalance(lane)

    def mark_redriven(self, *, key: str, name: str, now: float) -> bool:
        # The key's first mark in ``redriven``; one more while it names another run goes into the
        # set ``redriven_more``, never over it (each unadopted redriven run keeps the key marked).
        held, named = "attribute_exists(holder) AND holder <> :name AND ", values(name=name, now=now)
        free = held + "(attribute_not_exists(redriven) OR redriven = :name)"
        if self._update_if(payload_pk(key), "SET redriven = :name, updated_at = :now", free, named, names={}):
            return True
        more, named[":names"] = "SET updated_at = :now ADD redriven_more :names", {"SS": [name]}
        return self._update_if(payload_pk(key), more, held + "redriven <> :name", named, names={})

    def clear_redriven(self, *, key: str, name: str) -> bool:
        named = {**values(name=name), ":names": {"SS": [name]}}
        first = self._update_if(
            payload_pk(key), "REMOVE redriven", "redriven = :name", values(name=name), names={}
        )
        more = self._update_if(
            payload_pk(key), "DELETE redriven_more :names", "contains(redriven_more, :name)", named, names={}
        )
        return first or more

    def suspect(
        self, *, name: str, claim_version: int, reconciler: str, now: float, replacing: float | None = None
    ) -> bool:
        condition = "#state = :claimed AND (claim_version = :v OR (attribute_not_exists(claim_version) AND :v = :zero))"
        named = values(now=now, by=reconciler, claimed=PayloadState.CLAIMED.value, v=claim_version, zero=0)
        if replacing is None:
            condition += " AND attribute_not_exists(suspect_since)"
        else:
            condition += " AND suspect_since = :old"
            named.update(values(old=replacing))
        return self._update_if(
            execution_pk(name),
            "SET suspect_since = :now, suspect_by = :by, claim_version = :v",
            condition,
            named,
        )

    def mark_running(self, *, key: str, name: str, arn: str, started_at: float, now: float) -> bool:
        items = self._mark_items(key, name, arn, started_at, now)
        return self._transact(items) is None

    def _mark_items(
        self, key: str, name: str, arn: str, started_at: float, now: float
    ) -> list[dict[str, Any]]:
        return [
            {
                "Update": {
                    "TableName": self.table,
                    "Key": {"pk": {"S": payload_pk(key)}},
                    "UpdateExpression": "SET #state = :running, updated_at = :now REMOVE expires_at",
                    "ConditionExpression": "holder = :name",
                    "ExpressionAttributeNames": {"#state": "state"},
                    "ExpressionAttributeValues": values(
                        running=PayloadState.RUNNING.value, now=now, name=name
                    ),
                }
            },
            {
                "Update": {
                    "TableName": self.table,
                    "Key": {"pk": {"S": execution_pk(name)}},
                    "UpdateExpression": (
                        "SET #state = :running, arn = :arn, started_at = :started "
                        "REMOVE expires_at, suspect_since, suspect_by"
                    ),
                    "ConditionExpression": "#state = :claimed",
                    "ExpressionAttributeNames": {"#state": "state"},
                    "ExpressionAttributeValues": values(
                        running=PayloadState.RUNNING.value,
                        arn=arn,
                        started=started_at,
                        claimed=PayloadState.CLAIMED.value,
                    ),
                }
            },
        ]


# An execution record that is not of a run that ended (a claim's Put over a name that ran is refused).
NOT_ENDED = "NOT #state IN (:ended_s, :ended_f, :ended_t, :ended_a)"
NOT_ENDED_VALUES = values(
    ended_s=PayloadState.SUCCEEDED.value,
    ended_f=PayloadState.FAILED.value,
    ended_t=PayloadState.TIMED_OUT.value,
    ended_a=PayloadState.ABORTED.value,
)


def _carry_parked(items: list[dict[str, Any]], parked: list[str]) -> None:
    """Make a claim's items (``_claim_items``) keep the messages parked behind an earlier claim of
    the same name: the earlier one was released and its wake-up lost (a crash, or a park that
    committed while the release was on its way); the new record lists them, so they are woken when
    it ends (``sluice.parking``). Nothing parks behind a released record, so the list is as read."""
    put = items[2]["Put"]
    put["Item"]["parked"] = {"SS": parked}
    put["ConditionExpression"] = f"(attribute_not_exists(parked) OR size(parked) = :nparked) AND {NOT_ENDED}"
    put["ExpressionAttributeValues"] = {**NOT_ENDED_VALUES, ":nparked": {"N": str(len(parked))}}

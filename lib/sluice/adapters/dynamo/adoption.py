"""The adoption of an execution running again (a redrive), in the launcher's table: its slot, its
key's lease and its record taken back in one transaction (``Store.adopt``). A part of
``sluice.adapters.dynamo.store.DynamoStore``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.adapters.dynamo.codec import execution_pk, payload_pk, values
from sluice.adapters.dynamo.lanes import LaneSlots
from sluice.adapters.dynamo.launch_slots import POOL, LaunchSlots
from sluice.adapters.dynamo.release import ReleaseParts, adoptions_are
from sluice.adapters.dynamo.table import TableRef
from sluice.core.model import ExecutionRecord, PayloadState

ADOPT_ROUNDS = 3  # an adoption whose slot conditions failed (the pool moved) is tried again


@dataclass(frozen=True, slots=True)
class _Adopted:
    """The execution taken back, when, and Step Functions' date of the redrive it runs after."""

    name: str
    now: float
    redriven_at: float | None
    by: str | None  # whose clock ``now`` is


class AdoptionsTable:
    def __init__(
        self, db: TableRef, launch_slots: LaunchSlots, lane_slots: LaneSlots, parts: ReleaseParts
    ) -> None:
        self.db = db
        self.launch_slots = launch_slots
        self.lane_slots = lane_slots
        self.records, self.keys = parts.records, parts.keys

    def adopt(
        self, *, name: str, now: float, redriven_at: float | None = None, by: str | None = None
    ) -> bool:
        """Take a slot and the lease back for ``name``, an ended execution RUNNING again (a redrive).

        It runs already, so it counts against MAX whatever MAX is: a shard with room, else past a
        cap of a pool frozen first (``DynamoSlots.adoption``), so no crash leaves caps that admit
        beside it. Refused when the key's lease is held by another execution (then it counts as
        external). A slot condition that failed (the pool moved since the read) is tried again.
        """
        record = self.records.execution(name)
        if record is None or record.state.holds_lease:
            return False
        payload = next(iter(self.db.batch_get([payload_pk(record.key)])), {})
        if payload.get("holder"):
            return False  # another run holds the key: refused before any pool is frozen for it
        other = payload.get("redriven") if payload.get("redriven") != name else None
        for _ in range(ADOPT_ROUNDS):
            shard, takes = self.launch_slots.adopt_items(name, now)
            lane_take = (
                self.lane_slots.adopt_items(record.lane, name, now) if record.lane is not None else None
            )
            items = [
                self._adopt_lease(record, name, now, other),
                self._adopt_record(record, _Adopted(name, now, redriven_at, by), shard, lane_take),
            ]
            if record.ckey is not None:
                items.append(self.keys.key_adopt_item(record.ckey, name))
            slots = len(items)  # the slot items follow: their conditions alone are retried
            items.extend(takes)
            if lane_take is not None:
                items.extend(lane_take[1])
            reasons = self.db.transact(items)
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

    def sight_adoption(self, *, record: ExecutionRecord, by: str, now: float) -> bool:
        """Added to the sightings, only while ``record``'s adoption is held (its ``adopted_at`` and
        count): a sighting of an earlier one left by an older version's adoption is replaced; an
        adoption an older version wrote has no map: it is made with this one."""
        if record.adopted_at is None:
            return False
        held = "#state = :running AND adopted_at = :adopted AND " + adoptions_are(record.adoptions)
        named = values(running=PayloadState.RUNNING.value, adopted=record.adopted_at)
        if record.adoptions:
            named.update(values(counted=record.adoptions))
        if self.db.update_if(
            execution_pk(record.name),
            "SET adoption_seen.#by = :seen",
            held + " AND attribute_exists(adoption_seen)"
            " AND (attribute_not_exists(adoption_seen.#by) OR adoption_seen.#by[0] <> :adopted)",
            {**named, **values(seen=[record.adopted_at, now])},
            names={"#state": "state", "#by": by},
        ):
            return True
        return self.db.update_if(
            execution_pk(record.name),
            "SET adoption_seen = :seen",
            held + " AND attribute_not_exists(adoption_seen)",
            {**named, **values(seen={by: [record.adopted_at, now]})},
        )

    def _adopt_lease(
        self, record: ExecutionRecord, name: str, now: float, other: str | None
    ) -> dict[str, Any]:
        """The key's lease, and its own mark lifted. The first mark (``redriven``) is lifted only if
        it is its own: one naming another run, read before, stays (held by the condition), or that
        run, unmarked, would let a claim start beside it once this one ends."""
        named = values(key=record.key, running=PayloadState.RUNNING.value, name=name, now=now)
        named[":names"] = {"SS": [name]}  # its own mark, if it was one of the key's further marks
        removes, condition = (
            "expires_at, redriven, redriven_at, redriven_by",
            "attribute_not_exists(redriven) OR redriven = :name",
        )
        if other is not None:
            removes, condition, named[":other"] = "expires_at", "redriven = :other", {"S": other}
        return {
            "Update": {
                "TableName": self.db.table,
                "Key": {"pk": {"S": payload_pk(record.key)}},
                "UpdateExpression": (
                    "SET #key = :key, #state = :running, holder = :name, updated_at = :now "
                    f"REMOVE {removes} DELETE redriven_more :names"
                ),
                "ConditionExpression": f"attribute_not_exists(holder) AND ({condition})",
                "ExpressionAttributeNames": {"#key": "key", "#state": "state"},
                "ExpressionAttributeValues": named,
            }
        }

    def _adopt_record(
        self,
        record: ExecutionRecord,
        adopted: _Adopted,
        shard: int,
        lane_take: tuple[int, list[dict[str, Any]]] | None,
    ) -> dict[str, Any]:
        sets = "SET #state = :running, adopted_at = :now, #shard = :shard "
        # the end before, and the redrive after it: a stale DescribeExecution may still answer with
        # an end from before that redrive (sluice.launch.completion.earlier_end)
        dates = {"earlier": record.ended_at, "redriven": adopted.redriven_at}
        dates = {k: v for k, v in dates.items() if v is not None}
        if "earlier" in dates:
            sets += ", earlier_end_at = :earlier "
        if "redriven" in dates:
            sets += ", redriven_at = :redriven "
        # its first sighting, the adopter's: an earlier adoption's sightings go, and the count
        # read tells this adoption from any other, also one stamped with the same time
        sets += ", adoption_seen = :seen, adoptions = :adoptions "
        seen = {} if adopted.by is None else {adopted.by: [adopted.now, adopted.now]}
        update = {
            "TableName": self.db.table,
            "Key": {"pk": {"S": execution_pk(adopted.name)}},
            "UpdateExpression": sets + "REMOVE expires_at, ended_at, #output, output_ref, output_size",
            "ConditionExpression": "#state = :was AND " + adoptions_are(record.adoptions),
            "ExpressionAttributeNames": {"#state": "state", "#shard": "shard", "#output": "output"},
            "ExpressionAttributeValues": values(
                running=PayloadState.RUNNING.value,
                now=adopted.now,
                was=record.state.value,
                shard=shard,
                seen=seen,
                adoptions=record.adoptions + 1,
                **({"counted": record.adoptions} if record.adoptions else {}),
                **dates,
            ),
        }
        if lane_take is not None:
            update["UpdateExpression"] = update["UpdateExpression"].replace(
                "#shard = :shard ", "#shard = :shard, lane_shard = :lane_shard ", 1
            )
            update["ExpressionAttributeValues"].update(values(lane_shard=lane_take[0]))
        return {"Update": update}

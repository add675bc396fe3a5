"""Lanes' slots (``sluice.features.lanes``) in the Sluice table: one sharded pool per lane.

    SLOTS#lane-<name>       limit, shards, per_shard, frozen, version, stamp   (sluice.adapters.dynamo.slots)
    SLOTS#lane-<name>#<i>   holders (map name -> claimed_at), cap
    LANE#<name>             max (the operator's override, absent: the configured MAX), paused,
                            changed_at (the stamp of the lane's limit)

A start in a lane takes a slot of the global pool and one of its lane's pool in the claim's one
transaction (``DynamoStore.claim``), and ``EXEC#<name>`` records ``lane`` and ``lane_shard``; the
release gives both back in its transaction, and the adoption of a redriven run takes both. So the
sum of a lane's holders never passes its caps, nor the global holders the global caps, whatever
launchers and completions overlap:

    launcher A (lane gpu, cap 2, 1 held)        launcher B (lane gpu)
    ────────────────────────────────────        ─────────────────────
    claim: global shard 3 ✓, gpu shard 0 ✓      claim: global shard 5 ✓, gpu shard 0 ✗ (2 held)
                                                → the whole transaction fails: B takes no global slot

A lane's limit is moved like the global one (``DynamoSlots.set_limit``), stamped with the lane's
``changed_at``, so that a tick still holding the configured MAX never undoes an operator's newer one.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sluice.adapters.dynamo.codec import plain
from sluice.adapters.dynamo.slots import (
    DynamoSlots,
    claim_item,
    pool_pk,
    release_item,
    shard_pk,
    to_occupancy,
)
from sluice.adapters.errors import translated
from sluice.core.records import POOL_PREFIX, LaneRoom, LaneSetting
from sluice.primitives.slots import Capacity, Occupancy, Shard, candidates, sample_shards

LANE_PK = "LANE#"
FIRST_READ = 4  # shards read of a pool whose size is not known yet
TRIES = 3  # lane shards one claim tries
SAMPLE = 98  # shards one read of the lanes covers, shared among them (with the pool items: 100 keys)
NEARLY_FULL = 10  # a lane's sample with less room than one receive's worth: read that lane whole


def lane_pk(name: str) -> str:
    return LANE_PK + name


def to_setting(name: str, raw: dict[str, Any] | None) -> LaneSetting | None:
    if raw is None:
        return None
    return LaneSetting(
        name=name,
        max=None if raw.get("max") is None else int(raw["max"]),
        paused=bool(raw.get("paused", False)),
        changed_at=float(raw.get("changed_at", 0)),
    )


class LaneSlots:
    """Where lanes' holders live; builds the lane half of claims, releases and adoptions."""

    def __init__(self, slots: DynamoSlots, *, rng: random.Random | None = None) -> None:
        self.slots = slots
        self.table = slots.table
        self.rng = rng or random.Random()
        self.views: dict[str, Occupancy] = {}  # each lane's pool as last read, with our own claims
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()  # claims of one tick run on several threads (sluice.primitives.fanout)

    # -- reads ------------------------------------------------------------------------------------

    def rooms(self, lanes: Sequence[str], *, whole: bool = False) -> dict[str, LaneRoom]:
        """Every lane's pool item and shards, read consistently in one BatchGetItem (per 100 keys).

        A lane whose pool has more shards than its part of one read (``SAMPLE`` shared among the
        lanes) is read by a random sample of them, unless ``whole``: its ``free`` is then the room
        of the shards read (a lower bound, and exactly what a claim can choose from), so the cost of
        an admission does not grow with a lane's MAX. A sample with less room than one receive
        takes is read whole after all (near full, where a sample would miss the last free slots)."""
        budget = max(FIRST_READ, SAMPLE // max(1, len(lanes)))
        plan = {lane: self._indexes(lane, budget, whole) for lane in lanes}
        keys = [
            k for lane in lanes for k in (pool_pk(POOL_PREFIX + lane), *self._shard_keys(lane, plan[lane]))
        ]
        found = {r["pk"]: r for r in self.slots._batch_get(keys)}
        again = []
        for lane in lanes:
            meta = found.get(pool_pk(POOL_PREFIX + lane)) or {}
            count = int(meta.get("shards", 0))
            self._counts[lane] = count
            read = plan[lane]
            if count > len(read) and (whole or count <= budget):
                plan[lane] = list(range(count))  # a pool bigger than thought: the rest, once
                again += self._shard_keys(lane, [i for i in range(count) if i not in set(read)])
        if again:
            found.update((r["pk"], r) for r in self.slots._batch_get(again))
        out: dict[str, LaneRoom] = {}
        near_full = []
        for lane in lanes:
            view = self._view(lane, found, plan[lane])
            if not view.complete and view.free < NEARLY_FULL:
                near_full.append(lane)
                continue
            out[lane] = self._room(lane, view)
        if near_full:
            out.update(self.rooms(near_full, whole=True))
        return {lane: out[lane] for lane in lanes}

    def _indexes(self, lane: str, budget: int, whole: bool) -> list[int]:
        count = self._counts.get(lane)
        if count is None:
            return list(range(FIRST_READ))
        if whole or count <= budget:
            return list(range(count))
        return sample_shards(count, self.rng, budget)

    @staticmethod
    def _shard_keys(lane: str, indexes: Sequence[int]) -> list[str]:
        return [shard_pk(POOL_PREFIX + lane, i) for i in indexes]

    def _view(self, lane: str, found: dict[str, Any], indexes: Sequence[int]) -> Occupancy:
        pool = POOL_PREFIX + lane
        meta = found.get(pool_pk(pool))
        keys = set(self._shard_keys(lane, indexes))
        shards = [r for pk, r in found.items() if pk in keys]
        count = int(meta.get("shards", 0)) if meta else 0
        return to_occupancy(pool, meta, shards, len(set(indexes)) if count > len(set(indexes)) else count)

    def _room(self, lane: str, view: Occupancy) -> LaneRoom:
        with self._lock:
            self.views[lane] = view
        return LaneRoom(
            limit=view.limit,
            running=view.running,
            free=view.free,
            exists=view.version > 0,
            complete=view.complete,
            frozen=view.frozen,
            unsettled=view.complete and view.version > 0 and not view.frozen and view.caps != view.limit,
        )

    def settings(self, lanes: Sequence[str]) -> dict[str, LaneSetting]:
        found = {r["pk"]: r for r in self.slots._batch_get([lane_pk(lane) for lane in lanes])}
        out = {}
        for lane in lanes:
            setting = to_setting(lane, found.get(lane_pk(lane)))
            if setting is not None:
                out[lane] = setting
        return out

    def write_setting(self, setting: LaneSetting) -> None:
        update = "SET changed_at = :at, paused = :paused"
        named: dict[str, Any] = {":at": {"N": repr(setting.changed_at)}, ":paused": {"BOOL": setting.paused}}
        if setting.max is None:
            update += " REMOVE #max"
        else:
            update += ", #max = :max"
            named[":max"] = {"N": str(setting.max)}
        with translated("UpdateItem"):
            self.slots.client.update_item(
                TableName=self.table,
                Key={"pk": {"S": lane_pk(setting.name)}},
                UpdateExpression=update,
                ExpressionAttributeNames={"#max": "max"},
                ExpressionAttributeValues=named,
            )

    def set_limit(self, lane: str, limit: int, stamp: float) -> int | None:
        plan = self.slots.set_limit(Capacity(POOL_PREFIX + lane, limit, (stamp,)))
        with self._lock:
            self.views.pop(lane, None)  # read again before the next claim
        return None if plan is None else plan.limit

    # -- claims -----------------------------------------------------------------------------------

    def choices(self, lane: str, *, fresh: bool = False) -> list[int]:
        """Shards of ``lane`` to try, from the last read of its pool (``fresh``: read it now)."""
        view = None if fresh else self.views.get(lane)
        if view is None:
            self.rooms([lane])
            view = self.views[lane]
        return candidates(view, self.rng)[:TRIES]

    def claim_item(self, lane: str, shard: int, name: str, now: float) -> dict[str, Any]:
        return claim_item(self.table, POOL_PREFIX + lane, shard, name, now)

    def took(self, lane: str, shard: int, name: str, now: float) -> None:
        self._change(lane, shard, lambda s: {**s.holders, name: now})

    def full(self, lane: str, shard: int, seen: dict[str, Any] | None) -> None:
        """A claim on ``shard`` of ``lane`` found no room: remember it as it was (or as full)."""
        if seen:
            current = plain(seen)
            holders = {str(k): float(v) for k, v in (current.get("holders") or {}).items()}
            self._change(lane, shard, lambda s: holders, cap=int(current.get("cap", 0)))
        else:
            self._change(lane, shard, lambda s: s.holders, cap=0)

    def _change(self, lane: str, index: int, holders: Any, cap: int | None = None) -> None:
        with self._lock:
            view = self.views.get(lane)
            if view is None:
                return
            shards = tuple(
                Shard(s.index, s.cap if cap is None else cap, holders(s)) if s.index == index else s
                for s in view.shards
            )
            self.views[lane] = replace(view, shards=shards)

    # -- release and adoption ---------------------------------------------------------------------

    def release_item(self, lane: str, shard: int, name: str) -> dict[str, Any]:
        return release_item(self.table, POOL_PREFIX + lane, shard, name)

    def adopt_items(self, lane: str, name: str, now: float) -> tuple[int, list[dict[str, Any]]] | None:
        """A slot of ``lane`` for a run that runs already, as items of the adoption's transaction
        (``DynamoSlots.adoption``: a shard with room, else past a cap of the lane's pool frozen
        first). None when the lane has no pool (it was removed from the stack's lanes)."""
        self.rooms([lane], whole=True)
        view = self.views[lane]
        if view.version == 0:
            return None
        return self.slots.adoption(POOL_PREFIX + lane, name, now, view)

    def rebalance(self, lane: str) -> None:
        """Plan the lane's caps again under its limit in force: a frozen pool whose holders fit under
        it again is thawed (``sluice.primitives.slots``); one that does not stays frozen."""
        self.slots.rebalance(POOL_PREFIX + lane)
        with self._lock:
            self.views.pop(lane, None)

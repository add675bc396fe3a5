"""Slots (``sluice.primitives.slots``) in the Sluice table (partition key ``pk``).

    SLOTS#<pool>        limit, shards (count), per_shard, frozen, version
    SLOTS#<pool>#<i>    holders: map name -> claimed_at; cap        (i in 0 .. shards - 1)

The holder writes (claim, take, release, swap) and the shard's size: ``sluice.adapters.dynamo.slot_items``.

Changing the limit (``set_limit``, ``rebalance``) reads the pool item and every shard
consistently, plans with ``sluice.primitives.slots.plan_caps`` and writes only the shards whose cap moves:

    existing shard   SET cap = :new                   IF cap = :old AND size(holders) <= :new
                                                      (a freeze: IF cap = :old)
    new shard        SET cap = :new, holders = {}     IF the item does not exist
    pool item        SET limit, shards, frozen, stamp, version = v + 1      IF version = v
    restamp          SET stamp = :new, version = version + 1        IF stamp = :old

With at most 99 shards moving, all in one transaction. Otherwise in transactions of 99 shards,
decreases first, each with the pool item: the one that holds the first increase (or the last) writes
the new limit, the others ``SET version = v + 1 IF version = v``. Every transaction moves the version,
so a planner that read between two of them fails its own write; and until the caps are lowered the
old limit stays stored, so a planner that dies between them leaves caps that admit no more than the
limit the pool says is in force:

    planner A: 40 → 150 (110 raises)           planner B: → 30
    ────────────────────────────────           ───────────────
    limit 150, shards 0..98 raised  v → v+1
                                               read: v+1, shards 99..109 at cap 0
    shards 99..109 raised           v+1 → v+2
                                               write IF version = v+1  ✗ (a check alone let it
                                               land, keeping the caps it never read: 129 under 30)
                                               read again, plan anew

Any failed condition (a claim filled a shard past its new cap, a cap moved, the version moved)
means: read again and plan again; once its limit is written, a planner whose limit or stamp is no
longer the pool's stops. A stamped limit older than the pool's (``Occupancy.newer_than``)
is not written at all: the comparison is made on the read that the version condition commits.

    planner                                    claimer on shard 2
    ───────                                    ──────────────────
    read: shard 2 cap 2, 1 held                look: shard 2 has room
    plan: shard 2 → cap 1                      claim: SET holders.c IF size 1 < cap 2   ✓ (2 held)
    write: cap 1 IF size(holders) <= 1   ✗
    read again: shard 2 2 held → plan anew (or freeze when the pool holds more than the limit)
"""

from __future__ import annotations

import random
import time
import zlib
from collections.abc import Callable, Iterable
from typing import Any

from botocore.exceptions import ClientError

from sluice.adapters.dynamo.codec import plain, values
from sluice.adapters.dynamo.slot_items import (
    HAS_HOLDERS,
    claim_item,
    item_key,
    pool_pk,
    release_item,
    shard_pk,
    swap_item,
    take_item,
)
from sluice.adapters.dynamo.table import CONFLICT_BACKOFF, CONFLICT_RETRIES, Table
from sluice.adapters.errors import error_code, translated
from sluice.core.errors import ConditionFailed, SlotsFull, TransientError
from sluice.primitives.slots import (
    DEFAULT_PER_SHARD,
    LOOK_SHARDS,
    Capacity,
    Move,
    Occupancy,
    Plan,
    Shard,
    candidates,
    check_pool,
    plan_caps,
    plan_freeze,
    sample_shards,
)

__all__ = [
    "DynamoSlots",
    "claim_item",
    "pool_pk",
    "release_item",
    "shard_pk",
    "swap_item",
    "take_item",
    "to_occupancy",
]

PLAN_ROUNDS = 20  # read-plan-write rounds before set_limit gives up (TransientError)
SHARDS_PER_TRANSACTION = 99  # plus the pool item: TransactWriteItems takes 100


def to_occupancy(
    pool: str, meta: dict[str, Any] | None, shards: Iterable[dict[str, Any]], read: int
) -> Occupancy:
    """An ``Occupancy`` from plain items: the pool item (None if absent) and the shard items read."""
    found = []
    for raw in shards:
        index = int(str(raw["pk"]).rsplit("#", 1)[1])
        holders = {str(k): float(v) for k, v in (raw.get("holders") or {}).items()}
        found.append(Shard(index=index, cap=int(raw.get("cap", 0)), holders=holders))
    found.sort(key=lambda s: s.index)
    if meta is None:
        return Occupancy(pool=pool, shards=tuple(found), read=read)
    return Occupancy(
        pool=pool,
        limit=int(meta.get("limit", 0)),
        shard_count=int(meta.get("shards", 0)),
        per_shard=int(meta.get("per_shard", DEFAULT_PER_SHARD)),
        frozen=bool(meta.get("frozen", False)),
        version=int(meta.get("version", 0)),
        shards=tuple(found),
        read=read,
        stamp=tuple(float(x) for x in meta.get("stamp") or ()),
    )


class DynamoSlots(Table):
    def __init__(
        self,
        client: Any,
        table_name: str,
        *,
        per_shard: int = DEFAULT_PER_SHARD,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(client, table_name, sleep=sleep)
        if per_shard < 1:
            raise ValueError(f"per_shard must be >= 1, got {per_shard}")
        self.per_shard = per_shard  # for pools this adapter creates; a pool keeps its own
        self.rng = rng or random.Random()
        self._counts: dict[str, int] = {}  # shard counts seen per pool (they only grow)

    # -- reads ------------------------------------------------------------------------------------

    def look(self, pool: str) -> Occupancy:
        """One BatchGetItem, eventually consistent: the pool item and up to 99 shards (a random
        sample once the pool is known to have more). Stale is fine: a claim's condition is exact."""
        known = self._counts.get(pool)
        indexes = sample_shards(known, self.rng) if known else list(range(LOOK_SHARDS))
        meta_key = pool_pk(pool)
        found = self._read([meta_key, *(shard_pk(pool, i) for i in indexes)], consistent=False)
        meta = next((r for r in found if r["pk"] == meta_key), None)
        occupancy = to_occupancy(pool, meta, (r for r in found if r["pk"] != meta_key), len(indexes))
        self._counts[pool] = max(known or 0, occupancy.shard_count)
        return occupancy

    def occupancy(self, pool: str) -> Occupancy:
        """The pool item and every shard, read consistently (two calls and more past 99 shards)."""
        meta = self._get(pool_pk(pool))
        count = int(meta.get("shards", 0)) if meta else 0
        shards = self._batch_get([shard_pk(pool, i) for i in range(count)]) if count else []
        return to_occupancy(pool, meta, shards, count)

    def _read(self, pks: list[str], *, consistent: bool) -> list[dict[str, Any]]:
        request: dict[str, Any] = {
            self.table: {"Keys": [item_key(pk) for pk in pks], "ConsistentRead": consistent}
        }
        found: list[dict[str, Any]] = []
        while request:
            with translated("BatchGetItem"):
                response = self.client.batch_get_item(RequestItems=request)
            found.extend(plain(raw) for raw in response.get("Responses", {}).get(self.table, []))
            request = response.get("UnprocessedKeys") or {}
        return found

    # -- holders ----------------------------------------------------------------------------------

    def claim(self, pool: str, shard: int, name: str, now: float) -> None:
        was = self._update(claim_item(self.table, pool, shard, name, now)["Update"])
        if was is None or name in (was.get("holders") or {}):
            return  # taken now, or by an earlier attempt whose answer was lost
        raise SlotsFull(int(was.get("cap", 0)))

    def ensure_shard(self, pool: str, shard: int) -> None:
        """Create ``shard``'s item (cap 0, no holders) if it was never written; never changes one."""
        with translated("UpdateItem"):
            self.client.update_item(
                TableName=self.table,
                Key=item_key(shard_pk(pool, shard)),
                UpdateExpression="SET cap = if_not_exists(cap, :zero), holders = if_not_exists(holders, :empty)",
                ExpressionAttributeValues=values(zero=0, empty={}),
            )

    def release(self, pool: str, shard: int, name: str) -> bool:
        return self._update(release_item(self.table, pool, shard, name)["Update"]) is None

    def swap(self, pool: str, shard: int, old: str, new: str, now: float) -> bool:
        was = self._update(swap_item(self.table, pool, shard, old, new, now)["Update"])
        if was is None:
            return True
        holders = was.get("holders") or {}
        if old not in holders:
            return new in holders  # done already by an earlier attempt, or ``old`` never held here
        if new in holders:
            raise ConditionFailed(f"{new!r} holds a slot on shard {shard} of {pool!r} already")
        raise SlotsFull(int(was.get("cap", 0)))

    def _update(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """One conditional UpdateItem. None when written; the item as it was (``{}`` if absent or
        not returned) when the condition failed. A conflict with a transaction is asked again."""
        for attempt in range(CONFLICT_RETRIES):
            with translated("UpdateItem"):
                try:
                    self.client.update_item(**request)
                    return None
                except ClientError as exc:
                    code = error_code(exc)
                    if code == "ConditionalCheckFailedException":
                        return plain(exc.response.get("Item") or {})
                    if code != "TransactionConflictException":
                        raise
            # A planner's transaction held the shard for a moment.
            self.sleep(CONFLICT_BACKOFF * 2**attempt)
        raise TransientError(
            "UpdateItem: shard kept conflicting with transactions",
            operation="UpdateItem",
            code="TransactionConflictException",
        )

    # -- the limit --------------------------------------------------------------------------------

    def set_limit(self, capacity: Capacity) -> Plan | None:
        return self._plan(capacity.pool, capacity)

    # -- adoption ---------------------------------------------------------------------------------

    def adoption(self, pool: str, name: str, now: float, view: Occupancy) -> tuple[int, list[dict[str, Any]]]:
        """A slot of ``pool`` for ``name``, which runs already (an adoption): the shard and the
        TransactWriteItems items for the caller's transaction, from ``view`` (every shard, read
        consistently). A failed condition on them means: read the pool again and retry.

        An unfrozen pool never holds a shard past its cap, so the caps bound the holders at every
        instant, whatever point an adopter dies at:

            a shard with room   → a claim on it (IF size(holders) < cap)
            no room anywhere    → freeze the pool first (every cap 0), then take a slot past the cap
                                  IF the pool is still frozen at the version read after the freeze;
                                  the caller re-plans after (frozen while more run than the limit)

            adopter (pool full: 4 of 4)                 launchers, completions
            ───────────────────────────                 ──────────────────────
            freeze: caps 2+2 → 0+0, version v
                                                        claim IF size < cap  ✗ (nothing admitted)
            take r IF frozen AND version v  ✓  5 held, version v + 1
            ✝ dies before it re-plans                   a holder ends: 4 held; claims still ✗
                                                        3 held < 4: thaw (rebalance): caps cover
                                                        the 3 and leave 1 free
        Without the freeze, a slot taken past a full shard's cap while the caps still summed to the
        limit let every other shard refill its ends: 5 ran under 4 until the adopted run ended."""
        roomy = candidates(view, self.rng)
        if roomy:
            return roomy[0], [claim_item(self.table, pool, roomy[0], name, now)]
        if not (view.frozen and view.complete and view.caps == 0):
            # (A freeze in steps whose planner died leaves some caps at 0 and ``frozen`` not yet set.)
            self.freeze(pool)
            view = self.occupancy(pool)
        # Only a pool frozen whole may hold a slot past a cap: after a freeze that another planner
        # overtook (or that gave up between its steps), the check below cannot hold: read again.
        version = view.version if view.frozen and view.caps == 0 else -1
        shard = zlib.crc32(name.encode("utf-8", "surrogatepass")) % max(1, view.shard_count)
        if shard not in {s.index for s in view.shards}:
            self.ensure_shard(pool, shard)
        return shard, [take_item(self.table, pool, shard, name, now), self._frozen_take(pool, version)]

    def _frozen_take(self, pool: str, version: int) -> dict[str, Any]:
        """The pool item's side of a take past a cap: it moves the version, so a planner that read the
        pool before the take fails its ``version = v`` and plans again with the taken holder:

            planner (thaw)                      adopter
            ──────────────                      ───────
            read: frozen, version v, B holds 0
                                                take r on B IF frozen AND version v  ✓ v → v+1
            write: A cap 1, B stays 0 IF v  ✗   (a check alone left v: the thaw landed, B held
            read again: B holds 1 → plan anew    1 past its cap 0 beside A's free cap)"""
        return {
            "Update": {
                "TableName": self.table,
                "Key": item_key(pool_pk(pool)),
                "UpdateExpression": "ADD version :one",
                "ConditionExpression": "version = :version AND frozen = :frozen",
                "ExpressionAttributeValues": values(version=version, frozen=True, one=1),
            }
        }

    def rebalance(self, pool: str) -> Plan | None:
        return self._plan(check_pool(pool), None)

    def freeze(self, pool: str) -> Plan | None:
        """Every cap to 0, the limit kept (``frozen``): nothing is admitted until ``rebalance``
        finds the holders under the limit. None when the pool is absent."""
        return self._plan(check_pool(pool), None, freeze=True)

    def restamp(self, pool: str, stamp: tuple[float, ...], replaces: tuple[float, ...]) -> bool:
        """``SET stamp = :new, version = version + 1 IF stamp = :old`` on the pool item (or IF no
        stamp, when it had none): one write unit."""
        update: dict[str, Any] = {
            "TableName": self.table,
            "Key": item_key(pool_pk(check_pool(pool))),
            "UpdateExpression": "SET stamp = :stamp ADD version :one",
            "ExpressionAttributeValues": values(stamp=list(stamp), one=1),
        }
        if replaces:
            update["ConditionExpression"] = "stamp = :old"
            update["ExpressionAttributeValues"].update(values(old=list(replaces)))
        else:
            update["ConditionExpression"] = "attribute_exists(version) AND attribute_not_exists(stamp)"
        return self._update(update) is None

    def _plan(self, pool: str, target: Capacity | None, *, freeze: bool = False) -> Plan | None:
        took_version = False
        for _ in range(PLAN_ROUNDS):
            current = self.occupancy(pool)
            if current.version == 0 and target is None:
                return None
            if took_version and (
                target is None or (current.limit, current.stamp) != (target.limit, target.stamp)
            ):
                return None  # a later set_limit is in force
            # Once this planner has taken the version, the pool's stamp is its own: finish the caps.
            if target is not None and not took_version and target.refused_by(current):
                return None  # a limit from a newer reading is in force
            limit = current.limit if target is None else target.limit
            stamp = current.stamp if target is None else target.stamp
            per_shard = current.per_shard if current.version else self.per_shard
            plan = (plan_freeze if freeze else plan_caps)(limit, per_shard, current.loads())
            if current.version and not plan.moves and _same(current, plan) and stamp == current.stamp:
                return plan
            existing = {s.index for s in current.shards}
            updates = [self._cap_item(pool, m, m.shard in existing, plan.frozen) for m in plan.moves]
            if len(updates) <= SHARDS_PER_TRANSACTION:
                meta = self._pool_item(pool, current.version, plan, per_shard, stamp)
                if self._transact([meta, *updates]) is None:
                    return self._done(pool, plan)
                continue
            version = current.version
            for chunk, limit_with_it in _steps(plan, updates):
                head = (
                    self._pool_item(pool, version, plan, per_shard, stamp)
                    if limit_with_it
                    else self._version_step(pool, version)
                )
                if self._transact([head, *chunk]) is not None:
                    break
                version += 1
                took_version = took_version or limit_with_it
            else:
                return self._done(pool, plan)
        raise TransientError(
            f"set_limit on {pool!r}: the shards kept changing", operation="TransactWriteItems"
        )

    def _done(self, pool: str, plan: Plan) -> Plan:
        self._counts[pool] = max(self._counts.get(pool, 0), plan.shard_count)
        return plan

    def _pool_item(
        self, pool: str, version: int, plan: Plan, per_shard: int, stamp: tuple[float, ...]
    ) -> dict[str, Any]:
        update: dict[str, Any] = {
            "TableName": self.table,
            "Key": item_key(pool_pk(pool)),
            "UpdateExpression": (
                "SET #limit = :limit, shards = :shards, per_shard = :per, frozen = :frozen, version = :next"
                + (", stamp = :stamp" if stamp else " REMOVE stamp")
            ),
            "ExpressionAttributeNames": {"#limit": "limit"},
            "ExpressionAttributeValues": values(
                limit=plan.limit, shards=plan.shard_count, per=per_shard, frozen=plan.frozen, next=version + 1
            ),
        }
        if stamp:
            update["ExpressionAttributeValues"].update(values(stamp=list(stamp)))
        if version:
            update["ConditionExpression"] = "version = :version"
            update["ExpressionAttributeValues"].update(values(version=version))
        else:
            update["ConditionExpression"] = "attribute_not_exists(pk)"
        return {"Update": update}

    def _version_step(self, pool: str, version: int) -> dict[str, Any]:
        return {
            "Update": {
                "TableName": self.table,
                "Key": item_key(pool_pk(pool)),
                "UpdateExpression": "SET version = :next",
                "ConditionExpression": "version = :version",
                "ExpressionAttributeValues": values(version=version, next=version + 1),
            }
        }

    def _cap_item(self, pool: str, move: Move, exists: bool, freeze: bool) -> dict[str, Any]:
        update: dict[str, Any] = {"TableName": self.table, "Key": item_key(shard_pk(pool, move.shard))}
        if not exists:
            update["UpdateExpression"] = "SET cap = :new, holders = :empty"
            update["ConditionExpression"] = "attribute_not_exists(pk)"
            update["ExpressionAttributeValues"] = values(new=move.new, empty={})
        elif freeze:
            # Below the holders on purpose: nothing is admitted until rebalance unfreezes.
            update["UpdateExpression"] = "SET cap = :new"
            update["ConditionExpression"] = "cap = :old"
            update["ExpressionAttributeValues"] = values(new=move.new, old=move.old)
        else:
            update["UpdateExpression"] = "SET cap = :new"
            update["ConditionExpression"] = "cap = :old AND " + HAS_HOLDERS + "size(holders) <= :new"
            update["ExpressionAttributeValues"] = values(new=move.new, old=move.old)
        return {"Update": update}


def _steps(plan: Plan, updates: list[dict[str, Any]]) -> list[tuple[list[dict[str, Any]], bool]]:
    """The shard writes in transactions of 99, decreases first (``plan.moves``' order), and which
    one carries the new limit: the one with the first increase, or the last."""
    chunks = [updates[i : i + SHARDS_PER_TRANSACTION] for i in range(0, len(updates), SHARDS_PER_TRANSACTION)]
    rising = next((i for i, m in enumerate(plan.moves) if not m.decrease), len(updates) - 1)
    return [(chunk, n == rising // SHARDS_PER_TRANSACTION) for n, chunk in enumerate(chunks)]


def _same(current: Occupancy, plan: Plan) -> bool:
    return (current.limit, current.frozen, current.shard_count) == (plan.limit, plan.frozen, plan.shard_count)

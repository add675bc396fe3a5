"""The launcher's slots: the sharded pool ``launcher`` (``sluice.primitives.slots``) in the Sluice table.

    LEDGER                 external (external_count, external_from: its listing's numbers, see
                           ``sluice.core.external``), drift, reconciled_at; ``holders`` only on a table written by a
                           version before the shards (legacy holders, released as they end)
    SLOTS#launcher         limit, shards, per_shard, frozen, version       (sluice.adapters.dynamo.slots)
    SLOTS#launcher#<i>     holders (map name -> claimed_at), cap

Each holder sits in one shard, recorded on its ``EXEC#<name>`` (``shard``). A claim writes that
shard only, conditioned on the shard alone (``size(holders) < cap``): no item is rewritten by every
start, and an item holds at most ``per_shard`` names whatever MAX is.

The caps carry the limit, and nothing else does: a claim obeys them and passes no limit of its
own. Only the scheduled tick and the operator's commands (``sluice set-max``, ``pause``,
``resume``) move them (``set_limit``: MAX − external − legacy holders), each with the stamp of
the readings it worked the limit out from, so that a launcher holding an older MAX never undoes
a newer one (``sluice.primitives.slots``, "Stamped limits"). The caps always add up to the limit in force,
so the sum of all shards' holders never passes it (see ``sluice.primitives.slots`` for why, and for the
freeze when the limit drops below the holders).

Choosing a shard uses the last read of the pool (``Ledger`` reads it whole): a claim tries up to
``TRIES`` shards with room, and reads the pool again once before it reports the slots full.

    launcher A                          launcher B                     shard 3 (cap 2, 1 held)
    ──────────                          ──────────
    read: shard 3 has room              read: shard 3 has room
    claim a IF size < cap  ✓                                           2 held
                                        claim b IF size < cap  ✗       (B tries another shard)
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
from sluice.core.errors import Contended
from sluice.core.limits import Ledger, LimitSource
from sluice.primitives.slots import Capacity, Occupancy, Shard, candidates, sample_shards

LEDGER_PK = "LEDGER"
POOL = "launcher"
TRIES = 3  # shards a claim tries from one read of the pool
FIRST_READ = 8  # shards read with the ledger before the pool's size is known; then exactly its shards
MERGE_ROUNDS = 5  # set_limit's read-merge-write rounds when other writers keep moving the pool
SAMPLE = 98  # shards one admission read covers: with LEDGER and the pool item, 100 keys
NEARLY_FULL = 10  # a sample with less room than one receive's worth: read every shard instead


class LaunchSlots:
    """Where the launcher's holders live; builds the slot half of claims, releases and adoptions."""

    def __init__(self, slots: DynamoSlots, *, rng: random.Random | None = None) -> None:
        self.slots = slots
        self.table = slots.table
        self.rng = rng or random.Random()
        self.view: Occupancy | None = None  # the pool as last read, with this store's own claims
        self.legacy: frozenset[str] = frozenset()  # LEDGER.holders as last read
        # LEDGER as last read: external, reconciled_at, drift, the external count's numbers, the counter
        self.figures: tuple[int, float | None, int, int, int, int] = (0, None, 0, 0, 0, 0)
        self.fresh: frozenset[int] = frozenset()  # the shards the last read covered
        self.ledger_read = False  # LEDGER read at least once (a shard's look does not read it)
        self._count = FIRST_READ
        self._lock = threading.Lock()  # claims of one tick run on several threads (sluice.primitives.fanout)

    # -- reads ------------------------------------------------------------------------------------

    def ledger(self) -> Ledger:
        """LEDGER, the pool item and every shard, consistently: one BatchGetItem up to 98 shards."""
        keys = [LEDGER_PK, pool_pk(POOL), *(shard_pk(POOL, i) for i in range(self._count))]
        found = {r["pk"]: r for r in self.slots._batch_get(keys)}
        meta = found.get(pool_pk(POOL))
        count = int(meta.get("shards", 0)) if meta else 0
        read = self._count
        if count > read:
            rest = [shard_pk(POOL, i) for i in range(read, count)]
            found.update((r["pk"], r) for r in self.slots._batch_get(rest))
        self._count = count  # next time, exactly the pool's shards (none before its first claim)
        shards = [r for pk, r in found.items() if pk.startswith(pool_pk(POOL) + "#")]
        self.view = to_occupancy(POOL, meta, shards, max(count, read))
        self.fresh = frozenset(s.index for s in self.view.shards)
        return self._ledger(found.get(LEDGER_PK) or {})

    def look(self, shards: Sequence[int] | None = None) -> Ledger:
        """What admission needs before a receive, in one BatchGetItem whatever the pool's size.

        Without ``shards``: LEDGER, the pool item and every shard up to ``SAMPLE`` of them (the
        whole ledger), else a random ``SAMPLE`` (``Ledger.complete`` False), or, when the sample
        shows less room than one receive takes, every shard after all (near full, where a sample
        would miss the last free slots: once per tick, not per start). With ``shards`` (the
        one a completion just freed): the pool item and those shards only. ``Ledger.room`` is the
        room the shards read have, a count of free slots that is exact for them at the read, so a
        receive sized by it never takes more messages than there are slots to claim."""
        if shards is None and self._count <= SAMPLE:
            return self._whole()
        indexes = list(shards) if shards is not None else sample_shards(self._count, self.rng, SAMPLE)
        keys = [pool_pk(POOL), *(shard_pk(POOL, i) for i in indexes)]
        if shards is None:
            keys.insert(0, LEDGER_PK)
        found = {r["pk"]: r for r in self.slots._batch_get(keys)}
        meta = found.get(pool_pk(POOL))
        self._count = max(self._count, int(meta.get("shards", 0)) if meta else 0)
        read = to_occupancy(
            POOL, meta, (r for pk, r in found.items() if pk.startswith(pool_pk(POOL) + "#")), 0
        )
        known = {s.index: s for s in self.view.shards} if self.view is not None else {}
        known.update((s.index, s) for s in read.shards)
        self.view = replace(read, shards=tuple(known[i] for i in sorted(known)), read=len(known))
        self.fresh = frozenset(s.index for s in read.shards)
        if read.frozen:
            return self._whole()  # rare (MAX lowered below the holders): read all, unfreeze if they fit
        if shards is None and read.free < NEARLY_FULL:
            return self._whole()  # the sample may miss the last free slots: count them all, once
        return self._ledger(found.get(LEDGER_PK) if shards is None else None, sampled=read)

    def _whole(self) -> Ledger:
        ledger = self.ledger()
        return self._ledger(None) if self.thaw() else ledger

    def _ledger(self, raw: dict[str, Any] | None, sampled: Occupancy | None = None) -> Ledger:
        """The ledger as read: LEDGER's figures (or the last ones read, when ``raw`` is None)."""
        if raw is not None:
            self.ledger_read = True
            self.legacy = frozenset(raw.get("holders", ()))
            self.figures = (
                int(raw.get("external", 0)),
                None if raw.get("reconciled_at") is None else float(raw["reconciled_at"]),
                int(raw.get("drift", 0)),
                int(raw.get("external_count", 0)),
                int(raw.get("external_from", 0)),  # absent: written before listings were numbered twice
                int(raw.get("counts", 0)),
            )
        view = self.view
        assert view is not None
        seen = sampled or view
        external, reconciled_at, drift, count, listed_after, numbered = self.figures
        return Ledger(
            holders=frozenset(self.legacy.union(*(s.holders for s in seen.shards))),
            external=external,
            reconciled_at=reconciled_at,
            drift=drift,
            in_force=self.in_force,
            room=seen.free if view.version else 0,
            complete=sampled is None,
            estimated=None if sampled is None else self._estimate(view),
            count=count,
            listed_after=listed_after,
            numbered=numbered,
        )

    def _estimate(self, view: Occupancy) -> int:
        """Holders of the whole pool, scaled up from every shard this store has read (some stale)."""
        known = len(view.shards)
        return round(view.running * max(known, self._count) / max(1, known)) + len(self.legacy)

    # -- the claim --------------------------------------------------------------------------------

    def set_limit(self, source: LimitSource) -> int | None:
        """Bring the caps to MAX − external − legacy holders, from ``source`` merged with the pool's
        own source (its stamp): the newer MAX and the newer external count of the two. Written only
        while the pool's stamp is still the one merged with (compare-and-set), else read and merged
        again. No call when nothing moves; else the planner's calls and one more read."""
        for _ in range(MERGE_ROUNDS):
            if self.view is None or not self.ledger_read:
                self.ledger()  # the legacy holders and LEDGER's figures, not read by a shard's look
            view = self.view
            assert view is not None
            target, stamp = self._target(source, view)
            fenced = bool(stamp)  # an unfenced source (MAX's change time unknown) has no stamp
            # A view of every shard whose caps do not add up to the limit (a planner that stopped
            # between its transactions) is planned again even when the limit and source agree.
            settled = not view.complete or view.caps == view.limit
            if view.version and not view.frozen and view.limit == target and settled:
                # The caps stay; a newer source is still recorded (one write), or a writer holding
                # a count older than ours but newer than the pool's could put its own limit back.
                if view.stamp == stamp or not fenced:
                    break
                if self.slots.restamp(POOL, stamp, view.stamp):
                    self.view = replace(view, stamp=stamp, version=view.version + 1)
                    break
                self.ledger()
                continue
            replaces = view.stamp if view.version and fenced else None
            # No pool as read: create it only if it is still absent. Another writer may have made it
            # meanwhile with a count whose listing overlaps ours: merge with it (read again), never
            # replace it because our number is higher (explorer seed 1857508604).
            only_new = not view.version and fenced
            plan = self.slots.set_limit(Capacity(POOL, target, stamp, replaces, only_new=only_new))
            self.ledger()
            if plan is not None:
                break
        else:
            # Our source never reached the pool: a reconciliation must not save a count the caps do
            # not carry, or a later overlapping listing, merged with the pool alone, undoes it
            # (explorer seed 1398629532).
            if not self._carries(source):
                raise Contended(
                    f"the slot pool changed in each of {MERGE_ROUNDS} rounds", operation="set_limit"
                )
        return self.in_force

    def _target(self, source: LimitSource, view: Occupancy) -> tuple[int, tuple[float, ...]]:
        """The limit and stamp of ``source`` merged with the pool's as ``view`` read it."""
        merged = source.merged(LimitSource.from_stamp(view.stamp) if view.version else None)
        return max(0, merged.limit - len(self.legacy)), merged.stamp()

    def _carries(self, source: LimitSource) -> bool:
        """The pool as last read adds nothing of ``source`` when merged with it: our last write landed
        (its answer lost), or another writer's source, newer or overlapping, covers ours."""
        view = self.view
        return (
            view is not None and bool(view.version) and self._target(source, view) == (view.limit, view.stamp)
        )

    @property
    def in_force(self) -> int | None:
        """The slots the launcher may fill as last read: the pool's limit and the legacy holders."""
        if self.view is None or not self.view.version:
            return None
        return self.view.limit + len(self.legacy)

    def thaw(self) -> bool:
        """A pool frozen by a lowered limit whose holders fit under it again is planned anew
        (``rebalance``, the limit unchanged) and read again: admission need not wait for the next
        tick to unfreeze. True when it did."""
        view = self.view
        if view is None or not (view.frozen and view.complete and view.running < view.limit):
            return False
        self.slots.rebalance(POOL)
        self.ledger()
        return True

    def choices(self) -> list[int]:
        """Shards to try, those of the last read first (what a completion just freed)."""
        if not self.view:
            return []
        order = candidates(self.view, self.rng)
        return ([i for i in order if i in self.fresh] + [i for i in order if i not in self.fresh])[:TRIES]

    def claim_item(self, shard: int, name: str, now: float) -> dict[str, Any]:
        return claim_item(self.table, POOL, shard, name, now)

    def took(self, shard: int, name: str, now: float) -> None:
        self._change(shard, lambda s: {**s.holders, name: now})

    def freed(self, shard: int, name: str, meta: dict[str, Any]) -> None:
        """``name`` gave its slot on ``shard`` back (a completion's release, ``meta`` the pool item
        it read): the next claim tries that shard first, with no read of the pool (it is
        conditioned on the shard as ever: a slot taken meanwhile is found then)."""
        with self._lock:
            if self.view is None:
                held = {"pk": shard_pk(POOL, shard), "holders": {}, "cap": 1}
                self.view = to_occupancy(POOL, meta, [held], 0)
            else:
                shards = {s.index: s for s in self.view.shards}
                was = shards.get(shard, Shard(shard, 1, {}))
                rest = {k: v for k, v in was.holders.items() if k != name}
                shards[shard] = Shard(shard, max(was.cap, len(rest) + 1), rest)
                self.view = replace(self.view, shards=tuple(shards[i] for i in sorted(shards)))
            self.fresh = frozenset({shard})

    def full(self, shard: int, seen: dict[str, Any] | None) -> None:
        """A claim on ``shard`` found no room: remember the shard as it was (or as full)."""
        if seen:
            current = plain(seen)
            holders = {str(k): float(v) for k, v in (current.get("holders") or {}).items()}
            self._change(shard, lambda s: holders, cap=int(current.get("cap", 0)))
        else:
            self._change(shard, lambda s: s.holders, cap=0)

    def _change(self, index: int, holders: Any, cap: int | None = None) -> None:
        with self._lock:
            if self.view is None:
                return
            shards = tuple(
                Shard(s.index, s.cap if cap is None else cap, holders(s)) if s.index == index else s
                for s in self.view.shards
            )
            self.view = replace(self.view, shards=shards)

    # -- release and adoption ---------------------------------------------------------------------

    def release_item(self, name: str, shard: int | None) -> dict[str, Any]:
        if shard is None:  # claimed before the shards: held in LEDGER.holders
            return {
                "Update": {
                    "TableName": self.table,
                    "Key": {"pk": {"S": LEDGER_PK}},
                    "UpdateExpression": "DELETE holders :names",
                    "ConditionExpression": "contains(holders, :name)",
                    "ExpressionAttributeValues": {":names": {"SS": [name]}, ":name": {"S": name}},
                }
            }
        return release_item(self.table, POOL, shard, name)

    def adopt_items(self, name: str, now: float) -> tuple[int, list[dict[str, Any]]]:
        """A slot for an execution that runs already, as items of the adoption's transaction: a claim
        of a shard with room, else a slot past a cap of the pool frozen first
        (``DynamoSlots.adoption``: the caps bound the holders whatever point the adopter dies at).

        Adoptions are rare: the pool is read again first, so a view cached before the pool existed
        never stands in for it."""
        self.ledger()
        view = self.view
        assert view is not None
        if view.version == 0:
            # No pool yet: create it (limit 0; the next tick sets its caps), only if it is still
            # absent: a pool a reconciliation made meanwhile keeps its limit and its count's stamp.
            self.slots.set_limit(Capacity(POOL, 0, only_new=True))
            self.ledger()
            view = self.view
            assert view is not None
        return self.slots.adoption(POOL, name, now, view)

"""AWS as the benchmark sees it: every call counted by API, charged in capacity units, and given a latency.

Sluice's own adapters are replaced by these wrappers around the in-memory adapters
(``sluice.adapters.memory.store``). Each wrapper counts the calls the real adapter would make for the same
method, as ``lib/sluice/adapters/dynamo/store.py``, ``sqs.py``, ``sfn.py`` and ``ssm.py`` make them:

    Store.ledger()              dynamodb:BatchGetItem per 100 keys (LEDGER, the pool, every shard;
                                consistent: 1 RRU per item)
    Store.look()                dynamodb:BatchGetItem: as ledger() up to 98 shards, else LEDGER, the pool
                                and 98 sampled shards; with the freed shard: the pool and that shard
    Store.set_limit()           when the limit moves: GetItem, BatchGetItem of the shards,
                                TransactWriteItems (DynamoSlots.set_limit), then the ledger read again
    Store.claim()               dynamodb:TransactWriteItems      (one shard + PAYLOAD + EXEC, 2 WRU per KB
                                each)
    Store.mark_running()        dynamodb:TransactWriteItems      (PAYLOAD + EXEC)
    Store.release()             dynamodb:GetItem (+ TransactWriteItems when the name holds a lease:
                                its shard + PAYLOAD + EXEC)
    Store.record_duplicate()    dynamodb:UpdateItem
    Store.record_invalid()      dynamodb:UpdateItem
    Store.executions(names)     dynamodb:BatchGetItem per 100 names
    Store.next_count()          dynamodb:UpdateItem on LEDGER (ADD counts, once per reconciliation)
    Store.save_reconciliation() dynamodb:UpdateItem on LEDGER (no holders there any more: small)
    Store.renew()/suspect()     dynamodb:UpdateItem (also block, mark_redriven, clear_redriven)
    Store.adopt()               dynamodb:GetItem + TransactWriteItems
    Store.record_later_success() dynamodb:TransactWriteItems (EXEC + PAYLOAD, + EFFECTS with effects)
    Store.park()                dynamodb:TransactWriteItems (EXEC + PARK + PARKED)
    Store.parked_holders()      dynamodb:GetItem (PARKED, once per reconciliation)
    Store.payload()/execution() dynamodb:GetItem
    Queue.receive()             sqs:ReceiveMessage (a long poll waits in virtual time)
    Queue.delete()/release()    sqs:DeleteMessageBatch / ChangeMessageVisibilityBatch per 10
    Executions.list_running()   states:ListExecutions per page of 1,000 (eventually consistent: a lag)
    SsmMax.reading()            ssm:GetParameter per cache miss (the real SsmMax, on a counting client)
    Store.lane_rooms(lanes)     dynamodb:BatchGetItem per 100 keys (each lane's pool item and the shards this
                                container last saw, 4 before it saw any; once more for a pool that grew)
    Store.lane_settings(lanes)  dynamodb:BatchGetItem (LANE#<name> of every lane)
    Store.key_states(keys)      dynamodb:BatchGetItem per 100 keys (CKEY# of every key with waiters: a fair
                                lane's waker, sluice.features.fair)
    Store.set_lane_limit()      GetItem of the lane's pool, BatchGetItem of its shards, TransactWriteItems
                                (DynamoSlots.set_limit; no write for a limit with an older stamp)
    a claim or release in a lane one more item in its TransactWriteItems (the lane's shard); a claim that
                                finds the lane full (another launcher took its last slot since the read)
                                fails its transaction and reads the lane's pool once more

A call takes effect when it is issued and then costs its latency in virtual time. With a run's
``Quotas`` (``bench.quotas``), StartExecution and every SQS action are refused past their quota, as
AWS refuses them: retried as the SDK retries, then raised as the adapters raise it
(``TransientError(throttled=True)``), and counted (``Meter.refused``). Other APIs never fail, and
transaction conflicts are not simulated; their peak request rates are compared with the quotas that
would throttle them (``QUOTAS``) instead.
"""

from __future__ import annotations

import heapq
import json
import logging
import math
import random
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bench.quotas import SDK_ATTEMPTS, SDK_BACKOFF_BASE, Quotas
from bench.sim import Sim
from sluice.adapters.dynamo.launch_slots import FIRST_READ, NEARLY_FULL, SAMPLE
from sluice.adapters.memory.aws import MemoryExecutions, MemoryQueue, _Queued
from sluice.adapters.memory.store import MemoryStore
from sluice.core.errors import SlotsFull, TransientError
from sluice.core.limits import Ledger, LimitSource
from sluice.core.model import (
    Claim,
    Ending,
    ExecutionInfo,
    ExecutionRecord,
    HandOver,
    Message,
    PayloadRecord,
    StartResult,
)
from sluice.core.records import POOL_PREFIX, LaneRoom, LaneSetting
from sluice.primitives.slots import DEFAULT_PER_SHARD, shards_needed

# Median in-region latency of one call from Lambda, in seconds (assumed; see docs/benchmarks.md).
LATENCY = {
    "dynamodb:GetItem": 0.006,
    "dynamodb:PutItem": 0.008,
    "dynamodb:UpdateItem": 0.008,
    "dynamodb:DeleteItem": 0.008,
    "dynamodb:BatchGetItem": 0.012,
    "dynamodb:TransactWriteItems": 0.020,
    "sqs:ReceiveMessage": 0.012,
    "sqs:DeleteMessage": 0.010,
    "sqs:DeleteMessageBatch": 0.012,
    "sqs:ChangeMessageVisibilityBatch": 0.012,
    "sqs:SendMessage": 0.012,
    "states:StartExecution": 0.030,
    "states:DescribeExecution": 0.020,
    "states:ListExecutions": 0.060,
    "states:DescribeStateMachine": 0.020,
    "ssm:GetParameter": 0.015,
}

# Per-second limits that would throttle the busiest API (us-east-1 defaults), for the warnings.
QUOTAS = {
    "states:StartExecution": 300.0,  # refill per second (bucket 1,300)
    "states:ListExecutions": 5.0,  # refill per second (bucket 200)
    "states:DescribeExecution": 250.0,
    "sqs:ReceiveMessage": 300.0,  # FIFO without high-throughput mode, per API
    "sqs:DeleteMessageBatch": 300.0,
    "sqs:DeleteMessage": 300.0,
    "ssm:GetParameter": 40.0,  # standard throughput
}
HOT_ITEM_WCU = 1_000.0  # one item lives on one partition: at most 1,000 WCU/s
ITEM_LIMIT_BYTES = 400 * 1024

LEDGER_FIXED_BYTES = 60  # pk, external, drift, reconciled_at and the attribute names
SMALL_ITEM_KB = 1  # PAYLOAD#, EXEC# and counter items stay under 1 KB here
SHARD_FIXED_BYTES = 30  # a shard item's pk, cap and the holders map's own bytes
SHARD_ENTRY_BYTES = 10  # per holder: the map entry and its claimed_at number
LANE_FIRST_READ = (
    4  # sluice.adapters.dynamo.lanes.FIRST_READ: a lane pool's shards read before its size is known
)


def _kb(nbytes: int) -> int:
    return max(1, math.ceil(nbytes / 1024))


def _rru(nbytes: int) -> int:
    return max(1, math.ceil(nbytes / 4096))


class Meter:
    """Calls by API, DynamoDB capacity, log bytes and peak per-second rates of one system."""

    def __init__(
        self,
        clock: Any,
        sim: Sim | None = None,
        latency_scale: float = 1.0,
        quotas: Quotas | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.clock = clock
        self.sim = sim
        self.latency_scale = latency_scale
        self.quotas = quotas  # None: every call goes through (the counts alone: moto, scale)
        self.rng = rng or random.Random(0)  # the SDK's jittered waits between retries
        self.refused: dict[str, int] = {}  # calls AWS refused past a quota (bench.quotas)
        self.calls: dict[str, int] = {}
        self.rru = 0.0
        self.wru = 0.0
        self.log_bytes = 0
        self._rate: dict[str, list[float]] = {}  # api -> [second, count, peak]
        self._hot: dict[str, list[float]] = {}  # item -> [second, wcu, peak]
        self.hot_totals: dict[str, float] = {}  # item -> WRU spent on it
        self.hot_writes: dict[str, int] = {}  # item -> writes to it
        self.max_item_bytes: dict[str, int] = {}

    def call(self, api: str, n: int = 1) -> None:
        self.calls[api] = self.calls.get(api, 0) + n
        second = int(self.clock.now())
        r = self._rate.get(api)
        if r is None:
            self._rate[api] = [second, n, n]
        elif second <= r[0]:  # an earlier second (a round's branch) counts in the later one
            r[1] += n
            r[2] = max(r[2], r[1])
        else:
            r[0], r[1] = second, n
            r[2] = max(r[2], n)

    def attempt(self, api: str, scope: object = None) -> None:
        """One call of ``api`` through the SDK: refused past its quota, it is retried as boto3 does
        (``bench.quotas``), each refusal counted and costing its round trip; after the last one the
        adapter's ``TransientError(throttled=True)`` is raised and nothing was done."""
        for attempt in range(1, SDK_ATTEMPTS + 1):
            if self.quotas is None or self.quotas.admit(api, self.clock.now(), scope):
                self.call(api)
                return
            self.refused[api] = self.refused.get(api, 0) + 1
            self.wait(api)
            if attempt == SDK_ATTEMPTS:
                break
            if self.sim is not None:
                self.sim.sleep(self.rng.random() * SDK_BACKOFF_BASE ** (attempt - 1))
        operation = api.split(":", 1)[1]
        raise TransientError(
            f"{operation}: Rate exceeded", operation=operation, code="ThrottlingException", throttled=True
        )

    def hot(self, item: str, wcu: float, nbytes: int) -> None:
        self.hot_totals[item] = self.hot_totals.get(item, 0.0) + wcu
        self.hot_writes[item] = self.hot_writes.get(item, 0) + 1
        second = int(self.clock.now())
        h = self._hot.get(item)
        if h is None:
            self._hot[item] = [second, wcu, wcu]
        elif second <= h[0]:
            h[1] += wcu
            h[2] = max(h[2], h[1])
        else:
            h[0], h[1] = second, wcu
            h[2] = max(h[2], wcu)
        self.max_item_bytes[item] = max(self.max_item_bytes.get(item, 0), nbytes)

    def wait(self, api: str, times: int = 1) -> None:
        if self.sim is not None and self.latency_scale > 0:
            self.sim.sleep(LATENCY[api] * self.latency_scale * times)

    def peak_rates(self) -> dict[str, float]:
        return {api: r[2] for api, r in sorted(self._rate.items())}

    def peak_item_wcu(self) -> dict[str, float]:
        return {item: h[2] for item, h in sorted(self._hot.items())}

    def quota_warnings(self) -> list[str]:
        out = [f"{api}: {n:,} calls refused past the quota" for api, n in sorted(self.refused.items())]
        for api, peak in self.peak_rates().items():
            limit = QUOTAS.get(api)
            enforced = self.quotas is not None and (api.startswith("sqs:") or api == "states:StartExecution")
            if limit is not None and peak > limit and not enforced:
                out.append(f"{api} peaks at {peak:.0f}/s, above the {limit:.0f}/s quota")
        for item, peak in self.peak_item_wcu().items():
            if peak > HOT_ITEM_WCU:
                out.append(
                    f"item {item} takes {peak:.0f} WCU/s, above the {HOT_ITEM_WCU:.0f} WCU/s of one partition"
                )
        for item, nbytes in sorted(self.max_item_bytes.items()):
            if nbytes > ITEM_LIMIT_BYTES:
                out.append(f"item {item} reaches {nbytes / 1024:.0f} KB, above DynamoDB's 400 KB item limit")
        return out


# -- DynamoDB: the Sluice store ----------------------------------------------------------------------


class CountingStore:
    """``MemoryStore`` behind the calls ``DynamoStore`` makes for each method.

    ``release_without_read`` models a possible core change (the ``sluice-lean`` variant): no read
    before a release; ``skip_mark`` drops reconciliation's RUNNING marks with it. ``hint_one_free`` models a completion's
    admission that skips its read of the freed shard (the ``sluice-refill-one`` variant): the read is
    not made and shows exactly one free slot.
    """

    def __init__(
        self,
        inner: MemoryStore,
        meter: Meter,
        *,
        skip_mark: bool = False,
        release_without_read: bool = False,
        per_shard: int = DEFAULT_PER_SHARD,
    ) -> None:
        self.inner = inner
        self.meter = meter
        self.skip_mark = skip_mark
        self.release_without_read = release_without_read
        self._hinted: dict[int, int] = {}  # invocation -> MAX, for one ledger read
        self._placeholders: dict[int, frozenset[str]] = {}
        self.per_shard = per_shard
        self._pool_limit: int | None = None  # the caps in force (None: no pool yet)
        self._shards = 0
        self._read_count = FIRST_READ
        # lanes: each lane pool's shard count, and per container (``LaneSlots`` lives in each
        # container's store) the shard counts it last read and the lanes it holds a view of
        self._lane_shards: dict[str, int] = {}
        self._lane_reads: dict[int, dict[str, int]] = {}
        self._lane_views: dict[int, set[str]] = {}
        self.resync()

    def resync(self) -> None:
        """Recompute the shards after the inner store was filled directly (scale setups)."""
        if self.inner.table.holders:
            self._pool_limit = (
                self._pool_limit or self.inner.ledger().in_force or len(self.inner.table.holders)
            )
            self._shards = max(self._shards, shards_needed(self._pool_limit, self.per_shard))

    @property
    def ledger_bytes(self) -> int:
        """The LEDGER item: reconciliation's figures only (the holders live in the shards)."""
        return LEDGER_FIXED_BYTES

    def _shard_write(self, name: str) -> int:
        """One holder written to or removed from its shard (about 1 KB at most): write units, hot item."""
        shard = self._shard_of(name)
        nbytes = SHARD_FIXED_BYTES + self.per_shard * (SHARD_ENTRY_BYTES + len(name))
        kb = _kb(nbytes)
        self.meter.hot(f"SLOTS#launcher#{shard}", 2 * kb, nbytes)
        return kb

    def _shard_of(self, name: str) -> int:
        return zlib.crc32(name.encode("utf-8", "surrogatepass")) % max(1, self._shards)

    def _read_pool(self) -> None:
        """LEDGER, the pool item and the shards in one consistent read (per 100 keys), as
        ``LaunchSlots.ledger``: before the pool's size is known it covers 8 shards, then exactly the
        pool's shards."""
        first = 2 + self._read_count
        calls = math.ceil(first / 100)
        if self._shards > self._read_count:
            calls += math.ceil((self._shards - self._read_count) / 100)
        self.meter.call("dynamodb:BatchGetItem", calls)
        self.meter.rru += 2 + max(self._read_count, self._shards)
        self._read_count = self._shards  # next time, exactly the pool's shards (none before the pool)
        self.meter.wait("dynamodb:BatchGetItem", calls)

    def _move_caps(self, limit: int) -> None:
        """``DynamoSlots.set_limit``: read the pool and its shards, write the moved caps, read again."""
        self.meter.call("dynamodb:GetItem")
        self.meter.rru += 1
        self.meter.wait("dynamodb:GetItem")
        if self._shards:
            batches = math.ceil(self._shards / 100)
            self.meter.call("dynamodb:BatchGetItem", batches)
            self.meter.rru += self._shards
            self.meter.wait("dynamodb:BatchGetItem", batches)
        shards = max(self._shards, shards_needed(limit, self.per_shard))
        self.meter.call("dynamodb:TransactWriteItems")
        self.meter.wru += 2 * (1 + shards)  # the pool item and (at most) every shard's cap
        self.meter.wait("dynamodb:TransactWriteItems")
        self._shards, self._pool_limit = shards, limit
        self._read_pool()

    # reads

    def hint_one_free(self, max_concurrency: int) -> None:
        if self.meter.sim is not None:
            self._hinted[id(self.meter.sim.current)] = max_concurrency

    def forget_hint(self) -> None:
        if self.meter.sim is not None:
            self._hinted.pop(id(self.meter.sim.current), None)

    def ledger(self) -> Ledger:
        self._read_pool()
        return self.inner.ledger()

    def look(self, shards: Sequence[int] | None = None) -> Ledger:
        """``LaunchSlots.look``: the pool item and the freed shard (a completion's refill); else the
        whole ledger up to ``SAMPLE`` shards, or LEDGER, the pool item and a sample of ``SAMPLE``
        shards, whose room is taken as the pool's share of the free slots."""
        sim = self.meter.sim
        hinted = self._hinted.pop(id(sim.current), None) if sim is not None and self._hinted else None
        if hinted is not None:
            external = self.inner.pool.external
            size = max(0, hinted - external - 1)
            if size not in self._placeholders:
                self._placeholders[size] = frozenset(f"~{i}" for i in range(size))
            return Ledger(self._placeholders[size], external, in_force=self._pool_limit)
        if shards is None and self._shards <= SAMPLE:
            return self.ledger()
        keys = 1 + len(shards) if shards is not None else 2 + SAMPLE
        self.meter.call("dynamodb:BatchGetItem")
        self.meter.rru += keys
        self.meter.wait("dynamodb:BatchGetItem")
        ledger = self.inner.ledger()
        if shards is not None:
            return ledger
        room = ledger.free * SAMPLE // self._shards
        if room < NEARLY_FULL:
            return self.ledger()  # near full: every shard, as LaunchSlots.look does
        return replace(ledger, room=room, complete=False)

    def payload(self, key: str) -> PayloadRecord | None:
        self.meter.call("dynamodb:GetItem")
        self.meter.rru += 1
        result = self.inner.payload(key)
        self.meter.wait("dynamodb:GetItem")
        return result

    def execution(self, name: str) -> ExecutionRecord | None:
        self.meter.call("dynamodb:GetItem")
        self.meter.rru += 1
        result = self.inner.execution(name)
        self.meter.wait("dynamodb:GetItem")
        return result

    def effects(self, name: str) -> Any:
        self.meter.call("dynamodb:GetItem")
        self.meter.rru += 1
        result = self.inner.effects(name)
        self.meter.wait("dynamodb:GetItem")
        return result

    def executions(self, names: Iterable[str]) -> dict[str, ExecutionRecord]:
        unique = set(names)
        batches = math.ceil(len(unique) / 100)
        if batches:
            self.meter.call("dynamodb:BatchGetItem", batches)
            self.meter.rru += len(unique)
        result = self.inner.executions(unique)
        self.meter.wait("dynamodb:BatchGetItem", batches)
        return result

    # writes

    def set_limit(self, source: LimitSource) -> int | None:
        before = self.inner.pool.source
        merged = source.merged(before)
        if self._pool_limit != merged.limit:
            self._move_caps(merged.limit)
        elif before is not None and merged.fenced and merged.stamp() != before.stamp():
            self.meter.call("dynamodb:UpdateItem")  # DynamoSlots.restamp: the caps stay
            self.meter.wru += 1
            self.meter.wait("dynamodb:UpdateItem")
        return self.inner.set_limit(source)

    def claim(self, claim: Claim) -> None:
        limit = self._pool_limit or 0
        if len(self.inner.table.holders) >= limit:
            self._read_pool()  # no shard had room as read: DynamoStore reads once more, then gives up
            raise SlotsFull(limit)
        lane = claim.lane
        if lane is not None and lane not in self._views_here():
            self._read_lanes([lane])  # LaneSlots.choices: no view of the lane yet (its caps just moved)
        self.meter.call("dynamodb:TransactWriteItems")
        keyed = SMALL_ITEM_KB if claim.ckey is not None else 0  # CKEY#<key>
        laned = self._lane_shard_write(lane, claim.name) if lane is not None else 0  # SLOTS#lane-<l>#<j>
        lane_full = False
        try:
            self.inner.claim(claim)
        except SlotsFull:
            # The global pool had room (checked above): the lane's shard refused it. Its view, read
            # before the receive, showed room; LaneSlots reads the pool once more, finds it full.
            lane_full = lane is not None
            raise
        finally:
            self.meter.wru += 2 * (self._shard_write(claim.name) + 2 * SMALL_ITEM_KB + keyed + laned)
            self.meter.wait("dynamodb:TransactWriteItems")
            if lane_full:
                self._read_lanes([lane])

    def mark_running(self, *, key: str, name: str, arn: str, started_at: float, now: float) -> bool:
        if self.skip_mark:
            return True
        self.meter.call("dynamodb:TransactWriteItems")
        self.meter.wru += 2 * 2 * SMALL_ITEM_KB
        result = self.inner.mark_running(key=key, name=name, arn=arn, started_at=started_at, now=now)
        self.meter.wait("dynamodb:TransactWriteItems")
        return result

    def record_later_success(self, **kwargs: Any) -> bool:
        self.meter.call("dynamodb:TransactWriteItems")
        self.meter.wru += 2 * 2 * SMALL_ITEM_KB
        result = self.inner.record_later_success(**kwargs)
        self.meter.wait("dynamodb:TransactWriteItems")
        return result

    def release(self, name: str, ending: Ending, **kwargs: Any) -> ExecutionRecord | None:
        if not self.release_without_read:
            self.meter.call("dynamodb:GetItem")
            self.meter.rru += 1
            self.meter.wait("dynamodb:GetItem")
        record = self.inner.table.executions.get(name)
        if record is None or not record.state.holds_lease:
            return None
        result = self.inner.release(name, ending, **kwargs)
        self._release_writes(record, name, result)
        return result if result is None else replace(result, shard=self._shard_of(name))

    def _release_writes(self, record: ExecutionRecord, name: str, result: ExecutionRecord | None) -> None:
        """The release's transaction; twice for a key flagged as awaited (refused, then again)."""
        keyed = SMALL_ITEM_KB if record.ckey is not None else 0  # CKEY#<key>
        laned = self._lane_shard_write(record.lane, name) if record.lane is not None else 0
        for _ in range(2 if result is not None and result.awaited else 1):
            self.meter.call("dynamodb:TransactWriteItems")
            self.meter.wru += 2 * (self._shard_write(name) + 2 * SMALL_ITEM_KB + keyed + laned)
            self.meter.wait("dynamodb:TransactWriteItems")

    def hand_over(self, name: str, ending: Ending, offer: Any, **kwargs: Any) -> HandOver:
        """``DynamoStore.hand_over``: one BatchGetItem (the record, the pool item), the offer's
        receive, one transaction (the release and, when offered, the successor's lease and record
        on the freed shard), and a release alone after a refused successor."""
        self._batch_get(2)
        record = self.inner.table.executions.get(name)
        if record is None or not record.state.holds_lease:
            return HandOver(None)
        offered: list[Any] = []

        def counted(seen: ExecutionRecord, room: bool) -> Any:
            offered.append(offer(seen, room))
            return offered[-1]

        handed = self.inner.hand_over(name, ending, counted, **kwargs)
        if offered and offered[0] is not None:
            self.meter.call("dynamodb:TransactWriteItems")  # with the successor: 2 items more
            self.meter.wru += 2 * (self._shard_write(name) + 4 * SMALL_ITEM_KB)
            self.meter.wait("dynamodb:TransactWriteItems")
            if handed.claimed:
                if handed.released is not None and handed.released.awaited:
                    self._release_writes(record, name, None)  # refused once for the flag
                return replace(handed, released=replace(handed.released, shard=self._shard_of(name)))  # type: ignore[arg-type]
        if handed.released is not None:
            self._release_writes(record, name, handed.released)
        released = handed.released
        return replace(
            handed, released=None if released is None else replace(released, shard=self._shard_of(name))
        )

    def record_duplicate(self, *, key: str, message_id: str, now: float) -> None:
        self.meter.call("dynamodb:UpdateItem")
        self.meter.wru += SMALL_ITEM_KB
        self.inner.record_duplicate(key=key, message_id=message_id, now=now)
        self.meter.wait("dynamodb:UpdateItem")

    def first_sighting(self, *, key: str, message_id: str, receipt: str, now: float) -> bool:
        self.meter.call("dynamodb:UpdateItem")  # conditional: refused (still billed) when made before
        self.meter.wru += SMALL_ITEM_KB
        first = self.inner.first_sighting(key=key, message_id=message_id, receipt=receipt, now=now)
        self.meter.wait("dynamodb:UpdateItem")
        return first

    def record_already_done(
        self, *, key: str, message_id: str, now: float, seen: PayloadRecord | None = None
    ) -> None:
        self.meter.call("dynamodb:UpdateItem")  # a second one when a settle is refused: rare, not metered
        self.meter.wru += SMALL_ITEM_KB
        self.inner.record_already_done(key=key, message_id=message_id, now=now, seen=seen)
        self.meter.wait("dynamodb:UpdateItem")

    def record_invalid(self, *, key: str, reason: str, now: float) -> None:
        self.meter.call("dynamodb:UpdateItem")
        self.meter.wru += SMALL_ITEM_KB
        self.inner.record_invalid(key=key, reason=reason, now=now)
        self.meter.wait("dynamodb:UpdateItem")

    def _update(self, result: Any) -> Any:
        """One conditional UpdateItem on a small item (renew, suspect, unpark's marks)."""
        self.meter.call("dynamodb:UpdateItem")
        self.meter.wru += SMALL_ITEM_KB
        self.meter.wait("dynamodb:UpdateItem")
        return result

    def renew(self, **kwargs: Any) -> bool:
        return self._update(self.inner.renew(**kwargs))

    def suspect(self, **kwargs: Any) -> bool:
        return self._update(self.inner.suspect(**kwargs))

    def mark_starting(self, **kwargs: Any) -> bool:  # a conditional UpdateItem of EXEC#<name>
        return self._update(self.inner.mark_starting(**kwargs))

    def block(self, **kwargs: Any) -> bool:  # a conditional UpdateItem of EXEC#<name>
        return self._update(self.inner.block(**kwargs))

    def mark_redriven(self, **kwargs: Any) -> bool:  # a conditional UpdateItem of PAYLOAD#<key>
        return self._update(self.inner.mark_redriven(**kwargs))

    def clear_redriven(self, **kwargs: Any) -> bool:  # a conditional UpdateItem of PAYLOAD#<key>
        return self._update(self.inner.clear_redriven(**kwargs))

    def sight_adoption(self, **kwargs: Any) -> bool:  # a conditional UpdateItem of EXEC#<name>
        return self._update(self.inner.sight_adoption(**kwargs))

    def adopt(
        self, *, name: str, now: float, redriven_at: float | None = None, by: str | None = None
    ) -> bool:
        self.meter.call("dynamodb:GetItem")
        self.meter.rru += 1
        self.meter.wait("dynamodb:GetItem")
        record = self.inner.table.executions.get(name)
        if record is None or record.state.holds_lease:
            return False
        self.meter.call("dynamodb:BatchGetItem")  # its key's lease, read before any pool moves
        self.meter.rru += 1
        self.meter.wait("dynamodb:BatchGetItem")
        laned = 0
        if record.lane is not None:
            self._read_lanes([record.lane])  # LaneSlots.adopt_item reads the lane's pool
            if self._lane_shards.get(record.lane):
                laned = self._lane_shard_write(record.lane, name)
        self.meter.call("dynamodb:TransactWriteItems")
        result = self.inner.adopt(name=name, now=now, redriven_at=redriven_at, by=by)
        self.meter.wru += 2 * (self._shard_write(name) + 2 * SMALL_ITEM_KB + laned)
        self.meter.wait("dynamodb:TransactWriteItems")
        if result and laned:
            self._read_lane_caps(record.lane)  # LaneSlots.rebalance: the caps already add up
        return result

    def park(self, parked: Any) -> bool:
        self.meter.call("dynamodb:TransactWriteItems")
        self.meter.wru += 2 * (2 * SMALL_ITEM_KB + _kb(len(parked.body)))
        result = self.inner.park(parked)
        self.meter.wait("dynamodb:TransactWriteItems")
        return result

    def parked_messages(self, holder: str, message_ids: Iterable[str]) -> list[Any]:
        ids = set(message_ids)
        batches = math.ceil(len(ids) / 100)
        if batches:
            self.meter.call("dynamodb:BatchGetItem", batches)
            self.meter.rru += len(ids)
            self.meter.wait("dynamodb:BatchGetItem", batches)
        return self.inner.parked_messages(holder, ids)

    def unpark(self, holder: str, entries: Iterable[str], *, woken: Sequence[Any] = (), now: float) -> None:
        """Per entry read, one transaction of two items: the woken mark (or the check that no copy
        waits) and its removal from the holder's ``parked``; then the index's, of two items."""
        ids = sorted(set(entries))
        for _ in range(len(ids) + 1):
            self._transact(SMALL_ITEM_KB * 2, None)
        self.inner.unpark(holder, ids, woken=woken, now=now)

    def rooms(self) -> Any:
        """The three indexes in one BatchGetItem (``DynamoStore.rooms``)."""
        self._batch_get(3)
        return self.inner.rooms()

    def parked_holders(self) -> frozenset[str]:
        self.meter.call("dynamodb:GetItem")
        self.meter.rru += 1
        result = self.inner.parked_holders()
        self.meter.wait("dynamodb:GetItem")
        return result

    # -- lanes (sluice.features.lanes): the pools of every lane read together, each lane's caps moved like the
    # global pool's; the lane's shard in the claim's and the release's transactions is in ``claim``,
    # ``release`` and ``adopt`` --

    def _here(self) -> int:
        sim = self.meter.sim
        return id(sim.current) if sim is not None and sim.current is not None else 0

    def _views_here(self) -> set[str]:
        return self._lane_views.setdefault(self._here(), set())

    def _read_lanes(self, lanes: Sequence[str], whole: bool = False) -> None:
        """``LaneSlots.rooms``: each lane's pool item and the shards this container last saw (4 before
        it saw any), a lane with more shards than its part of 98 by a sample of that many unless
        ``whole``, in one consistent BatchGetItem per 100 keys; then the shards of a pool that has
        more than were read. (A sample near full is read whole again: not modelled.)"""
        seen = self._lane_reads.setdefault(self._here(), {})
        budget = max(LANE_FIRST_READ, 98 // max(1, len(lanes)))
        keys = sum(
            1 + (seen.get(lane, LANE_FIRST_READ) if whole else min(budget, seen.get(lane, LANE_FIRST_READ)))
            for lane in lanes
        )
        rest = sum(max(0, self._lane_shards.get(lane, 0) - seen.get(lane, LANE_FIRST_READ)) for lane in lanes)
        calls = math.ceil(keys / 100) + math.ceil(rest / 100)
        self.meter.call("dynamodb:BatchGetItem", calls)
        self.meter.rru += keys + rest
        self.meter.wait("dynamodb:BatchGetItem", calls)
        for lane in lanes:
            seen[lane] = self._lane_shards.get(lane, 0)
        self._views_here().update(lanes)

    def _read_lane_caps(self, lane: str) -> None:
        """``DynamoSlots.occupancy``: GetItem of the pool item, BatchGetItem of its shards."""
        self._get(None)
        self._batch_get(self._lane_shards.get(lane, 0))

    def _lane_shard_write(self, lane: str, name: str) -> int:
        """A holder written to or removed from a shard of the lane's pool: write units, hot item."""
        shards = max(1, self._lane_shards.get(lane, 0))
        shard = zlib.crc32(name.encode("utf-8", "surrogatepass")) % shards
        nbytes = SHARD_FIXED_BYTES + self.per_shard * (SHARD_ENTRY_BYTES + len(name))
        self.meter.hot(f"SLOTS#{POOL_PREFIX}{lane}#{shard}", 2 * _kb(nbytes), nbytes)
        return _kb(nbytes)

    def lane_rooms(self, lanes: Sequence[str], *, whole: bool = False) -> dict[str, LaneRoom]:
        self._read_lanes(lanes, whole)
        return self.inner.lane_rooms(lanes, whole=whole)

    def lane_settings(self, lanes: Sequence[str]) -> dict[str, LaneSetting]:
        self._batch_get(len(lanes))
        return self.inner.lane_settings(lanes)

    def set_lane_limit(self, lane: str, limit: int, stamp: float) -> int | None:
        """``DynamoSlots.set_limit``: read the pool and its shards; unless a newer limit is in force
        or nothing moves, write the pool item and the shards' caps in one transaction."""
        self._read_lane_caps(lane)
        current = self.inner.lanes.limits.get(lane)
        if current is None or (current[1] <= stamp and current != (limit, stamp)):
            shards = max(self._lane_shards.get(lane, 0), shards_needed(limit, self.per_shard))
            self.meter.call("dynamodb:TransactWriteItems")
            self.meter.wru += 2 * (1 + shards)  # the pool item and (at most) every shard's cap
            self.meter.wait("dynamodb:TransactWriteItems")
            self._lane_shards[lane] = shards
        self._views_here().discard(lane)  # read again before the next claim
        return self.inner.set_lane_limit(lane, limit, stamp)

    def write_lane_setting(self, setting: LaneSetting) -> None:
        self._update(self.inner.write_lane_setting(setting))

    def thaw_lane(self, lane: str) -> None:
        """``DynamoSlots.rebalance``: read the pool and its shards, write the caps (the memory store
        never freezes: counted as a read, then one transaction)."""
        self._read_lane_caps(lane)
        self.meter.call("dynamodb:TransactWriteItems")
        self.meter.wru += 2 * (1 + self._lane_shards.get(lane, 0))
        self.meter.wait("dynamodb:TransactWriteItems")
        self._views_here().discard(lane)
        self.inner.thaw_lane(lane)

    # -- awaits (sluice.features.awaits): every end reads its key's AWAITED# item and every reconciliation the
    # AWAITING index; the DAG workload's payloads (sluice-awaits) also read, park and release waiters --

    def _get(self, result: Any) -> Any:
        self.meter.call("dynamodb:GetItem")
        self.meter.rru += 1
        self.meter.wait("dynamodb:GetItem")
        return result

    def waiters_on(self, key: str) -> frozenset[str]:
        return self._get(self.inner.waiters_on(key))

    def waiting(self) -> frozenset[str]:
        return self._get(self.inner.waiting())

    def _batch_get(self, n: int) -> None:
        batches = math.ceil(n / 100)
        if batches:
            self.meter.call("dynamodb:BatchGetItem", batches)
            self.meter.rru += n
            self.meter.wait("dynamodb:BatchGetItem", batches)

    def payloads(self, keys: Iterable[str]) -> dict[str, PayloadRecord]:
        keys = list(keys)
        self._batch_get(len(keys))
        return self.inner.payloads(keys)

    def waiters(self, message_ids: Iterable[str]) -> list[Any]:
        ids = list(message_ids)
        self._batch_get(len(ids))
        return self.inner.waiters(ids)

    def park_waiter(self, waiter: Any, missing: Sequence[str]) -> Any:
        self.meter.call("dynamodb:TransactWriteItems")
        self.meter.wru += 2 * (SMALL_ITEM_KB * (len(missing) + 1) + _kb(len(waiter.body)))
        parked = self.inner.park_waiter(waiter, missing)
        self.meter.wait("dynamodb:TransactWriteItems")
        return parked

    def release_waiter(self, waiter: Any, *, how: str, reason: str | None, now: float) -> bool:
        self.meter.call("dynamodb:TransactWriteItems")
        self.meter.wru += 2 * SMALL_ITEM_KB * 3
        result = self.inner.release_waiter(waiter, how=how, reason=reason, now=now)
        self.meter.wait("dynamodb:TransactWriteItems")
        return result

    # -- concurrency keys (sluice.features.keys): every reconciliation reads KEYS_WAITING; a keyed workload also
    # reads, parks and wakes its keys' lines (the claim's and the release's CKEY# writes are in
    # ``claim`` and ``release``) --

    @property
    def key_concurrency(self) -> int:
        return self.inner.key_concurrency

    @property
    def key_gate(self) -> Any:
        """The launch's gate, as a key's wake asks it (none in these workloads: no book is read)."""
        return self.inner.key_gate

    def keys_waiting(self) -> frozenset[str]:
        return self._get(self.inner.keys_waiting())

    def key_state(self, ckey: str) -> Any:
        return self._get(self.inner.key_state(ckey))

    def key_wait_of(self, key: str) -> Any:
        return self._get(self.inner.key_wait_of(key))

    def _transact(self, items_kb: int, result: Any) -> Any:
        self.meter.call("dynamodb:TransactWriteItems")
        self.meter.wru += 2 * items_kb
        self.meter.wait("dynamodb:TransactWriteItems")
        return result

    def key_states(self, ckeys: Sequence[str]) -> dict[str, Any]:
        """``CKEY#`` of every key, consistently, in one BatchGetItem per 100 (a fair lane's waker)."""
        ckeys = list(ckeys)
        self._batch_get(len(ckeys))
        return self.inner.key_states(ckeys)

    def park_for_key(
        self, waiter: Any, *, tickets: int, replaces: str | None = None, fair: str | None = None
    ) -> bool:
        """One transaction: CKEY# (with its fair lane, if any), KWAITOF#, KEYS_WAITING and KWAIT#."""
        kb = SMALL_ITEM_KB * 3 + _kb(len(waiter.body))
        return self._transact(
            kb, self.inner.park_for_key(waiter, tickets=tickets, replaces=replaces, fair=fair)
        )

    def key_waiters(self, ckey: str, tickets: Sequence[int]) -> list[Any]:
        tickets = list(tickets)
        self._batch_get(len(tickets))
        return self.inner.key_waiters(ckey, tickets)

    def advance_key(self, ckey: str, *, woken: int, to: int, now: float, drop: Sequence[str] = ()) -> bool:
        result = self._transact(
            SMALL_ITEM_KB * (1 + to - woken),
            self.inner.advance_key(ckey, woken=woken, to=to, now=now, drop=drop),
        )
        if result and drop:
            self._update(None)
        return result

    def keep_inflight(self, ckey: str, entries: Sequence[str]) -> None:
        self._update(self.inner.keep_inflight(ckey, entries))

    def drop_inflight(self, ckey: str, entries: Sequence[str]) -> None:
        self._update(self.inner.drop_inflight(ckey, entries))

    def forget_key(self, ckey: str) -> None:
        """One transaction: CKEY# (conditioned on an empty line; its fair lane removed) and
        KEYS_WAITING."""
        self._transact(SMALL_ITEM_KB * 2, self.inner.forget_key(ckey))

    def set_key_cap(self, ckey: str, cap: int | None) -> None:
        self._update(self.inner.set_key_cap(ckey, cap))

    def next_count(self) -> int:
        self.meter.call("dynamodb:UpdateItem")
        kb = _kb(self.ledger_bytes)
        self.meter.wru += kb
        self.meter.hot("LEDGER", kb, self.ledger_bytes)
        result = self.inner.next_count()
        self.meter.wait("dynamodb:UpdateItem")
        return result

    def save_reconciliation(
        self, *, external: int, drift: int, now: float, count: int = 0, listed_after: int | None = None
    ) -> bool:
        self.meter.call("dynamodb:UpdateItem")
        kb = _kb(self.ledger_bytes)
        self.meter.wru += kb
        self.meter.hot("LEDGER", kb, self.ledger_bytes)
        saved = self.inner.save_reconciliation(
            external=external, drift=drift, now=now, count=count, listed_after=listed_after
        )
        self.meter.wait("dynamodb:UpdateItem")
        return saved


# -- DynamoDB: the counter semaphore's table -----------------------------------------------------------


class ConditionFailed(Exception):
    """ConditionalCheckFailedException."""


@dataclass
class CounterTable:
    """One counter item per key, as the counter-semaphore baseline uses it (PutItem / UpdateItem)."""

    meter: Meter
    values: dict[str, int] = field(default_factory=dict)

    def put_if_absent(self, key: str) -> None:
        """PutItem with ``#key <> :key``: creates the item once, fails (and is charged) after."""
        self.meter.call("dynamodb:PutItem")
        self.meter.wru += SMALL_ITEM_KB
        self.meter.hot(f"SEMAPHORE#{key}", SMALL_ITEM_KB, 64)
        created = key not in self.values
        self.values.setdefault(key, 0)
        self.meter.wait("dynamodb:PutItem")
        if not created:
            raise ConditionFailed("put")

    def add(self, key: str, delta: int, *, at_most: int | None = None, at_least: int | None = None) -> int:
        """UpdateItem ``SET semvalue = semvalue + :delta`` under an optional bound on the old value."""
        self.meter.call("dynamodb:UpdateItem")
        self.meter.wru += SMALL_ITEM_KB
        self.meter.hot(f"SEMAPHORE#{key}", SMALL_ITEM_KB, 64)
        value = self.values.get(key, 0)
        ok = (at_most is None or value <= at_most) and (at_least is None or value >= at_least)
        if ok:
            self.values[key] = value + delta
        self.meter.wait("dynamodb:UpdateItem")
        if not ok:
            raise ConditionFailed("update")
        return value + delta


# -- SQS --------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class HeapQueue(MemoryQueue):
    """``MemoryQueue`` with in-flight messages kept in a heap by the time they become visible again.

    Same behaviour (messages that come back go to the front, oldest first), but a receive no longer
    scans every in-flight message: the counter-semaphore baseline keeps hundreds in flight.
    """

    def __post_init__(self) -> None:
        self._returns: list[tuple[float, int, str]] = []
        self._pushes = 0

    def _due(self, handle: str, queued: _Queued) -> None:
        self._pushes += 1
        heapq.heappush(self._returns, (queued.visible_at, self._pushes, handle))

    def receive(self, max_messages: int, wait_seconds: int) -> list[Message]:
        self._count("ReceiveMessage")
        now = self.clock.now()  # type: ignore[attr-defined]
        back: list[_Queued] = []
        while self._returns and self._returns[0][0] <= now:
            visible_at, _, handle = heapq.heappop(self._returns)
            queued = self.in_flight.get(handle)
            if queued is not None and queued.visible_at == visible_at:
                back.append(self._out_of_flight(handle))
        self.messages.extendleft(reversed(back))
        return self._take(max_messages, now)

    def _in_flight(self, handle: str, queued: _Queued) -> None:
        self._due(handle, queued)

    def release(self, messages: Sequence[Message], delay_seconds: int = 0) -> None:
        now = self.clock.now()  # type: ignore[attr-defined]
        for i in range(0, len(messages), 10):
            self._count("ChangeMessageVisibilityBatch")
            for m in messages[i : i + 10]:
                queued = self.in_flight.get(m.receipt_handle)
                if queued is not None:
                    queued.visible_at = now + delay_seconds
                    self._due(m.receipt_handle, queued)

    def next_visible(self) -> float:
        while self._returns:
            visible_at, _, handle = self._returns[0]
            queued = self.in_flight.get(handle)
            if queued is not None and queued.visible_at == visible_at:
                return visible_at
            heapq.heappop(self._returns)
        return math.inf


class SimQueue:
    """``MemoryQueue`` with SQS calls counted and long polls that wait in virtual time.

    A receive with ``wait_seconds > 0`` on an empty queue parks the container until a message arrives
    or becomes visible again, or the wait ends; then it returns what is visible (up to the maximum).
    """

    def __init__(
        self,
        meter: Meter,
        clock: Any,
        *,
        visibility_timeout: float,
        max_receive_count: int | None,
        fifo: bool = True,
    ) -> None:
        self.meter = meter
        self.sim = meter.sim
        self.fifo = fifo
        self.inner = HeapQueue(
            clock=clock,
            visibility_timeout=visibility_timeout,
            max_receive_count=max_receive_count if max_receive_count is not None else 1 << 30,
        )
        self.waiters: list[Any] = []
        self.requeued: dict[str, float] = {}  # payload key -> when it was first sent back (awaits)

    # the producer (not counted: the same for every system)

    def send(self, body: str, group_id: str = "", attributes: dict[str, str] | None = None) -> str:
        """A producer's SendMessage; ``attributes`` reach the launcher as ``Message.attributes``."""
        message_id = self.inner.send(body, group_id, attributes)
        self._wake()
        return message_id

    def _wake(self) -> None:
        for waiter in self.waiters:
            waiter.wake()

    def _next_visible(self) -> float:
        return self.inner.next_visible()

    # the consumer

    def receive(self, max_messages: int, wait_seconds: int) -> list[Message]:
        self.meter.attempt("sqs:ReceiveMessage", self)
        messages = self.inner.receive(max_messages, 0)
        sim = self.sim
        if not messages and wait_seconds > 0 and sim is not None and sim.current is not None:
            deadline = sim.now + wait_seconds
            container = sim.current
            while sim.now < deadline and not sim.closing:
                self.waiters.append(container)
                try:
                    container.park(min(deadline, self._next_visible()))
                finally:
                    self.waiters.remove(container)
                messages = self.inner.receive(max_messages, 0)
                if messages:
                    break
        self.meter.wait("sqs:ReceiveMessage")
        return messages

    def delete(self, messages: Sequence[Message]) -> None:
        for i in range(0, len(messages), 10):
            self.meter.attempt("sqs:DeleteMessageBatch", self)
            self.inner.delete(messages[i : i + 10])
            self._wake()  # a message group held by what was in flight shows its next message
            self.meter.wait("sqs:DeleteMessageBatch")

    def delete_one(self, message: Message) -> None:
        self.meter.attempt("sqs:DeleteMessage", self)
        self.inner.delete([message])
        self._wake()
        self.meter.wait("sqs:DeleteMessage")

    def release(self, messages: Sequence[Message], delay_seconds: int = 0) -> None:
        for i in range(0, len(messages), 10):
            try:
                self.meter.attempt("sqs:ChangeMessageVisibilityBatch", self)
            except TransientError:
                continue  # SqsQueue.release: best effort, the visibility timeout returns them anyway
            self.inner.release(messages[i : i + 10], delay_seconds)
            self.meter.wait("sqs:ChangeMessageVisibilityBatch")
        if delay_seconds <= 0:
            self._wake()

    def send_to_dlq(self, message: Message, reason: str, *, dedup: str | None = None) -> None:
        self.meter.attempt("sqs:SendMessage", self.inner.dead)  # the DLQ: a queue of its own
        self.inner.send_to_dlq(message, reason, dedup=dedup)
        self.meter.wait("sqs:SendMessage")

    def requeue(self, parked: Any) -> None:
        """A parked message sent back (a deferred duplicate, or a waiter whose awaits are met)."""
        self.meter.attempt("sqs:SendMessage", self)
        self.requeued.setdefault(parked.key, self.sim.now if self.sim is not None else 0.0)
        self.inner.requeue(parked)
        self._wake()
        self.meter.wait("sqs:SendMessage")

    @property
    def dead(self) -> int:
        return len(self.inner.dead)

    def __len__(self) -> int:
        return len(self.inner)


# -- Step Functions ---------------------------------------------------------------------------------------


class SimExecutions:
    """``MemoryExecutions`` with calls counted and ListExecutions ``lag`` seconds behind.

    The listing shows the state machine as it was ``lag`` seconds ago: executions started since are
    missing, executions ended since are still RUNNING. DescribeExecution is consistent.
    ``on_start(name, input)`` is called for every execution that really starts.
    """

    def __init__(
        self, meter: Meter, clock: Any, *, lag: float, on_start: Callable[[str, str], None] | None = None
    ) -> None:
        self.meter = meter
        self.inner = MemoryExecutions(clock=clock)
        self.clock = clock
        self.lag = lag
        self.on_start = on_start
        self.state_machine_arn = self.inner.state_machine_arn
        self._recent_starts: deque[tuple[float, str]] = deque()
        self._recent_ends: deque[tuple[float, str]] = deque()

    def arn_for(self, name: str) -> str:
        return self.inner.arn_for(name)

    def start(self, name: str, input_json: str) -> StartResult:
        self.meter.attempt("states:StartExecution")
        new = name not in self.inner.running and name not in self.inner.ended
        result = self.inner.start(name, input_json)
        if new:
            if self.lag > 0:
                self._recent_starts.append((self.clock.now(), name))
            if self.on_start is not None:
                self.on_start(name, input_json)
        self.meter.wait("states:StartExecution")
        return result

    def finish(self, name: str, status: str = "SUCCEEDED") -> ExecutionInfo:
        """Step Functions ends an execution (scheduler side: no call)."""
        info = self.inner.finish(name, status)
        if self.lag > 0:
            self._recent_ends.append((self.clock.now(), name))
        return info

    def describe(self, name: str, arn: str | None = None) -> ExecutionInfo | None:
        self.meter.call("states:DescribeExecution")
        result = self.inner.describe(name)
        self.meter.wait("states:DescribeExecution")
        return result

    def vanished(self, arn: str | None) -> bool:
        return self.inner.vanished(arn)  # one state machine, never deleted: no call

    def redriven_succeeded(self) -> dict[str, float | None]:
        self.meter.call("states:ListExecutions")  # one page: nothing is redriven in the bench
        self.meter.wait("states:ListExecutions")
        return {}

    def list_running(self) -> set[str]:
        names = set(self.inner.running)
        if self.lag > 0:
            horizon = self.clock.now() - self.lag
            while self._recent_starts and self._recent_starts[0][0] <= horizon:
                self._recent_starts.popleft()
            while self._recent_ends and self._recent_ends[0][0] <= horizon:
                self._recent_ends.popleft()
            names.difference_update(n for _, n in self._recent_starts)
            names.update(n for _, n in self._recent_ends)
        pages = max(1, math.ceil(len(names) / 1000))
        self.meter.call("states:ListExecutions", pages)
        self.meter.wait("states:ListExecutions", pages)
        return names

    def check(self) -> None:
        self.meter.call("states:DescribeStateMachine")
        self.meter.wait("states:DescribeStateMachine")

    @property
    def running(self) -> int:
        return len(self.inner.running)


# -- SSM ---------------------------------------------------------------------------------------------------


class CountingSsmClient:
    """The one SSM call ``SsmMax`` makes, answered with MAX and counted."""

    def __init__(self, meter: Meter, value: int) -> None:
        self.meter = meter
        self.value = value

    def get_parameter(self, Name: str) -> dict[str, Any]:
        self.meter.call("ssm:GetParameter")
        self.meter.wait("ssm:GetParameter")
        return {"Parameter": {"Name": Name, "Value": str(self.value), "LastModifiedDate": 0.0}}


# -- CloudWatch Logs ----------------------------------------------------------------------------------------

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
POWERTOOLS_BASE_BYTES = 420  # level, location, timestamp, service, Lambda context, trace id


class LogBytes(logging.Handler):
    """Counts what a Powertools JSON log line of each record would weigh."""

    def __init__(self, meter: Meter | None) -> None:
        super().__init__(logging.INFO)
        self.meter = meter

    def emit(self, record: logging.LogRecord) -> None:
        if self.meter is None:
            return
        extra = {k: v for k, v in record.__dict__.items() if k not in _STANDARD}
        size = POWERTOOLS_BASE_BYTES + len(str(record.msg))
        if extra:
            size += len(json.dumps(extra, default=str))
        self.meter.log_bytes += size


def counting_logger(meter: Meter, name: str) -> logging.Logger:
    """A logger outside the logging registry (nothing accumulates across runs)."""
    logger = logging.Logger(name, logging.INFO)
    logger.addHandler(LogBytes(meter))
    logger.propagate = False
    return logger

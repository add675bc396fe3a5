"""The store in memory, for unit tests and large benchmarks. It passes the same contract suite as
``DynamoStore`` (tests/contract). Not part of the Lambda package.

``MemoryStore`` holds one part per concern, each holding the table (``MemoryTable``): its records and
the one lock every write takes, as DynamoStore's parts hold the one DynamoDB table."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from sluice.adapters.memory.awaits import MemoryAwaits
from sluice.adapters.memory.claims import MemoryClaims
from sluice.adapters.memory.handover import MemoryHandOver
from sluice.adapters.memory.keys import MemoryKeys
from sluice.adapters.memory.records import MemoryParking, MemoryRecords
from sluice.adapters.memory.releases import MemoryReleases
from sluice.adapters.memory.table import DEFAULT_RETENTION, MemoryLanes, MemoryPool, MemoryTable
from sluice.core.gates import OPEN, Gate
from sluice.core.limits import Ledger, LimitSource
from sluice.core.model import (
    Claim,
    ClaimFence,
    EffectsLog,
    Ending,
    ExecutionRecord,
    HandOver,
    ParkedMessage,
    PayloadRecord,
    Rooms,
)
from sluice.core.records import KeyState, LaneRoom, LaneSetting, ReceiptOutput
from sluice.features.awaits import Waiter
from sluice.features.keys import DEFAULT_KEY_CONCURRENCY, KeyWaiter

__all__ = ["DEFAULT_RETENTION", "MemoryStore"]


class MemoryStore:
    def __init__(
        self, *, retention_seconds: int = DEFAULT_RETENTION, key_concurrency: int = DEFAULT_KEY_CONCURRENCY
    ) -> None:
        self.table = table = MemoryTable(retention_seconds)
        self.pool = MemoryPool(table)
        self.lanes = MemoryLanes(table)
        self.records = MemoryRecords(table)
        self.parking = MemoryParking(table)
        self.awaits = MemoryAwaits(table)
        self.keys = MemoryKeys(table, key_concurrency)
        self.key_gate: Gate = OPEN  # the launch's gate, as a key's wake asks it (the runtime's)
        self.claims = MemoryClaims(table, self.pool, self.lanes, self.keys)
        self.releases = MemoryReleases(table, self.lanes, self.keys, self.awaits)
        self.hand_overs = MemoryHandOver(table, self.pool, self.releases, self.claims)

    @property
    def retention_seconds(self) -> int:
        return self.table.retention_seconds

    @property
    def key_concurrency(self) -> int:
        return self.keys.key_concurrency

    @key_concurrency.setter
    def key_concurrency(self, cap: int) -> None:
        self.keys.key_concurrency = cap

    # -- the slot pools (SlotPools) ------------------------------------------------------------------

    def ledger(self) -> Ledger:
        return self.pool.ledger()

    def look(self, shards: Sequence[int] | None = None) -> Ledger:
        return self.ledger()  # one lock holds every slot: reading all of them costs nothing

    def set_limit(self, source: LimitSource) -> int | None:
        return self.pool.set_limit(source)

    def lane_rooms(self, lanes: Sequence[str], *, whole: bool = False) -> dict[str, LaneRoom]:
        return self.lanes.rooms(lanes)

    def lane_settings(self, lanes: Sequence[str]) -> dict[str, LaneSetting]:
        return self.lanes.settings_of(lanes)

    def set_lane_limit(self, lane: str, limit: int, stamp: float) -> int | None:
        return self.lanes.set_limit(lane, limit, stamp)

    def write_lane_setting(self, setting: LaneSetting) -> None:
        self.lanes.write_setting(setting)

    def thaw_lane(self, lane: str) -> None:
        pass  # one count against one limit: never frozen

    # -- the leases (PayloadLeases) ------------------------------------------------------------------

    def claim(self, claim: Claim) -> None:
        self.claims.claim(claim)

    def renew(
        self,
        *,
        name: str,
        now: float,
        claim_expires_at: float,
        arn: str | None = None,
        copy_id: str | None = None,
    ) -> bool:
        return self.claims.renew(
            name=name, now=now, claim_expires_at=claim_expires_at, arn=arn, copy_id=copy_id
        )

    def block(self, *, name: str, by: str, now: float) -> bool:
        return self.claims.block(name=name, by=by, now=now)

    def mark_starting(self, *, name: str, now: float, copy_id: str | None = None) -> bool:
        return self.claims.mark_starting(name=name, now=now, copy_id=copy_id)

    def suspect(
        self, *, name: str, claim_version: int, reconciler: str, now: float, replacing: float | None = None
    ) -> bool:
        return self.claims.suspect(
            name=name, claim_version=claim_version, reconciler=reconciler, now=now, replacing=replacing
        )

    def mark_running(self, *, key: str, name: str, arn: str, started_at: float, now: float) -> bool:
        return self.claims.mark_running(key=key, name=name, arn=arn, started_at=started_at, now=now)

    def mark_redriven(self, *, key: str, name: str, now: float) -> bool:
        return self.claims.mark_redriven(key=key, name=name, now=now)

    def clear_redriven(self, *, key: str, name: str) -> bool:
        return self.claims.clear_redriven(key=key, name=name)

    def release(
        self,
        name: str,
        ending: Ending,
        *,
        fence: ClaimFence | None = None,
        confirm: Callable[[ExecutionRecord], bool] | None = None,
        output: Callable[[ExecutionRecord], ReceiptOutput | None] | None = None,
    ) -> ExecutionRecord | None:
        return self.releases.release(name, ending, fence=fence, confirm=confirm, output=output)

    def hand_over(
        self,
        name: str,
        ending: Ending,
        offer: Callable[[ExecutionRecord, bool], Claim | None],
        *,
        confirm: Callable[[ExecutionRecord], bool] | None = None,
        output: Callable[[ExecutionRecord], ReceiptOutput | None] | None = None,
    ) -> HandOver:
        return self.hand_overs.hand_over(name, ending, offer, confirm=confirm, output=output)

    def record_later_success(
        self, *, record: ExecutionRecord, ended_at: float, now: float, receipt: ReceiptOutput | None
    ) -> bool:
        return self.releases.record_later_success(record, ended_at=ended_at, now=now, receipt=receipt)

    def adopt(
        self, *, name: str, now: float, redriven_at: float | None = None, by: str | None = None
    ) -> bool:
        return self.releases.adopt(name=name, now=now, redriven_at=redriven_at, by=by)

    def sight_adoption(self, *, record: ExecutionRecord, by: str, now: float) -> bool:
        return self.releases.sight_adoption(record=record, by=by, now=now)

    # -- the records (Records) -----------------------------------------------------------------------

    def payload(self, key: str) -> PayloadRecord | None:
        return self.records.payload(key)

    def execution(self, name: str) -> ExecutionRecord | None:
        return self.records.execution(name)

    def effects(self, name: str) -> EffectsLog | None:
        return self.records.effects(name)

    def executions(self, names: Iterable[str]) -> dict[str, ExecutionRecord]:
        return self.records.executions(names)

    def record_duplicate(self, *, key: str, message_id: str, now: float) -> None:
        self.records.record_duplicate(key=key, message_id=message_id, now=now)

    def first_sighting(self, *, key: str, message_id: str, receipt: str, now: float) -> bool:
        return self.records.first_sighting(key=key, message_id=message_id, receipt=receipt, now=now)

    def record_already_done(
        self, *, key: str, message_id: str, now: float, seen: PayloadRecord | None = None
    ) -> None:
        self.records.record_already_done(key=key, message_id=message_id, now=now, seen=seen)

    def record_invalid(self, *, key: str, reason: str, now: float) -> None:
        self.records.record_invalid(key=key, reason=reason, now=now)

    def next_count(self) -> int:
        return self.pool.next_count()

    def save_reconciliation(
        self, *, external: int, drift: int, now: float, count: int = 0, listed_after: int | None = None
    ) -> bool:
        return self.pool.save_reconciliation(
            external=external, drift=drift, now=now, count=count, listed_after=listed_after
        )

    # -- the waiting room (WaitingRoom) --------------------------------------------------------------

    def park(self, parked: ParkedMessage) -> bool:
        return self.parking.park(parked)

    def parked_messages(self, holder: str, entries: Iterable[str]) -> list[ParkedMessage]:
        return self.parking.parked_messages(holder, entries)

    def unpark(
        self, holder: str, entries: Iterable[str], *, woken: Sequence[ParkedMessage] = (), now: float
    ) -> None:
        self.parking.unpark(holder, entries, woken=woken, now=now)

    def parked_holders(self) -> frozenset[str]:
        return self.parking.parked_holders()

    def rooms(self) -> Rooms:
        return Rooms(self.parked_holders(), self.waiting(), self.keys_waiting())

    # -- awaits (sluice.features.awaits.AwaitStore) -----------------------------------------------------------

    def payloads(self, keys: Iterable[str]) -> dict[str, PayloadRecord]:
        return self.records.payloads(keys)

    def park_waiter(self, waiter: Waiter, missing: Sequence[str]) -> Waiter:
        return self.awaits.park_waiter(waiter, missing)

    def waiters_on(self, key: str) -> frozenset[str]:
        return self.awaits.waiters_on(key)

    def waiting(self) -> frozenset[str]:
        return self.awaits.waiting()

    def waiters(self, entries: Iterable[str]) -> list[Waiter]:
        return self.awaits.waiters(entries)

    def release_waiter(self, waiter: Waiter, *, how: str, reason: str | None, now: float) -> bool:
        return self.awaits.release_waiter(waiter, how=how, reason=reason, now=now)

    # -- concurrency keys (sluice.features.keys.KeyStore) -----------------------------------------------------

    def key_state(self, ckey: str) -> KeyState:
        return self.keys.key_state(ckey)

    def key_states(self, ckeys: Sequence[str]) -> dict[str, KeyState]:
        return self.keys.key_states(ckeys)

    def park_for_key(
        self, waiter: KeyWaiter, *, tickets: int, replaces: str | None = None, fair: str | None = None
    ) -> bool:
        return self.keys.park_for_key(waiter, tickets=tickets, replaces=replaces, fair=fair)

    def key_waiters(self, ckey: str, tickets: Sequence[int]) -> list[KeyWaiter]:
        return self.keys.key_waiters(ckey, tickets)

    def advance_key(self, ckey: str, *, woken: int, to: int, now: float, drop: Sequence[str] = ()) -> bool:
        return self.keys.advance_key(ckey, woken=woken, to=to, now=now, drop=drop)

    def keep_inflight(self, ckey: str, entries: Sequence[str]) -> None:
        self.keys.keep_inflight(ckey, entries)

    def drop_inflight(self, ckey: str, entries: Sequence[str]) -> None:
        self.keys.drop_inflight(ckey, entries)

    def forget_key(self, ckey: str) -> None:
        self.keys.forget_key(ckey)

    def key_wait_of(self, key: str) -> KeyWaiter | None:
        return self.keys.key_wait_of(key)

    def keys_waiting(self) -> frozenset[str]:
        return self.keys.keys_waiting()

    def set_key_cap(self, ckey: str, cap: int | None) -> None:
        self.keys.set_key_cap(ckey, cap)

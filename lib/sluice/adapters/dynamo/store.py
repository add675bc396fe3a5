"""The launcher's store in one DynamoDB table (partition key ``pk``): the slots it claims, the
payload leases and the execution records, composed into one transaction per claim and per release.
``DynamoStore`` holds one part per concern, each holding the table (``TableRef``):

    SLOTS#launcher[#i] the slot pool and its shards (sluice.adapters.dynamo.launch_slots)
    PAYLOAD#<key>     the lease (holder), latest state, the last executions, attempts, duplicates
    EXEC#<name>       one claim / execution: key, message id, ARN, state, times, claim version, shard
    LEDGER, PARK#...  reconciliation's figures, the waiting room (sluice.adapters.dynamo.records,
                      sluice.adapters.dynamo.parking)

The claim and the marks on a live claim: ``sluice.adapters.dynamo.claims``; the release and the
hand-over: ``sluice.adapters.dynamo.release``; the adoption: ``sluice.adapters.dynamo.adoption``;
concurrency keys and awaits: ``sluice.adapters.dynamo.keys``, ``sluice.adapters.dynamo.awaits``. A
release is the mirror image of a claim, conditional on ``name`` still holding both.

Live records carry no ``expires_at``: TTL can only delete a record once its run has ended.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sluice.adapters.dynamo.adoption import AdoptionsTable
from sluice.adapters.dynamo.awaits import AWAITING_PK, AwaitsTable
from sluice.adapters.dynamo.claims import ClaimsTable
from sluice.adapters.dynamo.codec import TTL_ATTRIBUTE, create_table, execution_pk, payload_pk
from sluice.adapters.dynamo.keys import KEYS_WAITING_PK, KeysTable
from sluice.adapters.dynamo.lanes import LaneSlots
from sluice.adapters.dynamo.launch_slots import LEDGER_PK, LaunchSlots
from sluice.adapters.dynamo.parking import PARKED_PK, ParkingTable
from sluice.adapters.dynamo.records import RecordsTable
from sluice.adapters.dynamo.release import ReleaseParts, ReleasesTable
from sluice.adapters.dynamo.slots import DynamoSlots
from sluice.adapters.dynamo.table import DEFAULT_RETENTION, TableRef
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
from sluice.primitives.slots import DEFAULT_PER_SHARD

__all__ = [
    "LEDGER_PK",
    "PARKED_PK",
    "TTL_ATTRIBUTE",
    "DynamoStore",
    "create_table",
    "execution_pk",
    "payload_pk",
]


class DynamoStore:
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
        self.db = db = TableRef(client, table_name, retention_seconds, sleep)
        slots = DynamoSlots(client, table_name, per_shard=slots_per_shard, rng=rng, sleep=sleep)
        self.launch_slots = LaunchSlots(slots, rng=rng)
        self.lane_slots = LaneSlots(slots, rng=rng)
        self.records = RecordsTable(db)
        self.parking = ParkingTable(db)
        self.awaits = AwaitsTable(db)
        self.keys = KeysTable(db, key_concurrency)
        self.key_gate: Gate = OPEN  # the launch's gate, as a key's wake asks it (the runtime's)
        self.claims = ClaimsTable(db, self.launch_slots, self.lane_slots, self.keys)
        parts = ReleaseParts(self.records, self.keys, self.claims)
        self.releases = ReleasesTable(db, self.launch_slots, self.lane_slots, parts)
        self.adoptions = AdoptionsTable(db, self.launch_slots, self.lane_slots, parts)

    @property
    def client(self) -> Any:
        return self.db.client

    @property
    def table(self) -> str:
        return self.db.table

    @property
    def key_concurrency(self) -> int:
        return self.keys.key_concurrency

    @key_concurrency.setter
    def key_concurrency(self, cap: int) -> None:
        self.keys.key_concurrency = cap

    # -- the slot pools (SlotPools) ------------------------------------------------------------------

    def rooms(self) -> Rooms:
        found = {raw["pk"]: raw for raw in self.db.batch_get([PARKED_PK, AWAITING_PK, KEYS_WAITING_PK])}
        return Rooms(
            parked_holders=frozenset(found.get(PARKED_PK, {}).get("holders", ())),
            awaiting=frozenset(found.get(AWAITING_PK, {}).get("waiters", ())),
            keys_waiting=frozenset(found.get(KEYS_WAITING_PK, {}).get("keys", ())),
        )

    def ledger(self) -> Ledger:
        return self.launch_slots.ledger()

    def look(self, shards: Sequence[int] | None = None) -> Ledger:
        return self.launch_slots.look(shards)

    def set_limit(self, source: LimitSource) -> int | None:
        return self.launch_slots.set_limit(source)

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
        return self.releases.hand_over(name, ending, offer, confirm=confirm, output=output)

    def record_later_success(
        self, *, record: ExecutionRecord, ended_at: float, now: float, receipt: ReceiptOutput | None
    ) -> bool:
        return self.releases.record_later_success(record, ended_at=ended_at, now=now, receipt=receipt)

    def adopt(
        self, *, name: str, now: float, redriven_at: float | None = None, by: str | None = None
    ) -> bool:
        return self.adoptions.adopt(name=name, now=now, redriven_at=redriven_at, by=by)

    def sight_adoption(self, *, record: ExecutionRecord, by: str, now: float) -> bool:
        return self.adoptions.sight_adoption(record=record, by=by, now=now)

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
        return self.records.next_count()

    def save_reconciliation(
        self, *, external: int, drift: int, now: float, count: int = 0, listed_after: int | None = None
    ) -> bool:
        return self.records.save_reconciliation(
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

    # -- awaits (sluice.features.awaits.AwaitStore) -----------------------------------------------------------

    def payloads(self, keys: Iterable[str]) -> dict[str, PayloadRecord]:
        return self.awaits.payloads(keys)

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

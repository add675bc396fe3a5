"""The store in memory, for unit tests and large benchmarks. It passes the same contract suite as
``DynamoStore`` (tests/contract). Not part of the Lambda package.

``MemoryStore`` holds one part per concern, each holding the table (``MemoryTable``): its records and
the one lock every write takes, as DynamoStore's parts hold the one DynamoDB table."""

from __future__ import annotations

from collections.abc import Sequence

from sluice.adapters.memory.awaits import MemoryAwaits
from sluice.adapters.memory.claims import MemoryClaims
from sluice.adapters.memory.handover import MemoryHandOver
from sluice.adapters.memory.keys import MemoryKeys
from sluice.adapters.memory.records import MemoryParking, MemoryRecords
from sluice.adapters.memory.releases import MemoryReleases
from sluice.adapters.memory.table import DEFAULT_RETENTION, MemoryLanes, MemoryPool, MemoryTable
from sluice.adapters.part import Part
from sluice.core.gates import OPEN, Gate
from sluice.core.limits import Ledger
from sluice.core.model import (
    Rooms,
)
from sluice.core.records import LaneRoom
from sluice.features.keys import DEFAULT_KEY_CONCURRENCY

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

    ledger = Part("pool")

    def look(self, shards: Sequence[int] | None = None) -> Ledger:
        return self.ledger()  # one lock holds every slot: reading all of them costs nothing

    set_limit = Part("pool")

    def lane_rooms(self, lanes: Sequence[str], *, whole: bool = False) -> dict[str, LaneRoom]:
        return self.lanes.rooms(lanes)

    lane_settings = Part("lanes", "settings_of")
    set_lane_limit = Part("lanes", "set_limit")
    write_lane_setting = Part("lanes", "write_setting")

    def thaw_lane(self, lane: str) -> None:
        pass  # one count against one limit: never frozen

    # -- the leases (PayloadLeases) ------------------------------------------------------------------

    claim = Part("claims")
    renew = Part("claims")
    block = Part("claims")
    mark_starting = Part("claims")
    suspect = Part("claims")
    mark_running = Part("claims")
    mark_redriven = Part("claims")
    clear_redriven = Part("claims")
    release = Part("releases")
    hand_over = Part("hand_overs")
    record_later_success = Part("releases")
    adopt = Part("releases")
    sight_adoption = Part("releases")

    # -- the records (Records) -----------------------------------------------------------------------

    payload = Part("records")
    execution = Part("records")
    effects = Part("records")
    executions = Part("records")
    record_duplicate = Part("records")
    first_sighting = Part("records")
    record_already_done = Part("records")
    record_invalid = Part("records")
    next_count = Part("pool")
    save_reconciliation = Part("pool")

    # -- the waiting room (WaitingRoom) --------------------------------------------------------------

    park = Part("parking")
    parked_messages = Part("parking")
    unpark = Part("parking")
    parked_holders = Part("parking")

    def rooms(self) -> Rooms:
        return Rooms(self.parked_holders(), self.waiting(), self.keys_waiting())

    # -- awaits (sluice.features.awaits.AwaitStore) -----------------------------------------------------------

    payloads = Part("records")
    park_waiter = Part("awaits")
    waiters_on = Part("awaits")
    waiting = Part("awaits")
    waiters = Part("awaits")
    release_waiter = Part("awaits")

    # -- concurrency keys (sluice.features.keys.KeyStore) -----------------------------------------------------

    key_state = Part("keys")
    key_states = Part("keys")
    park_for_key = Part("keys")
    key_waiters = Part("keys")
    advance_key = Part("keys")
    keep_inflight = Part("keys")
    drop_inflight = Part("keys")
    forget_key = Part("keys")
    key_wait_of = Part("keys")
    keys_waiting = Part("keys")
    set_key_cap = Part("keys")

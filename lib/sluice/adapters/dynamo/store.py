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
from collections.abc import Callable
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
from sluice.adapters.dynamo.redriven_marks import RedrivenMarks
from sluice.adapters.dynamo.release import ReleaseParts, ReleasesTable
from sluice.adapters.dynamo.slots import DynamoSlots
from sluice.adapters.dynamo.table import DEFAULT_RETENTION, TableRef
from sluice.adapters.part import Part
from sluice.core.gates import OPEN, Gate
from sluice.core.model import (
    Rooms,
)
from sluice.features.keys import DEFAULT_KEY_CONCURRENCY
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
        self.marks = RedrivenMarks(db)
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

    ledger = Part("launch_slots")
    look = Part("launch_slots")
    set_limit = Part("launch_slots")
    lane_rooms = Part("lane_slots", "rooms")
    lane_settings = Part("lane_slots", "settings")
    set_lane_limit = Part("lane_slots", "set_limit")
    write_lane_setting = Part("lane_slots", "write_setting")
    thaw_lane = Part("lane_slots", "rebalance")

    # -- the leases (PayloadLeases) ------------------------------------------------------------------

    claim = Part("claims")
    renew = Part("claims")
    block = Part("claims")
    mark_starting = Part("claims")
    suspect = Part("claims")
    mark_running = Part("claims")
    mark_redriven = Part("marks")
    clear_redriven = Part("marks")
    release = Part("releases")
    hand_over = Part("releases")
    record_later_success = Part("releases")
    adopt = Part("adoptions")
    sight_adoption = Part("adoptions")

    # -- the records (Records) -----------------------------------------------------------------------

    payload = Part("records")
    execution = Part("records")
    effects = Part("records")
    executions = Part("records")
    record_duplicate = Part("records")
    first_sighting = Part("records")
    record_already_done = Part("records")
    record_invalid = Part("records")
    next_count = Part("records")
    save_reconciliation = Part("records")

    # -- the waiting room (WaitingRoom) --------------------------------------------------------------

    park = Part("parking")
    parked_messages = Part("parking")
    unpark = Part("parking")
    parked_holders = Part("parking")

    # -- awaits (sluice.features.awaits.AwaitStore) -----------------------------------------------------------

    payloads = Part("awaits")
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

"""``MemoryStore``'s table: the records every part of the store reads and writes under one lock, the
launch pool with reconciliation's figures, and the lanes' pools. For tests and the benchmark."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from sluice.core.errors import SlotsFull
from sluice.core.external import ExternalCount
from sluice.core.limits import Ledger, LimitSource
from sluice.core.model import EffectsLog, ExecutionRecord, PayloadRecord
from sluice.core.records import LaneRoom, LaneSetting

DEFAULT_RETENTION = 30 * 86_400


@dataclass(frozen=True, eq=False)
class MemoryTable:
    """What every part shares: the lock (a hand-over holds it across its release and its claim),
    the payload and execution records, the effects marks, the launch pool's holders."""

    retention_seconds: int = DEFAULT_RETENTION
    lock: threading.RLock = field(default_factory=threading.RLock)
    payloads: dict[str, PayloadRecord] = field(default_factory=dict)
    executions: dict[str, ExecutionRecord] = field(default_factory=dict)
    effects: dict[str, EffectsLog] = field(default_factory=dict)
    holders: set[str] = field(default_factory=set)


class MemoryPool:
    """The launch pool's limit and reconciliation's figures (``SlotPools``, LEDGER)."""

    def __init__(self, table: MemoryTable) -> None:
        self.table = table
        self.limit: int | None = None
        self.source: LimitSource | None = None
        self.external = 0
        self.count = 0  # the number of the external count saved
        self.listed_after: int | None = 0  # the number taken before its listing (0: unknown)
        self.counts = 0  # the numbering counter
        self.drift = 0
        self.reconciled_at: float | None = None

    def ledger(self) -> Ledger:
        with self.table.lock:
            return Ledger(
                frozenset(self.table.holders),
                self.external,
                self.reconciled_at,
                self.drift,
                self.limit,
                count=self.count,
                listed_after=self.listed_after,
                numbered=self.counts,
            )

    def set_limit(self, source: LimitSource) -> int | None:
        with self.table.lock:
            # The pool's stamp keeps no listing start (as in DynamoDB): a later merge takes it as unknown.
            self.source = replace(source.merged(self.source), listed_after=0)
            self.limit = self.source.limit
            return self.limit

    def admits(self, name: str) -> None:
        """Called under the lock by a claim: SlotsFull unless the pool has room for ``name``."""
        limit = self.limit or 0
        if len(self.table.holders) >= limit or name in self.table.holders:
            raise SlotsFull(limit)

    def next_count(self) -> int:
        with self.table.lock:
            self.counts += 1
            return self.counts

    def save_reconciliation(
        self, *, external: int, drift: int, now: float, count: int = 0, listed_after: int | None = None
    ) -> bool:
        with self.table.lock:
            saved = ExternalCount(self.external, self.count, self.listed_after)
            merged = ExternalCount(external, count, listed_after).merged(saved)
            self.external, self.count, self.listed_after = merged.external, merged.count, merged.began
            if count < saved.count:
                return False
            self.drift, self.reconciled_at = drift, now
            return True


class MemoryLanes:
    """The lanes' pools (``sluice.features.lanes``): each lane's holders, its limit in force with its stamp,
    its setting. One count against one limit: never frozen."""

    def __init__(self, table: MemoryTable) -> None:
        self.table = table
        self.holders: dict[str, set[str]] = {}
        self.limits: dict[str, tuple[int, float]] = {}
        self.settings: dict[str, LaneSetting] = {}

    def rooms(self, lanes: Sequence[str]) -> dict[str, LaneRoom]:
        with self.table.lock:
            out = {}
            for lane in lanes:
                limit, _ = self.limits.get(lane, (0, 0.0))
                running = len(self.holders.get(lane, ()))
                out[lane] = LaneRoom(limit, running, max(0, limit - running), exists=lane in self.limits)
            return out

    def settings_of(self, lanes: Sequence[str]) -> dict[str, LaneSetting]:
        with self.table.lock:
            return {lane: self.settings[lane] for lane in lanes if lane in self.settings}

    def set_limit(self, lane: str, limit: int, stamp: float) -> int | None:
        with self.table.lock:
            current = self.limits.get(lane)
            if current is not None and current[1] > stamp:
                return None  # a newer limit is in force
            self.limits[lane] = (limit, stamp)
            return limit

    def write_setting(self, setting: LaneSetting) -> None:
        with self.table.lock:
            self.settings[setting.name] = setting

    # -- called under the lock by claim, release and adopt ----------------------------------------

    def admits(self, lane: str) -> None:
        lane_limit = self.limits.get(lane, (0, 0.0))[0]
        if len(self.holders.get(lane, ())) >= lane_limit:
            raise SlotsFull(lane_limit)

    def hold(self, lane: str, name: str) -> None:
        self.holders.setdefault(lane, set()).add(name)

    def adopt(self, lane: str, name: str) -> None:
        if lane in self.limits:
            self.hold(lane, name)  # it runs already: counted whatever the lane's cap

    def free(self, lane: str, name: str) -> None:
        self.holders.get(lane, set()).discard(name)

"""What holds starts now, and why a tick stopped: MAX and a pause, the global pool, each lane's pool
and queue, the concurrency keys' lines.

``sluice status KEY`` for a payload with no record answers from it (``Room.holds``: what would keep
it from starting if it were in a queue), and ``sluice tick`` says from it, read after the tick, why
the tick stopped (``Room.stop_reasons``): the launcher's own word (``TickSummary.stopped``) is what
its last admission loop saw, which on a stack with lanes is not the whole story (a loop over an
empty lane says ``empty`` while another lane is full with payloads waiting).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from sluice.core.records import Lane
from sluice.features.lanes import DEFAULT_LANE
from sluice.ops.keys import key_status
from sluice.ops.lanes import lane_overview
from sluice.ops.maximum import read_max
from sluice.ops.parked import parked_by_lane
from sluice.runtime import Runtime


class Hold(StrEnum):
    """What holds starts (or stopped a tick), most telling first."""

    TRANSIENT = "transient"  # AWS throttled or failed: the tick's rest returns to the queue
    CONTENDED = "contended"  # other launchers kept moving the slot pool: MAX not in the caps yet
    TIME = "time"  # the tick's time limit
    MAX_INVALID = "max invalid"  # the MAX parameter holds no usable value: nothing starts
    PAUSED = "paused"  # MAX is 0
    FULL = "full"  # every global slot is taken
    LANE_PAUSED = "lane paused"
    LANE_FULL = "lane full"
    KEY_FULL = "key full"  # a concurrency key at its cap (0: the key is paused)
    NOT_RECEIVED = "not received"  # visible messages the tick did not receive (FIFO groups in flight)
    KEY_LINES = "key lines"  # the queue is empty; payloads wait in concurrency keys' lines
    EMPTY = "empty"  # the queue is empty


ORDER = list(Hold)


@dataclass(frozen=True, slots=True)
class Held:
    """One reason, with where it holds (``lane``: None for the global pool or a stack without lanes)."""

    hold: Hold
    lane: str | None = None
    concurrency_key: str | None = None


@dataclass(frozen=True, slots=True)
class QueueRoom:
    """One lane's queue and pool; on a stack without lanes, the stack's queue and the global pool."""

    lane: str
    waiting: int  # visible messages
    in_flight: int  # received and not yet deleted (or returned)
    delayed: int
    in_key_lines: int  # parked in concurrency keys' lines, to come back to this queue
    running: int
    limit: int | None  # None: no limit in force yet (before the first tick)
    free: int | None
    paused: bool = False  # the lane is paused (``pause --lane``)
    state: dict[str, Any] | None = None  # the lane as ``sluice.ops.lanes.lane_overview`` gives it

    @property
    def full(self) -> bool:
        return self.free == 0 and self.limit is not None


@dataclass(frozen=True, slots=True)
class Room:
    max: int | None
    max_error: str | None
    resume_max: int | None
    limit: int | None  # the global slots in force
    running: int
    queues: tuple[QueueRoom, ...]
    lanes: bool  # the stack has lanes (``queues`` are its lanes)
    key: dict[str, Any] | None = None  # a concurrency key asked about (``sluice.ops.keys.describe``)

    @property
    def paused(self) -> bool:
        return self.max == 0

    @property
    def free(self) -> int | None:
        return None if self.limit is None else max(0, self.limit - self.running)

    @property
    def full(self) -> bool:
        return self.free == 0

    def holds(self) -> list[Held]:
        """What keeps a payload from starting now, were it received: empty when nothing does."""
        held = []
        if self.max_error:
            held.append(Held(Hold.MAX_INVALID))
        if self.paused:
            held.append(Held(Hold.PAUSED))
        elif self.full:
            held.append(Held(Hold.FULL))
        for q in self.queues if self.lanes else ():
            if q.paused:
                held.append(Held(Hold.LANE_PAUSED, q.lane))
            elif q.full:
                held.append(Held(Hold.LANE_FULL, q.lane))
        k = self.key
        if k is not None and k["running"] >= k["cap"] and not ("fair_lane" in k and k["own_cap"] is None):
            held.append(Held(Hold.KEY_FULL, concurrency_key=k["key"]))
        return held

    def stop_reasons(self, stopped: str) -> list[Held]:
        """Why a tick that ended with the launcher's word ``stopped`` started nothing more, read
        after it: most telling first, one reason per lane below the global ones."""
        if stopped in (Hold.TRANSIENT, Hold.CONTENDED, Hold.TIME):
            return [Held(Hold(stopped))]
        if self.max_error:
            return [Held(Hold.MAX_INVALID)]
        if self.paused:
            return [Held(Hold.PAUSED)]
        if self.full:
            return [Held(Hold.FULL)]
        reasons = []
        for q in self.queues:
            lane = q.lane if self.lanes else None
            if self.lanes and q.paused:
                reasons.append(Held(Hold.LANE_PAUSED, lane))
            elif self.lanes and q.full:
                reasons.append(Held(Hold.LANE_FULL, lane))
            elif q.waiting:
                reasons.append(Held(Hold.NOT_RECEIVED, lane))
            elif q.in_key_lines:
                reasons.append(Held(Hold.KEY_LINES, lane))
            else:
                reasons.append(Held(Hold.EMPTY, lane))
        return sorted(reasons, key=lambda h: ORDER.index(h.hold))

    def queue(self, lane: str) -> QueueRoom | None:
        return next((q for q in self.queues if q.lane == lane), None)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(paused=self.paused, free=self.free, holds=[asdict(h) for h in self.holds()])
        return data


def read_room(
    rt: Runtime,
    lanes: Sequence[Lane] = (),
    *,
    lane: str | None = None,
    concurrency_key: str | None = None,
    deployed_default: Callable[[], int | None] = lambda: None,
) -> Room:
    """The room as it stands: MAX, the global pool, each lane's (or the stack's) queue and pool,
    ``lane`` alone when named, and concurrency key ``concurrency_key``'s line when named."""
    s = rt.settings
    s.require("queue_url", "table_name")
    maximum, error, remembered = s.max_concurrency, None, None
    if s.max_parameter:
        state = read_max(rt)
        maximum = state.value if state.exists else deployed_default()
        error, remembered = state.error, state.remembered
    store = rt.store()
    ledger = store.ledger()
    limit = ledger.in_force
    if limit is None and maximum is not None:
        limit = ledger.limit(maximum)  # what the first tick puts in force
    running = len(ledger.holders)
    if lanes:
        chosen = [x for x in lanes if lane is None or x.name == lane]
        queues = tuple(
            QueueRoom(
                lane=state["lane"],
                waiting=state["waiting"],
                in_flight=state["in_flight"],
                delayed=state["delayed"],
                in_key_lines=state["parked"]["in_key_lines"],
                running=state["running"],
                limit=state["limit"],
                free=state["free"],
                paused=state["paused"],
                state=state,
            )
            for state in lane_overview(rt, chosen)
        )
    else:
        depth = rt.queue().depth()
        queues = (
            QueueRoom(
                lane=DEFAULT_LANE,
                waiting=depth.get("ApproximateNumberOfMessages", 0),
                in_flight=depth.get("ApproximateNumberOfMessagesNotVisible", 0),
                delayed=depth.get("ApproximateNumberOfMessagesDelayed", 0),
                in_key_lines=parked_by_lane(store).of(DEFAULT_LANE)["in_key_lines"],
                running=running,
                limit=limit,
                free=None if limit is None else max(0, limit - running),
            ),
        )
    key = key_status(rt, concurrency_key) if concurrency_key is not None else None
    return Room(maximum, error, remembered, limit, running, queues, bool(lanes), key)

"""The launcher's admission with lanes (``sluice.features.lanes``): the tick's rounds over the priorities and
a completion's refill of the one slot it freed, each lane admitting from its own queue by its own
``sluice.launch.admission.Admission`` (one per lane, held here); a fair lane's admission (``sluice.features.fair``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from sluice.core.errors import TransientError
from sluice.core.limits import Ledger
from sluice.core.model import Outcome
from sluice.core.records import Lane, LaneSetting
from sluice.core.summary import TickSummary
from sluice.features import fair
from sluice.features.lanes import by_priority, refill_order, split
from sluice.launch.admission import RECEIVE_BATCH, Admission, time_left
from sluice.launch.context import LaunchContext, StateMachineCheck

__all__ = ["RECEIVE_BATCH", "SORT_RECEIVES", "LaneAdmission"]

SORT_RECEIVES = 2_000  # receives one pass over a fair lane's queue makes at most (then the next pass)


class LaneAdmission:
    """The lanes' side of the launcher: the rounds over the lanes, each lane admitting by its own
    admission (``admission``)."""

    def __init__(self, ctx: LaunchContext, checked: StateMachineCheck) -> None:
        self.ctx = ctx
        self.checked = checked  # the launcher's, shared by every lane's admission
        self._lanes: dict[str, Admission] = {}

    def admission(self, lane: Lane) -> Admission:
        """``lane``'s admission: receiving from its queue, its claims taking a slot of ``lane`` too."""
        one = self._lanes.get(lane.name)
        if one is None:
            one = self._lanes[lane.name] = Admission(self.ctx.for_lane(lane), self.checked)
        return one

    def sync_lanes(self) -> dict[str, int]:
        """Bring each lane's caps to its limit in force: the operator's setting (``LANE#``) or the
        configured MAX, stamped with the setting's time so that a tick holding an older one never
        undoes a newer one. Two reads; a write only for a lane whose limit moved."""
        names = [lane.name for lane in self.ctx.settings.lanes]
        settings = self.ctx.store.lane_settings(names)
        rooms = self.ctx.store.lane_rooms(names, whole=True)
        limits = {}
        for lane in self.ctx.settings.lanes:
            setting = settings.get(lane.name) or LaneSetting(lane.name)
            if lane.implied and setting.max is None:
                lane = replace(lane, max=self._global_max(lane.max))
            limit = setting.limit(lane)
            if not rooms[lane.name].exists or rooms[lane.name].limit != limit:
                written = self.ctx.store.set_lane_limit(lane.name, limit, setting.changed_at)
                if written is None:
                    self.ctx.log.warning(
                        "lane limit not moved: a newer one is in force",
                        extra={"lane": lane.name, "limit": limit, "stamp": setting.changed_at},
                    )
                limit = rooms[lane.name].limit if written is None else written
            elif (rooms[lane.name].frozen and rooms[lane.name].running < limit) or rooms[lane.name].unsettled:
                # Frozen by a lowered limit, and its runs fit under it again, or a plan of several
                # transactions stopped between them (its caps short of its limit): plan its caps anew.
                self.ctx.store.thaw_lane(lane.name)
            limits[lane.name] = limit
        return limits

    def _global_max(self, fallback: int) -> int:
        """The global MAX as the tick reads it (cached), for the implied lane ``default``."""
        try:
            return self.ctx.max_source.reading().value
        except TransientError:
            return fallback

    def admit_lanes(
        self, summary: TickSummary, *, remaining_ms: Callable[[], int] | None, linger: bool
    ) -> TickSummary:
        """The scheduled tick with lanes (``_lane_rounds``), then each lane's figures as it ends
        (running and MAX in force, for the metrics: one more read per tick)."""
        self._lane_rounds(summary, remaining_ms=remaining_ms, linger=linger)
        rooms = self.ctx.store.lane_rooms([lane.name for lane in self.ctx.settings.lanes], whole=True)
        for name, room in rooms.items():
            figures = summary.lanes.setdefault(name, {"received": 0, "started": 0})
            figures.update(running=room.running, limit=room.limit)
        return summary

    def _lane_rounds(
        self, summary: TickSummary, *, remaining_ms: Callable[[], int] | None, linger: bool
    ) -> TickSummary:
        """The scheduled tick with lanes: the lanes' caps first, then rounds over the priorities,
        highest first. In a round, the global room is split among the lanes of one priority by
        weight (``sluice.features.lanes.split``), each lane admitting its share from its own queue; a
        priority whose lanes start nothing more hands the room to the next. While lingering, the
        rounds go on (each lane's receive waits ``receiveWaitSeconds``)."""
        self.sync_lanes()
        names = [lane.name for lane in self.ctx.settings.lanes]
        linger_until = self.ctx.clock.now() + (self.ctx.settings.linger_seconds if linger else 0)
        first = True
        while True:
            started = offered = 0
            waited = False  # an ordinary lane's receive waited receiveWaitSeconds this round
            for group in by_priority(self.ctx.settings.lanes):
                drained: set[str] = set()
                while True:
                    rooms = self.ctx.store.lane_rooms(names)
                    ledger = self.ctx.store.look()
                    if first:
                        summary.running_before, first = ledger.running, False
                    open_ = [lane for lane in group if lane.name not in drained]
                    shares = split(ledger.free, open_, {n: r.free for n, r in rooms.items()})
                    if not any(shares.values()):
                        break
                    offered += 1
                    moved = 0
                    for lane in open_:
                        if not shares[lane.name]:
                            continue
                        part = self._admit_lane(
                            self.admission(lane),
                            shares[lane.name],
                            remaining_ms=remaining_ms,
                            sync_limit=True,
                        )
                        summary.add_lane(lane.name, part)
                        moved += part.n(Outcome.STARTED)
                        waited = waited or (not lane.fair and self.ctx.settings.receive_wait_seconds > 0)
                        if part.stopped in ("paused", "time", "transient"):
                            summary.stopped = part.stopped
                            return summary
                        if part.stopped == "empty" or part.n(Outcome.STARTED) < shares[lane.name]:
                            drained.add(lane.name)  # its queue gave less than its share
                    # A round that started nothing drained every lane it gave a share to; the lanes
                    # the split gave none (their share rounded away) are offered the room next.
                    started += moved
            if not offered:
                summary.stopped = "full"  # no lane has room: nothing to linger for
                return summary
            if not (self.ctx.clock.now() < linger_until and time_left(self.ctx.settings, remaining_ms)):
                summary.stopped = "full" if started else "empty"
                return summary
            if not started and not waited:
                self.ctx.sleep(1.0)  # no receive waited (none does in a fair lane): pace the lingering rounds

    def refill_lanes(
        self, *, remaining_ms: Callable[[], int] | None, freed: tuple[int, ...] | None
    ) -> TickSummary:
        """A completion's refill with lanes: its one freed slot goes to the first lane with room and
        a message, by priority, then in a weighted draw among equal priorities
        (``sluice.features.lanes.refill_order``). One read of every lane's room; a receive per lane tried."""
        summary = TickSummary()
        names = [lane.name for lane in self.ctx.settings.lanes]
        rooms = self.ctx.store.lane_rooms(names)
        for name, room in rooms.items():
            if room.frozen:
                self.ctx.store.thaw_lane(name)  # rare: a lowered lane MAX; it may admit again now
                rooms[name] = self.ctx.store.lane_rooms([name])[name]
        open_ = [
            lane for lane in refill_order(self.ctx.settings.lanes, self.ctx.rng) if rooms[lane.name].free > 0
        ]
        ledger = self.ctx.store.look(freed) if open_ else None
        for i, lane in enumerate(open_):
            last = i == len(open_) - 1
            part = self._admit_lane(
                self.admission(lane),
                1,
                remaining_ms=remaining_ms,
                lane_free=rooms[lane.name].free,
                ledger=ledger,  # read once for every lane tried: none of them took a slot
                # Every lane but the last is asked without waiting: an empty one costs no second.
                wait_seconds=None if last else 0,
            )
            summary.add_lane(lane.name, part)
            summary.stopped = part.stopped
            if part.n(Outcome.STARTED) or part.stopped in ("time", "transient"):
                break
            if part.stopped == "full" and not part.received:
                break  # the lane had room, so the global pool has none (MAX lowered): no lane can
        return summary

    def _admit_lane(
        self,
        one: Admission,
        share: int,
        *,
        remaining_ms: Callable[[], int] | None,
        sync_limit: bool = False,
        lane_free: int | None = None,
        ledger: Ledger | None = None,
        wait_seconds: int | None = None,
    ) -> TickSummary:
        """A lane's admission ``one`` admitting at most ``share``: from its queue, or, in a fair
        lane, from its tenants' lines (``sluice.features.fair``)."""
        lane = one.ctx.lane
        assert lane is not None
        if not lane.fair:
            return one.admit(
                remaining_ms=remaining_ms,
                max_new=share,
                sync_limit=sync_limit,
                lane_free=share if lane_free is None else lane_free,
                ledger=ledger,
                wait_seconds=wait_seconds,
            )
        summary = TickSummary()
        # What is new, to its tenant's line. No receive waits: a wait here would only delay the
        # wake (the tick paces its lingering rounds instead, ``_lane_rounds``).
        self._sort(one, summary, remaining_ms)
        if summary.stopped in ("time", "transient"):
            return summary
        sent = fair.wake_lane(
            store=one.ctx.store,
            queue=one.ctx.queue,
            lane=lane,
            now=one.ctx.clock.now(),
            rng=one.ctx.rng,
            at_most=share,
        )
        if sent:
            self._sort(one, summary, remaining_ms)  # the woken claim (and what came meanwhile lines up)
        if summary.stopped == "empty" and summary.n(Outcome.STARTED) >= share:
            summary.stopped = "full"  # its share is taken: it may have more for the next round
        return summary

    def _sort(self, one: Admission, summary: TickSummary, remaining_ms: Callable[[], int] | None) -> None:
        """A pass over a fair lane's queue (its admission ``one``'s) until it is empty (or time runs
        out): new messages go to their tenants' lines, woken ones claim and start; nothing is handed
        back for want of room. Every message is parked once, so a long pass happens once per
        backlog, and the waiters woken after it are not left behind messages nobody has parked yet."""
        summary.stopped = "empty"
        one.steps.line_all = False
        for _ in range(SORT_RECEIVES):
            if not one.time_left(remaining_ms):
                summary.stopped = "time"
                return
            messages = one.receive(max(RECEIVE_BATCH, one.ctx.fan.workers), 0)
            if not messages:
                summary.stopped = "empty"
                return
            summary.received += len(messages)
            # A batch of several tenants has someone to be fair to: its newcomers line up rather
            # than claim, so that it is shared out by the waker, not taken by the tenant queued
            # first. One tenant alone in sight, with nobody waiting, claims at once.
            # Once one message has lined up (``_line_up``), someone waits: the rest line up without
            # a claim that would be refused.
            one.steps.line_all = one.steps.line_all or len({one.batch_group(m) for m in messages}) > 1
            _, stop = one.process_batch(messages, summary)
            if stop:
                summary.stopped = stop
                return
        summary.stopped = "full"  # the pass's bound: the next round or admission goes on

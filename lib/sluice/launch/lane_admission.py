"""The launcher's admission with lanes (``sluice.features.lanes``): the tick's rounds over the priorities and
a completion's refill of the one slot it freed, each lane admitting from its own queue by its own
``sluice.launch.admission.Admission`` (one per lane, held here); a fair lane's admission (``sluice.features.fair``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from sluice.core.errors import TransientError
from sluice.core.limits import Ledger
from sluice.core.model import Message, Outcome
from sluice.core.records import Lane, LaneSetting
from sluice.core.summary import TickSummary
from sluice.features import fair
from sluice.features.keys import TICKET_ATTRIBUTE, KeyStore
from sluice.features.lanes import by_priority, refill_order, split
from sluice.launch.admission import RECEIVE_BATCH, Admission, time_left
from sluice.launch.context import LaunchContext, StateMachineCheck

__all__ = ["RECEIVE_BATCH", "SORT_RECEIVES", "LaneAdmission"]

SORT_RECEIVES = 2_000  # receives one pass over a fair lane's queue makes at most (then the next pass)
FIRST_RECEIVES = 20  # receives a pass keeps in hand at most, to see its tenants before any claims


def newcomer(message: Message) -> bool:
    """Not a woken waiter: no ticket, not even one that does not parse (checked when it is processed,
    where a bad one is dead-lettered with its reason)."""
    return TICKET_ATTRIBUTE not in message.attributes


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
                        if part.stopped in ("paused", "time", "transient", "contended"):
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
            if part.n(Outcome.STARTED) or part.stopped in ("time", "transient", "contended"):
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
        shared = self._sort(one, summary, remaining_ms, share=share)
        if summary.stopped in ("time", "transient"):
            return summary
        try:
            sent = fair.wake_lane(
                store=one.ctx.store,
                queue=one.ctx.queue,
                lane=lane,
                now=one.ctx.clock.now(),
                rng=one.ctx.rng,
                at_most=share - shared,
            )
        except TransientError as exc:  # the lines wait in the table: the next round or tick wakes them
            one.interrupted("a fair lane's lines could not be read or woken", exc)
            summary.stopped = "transient"
            return summary
        if sent:
            self._sort(one, summary, remaining_ms)  # the woken claim (and what came meanwhile lines up)
        if summary.stopped == "empty" and summary.n(Outcome.STARTED) >= share:
            summary.stopped = "full"  # its share is taken: it may have more for the next round
        return summary

    def _sort(
        self,
        one: Admission,
        summary: TickSummary,
        remaining_ms: Callable[[], int] | None,
        *,
        share: int | None = None,
    ) -> int:
        """A pass over a fair lane's queue (its admission ``one``'s) until it is empty (or time runs
        out): new messages go to their tenants' lines, woken ones claim and start; nothing is handed
        back for want of room. Every message is parked once, so a long pass happens once per
        backlog, and the waiters woken after it are not left behind messages nobody has parked yet.
        With ``share``, the pass first sees who is there (``_first_batches``), and the newcomers in
        hand claim their share of it at once (``_claim_shares``): returns how much of ``share``
        they were given (the waker has the rest; woken waiters claim slots their wakers kept)."""
        summary.stopped = "empty"
        one.steps.line_all = False
        receives = shared = 0
        if share is not None:
            in_hand, receives, cut = self._first_batches(one, summary, remaining_ms)
            stop, shared = self._claim_shares(one, summary, in_hand, share) if in_hand else ("", 0)
            if stop or cut or not in_hand:
                summary.stopped = stop or cut or "empty"
                return shared
        for _ in range(SORT_RECEIVES - receives):
            if not one.time_left(remaining_ms):
                summary.stopped = "time"
                return shared
            messages = self._receive(one, summary)
            if messages is None:
                return shared
            if not messages:
                summary.stopped = "empty"
                return shared
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
                return shared
        summary.stopped = "full"  # the pass's bound: the next round or admission goes on
        return shared

    def _first_batches(
        self, one: Admission, summary: TickSummary, remaining_ms: Callable[[], int] | None
    ) -> tuple[list[Message], int, str]:
        """The pass's first receives, kept in hand (in flight) while each brings a tenant not in hand
        yet. SQS FIFO skips a message group with a message in flight: when each tenant's messages
        share a group (``sluice enqueue`` to a fair lane sends them so), each receive surfaces
        another tenant, however long the backlog of the tenants ahead of it. Returns the messages
        in hand, the receives made, and why the pass ends after them ("time", "transient"), if it
        does; what is in hand is processed either way, as a pass processes each batch it received."""
        in_hand: list[Message] = []
        tenants: set[str] = set()
        for receives in range(1, FIRST_RECEIVES + 1):
            if not one.time_left(remaining_ms):
                return in_hand, receives, "time"
            messages = self._receive(one, summary)
            if messages is None:
                return in_hand, receives, "transient"
            summary.received += len(messages)
            in_hand += messages
            new = {one.batch_group(m) for m in messages} - tenants
            tenants |= new
            if not new:
                return in_hand, receives, ""
        return in_hand, FIRST_RECEIVES, ""

    @staticmethod
    def _receive(one: Admission, summary: TickSummary) -> list[Message] | None:
        """One receive of a pass, without waiting; None when SQS refused it (the pass ends, the tick
        as interrupted: ``transient``)."""
        try:
            return one.receive(max(RECEIVE_BATCH, one.ctx.fan.workers), 0)
        except TransientError as exc:  # SQS throttled past the SDK's retries: the next round or tick
            one.interrupted("a receive failed", exc)
            summary.stopped = "transient"
            return None

    @staticmethod
    def _shares(one: Admission, tenants: Mapping[str, list[Message]], share: int) -> dict[str, int]:
        """How many of each tenant's newcomers in hand claim at once: none while anyone waits in a
        line (their claims would be refused: they line up, as a pass's newcomers do), or when the
        lines cannot be read; else ``share`` among them, the fewest runs first, each at most an
        even part of it. A tenant may have more than it has in hand (SQS hid the rest of its group
        behind what is in hand): the part it leaves stays free for the waker, which gives it to the
        tenants with the fewest runs once their waiters are lined up, not to those received first."""
        keys: KeyStore = one.ctx.store
        try:
            if keys.keys_waiting():
                return {}
            states = keys.key_states(sorted(tenants))
        except TransientError as exc:
            one.ctx.log.warning("fair lane: its tenants' lines could not be read", extra={"error": str(exc)})
            return {}
        even = -(-share // len(tenants))
        return fair.share_out(
            share,
            states,
            now=one.ctx.clock.now(),
            rng=one.ctx.rng,
            waiting={t: min(len(ms), even) for t, ms in tenants.items()},
        )

    @staticmethod
    def _hand_back(one: Admission, messages: list[Message]) -> None:
        """Messages in hand that the pass will not begin: back to the queue, visible at once."""
        if messages:
            one.ctx.queue.release(messages)

    def _claim_shares(
        self, one: Admission, summary: TickSummary, in_hand: list[Message], share: int
    ) -> tuple[str, int]:
        """The messages in hand, of one tenant or of several. Several, and nobody waiting in any line
        (what a newcomer's claim checks): each tenant's newcomers claim at once its part of
        ``share`` (``fair.share_out``: the fewest runs first), then the rest line up, so that the
        first tenant received does not take the slots of those received after it. Returns why to
        stop (or "") and how much of ``share`` the tenants were given."""
        tenants: dict[str, list[Message]] = {}
        first: list[Message] = []
        for message in in_hand:
            group = one.batch_group(message)
            if group.startswith(fair.TENANT_GROUP) and newcomer(message):
                tenants.setdefault(group.removeprefix(fair.TENANT_GROUP), []).append(message)
            else:
                first.append(message)  # a woken waiter claims; a bad message is dead-lettered
        if len(tenants) < 2:
            _, stop = one.process_batch(in_hand, summary)
            return stop, 0
        shares = self._shares(one, tenants, share)
        rest: list[Message] = []
        for tenant_, messages in tenants.items():
            first += messages[: shares.get(tenant_, 0)]
            rest += messages[shares.get(tenant_, 0) :]
        try:
            _, stop = one.process_batch(first, summary) if first else (0, "")
        except Exception:
            self._hand_back(one, rest)
            raise
        if stop:
            self._hand_back(one, rest)
            return stop, sum(shares.values())
        one.steps.line_all = bool(rest)  # the rest line up: their tenants had their share
        _, stop = one.process_batch(rest, summary) if rest else (0, "")
        return stop, sum(shares.values())

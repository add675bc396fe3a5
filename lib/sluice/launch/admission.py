"""One queue's admission: how many messages to take and when to stop (``Admission.admit``), the
receives, the message groups run side by side (``startConcurrency``, ``sluice.primitives.fanout``: as many as
the room to fill at that round, by default) and the one delete per batch. The launcher holds one for its queue, and one per lane (``sluice.launch.lane_admission``);
what happens to each message is its ``steps`` (``sluice.launch.per_message``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial

from sluice.core.errors import (
    AmbiguousStartError,
    ConfigurationError,
    Contended,
    InvalidPayload,
    SlotsFull,
    TransientError,
)
from sluice.core.gates import Grant
from sluice.core.limits import Ledger
from sluice.core.model import Message, Outcome
from sluice.core.summary import TickSummary
from sluice.features.awaits import ReadAhead, read_ahead
from sluice.features.fair import TENANT_GROUP
from sluice.features.fair import tenant as fair_tenant
from sluice.launch.context import LaunchContext, StateMachineCheck
from sluice.launch.per_message import MessageProtocol
from sluice.launch.settings import Settings
from sluice.primitives.fanout import start_width

RECEIVE_BATCH = 10  # SQS ReceiveMessage returns at most 10
LONG_POLL = 20  # SQS WaitTimeSeconds maximum


class Admission:
    """Admit queued payloads of one queue (the launcher's, or one lane's: ``ctx.lane``) into free
    slots, each message by the per-message steps."""

    def __init__(self, ctx: LaunchContext, checked: StateMachineCheck) -> None:
        self.ctx = ctx
        self.steps = MessageProtocol(ctx)
        self.checked = checked  # shared by the launcher's admissions

    def admit(
        self,
        *,
        summary: TickSummary | None = None,
        remaining_ms: Callable[[], int] | None = None,
        max_new: int | None = None,
        linger: bool = False,
        sync_limit: bool = False,
        freed: tuple[int, ...] | None = None,
        lane_free: int | None = None,
        ledger: Ledger | None = None,
        wait_seconds: int | None = None,
    ) -> TickSummary:
        """Receive and start payloads while slots are free, the queue has messages and time remains.

        The ledger is read again before a receive, unless the room last read, less what was taken
        since, covers a whole round more than the next (a fill, ``_look_margin``); each claim is
        admitted by the caps in force at its write. With ``sync_limit`` (the scheduled tick) MAX is
        read before every receive too and the caps are brought to MAX − external
        (``Store.set_limit``), so a MAX changed in SSM by any means reaches the caps within one
        tick, also while the tick lingers. The read before a receive is ``Store.look``: one call
        whatever MAX is; ``freed`` (a completion's refill) reads only the shard the completion
        freed. ``max_new`` caps how many this call starts: a completion refills the one slot it
        freed. If every completion of a burst took all the free slots it saw, all but one would
        lose their claims and return their messages, and each return spends a receive of the
        message's ``maxReceiveCount``: healthy messages would walk to the DLQ. ``linger`` keeps
        long-polling while slots are free (``SLUICE_LINGER_SECONDS``); only the scheduled tick
        lingers.
        """
        summary = summary or TickSummary()
        self.check_state_machine()
        state = _Admitting(
            max_new=max_new,
            linger_until=self.ctx.clock.now() + (self.ctx.settings.linger_seconds if linger else 0),
            wait_seconds=wait_seconds,
            lane_free=lane_free,
            known=ledger,
        )
        while True:
            ledger = self._read_room(state, summary, freed=freed, sync_limit=sync_limit)
            if state.contended is not None:
                # The MAX it read is not in the caps, which may admit more: nothing more this time.
                self.ctx.log.warning(
                    "tick ends: the slot pool kept changing; MAX is not in the caps yet",
                    extra={"error": str(state.contended)},
                )
                summary.stopped = "contended"
                return summary
            if sync_limit and summary.max_concurrency == 0:
                summary.stopped = "paused"
                return summary
            stop = self._round(state, ledger, summary, remaining_ms)
            if stop == self.ctx.gate.name and self._wait_for_gate(state, remaining_ms):
                continue
            if stop:
                summary.stopped = stop
                return summary

    def _read_room(
        self, state: _Admitting, summary: TickSummary, *, freed: tuple[int, ...] | None, sync_limit: bool
    ) -> Ledger:
        """The room before a receive: as last known, or read (with MAX brought to the caps first,
        for the scheduled tick); the summary's figures as read."""
        ledger = state.known or self.ctx.store.look(freed if state.first else None)
        state.known = None
        if sync_limit:
            reading = self.ctx.max_source.reading()
            summary.max_concurrency = reading.value
            try:
                limit = self.ctx.store.set_limit(ledger.source(reading))
            except Contended as exc:  # ``admit`` stops: the figures are the pool's, read again
                state.contended, limit = exc, None
            if limit != ledger.in_force:
                ledger = self.ctx.store.look()
        summary.saw(ledger, first=state.first)
        state.first = False
        return ledger

    def _room_for(self, state: _Admitting, ledger: Ledger) -> int:
        """How many this round may start: the free room, within the lane's and ``max_new``."""
        free = ledger.free
        lane = self.ctx.lane
        if lane is not None:
            # A lane's admission: no more than its lane has room for (read with the other lanes'
            # for the first receive, then again before each one).
            if state.lane_free is None:
                state.lane_free = self.ctx.store.lane_rooms([lane.name])[lane.name].free
            free, state.lane_free = min(free, state.lane_free), None
        if state.max_new is not None:
            free = min(free, state.max_new - state.started)
        return free

    def _round(
        self, state: _Admitting, ledger: Ledger, summary: TickSummary, remaining_ms: Callable[[], int] | None
    ) -> str:
        """One receive and its batch. Returns why to stop, or "" to go on."""
        free = self._room_for(state, ledger)
        if free <= 0:
            return "full"
        if not self.time_left(remaining_ms):
            return "time"
        grant = self._grant(free)
        if grant.n == 0:
            state.gate_due = grant.due
            return self.ctx.gate.name
        lingering = self.ctx.clock.now() < state.linger_until
        wait = (
            self._wait_seconds(lingering, remaining_ms, state.linger_until)
            if state.wait_seconds is None
            else state.wait_seconds
        )
        if lingering:
            # Keys the gate held (``sluice.core.gates``): woken once due, and the long poll no
            # longer than until the next is, so their waiters start within this tick.
            self.steps.held_keys.wake_held()
            due = self.steps.held_keys.held_due()
            if due is not None:
                wait = max(0, min(wait, math.ceil(due - self.ctx.clock.now())))
        try:
            messages = self.receive(grant.n, wait)
        except TransientError as exc:  # SQS throttled past the SDK's retries: the next round or tick
            self._give_back(grant, grant.n)
            self.interrupted("a receive failed", exc)
            return "transient"
        if not messages:
            self._give_back(grant, grant.n)
            if lingering and self.time_left(remaining_ms):
                self._until_held(state, remaining_ms)
                return ""  # completions may have freed slots and MAX may have moved meanwhile
            return "empty"
        summary.received += len(messages)
        filled, stop = self.process_batch(messages, summary)
        # Each message received spends its grant, started or not (a resumed claim starts without
        # counting as filled); what the receive did not bring is given back. A crash keeps all spent.
        self._give_back(grant, grant.n - len(messages))
        state.started += filled
        summary.running_after = ledger.running + filled
        if stop:
            return stop
        if state.max_new is not None and state.started >= state.max_new:
            return "full"  # the one slot a completion freed is filled
        if filled >= free and ledger.complete:
            return "full"  # as far as this call knows: no read needed to stop
            # (after a sample of the shards, the next read samples others)
        state.known = self._known_after(ledger, filled, state.max_new)
        return ""

    # -- the gate (sluice.core.gates) ----------------------------------------------------------

    def _grant(self, free: int) -> Grant:
        """Grants for up to ``free`` starts from the gate, for this admission's pool, taken before
        the receive they size: a payload the gate holds stays in the queue, never received."""
        lane = None if self.ctx.lane is None else self.ctx.lane.name
        try:
            return self.ctx.gate.before_receive(lane, free, self.ctx.clock.now())
        except TransientError as exc:
            self.interrupted(f"the {self.ctx.gate.name} limits could not be read or written", exc)
            return Grant(0)

    def _give_back(self, grant: Grant, unused: int) -> None:
        if unused <= 0:
            return
        try:
            self.ctx.gate.give_back(grant, unused)
        except TransientError as exc:  # kept spent: fewer starts in this window, never more
            self.interrupted("grants not used could not be given back", exc)

    def _until_held(self, state: _Admitting, remaining_ms: Callable[[], int] | None) -> None:
        """After a long poll that found nothing, the rest of the wait until a held key's room
        (none, where the poll was shortened to it) when that comes within the linger."""
        state.gate_due = self.steps.held_keys.held_due()
        self._wait_for_gate(state, remaining_ms)

    def _wait_for_gate(self, state: _Admitting, remaining_ms: Callable[[], int] | None) -> bool:
        """Whether to wait for the gate's next room and go on: while lingering (the scheduled
        tick), when that room comes before the linger and the invocation's time end."""
        due, state.gate_due = state.gate_due, None
        if due is None:
            return False
        wait = due - self.ctx.clock.now()
        if self.ctx.clock.now() + wait > state.linger_until:
            return False
        if (
            remaining_ms is not None
            and remaining_ms() - wait * 1000 <= self.ctx.settings.time_reserve_seconds * 1000
        ):
            return False
        self.ctx.sleep(max(wait, 0.0))
        return True

    def _known_after(self, ledger: Ledger, filled: int, max_new: int | None) -> Ledger | None:
        """The room the next receive may be sized by without a read, if any."""
        if filled == 0 and max_new is not None:
            # A refill whose messages took no slot (parked, duplicates, dead-lettered): the
            # slot it freed is as free as it was read, so the next receive needs no new read. A
            # launcher that took it meanwhile makes the claim fail (SlotsFull): that message
            # returns, as it would have after a read a moment before its claim.
            return ledger
        if (
            max_new is None
            and self.ctx.lane is None
            and ledger.free - filled >= self._look_margin(ledger.free - filled)
        ):
            # A fill with room to spare as read: the next receive is sized by that room less
            # what this round took, without a read (claims obey the caps as ever; a room taken
            # meanwhile by another launcher, or a MAX lowered, returns a round's messages at
            # most, as after a read a moment before).
            return replace(
                ledger, room=ledger.free - filled, complete=False, estimated=ledger.running + filled
            )
        return None

    def _look_margin(self, room: int) -> int:
        """Known free room a fill needs to skip the read before its next receive: a round's worth
        more than the next round takes."""
        return self.width(room) + RECEIVE_BATCH

    def width(self, room: int) -> int:
        """Claims and starts a round with ``room`` to fill keeps in flight (``startConcurrency``:
        ``sluice.primitives.fanout.start_width``), within the fan's threads."""
        return min(self.ctx.fan.workers, start_width(self.ctx.settings.start_concurrency, room))

    # -- one batch ----------------------------------------------------------------------------

    def receive(self, free: int, wait_seconds: int) -> list[Message]:
        """Up to ``free`` messages, and no more than the starts this launcher keeps in flight at
        once: one receive (long-polling when lingering); when it comes back full and there is room
        for more, further receives side by side, without waiting."""
        messages = self.ctx.queue.receive(min(free, RECEIVE_BATCH), wait_seconds)
        more = min(free, self.width(free)) - len(messages)
        if len(messages) < RECEIVE_BATCH or more <= 0:
            return messages
        sizes = [min(RECEIVE_BATCH, more - i) for i in range(0, more, RECEIVE_BATCH)]
        for extra in self.ctx.fan.each([partial(self.ctx.queue.receive, n, 0) for n in sizes]):
            if extra.error is not None:
                # The messages in hand are started; a receive that failed is tried at the next round.
                self.ctx.log.warning("an extra receive failed", extra={"error": str(extra.error)})
                continue
            messages.extend(extra.value or ())
        return messages

    def process_batch(
        self, messages: list[Message], summary: TickSummary, handed: Mapping[str, str] | None = None
    ) -> tuple[int, str]:
        """Process the messages received. Returns (slots filled, why to stop or "").

        Message groups run side by side (``fan``); the messages of one group run one after another,
        in the group's order, as SQS FIFO hands them out. The messages handled are then deleted in
        one call per 10, also when an error ends a group early. A crash (``BaseException``: timeout,
        kill) does not delete, like the real thing. No RUNNING mark is written: a claim holds its
        lease until its release, started or not, and a redelivered message resumes it (asking
        DescribeExecution first: ``per_message``). ``handed``: message id → the name a completion's hand-over
        claimed it under (``sluice.launch.handover``): started without a claim of its own.
        """
        by_group: dict[str, list[Message]] = {}
        for message in messages:  # groups in the order of their first message, each in its order
            by_group.setdefault(self.batch_group(message), []).append(message)
        groups = list(by_group.values())
        runs = [_Run() for _ in groups]
        halt = _Halt()
        ahead = read_ahead(self.ctx.store, messages)
        handed = handed or {}
        results = self.ctx.fan.each(
            [partial(self._run_group, g, r, halt, ahead, handed) for g, r in zip(groups, runs, strict=True)]
        )
        done = [m for r in runs for m in r.done]
        filled, stops = 0, set()
        if done:
            try:
                self.ctx.queue.delete(done)
            except TransientError as exc:
                # Each message kept comes back after its visibility timeout and is settled by its
                # lease and its name: resumed, already ran, or a duplicate of the copy in flight.
                self.interrupted("a delete of handled messages failed; they come back and are settled", exc)
                stops.add("transient")
        for run in runs:
            filled += run.filled
            for outcome, n in run.outcomes.items():
                summary.outcomes[outcome.value] = summary.n(outcome) + n
            stops.add(run.stop)
        errors = [r.error for r in results if r.error is not None]
        if errors:
            raise errors[0]
        stop = next((s for s in ("transient", "full") if s in stops), "")
        return filled, stop

    def interrupted(self, what: str, exc: TransientError) -> None:
        self.ctx.log.warning(
            f"tick interrupted by a transient AWS error: {what}",
            extra={"operation": exc.operation, "code": exc.code, "error": str(exc)},
        )

    def _run_group(
        self, messages: list[Message], run: _Run, halt: _Halt, ahead: ReadAhead, handed: Mapping[str, str]
    ) -> None:
        """One group's messages in order. Once any group of the batch finds the slots full or AWS
        failing, the others hand back what they have not begun instead of trying."""
        rest = list(messages)
        while rest:
            message = rest[0]
            if halt.reason:
                self.ctx.queue.release(rest)
                run.add(Outcome.RETURNED if halt.reason == "full" else Outcome.INTERRUPTED, len(rest))
                run.stop = halt.reason
                return
            try:
                outcome = self.steps.process(
                    message, run.done, ahead, handed.get(message.message_id), halt.claims
                )
            except SlotsFull:
                # Another launcher took the slot since our ledger read, or the caps came down.
                self.ctx.queue.release(rest)
                run.add(Outcome.RETURNED, len(rest))
                run.stop = halt.reason = "full"
                return
            except TransientError as exc:
                away = away_after(exc, self.ctx.settings)
                if away:  # the rest began nothing: back at once
                    self.ctx.queue.release(rest[:1], away)
                    self.ctx.queue.release(rest[1:])
                else:
                    self.ctx.queue.release(rest)
                run.add(Outcome.INTERRUPTED, len(rest))
                run.stop = halt.reason = "transient"
                self.interrupted("the rest of the batch returns to the queue", exc)
                return
            except ConfigurationError:
                self.ctx.queue.release(rest)
                halt.reason = "error"
                raise
            run.add(outcome)
            rest = rest[1:]
            if outcome is Outcome.RECHECK:
                # Back for the window: the later messages of its FIFO group wait behind it, sighted.
                # A fair lane's run of one tenant spans groups (woken waiters each have their own):
                # the others go on, as SQS holds nothing of theirs behind it. Handed back unsighted,
                # each duplicate ahead cost them a receive, and enough walked them to the DLQ.
                behind = [m for m in rest if m.group_id == message.group_id]
                rest = [m for m in rest if m.group_id != message.group_id]
                self.steps.branches.sight_behind(message, behind)
                if behind:
                    self.ctx.queue.release(behind)
                run.add(Outcome.RETURNED, len(behind))
            elif outcome is Outcome.STARTED:
                run.filled += 1

    def batch_group(self, message: Message) -> str:
        """Which messages of a batch run one after another: those of one FIFO group; in a fair lane,
        those of one tenant (each parks on its tenant's next ticket: side by side they would race
        for it, sluice.features.fair)."""
        if self.ctx.lane is not None and self.ctx.lane.fair:
            try:
                return TENANT_GROUP + fair_tenant(message, self.ctx.lane)
            except InvalidPayload:
                pass  # dead-lettered when its turn comes
        return _group(message)

    # -- helpers ------------------------------------------------------------------------------

    def check_state_machine(self) -> None:
        self.checked.check(self.ctx.executions, self.ctx.clock.now())

    def time_left(self, remaining_ms: Callable[[], int] | None) -> bool:
        return time_left(self.ctx.settings, remaining_ms)

    def _wait_seconds(
        self, lingering: bool, remaining_ms: Callable[[], int] | None, linger_until: float
    ) -> int:
        settings = self.ctx.settings
        if not lingering:
            return settings.receive_wait_seconds
        budget = linger_until - self.ctx.clock.now()
        if remaining_ms is not None:
            budget = min(budget, remaining_ms() / 1000 - settings.time_reserve_seconds)
        return max(settings.receive_wait_seconds, min(LONG_POLL, int(budget)))


def away_after(exc: TransientError, settings: Settings) -> int:
    """How long the message whose step failed with ``exc`` stays away from the queue. A start that
    may have landed (ambiguous) keeps it away for the consistency window: its copy must come back
    no sooner than S after that start, or DescribeExecution may still answer "no such execution",
    and after a switch of the state machine the resume would start its name on the new machine
    beside the run on the old one (explorer seed 131310309)."""
    return settings.consistency_window_seconds if isinstance(exc, AmbiguousStartError) else 0


def time_left(settings: Settings, remaining_ms: Callable[[], int] | None) -> bool:
    """Whether the invocation has time for another round, its reserve kept."""
    return remaining_ms is None or remaining_ms() > settings.time_reserve_seconds * 1000


@dataclass
class _Admitting:
    """One ``admit`` call between its rounds."""

    max_new: int | None
    linger_until: float
    wait_seconds: int | None
    lane_free: int | None
    known: Ledger | None  # the room as last read, while nothing since has taken any of it
    started: int = 0
    first: bool = True
    gate_due: float | None = None  # when the gate that held this call has room again
    contended: Contended | None = None  # its MAX could not be brought to the caps


@dataclass
class _Run:
    """What one message group's run did, merged into the tick's summary by the caller's thread."""

    done: list[Message] = field(default_factory=list)
    outcomes: dict[Outcome, int] = field(default_factory=dict)
    filled: int = 0
    stop: str = ""

    def add(self, outcome: Outcome, n: int = 1) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + n


@dataclass
class _Halt:
    """Why the groups of a batch should stop beginning messages: "full", "transient", "error"."""

    reason: str = ""
    claims: set[str] = field(default_factory=set)  # names claimed since the batch was received


def _group(message: Message) -> str:
    return message.group_id

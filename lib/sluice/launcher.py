"""The launcher: admit queued payloads into free slots and start one execution per payload.

    tick ──► reconcile ──► admit ──► look ──► receive ≤ free ──► groups side by side ──► delete
                             ▲          (one read;                  (one message each:     (per batch)
                             │           skipped while              sluice.per_message)
                             │           room remains)
                             └── again while slots are free, messages come and time is left

    status event ──► on_status_change ──► release, handing the freed slot to the next payload in
                                          its own transaction (sluice.handover) ──► start, delete

This module is the admission loop: how many messages to take and when to stop (``admit``), the
receives, the message groups run side by side (``startConcurrency``, ``sluice.fanout``) and the one
delete per batch; and a completion's refill. What happens to each message, and why each step is
safe to die after, is ``sluice.per_message``.

Admission is exact across concurrent launchers because the slot is taken by a conditional write
on one shard of the slots (``size(holders) < cap``), in the same transaction as the payload's
lease, and the caps add up to the limit in force. The claim passes no limit: the caps are the
limit. Only the scheduled tick (from MAX and reconciliation's external count) and the operator's
``sluice set-max``/``pause``/``resume`` move them; a completion's refill reads no MAX at all.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from sluice.awaits import ReadAhead, read_ahead
from sluice.completion import StatusChange, settle_status_change
from sluice.effects import Effects
from sluice.errors import ConfigurationError, InvalidPayload, SlotsFull, SluiceError, TransientError
from sluice.fair import tenant as fair_tenant
from sluice.fanout import Pacer, fanout
from sluice.handover import HandOverOffer
from sluice.lane_admission import RECEIVE_BATCH, LaneAdmission
from sluice.model import ExecutionRecord, Ledger, Message, Outcome
from sluice.per_message import MessageProtocol
from sluice.pointers import PayloadObjects
from sluice.ports import Clock, Executions, Fanout, MaxSource, Queue, state_machine_arns
from sluice.receipts import Outputs
from sluice.reconcile import reconcile
from sluice.settings import Settings
from sluice.stores import LaunchStore
from sluice.summary import TickSummary

LONG_POLL = 20  # SQS WaitTimeSeconds maximum
CHECK_INTERVAL = 300.0  # how often a warm launcher re-checks that the state machine exists

log = logging.getLogger("sluice.launcher")


class Launcher(LaneAdmission, MessageProtocol):
    def __init__(
        self,
        *,
        queue: Queue,
        executions: Executions,
        store: LaunchStore,
        max_source: MaxSource,
        clock: Clock,
        settings: Settings,
        logger: logging.Logger | logging.LoggerAdapter | None = None,
        fan: Fanout | None = None,
        sleep: Callable[[float], None] | None = None,
        payloads: PayloadObjects | None = None,
        lane_queues: Mapping[str, Queue] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.queue = queue
        # Lanes (sluice.lanes): each lane's queue (the default lane's is ``queue``); ``lane`` is set
        # on the launcher of one lane (``_for_lane``), whose claims take a slot of that lane too.
        self.lane_queues: Mapping[str, Queue] = lane_queues or {}
        self.lane = None
        self.rng = rng or random.Random()
        self.executions = executions
        self.store = store
        self.max_source = max_source
        self.clock = clock
        self.settings = settings
        self.log = logger or log
        self.fan = fan or fanout(settings.start_concurrency)
        self.sleep = sleep if sleep is not None else getattr(clock, "sleep", time.sleep)
        self.pacer = Pacer(settings.start_rate, settings.start_burst, clock=clock, sleep=self.sleep)
        self.payloads = payloads  # the bucket of stored payloads that pointers name (sluice.pointers)
        self.outputs = Outputs(payloads, settings.receipt_inline_bytes)  # receipts' outputs
        # what outputs send (sluice.effects), to any of the stack's lanes
        self.effects = Effects(
            payloads, settings.pointer_threshold, lanes=tuple(n.name for n in settings.lanes)
        )
        self.identity = uuid.uuid4().hex[:16]  # this container, as a reconciler marking claims
        # When the state machine was last checked: one holder shared with the lanes' launchers
        # (``_for_lane`` copies), so a completion checks it once per interval, not once per lane.
        self._checked: dict[str, float] = {}

    # -- entry points -------------------------------------------------------------------------

    def tick(
        self, *, reconcile_first: bool = True, remaining_ms: Callable[[], int] | None = None
    ) -> TickSummary:
        """One scheduled run: reconcile the ledger with Step Functions, then fill free slots."""
        summary = TickSummary()
        self._check_state_machine()
        if reconcile_first:
            report = reconcile(
                store=self.store,
                executions=self.executions,
                queue=self.queue,
                clock=self.clock,
                settings=self.settings,
                reconciler=self.identity,
                logger=self.log,
                max_source=self.max_source,
                outputs=self.outputs,
                effects=self.effects,
            )
            summary.reconciled = True
            summary.released_by_reconcile = report.released
            summary.drift = report.drift
        if self.settings.lanes:
            return self._admit_lanes(summary, remaining_ms=remaining_ms, linger=True)
        return self.admit(summary=summary, remaining_ms=remaining_ms, linger=True, sync_limit=True)

    def on_status_change(
        self, change: StatusChange, *, remaining_ms: Callable[[], int] | None = None
    ) -> tuple[bool, TickSummary | None, str]:
        """What the completion function does with one status event: release the execution's slot
        and fill the one slot it freed, handing it to the next payload in the release's own write
        (``sluice.handover``; on a stack with lanes, a refill after the release offers it to the
        lanes by priority). Returns (released, the refill's summary, why it was skipped)."""
        offer = None
        if not self.settings.lanes and self._checked_for_hand_over():
            offer = HandOverOffer(
                queue=self.queue,
                executions=self.executions,
                now=self.clock.now,
                claim_timeout=self.settings.claim_timeout_seconds,
                time_left=lambda: self._time_left(remaining_ms),
            )
        try:
            released = settle_status_change(
                change,
                store=self.store,
                queue=self.queue,
                state_machine_arn=state_machine_arns(self.executions),
                now=self.clock.now(),
                executions=self.executions,
                outputs=self.outputs,
                effects=self.effects,
                offer=offer,
            )
        except Exception:
            if offer is not None and offer.message is not None and not offer.claimed:
                self.queue.release([offer.message])  # received for a release that failed: back at once
            raise
        try:
            if released is None:
                # Nothing freed (a repeated event that lost to another): a message received for
                # it is claimed its own way, under the slots in force, rather than sent back.
                taken = offer is not None and offer.message is not None
                return False, self._admit_received(offer) if taken else None, ""  # type: ignore[arg-type]
            if offer is None or not offer.room:
                # Lanes, or nothing received: a frozen or paused pool, a slot from before the
                # shards. The refill reads the freed shard (and thaws the pool when runs fit again).
                freed = None if released.shard is None else (released.shard,)
                return True, self.refill(freed=freed, remaining_ms=remaining_ms), ""
            return True, self._after_hand_over(offer, released, remaining_ms), ""
        except TransientError as exc:
            # The release is done; the next tick fills the slot. Retrying the event would not help.
            self.log.warning("refill skipped: AWS is throttling or unavailable", extra={"error": str(exc)})
            return True, None, str(exc)

    def _checked_for_hand_over(self) -> bool:
        """The state machine check a start needs, before a hand-over claims one. When it fails (AWS
        throttling, or the machine gone) the release goes first, alone, and the refill after it
        checks again and says why, as a refill did: the ended run never keeps its slot for it."""
        try:
            self._check_state_machine()
        except SluiceError:
            return False
        return True

    def _after_hand_over(
        self, offer: HandOverOffer, released: ExecutionRecord, remaining_ms: Callable[[], int] | None
    ) -> TickSummary:
        """Start what the hand-over claimed, or claim the message it received its own way; when it
        received none, or that took no slot (parked, a duplicate, dead-lettered), the freed slot is
        refilled as before, without a read of the slots."""
        summary = self._admit_received(offer)
        if summary.n(Outcome.STARTED):  # a resumed message held a slot of its own already
            summary.stopped = "full"  # the one slot the completion freed is filled
        elif offer.message is None or not summary.stopped:
            # The hand-over's receive does not wait, and came before the release's wake-ups:
            # what it sent back (deferred duplicates, a key's waiters, waiters whose awaits it met,
            # effects) and what arrives within the receive wait is received now, as a refill did.
            # The slot it freed is as free as the hand-over read it: no read before this receive.
            room = Ledger(room=1, complete=False)
            more = self.admit(remaining_ms=remaining_ms, max_new=1, ledger=room)
            summary.received += more.received
            for outcome, n in more.outcomes.items():
                summary.outcomes[outcome] = summary.outcomes.get(outcome, 0) + n
            summary.stopped = more.stopped
            summary.limit, summary.running_after = more.limit, more.running_after
            summary.counted = more.counted  # False: the hand-over's room alone, no count read
        return summary

    def _admit_received(self, offer: HandOverOffer) -> TickSummary:
        """The message a hand-over received, started (claimed in the release) or claimed its own way."""
        summary = TickSummary(counted=False)  # no read of the slots: limit and running not known
        if offer.message is None:
            summary.stopped = "empty"
            return summary
        summary.received = 1
        _, stop = self._process_batch([offer.message], summary, handed=offer.handed)
        summary.stopped = stop
        return summary

    def refill(
        self, *, freed: tuple[int, ...] | None, remaining_ms: Callable[[], int] | None = None
    ) -> TickSummary:
        """A completion's admission: the one slot its release freed (``freed``: that slot's shard),
        offered to the lanes by priority when the stack has lanes."""
        if self.settings.lanes:
            return self._refill_lanes(remaining_ms=remaining_ms, freed=freed)
        return self.admit(remaining_ms=remaining_ms, max_new=1, freed=freed)

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
        admitted by the caps in force at its write. With ``sync_limit`` (the scheduled tick) MAX is read before every receive too
        and the caps are brought to MAX − external (``Store.set_limit``), so a MAX changed in SSM by
        any means reaches the caps within one tick, also while the tick lingers. The read before a
        receive is ``Store.look``: one call whatever MAX is; ``freed`` (a completion's refill) reads
        only the shard the completion freed. ``max_new`` caps how
        many this call starts: a completion refills the one slot it freed. If every completion of a burst took all the free slots it
        saw, all but one would lose their claims and return their messages, and each return spends
        a receive of the message's ``maxReceiveCount``: healthy messages would walk to the DLQ.
        ``linger`` keeps long-polling while slots are free (``SLUICE_LINGER_SECONDS``); only the
        scheduled tick lingers.
        """
        summary = summary or TickSummary()
        self._check_state_machine()
        linger_until = self.clock.now() + (self.settings.linger_seconds if linger else 0)
        started = 0
        first = True
        known = ledger  # the room as last read, while nothing since has taken any of it
        while True:
            ledger = known or self.store.look(freed if first else None)
            known = None
            if sync_limit:
                reading = self.max_source.reading()
                summary.max_concurrency = reading.value
                limit = self.store.set_limit(ledger.source(reading))
                if limit != ledger.in_force:
                    ledger = self.store.look()
            running = ledger.running
            summary.limit, summary.running_after = ledger.in_force or 0, running
            summary.counted = ledger.counted
            if first:
                summary.running_before, first = running, False
            if sync_limit and summary.max_concurrency == 0:
                summary.stopped = "paused"
                break
            free = ledger.free
            if self.lane is not None:
                # A lane's launcher: no more than its lane has room for (read with the other lanes'
                # for the first receive, then again before each one).
                if lane_free is None:
                    lane_free = self.store.lane_rooms([self.lane.name])[self.lane.name].free
                free, lane_free = min(free, lane_free), None
            if max_new is not None:
                free = min(free, max_new - started)
            if free <= 0:
                summary.stopped = "full"
                break
            if not self._time_left(remaining_ms):
                summary.stopped = "time"
                break
            lingering = self.clock.now() < linger_until
            wait = (
                self._wait_seconds(lingering, remaining_ms, linger_until)
                if wait_seconds is None
                else wait_seconds
            )
            messages = self._receive(free, wait)
            if not messages:
                if lingering and self._time_left(remaining_ms):
                    continue  # completions may have freed slots and MAX may have moved meanwhile
                summary.stopped = "empty"
                break
            summary.received += len(messages)
            filled, stop = self._process_batch(messages, summary)
            started += filled
            summary.running_after = running + filled
            if stop:
                summary.stopped = stop
                break
            if max_new is not None and started >= max_new:
                summary.stopped = "full"  # the one slot a completion freed is filled
                break
            if filled >= free and ledger.complete:
                summary.stopped = "full"  # as far as this call knows: no read needed to stop
                break  # (after a sample of the shards, the next read samples others)
            if filled == 0 and max_new is not None:
                # A refill whose messages took no slot (parked, duplicates, dead-lettered): the
                # slot it freed is as free as it was read, so the next receive needs no new read. A
                # launcher that took it meanwhile makes the claim fail (SlotsFull): that message
                # returns, as it would have after a read a moment before its claim.
                known = ledger
            elif max_new is None and self.lane is None and ledger.free - filled >= self._look_margin:
                # A fill with room to spare as read: the next receive is sized by that room less
                # what this round took, without a read (claims obey the caps as ever; a room taken
                # meanwhile by another launcher, or a MAX lowered, returns a round's messages at
                # most, as after a read a moment before).
                known = replace(ledger, room=ledger.free - filled, complete=False, estimated=running + filled)
        return summary

    @property
    def _look_margin(self) -> int:
        """Known free room a fill needs to skip the read before its next receive: a round's worth
        more than the next round takes."""
        return self.fan.workers + RECEIVE_BATCH

    # -- one batch ----------------------------------------------------------------------------

    def _receive(self, free: int, wait_seconds: int) -> list[Message]:
        """Up to ``free`` messages, and no more than the starts this launcher keeps in flight at
        once: one receive (long-polling when lingering); when it comes back full and there is room
        for more, further receives side by side, without waiting."""
        messages = self.queue.receive(min(free, RECEIVE_BATCH), wait_seconds)
        more = min(free, self.fan.workers) - len(messages)
        if len(messages) < RECEIVE_BATCH or more <= 0:
            return messages
        sizes = [min(RECEIVE_BATCH, more - i) for i in range(0, more, RECEIVE_BATCH)]
        for extra in self.fan.each([lambda n=n: self.queue.receive(n, 0) for n in sizes]):
            if extra.error is not None:
                # The messages in hand are started; a receive that failed is tried at the next round.
                self.log.warning("an extra receive failed", extra={"error": str(extra.error)})
                continue
            messages.extend(extra.value or ())
        return messages

    def _process_batch(
        self, messages: list[Message], summary: TickSummary, handed: Mapping[str, str] | None = None
    ) -> tuple[int, str]:
        """Process the messages received. Returns (slots filled, why to stop or "").

        Message groups run side by side (``fan``); the messages of one group run one after another,
        in the group's order, as SQS FIFO hands them out. The messages handled are then deleted in
        one call per 10, also when an error ends a group early. A crash (``BaseException``: timeout,
        kill) does not delete, like the real thing. No RUNNING mark is written: a claim holds its
        lease until its release, started or not, and a redelivered message resumes it (asking
        DescribeExecution first: ``per_message``). ``handed``: message id → the name a completion's hand-over
        claimed it under (``sluice.handover``): started without a claim of its own.
        """
        by_group: dict[str, list[Message]] = {}
        for message in messages:  # groups in the order of their first message, each in its order
            by_group.setdefault(self._batch_group(message), []).append(message)
        groups = list(by_group.values())
        runs = [_Run() for _ in groups]
        halt = _Halt()
        ahead = read_ahead(self.store, messages)
        handed = handed or {}
        results = self.fan.each(
            [
                lambda g=g, r=r: self._run_group(g, r, halt, ahead, handed)
                for g, r in zip(groups, runs, strict=True)
            ]
        )
        done = [m for r in runs for m in r.done]
        if done:
            self.queue.delete(done)
        filled, stops = 0, set()
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

    def _run_group(
        self, messages: list[Message], run: _Run, halt: _Halt, ahead: ReadAhead, handed: Mapping[str, str]
    ) -> None:
        """One group's messages in order. Once any group of the batch finds the slots full or AWS
        failing, the others hand back what they have not begun instead of trying."""
        for i, message in enumerate(messages):
            rest = messages[i:]
            if halt.reason:
                self.queue.release(rest)
                run.add(Outcome.RETURNED if halt.reason == "full" else Outcome.INTERRUPTED, len(rest))
                run.stop = halt.reason
                return
            try:
                outcome = self._process(message, run.done, ahead, handed.get(message.message_id), halt.claims)
            except SlotsFull:
                # Another launcher took the slot since our ledger read, or the caps came down.
                self.queue.release(rest)
                run.add(Outcome.RETURNED, len(rest))
                run.stop = halt.reason = "full"
                return
            except TransientError as exc:
                self.queue.release(rest)
                run.add(Outcome.INTERRUPTED, len(rest))
                run.stop = halt.reason = "transient"
                self.log.warning(
                    "tick interrupted by a transient AWS error; the rest of the batch returns to the queue",
                    extra={"operation": exc.operation, "code": exc.code, "error": str(exc)},
                )
                return
            except ConfigurationError:
                self.queue.release(rest)
                halt.reason = "error"
                raise
            run.add(outcome)
            if outcome is Outcome.RECHECK:  # back for the window; its group waits behind it, sighted
                self._sight_behind(message, rest[1:])
                self.queue.release(rest[1:])
                run.add(Outcome.RETURNED, len(rest) - 1)
                return
            if outcome is Outcome.STARTED:
                run.filled += 1

    def _batch_group(self, message: Message) -> str:
        """Which messages of a batch run one after another: those of one FIFO group; in a fair lane,
        those of one tenant (each parks on its tenant's next ticket: side by side they would race
        for it, sluice.fair)."""
        if self.lane is not None and self.lane.fair:
            try:
                return "tenant:" + fair_tenant(message, self.lane)
            except InvalidPayload:
                pass  # dead-lettered when its turn comes
        return _group(message)

    # -- helpers ------------------------------------------------------------------------------

    def _check_state_machine(self) -> None:
        now = self.clock.now()
        if "at" not in self._checked or now - self._checked["at"] >= CHECK_INTERVAL:
            self.executions.check()
            self._checked["at"] = now

    def _time_left(self, remaining_ms: Callable[[], int] | None) -> bool:
        return remaining_ms is None or remaining_ms() > self.settings.time_reserve_seconds * 1000

    def _wait_seconds(
        self, lingering: bool, remaining_ms: Callable[[], int] | None, linger_until: float
    ) -> int:
        if not lingering:
            return self.settings.receive_wait_seconds
        budget = linger_until - self.clock.now()
        if remaining_ms is not None:
            budget = min(budget, remaining_ms() / 1000 - self.settings.time_reserve_seconds)
        return max(self.settings.receive_wait_seconds, min(LONG_POLL, int(budget)))


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

"""The launcher: admit queued payloads into free slots and start one execution per payload.

    tick ──► reconcile ──► admit ──► look ──► receive ≤ free ──► groups side by side ──► delete
                             ▲          (one read;                  (one message each:     (per batch)
                             │           skipped while              sluice.launch.per_message)
                             │           room remains)
                             └── again while slots are free, messages come and time is left

    status event ──► on_status_change ──► release, handing the freed slot to the next payload in
                                          its own transaction (sluice.launch.handover) ──► start, delete

The launcher is assembled from collaborators sharing one frozen ``LaunchContext`` (the adapters,
settings, clock and logger: ``sluice.launch.context``): its ``admission`` (``sluice.launch.admission``:
how many messages to take and when to stop, the receives, the message groups run side by side
(``startConcurrency``, ``sluice.primitives.fanout``) and the one delete per batch), the ``lanes``' admission,
one per lane (``sluice.launch.lane_admission``), and, inside each admission, the per-message steps and
their branches (``sluice.launch.per_message``, ``sluice.launch.message_branches``: what happens to each message,
and why each step is safe to die after). This module is the entry points: the tick, and a
completion's release and refill.

Admission is exact across concurrent launchers because the slot is taken by a conditional write
on one shard of the slots (``size(holders) < cap``), in the same transaction as the payload's
lease, and the caps add up to the limit in force. The claim passes no limit: the caps are the
limit. Only the scheduled tick (from MAX and reconciliation's external count) and the operator's
``sluice set-max``/``pause``/``resume`` move them; a completion's refill reads no MAX at all.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping

from sluice.core.errors import Contended, SluiceError, TransientError
from sluice.core.events import StatusChange
from sluice.core.gates import OPEN, Gate
from sluice.core.limits import Ledger
from sluice.core.model import ExecutionRecord, Outcome
from sluice.core.ports import Clock, Executions, Fanout, MaxSource, Queue, state_machine_arns
from sluice.core.records import Lane
from sluice.core.summary import TickSummary
from sluice.features.effects import Effects
from sluice.features.pointers import PayloadObjects
from sluice.features.receipts import Outputs
from sluice.features.stores import LaunchStore
from sluice.features.wake import WakeTurns, woken
from sluice.launch.admission import LONG_POLL, RECEIVE_BATCH, Admission
from sluice.launch.completion import settle_status_change
from sluice.launch.context import LaunchContext, StateMachineCheck
from sluice.launch.handover import HandOverOffer
from sluice.launch.lane_admission import LaneAdmission
from sluice.launch.reconcile import reconcile
from sluice.launch.settings import Settings
from sluice.primitives.fanout import Pacer, fanout

__all__ = ["CHECK_INTERVAL", "LONG_POLL", "RECEIVE_BATCH", "Launcher"]

WAKE_DEADLINE_SECONDS = 900.0  # a woken turn's end when no invocation deadline is given (Lambda's longest)
CHECK_INTERVAL = (
    StateMachineCheck.INTERVAL
)  # how often a warm launcher re-checks that the state machine exists

log = logging.getLogger("sluice.launcher")


class Launcher:
    """Admit queued payloads into free slots: the tick, and a completion's release and refill. What
    it works with is one frozen ``LaunchContext`` (``ctx``), shared by its collaborators: its
    ``admission`` (of ``queue``) and the ``lanes``' admissions."""

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
        gate: Gate = OPEN,
    ) -> None:
        sleep = sleep if sleep is not None else getattr(clock, "sleep", time.sleep)
        self._context(
            LaunchContext(
                queue=queue,
                executions=executions,
                store=store,
                max_source=max_source,
                clock=clock,
                settings=settings,
                log=logger or log,
                fan=fan or fanout(settings.start_concurrency),
                sleep=sleep,
                pacer=Pacer(settings.start_rate, settings.start_burst, clock=clock, sleep=sleep),
                payloads=payloads,  # the bucket of stored payloads that pointers name (sluice.features.pointers)
                outputs=Outputs(payloads, settings.receipt_inline_bytes),  # receipts' outputs
                # what outputs send (sluice.features.effects), to any of the stack's lanes
                effects=Effects(
                    payloads, settings.pointer_threshold, lanes=tuple(n.name for n in settings.lanes)
                ),
                rng=rng or random.Random(),
                # Lanes (sluice.features.lanes): each lane's queue (the default lane's is ``queue``).
                lane_queues=lane_queues or {},
                gate=gate,  # a limit beside MAX (sluice.core.gates)
            ),
            StateMachineCheck(),
        )
        self.container = uuid.uuid4().hex[:16]  # this container, in its invocations' ids
        # its clock's machine: who marks unstarted claims and stamps adoptions (sluice.core.clock)
        self.identity = clock.identity

    def _context(self, ctx: LaunchContext, checked: StateMachineCheck) -> None:
        """Hold ``ctx`` and the collaborators built on it. When the state machine was last checked:
        one holder shared with the lanes' admissions, so a completion checks it once per interval,
        not once per lane."""
        self.ctx = ctx
        self._checked = checked
        self.admission = Admission(ctx, checked)
        self.lanes = LaneAdmission(ctx, checked)

    # -- what the launcher works with (its context) ---------------------------------------------

    @property
    def queue(self) -> Queue:
        return self.ctx.queue

    @property
    def lane_queues(self) -> Mapping[str, Queue]:
        return self.ctx.lane_queues

    @property
    def lane(self) -> Lane | None:
        return self.ctx.lane

    @property
    def executions(self) -> Executions:
        return self.ctx.executions

    @property
    def store(self) -> LaunchStore:
        return self.ctx.store

    @property
    def max_source(self) -> MaxSource:
        return self.ctx.max_source

    @max_source.setter
    def max_source(self, source: MaxSource) -> None:
        self._context(dataclasses.replace(self.ctx, max_source=source), self._checked)

    @property
    def clock(self) -> Clock:
        return self.ctx.clock

    @property
    def settings(self) -> Settings:
        return self.ctx.settings

    @property
    def log(self) -> logging.Logger | logging.LoggerAdapter:
        return self.ctx.log

    @property
    def fan(self) -> Fanout:
        return self.ctx.fan

    @property
    def sleep(self) -> Callable[[float], None]:
        return self.ctx.sleep

    @property
    def pacer(self) -> Pacer:
        return self.ctx.pacer

    @property
    def rng(self) -> random.Random:
        return self.ctx.rng

    @property
    def payloads(self) -> PayloadObjects | None:
        return self.ctx.payloads

    @property
    def outputs(self) -> Outputs:
        return self.ctx.outputs

    @property
    def effects(self) -> Effects:
        return self.ctx.effects

    # -- entry points -------------------------------------------------------------------------

    def tick(
        self,
        *,
        reconcile_first: bool = True,
        remaining_ms: Callable[[], int] | None = None,
        linger: bool = True,
    ) -> TickSummary:
        """One scheduled run: reconcile the ledger with Step Functions, then fill free slots, lingering
        while they stay free (``lingerSeconds``). A producer's wake (``wake``) fills with
        ``tick(reconcile_first=False, linger=False)``: what is free now, and it returns."""
        summary = TickSummary()
        self.admission.check_state_machine()
        if reconcile_first:
            try:
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
            except Contended as exc:  # its count is not in the caps: this tick starts nothing
                self.log.warning("tick ends: the slot pool kept changing", extra={"error": str(exc)})
                summary.saw(self.store.look(), first=True)
                summary.stopped = "contended"
                return summary
            summary.reconciled = True
            summary.released_by_reconcile = report.released
            summary.drift = report.drift
        if self.settings.lanes:
            return self.lanes.admit_lanes(summary, remaining_ms=remaining_ms, linger=linger)
        return self.admit(summary=summary, remaining_ms=remaining_ms, linger=linger, sync_limit=True)

    def wake(
        self,
        turns: WakeTurns,
        *,
        remaining_ms: Callable[[], int] | None = None,
        invocation: str | None = None,
    ) -> TickSummary:
        """A producer's wake (``sluice.features.wake``): fill the free slots now, without reconciling
        or lingering, one woken launcher at a time (``turns``), once more for each wake meanwhile.
        ``invocation``: Lambda's request id, which its retries of the invocation keep."""
        left = remaining_ms() / 1000 if remaining_ms is not None else WAKE_DEADLINE_SECONDS
        return woken(
            turns,
            invocation or f"{self.container}:{uuid.uuid4().hex[:8]}",
            now=self.clock.now,
            ends_at=self.clock.now() + left - self.settings.time_reserve_seconds,
            fill=lambda: self.tick(reconcile_first=False, linger=False, remaining_ms=remaining_ms),
        )

    def on_status_change(
        self, change: StatusChange, *, remaining_ms: Callable[[], int] | None = None
    ) -> tuple[bool, TickSummary | None, str]:
        """What the completion function does with one status event: release the execution's slot
        and fill the one slot it freed, handing it to the next payload in the release's own write
        (``sluice.launch.handover``; on a stack with lanes, a refill after the release offers it to the
        lanes by priority). Returns (released, the refill's summary, why it was skipped)."""
        offer = None
        if not self.settings.lanes and self._checked_for_hand_over():
            offer = HandOverOffer(
                queue=self.queue,
                executions=self.executions,
                now=self.clock.now,
                claim_timeout=self.settings.claim_timeout_seconds,
                time_left=lambda: self.admission.time_left(remaining_ms),
                gate=self.ctx.gate,
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
                window=self.settings.consistency_window_seconds,
                judge=self.identity,
            )
        except Exception:
            if offer is not None and offer.message is not None and not offer.claimed:
                self.queue.release([offer.message])  # received for a release that failed: back at once
            raise
        try:
            if released is None:
                # Nothing freed (a repeated event that lost to another): a message received for
                # it is claimed its own way, under the slots in force, rather than sent back.
                if offer is not None and offer.message is not None:
                    return False, self._admit_received(offer), ""
                return False, None, ""
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
            self.admission.check_state_machine()
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
        elif offer.held:
            # The gate had no room, read a moment ago: the next tick, or a later end, starts one.
            summary.stopped = self.ctx.gate.name
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
        _, stop = self.admission.process_batch([offer.message], summary, handed=offer.handed)
        summary.stopped = stop
        return summary

    def refill(
        self, *, freed: tuple[int, ...] | None, remaining_ms: Callable[[], int] | None = None
    ) -> TickSummary:
        """A completion's admission: the one slot its release freed (``freed``: that slot's shard),
        offered to the lanes by priority when the stack has lanes."""
        if self.settings.lanes:
            return self.lanes.refill_lanes(remaining_ms=remaining_ms, freed=freed)
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
        """Receive and start payloads from ``queue`` while slots are free, the queue has messages
        and time remains (``sluice.launch.admission.Admission.admit``)."""
        return self.admission.admit(
            summary=summary,
            remaining_ms=remaining_ms,
            max_new=max_new,
            linger=linger,
            sync_limit=sync_limit,
            freed=freed,
            lane_free=lane_free,
            ledger=ledger,
            wait_seconds=wait_seconds,
        )

    def sync_lanes(self) -> dict[str, int]:
        """Bring each lane's caps to its limit in force (``LaneAdmission.sync_lanes``)."""
        return self.lanes.sync_lanes()

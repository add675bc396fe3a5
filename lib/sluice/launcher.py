"""The launcher: admit queued payloads into free slots and start one execution per payload.

Per message the order is fixed; each step is safe to die after:

    receive ──► validate ──► claim(lease + slot) ──► StartExecution ──► mark RUNNING ──► delete
                                                                      (per batch)     (per batch)
                   │               │                       │                  │              │
              invalid: DLQ    LeaseHeld by us:         already exists:        │              │
              with reason     resume (same name)       describe, record       │              │
                              LeaseHeld by other:      refused for sure:      │              │
                              holder ended? settle,    roll the claim back    │              │
                              claim again; else        (a retried call is     │              │
                              duplicate / park         never "for sure")      │              │
                              SlotsFull: return msg    unsure: keep claim     │              │

    dies after claim    message returns with the same id, so the same name: the claim is
                        ours; renew it (fenced by its version), then start it. If it never
                        returns, reconciliation asks DescribeExecution, marks the claim, and
                        releases it a claim timeout later only if nobody renewed it since.
    dies after start    the retry's StartExecution returns the same ARN (same name, same
                        input, still running) or ExecutionAlreadyExists (ended): no second run.
    dies after mark     the lease names this very message: delete it, start nothing.
    dies after delete   nothing left to do.

A run-once message (``sluice-once: true``) whose key has SUCCEEDED already fails its claim with
``AlreadyDone`` (the check is in the claim's own condition): it is deleted and recorded, nothing
starts. Why the check cannot be a read before the claim: ``sluice.receipts``.

A message that awaits keys (``sluice-awaits``) is checked before its claim (``sluice.awaits.gate``):
all SUCCEEDED, it goes on to the claim; otherwise it is parked in the table and deleted, or, when an
awaited key ended badly, dead-lettered with the reason. A woken waiter is checked again on arrival.

Admission is exact across concurrent launchers because the slot is taken by a conditional write
on one shard of the slots (``size(holders) < cap``), in the same transaction as the payload's
lease, and the caps add up to the limit in force. The claim passes no limit: the caps are the
limit. Only the scheduled tick (from MAX and reconciliation's external count) and the operator's
``sluice set-max``/``pause``/``resume`` move them; a completion's refill reads no MAX at all.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import groupby

from sluice.awaits import gate
from sluice.completion import StatusChange, complete, output_from, settle_status_change
from sluice.effects import Effects
from sluice.errors import (
    AlreadyDone,
    AmbiguousStartError,
    ConfigurationError,
    InvalidPayload,
    LeaseHeld,
    SlotsFull,
    TransientError,
)
from sluice.fanout import Pacer, fanout
from sluice.model import Message, Outcome, Payload, PayloadState, StartedExecution, StartResult, TickSummary
from sluice.names import execution_name, origin_id
from sluice.parking import park
from sluice.pointers import PayloadObjects, check_pointer
from sluice.ports import Clock, Executions, Fanout, MaxSource, Queue, Store
from sluice.receipts import Outputs, is_once
from sluice.reconcile import reconcile
from sluice.settings import DuplicatePolicy, Settings
from sluice.validation import validate_message

RECEIVE_BATCH = 10  # SQS ReceiveMessage returns at most 10
LONG_POLL = 20  # SQS WaitTimeSeconds maximum
CHECK_INTERVAL = 300.0  # how often a warm launcher re-checks that the state machine exists
ATTEMPTS = 3  # claims per message when the lease changes hands under us
THROTTLED_STARTS = 5  # StartExecution calls per payload while Step Functions throttles (backing off)

log = logging.getLogger("sluice.launcher")


class Launcher:
    def __init__(
        self,
        *,
        queue: Queue,
        executions: Executions,
        store: Store,
        max_source: MaxSource,
        clock: Clock,
        settings: Settings,
        logger: logging.Logger | logging.LoggerAdapter | None = None,
        fan: Fanout | None = None,
        sleep: Callable[[float], None] | None = None,
        payloads: PayloadObjects | None = None,
    ) -> None:
        self.queue = queue
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
        self.effects = Effects(payloads, settings.pointer_threshold)  # what outputs send (sluice.effects)
        self.identity = uuid.uuid4().hex[:16]  # this container, as a reconciler marking claims
        self._checked_at: float | None = None

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
        return self.admit(summary=summary, remaining_ms=remaining_ms, linger=True, sync_limit=True)

    def on_status_change(
        self, change: StatusChange, *, remaining_ms: Callable[[], int] | None = None
    ) -> tuple[bool, TickSummary | None, str]:
        """What the completion function does with one status event: release the execution's slot,
        then fill the one slot it freed. Returns (released, the refill's summary, why it was skipped)."""
        released = settle_status_change(
            change,
            store=self.store,
            queue=self.queue,
            state_machine_arn=self.executions.state_machine_arn,
            now=self.clock.now(),
            executions=self.executions,
            outputs=self.outputs,
            effects=self.effects,
        )
        if released is None:
            return False, None, ""
        freed = None if released.shard is None else (released.shard,)
        try:
            return True, self.admit(remaining_ms=remaining_ms, max_new=1, freed=freed), ""
        except TransientError as exc:
            # The release is done; the next tick fills the slot. Retrying the event would not help.
            self.log.warning("refill skipped: AWS is throttling or unavailable", extra={"error": str(exc)})
            return True, None, str(exc)

    def admit(
        self,
        *,
        summary: TickSummary | None = None,
        remaining_ms: Callable[[], int] | None = None,
        max_new: int | None = None,
        linger: bool = False,
        sync_limit: bool = False,
        freed: tuple[int, ...] | None = None,
    ) -> TickSummary:
        """Receive and start payloads while slots are free, the queue has messages and time remains.

        The ledger is read again before every receive; each claim is admitted by the caps in force
        at its write. With ``sync_limit`` (the scheduled tick) MAX is read before every receive too
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
        while True:
            ledger = self.store.look(freed if first else None)
            if sync_limit:
                reading = self.max_source.reading()
                summary.max_concurrency = reading.value
                limit = self.store.set_limit(ledger.source(reading))
                if limit != ledger.in_force:
                    ledger = self.store.look()
            running = ledger.running
            summary.limit, summary.running_after = ledger.in_force or 0, running
            if first:
                summary.running_before, first = running, False
            if sync_limit and summary.max_concurrency == 0:
                summary.stopped = "paused"
                break
            free = ledger.free
            if max_new is not None:
                free = min(free, max_new - started)
            if free <= 0:
                summary.stopped = "full"
                break
            if not self._time_left(remaining_ms):
                summary.stopped = "time"
                break
            lingering = self.clock.now() < linger_until
            messages = self._receive(free, self._wait_seconds(lingering, remaining_ms, linger_until))
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
        return summary

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

    def _process_batch(self, messages: list[Message], summary: TickSummary) -> tuple[int, str]:
        """Process the messages received. Returns (slots filled, why to stop or "").

        Message groups run side by side (``fan``); the messages of one group run one after another,
        in the group's order, as SQS FIFO hands them out. The executions started are then marked
        RUNNING in one write, and the messages handled deleted in one call per 10, also when an
        error ends a group early. A crash (``BaseException``: timeout, kill) does neither, like the
        real thing.
        """
        groups = [list(g) for _, g in groupby(sorted(messages, key=_group_order(messages)), key=_group)]
        runs = [_Run() for _ in groups]
        halt = _Halt()
        results = self.fan.each(
            [lambda g=g, r=r: self._run_group(g, r, halt) for g, r in zip(groups, runs, strict=True)]
        )
        self._settle(
            [m for r in runs for m in r.done],
            [e for r in runs for e in r.started],
        )
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

    def _run_group(self, messages: list[Message], run: _Run, halt: _Halt) -> None:
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
                outcome = self._process(message, run.done, run.started)
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
            if outcome is Outcome.STARTED:
                run.filled += 1

    def _settle(self, done: list[Message], started: list[StartedExecution]) -> None:
        if started:
            self.store.mark_running_many(started, now=self.clock.now())
        if done:
            self.queue.delete(done)

    def _process(self, message: Message, done: list[Message], started: list[StartedExecution]) -> Outcome:
        try:
            payload = validate_message(message)
            check_pointer(payload, self.payloads)  # before any claim; S3 throttled: TransientError
            if gate(store=self.store, queue=self.queue, payload=payload, now=self.clock.now()):  # type: ignore[arg-type]
                done.append(message)  # parked until its awaits have SUCCEEDED (sluice.awaits)
                self._log("payload awaits keys not yet SUCCEEDED; parked", payload, None, Outcome.WAITING)
                return Outcome.WAITING
        except InvalidPayload as exc:
            return self._dead_letter(message, exc, done)
        name = execution_name(payload.key, origin_id(message.message_id, message.attributes))
        for _ in range(ATTEMPTS):
            outcome = self._attempt(payload, name, done, started)
            if outcome is not None:
                return outcome
        # The lease kept changing hands under us: try again later, as if the slot had been taken.
        raise SlotsFull(0)

    def _attempt(
        self, payload: Payload, name: str, done: list[Message], started: list[StartedExecution]
    ) -> Outcome | None:
        """One claim-and-start of ``payload``. None when the lease changed meanwhile: look again."""
        now = self.clock.now()
        claim_expires_at = now + self.settings.claim_timeout_seconds
        fresh = True
        try:
            self.store.claim(
                key=payload.key,
                name=name,
                message_id=origin_id(payload.message.message_id, payload.message.attributes),
                arn=self.executions.arn_for(name),
                now=now,
                claim_expires_at=claim_expires_at,
                once=is_once(payload.message),
            )
        except AlreadyDone as done_before:
            # A run-once message of a key that has SUCCEEDED: acknowledged, recorded, not started.
            self.store.record_already_done(
                key=payload.key, message_id=payload.message.message_id, now=self.clock.now()
            )
            done.append(payload.message)
            self._log(
                "run-once payload succeeded already; not started",
                payload,
                done_before.existing.succeeded_by,
                Outcome.ALREADY_DONE,
            )
            return Outcome.ALREADY_DONE
        except LeaseHeld as held:
            if held.existing.holder != name:
                return self._duplicate(payload, held, done)
            # Our own earlier claim: this message was received before and the launcher stopped
            # somewhere after claiming. Same message id, same name: carry on from where it stopped.
            if held.existing.state is PayloadState.RUNNING:
                self._log("redelivered message already running", payload, name, Outcome.RESUMED)
                done.append(payload.message)
                return Outcome.RESUMED
            # Re-take the claim first: reconciliation may be judging it abandoned right now, and
            # a renewal is what makes its release fail. Released or started meanwhile: look again.
            if not self.store.renew(name=name, now=now, claim_expires_at=claim_expires_at):
                return self._renewal_refused(payload, name, done, started)
            fresh = False

        try:
            result = self._start(name, payload.body)
        except AmbiguousStartError:
            # It may have started: keep the claim. The message returns with the same name, and
            # StartExecution then answers with the same ARN or ExecutionAlreadyExists.
            raise
        except InvalidPayload as exc:
            if fresh:
                self._rollback(name, exc.reason)
            return self._dead_letter(payload.message, exc, done)
        except (TransientError, ConfigurationError) as exc:
            # Refused for certain: nothing started, so the claim goes back (a resumed claim stays:
            # an earlier attempt may have started it).
            if fresh:
                self._rollback(name, f"StartExecution refused: {exc}")
            raise

        if result.already_existed:
            return self._already_exists(payload, name, done, started)
        started.append(StartedExecution(payload.key, name, result.arn, now))
        done.append(payload.message)
        outcome = Outcome.STARTED if fresh else Outcome.RESUMED
        self._log("execution started", payload, name, outcome, arn=result.arn)
        return outcome

    def _start(self, name: str, body: str) -> StartResult:
        """StartExecution at the pace of the token bucket. Throttled all the same (the bucket is the
        account's, shared with every completion): back off and call again with the same name,
        which cannot start it twice, instead of returning the message to the queue.

        Once one call was ambiguous (it may have started the execution), a later refusal does not
        say it did not: the error stays ambiguous, so the claim is kept."""
        unsure: AmbiguousStartError | None = None
        for attempt in range(THROTTLED_STARTS):
            self.pacer.take()
            try:
                result = self.executions.start(name, body)
            except AmbiguousStartError as exc:
                unsure = exc
                if not exc.throttled or attempt + 1 == THROTTLED_STARTS:
                    raise
            except Exception as exc:
                throttled = isinstance(exc, TransientError) and exc.throttled
                if unsure is not None and (not throttled or attempt + 1 == THROTTLED_STARTS):
                    raise AmbiguousStartError(
                        f"{exc}, after an attempt that may have started it ({unsure})",
                        operation="StartExecution",
                        code=getattr(exc, "code", ""),
                    ) from exc
                if not throttled or attempt + 1 == THROTTLED_STARTS:
                    raise
            else:
                self.pacer.passed()
                return result
            self.log.info("StartExecution throttled; backing off", extra={"execution_name": name})
            self.pacer.throttled()
        raise AssertionError("unreachable")

    # -- the branches -------------------------------------------------------------------------

    def _duplicate(self, payload: Payload, held: LeaseHeld, done: list[Message]) -> Outcome | None:
        holder = held.existing.holder or ""
        # The holder may have ended with its status event still on the way: ask Step Functions
        # before turning a re-submission away. Ended: settle it and claim again.
        try:
            info = self.executions.describe(holder)
        except ConfigurationError:
            info = None  # a holder on a state machine this role may not ask about: assume it runs
        if info is not None and info.ended:
            complete(
                store=self.store,
                queue=self.queue,
                name=holder,
                state=PayloadState.after(info.status),
                now=self.clock.now(),
                error=info.error,
                cause=info.cause,
                ended_at=info.stop_date,
                output=output_from(info.output, self.outputs),
                effects=self.effects,
            )
            return None
        if self.settings.duplicate_policy is DuplicatePolicy.DEFER:
            if not park(store=self.store, payload=payload, holder=holder, now=self.clock.now()):
                return None  # the holder was released meanwhile: the lease is free
            done.append(payload.message)
            self._log("payload already running; parked until it ends", payload, holder, Outcome.DEFERRED)
            return Outcome.DEFERRED
        self.store.record_duplicate(
            key=payload.key, message_id=payload.message.message_id, now=self.clock.now()
        )
        done.append(payload.message)
        self._log("payload already running; duplicate suppressed", payload, holder, Outcome.DUPLICATE)
        return Outcome.DUPLICATE

    def _renewal_refused(
        self, payload: Payload, name: str, done: list[Message], started: list[StartedExecution]
    ) -> Outcome | None:
        """Our claim could not be renewed. Released or started meanwhile: look again. Blocked
        (reconciliation saw a redriven run of its key, ``Store.block``) and never started: hand the
        key to that run, which is then adopted, and look again: this message is its duplicate."""
        record = self.store.execution(name)
        if record is None or record.state is not PayloadState.CLAIMED or not record.blocked_by:
            return None
        if self.executions.describe(name) is not None:
            # An earlier attempt did start it: it runs beside the redriven one; carry on.
            return self._already_exists(payload, name, done, started)
        self._rollback(name, f"yielded to {record.blocked_by}, a redriven run of the same key")
        redriven = self.executions.describe(record.blocked_by)
        if redriven is not None and not redriven.ended:
            self.store.adopt(name=record.blocked_by, now=self.clock.now())
        return None

    def _already_exists(
        self, payload: Payload, name: str, done: list[Message], started: list[StartedExecution]
    ) -> Outcome:
        """StartExecution says this name exists with other input or has ended: this message ran."""
        info = self.executions.describe(name)
        if info is None:
            # Contradicts StartExecution; Step Functions has not caught up. Keep the claim and retry.
            raise AmbiguousStartError(
                f"execution {name} exists but cannot be described yet", operation="DescribeExecution"
            )
        if not info.ended:
            started.append(StartedExecution(payload.key, name, info.arn, info.start_date or self.clock.now()))
            done.append(payload.message)
            self._log("redelivered message already running", payload, name, Outcome.RESUMED)
            return Outcome.RESUMED
        complete(
            store=self.store,
            queue=self.queue,
            name=name,
            state=PayloadState.after(info.status),
            now=self.clock.now(),
            error=info.error,
            cause=info.cause,
            ended_at=info.stop_date,
            output=output_from(info.output, self.outputs),
            effects=self.effects,
        )
        done.append(payload.message)
        self._log("redelivered message already ran", payload, name, Outcome.ALREADY_RAN)
        return Outcome.ALREADY_RAN

    def _dead_letter(self, message: Message, exc: InvalidPayload, done: list[Message]) -> Outcome:
        self.queue.send_to_dlq(message, exc.reason)
        if exc.key:
            self.store.record_invalid(key=exc.key, reason=exc.reason, now=self.clock.now())
        done.append(message)
        self.log.warning(
            "invalid payload dead-lettered",
            extra={
                "message_id": message.message_id,
                "reason": exc.reason,
                "outcome": Outcome.INVALID.value,
                "correlation_id": exc.key or message.message_id,
            },
        )
        return Outcome.INVALID

    def _rollback(self, name: str, reason: str) -> None:
        complete(
            store=self.store,
            queue=self.queue,
            name=name,
            state=PayloadState.RELEASED,
            now=self.clock.now(),
            error=reason,
        )

    # -- helpers ------------------------------------------------------------------------------

    def _check_state_machine(self) -> None:
        now = self.clock.now()
        if self._checked_at is None or now - self._checked_at >= CHECK_INTERVAL:
            self.executions.check()
            self._checked_at = now

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

    def _log(self, text: str, payload: Payload, name: str | None, outcome: Outcome, **more: object) -> None:
        self.log.info(
            text,
            extra={
                "correlation_id": payload.key,
                "payload_key": payload.key,
                "message_id": payload.message.message_id,
                "execution_name": name,
                "outcome": outcome.value,
                **more,
            },
        )


@dataclass
class _Run:
    """What one message group's run did, merged into the tick's summary by the caller's thread."""

    done: list[Message] = field(default_factory=list)
    started: list[StartedExecution] = field(default_factory=list)
    outcomes: dict[Outcome, int] = field(default_factory=dict)
    filled: int = 0
    stop: str = ""

    def add(self, outcome: Outcome, n: int = 1) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + n


@dataclass
class _Halt:
    """Why the groups of a batch should stop beginning messages: "full", "transient", "error"."""

    reason: str = ""


def _group(message: Message) -> str:
    return message.group_id


def _group_order(messages: list[Message]) -> Callable[[Message], tuple[int, str]]:
    """Groups in the order their first message came, messages in their order within a group."""
    first: dict[str, int] = {}
    for i, m in enumerate(messages):
        first.setdefault(m.group_id, i)
    return lambda m: (first[m.group_id], m.group_id)

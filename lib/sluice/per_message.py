"""One message, from its receipt to its start: the per-message protocol of the launcher.

Per message the order is fixed; each step is safe to die after:

    receive ──► validate ──► claim(lease + slot) ──► StartExecution ──► delete (per batch)
                   │               │                       │
              invalid: DLQ    LeaseHeld by us:         already exists: describe, record
              with reason     resume (same name)       refused for sure: roll the claim back
                              LeaseHeld by other:        (a retried call is never "for sure")
                              holder ended? settle,    unsure: keep the claim
                              claim again; else
                              duplicate / park
                              SlotsFull: return msg

    dies after claim    message returns with the same id, so the same name: the claim is
                        ours; renew it (fenced by its version), then start it. If it never
                        returns, reconciliation asks DescribeExecution, marks the claim, and
                        releases it a claim timeout later only if nobody renewed it since.
    dies after start    no RUNNING mark is written after a start, so the retry asks
                        DescribeExecution by the ARN the claim recorded: running, the message
                        is deleted (resumed); ended, settled (already ran); never started, the
                        claim is renewed and started. No second run. A lease reconciliation
                        marked RUNNING is deleted, nothing started.
    dies after delete   nothing left to do.

A completion's hand-over (``sluice.handover``) claims in its release; its message joins here at
StartExecution (``handed``).

A run-once message (``sluice-once: true``) whose key has SUCCEEDED already fails its claim with
``AlreadyDone`` (the check is in the claim's own condition): it is deleted and recorded, nothing
starts. Why the check cannot be a read before the claim: ``sluice.receipts``.

A message that awaits keys (``sluice-awaits``) is checked before its claim (``sluice.awaits.gate``):
all SUCCEEDED, it goes on to the claim; otherwise it is parked in the table and deleted, or, when an
awaited key ended badly, dead-lettered with the reason. A woken waiter is checked again on arrival.

In a fair lane (``sluice.fair``) a new message claims only while no key has waiters (nobody to be
fair to); otherwise, or when the lane is full, it parks in its tenant's line and is deleted, and
only a waiter its lane's waker sent back claims; one that finds no room parks again.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from sluice import fair, keys
from sluice.awaits import ReadAhead, gate
from sluice.completion import complete, output_from
from sluice.effects import Effects
from sluice.errors import (
    AlreadyDone,
    AlreadyRan,
    AmbiguousStartError,
    ConfigurationError,
    InvalidPayload,
    KeyFull,
    LeaseHeld,
    SlotsFull,
    TransientError,
)
from sluice.fanout import Pacer
from sluice.keys import concurrency_key, ticket_of
from sluice.lanes import Lane
from sluice.model import ClaimFence, ExecutionInfo, Message, Outcome, Payload, PayloadState, StartResult
from sluice.names import execution_name, origin_id
from sluice.parking import park
from sluice.pointers import PayloadObjects, check_pointer
from sluice.ports import Clock, Executions, Queue, Store
from sluice.receipts import Outputs, is_once
from sluice.settings import DuplicatePolicy, Settings
from sluice.validation import validate_message

ATTEMPTS = 3  # claims per message when the lease changes hands under us
THROTTLED_STARTS = 5  # StartExecution calls per payload while Step Functions throttles (backing off)


class MessageProtocol:
    """Validate, check, claim and start one message; the launcher's per-message steps. Mixed into
    ``sluice.launcher.Launcher``, which owns the adapters below."""

    queue: Queue
    executions: Executions
    store: Store
    clock: Clock
    settings: Settings
    log: logging.Logger | logging.LoggerAdapter
    pacer: Pacer
    payloads: PayloadObjects | None
    # A fair lane's pass that saw several tenants in a batch, or lined one message up: its new
    # messages line up, so the waker sees every tenant before it shares the room out (sluice.fair).
    line_all: bool = False
    outputs: Outputs
    effects: Effects
    lane: Lane | None

    def _process(
        self,
        message: Message,
        done: list[Message],
        ahead: ReadAhead | None = None,
        handed: str | None = None,
    ) -> Outcome:
        """``handed``: the name this message was claimed under already, by the hand-over of a
        completion's release (``sluice.handover``): it is started, nothing more."""
        if handed is not None:
            return self._launch(validate_message(message), handed, done, fresh=True)
        outcome = self._one(message, done, ahead)
        if outcome not in (Outcome.STARTED, Outcome.KEY_WAITING, Outcome.INVALID):
            # A waiter woken from its key's line that did not claim (a duplicate, already run, ...):
            # the slot kept for it is given back now rather than after INFLIGHT_SECONDS.
            ckey, ticket = self._ckey(message), ticket_of(message)
            if ckey is not None and ticket is not None:
                keys.forgo(store=self.store, ckey=ckey, ticket=ticket)  # type: ignore[arg-type]
        return outcome

    def _one(
        self,
        message: Message,
        done: list[Message],
        ahead: ReadAhead | None = None,
    ) -> Outcome:
        try:
            payload = validate_message(message)
            check_pointer(payload, self.payloads)  # before any claim; S3 throttled: TransientError
            if self._ckey(message) is not None:  # a bad key is dead-lettered, not claimed
                keys.check_fits_line(message, key=payload.key)
            ticket_of(message)
            if gate(store=self.store, queue=self.queue, payload=payload, now=self.clock.now(), ahead=ahead):  # type: ignore[arg-type]
                done.append(message)  # parked until its awaits have SUCCEEDED (sluice.awaits)
                self._log("payload awaits keys not yet SUCCEEDED; parked", payload, None, Outcome.WAITING)
                return Outcome.WAITING
        except InvalidPayload as exc:
            return self._dead_letter(message, exc, done)
        if self.line_all and self._fair_newcomer(message):
            return self._line_up(payload, done, None)  # other tenants in its batch: all line up
        name = execution_name(payload.key, origin_id(message.message_id, message.attributes))
        for _ in range(ATTEMPTS):
            outcome = self._attempt(payload, name, done)
            if outcome is not None:
                return outcome
        # The lease kept changing hands under us: try again later, as if the slot had been taken.
        raise SlotsFull(0)

    def _attempt(self, payload: Payload, name: str, done: list[Message]) -> Outcome | None:
        """One claim-and-start of ``payload``. None when the lease changed meanwhile: look again."""
        now = self.clock.now()
        claim_expires_at = now + self.settings.claim_timeout_seconds
        fresh = True
        ckey = self._ckey(payload.message)
        try:
            self.store.claim(
                key=payload.key,
                name=name,
                message_id=origin_id(payload.message.message_id, payload.message.attributes),
                arn=self.executions.arn_for(name),
                now=now,
                claim_expires_at=claim_expires_at,
                once=is_once(payload.message),
                **({"ckey": ckey, "ticket": ticket_of(payload.message)} if ckey is not None else {}),
                **({"lane": self.lane.name} if self.lane is not None else {}),
                # A fair lane's new message claims only while nobody waits; else it lines up.
                **({"fair_newcomer": True} if self._fair_newcomer(payload.message) else {}),
                **({"uncapped": True} if self.lane is not None and self.lane.fair else {}),
            )
        except KeyFull as full:
            # Its concurrency key is at its cap: it waits in the key's line, out of the queue.
            return self._line_up(payload, done, full.state)
        except SlotsFull:
            if self.lane is None or not self.lane.fair:
                raise
            # A fair lane's message with no room (a newcomer to a full lane; a woken waiter that
            # found its room taken by another waker's, or a lowered MAX): in line rather than back
            # to the queue, where it would spend receives.
            return self._line_up(payload, done, None)
        except AlreadyRan as ran:
            # Its message back after its run ended and was released: it ran. Not started again,
            # on this state machine or on one the stack switched to since.
            done.append(payload.message)
            self._log("redelivered message already ran", payload, ran.existing.name, Outcome.ALREADY_RAN)
            return Outcome.ALREADY_RAN
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
            # No mark is written after a start, so the launcher that claimed it may have started
            # it before it died: ask Step Functions by the ARN the claim recorded. A start on the
            # state machine in use now would run it twice if the stack was switched since.
            try:
                started = self._started_before(name)
            except ConfigurationError as exc:
                # Claimed on a state machine this role may not ask about (the stack was switched
                # without previousStateMachineArn): it may run there, so it is not started here.
                reason = f"its claim {name} is on a state machine Sluice may not describe ({exc}); set previousStateMachineArn"
                return self._dead_letter(payload.message, InvalidPayload(reason, key=payload.key), done)
            if started is not None:
                return self._already_exists(payload, name, done, started)
            # Re-take the claim first: reconciliation may be judging it abandoned right now, and
            # a renewal is what makes its release fail. Released or started meanwhile: look again.
            # It starts on the state machine in use now, and its record says so from here on.
            arn = self.executions.arn_for(name)
            if not self.store.renew(name=name, now=now, claim_expires_at=claim_expires_at, arn=arn):
                return self._renewal_refused(payload, name, done)
            fresh = False
        return self._launch(payload, name, done, fresh=fresh)

    def _launch(
        self,
        payload: Payload,
        name: str,
        done: list[Message],
        *,
        fresh: bool,
    ) -> Outcome:
        """Start ``payload`` under ``name``, whose claim is held (``fresh``: taken just now, so given
        back if StartExecution refuses it for sure; else a resumed claim, kept)."""
        ckey = self._ckey(payload.message)
        try:
            result = self._start(name, payload.body)
        except AmbiguousStartError:
            # It may have started: keep the claim. The message returns with the same name, and
            # StartExecution then answers with the same ARN or ExecutionAlreadyExists.
            raise
        except InvalidPayload as exc:
            if fresh:
                self._rollback(name, exc.reason, version=0)
            return self._dead_letter(payload.message, exc, done)
        except (TransientError, ConfigurationError) as exc:
            # Refused for certain: nothing started, so the claim goes back (a resumed claim stays:
            # an earlier attempt may have started it).
            if fresh:
                ticket = ticket_of(payload.message)
                if ckey is not None and ticket is not None:
                    # A woken waiter going back to the queue keeps its slot in the key: else the
                    # release below wakes the next waiter into it, and this one loses its place.
                    self.store.keep_inflight(ckey, [ticket])  # type: ignore[attr-defined]
                self._rollback(name, f"StartExecution refused: {exc}", version=0)
            raise

        if result.already_existed:
            return self._already_exists(payload, name, done)
        done.append(payload.message)
        outcome = Outcome.STARTED if fresh else Outcome.RESUMED
        self._log("execution started", payload, name, outcome, arn=result.arn)
        return outcome

    def _fair_newcomer(self, message: Message) -> bool:
        return self.lane is not None and self.lane.fair and ticket_of(message) is None

    def _ckey(self, message: Message) -> str | None:
        """The key whose line the message waits in: its concurrency key; in a fair lane, its tenant."""
        if self.lane is not None and self.lane.fair:
            return fair.tenant(message, self.lane)
        return concurrency_key(message)

    def _line_up(self, payload: Payload, done: list[Message], seen: keys.KeyState | None) -> Outcome:
        """Park ``payload`` in its key's line (``sluice.keys``); its message is then deleted."""
        ckey = self._ckey(payload.message)
        assert ckey is not None
        fair_lane = self.lane.name if self.lane is not None and self.lane.fair else None
        if fair_lane is not None and concurrency_key(payload.message) is None:
            # An unkeyed message of a fair lane waits as its tenant, lane:<name>, and carries it as
            # its key from now on: woken, in whatever lane, its claim is of that key's line.
            message = payload.message
            attributes = {**message.attributes, keys.CONCURRENCY_KEY_ATTRIBUTE: ckey}
            payload = replace(payload, message=replace(message, attributes=attributes))
        ticket = keys.wait(
            store=self.store,  # type: ignore[arg-type]
            queue=self.queue,
            payload=payload,
            ckey=ckey,
            now=self.clock.now(),
            seen=seen,
            fair=fair_lane,
        )
        done.append(payload.message)
        if fair_lane:
            self.line_all = True  # someone waits now: the rest of this pass lines up too
        self._log(
            "in its tenant's line (fair lane)"
            if fair_lane
            else "concurrency key at its cap; parked in its line",
            payload,
            None,
            Outcome.KEY_WAITING,
            ticket=ticket,
        )
        return Outcome.KEY_WAITING

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
            except Exception as exc:
                if isinstance(exc, AmbiguousStartError):
                    unsure = exc
                last = attempt + 1 == THROTTLED_STARTS
                if isinstance(exc, TransientError) and exc.throttled and not last:
                    self.log.info("StartExecution throttled; backing off", extra={"execution_name": name})
                    self.pacer.throttled()
                    continue
                if unsure is not None and exc is not unsure:
                    raise AmbiguousStartError(
                        f"{exc}, after an attempt that may have started it ({unsure})",
                        operation="StartExecution",
                        code=getattr(exc, "code", ""),
                    ) from exc
                raise
            self.pacer.passed()
            return result
        raise AssertionError("unreachable")

    # -- the branches -------------------------------------------------------------------------

    def _duplicate(self, payload: Payload, held: LeaseHeld, done: list[Message]) -> Outcome | None:
        if held.existing.holder is None and held.existing.redriven is not None:
            self._take_redriven(payload.key, held.existing.redriven)
            return None
        holder = held.existing.holder or ""
        # The holder may have ended with its status event still on the way: ask Step Functions
        # before turning a re-submission away, on the machine the holder was claimed on (another
        # lane's, or the one before a switch: names are unique per machine only). Ended: settle
        # it and claim again.
        record = self.store.execution(holder)
        try:
            info = self.executions.describe(holder, record.arn if record is not None else None)
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
                started_at=info.start_date,
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

    def _take_redriven(self, key: str, redriven: str) -> None:
        """The lease is free but a run of the key was redriven behind Sluice's back while another
        held it (``Store.mark_redriven``): adopt it if it still runs, else lift the mark. The caller
        looks again and finds the adopted run, or a free lease."""
        record = self.store.execution(redriven)
        try:
            info = self.executions.describe(redriven, record.arn) if record is not None else None
            runs = info is not None and not info.ended
        except ConfigurationError:
            runs = True  # a state machine this role may not ask about: assume it runs
        if not runs or not self.store.adopt(name=redriven, now=self.clock.now()):
            self.store.clear_redriven(key=key, name=redriven)

    def _renewal_refused(self, payload: Payload, name: str, done: list[Message]) -> Outcome | None:
        """Our claim could not be renewed. Released or started meanwhile: look again. Blocked
        (reconciliation saw a redriven run of its key, ``Store.block``) and never started: hand the
        key to that run, which is then adopted, and look again: this message is its duplicate."""
        record = self.store.execution(name)
        if record is None or record.state is not PayloadState.CLAIMED or not record.blocked_by:
            return None
        info = self.executions.describe(name, record.arn)
        if info is not None:
            # An earlier attempt did start it: it runs beside the redriven one; carry on.
            return self._already_exists(payload, name, done, info)
        self._rollback(
            name,
            f"yielded to {record.blocked_by}, a redriven run of the same key",
            version=record.claim_version,
        )
        redriven = self.executions.describe(record.blocked_by)
        if redriven is not None and not redriven.ended:
            self.store.adopt(name=record.blocked_by, now=self.clock.now())
        return None

    def _started_before(self, name: str) -> ExecutionInfo | None:
        """Our own claim, back: what Step Functions says of it, asked by the ARN it was claimed for
        (None: never started)."""
        record = self.store.execution(name)
        return self.executions.describe(name, record.arn if record is not None else None)

    def _already_exists(
        self, payload: Payload, name: str, done: list[Message], info: ExecutionInfo | None = None
    ) -> Outcome:
        """StartExecution says this name exists with other input or has ended, or a resumed claim
        was found started (``info``): this message ran, or runs."""
        info = info or self.executions.describe(name)
        if info is None:
            # Contradicts StartExecution; Step Functions has not caught up. Keep the claim and retry.
            raise AmbiguousStartError(
                f"execution {name} exists but cannot be described yet", operation="DescribeExecution"
            )
        if not info.ended:
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
            started_at=info.start_date,
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

    def _rollback(self, name: str, reason: str, *, version: int) -> None:
        """Give back a claim of ours that never started, only while it is still the claim at
        ``version``: two copies of one message (one name) may run side by side, and the other copy
        may have renewed the claim as its own resume and started it meanwhile.

            copy A                               copy B
            claim N (version 0)
                                                 claim N: LeaseHeld by N → resume: renew (v1)
            StartExecution(N): refused for sure
                                                 StartExecution(N): started
            roll back N IF version 0  ✗          (N keeps its slot and lease)
        """
        complete(
            store=self.store,
            queue=self.queue,
            name=name,
            state=PayloadState.RELEASED,
            now=self.clock.now(),
            error=reason,
            fence=ClaimFence(version),
        )

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

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

Every StartExecution is preceded by the start mark (``starting_at``), the fence against
reconciliation's block of a claim whose key a redriven run holds: written by the claim itself, and
anew by a resumed claim after its renewal (``Store.mark_starting``): see ``_launch``.

A completion's hand-over (``sluice.launch.handover``) claims in its release; its message joins here
at its start (``handed``).

A run-once message (``sluice-once: true``) whose key has SUCCEEDED already fails its claim with
``AlreadyDone`` (the check is in the claim's own condition): it is deleted and recorded, nothing
starts. Why the check cannot be a read before the claim: ``sluice.features.receipts``. One whose key's
run-once run vanished with an unknown outcome (``OnceUnknown``) is dead-lettered with the reason.

Every ``sluice-*`` attribute is checked first, against one catalogue (``sluice.features.attributes``): a
message with a malformed one, or one Sluice does not know, is dead-lettered with the attribute named.

A message that awaits keys (``sluice-awaits``) is checked before its claim (``sluice.features.awaits.gate``):
all SUCCEEDED, it goes on to the claim; otherwise it is parked in the table and deleted, or, when an
awaited key ended badly, dead-lettered with the reason. A woken waiter is checked again on arrival.

In a fair lane (``sluice.features.fair``) a new message claims only while no key has waiters (nobody to be
fair to); otherwise, or when the lane is full, it parks in its tenant's line and is deleted, and
only a waiter its lane's waker sent back claims; one that finds no room parks again.
"""

from __future__ import annotations

from dataclasses import replace
from enum import Enum
from typing import TypedDict

from sluice.core.errors import (
    AlreadyDone,
    AlreadyRan,
    AmbiguousStartError,
    ConfigurationError,
    InvalidPayload,
    KeyFull,
    LeaseHeld,
    MachineVanished,
    OnceUnknown,
    SlotsFull,
    TransientError,
)
from sluice.core.model import Claim, Message, Outcome, Payload, PayloadState, StartResult
from sluice.core.names import execution_name, origin_id
from sluice.core.records import KeyState
from sluice.core.validation import validate_message
from sluice.features import fair, keys
from sluice.features.attributes import check_attributes
from sluice.features.awaits import ReadAhead, gate
from sluice.features.keys import concurrency_key, ticket_of
from sluice.features.pointers import check_pointer
from sluice.features.receipts import is_once
from sluice.launch.context import LaunchContext
from sluice.launch.message_branches import MessageBranches

ATTEMPTS = 3  # claims per message when the lease changes hands under us
THROTTLED_STARTS = 5  # StartExecution calls per payload while Step Functions throttles (backing off)


class _ClaimOptions(TypedDict, total=False):
    """The claim's arguments that apply to some messages only (``PayloadLeases.claim``)."""

    ckey: str
    ticket: str | None
    lane: str
    fair_newcomer: bool
    uncapped: bool


class _Resume(Enum):
    RENEWED = "renewed"  # our own earlier claim, renewed: start it


class MessageProtocol:
    """Validate, check, claim and start one message; the launcher's per-message steps, over the
    launch's context. What a claim or start runs into is settled by its ``branches``."""

    def __init__(self, ctx: LaunchContext) -> None:
        self.ctx = ctx
        self.branches = MessageBranches(ctx)
        # A fair lane's pass that saw several tenants in a batch, or lined one message up: its new
        # messages line up, so the waker sees every tenant before it shares the room out (sluice.features.fair).
        self.line_all = False
        self.held_keys = keys.HeldKeys(ctx)  # the gate's grants before keyed claims, and the keys it held

    def process(
        self,
        message: Message,
        done: list[Message],
        ahead: ReadAhead | None = None,
        handed: str | None = None,
        claims: set[str] | None = None,
    ) -> Outcome:
        """``handed``: the name this message was claimed under already, by the hand-over of a
        completion's release (``sluice.launch.handover``): it is started, nothing more. ``claims``: the
        names claimed since this message's batch was received (its duplicate check's witness)."""
        claims = set() if claims is None else claims
        if handed is not None:
            claims.add(handed)
            launched = self._launch(validate_message(message), handed, done, fresh=True)
            if launched is not None:
                return launched
            # Blocked before its start (or released meanwhile): claimed its own way, as if received.
        outcome = self._one(message, done, ahead, claims)
        if outcome not in (Outcome.STARTED, Outcome.KEY_WAITING, Outcome.INVALID, Outcome.RECHECK):
            # A waiter woken from its key's line that did not claim (a duplicate, already run, ...):
            # the slot kept for it is given back now rather than after INFLIGHT_SECONDS. One sent
            # back for a second look keeps it: it claims, or is a duplicate, within the window.
            ckey, ticket = self._ckey(message), ticket_of(message)
            if ckey is not None and ticket is not None:
                keys.forgo(store=self.ctx.store, ckey=ckey, ticket=ticket)
        return outcome

    def _one(
        self,
        message: Message,
        done: list[Message],
        ahead: ReadAhead | None = None,
        claims: set[str] | None = None,
    ) -> Outcome:
        rejected = check_attributes(message)  # every sluice-* attribute, before anything reads one
        if rejected is not None:
            return self.branches._dead_letter(message, rejected.error(), done)
        try:
            payload = validate_message(message)
            check_pointer(payload, self.ctx.payloads)  # before any claim; S3 throttled: TransientError
            if self._ckey(message) is not None:  # a bad key is dead-lettered, not claimed
                keys.check_fits_line(message, key=payload.key)
            ticket_of(message)
            if gate(
                store=self.ctx.store,
                queue=self.ctx.queue,
                payload=payload,
                now=self.ctx.clock.now(),
                ahead=ahead,
            ):
                done.append(message)  # parked until its awaits have SUCCEEDED (sluice.features.awaits)
                self.branches._log(
                    "payload awaits keys not yet SUCCEEDED; parked", payload, None, Outcome.WAITING
                )
                return Outcome.WAITING
        except InvalidPayload as exc:
            return self.branches._dead_letter(message, exc, done)
        if self.line_all and self._fair_newcomer(message):
            return self._line_up(payload, done, None)  # other tenants in its batch: all line up
        name = execution_name(payload.key, origin_id(message.message_id, message.attributes))
        ckey = self._ckey(message)
        grant = self.held_keys.take(ckey) if ckey is not None else None
        if grant is not None and grant.n == 0:
            return self._line_up(
                payload, done, None, reason=f"concurrency key at its {self.ctx.gate.name}; parked in its line"
            )
        try:
            outcome = self._attempts(payload, name, done, set() if claims is None else claims)
        except SlotsFull:
            self.held_keys.give_back(grant)
            raise
        if outcome not in (Outcome.STARTED, Outcome.RESUMED):
            self.held_keys.give_back(grant)  # kept where it may have started: fewer starts, never more
        return outcome

    def _attempts(self, payload: Payload, name: str, done: list[Message], claims: set[str]) -> Outcome:
        for _ in range(ATTEMPTS):
            outcome = self._attempt(payload, name, done, claims)
            if outcome is not None:
                return outcome
        # The lease kept changing hands under us: try again later, as if the slot had been taken.
        raise SlotsFull(0)

    def _attempt(self, payload: Payload, name: str, done: list[Message], claims: set[str]) -> Outcome | None:
        """One claim-and-start of ``payload``. None when the lease changed meanwhile: look again.
        ``claims``: names claimed since its batch was received; this claim joins them."""
        now = self.ctx.clock.now()
        claim_expires_at = now + self.ctx.settings.claim_timeout_seconds
        fresh = True
        ckey = self._ckey(payload.message)
        try:
            self._claim(payload, name, ckey, now=now, claim_expires_at=claim_expires_at)
        except KeyFull as full:
            # Its concurrency key is at its cap: it waits in the key's line, out of the queue.
            return self._line_up(payload, done, full.state)
        except SlotsFull:
            if self.ctx.lane is None or not self.ctx.lane.fair:
                raise
            # A fair lane's message with no room (a newcomer to a full lane; a woken waiter that
            # found its room taken by another waker's, or a lowered MAX): in line rather than back
            # to the queue, where it would spend receives.
            return self._line_up(payload, done, None)
        except AlreadyRan as ran:
            # Its message back after its run ended and was released: it ran. Not started again,
            # on this state machine or on one the stack switched to since. Released as vanished
            # (its machine deleted): it may have run, as a resumed claim there (_started_before).
            if ran.existing.outcome_unknown:
                reason = str(MachineVanished.claim(ran.existing.name, ran.existing.arn))
                return self.branches._dead_letter(
                    payload.message, InvalidPayload(reason, key=payload.key), done
                )
            done.append(payload.message)
            self.branches._log(
                "redelivered message already ran", payload, ran.existing.name, Outcome.ALREADY_RAN
            )
            return Outcome.ALREADY_RAN
        except AlreadyDone as done_before:
            return self._done_already(payload, done_before, done)
        except OnceUnknown as unknown:
            # A run-once message of a key whose run-once run vanished with an unknown outcome: it
            # may have SUCCEEDED, so not run by itself; dead-lettered with the way out in its reason.
            return self.branches._dead_letter(
                payload.message, InvalidPayload(str(unknown), key=payload.key), done
            )
        except LeaseHeld as held:
            if held.existing.holder != name:
                return self.branches._duplicate(payload, held, done, claims)
            resumed = self._resume(payload, name, done, held, now=now, claim_expires_at=claim_expires_at)
            if resumed is not _Resume.RENEWED:
                return resumed
            fresh = False
        else:
            claims.add(name)  # after every message of its batch was received
        return self._launch(payload, name, done, fresh=fresh)

    def _claim(
        self, payload: Payload, name: str, ckey: str | None, *, now: float, claim_expires_at: float
    ) -> None:
        """The claim of ``payload`` under ``name``: its lease and a slot (and its key's, its lane's)."""
        lane = self.ctx.lane
        options: _ClaimOptions = {}  # only what applies: the store's defaults otherwise
        if ckey is not None:
            options["ckey"], options["ticket"] = ckey, ticket_of(payload.message)
        if lane is not None:
            options["lane"] = lane.name
        if self._fair_newcomer(payload.message):
            # A fair lane's new message claims only while nobody waits; else it lines up.
            options["fair_newcomer"] = True
        if lane is not None and lane.fair:
            options["uncapped"] = True
        self.ctx.store.claim(
            Claim(
                key=payload.key,
                name=name,
                message_id=origin_id(payload.message.message_id, payload.message.attributes),
                arn=self.ctx.executions.arn_for(name),
                now=now,
                claim_expires_at=claim_expires_at,
                once=is_once(payload.message),
                copy_id=payload.message.message_id,
                **options,
            )
        )

    def _done_already(self, payload: Payload, done_before: AlreadyDone, done: list[Message]) -> Outcome:
        """A run-once message of a key that has SUCCEEDED: acknowledged, recorded, not started."""
        self.ctx.store.record_already_done(
            key=payload.key,
            message_id=payload.message.message_id,
            now=self.ctx.clock.now(),
            seen=done_before.existing,
        )
        done.append(payload.message)
        self.branches._log(
            "run-once payload succeeded already; not started",
            payload,
            done_before.existing.succeeded_by,
            Outcome.ALREADY_DONE,
        )
        return Outcome.ALREADY_DONE

    def _resume(
        self,
        payload: Payload,
        name: str,
        done: list[Message],
        held: LeaseHeld,
        *,
        now: float,
        claim_expires_at: float,
    ) -> Outcome | _Resume | None:
        """Our own earlier claim: this message was received before and the launcher stopped
        somewhere after claiming. Same message id, same name: carry on from where it stopped.
        ``RENEWED``: the claim is renewed, start it; None: look again."""
        if held.existing.state is PayloadState.RUNNING:
            self.branches._log("redelivered message already running", payload, name, Outcome.RESUMED)
            done.append(payload.message)
            return Outcome.RESUMED
        # No mark is written after a start, so the launcher that claimed it may have started
        # it before it died: ask Step Functions by the ARN the claim recorded. A start on the
        # state machine in use now would run it twice if the stack was switched since.
        try:
            started = self.branches._started_before(name)
        except ConfigurationError as exc:
            # Claimed on a state machine this role may not ask about (the stack was switched
            # without previousStateMachineArn): it may run there, so it is not started here.
            reason = f"its claim {name} is on a state machine Sluice may not describe ({exc}); set previousStateMachineArn"
            if isinstance(exc, MachineVanished):
                reason = str(exc)
            return self.branches._dead_letter(payload.message, InvalidPayload(reason, key=payload.key), done)
        if started is not None:
            return self.branches._already_exists(payload, name, done, started)
        # Re-take the claim first: reconciliation may be judging it abandoned right now, and
        # a renewal is what makes its release fail. Released or started meanwhile: look again.
        # It starts on the state machine in use now, and its record says so from here on.
        arn = self.ctx.executions.arn_for(name)
        copy = payload.message.message_id  # a mark another copy wrote is not lifted: see ``_launch``
        if not self.ctx.store.renew(
            name=name, now=now, claim_expires_at=claim_expires_at, arn=arn, copy_id=copy
        ):
            return self.branches._renewal_refused(payload, name, done)
        # The renewal lifted a start mark an earlier attempt left (a crash, an unsure start),
        # which may have refused a reconciliation's block: honour that reconciliation's word,
        # the key's redriven mark, read after the renewal (see ``_yield_to_redriven``).
        if self.branches._yield_to_redriven(payload, name):
            return None
        return _Resume.RENEWED

    def _launch(self, payload: Payload, name: str, done: list[Message], *, fresh: bool) -> Outcome | None:
        """Start ``payload`` under ``name``, whose claim is held (``fresh``: taken just now, so given
        back if StartExecution refuses it for sure; else a resumed claim, kept). None when the claim
        was blocked (settled: ``_renewal_refused``), released or marked meanwhile: look again.

        The start mark is the fence against reconciliation's block (a redriven run of the key,
        ``sluice.launch.redriven.hold_for_redriven``); each is conditional on the other's absence, so
        whichever lands first wins and no StartExecution follows a block. A fresh claim is written
        with its mark (``starting_at``), so a block never lands on it:

            launcher (claim N of key k)         reconciliation
            claim N (CLAIMED, starting_at)
                                                lists R (k's run, redriven): adopt(R) ✗ (N holds k)
                                                block(N) IF no starting_at ✗: N runs (or is about
                                                to) beside R, as if R had been redriven after N's
                                                start; k is marked, so N's successor adopts R
            StartExecution(N)

        A resumed claim's renewal lifts the mark, and the resume marks it anew:

            renew N (no starting_at)
                                                block(N) IF CLAIMED AND no starting_at    ✓
            mark_starting(N) IF no blocked_by ✗ → N rolled back, R adopted: a duplicate of R
          or
            mark_starting(N) IF no blocked_by ✓ → as a fresh claim above

        The mark is lifted only by a renewal by the copy of the message that wrote it (``copy_id``),
        visible again only after the visibility timeout, which exceeds the launcher's timeout: the
        invocation that marked is over and starts nothing after a block."""
        ckey = self._ckey(payload.message)
        if not fresh and not self.ctx.store.mark_starting(
            name=name, now=self.ctx.clock.now(), copy_id=payload.message.message_id
        ):
            return self.branches._renewal_refused(payload, name, done)
        try:
            result = self._start(name, payload.body)
        except AmbiguousStartError:
            # It may have started: keep the claim. The message returns with the same name, and
            # StartExecution then answers with the same ARN or ExecutionAlreadyExists.
            raise
        except InvalidPayload as exc:
            if fresh:
                self.branches._rollback(name, exc.reason, version=0)
            return self.branches._dead_letter(payload.message, exc, done)
        except (TransientError, ConfigurationError) as exc:
            # Refused for certain: nothing started, so the claim goes back (a resumed claim stays:
            # an earlier attempt may have started it).
            if fresh:
                self._give_back(payload, name, ckey, exc)
            raise
        if result.already_existed:
            return self._exists(payload, name, done)
        done.append(payload.message)
        outcome = Outcome.STARTED if fresh else Outcome.RESUMED
        self.branches._log("execution started", payload, name, outcome, arn=result.arn)
        return outcome

    def _exists(self, payload: Payload, name: str, done: list[Message]) -> Outcome:
        """StartExecution said "already exists": it runs or ran, perhaps started just now by an
        earlier attempt, so a failure to settle it keeps its copy away the window, as after an
        ambiguous start (``sluice.launch.admission.away_after``)."""
        try:
            return self.branches._already_exists(payload, name, done)
        except TransientError as exc:
            if isinstance(exc, AmbiguousStartError):
                raise
            raise AmbiguousStartError(
                f"execution {name} exists; then {exc}", operation=exc.operation, code=exc.code
            ) from exc

    def _give_back(self, payload: Payload, name: str, ckey: str | None, exc: Exception) -> None:
        """Roll back our fresh claim ``name``, whose StartExecution was refused for certain."""
        ticket = ticket_of(payload.message)
        if ckey is not None and ticket is not None:
            # A woken waiter going back to the queue keeps its slot in the key: else the
            # release below wakes the next waiter into it, and this one loses its place.
            self.ctx.store.keep_inflight(ckey, [ticket])
        self.branches._rollback(name, f"StartExecution refused: {exc}", version=0)

    def _fair_newcomer(self, message: Message) -> bool:
        return self.ctx.lane is not None and self.ctx.lane.fair and ticket_of(message) is None

    def _ckey(self, message: Message) -> str | None:
        """The key whose line the message waits in: its concurrency key; in a fair lane, its tenant."""
        if self.ctx.lane is not None and self.ctx.lane.fair:
            return fair.tenant(message, self.ctx.lane)
        return concurrency_key(message)

    def _line_up(
        self, payload: Payload, done: list[Message], seen: KeyState | None, *, reason: str = ""
    ) -> Outcome:
        """Park ``payload`` in its key's line (``sluice.features.keys``); its message is then deleted."""
        ckey = self._ckey(payload.message)
        assert ckey is not None
        fair_lane = self.ctx.lane.name if self.ctx.lane is not None and self.ctx.lane.fair else None
        if fair_lane is not None and concurrency_key(payload.message) is None:
            # An unkeyed message of a fair lane waits as its tenant, lane:<name>, and carries it as
            # its key from now on: woken, in whatever lane, its claim is of that key's line.
            message = payload.message
            attributes = {**message.attributes, keys.CONCURRENCY_KEY_ATTRIBUTE: ckey}
            payload = replace(payload, message=replace(message, attributes=attributes))
        ticket = keys.wait(
            store=self.ctx.store,
            queue=self.ctx.queue,
            payload=payload,
            ckey=ckey,
            now=self.ctx.clock.now(),
            seen=seen,
            fair=fair_lane,
        )
        done.append(payload.message)
        if fair_lane:
            self.line_all = True  # someone waits now: the rest of this pass lines up too
        self.branches._log(
            reason
            or (
                "in its tenant's line (fair lane)"
                if fair_lane
                else "concurrency key at its cap; parked in its line"
            ),
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
            self.ctx.pacer.take()
            try:
                result = self.ctx.executions.start(name, body)
            except Exception as exc:
                if isinstance(exc, AmbiguousStartError):
                    unsure = exc
                last = attempt + 1 == THROTTLED_STARTS
                if isinstance(exc, TransientError) and exc.throttled and not last:
                    self.ctx.log.info("StartExecution throttled; backing off", extra={"execution_name": name})
                    self.ctx.pacer.throttled()
                    continue
                if unsure is not None and exc is not unsure:
                    raise AmbiguousStartError(
                        f"{exc}, after an attempt that may have started it ({unsure})",
                        operation="StartExecution",
                        code=getattr(exc, "code", ""),
                    ) from exc
                raise
            self.ctx.pacer.passed()
            return result
        raise AssertionError("unreachable")

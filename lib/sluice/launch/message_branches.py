"""What one message's claim or start ran into, and how each is settled: a lease held by another
run (a duplicate, deferred or suppressed; a holder that ended with its event on the way; a run
redriven behind Sluice's back), a renewal refused, a name that started or ended already, input
that cannot run. The other half of ``sluice.launch.per_message``, whose docstring has the timeline."""

from __future__ import annotations

import hashlib
import math

from sluice.core.errors import (
    AmbiguousStartError,
    ConfigurationError,
    InvalidPayload,
    LeaseHeld,
    MachineVanished,
    TransientError,
)
from sluice.core.model import (
    ClaimFence,
    Ending,
    ExecutionInfo,
    ExecutionRecord,
    ExecutionStatus,
    Message,
    Outcome,
    Payload,
    PayloadRecord,
    PayloadState,
)
from sluice.core.validation import validate_message
from sluice.features.parking import park
from sluice.launch.completion import (
    before_its_redrive,
    complete,
    earlier_end,
    output_from,
    young_adoption,
)
from sluice.launch.context import LaunchContext
from sluice.launch.settings import OTHER_CLOCK_WINDOWS, SQS_MAX_VISIBILITY, DuplicatePolicy

# a key's redriven mark holds its claims this many consistency windows by the clock that stamped it,
# as an adoption holds by its own sighting (``_mark_old``)
MARK_WINDOWS = OTHER_CLOCK_WINDOWS


class MessageBranches:
    """The branches of the per-message steps (``sluice.launch.per_message.MessageProtocol``, which holds
    one), over the launch's context."""

    def __init__(self, ctx: LaunchContext) -> None:
        self.ctx = ctx

    def _duplicate(
        self, payload: Payload, held: LeaseHeld, done: list[Message], claims: set[str]
    ) -> Outcome | None:
        """``claims``: names claimed since the message's batch was received (``_first_sighting``)."""
        marked = held.existing.redriven or min(held.existing.redriven_more, default=None)
        if held.existing.holder is None and marked is not None:
            self._take_redriven(marked, held.existing)
            return None
        holder = held.existing.holder or ""
        # The holder may have ended with its status event still on the way: ask Step Functions
        # before turning a re-submission away, on the machine the holder was claimed on (another
        # lane's, or the one before a switch: names are unique per machine only). Ended: settle
        # it and claim again.
        record = self.ctx.store.execution(holder)
        try:
            info = self.ctx.executions.describe(holder, record.arn if record is not None else None)
        except ConfigurationError:
            info = None  # a holder on a state machine this role may not ask about: assume it runs
        if info is not None and self._holder_ended(info, record):
            self._settle_ended(holder, info)
            return None
        if self._parks_behind(info):
            return self._defer(payload, holder, done)
        if info is None and self._vanished(record):
            # Step Functions no longer knows it: its state machine was switched from and deleted,
            # so it runs no more, and reconciliation releases it. No answer says it runs: back for
            # the window, however often, rather than dropped behind it.
            return self._recheck(
                payload, holder, "payload behind a run whose state machine is gone; looked at again later"
            )
        if holder not in claims and self._first_sighting(payload):
            return self._recheck(
                payload, holder, "payload may duplicate a run that just ended; looked at again later"
            )
        self.ctx.store.record_duplicate(
            key=payload.key, message_id=payload.message.message_id, now=self.ctx.clock.now()
        )
        done.append(payload.message)
        self._log("payload already running; duplicate suppressed", payload, holder, Outcome.DUPLICATE)
        return Outcome.DUPLICATE

    def _parks_behind(self, info: ExecutionInfo | None) -> bool:
        """Whether the message waits parked behind the holder rather than be suppressed: under the
        policy DEFER, and whenever the answer is an end taken for one from before the holder's
        redrive (its adoption reads as young to this clock, ``completion.young_adoption``): no
        proof that it runs, so never suppressed; woken by its release."""
        return self.ctx.settings.duplicate_policy is DuplicatePolicy.DEFER or (
            info is not None and info.ended
        )

    def _holder_ended(self, info: ExecutionInfo, record: ExecutionRecord | None) -> bool:
        """Whether the holder's answer says it ended. While its adoption (it ran again after a
        redrive) is younger than the consistency window, no end but a success is proof: it may be
        from before that redrive, recorded or not (``completion.young_adoption``). Past it, the
        answer is fresh: an end from before the adoption means the adoption took a stale RUNNING
        answer, and that end is the holder's. Never one before the redrive it was adopted after:
        Step Functions' own dates say that answer is stale, however late it is read."""
        if not info.ended or (record is not None and before_its_redrive(info.stop_date, record)):
            return False
        if info.status == ExecutionStatus.SUCCEEDED:
            return True  # a success is its last end: never redriven
        return not self._adopted_within_the_window(record)

    def _settle_ended(self, name: str, info: ExecutionInfo) -> None:
        """Release ``name``, whose run Step Functions says ended, as its status event would. The
        end is judged again against the record the release reads: the run may have been redriven
        and adopted since the answer (explorer seed 1206301599)::

            tick A                               meanwhile
            claim m2 of k: refused (e1 holds k)
            DescribeExecution(e1): FAILED
                                                 e1 released, redriven, adopted (RUNNING again)
            release e1 on that FAILED   ✗        (now: its adoption is young, nothing released)
            claim m2, start: two runs of k
        """
        complete(
            store=self.ctx.store,
            queue=self.ctx.queue,
            confirm=lambda record: self._holder_ended(info, record),
            name=name,
            ending=Ending(
                PayloadState.after(info.status),
                self.ctx.clock.now(),
                error=info.error,
                cause=info.cause,
                ended_at=info.stop_date,
                started_at=info.start_date,
            ),
            output=output_from(info.output, self.ctx.outputs),
            effects=self.ctx.effects,
        )

    def _defer(self, payload: Payload, holder: str, done: list[Message]) -> Outcome | None:
        """The duplicate policy DEFER: parked behind the holder, woken by its release. Safe on a
        stale answer: the release follows its end (its event, or the next reconciliation) whenever
        that end came. None: the holder was released meanwhile, the lease is free."""
        if not park(store=self.ctx.store, payload=payload, holder=holder, now=self.ctx.clock.now()):
            return None
        done.append(payload.message)
        self._log("payload already running; parked until it ends", payload, holder, Outcome.DEFERRED)
        return Outcome.DEFERRED

    def _recheck(self, payload: Payload, holder: str, text: str, *, delay: float = 0.0) -> Outcome:
        """Back to the queue for the consistency window (or ``delay``, if longer, up to SQS's
        longest visibility timeout), to be looked at again."""
        window = self.ctx.settings.consistency_window_seconds
        seconds = min(max(window, math.ceil(delay)), SQS_MAX_VISIBILITY)
        self.ctx.queue.release([payload.message], delay_seconds=seconds)
        self._log(text, payload, holder, Outcome.RECHECK)
        return Outcome.RECHECK

    def _first_sighting(self, payload: Payload) -> bool:
        """Whether this is the first time this SQS message is refused by a holder that reads as
        running. The answer may be stale by up to S (docs/protocol.md, "Staleness"): the holder may
        have ended just before the message was sent, and a suppressed message never runs. So the
        message goes back to the queue, and is dropped only when it is refused again on a later
        receive, whose answer is no older than the first refusal, so later than its send:

            holder h of k                  message m of k (suppress)
            h ends (event on the way)
                                           sent; received; claim ✗ (h holds k)
                                           DescribeExecution(h): RUNNING (stale)
                                           first sighting: SIGHT#m; back for the window (≥ S)
            released (event, or reconciliation)
                                           received again: claim ✓ (k free), or ✗ and
                                           DescribeExecution(h) ended → settle, claim ✓;
                                           RUNNING now means h ran after m was sent: a duplicate

        A later receive comes at least S after the first sighting whatever happens in between:
        after the visibility change (S), or, if that change or this invocation is lost, after the
        visibility timeout, which exceeds the launcher's timeout by at least S.

        No second look is needed when the holder was claimed after the message was received (in
        its batch, by this launcher: ``claims``): the message was sent before the holder's claim,
        so before its end, whatever the answer's age. Copies of one key in one batch are dropped
        at once, as before.

        The sighting names the receive that made it (its receipt handle's digest), so a retried
        write of that receive, whose first attempt landed with its answer lost, is still the first
        sighting; and a write that failed is taken as a first sighting, since it may have landed:
        the message goes back for the window either way, never at once as a transient error's batch
        would go back:

            receive 1 of m: SIGHT#m (receipt r1) lands, its answer lost
                            retry: condition ✓ (receipt r1 is this receive's) → first, back for S
            or: the write raises → first, back for S (not with the batch, at once)
            receive 2 of m, ≥ S later: receipt r2 ≠ r1 → a second sighting"""
        try:
            return self._sight(payload)
        except TransientError:
            return True

    def _sight(self, payload: Payload) -> bool:
        receipt = hashlib.sha256(payload.message.receipt_handle.encode()).hexdigest()[:32]
        return self.ctx.store.first_sighting(
            key=payload.key, message_id=payload.message.message_id, receipt=receipt, now=self.ctx.clock.now()
        )

    def sight_behind(self, message: Message, behind: list[Message]) -> None:
        """``message`` went back for a second look; ``behind``, its FIFO group's later messages of
        the batch, go back with it and are sighted on this receive. Each is received again only
        after ``message`` is (SQS FIFO delivers a group in order and holds it while a message is in
        flight), so at least S after ``message`` went back, a moment ago, and after its own send:
        its next refusal by a holder that reads as running is a second look, not a first one that
        would send the group back again. Without this each duplicate ahead costs every later
        message of its group one receive, and enough of them walk a fresh message to the DLQ
        through ``maxReceiveCount``:

            group g: d1 d2 … d9 j        (d* re-submissions of a running key; j runs nothing's)
            receive 1: d1 first look → back for S; d2 … j sighted, handed back (received once)
            receive 2 (≥ S later): d1 … d9 second looks → suppressed; j claims and starts

        Only ``message``'s own group: in a fair lane a batch's run of one tenant spans groups, and
        another group is not held behind ``message``. Best effort: an unsighted one looks twice."""
        for later in behind:
            if later.group_id != message.group_id:
                continue
            try:
                self._sight(validate_message(later))
            except (InvalidPayload, TransientError):
                continue  # dead-lettered on its turn; or looked at twice, as before

    def _vanished(self, record: ExecutionRecord | None) -> bool:
        """Whether ``record``'s run is on a state machine the stack no longer uses that Step
        Functions says does not exist: it ran there and ended, or never started (its message is
        then dead-lettered, ``sluice.launch.per_message``); either way it runs no more."""
        if record is None:
            return False
        try:
            return self.ctx.executions.vanished(record.arn)
        except ConfigurationError:
            return False  # a state machine this role may not ask about: as before, assume it runs

    def _adopted_within_the_window(self, record: ExecutionRecord | None) -> bool:
        """Whether ``record``'s adoption is young (``completion.young_adoption``, reconciliation's
        rule too): past it, an answer cannot be from before it."""
        window = self.ctx.settings.consistency_window_seconds
        return record is not None and young_adoption(
            record, self.ctx.clock.now(), window, self.ctx.clock.identity
        )

    def _adopt(self, name: str, redriven_at: float | None) -> bool:
        """``Store.adopt``, stamped and first seen by this clock (``young_adoption``)."""
        clock = self.ctx.clock
        return self.ctx.store.adopt(name=name, now=clock.now(), redriven_at=redriven_at, by=clock.identity)

    def _window_past(self, since: float, *, windows: int = 1) -> bool:
        return self.ctx.clock.now() - since >= windows * self.ctx.settings.consistency_window_seconds

    def _take_redriven(self, redriven: str, marked: PayloadRecord) -> None:
        """The lease is free but a run of the key was, or may have been, redriven behind Sluice's
        back (``Store.mark_redriven``): adopt it if it still runs, else lift the mark. The caller
        looks again and finds the adopted run, or a free lease. ``marked``: the key's record as
        read, with its marks. An adoption refused (another run took the key, or the pools kept
        moving) keeps the mark: the run still runs, and the next look finds the holder or tries again."""
        runs = self._still_runs(redriven, marked)
        if runs is None:
            self.ctx.store.clear_redriven(key=marked.key, name=redriven, as_read=marked)
            return
        self._adopt(redriven, runs.redrive_date)

    def _mark_old(self, marked: PayloadRecord) -> bool:
        """Whether the key's mark is two consistency windows old, by the clock that stamped it: this
        one, read now, before the answer it judges is asked for. A mark another clock stamped, or
        none did (a further mark, or an older version's), is of unknown age, so young: a clock an
        hour behind the marker's would read it an hour old (explorer seed 247667414)."""
        age = marked.marks_age(self.ctx.clock.now(), self.ctx.clock.identity)
        return age is not None and age >= MARK_WINDOWS * self.ctx.settings.consistency_window_seconds

    def _still_runs(self, redriven: str, marked: PayloadRecord) -> ExecutionInfo | None:
        """The answer that says ``redriven``, a run a reconciliation saw redriven (``marked``: its
        key's record, with the mark), runs still, or may; None: it ended.

        An end other than a success may be a stale answer (the one its record knew before the
        redrive, or one between two redrives it never recorded): the mark may have been made just
        after a real redrive. Once the mark is the consistency window old (``_mark_old``), an answer
        can no longer be from before that redrive, so that end is fresh: the reconciliation that
        marked took a stale RUNNING answer of a run that never ran again, and the mark is lifted:

            e1 of k FAILED at s1, released; n2 holds k
            reconciliation: e1 listed and described RUNNING (stale) → adopt ✗ (n2) → mark k: e1
            n2 ends, released
            claim of k ✗ (marked) → DescribeExecution(e1): FAILED at s1
                within the window of the mark, or another clock's mark: it may run (a redrive just
                before the mark) → adopt
                past it: it ended at s1, never ran again → lift the mark, claim"""
        old = self._mark_old(marked)
        record = self.ctx.store.execution(redriven)
        try:
            info = self.ctx.executions.describe(redriven, record.arn) if record is not None else None
        except ConfigurationError:
            # a state machine this role may not ask about: assume it runs
            return ExecutionInfo(name=redriven, arn="", status=ExecutionStatus.RUNNING)
        if info is None:
            # "No such execution" for a run Sluice recorded answers from a view older than it (as
            # for reconciliation, ``listed_again``): within the mark's window it may run.
            if record is None or old:
                return None
            return ExecutionInfo(name=redriven, arn=record.arn, status=ExecutionStatus.RUNNING)
        if not info.ended:
            return info
        # Any end but a success: one Sluice never recorded (between two redrives) may be as stale.
        runs = info.status != ExecutionStatus.SUCCEEDED or earlier_end(info, record)
        return info if runs and not old else None

    def _yield_to_redriven(self, payload: Payload, name: str) -> bool:
        """Our resumed claim ``name`` was just renewed, which lifts any start mark: if its key is
        marked redriven by another run that still runs, give the claim back and adopt that run
        (True: look again; this message is then its duplicate), as a block would have.

        A start mark refuses reconciliation's block, and the renewal lifts the mark; reading the
        key's mark after the renewal closes the gap, as reconciliation marks before it blocks:

            launcher (resume N of key k)        reconciliation
            (N: CLAIMED, start mark left)
                                                lists R: adopt(R) ✗ → mark_redriven(k, R)
                                                block(N) IF no starting_at ✗ (the mark)
            renew(N): mark lifted
            payload(k).redriven = R, R runs → roll N back, adopt(R)
          or
            renew(N): mark lifted
            payload(k): no mark
                                                mark_redriven(k, R); block(N) ✓ (no mark now)
            mark_starting(N) IF no blocked_by ✗ → ``_renewal_refused``: yields"""
        seen = self.ctx.store.payload(payload.key)
        if seen is None:
            return False
        marks = [seen.redriven, *sorted(seen.redriven_more)]
        runs: ExecutionInfo | None = None
        for redriven in (mark for mark in marks if mark is not None and mark != name):
            runs = self._still_runs(redriven, seen)
            if runs is not None:
                break
            self.ctx.store.clear_redriven(key=payload.key, name=redriven, as_read=seen)
        if runs is None:
            return False
        record = self.ctx.store.execution(name)
        if record is not None and record.copy_id not in (None, payload.message.message_id):
            # Another copy of this message renewed the claim since ours, and may have marked and
            # started it: its claim now, not ours to give back. Look again (a rollback fenced on
            # the version read here would land on that copy's renewal).
            return True
        self._rollback(
            name,
            f"yielded to {redriven}, a redriven run of the same key",
            version=record.claim_version if record is not None else 0,
        )
        self._adopt(redriven, runs.redrive_date)
        return True

    def _renewal_refused(self, payload: Payload, name: str, done: list[Message]) -> Outcome | None:
        """Our claim could not be renewed or marked starting. Released or started meanwhile: look
        again. Blocked (reconciliation saw a redriven run of its key, ``Store.block``) and never
        started: hand the key to that run, which is then adopted, and look again: this message is
        its duplicate."""
        record = self.ctx.store.execution(name)
        if record is None or record.state is not PayloadState.CLAIMED:
            return None
        if not record.blocked_by:
            if record.copy_id not in (None, payload.message.message_id):
                # Another copy of this message (its origin id, in another group) holds the claim,
                # and its invocation may be starting it. Looked at again a claim timeout later, by
                # SQS's clock, it finds the run, or the claim resumed by its copy or released by
                # reconciliation as abandoned, and claims it afresh (``Store.renew``).
                return self._recheck(
                    payload,
                    name,
                    "another copy of this message holds its claim",
                    delay=self.ctx.settings.claim_timeout_seconds,
                )
            return None
        info = self.ctx.executions.describe(name, record.arn)
        if info is not None:
            # An earlier attempt did start it: it runs beside the redriven one; carry on.
            return self._already_exists(payload, name, done, info)
        self._rollback(
            name,
            f"yielded to {record.blocked_by}, a redriven run of the same key",
            version=record.claim_version,
        )
        redriven = self.ctx.executions.describe(record.blocked_by)
        if redriven is not None and not redriven.ended:
            self._adopt(record.blocked_by, redriven.redrive_date)
        return None

    def _started_before(self, name: str) -> ExecutionInfo | None:
        """Our own claim, back: what Step Functions says of it, asked by the ARN it was claimed for
        (None: never started)."""
        record = self.ctx.store.execution(name)
        info = self.ctx.executions.describe(name, record.arn if record is not None else None)
        if info is None and record is not None and self.ctx.executions.vanished(record.arn):
            # Claimed on a machine since switched from and deleted: "no such execution" no longer
            # says it never started there. Not started again (sluice.launch.per_message dead-letters it).
            raise MachineVanished.claim(name, record.arn)
        return info

    def _already_exists(
        self, payload: Payload, name: str, done: list[Message], info: ExecutionInfo | None = None
    ) -> Outcome:
        """StartExecution says this name exists with other input or has ended, or a resumed claim
        was found started (``info``): this message ran, or runs."""
        info = info or self.ctx.executions.describe(name)
        if info is None:
            # Contradicts StartExecution; Step Functions has not caught up. Keep the claim and retry.
            raise AmbiguousStartError(
                f"execution {name} exists but cannot be described yet", operation="DescribeExecution"
            )
        if not info.ended:
            done.append(payload.message)
            self._log("redelivered message already running", payload, name, Outcome.RESUMED)
            return Outcome.RESUMED
        self._settle_ended(name, info)
        done.append(payload.message)
        self._log("redelivered message already ran", payload, name, Outcome.ALREADY_RAN)
        return Outcome.ALREADY_RAN

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
            store=self.ctx.store,
            queue=self.ctx.queue,
            name=name,
            ending=Ending(PayloadState.RELEASED, self.ctx.clock.now(), error=reason),
            fence=ClaimFence(version),
        )

    def _dead_letter(self, message: Message, exc: InvalidPayload, done: list[Message]) -> Outcome:
        self.ctx.queue.send_to_dlq(message, exc.reason)
        if exc.key:
            self.ctx.store.record_invalid(key=exc.key, reason=exc.reason, now=self.ctx.clock.now())
        done.append(message)
        self.ctx.log.warning(
            "invalid payload dead-lettered",
            extra={
                "message_id": message.message_id,
                "reason": exc.reason,
                "outcome": Outcome.INVALID.value,
                "correlation_id": exc.key or message.message_id,
            },
        )
        return Outcome.INVALID

    def _log(self, text: str, payload: Payload, name: str | None, outcome: Outcome, **more: object) -> None:
        self.ctx.log.info(
            text,
            extra={
                "correlation_id": payload.key,
                "message_id": payload.message.message_id,
                "execution_name": name,
                "outcome": outcome.value,
                **more,
            },
        )

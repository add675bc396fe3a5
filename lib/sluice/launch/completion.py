"""Completion: an execution ended, so free its slot and lease and record the outcome.

Status-change events are best effort: lost, repeated, late or out of order. So release is keyed
on the execution name and conditional on that name still holding the lease:

    event A(SUCCEEDED) ──► release(A): holder == A ──► slot freed, outcome recorded
    event A(SUCCEEDED) ──► release(A): holder != A ──► nothing (second delivery)
    event lost          ──► reconciliation finds A ended (DescribeExecution) ──► same release

A set ``DELETE`` on the ledger removes A at most once, so the slot count never goes negative.
Messages parked behind A (deferred duplicates) go back to the queue once A is released.

The release writes the key's receipt (``sluice.features.receipts``) in the same transaction, with the output
from the event (``detail.output``), else from DescribeExecution. An execution redriven and adopted
back may have ended a second time before an event of its first end arrives late:

    A FAILED at t1 ──► released, receipt A FAILED
    A redriven, adopted (RUNNING again) ──► A SUCCEEDED at t2 (its event lost)
    late repeat of A(FAILED, stopDate t1) ──► DescribeExecution(A): SUCCEEDED, stopped t2 ≠ t1
                                          ──► nothing (reconciliation releases A as SUCCEEDED)

So an adopted execution is released by an event only when Step Functions reports it ended, and
ended at that event's stop date. A SUCCEEDED event that releases nothing while the released record
holds another end is a redriven run's success: recorded without a slot (``_later_success``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Any, Protocol

from sluice.core.events import StatusChange
from sluice.core.model import (
    Claim,
    ClaimFence,
    Ending,
    ExecutionInfo,
    ExecutionRecord,
    ExecutionStatus,
    PayloadState,
)
from sluice.core.ports import Executions, Queue
from sluice.core.records import ReceiptOutput
from sluice.features import keys
from sluice.features.awaits import on_receipt
from sluice.features.effects import Effects, around
from sluice.features.parking import wake
from sluice.features.receipts import Outputs
from sluice.features.stores import LaunchStore
from sluice.launch.settings import CONSISTENCY_WINDOW_SECONDS, OTHER_CLOCK_WINDOWS

log = logging.getLogger("sluice.completion")


def complete(
    *,
    store: LaunchStore,
    queue: Queue,
    name: str,
    ending: Ending,
    fence: ClaimFence | None = None,
    confirm: Callable[[ExecutionRecord], bool] | None = None,
    output: Callable[[ExecutionRecord], ReceiptOutput | None] | None = None,
    effects: Effects | None = None,
    offer: Offer | None = None,
) -> ExecutionRecord | None:
    """Release ``name``, record ``ending`` (with the receipt: ``output`` is asked for what to keep of
    the output, only when the release happens) and wake what waits for it. The one path every
    release takes. A SUCCEEDED output's effects are sent before the release and marked in it
    (``sluice.features.effects``; ``effects``: how, by default without a payload bucket). With ``offer`` (a
    completion's refill) the freed slot is handed to the successor it offers, in the release's own
    transaction (``Store.hand_over``); ``offer.settled`` then says whether it took it.
    ``ending.outcome_unknown``: its execution vanished (``Store.release``)."""
    state, now = ending.state, ending.now
    if ending.outcome_unknown:
        assert offer is None and not state.ended, "an unknown outcome is a release, not an end"
    output = around(output, effects, store=store, queue=queue, name=name, state=state, now=now)
    if offer is None:
        released = store.release(name, ending, fence=fence, confirm=confirm, output=output)
    else:
        assert fence is None, "a hand-over ends a run; a fenced release gives an unstarted claim back"
        handed = store.hand_over(name, ending, offer.take, confirm=confirm, output=output)
        released = handed.released
        offer.settled(handed.claimed)
    if released is None:
        log.info("nothing to release", extra={"execution_name": name, "state": state.value})
        return None
    _wake_after(store, queue, released, name=name, state=state, now=now)
    log.info(
        "slot released",
        extra={
            "execution_name": name,
            "state": state.value,
            "correlation_id": released.key,
        },
    )
    return released


def _wake_after(
    store: LaunchStore, queue: Queue, released: ExecutionRecord, *, name: str, state: PayloadState, now: float
) -> None:
    """What waits for the run ``released`` ended: its parked duplicates, its key's line, and, when
    it ended, the messages awaiting its key."""
    if released.parked:
        wake(store=store, queue=queue, record=released, now=now)
    if released.ckey is not None:
        keys.wake(store=store, queue=queue, ckey=released.ckey, now=now)
    if state.ended and released.awaited:
        succeeded = name if state is PayloadState.SUCCEEDED else None
        on_receipt(store=store, queue=queue, key=released.key, now=now, succeeded_by=succeeded)  # its waiters


class Offer(Protocol):
    """A completion's refill, offered the slot its release frees (``sluice.launch.launcher``)."""

    def take(self, record: ExecutionRecord, room: bool) -> Claim | None:
        """The claim to hand the freed slot to, or None (asked once, before the release's write)."""
        ...

    def settled(self, claimed: bool) -> None:
        """The release committed, or did not; ``claimed``: with the successor in it."""
        ...


def handle_status_change(
    change: StatusChange,
    *,
    store: LaunchStore,
    queue: Queue,
    state_machine_arn: str,
    now: float,
    executions: Executions | None = None,
    outputs: Outputs | None = None,
) -> bool:
    """Apply one status-change event. True when it freed a slot."""
    released = settle_status_change(
        change,
        store=store,
        queue=queue,
        state_machine_arn=state_machine_arn,
        now=now,
        executions=executions,
        outputs=outputs,
    )
    return released is not None


def settle_status_change(
    change: StatusChange,
    *,
    store: LaunchStore,
    queue: Queue,
    state_machine_arn: str | Collection[str],
    now: float,
    executions: Executions | None = None,
    outputs: Outputs | None = None,
    effects: Effects | None = None,
    offer: Offer | None = None,
    window: float = CONSISTENCY_WINDOW_SECONDS,
    judge: str | None = None,
) -> ExecutionRecord | None:
    """Apply one status-change event. The released execution's record as it was (its ``shard`` is
    the slot freed), or None when the event freed nothing. ``state_machine_arn``: the stack's state
    machine, or every one it starts (the lanes' own too). ``offer``: see ``complete``. ``window``:
    the consistency window (``Settings.consistency_window_seconds``); ``judge``: the identity of
    the clock ``now`` is by (``young_adoption``)."""
    arns = {state_machine_arn} if isinstance(state_machine_arn, str) else set(state_machine_arn)
    if change.state_machine_arn not in arns:
        log.info(
            "event for another state machine ignored", extra={"state_machine_arn": change.state_machine_arn}
        )
        return None
    if not change.terminal:
        return None
    confirm = None
    if executions is not None:
        executions = _Described(executions)  # one DescribeExecution at most, whoever asks
        confirm = _both(
            _not_its_earlier_end(change, now, window, judge),
            _both(_ended_by_its_own_word(executions), _ended_at_this_events_stop(executions, change)),
        )
    released = complete(
        store=store,
        queue=queue,
        confirm=confirm,
        name=change.name,
        ending=Ending(
            PayloadState.after(change.status),
            now,
            error=change.error,
            cause=change.cause,
            ended_at=change.stop_date,
            started_at=change.start_date,
        ),
        output=_event_output(change, executions, outputs or Outputs()),
        effects=effects,
        offer=offer,
    )
    if released is None and change.status == ExecutionStatus.SUCCEEDED:
        output = _event_output(change, executions, outputs or Outputs())
        _later_success(change, store=store, queue=queue, now=now, output=output, effects=effects)
    return released


REDRIVABLE_ENDS = frozenset({PayloadState.FAILED, PayloadState.TIMED_OUT, PayloadState.ABORTED})


def _later_success(
    change: StatusChange,
    *,
    store: LaunchStore,
    queue: Queue,
    now: float,
    output: Callable[[ExecutionRecord], ReceiptOutput | None],
    effects: Effects | None,
) -> None:
    """A SUCCEEDED event that released nothing, of an execution whose record holds another end:
    redriven after its release, it ran again without a slot and ended before any
    reconciliation adopted it (or a late event of its earlier end released it first). No slot is
    freed; its success is written as its release would have written it (the key's
    ``succeeded_by`` for run-once and awaits, its effects sent and marked), and its waiters woken:

        e FAILED (t1), released    operator: redrive e    e SUCCEEDED (t2), event
        release(e): not held  ─►  read EXEC#e: FAILED at t1  ─►  send e's effects
        ─►  record_later_success (conditioned on EXEC#e FAILED at t1)  ─►  waiters on e's key

    A repeated event reads EXEC#e SUCCEEDED: nothing. Two at once: one write wins, and SQS drops
    the other's effect sends (same deduplication ids). A run-once message claimed between the
    redriven run's end and this write may run: the redrive was behind Sluice's back."""
    record = store.execution(change.name)
    ended_at = change.stop_date if change.stop_date is not None else now
    record_redriven_success(
        record, store=store, queue=queue, now=now, ended_at=ended_at, output=output, effects=effects
    )


def record_redriven_success(
    record: ExecutionRecord | None,
    *,
    store: LaunchStore,
    queue: Queue,
    now: float,
    ended_at: float,
    output: Callable[[ExecutionRecord], ReceiptOutput | None],
    effects: Effects | None,
) -> bool:
    """``record``'s execution SUCCEEDED (its event, or reconciliation's listing of redriven runs
    when that event was lost), while the record holds another end: write its success as
    ``_later_success`` says. False when there was nothing to write."""
    if record is None or record.state not in REDRIVABLE_ENDS:
        # Not ended, or SUCCEEDED already (a repeat). One run of an execution ends once, and only a
        # redrive makes a FAILED, TIMED_OUT or ABORTED execution SUCCEED: no clock is compared.
        return False
    state = PayloadState.SUCCEEDED
    keep = around(output, effects, store=store, queue=queue, name=record.name, state=state, now=now)
    receipt = keep(record) if keep is not None else None
    if not store.record_later_success(record=record, ended_at=ended_at, now=now, receipt=receipt):
        return False
    log.info(
        "success of a redriven run recorded after its release",
        extra={"execution_name": record.name, "payload_key": record.key},
    )
    on_receipt(store=store, queue=queue, key=record.key, now=now, succeeded_by=record.name)
    return True


def earlier_end(info: ExecutionInfo, record: ExecutionRecord | None) -> bool:
    """DescribeExecution says ``record``'s execution ended, with an end from before it ran again: the
    end its record already holds (a redriven run refused adoption), or the one it had before its
    adoption (``earlier_end_at``). DescribeExecution is eventually consistent, and within its
    staleness bound of a redrive it may still answer with that end (docs/protocol.md,
    "Staleness"): no proof that the run it has now ended. A new end has another stop date (Step
    Functions' own, to the millisecond), so no clock is compared with Sluice's. A SUCCEEDED answer
    is never one: Step Functions redrives only FAILED, TIMED_OUT and ABORTED executions, so a
    success is the last end, also of a run adopted on a stale listing (and by a reconciler whose
    clock runs ahead: explorer seed 111160034)."""
    if record is None or not info.ended:
        return False
    if before_its_redrive(info.stop_date, record):
        return True
    if info.status == "SUCCEEDED" or record.state is PayloadState.SUCCEEDED:
        return False  # (a SUCCEEDED execution cannot be redriven: its end is its last)
    return _same_stop(info.stop_date, record.ended_at) or _same_stop(info.stop_date, record.earlier_end_at)


def before_its_redrive(stop_date: float | None, record: ExecutionRecord) -> bool:
    """An end that stopped before the redrive ``record``'s run was adopted after (``redriven_at``,
    Step Functions' ``redriveDate``, compared with its own stop dates): never that run's end, however
    late it is read, also an end Sluice never recorded (explorer seed 1203230958)::

        p FAILED at s1, released      RedriveExecution: r1      p FAILED at s2 (its event frees nothing)
        RedriveExecution: r2          adopt(p) on RUNNING, redriveDate r2: earlier_end_at s1, redriven_at r2
        DescribeExecution (stale): FAILED at s2
            before: s2 is neither s1 nor the record's end → taken for p's end → p released, p runs
            now:    s2 < r2 → an earlier end: p still holds its slot and its key"""
    return stop_date is not None and record.redriven_at is not None and stop_date < record.redriven_at


def _same_stop(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and abs(a - b) < 0.002


def output_from(
    text: str | None, outputs: Outputs | None
) -> Callable[[ExecutionRecord], ReceiptOutput | None]:
    """What a release keeps of an output already in hand (DescribeExecution's)."""
    return lambda record: (outputs or Outputs()).keep(text)


def _event_output(
    change: StatusChange, executions: Executions | None, outputs: Outputs
) -> Callable[[ExecutionRecord], ReceiptOutput | None]:
    """The event's output; when the event left it out, DescribeExecution's (asked only for a
    SUCCEEDED run that is really released: a repeated event asks nothing)."""

    def keep(record: ExecutionRecord) -> ReceiptOutput | None:
        if change.output_known or executions is None or change.status != ExecutionStatus.SUCCEEDED:
            return outputs.keep(change.output)
        info = executions.describe(record.name, record.arn)
        return outputs.keep(info.output if info is not None else None)

    return keep


class _Described:
    """An ``Executions`` that asks DescribeExecution once per execution for one event."""

    def __init__(self, executions: Executions) -> None:
        self._executions = executions
        self._seen: dict[str, ExecutionInfo | None] = {}
        self.state_machine_arn = executions.state_machine_arn

    def describe(self, name: str, arn: str | None = None) -> ExecutionInfo | None:
        if name not in self._seen:
            self._seen[name] = self._executions.describe(name, arn)
        return self._seen[name]

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._executions, attr)


def _both(
    first: Callable[[ExecutionRecord], bool], second: Callable[[ExecutionRecord], bool]
) -> Callable[[ExecutionRecord], bool]:
    return lambda record: first(record) and second(record)


def _ended_at_this_events_stop(
    executions: Executions, change: StatusChange
) -> Callable[[ExecutionRecord], bool]:
    """An adopted execution that has ended again: the event must be of that end, not of its earlier
    run (its stop date is Step Functions' own, to the millisecond), or its receipt would be the
    earlier run's. Asked of adopted executions only."""

    def confirm(record: ExecutionRecord) -> bool:
        if change.stop_date is None:
            return True
        info = executions.describe(record.name, record.arn)
        if info is None or info.stop_date is None or abs(info.stop_date - change.stop_date) < 0.002:
            return True
        log.info(
            "event of an earlier end of a redriven execution ignored",
            extra={"execution_name": record.name},
        )
        return False

    return confirm


def _not_its_earlier_end(
    change: StatusChange, now: float, window: float, judge: str | None
) -> Callable[[ExecutionRecord], bool]:
    """An event with the stop date of the end an adopted execution had before its redrive is of
    that earlier run (late, or repeated): it releases nothing, and DescribeExecution is not asked,
    since within the staleness bound of the redrive it may still answer with that very end and
    confirm it. Asked of adopted executions only. So is an event of an end before the redrive the
    run was adopted after (``before_its_redrive``), recorded or not, and any end but a success
    within the window of the adoption (``young_adoption``). A SUCCEEDED event is the last end
    whatever its stop date otherwise (``earlier_end``: a success is never redriven), also of a run
    adopted on a stale listing."""

    def confirm(record: ExecutionRecord) -> bool:
        earlier = before_its_redrive(change.stop_date, record) or (
            change.status != "SUCCEEDED"
            and (
                _same_stop(change.stop_date, record.earlier_end_at)
                or young_adoption(record, now, window, judge)
            )
        )
        if not earlier:
            return True
        log.info(
            "event of an earlier run of a redriven execution ignored", extra={"execution_name": record.name}
        )
        return False

    return confirm


def young_adoption(record: ExecutionRecord, now: float, window: float, judge: str | None) -> bool:
    """``record`` was adopted, and the clock ``judge`` names (``now`` is by it) first saw the
    adoption less than two consistency windows ago (``OTHER_CLOCK_WINDOWS``), or never
    (``ExecutionRecord.adoption_seen``: the adopter's clock saw it at its adoption; reconciliation
    records each other clock's first sighting). No clock judges the age from another's stamp,
    whatever their skew (explorer seed 629934866: a reconciler an hour ahead judged an adoption two
    windows old at once). While young, an end other than a success, an event's or
    DescribeExecution's, may be from before the redrive it runs after, even one Sluice never
    recorded, and the adoption's own RUNNING answer may have been stale, its ``redriveDate`` an
    older redrive's (``tests/integration/test_redrive_date_attacks.py``)::

        e1 FAILED at s1, released;  redriven at r1;  FAILED at s2 (unrecorded);  redriven at r2
        adopt(e1) on a stale RUNNING answer (redriveDate r1): redriven_at r1, earlier_end_at s1
        DescribeExecution, or a late event: FAILED at s2 (after r1, not s1)
            before: taken for e1's end → released while it runs → a new claim of its key
            now:    the adoption is young → not proof; reconciliation judges it past the window

    The cost: a redriven run that ends other than in success keeps its slot until a reconciliation
    by a clock that saw its adoption two windows before (a completion handler's rarely has)."""
    if record.adopted_at is None:
        return False
    seen = record.seen_by(judge)
    return seen is None or now - seen < OTHER_CLOCK_WINDOWS * window


def _ended_by_its_own_word(executions: Executions) -> Callable[[ExecutionRecord], bool]:
    """An execution taken back after a redrive runs again under the same name: an event of its
    earlier run (late, or repeated) must not release it. Asked of adopted executions only, with the
    record the release reads anyway."""

    def confirm(record: ExecutionRecord) -> bool:
        info = executions.describe(record.name, record.arn)
        if info is not None and (not info.ended or before_its_redrive(info.stop_date, record)):
            log.info(
                "event of an earlier run of a redriven execution ignored",
                extra={"execution_name": record.name},
            )
            return False
        return True

    return confirm

"""The small interfaces domain code talks to. Adapters in ``sluice.adapters`` implement them.

Every method raises only ``sluice.core.errors`` exceptions: ``TransientError`` for throttling and
service faults, ``ConfigurationError`` for setup problems. Nothing here ever raises ``ClientError``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeVar, runtime_checkable

from sluice.core.limits import Ledger, LimitSource, MaxReading
from sluice.core.model import (
    Claim,
    ClaimFence,
    EffectsLog,
    Ending,
    ExecutionInfo,
    ExecutionRecord,
    HandOver,
    Message,
    ParkedMessage,
    PayloadRecord,
    Rooms,
    StartResult,
)
from sluice.core.records import Done, LaneRoom, LaneSetting, ReceiptOutput


class Clock(Protocol):
    identity: str  # the machine whose time it reads (sluice.core.clock)

    def now(self) -> float:
        """Seconds since the epoch."""
        ...


T = TypeVar("T")


class Fanout(Protocol):
    """Runs calls side by side (``sluice.primitives.fanout``): each call's value or ``Exception`` comes back in
    order; a ``BaseException`` propagates once every call has ended."""

    workers: int

    def each(self, calls: Sequence[Callable[[], T]]) -> list[Done[T]]: ...


class Queue(Protocol):
    """The main FIFO queue and its DLQ."""

    def receive(self, max_messages: int, wait_seconds: int) -> list[Message]: ...

    def delete(self, messages: Sequence[Message]) -> None:
        """Delete messages. A receipt that is no longer valid is not an error: it was handled."""
        ...

    def release(self, messages: Sequence[Message], delay_seconds: int = 0) -> None:
        """Make in-flight messages visible again after ``delay_seconds`` (best effort)."""
        ...

    def send_to_dlq(self, message: Message, reason: str, *, dedup: str | None = None) -> None:
        """Copy the message, body untouched, to the DLQ with ``reason`` attached.

        The caller deletes it from the main queue afterwards; a crash in between sends it again
        with the same deduplication id (its message id, or ``dedup``).
        """
        ...

    def requeue(self, parked: ParkedMessage) -> None:
        """Send a parked message back to the main queue, in its group, carrying its original id.

        A second send for the same holder within SQS's deduplication window is dropped; a later one
        arrives as a copy with the same original id, so the same execution name: it cannot run twice.
        """
        ...


class Executions(Protocol):
    """One Step Functions state machine."""

    state_machine_arn: str

    def arn_for(self, name: str) -> str: ...

    def start(self, name: str, input_json: str) -> StartResult:
        """Start ``name``. A name that exists already gives ``StartResult(already_existed=True)``."""
        ...

    def describe(self, name: str, arn: str | None = None) -> ExecutionInfo | None:
        """The execution, or ``None`` when Step Functions has never heard of it.

        ``arn``, when given, names it on the state machine it was claimed on (which may differ from
        the one the stack uses now).
        """
        ...

    def vanished(self, arn: str | None) -> bool:
        """Whether execution ``arn`` is on a state machine the stack no longer uses that Step
        Functions says does not exist (deleted after a switch)."""
        ...

    def list_running(self) -> set[str]:
        """Names of RUNNING executions. Eventually consistent: a fresh start may be missing."""
        ...

    def redriven_succeeded(self) -> dict[str, float | None]:
        """Executions redriven at least once that have SUCCEEDED, with their stop dates (the
        newest pages; eventually consistent). Reconciliation's way to a redriven run's success
        whose status event was lost (``sluice.launch.completion.record_redriven_success``)."""
        ...

    def check(self) -> None:
        """Raise ``ConfigurationError`` unless the state machine exists and may be used."""
        ...


def lane_executions(executions: Executions, lane: str) -> Executions:
    """The executions ``lane`` starts: of its own state machine when the adapter knows the lanes'
    (``StepFunctionsExecutions.for_lane``), else ``executions``."""
    for_lane = getattr(executions, "for_lane", None)
    return executions if for_lane is None else for_lane(lane)


def state_machine_arns(executions: Executions) -> tuple[str, ...]:
    """Every state machine the stack starts: the stack's, and the lanes' own."""
    return tuple(getattr(executions, "state_machine_arns", None) or (executions.state_machine_arn,))


class MaxSource(Protocol):
    def reading(self) -> MaxReading:
        """MAX as configured now (0 pauses admission), with when it was last changed."""
        ...


@runtime_checkable
class SlotPools(Protocol):
    """The launcher's slot pool and each lane's (``sluice.primitives.slots``): what a claimer reads before it
    receives, and the limit moves. The caps carry the limit: a claim (``PayloadLeases.claim``) obeys
    them at its write and passes no limit of its own."""

    def ledger(self) -> Ledger:
        """Every holder, the limit in force and reconciliation's figures, read consistently."""
        ...

    def look(self, shards: Sequence[int] | None = None) -> Ledger:
        """The cheap read admission makes before each receive, whatever MAX is: ``Ledger.free`` is
        exact for what was read, so a receive sized by it never outruns the slots. ``shards``: only
        those (the one a completion freed, ``ExecutionRecord.shard``). ``Ledger.complete`` says
        whether every holder was read."""
        ...

    def set_limit(self, source: LimitSource) -> int | None:
        """Put MAX − external in force in the slots, from ``source`` merged with the source of the
        limit in force (the newer MAX and the newer external count win: ``LimitSource.merged``).
        Never evicts a holder. Returns the limit in force after (``Ledger.in_force``). Contended
        when other writers kept moving the pool: nothing of ``source`` was written."""
        ...

    def lane_rooms(self, lanes: Sequence[str], *, whole: bool = False) -> dict[str, LaneRoom]:
        """Each lane's pool as read now (one read for all): limit in force, holders, free slots. A
        big lane may be read by a sample of its shards (``LaneRoom.complete`` False: ``free`` and
        ``running`` count the shards read) unless ``whole``."""
        ...

    def lane_settings(self, lanes: Sequence[str]) -> dict[str, LaneSetting]:
        """The operator's run-time settings of those lanes that have one."""
        ...

    def set_lane_limit(self, lane: str, limit: int, stamp: float) -> int | None:
        """Put ``limit`` in force in ``lane``'s pool, unless its limit in force has a newer stamp;
        never evicts a holder. The limit written, or None when refused."""
        ...

    def write_lane_setting(self, setting: LaneSetting) -> None:
        """Record the operator's run-time setting of a lane (``LANE#<name>``)."""
        ...

    def thaw_lane(self, lane: str) -> None:
        """Plan a frozen lane's caps again under its limit in force (``LaneRoom.frozen``): once its
        holders fit under the limit again, it admits again; until then it stays frozen."""
        ...


@runtime_checkable
class PayloadLeases(Protocol):
    """Per-payload leases, each taken and given back with a slot and the execution record in one
    write: there is never a slot without a lease or a lease without a slot. A claim names the
    capacity it draws on (the pool, ``lane``'s pool, ``ckey``'s cap) rather than a limit."""

    def claim(self, claim: Claim) -> None:
        """Take a slot and the payload's lease for ``claim.name``, under the limit in force at the write,
        and with ``ckey`` a slot of that concurrency key under its cap (``KeyFull`` when it has no
        room, or has waiters and ``ticket`` is None: ``sluice.features.keys``), and with ``lane`` a slot of
        that lane's pool under its caps (``SlotsFull`` when it has none: ``sluice.features.lanes``).
        ``fair_newcomer`` (a fair lane's new message, ``sluice.features.fair``): ``KeyFull`` while any key
        has waiters. ``uncapped`` (any claim from a fair lane): its key has no default cap.

        Raises ``LeaseHeld`` (with the existing record) when the payload's lease is live, including
        when ``name`` itself holds it, and ``SlotsFull`` when no slot is free (or no limit was ever
        put in force). With ``once`` (a run-once message), raises ``AlreadyDone`` when the key has
        SUCCEEDED already (``PayloadRecord.succeeded_by``), checked in the claim's own write.
        The claim carries its start mark (``mark_starting``), owned by ``copy_id`` (the SQS message
        id of the copy claiming): no ``block`` lands on it.
        """
        ...

    def renew(
        self,
        *,
        name: str,
        now: float,
        claim_expires_at: float,
        arn: str | None = None,
        copy_id: str | None = None,
    ) -> bool:
        """Re-take ``name``'s claim before resuming it: only while it is still ``CLAIMED``, and,
        with ``copy_id`` (the copy resuming), not while another copy's start mark is on it: that
        copy's invocation may be about to start it. The claim's copy is ``copy_id`` from then on.

        Moves its expiry, bumps its version and clears a reconciler's suspicion, so a release
        judged on the claim as it was fails; with ``arn``, records the execution it starts as now
        (the stack's state machine may have changed since the claim); lifts a start mark
        (``mark_starting``). False when it was released or has started meanwhile, when it was
        blocked (``block``), or when another copy's mark is on it.
        """
        ...

    def block(self, *, name: str, by: str, now: float) -> bool:
        """Stop ``name``'s unstarted claim from being started: ``by``, a redriven execution of the
        same key, runs. Only while ``name`` is ``CLAIMED`` and not marked starting
        (``mark_starting``); its renewals and start marks fail from now on."""
        ...

    def mark_starting(self, *, name: str, now: float, copy_id: str | None = None) -> bool:
        """A resumed claim's last write before StartExecution of ``name`` (a fresh claim is
        written marked): only while it is ``CLAIMED``, not blocked and, with ``copy_id``, last
        renewed by that copy. From then on ``block`` is refused, until a renewal (a later copy
        of the message, whose earlier copy's invocation has ended) lifts the mark. False when it was
        blocked, released, marked RUNNING or ended meanwhile: nothing may start."""
        ...

    def suspect(
        self, *, name: str, claim_version: int, reconciler: str, now: float, replacing: float | None = None
    ) -> bool:
        """Note that ``reconciler`` saw ``name`` CLAIMED and unstarted at ``now`` (its own clock).

        Only if the claim is still at ``claim_version`` and unmarked (or marked at ``replacing``).
        """
        ...

    def mark_running(self, *, key: str, name: str, arn: str, started_at: float, now: float) -> bool:
        """CLAIMED → RUNNING if ``name`` still holds the lease and has not ended. False otherwise.
        Reconciliation's, on DescribeExecution's word: the launcher writes no mark after a start."""
        ...

    def release(
        self,
        name: str,
        ending: Ending,
        *,
        fence: ClaimFence | None = None,
        confirm: Callable[[ExecutionRecord], bool] | None = None,
        output: Callable[[ExecutionRecord], ReceiptOutput | None] | None = None,
    ) -> ExecutionRecord | None:
        """Free ``name``'s slot and lease and record ``ending.state``; only if ``name`` holds them.

        ``ending.started_at``: when Step Functions says it started (the status event's,
        DescribeExecution's), kept on the execution record unless one is there already. An ended
        state is the key's
        receipt (``sluice.features.receipts``): the payload record names
        ``name`` as its receipt (and as ``succeeded_by`` on the key's first SUCCEEDED), and the
        execution record keeps what ``output`` (asked with the record, only when it is released)
        returns, all in the release's own write; with the effects it sent (``ReceiptOutput.effects``),
        the release writes ``EFFECTS#<name>`` in the same transaction.

        With ``fence``, only if the claim is still CLAIMED, unrenewed and marked as the fence says.
        With ``confirm``, an execution adopted after a redrive is released only if ``confirm``
        (asked with the record the release reads) says it has really ended.
        With ``ending.outcome_unknown`` (its execution vanished with its state machine), the execution,
        run-once or not, marks its key ``once_unknown`` (and ``once_by``: kept without expiry), so no
        run-once claim of the key passes until the mark is cleared (``sluice.features.receipts``).
        Returns the record as it was before, or ``None`` when nothing was released (a redelivered
        event, an execution Sluice did not start, a renewed claim): never a second slot. The
        record's ``awaited`` says whether a waiter ever parked on its key (then read its waiters).
        """
        ...

    def hand_over(
        self,
        name: str,
        ending: Ending,
        offer: Callable[[ExecutionRecord, bool], Claim | None],
        *,
        confirm: Callable[[ExecutionRecord], bool] | None = None,
        output: Callable[[ExecutionRecord], ReceiptOutput | None] | None = None,
    ) -> HandOver:
        """``release``, handing the slot it frees to a successor in the same write (a completion's
        refill). ``offer`` is asked once, with the record read and whether the freed slot can pass
        to a successor as it stands (a shard of the pool, which is neither frozen nor paused): a
        claim for that slot, or None. The successor takes exactly what a claim takes (its lease,
        its record, the freed slot under its shard's cap); where it cannot (its key held or the
        same as the ended run's, the cap lowered meanwhile, a claim that is not ``Claim.plain``),
        the release goes alone and the hand-over says so: the caller claims it its own way."""
        ...

    def record_later_success(
        self, *, record: ExecutionRecord, ended_at: float, now: float, receipt: ReceiptOutput | None
    ) -> bool:
        """A SUCCEEDED end, stopped at ``ended_at``, of ``record``'s execution, released before on an
        earlier end that ``record`` holds (FAILED, TIMED_OUT or ABORTED): redriven, it ran again
        without a slot or the lease, so none is freed. Written as its release would have: the record
        SUCCEEDED, the key's ``succeeded_by`` (``once_by`` too, kept without expiry, when a run-once
        message claimed it), the key's receipt when it is still this execution's (or the key has
        none: TTL took its record), its output and the mark of its effects (``receipt``). Only while
        the record holds the end it was read with; False otherwise (recorded by another, or adopted
        meanwhile), or with no key record left."""
        ...

    def adopt(
        self, *, name: str, now: float, redriven_at: float | None = None, by: str | None = None
    ) -> bool:
        """Take a slot and the lease back for an ended execution that runs again (a redrive).

        No limit applies: it runs already. False when the key's lease is held by another run.
        Lifts the key's ``redriven`` block. ``redriven_at``: Step Functions' ``redriveDate`` in the
        answer that showed it running (None: not reported), kept as the record's ``redriven_at``.
        ``by`` names the clock ``now`` is by (``Clock.identity``): the adoption's first sighting
        (``ExecutionRecord.adoption_seen``); no earlier adoption's sightings are kept.
        """
        ...

    def sight_adoption(self, *, record: ExecutionRecord, by: str, now: float) -> bool:
        """Record that the clock ``by`` names has seen ``record``'s adoption, ``now`` by that
        clock (read after ``record``): it judges the adoption's age from there
        (``sluice.launch.completion.young_adoption``). Only while the adoption read is the one held
        (its ``adopted_at`` and ``adoptions``), and once per clock and adoption; False otherwise."""
        ...

    def mark_redriven(self, *, key: str, name: str, now: float, by: str | None = None) -> bool:
        """``name``, a run of ``key`` redriven behind Sluice's back, was not adopted: another run
        holds the lease, or reconciliation is unsure it runs again. Until ``name`` is adopted or
        ``clear_redriven`` lifts the mark, no claim of ``key`` succeeds (it raises ``LeaseHeld``
        with the mark in the record). Only on a key with a record, and while ``name`` does not
        hold its lease. A key keeps a mark for each such run: the first in ``redriven``, any other
        (seen while that one is marked) in ``redriven_more``. A key's one mark is stamped ``now`` by
        clock ``by`` (``PayloadRecord.marks_age``): first on an unmarked key, and again by that clock
        at each sighting of its run; any other mark unstamps it."""
        ...

    def clear_redriven(self, *, key: str, name: str, as_read: PayloadRecord | None = None) -> bool:
        """Lift ``key``'s mark of ``name`` if it is still there (``name`` has ended, or was never
        found), whichever of the key's marks it is; the first (``redriven``) only while its stamp
        is the one ``as_read`` holds, if given (a sighting since keeps the mark)."""
        ...


@runtime_checkable
class Records(Protocol):
    """Payload and execution history: what each key and each run did, and reconciliation's figures.
    Live records never expire; a record gets its ``expires_at`` (the table's TTL) when its run ends."""

    def payload(self, key: str) -> PayloadRecord | None: ...

    def execution(self, name: str) -> ExecutionRecord | None: ...

    def executions(self, names: Iterable[str]) -> dict[str, ExecutionRecord]: ...

    def effects(self, name: str) -> EffectsLog | None:
        """The effects ``name``'s release sent (``EFFECTS#<name>``, ``sluice.features.effects``), or None
        when none were sent: written by the release whose ``output`` returned them, never removed
        by a later claim of the same name."""
        ...

    def record_duplicate(self, *, key: str, message_id: str, now: float) -> None: ...

    def first_sighting(self, *, key: str, message_id: str, receipt: str, now: float) -> bool:
        """Record that SQS message ``message_id`` of ``key`` was refused by a holder that may have
        ended (``sluice.launch.message_branches``), on the receive ``receipt`` names. True the first time,
        and again for the same ``receipt`` (a retried write); False when an earlier receive of the
        same message recorded it (that receive was at least the consistency window ago)."""
        ...

    def record_already_done(
        self, *, key: str, message_id: str, now: float, seen: PayloadRecord | None = None
    ) -> None:
        """Count a run-once message of a key that had SUCCEEDED already (``already_done``). ``seen``:
        the key's record as the refused claim read it. Read ``RELEASED`` with no holder (a claim
        dropped unstarted after the success was recorded), the key is settled at its receipt's end
        while still so: the message that claim was for is now done, and ``RELEASED`` would say it
        is retried or in the DLQ."""
        ...

    def record_invalid(self, *, key: str, reason: str, now: float) -> None: ...

    def next_count(self) -> int:
        """Number an external count about to be taken: one more than any before (atomic)."""
        ...

    def save_reconciliation(
        self, *, external: int, drift: int, now: float, count: int = 0, listed_after: int | None = None
    ) -> bool:
        """Save a reconciliation's figures: its external count merged with the saved one
        (``ExternalCount.merged``: the newer listing, or the larger count when the listings overlap),
        and its drift and time unless a count numbered higher was saved since (then False)."""
        ...


@runtime_checkable
class WaitingRoom(Protocol):
    """Deferred duplicates parked behind the execution that holds their key, woken when it ends
    (``sluice.features.parking``), and the waiting rooms' indexes reconciliation sweeps."""

    def park(self, parked: ParkedMessage) -> bool:
        """Park a message behind its holder. False when the holder is no longer live."""
        ...

    def parked_messages(self, holder: str, entries: Iterable[str]) -> list[ParkedMessage]:
        """Those of ``entries`` (``ParkedMessage.entry``) still waiting for ``holder``, oldest first."""
        ...

    def unpark(
        self, holder: str, entries: Iterable[str], *, woken: Sequence[ParkedMessage] = (), now: float
    ) -> None:
        """Of the entries a release read: mark the copies in ``woken`` (re-sent) woken, and take off
        ``holder``'s set every entry not waiting for it any more; never a copy parked since."""
        ...

    def parked_holders(self) -> frozenset[str]:
        """Executions that have messages parked behind them (reconciliation's sweep)."""
        ...

    def rooms(self) -> Rooms:
        """The waiting rooms' indexes in one read (reconciliation's sweeps)."""
        ...


class Store(SlotPools, PayloadLeases, Records, WaitingRoom, Protocol):
    """The launcher's store: slots, leases, records and the waiting room in one DynamoDB table.

    One adapter implements the four ports because a start composes them: a claim writes a slot
    shard, the payload's lease and the execution record in one transaction, and a release (or a
    completion's hand-over) gives them back the same way. Code that needs one of them takes that
    port (``sluice.features.effects`` reads ``Records``); ``tests/contract/test_ports_contract.py`` checks
    that both adapters implement each port and that ``Store`` has nothing outside them.
    """

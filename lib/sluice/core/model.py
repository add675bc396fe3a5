"""Records and outcomes. Everything here is immutable; stores return new values."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from sluice.core.names import named_entry


class ExecutionStatus(StrEnum):
    """A Step Functions execution's status, as DescribeExecution, ListExecutions and the status
    events report it. Not a payload state: ``PayloadState.after`` turns an end into one."""

    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    ABORTED = "ABORTED"
    PENDING_REDRIVE = "PENDING_REDRIVE"  # a redrive was accepted and has not started yet

    @classmethod
    def terminal(cls, status: str) -> bool:
        """The one definition of "ended": any text, so an unknown future status is not an end."""
        return status in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset(
    {ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED, ExecutionStatus.TIMED_OUT, ExecutionStatus.ABORTED}
)


class PayloadState(StrEnum):
    """Latest state of a payload (the ``state`` of its payload record)."""

    CLAIMED = "CLAIMED"  # lease and slot taken, StartExecution not yet confirmed
    RUNNING = "RUNNING"  # execution confirmed started
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    ABORTED = "ABORTED"
    RELEASED = "RELEASED"  # a claim was dropped without a start; the message is retried or dead-lettered
    INVALID = "INVALID"  # the message could not be run and went to the DLQ

    @property
    def holds_lease(self) -> bool:
        return self in (PayloadState.CLAIMED, PayloadState.RUNNING)

    @property
    def ended(self) -> bool:
        """An execution ran and ended."""
        return ExecutionStatus.terminal(self.value)

    @classmethod
    def after(cls, status: str) -> PayloadState:
        """The state a payload ends in when its execution ended with ``status`` (a terminal one)."""
        if not ExecutionStatus.terminal(status):
            raise ValueError(f"{status!r} is not a status an execution ends with")
        return cls(status)

    @property
    def redrivable(self) -> bool:
        """An operator may redrive it (RedriveExecution), for ``REDRIVE_WINDOW_SECONDS`` after it ended."""
        return self in (PayloadState.FAILED, PayloadState.TIMED_OUT, PayloadState.ABORTED)


# RedriveExecution accepts executions that ended unsuccessfully in the last 14 days. A redriven
# execution runs again under its old name, and only its execution record says which key it holds;
# so that record outlives the window, whatever the retention, with a day's margin.
REDRIVE_WINDOW_SECONDS = 14 * 86_400
REDRIVE_MARGIN_SECONDS = 86_400
# The payload queue keeps a message 14 days (MessageRetentionPeriod), and a run's message was sent
# before its run: the record of a name that ran (ended, or released as vanished) outlives every
# message of that name by the same margin, so its claim is refused (``AlreadyRan``) whatever
# ``retentionDays`` says.
QUEUE_RETENTION_SECONDS = 14 * 86_400


def record_expiry(state: PayloadState, *, now: float, retention_seconds: int, ran: bool = False) -> int:
    """When DynamoDB's TTL may delete an execution record released at ``now`` (``expires_at``).
    ``ran``: released as vanished (outcome unknown), so it may have run.

    Counted from the release, which comes after the end: a stop date from another clock never
    shortens it.
    """
    keep = retention_seconds
    if state.ended or ran:  # every redrivable end is one: the longer window of the two, and a day
        keep = max(keep, max(QUEUE_RETENTION_SECONDS, REDRIVE_WINDOW_SECONDS) + REDRIVE_MARGIN_SECONDS)
    return int(now) + keep


class Outcome(StrEnum):
    """What a launcher did with one received message."""

    STARTED = "started"  # new execution started, message deleted
    RESUMED = "resumed"  # redelivered message whose execution already runs: recorded, deleted
    ALREADY_RAN = "already_ran"  # redelivered message whose execution already ended: deleted
    DUPLICATE = "duplicate"  # another message of a payload whose lease is live: deleted, recorded
    DEFERRED = "deferred"  # same, under the defer policy: parked in the table, re-sent when the lease ends
    INVALID = "invalid"  # dead-lettered with a reason
    RETURNED = "returned"  # no slot after all (lost a race): made visible again, untouched
    # Refused by a live lease whose holder reads RUNNING on an answer that may be stale (its holder
    # may have ended just before it was sent): back in the queue for the consistency window, then
    # judged again (sluice.launch.message_branches); its group's later messages wait behind it.
    RECHECK = "recheck"
    INTERRUPTED = "interrupted"  # a transient AWS error stopped the tick; retried later
    ALREADY_DONE = "already_done"  # a run-once message whose key has SUCCEEDED already: deleted, recorded
    WAITING = "waiting"  # awaits keys that have not all SUCCEEDED: parked in the table, deleted (sluice.features.awaits)
    KEY_WAITING = (
        "key_waiting"  # its concurrency key is at its cap: parked in its line, deleted (sluice.features.keys)
    )


@dataclass(frozen=True, slots=True)
class Message:
    """One SQS message as the launcher sees it."""

    message_id: str
    receipt_handle: str
    body: str
    group_id: str = ""
    receive_count: int = 1
    attributes: dict[str, str] = field(default_factory=dict)
    # Attributes received without a string value (SQS's Binary), by name: their data types. Sluice
    # reads none of them, but a ``sluice-*`` one among them is refused (``sluice.features.attributes``).
    binary_attributes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Payload:
    """A validated message: its key and the exact body to use as execution input."""

    key: str
    body: str
    message: Message


@dataclass(frozen=True, slots=True)
class PayloadRecord:
    """Item ``PAYLOAD#<key>``: the payload's lease and its latest state."""

    key: str
    state: PayloadState
    holder: str | None = None  # execution name holding the lease; None when the lease is free
    executions: tuple[str, ...] = ()  # every execution name ever claimed for this key, oldest first
    attempts: int = 0
    duplicates: int = 0
    updated_at: float = 0.0
    expires_at: int = 0
    reason: str | None = None
    receipt: str | None = None  # the execution whose end is the key's receipt (the latest ended run)
    succeeded_by: str | None = None  # the first execution of this key that SUCCEEDED; never removed
    already_done: int = 0  # run-once messages acknowledged as already done (sluice.features.receipts)
    # How the receipt's run ended: ``state`` moves on (a later claim rolled back, an invalid message
    # of the key), but an awaits waiter judges the key by its latest *run* (sluice.features.awaits.judge).
    receipt_state: PayloadState | None = None
    # A run of this key redriven behind Sluice's back while another run held the lease, or that may
    # have been (sluice.launch.redriven): no claim until that run is adopted (it takes the lease) or
    # has ended.
    redriven: str | None = None
    # Further redriven runs of this key seen while ``redriven`` was set (a key keeps each one it
    # saw): no claim either until each is adopted or has ended.
    redriven_more: frozenset[str] = frozenset()
    # When the key's only mark was written or its run last seen, and by which clock
    # (``Clock.identity``): that clock alone may judge the mark's age from it; any other takes it
    # for young. Removed by a further mark, or a sighting by another clock.
    redriven_at: float | None = None
    redriven_by: str | None = None
    # The run-once execution whose success keeps this record without expiry (sluice.features.receipts): no
    # later write puts it back under TTL. Never removed. Also set by ``once_unknown``'s release.
    once_by: str | None = None
    # A run-once execution released with an unknown outcome (it vanished with its state machine):
    # no run-once claim of the key until the operator clears it (sluice.features.receipts).
    once_unknown: str | None = None

    def may_run_again(self, now: float | None) -> bool:
        """Whether a redriven mark of this key is young enough (``MARKED_RUN_HOLD_SECONDS``; any age
        when ``now`` is None) that its run may run again: an awaits waiter waits for it rather than
        judge the key by its earlier end (sluice.features.awaits.judge)."""
        marked = self.redriven is not None or bool(self.redriven_more)
        return marked and (now is None or now - self.updated_at < MARKED_RUN_HOLD_SECONDS)

    def sighting_moves_nothing(self, name: str) -> bool:
        """Whether ``name`` is marked on this key with no stamp: another sighting of its run changes
        nothing (a stamp removed stays removed until the mark is lifted or adopted)."""
        return name in self.redriven_more or (self.redriven == name and self.redriven_at is None)

    def marks_age(self, now: float, clock: str) -> float | None:
        """How old the key's mark is by ``clock`` reading ``now``: only if that clock stamped it, the
        key's only mark (``redriven_at``); None when unknown (another clock's stamp, or none)."""
        if self.redriven_by != clock or self.redriven_at is None or self.redriven_more:
            return None
        return now - self.redriven_at


# How long a redriven mark on a key holds an awaits waiter's verdict: three consistency windows as
# deployed, by which time a reconciliation past the window adopted the marked run if it runs. A mark
# left longer (the listing was only behind the end) no longer holds waiters.
MARKED_RUN_HOLD_SECONDS = 180.0


@dataclass(frozen=True, slots=True)
class ExecutionRecord:
    """Item ``EXEC#<name>``: one claim and, once started, one execution."""

    name: str
    key: str
    message_id: str
    state: PayloadState
    claimed_at: float
    claim_expires_at: float
    arn: str | None = (
        None  # recorded at the claim: the state machine it runs on, whatever the stack says later
    )
    started_at: float | None = None
    ended_at: float | None = None
    error: str | None = None
    cause: str | None = None
    expires_at: int = 0  # TTL; 0 while the claim or execution is live: live records never expire
    claim_version: int = 0  # bumped by every renewal of the claim: fences reconciliation's release
    suspect_since: float | None = None  # when a reconciler first saw the claim unstarted (its own clock)
    suspect_by: str | None = None  # which reconciler: only the one that marked it judges its age
    parked: frozenset[str] = frozenset()  # ParkedMessage.entry of each deferred duplicate waiting for it
    adopted_at: float | None = None  # ran again after its release (a redrive) and was taken back
    adoptions: int = 0  # how many times it was adopted (by this version): tells two adoptions apart
    # adopted: each clock that has seen an adoption (``Clock.identity``), the ``adopted_at`` it saw,
    # and when, by that clock (the adopter's first): a clock judges the age from its own sighting
    adoption_seen: tuple[tuple[str, float, float], ...] = ()
    earlier_end_at: float | None = None  # adopted: the stop date of the end before (Step Functions')
    redriven_at: float | None = None  # adopted: the redrive date of the run taken back (Step Functions')
    blocked_by: str | None = None  # an unstarted claim that must yield to a redriven run of its key
    starting_at: float | None = None  # the launcher's mark just before StartExecution: no block after it
    copy_id: str | None = None  # the SQS message id of the copy that claimed or last renewed: its mark's
    shard: int | None = None  # the slot shard it holds (None: claimed before the shards, in LEDGER)
    once: bool = False  # claimed by a run-once message (``sluice-once: true``)
    output: str | None = (
        None  # its output as JSON text, when at most the inline size (sluice.features.receipts)
    )
    output_ref: str | None = None  # else the pointer to it in the payload bucket, as JSON text
    output_size: int | None = None  # the output's size in bytes (None: it had none, or not ended)
    ckey: str | None = None  # its concurrency key (sluice.features.keys): the release frees a slot there too
    lane: str | None = None  # its lane (sluice.features.lanes), when the stack has lanes: a slot there too
    lane_shard: int | None = None  # the shard of its lane's pool it holds
    outcome_unknown: bool = (
        False  # released as vanished (sluice.launch.reconcile): it may have run; never claimed again
    )
    # Set only on the record a release returns: its key is flagged as awaited (a waiter parked on it
    # once, ``sluice.features.awaits``), so the release's wake-up reads the key's waiters; else it reads none.
    awaited: bool = False

    def seen_by(self, clock: str | None) -> float | None:
        """When the clock named ``clock`` first saw this adoption, by itself (None: never; a
        sighting of an earlier adoption, which an older version's adoption may have left, is not
        one of this)."""
        return next(
            (at for who, of, at in self.adoption_seen if who == clock and of == self.adopted_at), None
        )

    @property
    def fence(self) -> ClaimFence | None:
        """What a release of this unstarted claim must still find, or None if it is not suspect."""
        if self.suspect_since is None:
            return None
        return ClaimFence(self.claim_version, self.suspect_since)


@dataclass(frozen=True, slots=True)
class HandOver:
    """What a hand-over did: the record it released (None: released by someone else, or not
    holding), and whether the successor took the freed slot (else the release went alone)."""

    released: ExecutionRecord | None
    claimed: bool = False


# How long ``EFFECTS#<name>`` is kept: as long as Step Functions keeps a name from running again, so
# as long as any copy of a message that names that execution can come back (SQS keeps 14 days at most).
EFFECTS_RETENTION_SECONDS = 90 * 86_400


@dataclass(frozen=True, slots=True)
class EffectsLog:
    """Item ``EFFECTS#<name>``: the follow-up payloads (``sluice.features.effects``) an execution's output
    named, written once in the release that sent them. Its existence means "sent": nothing sends
    that execution's effects again."""

    name: str  # the execution whose output named them
    key: str  # its payload key
    count: int  # effects the output named (sent + rejected; the whole list when it was refused)
    sent: tuple[str, ...] = ()  # the keys of the effects sent, in the output's order
    rejected: tuple[tuple[int, str], ...] = ()  # (index, reason); index -1: the list as a whole
    sent_at: float = 0.0


@dataclass(frozen=True, slots=True)
class ClaimFence:
    """A CLAIMED record as its releaser last knew it: released only if unchanged since. Reconciliation
    gives the mark it judged (``suspect_since``); a launcher rolling back a claim of its own gives
    its version alone, so that a renewal by anyone else (a resume of the same name) fences it off."""

    claim_version: int
    suspect_since: float | None = None

    def holds(self, record: ExecutionRecord) -> bool:
        """``record`` is still the claim this fence was taken from."""
        return (
            record.state is PayloadState.CLAIMED
            and record.claim_version == self.claim_version
            and (self.suspect_since is None or record.suspect_since == self.suspect_since)
        )


@dataclass(frozen=True, slots=True)
class Claim:
    """What a claim asks of the store (``PayloadLeases.claim``): a slot and ``key``'s lease for ``name``."""

    key: str
    name: str
    message_id: str  # the message it runs (its origin's id: a re-sent copy keeps its name)
    now: float
    claim_expires_at: float
    arn: str | None = None  # the execution it will start
    once: bool = False  # a run-once message: refused once its key SUCCEEDED (AlreadyDone)
    ckey: str | None = None  # its concurrency key (sluice.features.keys), ``ticket`` when a wake sent it
    ticket: str | None = None
    lane: str | None = None  # its lane (sluice.features.lanes)
    fair_newcomer: bool = False  # refused while any concurrency key has waiters
    uncapped: bool = False  # its key has no default cap (a claim from a fair lane, sluice.features.fair)
    copy_id: str | None = None  # the SQS message id of the copy claiming: the owner of its start mark

    @property
    def plain(self) -> bool:
        """Neither keyed, laned nor fair: a claim a hand-over's one write can take (``hand_over``)."""
        unkeyed = self.ckey is None and self.ticket is None and self.lane is None
        return unkeyed and not (self.fair_newcomer or self.uncapped)


@dataclass(frozen=True, slots=True)
class Ending:
    """How a holding ended, as its release writes it down (``PayloadLeases.release``, ``hand_over``)."""

    state: PayloadState
    now: float
    error: str | None = None
    cause: str | None = None
    ended_at: float | None = None
    started_at: float | None = None  # when Step Functions says it started: kept unless one is there
    outcome_unknown: bool = False  # its execution vanished: a run-once one marks its key (receipts)


@dataclass(frozen=True, slots=True)
class ParkedMessage:
    """Item ``PARK#<entry>``: a deferred duplicate, out of the queue until its key is free."""

    message_id: str  # the original SQS message id: the re-sent copy keeps its execution name
    key: str
    holder: str  # the execution it waits for
    body: str
    group_id: str
    attributes: dict[str, str]
    parked_at: float
    # The SQS message id of the copy parked (``message_id`` is its origin's): a copy re-sent by a
    # wake-up and parked again is another copy, which that wake-up does not mark woken.
    copy_id: str = ""
    # Parked by an earlier version, under ``PARK#<message id>``: read and woken under that id.
    by_message_id: bool = False

    @property
    def entry(self) -> str:
        """Its id in the holder's ``parked`` set and its item's: by the name it runs under, a function
        of its key and its origin (``named_entry``). A producer's message of another key carrying the
        same ``sluice-origin-message-id`` is another message, with an item of its own."""
        return self.message_id if self.by_message_id else named_entry(self.key, self.message_id)


@dataclass(frozen=True, slots=True)
class Rooms:
    """The waiting rooms' indexes, as reconciliation reads them at once: the executions with deferred
    duplicates parked behind them, the parked awaits waiters, and the concurrency keys with a line."""

    parked_holders: frozenset[str] = frozenset()
    awaiting: frozenset[str] = frozenset()
    keys_waiting: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ExecutionInfo:
    """What Step Functions says about one execution."""

    name: str
    arn: str
    status: str
    start_date: float | None = None
    stop_date: float | None = None
    error: str | None = None
    cause: str | None = None
    output: str | None = None  # DescribeExecution's output (JSON text), when it ended with one
    redrive_count: int | None = None  # DescribeExecution's redriveCount; None when not reported
    redrive_date: float | None = None  # DescribeExecution's redriveDate: its last redrive

    @property
    def ended(self) -> bool:
        return ExecutionStatus.terminal(self.status)

    def not_redriven_since(self, ended_at: float | None) -> bool:
        """Step Functions says no redrive followed the end at ``ended_at``: a RUNNING answer for
        that run is then a stale one. Unknown (the fields not reported) is not proof either way."""
        if self.redrive_count == 0:
            return True
        if self.redrive_date is not None and ended_at is not None:
            return self.redrive_date <= ended_at
        return False


@dataclass(frozen=True, slots=True)
class StartResult:
    arn: str
    already_existed: bool = False  # ExecutionAlreadyExists: this name ran before

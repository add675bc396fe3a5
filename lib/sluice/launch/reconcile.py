"""Reconciliation: make the ledger agree with Step Functions without ever starting a duplicate.

Status events can be lost and ListExecutions is eventually consistent, so neither alone may free
a slot. A holder is only released on the word of DescribeExecution (asked by the ARN recorded at
its claim, so executions of a state machine the stack no longer uses are found too), and only once
its claim, start and adoption are older than the consistency window, the bound on how stale
DescribeExecution's answer may be (docs/protocol.md, "Staleness"):

    t0  read ledger H1          (holders)
    t1  ListExecutions → R      (RUNNING, may miss starts younger than the window), between two
                                numbers of LEDGER's counter: the external count's place in time
    t2  read ledger H2          (claims made during the listing are in H2, not in R)

    h in H1 − R, older than the window:
        DescribeExecution(h) ended        → release through the completion path
        DescribeExecution(h) RUNNING      → mark RUNNING if still CLAIMED
        DescribeExecution(h) absent       → CLAIMED: an unstarted claim, see below; RUNNING (it was
                                            seen running, so absent means its state machine was
                                            deleted), or CLAIMED on a machine switched from and
                                            deleted (it may have run there): release through the
                                            completion path, the outcome unknown
    r in R − H2:
        its record ended or released      → DescribeExecution(r): RUNNING again (a redrive) →
                                            adopt: it takes its slot and lease back; if another run
                                            of its key holds the lease, it counts as external
        no record                         → external: occupies the state machine, so admission
                                            uses limit = MAX − external: the caps move to it
                                            before the count is saved, so by the time anyone can
                                            read the new count, the caps already obey it. A
                                            count replaces the one in force only if its listing
                                            began after that one was numbered; listings that
                                            overlap keep the larger count (sluice.core.external)
    drift = judged holders missing from R + R − H2 (not the listing's lag) → LedgerDrift metric

An unstarted claim is released in two sightings, each by this reconciler's own clock, so no clock
has to agree with the claimer's:

    sighting 1   DescribeExecution: absent → suspect(h, version v): suspect_since = t, by me
    sighting 2   t + claim timeout later, still absent, still version v, marked by me →
                 release(h) IF CLAIMED AND version v AND suspect_since t

A launcher that still holds the claim either started it within its own timeout (shorter than the
claim timeout: sighting 2 then sees it) or, resuming it, renewed it first: the version moved and the
release fails. A mark left by another reconciler is taken over only once it is a whole claim
timeout old by this reconciler's clock.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass

from sluice.core.errors import ConfigurationError, TransientError
from sluice.core.external import ExternalCount
from sluice.core.limits import LimitSource
from sluice.core.model import ClaimFence, Ending, ExecutionInfo, ExecutionRecord, PayloadState
from sluice.core.ports import Clock, Executions, MaxSource, Queue, Store, state_machine_arns
from sluice.features.awaits import sweep as sweep_awaits
from sluice.features.effects import Effects
from sluice.features.keys import sweep as sweep_keys
from sluice.features.parking import sweep
from sluice.features.receipts import Outputs
from sluice.features.stores import LaunchStore
from sluice.launch.completion import before_its_redrive, complete, output_from, young_adoption
from sluice.launch.redriven import Pass, count_unknown, redriven_successes
from sluice.launch.settings import Settings

log = logging.getLogger("sluice.reconcile")


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    holders: int
    running: int
    external: int
    drift: int
    released: int
    confirmed_running: int
    adopted: int = 0
    woken: int = 0


def reconcile(
    *,
    store: LaunchStore,
    executions: Executions,
    queue: Queue,
    clock: Clock,
    settings: Settings,
    reconciler: str,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
    max_source: MaxSource | None = None,
    outputs: Outputs | None = None,
    effects: Effects | None = None,
) -> ReconcileReport:
    logger = logger or log
    before = store.ledger()  # read consistently, with LEDGER's counter
    h1 = before.holders
    # The external count is ordered by its listing, numbered on both sides (sluice.core.external): every
    # count numbered below ``listed_after`` was numbered before this read, so before the listing.
    listed_after = before.numbered + 1
    running = executions.list_running()
    count = store.next_count()
    h2 = store.ledger().holders
    now = clock.now()
    p = Pass(store, executions, queue, settings, reconciler, now, logger, outputs, effects, clock)

    missing = h1 - running
    unknown_running = running - h2
    records = store.executions(missing | unknown_running)
    released, confirmed, judged = _judge_missing(p, missing, records)
    external, adopted = count_unknown(p, unknown_running, records, running)
    redriven_successes(p)
    woken = _sweep_rooms(p)
    drift = judged + external + adopted
    counted = ExternalCount(external, count, listed_after)
    # A saved count says the caps carry it: with MAX unreadable the caps stay, and so does the count
    # in force (a completion's refill admits by the caps; the next reconciliation lists again).
    if max_source is None or _caps_for(store, max_source, counted, logger):
        store.save_reconciliation(
            external=external, drift=drift, now=now, count=count, listed_after=listed_after
        )
    report = ReconcileReport(
        holders=len(h2),
        running=len(running),
        external=external,
        drift=drift,
        released=released,
        confirmed_running=confirmed,
        adopted=adopted,
        woken=woken,
    )
    logger.info("reconciled", extra={"reconcile": asdict(report)})
    return report


def _judge_missing(
    p: Pass, missing: AbstractSet[str], records: Mapping[str, ExecutionRecord]
) -> tuple[int, int, int]:
    """The holders the listing did not show, each judged by DescribeExecution once its claim, start
    and adoption are older than the consistency window. Returns (released, confirmed running,
    judged)."""
    released = confirmed = judged = 0
    for name in sorted(missing):
        record = records.get(name)
        if record is None:
            p.logger.error("ledger holder without an execution record", extra={"execution_name": name})
            continue
        # Its claim, its start, or its adoption (a redrive, by this clock's sighting of it):
        # DescribeExecution may still answer as before any of them (docs/protocol.md,
        # "Staleness"), ListExecutions too.
        seen_at = record.started_at or record.claimed_at
        window = p.settings.consistency_window_seconds
        if young_adoption(record, p.now, window, p.reconciler):
            _sight_adoption(p, record)
            continue  # an adoption not yet two windows old since this clock first saw it
        if p.now - seen_at < window:
            continue  # too young: ListExecutions may not show it yet
        judged += 1
        freed, marked = _judge(p, name, record)
        released += freed
        confirmed += marked
    return released, confirmed, judged


def _sight_adoption(p: Pass, record: ExecutionRecord) -> None:
    """An adoption this clock has not seen yet is seen now (``Store.sight_adoption``): this clock
    judges its age from that sighting only, never from another clock's stamp, whatever their skew
    (``young_adoption``). Each clock keeps its own first sighting, so containers taking turns
    never restart one another's count::

        A adopts e1 at a (A's clock), then is gone     B (an hour ahead) sees it: b (B's clock)
        B judges e1 at b + 2w, by B's clock: two windows have passed since the adoption
    """
    if record.adopted_at is not None and record.seen_by(p.reconciler) is None:
        # the clock read after the record: the adoption it shows came before, so the sighting never
        # predates it (the pass's ``now`` was read before the records)
        p.store.sight_adoption(record=record, by=p.reconciler, now=p.clock.now())


# A Standard execution runs at most a year, and Step Functions keeps a closed one 90 days: a run
# seen running that reads as missing on a machine that still exists, later than that, is gone.
HISTORY_KEPT_SECONDS = (366 + 90) * 86_400


def _judge(p: Pass, name: str, record: ExecutionRecord) -> tuple[int, int]:
    """One holder past the window, by DescribeExecution's word. Returns (released, marked running)."""
    try:
        info = p.executions.describe(name, record.arn)
    except ConfigurationError as exc:
        if any(_on(record.arn, arn) for arn in state_machine_arns(p.executions)):
            raise
        # A holder of a state machine the stack no longer uses, which this role may not ask
        # about (previousStateMachineArn unset): it stays drift; the tick goes on.
        p.logger.error(
            "cannot describe a holder of another state machine",
            extra={"execution_name": name, "arn": record.arn, "error": str(exc)},
        )
        return 0, 0
    if info is None:
        vanished = p.executions.vanished(record.arn)
        if record.state is PayloadState.CLAIMED and not vanished:
            return _settle_unstarted(
                p.store, p.queue, record, p.now, p.reconciler, p.settings.claim_timeout_seconds
            ), 0
        if not vanished and p.now - (record.started_at or record.claimed_at) < HISTORY_KEPT_SECONDS:
            # Seen running, on a machine that exists: an answer from before its start (a reconciler
            # whose clock runs ahead judges a young holder); asked again next tick. Only a deleted
            # machine, or Step Functions' retention, takes an execution away.
            p.logger.warning(
                "holder seen running reads as missing; asked again", extra={"execution_name": name}
            )
            return 0, 0
        return _release_vanished(p.store, p.queue, record, p.now, p.logger), 0
    if info.ended and _its_end(info, record):
        _release_ended(p, name, info)
        return 1, 0
    if info.ended:
        return 0, 0  # an end from before its adoption (a stale answer): it runs; asked again later
    if record.state is PayloadState.CLAIMED:
        p.store.mark_running(
            key=record.key, name=name, arn=info.arn, started_at=info.start_date or p.now, now=p.now
        )
        return 0, 1
    return 0, 0


def _release_ended(p: Pass, name: str, info: ExecutionInfo) -> None:
    """A holder whose run ended, by DescribeExecution's word: released as its lost event would."""
    window = p.settings.consistency_window_seconds
    complete(
        store=p.store,
        queue=p.queue,
        # Judged again on the record the release reads: the run may have been released, redriven
        # and adopted since this pass read it (explorer seed 1503073754)::
        #
        #     reconciler B                          meanwhile
        #     DescribeExecution(e1): FAILED at s1
        #     release: reads EXEC#e1, not adopted   e1 released on its event; redriven at r1 > s1;
        #                                           reconciler C adopts it (slot and lease back)
        #     write IF not adopted  ✗, reads again
        #     before: released on s1 → e1 runs with no slot, and a claim takes it
        #     now: s1 is before its redrive (and the adoption is young): nothing released
        confirm=lambda read: not young_adoption(read, p.now, window, p.reconciler) and _its_end(info, read),
        name=name,
        ending=Ending(
            PayloadState.after(info.status),
            p.now,
            error=info.error,
            cause=info.cause,
            ended_at=info.stop_date,
            started_at=info.start_date,
        ),
        output=output_from(info.output, p.outputs),
        effects=p.effects,  # an end whose event was lost: its effects go now (sluice.features.effects)
    )


def _sweep_rooms(p: Pass) -> int:
    """The three waiting rooms swept (parked duplicates, awaits, key lines). Returns how many
    parked messages were woken."""
    rooms = p.store.rooms()  # the three waiting rooms' indexes, in one read
    woken = sweep(store=p.store, queue=p.queue, now=p.now, holders=rooms.parked_holders)
    sweep_awaits(
        store=p.store,
        queue=p.queue,
        now=p.now,
        horizon=p.settings.await_horizon_seconds,
        ids=rooms.awaiting,
    )
    sweep_keys(
        store=p.store,
        queue=p.queue,
        now=p.now,
        ckeys=rooms.keys_waiting,
        fair_lanes=[lane.name for lane in p.settings.lanes if lane.fair],  # their wakers wake them
    )
    return woken


def _its_end(info: ExecutionInfo, record: ExecutionRecord) -> bool:
    """Whether an end DescribeExecution gives for a holder judged past the staleness bound (its
    claim and start older than the consistency window, its adoption two) is that holder's end. Even
    the stop date it had before its adoption (``earlier_end_at``): a real redrive came before the
    adoption that saw it, so an answer a window after the adoption can no longer be older than it.
    That end then means the adoption took a stale RUNNING answer, and the run ended long ago::

        p FAILED at s1, released     ListExecutions + DescribeExecution (stale): p RUNNING
        adopt(p): earlier_end_at s1  a window later: DescribeExecution(p) FAILED at s1 → release

    Before then the holder is not judged at all (``_judge_missing``), so a stale end is never
    taken for the end of a redriven run. An end before the redrive it was adopted after is never
    its end (``before_its_redrive``): the answer is stale, whenever it is read."""
    return info.ended and not before_its_redrive(info.stop_date, record)


def _settle_unstarted(
    store: LaunchStore,
    queue: Queue,
    record: ExecutionRecord,
    now: float,
    reconciler: str,
    claim_timeout: float,
) -> int:
    """Sighting 1 marks the claim; sighting 2, a claim timeout later by the same clock, releases it."""
    fence = record.fence
    if fence is None:
        store.suspect(name=record.name, claim_version=record.claim_version, reconciler=reconciler, now=now)
        return 0
    age = now - fence.suspect_since
    if record.suspect_by != reconciler:
        if age >= claim_timeout:  # its marker is gone (a new container): mark it as ours
            store.suspect(
                name=record.name,
                claim_version=record.claim_version,
                reconciler=reconciler,
                now=now,
                replacing=fence.suspect_since,
            )
        return 0
    if age < claim_timeout:
        return 0
    done = complete(
        store=store,
        queue=queue,
        name=record.name,
        ending=Ending(PayloadState.RELEASED, now, error="claim abandoned: no execution was ever started"),
        fence=fence,
    )
    return int(done is not None)


def _release_vanished(
    store: LaunchStore,
    queue: Queue,
    record: ExecutionRecord,
    now: float,
    logger: logging.Logger | logging.LoggerAdapter,
) -> int:
    """A holder past the staleness bound that Step Functions once said runs (marked RUNNING, or
    adopted) and now says does not exist: its state machine was deleted (after a switch), and with
    it the execution, which had ended. Or a claim on a machine switched from and deleted: it may
    have started there (a start's answer lost, a launcher dead after it), and nothing can start
    there any more. Released through the completion path with the reason: its outcome is unknown,
    so it is recorded as released, not as an end. It marks its key ``once_unknown``, run-once
    holder or not: it may have SUCCEEDED, so no run-once message of the key runs by itself after
    it (``sluice.features.receipts``).

    A claim is released fenced by its version: a launcher resuming it asks Step Functions first and
    dead-letters it (``MachineVanished``) without renewing it; one that had renewed it (moved it to
    the machine in use, before the deletion was visible to it) bumped the version, and the release
    fails::

        launcher L (resumes c)                   reconciler R
        describe(c on M1): absent, M1 exists
                                                 read c (CLAIMED, M1, version v)
                                                 describe(c): absent; M1 deleted
        renew(c): version v+1, arn on M2
                                                 release(c) IF version v   ✗ (L starts it on M2)
    """
    logger.warning(
        "holder's execution does not exist in Step Functions; released",
        extra={"execution_name": record.name, "arn": record.arn},
    )
    claimed = record.state is PayloadState.CLAIMED
    done = complete(
        store=store,
        queue=queue,
        name=record.name,
        ending=Ending(
            PayloadState.RELEASED,
            now,
            error=f"execution {record.arn or record.name} does not exist in Step Functions (its state machine was deleted?)",
            outcome_unknown=True,
        ),
        fence=ClaimFence(record.claim_version) if claimed else None,
    )
    return int(done is not None)


def _on(execution_arn: str | None, state_machine_arn: str) -> bool:
    """Whether an execution ARN belongs to ``state_machine_arn`` (unknown: assume it does)."""
    if not execution_arn:
        return True
    machine = state_machine_arn.split(":")[6:7]
    return execution_arn.split(":")[6:7] == machine


def _caps_for(
    store: Store,
    max_source: MaxSource,
    counted: ExternalCount,
    logger: logging.Logger | logging.LoggerAdapter,
) -> bool:
    """Move the caps to MAX − the external count just taken, before it is saved (merged with the
    count in force: the newer listing, or the larger count when the two listings overlap). False
    when MAX could not be read: nothing moved."""
    try:
        reading = max_source.reading()
    except TransientError as exc:
        # Admission reads MAX again before its first receive, and ends the tick if it still cannot.
        logger.warning("caps not moved: MAX could not be read", extra={"error": str(exc)})
        return False
    source = LimitSource(
        reading.value,
        reading.changed_at,
        counted.external,
        counted.count,
        reading.version,
        counted.listed_after,
    )
    # Contended goes up, the count unsaved: a saved count the caps lack is undone by the next
    # overlapping listing, which merges with the pool alone (explorer seed 1398629532), and this
    # tick, knowing more than the caps, starts nothing (``Launcher.tick``).
    store.set_limit(source)
    return True

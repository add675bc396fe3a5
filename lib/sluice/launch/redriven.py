"""Reconciliation's side of runs redriven behind Sluice's back (RedriveExecution by an operator):
a listed run whose record ended is adopted when it runs again (``count_unknown``, ``ran_again``),
its key held for it when another run holds it or the redrive is unsure (``hold_for_redriven``),
and a redriven run that SUCCEEDED unheard has its success written (``redriven_successes``).
``Pass``: what one reconciliation works with (``sluice.launch.reconcile``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from enum import StrEnum

from sluice.core.errors import ConfigurationError
from sluice.core.model import ExecutionInfo, ExecutionRecord, ExecutionStatus
from sluice.core.ports import Clock, Executions, Queue, Store
from sluice.features.effects import Effects
from sluice.features.receipts import Outputs
from sluice.features.stores import LaunchStore
from sluice.launch.completion import REDRIVABLE_ENDS, earlier_end, output_from, record_redriven_success
from sluice.launch.settings import Settings


@dataclass(frozen=True, slots=True)
class Pass:
    """What one reconciliation works with, and when it runs."""

    store: LaunchStore
    executions: Executions
    queue: Queue
    settings: Settings
    reconciler: str
    now: float
    logger: logging.Logger | logging.LoggerAdapter
    outputs: Outputs | None
    effects: Effects | None
    clock: Clock  # ``now`` is its reading at the pass's start; a write that must follow a read reads it again


def count_unknown(
    p: Pass,
    unknown_running: AbstractSet[str],
    records: Mapping[str, ExecutionRecord],
    running: set[str],
) -> tuple[int, int]:
    """The listed runs the ledger does not hold: a redrive of one that ended is adopted (or its key
    held for it); the rest are external. Returns (external, adopted)."""
    external = adopted = 0
    for name in sorted(unknown_running):
        record = records.get(name)
        if record is not None and not record.state.holds_lease:
            info = p.executions.describe(name, record.arn)
            rerun = listed_again(p, info, record)
            if rerun is Rerun.ENDED:
                continue  # ended and released; the listing is behind
            # Running again although it ended (an operator's RedriveExecution): it holds a slot
            # and its key again, so nothing new starts beside it. Unsure: its key is held for it
            # (no slot), and it counts against MAX.
            if rerun is Rerun.AGAIN and p.store.adopt(
                name=name, now=p.now, redriven_at=info.redrive_date, by=p.reconciler
            ):
                adopted += 1
                p.logger.warning(
                    "execution running again; slot and lease taken back", extra={"execution_name": name}
                )
                continue
            if rerun is not Rerun.OTHER:
                hold_for_redriven(p.store, record.key, name, running, p.clock, p.logger)
        external += 1
    return external, adopted


def listed_again(p: Pass, info: ExecutionInfo | None, record: ExecutionRecord) -> Rerun:
    """A run its record says ended, listed RUNNING and described as ``info``. "No such execution"
    for a run its record says started is an answer from a view older than the run: unsure, as any
    answer the window may still turn (explorer seed 1204130804):

        p2 FAILED;  RedriveExecution(p2);  the FAILED event releases p2
        reconciliation: listed RUNNING; DescribeExecution: no such execution (a view before p2)
            before: "the listing is behind" → p2 runs uncounted → a claim takes its slot: MAX + 1
            now:    UNSURE → p2 counts against MAX, its key held for it

    Unless the record's state machine is deleted (a switch): its run went with it, so the one
    listed is another execution of its name on a machine the stack uses now, counted against MAX,
    its key not held (a mark, seen again at every pass, would hold it while that one runs)."""
    if info is not None:
        return ran_again(p, info, record)
    try:
        return Rerun.OTHER if p.executions.vanished(record.arn) else Rerun.UNSURE
    except ConfigurationError:
        return Rerun.UNSURE  # a state machine this role may not ask about: as any unsure answer


class Rerun(StrEnum):
    """Whether a run its record says ended, listed RUNNING, runs again (``ran_again``)."""

    AGAIN = "again"  # redriven: adopt it
    ENDED = "ended"  # the listing is behind its end
    UNSURE = "unsure"  # within the window of its end, either answer may be the stale one
    OTHER = "other"  # its machine deleted: the listed run is another execution of its name


def ran_again(p: Pass, info: ExecutionInfo, record: ExecutionRecord) -> Rerun:
    """Whether a run its record says ended, listed RUNNING, runs again (a redrive). Both answers
    may be stale by up to S (docs/protocol.md, "Staleness"): a listing just after the end still
    shows it RUNNING, and a DescribeExecution just after a redrive still gives the end before it
    (with no redrive reported). Where they disagree, the age of the end decides: a listing taken
    the window after the end cannot be behind it, so the run ran again, and adopting it keeps its
    key from a second run (explorer seed 818180473):

        e1 of k ABORTED at s, released          … the window passes …      RedriveExecution(e1)
        reconciliation: listed RUNNING; DescribeExecution: ABORTED at s (stale)
            before: "the listing is behind" → claim(k) free → k runs twice
            now:    the end is the window old → adopt(e1) → claim(k) finds e1

    Within the window (by this clock, which may run behind Step Functions') either may be the
    stale one: UNSURE. Adopting would hold a slot for each end a listing lags behind (common);
    the key is marked instead (``hold_for_redriven``), which holds only its claims, and those for
    two windows of the mark (``MessageBranches._still_runs``):

        e1 of k ABORTED at s, released;  RedriveExecution(e1) at s + 20
        reconciliation at s + 25: listed RUNNING; DescribeExecution: ABORTED at s (stale)
            before: left to the next pass → claim(k) free → k runs twice
            now:    UNSURE → mark k: e1 → claim(k) ✗ (marked) → e1 may run: adopt(e1)

    A clock ahead adopts a run that ended: it holds its slot until a pass past the adoption's
    window releases it."""
    if info.ended and not earlier_end(info, record):
        if ExecutionStatus.SUCCEEDED in (info.status, record.state.value) or info.stop_date is None:
            return Rerun.ENDED  # a success is its last end: the listing is behind it
        # A new end, after a redrive Sluice never adopted, which it never recorded. The window
        # after it, the listing cannot be behind it: the answer is the stale one, and the run ran
        # again since. Within it, either may be: UNSURE, as for the end it recorded (below).
        if p.now - info.stop_date >= p.settings.consistency_window_seconds:
            return Rerun.AGAIN
        return Rerun.UNSURE
    if not info.ended and not info.not_redriven_since(record.ended_at):
        return Rerun.AGAIN  # RUNNING, a redrive after its end reported or not ruled out
    if record.state not in REDRIVABLE_ENDS or record.ended_at is None:
        return Rerun.ENDED  # (a success is its last end: never redriven)
    if p.now - record.ended_at >= p.settings.consistency_window_seconds:
        return Rerun.AGAIN
    return Rerun.UNSURE


def hold_for_redriven(
    store: Store,
    key: str,
    redriven: str,
    running: set[str],
    clock: Clock,
    logger: logging.Logger | logging.LoggerAdapter,
) -> None:
    """``redriven`` runs again, or may (``Rerun.UNSURE``), and is not adopted (another run holds
    its key's lease, or it is unsure), so it counts as external.

    The key is marked: no new claim may take the lease beside the redriven run, now or when that
    holder ends; the next claim adopts it instead (or lifts the mark once it has ended)::

        reconcile: adopt(R) ✗ (H holds)  → mark_redriven(k, R)
        H ends → lease free              → claim(k) ✗ LeaseHeld(redriven=R) → R running: adopt(R)
                                            (R ended: clear_redriven) → look again

    If the holder's claim has not started (not listed), it must not start now either: its launcher,
    resuming, finds it blocked and yields."""
    payload = store.payload(key)
    holder = payload.holder if payload is not None else None
    if payload is None or holder == redriven:
        return
    if not payload.sighting_moves_nothing(redriven):
        # Marked, or its stamp moved, at every sighting, by this clock read now, after the listing
        # that showed the run (the pass's start may precede a redrive that listing saw). A stamp
        # left at an earlier sighting would let a claim judge the mark old and believe a stale end
        # from before a redrive seen since (a claim on the stamping clock, seconds after it).
        store.mark_redriven(key=key, name=redriven, now=clock.now(), by=clock.identity)
    if holder is None or holder in running:
        return
    if store.block(name=holder, by=redriven, now=clock.now()):
        logger.warning(
            "unstarted claim blocked: a redriven run of its key runs",
            extra={"execution_name": holder, "redriven": redriven},
        )


def redriven_successes(p: Pass) -> int:
    """Redriven runs that SUCCEEDED while Sluice did not hold them (redriven after their release,
    ended before any reconciliation listed them RUNNING) and whose status event was lost: their
    records still hold the earlier end. Their success is written as the event would have written
    it (``record_redriven_success``). Returns how many. A success already written, or a record
    gone with TTL, costs the read alone."""
    listed = p.executions.redriven_succeeded()
    if not listed:
        return 0
    written = 0
    for name, record in sorted(p.store.executions(set(listed)).items()):
        if record.state not in REDRIVABLE_ENDS:
            continue
        info = p.executions.describe(name, record.arn)
        if info is None or info.status != ExecutionStatus.SUCCEEDED:
            continue  # a listing ahead of a stale answer: the next pass asks again
        stopped = listed[name] or info.stop_date or p.now
        output = output_from(info.output, p.outputs)
        written += record_redriven_success(
            record,
            store=p.store,
            queue=p.queue,
            now=p.now,
            ended_at=stopped,
            output=output,
            effects=p.effects,
        )
    return written

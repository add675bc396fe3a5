"""Reconciliation: make the ledger agree with Step Functions without ever starting a duplicate.

Status events can be lost and ListExecutions is eventually consistent, so neither alone may free
a slot. A holder is only released on the word of DescribeExecution (consistent), and only once it
is older than the consistency window:

    t0  read ledger H1          (holders)
    t1  ListExecutions → R      (RUNNING, may miss starts younger than the window)
    t2  read ledger H2          (claims made during the listing are in H2, not in R)

    h in H1 − R, older than the window:
        DescribeExecution(h) ended        → release through the completion path
        DescribeExecution(h) absent       → release once its claim has expired
                                            (the launcher that claimed it is gone: its timeout
                                            is shorter than the visibility timeout, which is
                                            shorter than the claim)
        DescribeExecution(h) RUNNING      → mark RUNNING if still CLAIMED
    r in R − H2 not known to have ended   → external: occupies the state machine, so admission
                                            uses limit = MAX − external
    drift = |H1 − R| + |R − H2|           → logged and returned for the LedgerDrift metric
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from sluice.completion import complete
from sluice.model import PayloadState
from sluice.ports import Clock, Executions, Store

log = logging.getLogger("sluice.reconcile")


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    holders: int
    running: int
    external: int
    drift: int
    released: int
    confirmed_running: int


def reconcile(
    *,
    store: Store,
    executions: Executions,
    clock: Clock,
    consistency_window: float,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
) -> ReconcileReport:
    logger = logger or log
    h1 = store.ledger().holders
    running = executions.list_running()
    h2 = store.ledger().holders
    now = clock.now()

    missing = h1 - running
    unknown_running = running - h2
    records = store.executions(missing | unknown_running)

    released = confirmed = 0
    for name in sorted(missing):
        record = records.get(name)
        if record is None:
            logger.error("ledger holder without an execution record", extra={"execution_name": name})
            continue
        seen_at = record.started_at or record.claimed_at
        if now - seen_at < consistency_window:
            continue  # too young: ListExecutions may not show it yet
        info = executions.describe(name)
        if info is None:
            if record.state is PayloadState.CLAIMED and now >= record.claim_expires_at:
                complete(
                    store=store,
                    name=name,
                    state=PayloadState.RELEASED,
                    now=now,
                    error="claim expired and no execution was ever started",
                )
                released += 1
        elif info.ended:
            complete(
                store=store,
                name=name,
                state=PayloadState(info.status),
                now=now,
                error=info.error,
                cause=info.cause,
                ended_at=info.stop_date,
            )
            released += 1
        elif record.state is PayloadState.CLAIMED:
            store.mark_running(
                key=record.key, name=name, arn=info.arn, started_at=info.start_date or now, now=now
            )
            confirmed += 1

    external = 0
    for name in unknown_running:
        record = records.get(name)
        if record is not None and record.state in (
            PayloadState.SUCCEEDED,
            PayloadState.FAILED,
            PayloadState.TIMED_OUT,
            PayloadState.ABORTED,
        ):
            continue  # ended and released; the listing is behind
        external += 1

    drift = len(missing) + len(unknown_running)
    store.save_reconciliation(external=external, drift=drift, now=now)
    report = ReconcileReport(
        holders=len(h2),
        running=len(running),
        external=external,
        drift=drift,
        released=released,
        confirmed_running=confirmed,
    )
    logger.info("reconciled", extra={"reconcile": asdict(report)})
    return report

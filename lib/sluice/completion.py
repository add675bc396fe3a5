"""Completion: an execution ended, so free its slot and lease and record the outcome.

Status-change events are best effort: lost, repeated, late or out of order. So release is keyed
on the execution name and conditional on that name still holding the lease:

    event A(SUCCEEDED) ──► release(A): holder == A ──► slot freed, outcome recorded
    event A(SUCCEEDED) ──► release(A): holder != A ──► nothing (second delivery)
    event lost          ──► reconciliation finds A ended (DescribeExecution) ──► same release

A set ``DELETE`` on the ledger removes A at most once, so the slot count never goes negative.
Messages parked behind A (deferred duplicates) go back to the queue once A is released.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sluice.model import ClaimFence, ExecutionRecord, ExecutionStatus, PayloadState
from sluice.parking import wake
from sluice.ports import Executions, Queue, Store

log = logging.getLogger("sluice.completion")

DETAIL_TYPE = "Step Functions Execution Status Change"


@dataclass(frozen=True, slots=True)
class StatusChange:
    """The parts of an EventBridge "Step Functions Execution Status Change" event Sluice uses."""

    name: str
    status: str
    state_machine_arn: str
    execution_arn: str
    stop_date: float | None = None
    error: str | None = None
    cause: str | None = None

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> StatusChange:
        detail = event.get("detail") or {}
        stop = detail.get("stopDate")
        return cls(
            name=str(detail.get("name", "")),
            status=str(detail.get("status", "")),
            state_machine_arn=str(detail.get("stateMachineArn", "")),
            execution_arn=str(detail.get("executionArn", "")),
            stop_date=_epoch(stop),
            error=detail.get("error"),
            cause=detail.get("cause"),
        )

    @property
    def terminal(self) -> bool:
        return ExecutionStatus.terminal(self.status)


def complete(
    *,
    store: Store,
    queue: Queue,
    name: str,
    state: PayloadState,
    now: float,
    error: str | None = None,
    cause: str | None = None,
    ended_at: float | None = None,
    fence: ClaimFence | None = None,
    confirm: Callable[[ExecutionRecord], bool] | None = None,
) -> ExecutionRecord | None:
    """Release ``name``, record ``state`` and wake what waits for it. The one path every release takes."""
    released = store.release(
        name=name,
        state=state,
        now=now,
        error=error,
        cause=cause,
        ended_at=ended_at,
        fence=fence,
        confirm=confirm,
    )
    if released is not None and released.parked:
        wake(store=store, queue=queue, record=released, now=now)
    if released is None:
        log.info("nothing to release", extra={"execution_name": name, "state": state.value})
    else:
        log.info(
            "slot released",
            extra={
                "execution_name": name,
                "state": state.value,
                "correlation_id": released.key,
                "payload_key": released.key,
            },
        )
    return released


def handle_status_change(
    change: StatusChange,
    *,
    store: Store,
    queue: Queue,
    state_machine_arn: str,
    now: float,
    executions: Executions | None = None,
) -> bool:
    """Apply one status-change event. True when it freed a slot."""
    released = settle_status_change(
        change,
        store=store,
        queue=queue,
        state_machine_arn=state_machine_arn,
        now=now,
        executions=executions,
    )
    return released is not None


def settle_status_change(
    change: StatusChange,
    *,
    store: Store,
    queue: Queue,
    state_machine_arn: str,
    now: float,
    executions: Executions | None = None,
) -> ExecutionRecord | None:
    """Apply one status-change event. The released execution's record as it was (its ``shard`` is
    the slot freed), or None when the event freed nothing."""
    if change.state_machine_arn != state_machine_arn:
        log.info(
            "event for another state machine ignored", extra={"state_machine_arn": change.state_machine_arn}
        )
        return None
    if not change.terminal:
        return None
    return complete(
        store=store,
        queue=queue,
        confirm=_ended_by_its_own_word(executions) if executions is not None else None,
        name=change.name,
        state=PayloadState.after(change.status),
        now=now,
        error=change.error,
        cause=change.cause,
        ended_at=change.stop_date,
    )


def _ended_by_its_own_word(executions: Executions) -> Callable[[ExecutionRecord], bool]:
    """An execution taken back after a redrive runs again under the same name: an event of its
    earlier run (late, or repeated) must not release it. Asked of adopted executions only, with the
    record the release reads anyway."""

    def confirm(record: ExecutionRecord) -> bool:
        info = executions.describe(record.name, record.arn)
        if info is not None and not info.ended:
            log.info(
                "event of an earlier run of a redriven execution ignored",
                extra={"execution_name": record.name},
            )
            return False
        return True

    return confirm


def _epoch(value: Any) -> float | None:
    """EventBridge gives ``stopDate`` in epoch milliseconds; accept ISO strings too."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value) / 1000.0
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None

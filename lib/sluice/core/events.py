"""The events Sluice's functions read: the EventBridge "Step Functions Execution Status Change" event
(the completion's input, and the semaphore's; best effort: lost, repeated, late or out of order), and
a producer's wake (the launcher's, beside its schedule)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sluice.core.model import ExecutionStatus

DETAIL_TYPE = "Step Functions Execution Status Change"
# What a producer's wake sends the launcher (sluice.enqueue.LauncherWake): a tick that neither reconciles
# nor lingers. Any other event is a scheduled tick, so a forged or mistyped wake costs one full tick.
WAKE_EVENT: Mapping[str, str] = {"sluice": "wake"}


def is_wake(event: Any) -> bool:
    """Whether a launcher invocation's event is a producer's wake: exactly ``WAKE_EVENT``."""
    return isinstance(event, dict) and event == WAKE_EVENT


@dataclass(frozen=True, slots=True)
class StatusChange:
    """The parts of an EventBridge "Step Functions Execution Status Change" event Sluice uses."""

    name: str
    status: str
    state_machine_arn: str
    execution_arn: str
    stop_date: float | None = None
    start_date: float | None = None
    error: str | None = None
    cause: str | None = None
    output: str | None = None  # ``detail.output``: the output as JSON text, when the event carries it
    output_known: bool = False  # the event says what the output is (so no DescribeExecution for it)

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> StatusChange:
        detail = event.get("detail") or {}
        stop = detail.get("stopDate")
        output = detail.get("output")
        included = (detail.get("outputDetails") or {}).get("included")
        return cls(
            output=output if isinstance(output, str) else None,
            # EventBridge leaves the output out (``included`` false) when it is too big for an event.
            output_known=isinstance(output, str) or included is True,
            name=str(detail.get("name", "")),
            status=str(detail.get("status", "")),
            state_machine_arn=str(detail.get("stateMachineArn", "")),
            execution_arn=str(detail.get("executionArn", "")),
            stop_date=epoch(stop),
            start_date=epoch(detail.get("startDate")),
            error=detail.get("error"),
            cause=detail.get("cause"),
        )

    @property
    def terminal(self) -> bool:
        return ExecutionStatus.terminal(self.status)


def epoch(value: Any) -> float | None:
    """EventBridge gives ``stopDate`` in epoch milliseconds; accept ISO strings too."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value) / 1000.0
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None

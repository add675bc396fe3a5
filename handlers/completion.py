"""Completion Lambda: EventBridge "Step Functions Execution Status Change".

Releases the execution's slot and lease (only if it holds them), records the outcome, then fills
the one slot it freed at once through the launcher's admission code.
"""

from __future__ import annotations

import logging
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from handlers._shared import emit, logger, metrics, runtime
from sluice.core.events import StatusChange


@metrics.log_metrics
@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, object]:
    change = StatusChange.from_event(event)
    logger.set_correlation_id(change.name)
    released, summary, skipped = (
        runtime().launcher(logger).on_status_change(change, remaining_ms=context.get_remaining_time_in_millis)
    )
    metrics.add_metric("Released", MetricUnit.Count, int(released))
    result: dict[str, object] = {"execution": change.name, "status": change.status, "released": released}
    if skipped:
        result["admission"] = {"skipped": skipped}
    elif summary is not None:
        # Each start and the release log a line of their own: the summary adds to them only when a
        # message received did not start (its outcome's line is there too, but not the tally).
        result["admission"] = emit(summary, level=logging.DEBUG if summary.all_started else logging.INFO)
    return result

"""Completion Lambda: EventBridge "Step Functions Execution Status Change".

Releases the execution's slot and lease (only if it holds them), records the outcome, then fills
the one slot it freed at once through the launcher's admission code.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from handlers._shared import emit, logger, metrics, runtime
from sluice.completion import StatusChange, handle_status_change
from sluice.errors import TransientError


@metrics.log_metrics
@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, object]:
    rt = runtime()
    launcher = rt.launcher(logger)
    change = StatusChange.from_event(event)
    logger.set_correlation_id(change.name)
    released = handle_status_change(
        change, store=launcher.store, state_machine_arn=rt.settings.state_machine_arn, now=rt.clock.now()
    )
    metrics.add_metric("Released", MetricUnit.Count, int(released))
    result: dict[str, object] = {"execution": change.name, "status": change.status, "released": released}
    if released:
        try:
            summary = launcher.admit(remaining_ms=context.get_remaining_time_in_millis, max_new=1)
        except TransientError as exc:
            # The release is done; the next tick fills the slot. Retrying the event would not help.
            logger.warning("refill skipped: AWS is throttling or unavailable", extra={"error": str(exc)})
            result["admission"] = {"skipped": str(exc)}
        else:
            result["admission"] = emit(summary)
    return result

"""Semaphore Lambda: the Acquire and Release tasks of workflows, their ends (EventBridge status
changes) and the scheduled sweep. What each event asks is sluice.semaphore.service's to say."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from handlers._shared import logger, metrics, runtime
from sluice.semaphore.service import BadSemaphoreRequest


@metrics.log_metrics
@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, object]:
    try:
        result = runtime().semaphore_service(logger).handle(event)
    except BadSemaphoreRequest as exc:
        metrics.add_metric("SemaphoreBadRequests", MetricUnit.Count, 1)
        logger.warning("bad semaphore request", extra={"error": str(exc)})
        raise
    if "swept" in result:  # the permits of ended executions whose status event was lost
        swept = result["swept"]
        freed = sum(len(r.get("freed", [])) for r in swept.values()) if isinstance(swept, dict) else 0
        metrics.add_metric("SemaphorePermitsReleased", MetricUnit.Count, freed)
    elif "outcome" in result:
        metrics.add_metric("SemaphoreAcquires", MetricUnit.Count, 1)
    else:
        released = result["released"]
        entries = released if isinstance(released, list) else [result]
        freed = sum(1 for r in entries if r["released"] == "permit")
        metrics.add_metric("SemaphorePermitsReleased", MetricUnit.Count, freed)
    return result

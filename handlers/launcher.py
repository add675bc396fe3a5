"""Launcher Lambda: EventBridge schedule (and manual invokes). Reconcile, then fill free slots."""

from __future__ import annotations

from typing import Any

from handlers._shared import emit, logger, metrics, runtime


@metrics.log_metrics
@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, object]:
    launcher = runtime().launcher(logger)
    summary = launcher.tick(reconcile_first=True, remaining_ms=context.get_remaining_time_in_millis)
    return emit(summary)

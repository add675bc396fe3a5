"""Launcher Lambda: EventBridge schedule (and manual invokes): reconcile, then fill free slots. A
producer's wake (``sluice.core.events.WAKE_EVENT``, sent by ``sluice enqueue``) fills what is free now,
no reconciliation, no linger, one woken launcher at a time (``sluice.features.wake``)."""

from __future__ import annotations

from typing import Any

from handlers._shared import emit, logger, metrics, runtime
from sluice.core.events import is_wake


@metrics.log_metrics
@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, object]:
    launcher = runtime().launcher(logger)
    remaining_ms = context.get_remaining_time_in_millis
    if is_wake(event):
        turns = runtime().wake_turns()
        return emit(launcher.wake(turns, remaining_ms=remaining_ms, invocation=context.aws_request_id))
    return emit(launcher.tick(reconcile_first=True, remaining_ms=remaining_ms))

"""``sluice status``: the overview (MAX, slots, queue, DLQ, oldest message, drift) and one payload's
record with its execution history."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from sluice.adapters.aws.cloudwatch import Window
from sluice.core.errors import SluiceError
from sluice.core.records import Lane
from sluice.features.receipts import receipt_of
from sluice.ops.dlq import dlq_counts
from sluice.ops.keys import describe
from sluice.ops.lanes import lane_overview
from sluice.ops.maximum import read_max
from sluice.runtime import Runtime

AGE_METRIC = "ApproximateAgeOfOldestMessage"
AGE_LOOKBACK = timedelta(minutes=15)


def overview(
    rt: Runtime, *, deployed_default: Callable[[], int | None] = lambda: None, lanes: Sequence[Lane] = ()
) -> dict[str, Any]:
    """MAX, slots, Step Functions' own RUNNING count, queue and DLQ depth, oldest age, drift; with
    ``lanes`` (``sluice.features.lanes``), each lane's MAX, pool and queue."""
    s = rt.settings
    s.require("queue_url", "dlq_url", "table_name", "state_machine_arn")
    data: dict[str, Any] = {}
    if s.max_parameter:
        state = read_max(rt)
        data.update(max_parameter=state.parameter, max_error=state.error, resume_max=state.remembered)
        if state.exists:
            data.update(max=state.value, max_source="parameter")
        else:
            data.update(max=deployed_default(), max_source="deployed default (parameter missing)")
    else:
        data.update(max=s.max_concurrency, max_source="deployed default (no parameter)", max_parameter=None)
    ledger = rt.store().ledger()
    sfn_running = rt.executions().list_running()
    holders = ledger.holders
    wanted = ledger.limit(data["max"]) if data["max"] is not None else None
    # The caps are the limit; before the first tick has set them, MAX − external is what it sets.
    limit = ledger.in_force if ledger.in_force is not None else wanted
    data.update(
        paused=data["max"] == 0,
        running=len(holders),
        limit=limit,
        limit_next_tick=wanted if wanted != limit else None,
        free=max(0, limit - len(holders)) if limit is not None else None,
        external=ledger.external,
        sfn_running=len(sfn_running),
        running_not_in_ledger=len(sfn_running - holders),
        ledger_not_running=len(holders - sfn_running),
        drift=ledger.drift,
        reconciled_at=ledger.reconciled_at,
        reconciled_ago=round(time.time() - ledger.reconciled_at, 1) if ledger.reconciled_at else None,
    )
    depth = rt.queue().depth()
    data.update(
        queue_visible=depth.get("ApproximateNumberOfMessages", 0),
        queue_in_flight=depth.get("ApproximateNumberOfMessagesNotVisible", 0),
        queue_delayed=depth.get("ApproximateNumberOfMessagesDelayed", 0),
    )
    visible, in_flight = dlq_counts(rt)
    data.update(dlq=visible, dlq_in_flight=in_flight)
    if data["queue_visible"] + data["queue_in_flight"] + data["queue_delayed"] == 0:
        age, source = 0.0, "queue empty"
    else:
        age, source = oldest_age(rt)
    data.update(oldest_message_age=age, oldest_message_age_source=source)
    data.update(keys=busiest_keys(rt))
    if lanes:
        data.update(lanes=lane_overview(rt, lanes))
    return data


def busiest_keys(rt: Runtime, *, top: int = 10) -> list[dict[str, Any]]:
    """The concurrency keys with a line (``sluice.features.keys``), most waiting first."""
    store = rt.store()
    now = rt.clock.now()
    states = [store.key_state(k) for k in sorted(store.keys_waiting())[:100]]
    states.sort(key=lambda s: (-s.waiting, -len(s.holders), s.key))
    return [describe(s, store.key_concurrency, now) for s in states[:top]]


def oldest_age(rt: Runtime) -> tuple[float | None, str]:
    """The queue's ``ApproximateAgeOfOldestMessage`` from CloudWatch: the newest datapoint of the last
    15 minutes. SQS has no queue attribute for it, and peeking at a FIFO queue would raise the receive
    count of healthy messages (walking them towards the DLQ), so CloudWatch is the only honest source."""
    queue_name = rt.settings.queue_url.rstrip("/").rsplit("/", 1)[-1]
    end = datetime.now(UTC)
    window = Window(end - AGE_LOOKBACK, end + timedelta(minutes=1))
    try:
        points = rt.queue_metrics().maxima(queue_name, AGE_METRIC, window)
    except SluiceError as exc:
        return None, f"CloudWatch refused: {exc}"
    if not points:
        return None, f"no CloudWatch {AGE_METRIC} datapoint in the last 15 minutes"
    latest = max(points, key=lambda p: p.at)
    at = latest.at.astimezone(UTC).strftime("%H:%M:%SZ")
    return latest.value, f"CloudWatch {AGE_METRIC} at {at}"


def payload_history(rt: Runtime, key: str) -> dict[str, Any] | None:
    rt.settings.require("table_name")
    store = rt.store()
    record = store.payload(key)
    if record is None:
        return None
    history = store.executions(record.executions)
    runs = [history[n] for n in dict.fromkeys(record.executions) if n in history]
    if record.receipt is not None and record.receipt not in history:
        found = store.execution(record.receipt)  # cut from the history, still the receipt
        if found is not None:
            history[found.name] = found
    receipt = receipt_of(record, history.get(record.receipt)) if record.receipt else None
    return {
        "holder_status": _holder_status(rt, history.get(record.holder) if record.holder else None),
        "payload": asdict(record),
        "executions": [asdict(r) for r in runs],
        "receipt": receipt.as_dict() if receipt is not None else None,
        "effects": _effects(store, receipt.name) if receipt is not None and receipt.succeeded else None,
    }


def _holder_status(rt: Runtime, holder: Any) -> str | None:
    """What Step Functions says of the run holding the lease: the launcher writes no RUNNING mark
    after a start, so a ``CLAIMED`` lease is asked about (``NOT STARTED``: no such execution yet)."""
    if holder is None or holder.state.value != "CLAIMED":
        return None
    try:
        info = rt.executions().describe(holder.name, holder.arn)
    except SluiceError:
        return None
    return "NOT STARTED" if info is None else info.status


def _effects(store: Any, name: str) -> dict[str, Any] | None:
    """What the receipt's run sent (``sluice.features.effects``): a read only for a SUCCEEDED receipt."""
    log = store.effects(name)
    if log is None:
        return None
    return {
        "count": log.count,
        "sent": list(log.sent),
        "rejected": [list(r) for r in log.rejected],
        "sent_at": log.sent_at,
    }

"""Operator operations behind the ``sluice`` command, as plain functions over a ``Runtime``.

Each function does one thing an operator asks for and returns plain data (dicts and dataclasses)
that the CLI prints as a table or as JSON. AWS failures arrive as ``sluice.errors`` exceptions.

MAX, pause and resume
    MAX is the SSM parameter the launcher reads every tick (cached ``SLUICE_MAX_CACHE_SECONDS``).
    ``pause`` first tags the parameter with the value in force (``sluice:resume-max``) and then
    writes 0, so a failure in between loses nothing; ``resume`` writes the remembered value back
    and removes the tag. Nothing remembered: the deployed default (``SLUICE_MAX_CONCURRENCY``).

The dead-letter queue
    Listing receives with a short visibility timeout and makes every listed message visible again
    at the end: nothing is consumed. A FIFO queue hides the rest of a message group while any of
    its messages is in flight, so a listing sees at most the first 10 messages of each group.
    Redrive sends the original body back to the main queue (same group, same attributes less
    Sluice's annotations) with the deduplication id ``redrive-<DLQ message id>``, and deletes the
    DLQ message only once the send succeeded. Run twice within SQS's 5-minute deduplication window
    (say after a crash between send and delete), the second send is dropped by SQS.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from sluice.adapters.errors import error_code, translated
from sluice.adapters.sqs import REASON_ATTRIBUTE
from sluice.adapters.ssm import parse_max
from sluice.errors import ConfigurationError, SluiceError, TransientError
from sluice.model import TickSummary
from sluice.runtime import Runtime
from sluice.validation import KEY_ATTRIBUTE

RESUME_TAG = "sluice:resume-max"
PAUSED_AT_TAG = "sluice:paused-at"
SOURCE_ATTRIBUTE = "sluice-source-message-id"
RECEIVES_ATTRIBUTE = "sluice-receive-count"
DLQ_ANNOTATIONS = frozenset({REASON_ATTRIBUTE, SOURCE_ATTRIBUTE, RECEIVES_ATTRIBUTE})
MOVED_BY_SQS = "moved by SQS after maxReceiveCount receives (no sluice-error attribute)"
HIDE_SECONDS = 30  # how long a listed or selected DLQ message stays hidden before it is made visible again
REDRIVE_PREFIX = "redrive-"
AGE_METRIC = "ApproximateAgeOfOldestMessage"
AGE_LOOKBACK = timedelta(minutes=15)


# -- MAX ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MaxState:
    """The MAX parameter as it stands: its raw value, and what ``pause`` remembered on it."""

    parameter: str
    exists: bool
    raw: str | None = None
    value: int | None = None  # None when missing or not a whole number >= 0
    error: str | None = None  # why ``raw`` is not a usable MAX
    remembered: int | None = None  # the value ``pause`` saved, if any
    paused_at: str | None = None

    @property
    def paused(self) -> bool:
        return self.value == 0


def _parameter(rt: Runtime) -> str:
    name = rt.settings.max_parameter
    if not name:
        raise ConfigurationError(
            "no MAX parameter: the stack output MaxConcurrencyParameter is missing and SLUICE_MAX_PARAMETER "
            "is not set, so MAX is the fixed deployed default and cannot change at run time"
        )
    return name


def read_max(rt: Runtime) -> MaxState:
    name = _parameter(rt)
    try:
        with translated("GetParameter"):
            raw = rt.client("ssm").get_parameter(Name=name)["Parameter"]["Value"]
    except ConfigurationError as exc:
        cause = exc.__cause__
        if isinstance(cause, ClientError) and error_code(cause) == "ParameterNotFound":
            return MaxState(parameter=name, exists=False)
        raise
    value: int | None = None
    error: str | None = None
    try:
        value = parse_max(raw, source=name)
    except ConfigurationError as exc:
        error = str(exc)
    tags = _tags(rt, name)
    remembered: int | None = None
    if RESUME_TAG in tags:
        try:
            remembered = parse_max(tags[RESUME_TAG], source=RESUME_TAG)
        except ConfigurationError:
            remembered = None
    return MaxState(name, True, raw, value, error, remembered, tags.get(PAUSED_AT_TAG))


def set_max(rt: Runtime, value: int) -> dict[str, Any]:
    """Write MAX. A value above 0 also ends a pause: the remembered value is dropped."""
    parse_max(str(value), source="MAX")
    before = read_max(rt)
    _put(rt, before.parameter, value)
    cleared = None
    if value > 0 and before.remembered is not None:
        _untag(rt, before.parameter)
        cleared = before.remembered
    return {
        "parameter": before.parameter,
        "before": before.value if before.exists else None,
        "before_raw": before.raw,
        "max": value,
        "cleared_resume_max": cleared,
        "running": len(rt.store().ledger().holders),
        "cache_seconds": rt.settings.max_cache_seconds,
    }


def pause(rt: Runtime, deployed_default: Callable[[], int | None] = lambda: None) -> dict[str, Any]:
    """MAX → 0, remembering the value in force on the parameter's tag first."""
    state = read_max(rt)
    running = len(rt.store().ledger().holders)
    result: dict[str, Any] = {"parameter": state.parameter, "running": running, "max": 0}
    if state.paused:
        result.update(changed=False, before=0, remembered=state.remembered, paused_at=state.paused_at)
        return result
    # The value the launcher uses now: the parameter, or the deployed default when it is missing.
    in_force = state.value if state.exists else deployed_default()
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if state.exists:
        if in_force is not None:
            _tag(rt, state.parameter, {RESUME_TAG: str(in_force), PAUSED_AT_TAG: now})
        _put(rt, state.parameter, 0)
    else:
        tags = {PAUSED_AT_TAG: now}
        if in_force is not None:
            tags[RESUME_TAG] = str(in_force)
        with translated("PutParameter"):
            rt.client("ssm").put_parameter(
                Name=state.parameter,
                Value="0",
                Type="String",
                Tags=[{"Key": k, "Value": v} for k, v in tags.items()],
            )
    result.update(
        changed=True,
        before=in_force,
        before_raw=state.raw,
        before_error=state.error,
        remembered=in_force,
        paused_at=now,
        cache_seconds=rt.settings.max_cache_seconds,
    )
    return result


def resume(rt: Runtime, deployed_default: Callable[[], int | None] = lambda: None) -> dict[str, Any]:
    """Restore the value ``pause`` remembered, or the deployed default when nothing was remembered."""
    state = read_max(rt)
    result: dict[str, Any] = {"parameter": state.parameter, "before": state.value, "before_raw": state.raw}
    if not state.exists:
        # The launcher uses the deployed default: nothing is paused.
        result.update(changed=False, max=None, dropped_resume_max=None)
        return result
    if not state.paused and state.error is None:
        if state.remembered is not None:
            _untag(rt, state.parameter)  # MAX was changed by other means since the pause
        result.update(changed=False, max=state.value, dropped_resume_max=state.remembered)
        return result
    default = None if state.remembered is not None else deployed_default()
    if state.remembered is not None:
        target, source = state.remembered, "remembered"
    elif default is not None:
        target, source = default, "deployed default"
    else:
        raise ConfigurationError(
            f"nothing to resume to: {state.parameter} has no {RESUME_TAG} tag and the deployed default is "
            "unknown (set SLUICE_MAX_CONCURRENCY, or use `sluice set-max N`)"
        )
    _put(rt, state.parameter, target)
    if state.remembered is not None or state.paused_at is not None:
        _untag(rt, state.parameter)
    result.update(
        changed=True,
        max=target,
        source=source,
        paused_at=state.paused_at,
        cache_seconds=rt.settings.max_cache_seconds,
    )
    return result


def _put(rt: Runtime, name: str, value: int) -> None:
    with translated("PutParameter"):
        rt.client("ssm").put_parameter(Name=name, Value=str(value), Type="String", Overwrite=True)


def _tags(rt: Runtime, name: str) -> dict[str, str]:
    with translated("ListTagsForResource"):
        tags = rt.client("ssm").list_tags_for_resource(ResourceType="Parameter", ResourceId=name)
    return {t["Key"]: t["Value"] for t in tags.get("TagList", [])}


def _tag(rt: Runtime, name: str, tags: dict[str, str]) -> None:
    with translated("AddTagsToResource"):
        rt.client("ssm").add_tags_to_resource(
            ResourceType="Parameter", ResourceId=name, Tags=[{"Key": k, "Value": v} for k, v in tags.items()]
        )


def _untag(rt: Runtime, name: str) -> None:
    with translated("RemoveTagsFromResource"):
        rt.client("ssm").remove_tags_from_resource(
            ResourceType="Parameter", ResourceId=name, TagKeys=[RESUME_TAG, PAUSED_AT_TAG]
        )


# -- status ------------------------------------------------------------------------------------------


def overview(rt: Runtime, *, deployed_default: Callable[[], int | None] = lambda: None) -> dict[str, Any]:
    """MAX, slots, Step Functions' own RUNNING count, queue and DLQ depth, oldest age, drift."""
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
    limit = ledger.limit(data["max"]) if data["max"] is not None else None
    data.update(
        paused=data["max"] == 0,
        running=len(holders),
        limit=limit,
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
    dlq = _queue_attributes(
        rt, s.dlq_url, ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )
    data.update(
        dlq=dlq.get("ApproximateNumberOfMessages", 0),
        dlq_in_flight=dlq.get("ApproximateNumberOfMessagesNotVisible", 0),
    )
    if data["queue_visible"] + data["queue_in_flight"] + data["queue_delayed"] == 0:
        age, source = 0.0, "queue empty"
    else:
        age, source = oldest_age(rt)
    data.update(oldest_message_age=age, oldest_message_age_source=source)
    return data


def oldest_age(rt: Runtime) -> tuple[float | None, str]:
    """The queue's ``ApproximateAgeOfOldestMessage`` from CloudWatch: the newest datapoint of the last
    15 minutes. SQS has no queue attribute for it, and peeking at a FIFO queue would raise the receive
    count of healthy messages (walking them towards the DLQ), so CloudWatch is the only honest source."""
    queue_name = rt.settings.queue_url.rstrip("/").rsplit("/", 1)[-1]
    end = datetime.now(UTC)
    try:
        with translated("GetMetricStatistics"):
            points = rt.client("cloudwatch").get_metric_statistics(
                Namespace="AWS/SQS",
                MetricName=AGE_METRIC,
                Dimensions=[{"Name": "QueueName", "Value": queue_name}],
                StartTime=end - AGE_LOOKBACK,
                EndTime=end + timedelta(minutes=1),
                Period=60,
                Statistics=["Maximum"],
            )["Datapoints"]
    except SluiceError as exc:
        return None, f"CloudWatch refused: {exc}"
    if not points:
        return None, f"no CloudWatch {AGE_METRIC} datapoint in the last 15 minutes"
    latest = max(points, key=lambda p: p["Timestamp"])
    at = latest["Timestamp"].astimezone(UTC).strftime("%H:%M:%SZ")
    return float(latest["Maximum"]), f"CloudWatch {AGE_METRIC} at {at}"


def payload_history(rt: Runtime, key: str) -> dict[str, Any] | None:
    rt.settings.require("table_name")
    store = rt.store()
    record = store.payload(key)
    if record is None:
        return None
    history = store.executions(record.executions)
    runs = [history[n] for n in dict.fromkeys(record.executions) if n in history]
    return {"payload": asdict(record), "executions": [asdict(r) for r in runs]}


def _queue_attributes(rt: Runtime, url: str, names: list[str]) -> dict[str, int]:
    with translated("GetQueueAttributes"):
        attrs = rt.client("sqs").get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    return {k: int(v) for k, v in attrs.items()}


# -- the dead-letter queue ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DlqMessage:
    message_id: str
    group_id: str
    reason: str
    source_message_id: str
    receive_count: int
    sent_at: float | None
    key: str | None
    body: str
    attributes: dict[str, Any] = field(repr=False)  # raw SQS message attributes
    receipt_handle: str = field(default="", repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "group_id": self.group_id,
            "reason": self.reason,
            "source_message_id": self.source_message_id,
            "receive_count": self.receive_count,
            "sent_at": self.sent_at,
            "key": self.key,
            "body": self.body,
        }


def _dlq_message(raw: dict[str, Any]) -> DlqMessage:
    system = raw.get("Attributes", {})
    attributes = raw.get("MessageAttributes", {})

    def text(name: str) -> str | None:
        value = attributes.get(name, {}).get("StringValue")
        return value or None

    sent = system.get("SentTimestamp")
    receives = text(RECEIVES_ATTRIBUTE) or system.get("ApproximateReceiveCount", "0")
    return DlqMessage(
        message_id=raw["MessageId"],
        group_id=system.get("MessageGroupId", ""),
        reason=text(REASON_ATTRIBUTE) or MOVED_BY_SQS,
        source_message_id=text(SOURCE_ATTRIBUTE) or raw["MessageId"],
        receive_count=int(receives),
        sent_at=int(sent) / 1000 if sent else None,
        key=text(KEY_ATTRIBUTE),
        body=raw.get("Body", ""),
        attributes=attributes,
        receipt_handle=raw["ReceiptHandle"],
    )


def _receive_dlq(rt: Runtime, n: int) -> list[DlqMessage]:
    with translated("ReceiveMessage"):
        got = (
            rt.client("sqs")
            .receive_message(
                QueueUrl=rt.settings.dlq_url,
                MaxNumberOfMessages=max(1, min(10, n)),
                WaitTimeSeconds=0,
                VisibilityTimeout=HIDE_SECONDS,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
            .get("Messages", [])
        )
    return [_dlq_message(raw) for raw in got]


def _show_again(rt: Runtime, messages: Iterable[DlqMessage]) -> None:
    """Make received DLQ messages visible again (best effort: they reappear after HIDE_SECONDS anyway)."""
    pending = list(messages)
    for i in range(0, len(pending), 10):
        chunk = pending[i : i + 10]
        try:
            with translated("ChangeMessageVisibilityBatch"):
                rt.client("sqs").change_message_visibility_batch(
                    QueueUrl=rt.settings.dlq_url,
                    Entries=[
                        {"Id": str(j), "ReceiptHandle": m.receipt_handle, "VisibilityTimeout": 0}
                        for j, m in enumerate(chunk)
                    ],
                )
        except SluiceError:
            pass


@dataclass
class DlqListing:
    messages: list[DlqMessage]
    visible: int  # ApproximateNumberOfMessages before listing
    in_flight: int  # ApproximateNumberOfMessagesNotVisible before listing (hidden from this listing)


def dlq_list(rt: Runtime, *, limit: int = 100) -> DlqListing:
    rt.settings.require("dlq_url")
    counts = _queue_attributes(
        rt, rt.settings.dlq_url, ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )
    seen: dict[str, DlqMessage] = {}
    received: list[DlqMessage] = []
    try:
        while len(seen) < limit:
            got = _receive_dlq(rt, limit - len(seen))
            if not got:
                break
            received.extend(got)
            for m in got:
                seen.setdefault(m.message_id, m)
    finally:
        _show_again(rt, received)
    messages = sorted(seen.values(), key=lambda m: (m.sent_at or 0, m.message_id))
    return DlqListing(
        messages=messages,
        visible=counts.get("ApproximateNumberOfMessages", 0),
        in_flight=counts.get("ApproximateNumberOfMessagesNotVisible", 0),
    )


@dataclass
class DlqReport:
    done: list[dict[str, str]] = field(default_factory=list)  # redriven or deleted
    failed: list[dict[str, str]] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)
    interrupted: str | None = None  # a transient AWS error stopped the run

    @property
    def ok(self) -> bool:
        return not (self.failed or self.not_found or self.interrupted)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def redrive_dedup_id(dlq_message_id: str) -> str:
    return f"{REDRIVE_PREFIX}{dlq_message_id}"[:128]


def dlq_redrive(rt: Runtime, ids: Iterable[str] | None = None) -> DlqReport:
    """Send DLQ messages back to the main queue: those named in ``ids``, or every one when ``ids`` is None."""
    rt.settings.require("queue_url", "dlq_url")
    return _drain(rt, ids, _send_back)


def dlq_delete(rt: Runtime, ids: Iterable[str]) -> DlqReport:
    """Delete the named DLQ messages (once their payload was fixed and enqueued again, say)."""
    rt.settings.require("dlq_url")
    return _drain(rt, ids, lambda rt, batch, report: [(m, {"dlq_message_id": m.message_id}) for m in batch])


Action = Callable[[Runtime, list[DlqMessage], DlqReport], list[tuple[DlqMessage, dict[str, str]]]]


def _drain(rt: Runtime, ids: Iterable[str] | None, act: Action) -> DlqReport:
    """Receive DLQ messages and ``act`` on the selected ones; ``act`` returns those that may now be
    deleted, each with its report entry. Every other received message is made visible again, also
    when the run stops half-way (an interrupt between send and delete: a second redrive within
    5 minutes is dropped by SQS deduplication)."""
    report = DlqReport()
    wanted = None if ids is None else set(ids)
    held: list[DlqMessage] = []  # received and kept: not selected, or not done
    pending: list[DlqMessage] = []  # selected and not yet deleted
    try:
        while wanted is None or wanted:
            got = _receive_dlq(rt, 10)
            if not got:
                break
            pending = [m for m in got if wanted is None or m.message_id in wanted]
            chosen = {m.message_id for m in pending}
            held.extend(m for m in got if m.message_id not in chosen)
            if wanted is not None:
                wanted -= chosen
            if not pending:
                continue
            try:
                done = act(rt, pending, report)
                deleted = _delete_dlq(rt, [m for m, _ in done])
            except TransientError as exc:
                report.interrupted = str(exc)
                break
            for m, entry in done:
                if m.message_id in deleted:
                    report.done.append(entry)
                else:
                    report.failed.append({**entry, "reason": "not deleted from the DLQ: it is listed again"})
            held.extend(m for m in pending if m.message_id not in deleted)
            pending = []
    finally:
        _show_again(rt, held + pending)
    report.not_found = sorted(wanted or ())
    return report


def _send_back(
    rt: Runtime, batch: list[DlqMessage], report: DlqReport
) -> list[tuple[DlqMessage, dict[str, str]]]:
    entries = []
    for i, m in enumerate(batch):
        entry: dict[str, Any] = {"Id": str(i), "MessageBody": m.body}
        attributes = _original_attributes(m)
        if attributes:
            entry["MessageAttributes"] = attributes
        if rt.settings.queue_url.endswith(".fifo"):
            entry["MessageGroupId"] = m.group_id or m.key or "sluice-redrive"
            entry["MessageDeduplicationId"] = redrive_dedup_id(m.message_id)
        entries.append(entry)
    with translated("SendMessageBatch"):
        response = rt.client("sqs").send_message_batch(QueueUrl=rt.settings.queue_url, Entries=entries)
    for bad in response.get("Failed", []):
        m = batch[int(bad["Id"])]
        report.failed.append(
            {
                "dlq_message_id": m.message_id,
                "reason": f"SQS refused it: {bad.get('Code')}: {bad.get('Message', '')}",
            }
        )
    return [
        (
            batch[int(ok["Id"])],
            {"dlq_message_id": batch[int(ok["Id"])].message_id, "message_id": ok["MessageId"]},
        )
        for ok in response.get("Successful", [])
    ]


def _original_attributes(m: DlqMessage) -> dict[str, Any]:
    """The message's own attributes (``sluice-key`` among them), without Sluice's DLQ annotations."""
    out: dict[str, Any] = {}
    for name, value in m.attributes.items():
        if name in DLQ_ANNOTATIONS:
            continue
        kind = value.get("DataType", "String")
        if "BinaryValue" in value:
            out[name] = {"DataType": kind, "BinaryValue": value["BinaryValue"]}
        else:
            out[name] = {"DataType": kind, "StringValue": value.get("StringValue", "")}
    return out


def _delete_dlq(rt: Runtime, messages: list[DlqMessage]) -> set[str]:
    """Delete from the DLQ; the message ids that were deleted."""
    deleted: set[str] = set()
    for i in range(0, len(messages), 10):
        chunk = messages[i : i + 10]
        with translated("DeleteMessageBatch"):
            response = rt.client("sqs").delete_message_batch(
                QueueUrl=rt.settings.dlq_url,
                Entries=[{"Id": str(j), "ReceiptHandle": m.receipt_handle} for j, m in enumerate(chunk)],
            )
        deleted.update(chunk[int(ok["Id"])].message_id for ok in response.get("Successful", []))
    return deleted


# -- one tick ----------------------------------------------------------------------------------------


def tick(rt: Runtime, *, time_limit: float | None = None) -> TickSummary:
    """One launcher tick in this process: reconcile, then fill free slots, exactly as the Lambda does."""
    remaining_ms = None
    if time_limit is not None:
        deadline = time.monotonic() + time_limit

        def remaining_ms() -> int:
            return int((deadline - time.monotonic()) * 1000)

    return rt.launcher().tick(reconcile_first=True, remaining_ms=remaining_ms)

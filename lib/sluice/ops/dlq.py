"""The dead-letter queue: list, redrive, delete.

Listing receives with a short visibility timeout and makes every listed message visible again at the
end: nothing is consumed. A FIFO queue hides the rest of a message group while any of its messages is
in flight, so a listing sees at most the first 10 messages of each group. Redrive sends the original
body back to the main queue (same group, same attributes less Sluice's annotations) with the
deduplication id ``redrive-<DLQ message id>``, and deletes the DLQ message only once the send
succeeded. Run twice within SQS's 5-minute deduplication window (say after a crash between send and
delete), the second send is dropped by SQS.

With lanes (``sluice.lanes``), each message goes back to its lane's queue: the queue SQS moved it
from (``DeadLetterQueueSourceArn``), else its ``sluice-lane`` attribute (Sluice's own dead letters
and the messages ``sluice enqueue --lane`` sent carry it), else the default lane's. A lane whose
queue is not known here (a lane removed from the stack, or SLUICE_* variables without
SLUICE_LANE_QUEUES) is not guessed: the message stays in the DLQ, unless ``lane`` names the lane to
send it to.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from sluice.adapters.errors import translated
from sluice.adapters.sqs import REASON_ATTRIBUTE
from sluice.errors import ConfigurationError, SluiceError, TransientError
from sluice.lanes import DEFAULT_LANE, LANE_ATTRIBUTE
from sluice.runtime import Runtime
from sluice.settings import Settings
from sluice.validation import KEY_ATTRIBUTE

SOURCE_ATTRIBUTE = "sluice-source-message-id"
RECEIVES_ATTRIBUTE = "sluice-receive-count"
SOURCE_ARN = "DeadLetterQueueSourceArn"  # system attribute: the queue SQS moved the message from
DLQ_ANNOTATIONS = frozenset({REASON_ATTRIBUTE, SOURCE_ATTRIBUTE, RECEIVES_ATTRIBUTE})
MOVED_BY_SQS = "moved by SQS after maxReceiveCount receives (no sluice-error attribute)"
HIDE_SECONDS = 30  # how long a listed or selected DLQ message stays hidden before it is made visible again
REDRIVE_PREFIX = "redrive-"
COUNTS = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]


def dlq_counts(rt: Runtime) -> tuple[int, int]:
    """The DLQ's approximate (visible, in flight) message counts."""
    with translated("GetQueueAttributes"):
        attrs = rt.client("sqs").get_queue_attributes(QueueUrl=rt.settings.dlq_url, AttributeNames=COUNTS)[
            "Attributes"
        ]
    return int(attrs.get(COUNTS[0], 0)), int(attrs.get(COUNTS[1], 0))


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
    lane: str | None = None  # its sluice-lane attribute (sluice.lanes)
    source_queue: str | None = None  # the queue SQS moved it from (DeadLetterQueueSourceArn), by name

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
            **({"lane": self.lane} if self.lane else {}),
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
        lane=text(LANE_ATTRIBUTE),
        source_queue=_queue_name(system.get(SOURCE_ARN, "")) or None,
    )


def _queue_name(arn_or_url: str) -> str:
    """A queue's name from its ARN (``arn:aws:sqs:REGION:ACCOUNT:NAME``) or URL (``…/ACCOUNT/NAME``)."""
    return re.split(r"[:/]", arn_or_url.rstrip("/"))[-1] if arn_or_url else ""


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
    visible, in_flight = dlq_counts(rt)
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
        visible=visible,
        in_flight=in_flight,
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


def dlq_redrive(rt: Runtime, ids: Iterable[str] | None = None, *, lane: str | None = None) -> DlqReport:
    """Send DLQ messages back to their lanes' queues (the main queue without lanes): those named in
    ``ids``, or every one when ``ids`` is None; with ``lane``, all to that lane's queue."""
    rt.settings.require("queue_url", "dlq_url")
    if lane is not None and lane != DEFAULT_LANE and lane not in rt.settings.lane_queue_urls:
        raise ConfigurationError(f"no queue known for lane {lane!r}")
    return _drain(rt, ids, lambda rt, batch, report: _send_back(rt, batch, report, lane))


def redrive_lane(settings: Settings, m: DlqMessage) -> str:
    """The lane a DLQ message belongs to: its source queue's, else its ``sluice-lane``, else the default."""
    if m.source_queue:
        urls = {DEFAULT_LANE: settings.queue_url, **settings.lane_queue_urls}
        for name, url in urls.items():
            if _queue_name(url) == m.source_queue:
                return name
    return m.lane or DEFAULT_LANE


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
    rt: Runtime, batch: list[DlqMessage], report: DlqReport, lane: str | None = None
) -> list[tuple[DlqMessage, dict[str, str]]]:
    by_queue: dict[str, list[tuple[DlqMessage, str]]] = {}  # queue URL -> its messages, in order
    for m in batch:
        target = lane or redrive_lane(rt.settings, m)
        url = rt.settings.queue_url if target == DEFAULT_LANE else rt.settings.lane_queue_urls.get(target)
        if url is None:
            report.failed.append(
                {
                    "dlq_message_id": m.message_id,
                    "reason": f"its lane {target!r} has no queue known here (stack output LaneQueueUrls or "
                    "SLUICE_LANE_QUEUES): it stays in the DLQ; --lane NAME sends it to another lane's queue",
                }
            )
            continue
        by_queue.setdefault(url, []).append((m, target))
    done: list[tuple[DlqMessage, dict[str, str]]] = []
    for url, messages in by_queue.items():
        done.extend(_send_batch(rt, url, messages, report))
    return done


def _send_batch(
    rt: Runtime, url: str, batch: list[tuple[DlqMessage, str]], report: DlqReport
) -> list[tuple[DlqMessage, dict[str, str]]]:
    entries = []
    for i, (m, lane) in enumerate(batch):
        entry: dict[str, Any] = {"Id": str(i), "MessageBody": m.body}
        attributes = _original_attributes(m)
        attributes.pop(LANE_ATTRIBUTE, None)
        if lane != DEFAULT_LANE:  # says its lane again, should SQS move it to the DLQ once more
            attributes[LANE_ATTRIBUTE] = {"DataType": "String", "StringValue": lane}
        if attributes:
            entry["MessageAttributes"] = attributes
        if url.endswith(".fifo"):
            entry["MessageGroupId"] = m.group_id or m.key or "sluice-redrive"
            entry["MessageDeduplicationId"] = redrive_dedup_id(m.message_id)
        entries.append(entry)
    with translated("SendMessageBatch"):
        response = rt.client("sqs").send_message_batch(QueueUrl=url, Entries=entries)
    for bad in response.get("Failed", []):
        m, _ = batch[int(bad["Id"])]
        report.failed.append(
            {
                "dlq_message_id": m.message_id,
                "reason": f"SQS refused it: {bad.get('Code')}: {bad.get('Message', '')}",
            }
        )
    done = []
    for ok in response.get("Successful", []):
        m, lane = batch[int(ok["Id"])]
        entry = {"dlq_message_id": m.message_id, "message_id": ok["MessageId"]}
        done.append((m, {**entry, "lane": lane} if lane != DEFAULT_LANE else entry))
    return done


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

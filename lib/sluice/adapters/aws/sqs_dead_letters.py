"""The dead-letter queue, as the operator's commands use it (``sluice.ops.dlq``): its counts, a look
at its messages that consumes nothing, and sending them back or deleting them, in batches of 10.

A look (``peek``) receives with a short visibility timeout; ``show_again`` makes what was received
visible at once (best effort: it reappears after ``HIDE_SECONDS`` anyway). ``send_back`` sends each
message's original body and attributes (less Sluice's dead-letter annotations, with its lane said
again) to a queue, with the deduplication id ``redrive-<DLQ message id>`` on a FIFO queue: a second
send within SQS's 5-minute window is dropped. ``delete`` says which messages it deleted.

A copy sent back is the message it came from: it carries that message's id as its origin
(``sluice-origin-message-id``, ``logical_id``), so it runs under that message's execution name. A
message dead-lettered whose delete from the queue was lost may come back and run, its reason gone;
its dead-letter copy, however often redriven, then names the run that already happened:

    message m of k: dead-lettered (copy d in the DLQ); delete lost → m back in the queue
    m received again: runs as name(k, m)
    redrive d (twice, hours apart) → copies r1, r2, origin m: name(k, m) ran → already done, deleted

``Resend.new_name`` sends a copy without an origin: a new message, named by its own id.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sluice.adapters.aws.sqs import (
    BATCH,
    MAX_ATTRIBUTES,
    REASON_ATTRIBUTE,
    RECEIVES_ATTRIBUTE,
    SOURCE_ATTRIBUTE,
)
from sluice.adapters.errors import translated
from sluice.core.errors import SluiceError
from sluice.core.names import ORIGIN_ATTRIBUTE, ORIGIN_PATTERN
from sluice.core.validation import KEY_ATTRIBUTE
from sluice.features.lanes import DEFAULT_LANE, LANE_ATTRIBUTE

SOURCE_ARN = "DeadLetterQueueSourceArn"  # system attribute: the queue SQS moved the message from
DLQ_ANNOTATIONS = frozenset({REASON_ATTRIBUTE, SOURCE_ATTRIBUTE, RECEIVES_ATTRIBUTE})
MOVED_BY_SQS = "moved by SQS after maxReceiveCount receives (no sluice-error attribute)"
HIDE_SECONDS = 30  # how long a looked-at DLQ message stays hidden before it is made visible again
REDRIVE_PREFIX = "redrive-"
NO_ROOM = (
    f"it has {MAX_ATTRIBUTES} attributes, no room for the {ORIGIN_ATTRIBUTE} that keeps its execution "
    "name: it stays in the DLQ; --new-name sends it back as a new message (a new name: it may run again)"
)
COUNTS = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]


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
    lane: str | None = None  # its sluice-lane attribute (sluice.features.lanes)
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


@dataclass(frozen=True, slots=True)
class DlqCounts:
    visible: int  # ApproximateNumberOfMessages
    in_flight: int  # ApproximateNumberOfMessagesNotVisible


@dataclass(frozen=True, slots=True)
class Resend:
    """One DLQ message to send back, to ``lane``'s queue: as the message it came from, or with
    ``new_name`` as a new message (a new execution name)."""

    message: DlqMessage
    lane: str
    new_name: bool = False


@dataclass(frozen=True, slots=True)
class Resent:
    """A message the queue took: ``message_id`` is its id there."""

    message: DlqMessage
    lane: str
    message_id: str


@dataclass(frozen=True, slots=True)
class Refused:
    """A message the queue refused, with SQS's word for why."""

    message: DlqMessage
    reason: str


def queue_name(arn_or_url: str) -> str:
    """A queue's name from its ARN (``arn:aws:sqs:REGION:ACCOUNT:NAME``) or URL (``…/ACCOUNT/NAME``)."""
    return re.split(r"[:/]", arn_or_url.rstrip("/"))[-1] if arn_or_url else ""


def redrive_dedup_id(dlq_message_id: str) -> str:
    return f"{REDRIVE_PREFIX}{dlq_message_id}"[:128]


def logical_id(m: DlqMessage) -> str:
    """The id of the message a DLQ message without an origin stands for, which names its run: the
    message Sluice dead-lettered (``sluice-source-message-id``, on Sluice's own copies only: on a
    message SQS moved it is the producer's word), else its own id (SQS keeps a message's id when it
    moves it). A value SQS would refuse is passed over. A message with an origin keeps it as it is:
    a bad one is dead-lettered again with its reason, never mended by a redrive."""
    source = m.source_message_id if m.source_queue is None else ""
    return source if ORIGIN_PATTERN.fullmatch(source) else m.message_id


def dlq_message_of(raw: dict[str, Any]) -> DlqMessage:
    """A DLQ message from a ReceiveMessage answer's message (all attributes asked for)."""
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
        source_queue=queue_name(system.get(SOURCE_ARN, "")) or None,
    )


def original_attributes(m: DlqMessage) -> dict[str, Any]:
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


def _entry(index: int, resend: Resend, fifo: bool) -> dict[str, Any]:
    m, lane = resend.message, resend.lane
    entry: dict[str, Any] = {"Id": str(index), "MessageBody": m.body}
    attributes = original_attributes(m)
    attributes.pop(LANE_ATTRIBUTE, None)
    if lane != DEFAULT_LANE:  # says its lane again, should SQS move it to the DLQ once more
        attributes[LANE_ATTRIBUTE] = {"DataType": "String", "StringValue": lane}
    if resend.new_name:
        attributes.pop(ORIGIN_ATTRIBUTE, None)
    elif ORIGIN_ATTRIBUTE not in attributes:  # one it has is kept as it is, a bad one too
        attributes[ORIGIN_ATTRIBUTE] = {"DataType": "String", "StringValue": logical_id(m)}
    if attributes:
        entry["MessageAttributes"] = attributes
    if fifo:
        entry["MessageGroupId"] = m.group_id or m.key or "sluice-redrive"
        entry["MessageDeduplicationId"] = redrive_dedup_id(m.message_id)
    return entry


def _chunks(items: Sequence[Any]) -> list[Sequence[Any]]:
    return [items[i : i + BATCH] for i in range(0, len(items), BATCH)]


class DeadLetterQueue:
    """The stack's DLQ (``url``)."""

    def __init__(self, client: Any, url: str) -> None:
        self.client = client
        self.url = url

    def counts(self) -> DlqCounts:
        """The approximate visible and in-flight message counts."""
        with translated("GetQueueAttributes"):
            attrs = self.client.get_queue_attributes(QueueUrl=self.url, AttributeNames=COUNTS)["Attributes"]
        return DlqCounts(int(attrs.get(COUNTS[0], 0)), int(attrs.get(COUNTS[1], 0)))

    def peek(self, n: int, hide_seconds: int = HIDE_SECONDS) -> list[DlqMessage]:
        """Receive up to ``n`` (at most 10) messages, hidden for ``hide_seconds``."""
        with translated("ReceiveMessage"):
            got = self.client.receive_message(
                QueueUrl=self.url,
                MaxNumberOfMessages=max(1, min(BATCH, n)),
                WaitTimeSeconds=0,
                VisibilityTimeout=hide_seconds,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            ).get("Messages", [])
        return [dlq_message_of(raw) for raw in got]

    def show_again(self, messages: Iterable[DlqMessage]) -> None:
        """Make received messages visible again (best effort: a failure is ignored)."""
        for chunk in _chunks(list(messages)):
            entries = [
                {"Id": str(j), "ReceiptHandle": m.receipt_handle, "VisibilityTimeout": 0}
                for j, m in enumerate(chunk)
            ]
            try:
                with translated("ChangeMessageVisibilityBatch"):
                    self.client.change_message_visibility_batch(QueueUrl=self.url, Entries=entries)
            except SluiceError:
                pass

    def send_back(self, url: str, resends: Sequence[Resend]) -> tuple[list[Resent], list[Refused]]:
        """Send each message to the queue ``url``: those it took, and those it refused."""
        sent: list[Resent] = []
        refused: list[Refused] = []
        roomy = []
        for r in resends:
            if len(_entry(0, r, False).get("MessageAttributes", {})) > MAX_ATTRIBUTES:
                refused.append(Refused(r.message, NO_ROOM))
            else:
                roomy.append(r)
        for chunk in _chunks(roomy):
            entries = [_entry(i, r, url.endswith(".fifo")) for i, r in enumerate(chunk)]
            with translated("SendMessageBatch"):
                response = self.client.send_message_batch(QueueUrl=url, Entries=entries)
            for bad in response.get("Failed", []):
                reason = f"SQS refused it: {bad.get('Code')}: {bad.get('Message', '')}"
                refused.append(Refused(chunk[int(bad["Id"])].message, reason))
            for ok in response.get("Successful", []):
                r = chunk[int(ok["Id"])]
                sent.append(Resent(r.message, r.lane, ok["MessageId"]))
        return sent, refused

    def delete(self, messages: Sequence[DlqMessage]) -> set[str]:
        """Delete the messages; the ids of those deleted."""
        deleted: set[str] = set()
        for chunk in _chunks(messages):
            entries = [{"Id": str(j), "ReceiptHandle": m.receipt_handle} for j, m in enumerate(chunk)]
            with translated("DeleteMessageBatch"):
                response = self.client.delete_message_batch(QueueUrl=self.url, Entries=entries)
            deleted.update(chunk[int(ok["Id"])].message_id for ok in response.get("Successful", []))
        return deleted

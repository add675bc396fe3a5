"""SQS FIFO queue and DLQ.

A dead-letter copy must always be accepted, or the tick fails on the same message every time. SQS
counts a message's size as its body plus each attribute's name, data type and value, in bytes, and
the copy adds Sluice's reason attributes to a message that may already be at the limit. So the copy
is fitted to ``dlq_max_bytes`` (by default 262,144: the limit of queues made before SQS allowed
1 MiB, so no more than any DLQ the stack creates accepts) by, in this order: leaving out the copied
message attributes, the largest first; shortening the reason (to no less than ``MIN_REASON_BYTES``);
and replacing the body with a JSON note that points at the original (its size, SHA-256 and message
id), marked with the ``sluice-body-truncated`` attribute.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sluice.adapters.errors import translated
from sluice.core.errors import TransientError
from sluice.core.model import Message, ParkedMessage
from sluice.core.names import ORIGIN_ATTRIBUTE, ORIGIN_PATTERN
from sluice.core.validation import TRUNCATED_ATTRIBUTE
from sluice.features.lanes import DEFAULT_LANE, LANE_ATTRIBUTE

BATCH = 10
MAX_ATTRIBUTES = 10
SLUICE_PREFIX = "sluice-"  # attributes Sluice reads (sluice-key, sluice-once, ...)
REASON_ATTRIBUTE = "sluice-error"
SOURCE_ATTRIBUTE = "sluice-source-message-id"
RECEIVES_ATTRIBUTE = "sluice-receive-count"
MAX_REASON = 1_000
MIN_REASON_BYTES = 128
SQS_MAX_MESSAGE_BYTES = 262_144
NOTE_FIELD = "sluice-dead-letter-note"
NOTE = "the body was too large to dead-letter beside its reason and is not kept; this points at it"
# What SQS accepts in a body or string attribute (the XML character range); the rest becomes U+FFFD.
_NOT_SQS_TEXT = re.compile(r"[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")

Attributes = dict[str, dict[str, str]]


@dataclass(frozen=True)
class DeadLetter:
    """The body and message attributes a dead-lettered message is sent to the DLQ with."""

    body: str
    attributes: Attributes

    @property
    def size(self) -> int:
        return message_size(self.body, self.attributes)


class SqsQueue:
    """The payload queue. With lanes (``sluice.features.lanes``), one adapter per lane (``for_lane``): it
    receives from its lane's queue and stamps each message with ``sluice-lane``, so that a message
    parked in the table (awaits, keys, deferred duplicates) and sent back later, by whichever
    adapter, goes back to its lane's queue (``requeue`` routes by that attribute)."""

    def __init__(
        self,
        client: Any,
        queue_url: str,
        dlq_url: str = "",
        dlq_max_bytes: int = SQS_MAX_MESSAGE_BYTES,
        *,
        lane_urls: Mapping[str, str] | None = None,
        lane: str | None = None,
        home_url: str | None = None,
    ) -> None:
        self.client = client
        self.queue_url = queue_url
        self.dlq_url = dlq_url
        self.dlq_max_bytes = dlq_max_bytes
        self.lane_urls = dict(lane_urls or {})  # the lanes other than default: name -> queue URL
        self.lane = lane  # the lane this adapter receives from (None: the default lane)
        self.home_url = home_url or queue_url  # the default lane's queue

    def for_lane(self, lane: str) -> SqsQueue:
        """The adapter of ``lane``'s queue (``default``: the stack's payload queue)."""
        if lane == DEFAULT_LANE:
            return SqsQueue(
                self.client, self.home_url, self.dlq_url, self.dlq_max_bytes, lane_urls=self.lane_urls
            )
        return SqsQueue(
            self.client,
            self.lane_urls[lane],
            self.dlq_url,
            self.dlq_max_bytes,
            lane_urls=self.lane_urls,
            lane=lane,
            home_url=self.home_url,
        )

    def url_for(self, attributes: Mapping[str, str]) -> str:
        """The queue a message with these attributes belongs in: its lane's, else the default."""
        return self.lane_urls.get(attributes.get(LANE_ATTRIBUTE, ""), self.home_url)

    def receive(self, max_messages: int, wait_seconds: int) -> list[Message]:
        with translated("ReceiveMessage"):
            response = self.client.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=max(1, min(BATCH, max_messages)),
                WaitTimeSeconds=wait_seconds,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
        messages = [_message(raw) for raw in response.get("Messages", [])]
        if self.lane_urls:
            for message in messages:
                # The queue says the lane, not the producer: a copy sent back goes back here.
                message.attributes.pop(LANE_ATTRIBUTE, None)
                if self.lane is not None:
                    message.attributes[LANE_ATTRIBUTE] = self.lane
        return messages

    def delete(self, messages: Sequence[Message]) -> None:
        """Every chunk is tried; the first error is raised after the last chunk."""
        failed: TransientError | None = None
        for chunk in _chunks(messages):
            try:
                with translated("DeleteMessageBatch"):
                    self.client.delete_message_batch(
                        QueueUrl=self.queue_url,
                        Entries=[
                            {"Id": str(i), "ReceiptHandle": m.receipt_handle} for i, m in enumerate(chunk)
                        ],
                    )
            except TransientError as exc:
                failed = failed or exc
            # A failed entry is a receipt that expired: the message comes back and is recognised
            # by its lease (same message id, same name), so it is deleted then.
        if failed is not None:
            raise failed

    def release(self, messages: Sequence[Message], delay_seconds: int = 0) -> None:
        for chunk in _chunks(messages):
            try:
                with translated("ChangeMessageVisibilityBatch"):
                    self.client.change_message_visibility_batch(
                        QueueUrl=self.queue_url,
                        Entries=[
                            {
                                "Id": str(i),
                                "ReceiptHandle": m.receipt_handle,
                                "VisibilityTimeout": delay_seconds,
                            }
                            for i, m in enumerate(chunk)
                        ],
                    )
            except TransientError:
                pass  # best effort: the visibility timeout returns them anyway

    def send_to_dlq(self, message: Message, reason: str, *, dedup: str | None = None) -> None:
        copy = dead_letter_copy(message, reason, limit=self.dlq_max_bytes)
        request: dict[str, Any] = {
            "QueueUrl": self.dlq_url,
            "MessageBody": copy.body,
            "MessageAttributes": copy.attributes,
        }
        if self.dlq_url.endswith(".fifo"):
            request["MessageGroupId"] = message.group_id or "sluice-invalid"
            request["MessageDeduplicationId"] = _dedup_stem(dedup or message.message_id, 128)
        with translated("SendMessage"):
            self.client.send_message(**request)

    def requeue(self, parked: ParkedMessage) -> None:
        attributes = {k: v for k, v in parked.attributes.items() if v}
        # At most 10 attributes, the origin among them. Sluice's own go first: they say how it runs
        # (its key, its concurrency key and place in the line, run-once, awaits). A woken key waiter
        # carries one more than it came with (its ticket): the producer's, last by name, make room.
        ranked = sorted(attributes.items(), key=lambda kv: (not kv[0].startswith(SLUICE_PREFIX), kv[0]))
        kept = dict(ranked[: MAX_ATTRIBUTES - 1])
        kept[ORIGIN_ATTRIBUTE] = parked.message_id
        # One copy's wake-up sent twice within 5 minutes is one message; a wake-up behind a later
        # holder, or of a copy parked again (behind the same name claimed again), is another send,
        # which SQS would otherwise take for the first and drop. A copy that does get through twice
        # names the same execution.
        parked_as = parked.holder + (f"\n{parked.copy_id}" if parked.copy_id else "")
        holder = hashlib.sha256(parked_as.encode()).hexdigest()[:32]
        with translated("SendMessage"):
            self.client.send_message(
                QueueUrl=self.url_for(attributes),
                MessageBody=parked.body,
                MessageGroupId=parked.group_id or "sluice-parked",
                MessageDeduplicationId=f"{_dedup_stem(parked.message_id)}-{holder}",
                MessageAttributes={k: _string(v) for k, v in kept.items()},
            )

    def depth(self) -> dict[str, int]:
        """Visible, in-flight and delayed message counts of the main queue."""
        with translated("GetQueueAttributes"):
            attrs = self.client.get_queue_attributes(
                QueueUrl=self.queue_url,
                AttributeNames=[
                    "ApproximateNumberOfMessages",
                    "ApproximateNumberOfMessagesNotVisible",
                    "ApproximateNumberOfMessagesDelayed",
                ],
            )["Attributes"]
        return {k: int(v) for k, v in attrs.items()}


def _dedup_stem(message_id: str, limit: int = 90) -> str:
    """The message id as (the start of) a deduplication id, or a digest of it when SQS would refuse
    it there (an origin forged before origins were checked at receipt, ``sluice.features.attributes``): the
    message is sent all the same, and its receipt dead-letters it with the reason."""
    if len(message_id) <= limit and ORIGIN_PATTERN.fullmatch(message_id):
        return message_id
    # Cut short, two origins alike in their first ``limit`` characters would share it.
    return hashlib.sha256(message_id.encode("utf-8", "surrogatepass")).hexdigest()[: min(64, limit)]


def message_size(body: str, attributes: Attributes) -> int:
    """Bytes as SQS counts them against its size limit: the body, and each attribute's name, data
    type and value."""
    return _bytes(body) + sum(
        _bytes(name) + _bytes(value["DataType"]) + _bytes(value["StringValue"])
        for name, value in attributes.items()
    )


def dead_letter_copy(message: Message, reason: str, *, limit: int = SQS_MAX_MESSAGE_BYTES) -> DeadLetter:
    """What to send to the DLQ: at most ``limit`` bytes as SQS counts them (see the module docstring)."""
    reason = _NOT_SQS_TEXT.sub("\ufffd", reason[:MAX_REASON]) or "invalid"
    body = message.body or "(empty body)"
    copy = _fit(message, body, {}, reason, limit, min_reason=MIN_REASON_BYTES)
    if copy is None:
        raw = body.encode("utf-8", "surrogatepass")
        note = {
            NOTE_FIELD: NOTE,
            "source_message_id": message.message_id,
            "bytes": len(raw),
            "sha256": hashlib.sha256(raw).hexdigest(),
        }
        marker = {TRUNCATED_ATTRIBUTE: {"DataType": "Number", "StringValue": str(len(raw))}}
        copy = _fit(message, json.dumps(note), marker, reason, limit, min_reason=16)
    if copy is None:
        raise ValueError(f"a dead-letter note does not fit in {limit:,} bytes")
    return copy


def _fit(
    message: Message, body: str, extra: Attributes, reason: str, limit: int, *, min_reason: int
) -> DeadLetter | None:
    annotations: Attributes = {
        REASON_ATTRIBUTE: _string(reason),
        SOURCE_ATTRIBUTE: _string(message.message_id),
        RECEIVES_ATTRIBUTE: {"DataType": "Number", "StringValue": str(message.receive_count)},
        **extra,
    }
    copied = sorted(
        (
            (name, _string(value))
            for name, value in message.attributes.items()
            if value and name not in annotations
        ),
        # Its lane first (a redrive sends it back there), its origin next (its run's name, which a
        # redrive keeps), then the smallest.
        key=lambda item: (
            item[0] != LANE_ATTRIBUTE,
            item[0] != ORIGIN_ATTRIBUTE,
            message_size("", dict([item])),
        ),
    )[: MAX_ATTRIBUTES - len(annotations)]
    while copied and message_size(body, {**annotations, **dict(copied)}) > limit:
        copied.pop()  # the largest
    over = message_size(body, {**annotations, **dict(copied)}) - limit
    if over > 0:
        room = _bytes(reason) - over
        if room < min(min_reason, _bytes(reason)):
            return None
        annotations[REASON_ATTRIBUTE] = _string(_shorten(reason, room))
    return DeadLetter(body, {**annotations, **dict(copied)})


def _shorten(text: str, max_bytes: int) -> str:
    """At most ``max_bytes`` (at least 4) of UTF-8, cut at a character boundary, ending in an ellipsis."""
    return text.encode("utf-8")[: max_bytes - 3].decode("utf-8", "ignore") + "…"


def _string(value: str) -> dict[str, str]:
    return {"DataType": "String", "StringValue": value}


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _message(raw: dict[str, Any]) -> Message:
    system = raw.get("Attributes", {})
    attributes: dict[str, str] = {}
    binary: dict[str, str] = {}
    for name, value in raw.get("MessageAttributes", {}).items():
        data_type = value.get("DataType", "")
        if data_type.startswith(("String", "Number")):
            attributes[name] = value.get("StringValue", "")
        else:
            binary[name] = data_type  # its name and type only: the catalogue refuses a sluice-* one
    return Message(
        message_id=raw["MessageId"],
        receipt_handle=raw["ReceiptHandle"],
        body=raw.get("Body", ""),
        group_id=system.get("MessageGroupId", ""),
        receive_count=int(system.get("ApproximateReceiveCount", "1")),
        attributes=attributes,
        binary_attributes=binary,
    )


def _chunks(messages: Sequence[Message]) -> list[Sequence[Message]]:
    return [messages[i : i + BATCH] for i in range(0, len(messages), BATCH)]

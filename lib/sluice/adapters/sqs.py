"""SQS FIFO queue and DLQ."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sluice.adapters.errors import translated
from sluice.errors import TransientError
from sluice.model import Message

BATCH = 10
MAX_ATTRIBUTES = 10
REASON_ATTRIBUTE = "sluice-error"
MAX_REASON = 1_000


class SqsQueue:
    def __init__(self, client: Any, queue_url: str, dlq_url: str = "") -> None:
        self.client = client
        self.queue_url = queue_url
        self.dlq_url = dlq_url

    def receive(self, max_messages: int, wait_seconds: int) -> list[Message]:
        with translated("ReceiveMessage"):
            response = self.client.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=max(1, min(BATCH, max_messages)),
                WaitTimeSeconds=wait_seconds,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
        return [_message(raw) for raw in response.get("Messages", [])]

    def delete(self, messages: Sequence[Message]) -> None:
        for chunk in _chunks(messages):
            with translated("DeleteMessageBatch"):
                self.client.delete_message_batch(
                    QueueUrl=self.queue_url,
                    Entries=[{"Id": str(i), "ReceiptHandle": m.receipt_handle} for i, m in enumerate(chunk)],
                )
            # A failed entry is a receipt that expired: the message comes back and is recognised
            # by its lease (same message id, same name), so it is deleted then.

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

    def send_to_dlq(self, message: Message, reason: str) -> None:
        attributes: dict[str, dict[str, str]] = {
            REASON_ATTRIBUTE: {"DataType": "String", "StringValue": reason[:MAX_REASON]},
            "sluice-source-message-id": {"DataType": "String", "StringValue": message.message_id},
            "sluice-receive-count": {"DataType": "Number", "StringValue": str(message.receive_count)},
        }
        for name, value in message.attributes.items():
            if len(attributes) >= MAX_ATTRIBUTES:
                break
            if value and name not in attributes:
                attributes[name] = {"DataType": "String", "StringValue": value}
        request: dict[str, Any] = {
            "QueueUrl": self.dlq_url,
            "MessageBody": message.body if message.body else "(empty body)",
            "MessageAttributes": attributes,
        }
        if self.dlq_url.endswith(".fifo"):
            request["MessageGroupId"] = message.group_id or "sluice-invalid"
            request["MessageDeduplicationId"] = message.message_id
        with translated("SendMessage"):
            self.client.send_message(**request)

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


def _message(raw: dict[str, Any]) -> Message:
    system = raw.get("Attributes", {})
    attributes = {
        name: value.get("StringValue", "")
        for name, value in raw.get("MessageAttributes", {}).items()
        if value.get("DataType", "").startswith(("String", "Number"))
    }
    return Message(
        message_id=raw["MessageId"],
        receipt_handle=raw["ReceiptHandle"],
        body=raw.get("Body", ""),
        group_id=system.get("MessageGroupId", ""),
        receive_count=int(system.get("ApproximateReceiveCount", "1")),
        attributes=attributes,
    )


def _chunks(messages: Sequence[Message]) -> list[Sequence[Message]]:
    return [messages[i : i + BATCH] for i in range(0, len(messages), BATCH)]

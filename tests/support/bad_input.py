"""Hostile input at the limits Sluice lives under, and SQS's size rule as a client hook.

``HOSTILE`` maps a name to a body that must be dead-lettered, the reason (a regex) its
``sluice-error`` attribute must match, and whether the dead-letter copy can keep the body (at the
SQS maximum it cannot: the copy carries a note pointing at the original). ``HOSTILE_BODIES`` is
the same as name -> body, the shape of the property suite's ``UNUSABLE`` pool. ``EXTREME_PAYLOADS``
are payloads at the limits that must run.

``sqs_size_limit`` makes a boto3 SQS client refuse what SQS refuses: a message whose body plus
attribute names, data types and values is over 262,144 bytes (moto checks only the body's
characters, against 1 MiB). It also keeps every message the client sent, to check what arrived.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tests.support.hooks import error_answer

SQS_MAX_BYTES = 262_144
MAX_KEY_BYTES = 1_024


class Hostile(NamedTuple):
    body: str
    reason: str
    body_kept: bool = True


HOSTILE: dict[str, Hostile] = {
    "huge_integer": Hostile(
        '{"id": "x", "n": ' + "1" * 5_000 + "}", r"a number has more than 4,300 digits \(5,000\)"
    ),
    "huge_negative_integer": Hostile(
        '{"id": "x", "n": -' + "9" * 4_301 + "}", r"a number has more than 4,300 digits \(4,301\)"
    ),
    "float_overflowing_to_infinity": Hostile(
        '{"id": "x", "n": 1e999}', r"number 1e999 is out of range for a 64-bit float"
    ),
    "nan": Hostile('{"id": "x", "n": NaN}', r"NaN is not JSON"),
    "infinity": Hostile('{"id": "x", "n": -Infinity}', r"-Infinity is not JSON"),
    "key_of_511_four_byte_characters": Hostile(
        json.dumps({"id": "\U0001f600" * 511}, ensure_ascii=False),
        r"field 'id' is 2,044 bytes in UTF-8; keys are at most 1,024 bytes",
    ),
    "key_one_byte_over": Hostile(
        json.dumps({"id": "é" * 512 + "a"}), r"field 'id' is 1,025 bytes in UTF-8; keys are at most 1,024"
    ),
    "not_json_at_the_sqs_maximum": Hostile(
        "x" * SQS_MAX_BYTES, r"not JSON: Expecting value at line 1 column 1", body_kept=False
    ),
    "two_byte_characters_at_the_sqs_maximum": Hostile(
        "é" * (SQS_MAX_BYTES // 2), r"not JSON: Expecting value at line 1 column 1", body_kept=False
    ),
    "array_100_bytes_under_the_sqs_maximum": Hostile(
        '["' + "a" * (SQS_MAX_BYTES - 100 - 4) + '"]', r"must be a JSON object, got an array", body_kept=False
    ),
}
HOSTILE_BODIES: dict[str, str] = {name: h.body for name, h in HOSTILE.items()}

EXTREME_PAYLOADS: dict[str, dict[str, Any]] = {
    "key_of_256_four_byte_characters": {"id": "\U0001f600" * 256},  # exactly 1,024 bytes
    "ascii_key_at_the_byte_limit": {"id": "k" * MAX_KEY_BYTES},
    "integer_of_4300_digits": {"id": "digits", "n": int("7" * 4_300)},
}


def sqs_message_size(body: str, attributes: dict[str, dict[str, Any]] | None) -> int:
    """A message's size as SQS counts it: the body and each attribute's name, data type and value."""
    size = len(body.encode("utf-8"))
    for name, value in (attributes or {}).items():
        size += len(name.encode("utf-8")) + len(value["DataType"].encode("utf-8"))
        if "BinaryValue" in value:
            size += len(value["BinaryValue"])
        else:
            size += len(value["StringValue"].encode("utf-8"))
    return size


@dataclass
class SentMessages:
    limit: int
    sent: list[dict[str, Any]] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)

    def to(self, queue_url: str) -> list[dict[str, Any]]:
        return [m for m in self.sent if m["QueueUrl"] == queue_url]


@contextmanager
def sqs_size_limit(*clients: Any, limit: int = SQS_MAX_BYTES) -> Iterator[SentMessages]:
    """While open, ``SendMessage`` over ``limit`` bytes is answered with SQS's error; nothing is sent."""
    log = SentMessages(limit)
    pending: list[dict[str, Any]] = []

    def keep(params: dict[str, Any], **_: Any) -> None:
        pending.append(dict(params))

    def answer(**_: Any) -> Any:
        params = pending.pop()
        if sqs_message_size(params["MessageBody"], params.get("MessageAttributes")) > limit:
            log.refused.append(params)
            return error_answer("InvalidParameterValue", 400)
        log.sent.append(params)
        return None

    hooks = [
        ("before-parameter-build.sqs.SendMessage", keep),
        ("before-call.sqs.SendMessage", answer),
    ]
    for client in clients:
        for event, hook in hooks:
            client.meta.events.register(event, hook)
    try:
        yield log
    finally:
        for client in clients:
            for event, hook in hooks:
                client.meta.events.unregister(event, hook)

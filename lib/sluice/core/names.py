"""Deterministic execution names.

A name is derived from the payload key and the SQS message id, so:

* the same message, redelivered after a crash, always gets the same name, and Step Functions
  refuses to run a name twice (90 days), so it can never start a second execution;
* a new message for the same payload (a re-submission) gets a new name and can run again once the
  earlier run has ended;
* keys that look alike once sanitised (``a/b`` and ``a:b``, or two unicode keys) still get different
  names, because the hash covers the raw key;
* a parked message that Sluice re-sends to the queue carries its original message id in the
  ``sluice-origin-message-id`` attribute, and the name comes from that id: however often it is
  re-sent, it names one execution.

Shape: ``<readable prefix>-<32 hex digits>``, at most 80 characters of ``[A-Za-z0-9_-]``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

MAX_NAME_LENGTH = 80
PREFIX_LENGTH = 40
DIGEST_LENGTH = 32  # 128 bits of SHA-256
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
ORIGIN_ATTRIBUTE = "sluice-origin-message-id"
MAX_ORIGIN_LENGTH = 128
# What SQS takes in a deduplication id, which a re-sent message's is made from: 1-128 alphanumeric
# or punctuation characters (ASCII).
ORIGIN_PATTERN = re.compile(r"[!-~]{1,128}", re.ASCII)


def origin_id(message_id: str, attributes: Mapping[str, str]) -> str:
    """The id a message's execution name derives from: its original id when Sluice re-sent it. A
    message whose origin is malformed is dead-lettered at receipt (``sluice.features.attributes``); one seen
    before that check is named by its own id."""
    origin = attributes.get(ORIGIN_ATTRIBUTE, "")
    return origin if ORIGIN_PATTERN.fullmatch(origin) else message_id


def execution_name(key: str, message_id: str) -> str:
    digest = hashlib.sha256(f"{key}\x00{message_id}".encode("utf-8", "surrogatepass")).hexdigest()
    prefix = _UNSAFE.sub("-", key).strip("-_")[:PREFIX_LENGTH].strip("-_")
    name = f"{prefix}-{digest[:DIGEST_LENGTH]}" if prefix else digest[:DIGEST_LENGTH]
    assert NAME_PATTERN.match(name), name
    return name


def named_entry(key: str, origin: str) -> str:
    """A parked message's id in a waiting room's sets and item keys, by the name it runs under. With a
    space, which no origin id holds (``ORIGIN_PATTERN``): never the id of an item keyed by a message
    id, whatever a producer forges."""
    return f"name {execution_name(key, origin)}"


def execution_arn(state_machine_arn: str, name: str) -> str:
    """``arn:<partition>:states:<region>:<account>:stateMachine:<sm>`` → that machine's execution ARN."""
    parts = state_machine_arn.split(":")
    if len(parts) < 7 or parts[2] != "states" or parts[5] != "stateMachine":
        raise ValueError(f"not a state machine ARN: {state_machine_arn!r}")
    return ":".join([*parts[:5], "execution", parts[6], name])

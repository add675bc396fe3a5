"""SQS's rules on what a send may carry, answered as SQS answers them, as a botocore hook.

moto takes a deduplication id or group id of any characters, an empty or control-character
attribute value, a non-numeric ``Number``; SQS refuses each (``InvalidParameterValue``, or
``InvalidMessageContents`` for a body character outside the XML range). ``sqs_rules`` installs, on a
boto3 session (every client made from it afterwards) or on given clients, a ``before-call`` hook on
``SendMessage`` and ``SendMessageBatch`` that refuses such a request, or such a batch entry (in the
answer's ``Failed`` list, as SQS reports an entry it refuses), with SQS's error; nothing refused
reaches moto. Every refusal is counted in ``SqsRules.refused``.

The rules (Amazon SQS Developer Guide, "Amazon SQS message attributes", and the API reference of
SendMessage): a deduplication id and a group id are 1-128 alphanumeric or punctuation characters; a
message has at most 10 attributes; an attribute name is 1-256 of ``A-Za-z0-9_-.``, does not start
with ``AWS.`` or ``Amazon.`` (any case), has no ``..`` and does not start or end with ``.``; a data
type is ``String``, ``Number`` or ``Binary``, optionally followed by ``.<label>``; a string value is
not empty and holds only XML characters (``#x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD |
#x10000-#x10FFFF``); a number has at most 38 significant digits and lies between -10^128 and
10^126; the body is not empty and holds only XML characters; body and attributes (names, data
types, values) are at most ``limit`` bytes.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from tests.support.bad_input import SQS_MAX_BYTES, sqs_message_size
from tests.support.hooks import _Http

_ID = re.compile(r"[!-~]{1,128}", re.ASCII)  # alphanumerics and punctuation
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}", re.ASCII)
_TYPE = re.compile(r"(String|Number|Binary)(\.[A-Za-z0-9_.-]{1,200})?", re.ASCII)
_XML = re.compile(r"[\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]*")
_CONTEXT = "sqs-rules"


@dataclass(frozen=True, slots=True)
class Refusal:
    code: str
    message: str


@dataclass
class SqsRules:
    """What the hook refused: (operation, code, message), in order."""

    limit: int = SQS_MAX_BYTES
    refused: list[tuple[str, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refuse(self, operation: str, refusal: Refusal) -> None:
        with self.lock:
            self.refused.append((operation, refusal.code, refusal.message))


def refusal(entry: dict[str, Any], *, fifo: bool, limit: int = SQS_MAX_BYTES) -> Refusal | None:
    """Why SQS refuses this send (a SendMessage request or a batch entry), or None."""
    for parameter in ("MessageDeduplicationId", "MessageGroupId"):
        value = entry.get(parameter)
        if value is None:
            continue
        if not isinstance(value, str) or not _ID.fullmatch(value):
            return _invalid(
                f"Value {value} for parameter {parameter} is invalid. Reason: {parameter} can only "
                "include alphanumeric and punctuation characters. 1 to 128 in length."
            )
    if fifo and "MessageGroupId" not in entry:
        return _invalid("The request must contain the parameter MessageGroupId.")
    body = entry.get("MessageBody", "")
    if not body:
        return _invalid("The request must contain the parameter MessageBody.")
    if not _XML.fullmatch(body):
        return Refusal("InvalidMessageContents", "Invalid characters found.")
    attributes = entry.get("MessageAttributes") or {}
    if len(attributes) > 10:
        return _invalid(f"Number of message attributes [{len(attributes)}] exceeds the allowed maximum [10].")
    for name, value in attributes.items():
        why = _attribute(name, value)
        if why is not None:
            return why
    size = sqs_message_size(body, attributes)
    if size > limit:
        return _invalid(
            f"One or more parameters are invalid. Reason: Message must be shorter than {limit} bytes."
        )
    return None


def _attribute(name: str, value: dict[str, Any]) -> Refusal | None:
    lowered = name.lower()
    if (
        not _NAME.fullmatch(name)
        or lowered.startswith(("aws.", "amazon."))
        or ".." in name
        or name.startswith(".")
        or name.endswith(".")
    ):
        return _invalid(f"Message (user) attribute name '{name}' is invalid.")
    data_type = value.get("DataType", "")
    if not _TYPE.fullmatch(data_type):
        return _invalid(f"The message attribute '{name}' has an invalid message attribute type.")
    if data_type.startswith("Binary"):
        return None if value.get("BinaryValue") else _empty(name)
    text = value.get("StringValue")
    if not text:
        return _empty(name)
    if not _XML.fullmatch(text):
        return _invalid(f"Message (user) attribute '{name}' value contains invalid characters.")
    if data_type.startswith("Number") and not _number(text):
        return _invalid(f"Can't cast message (user) attribute '{name}' to a number.")
    return None


def _number(text: str) -> bool:
    try:
        number = Decimal(text.strip())
    except InvalidOperation:
        return False
    if not number.is_finite():
        return False
    digits = number.normalize().as_tuple().digits
    return len(digits) <= 38 and (number == 0 or Decimal("-1e128") <= number <= Decimal("1e126"))


def _empty(name: str) -> Refusal:
    return _invalid(f"Message (user) attribute '{name}' must contain a non-empty message attribute value.")


def _invalid(message: str) -> Refusal:
    return Refusal("InvalidParameterValue", message)


def _answer(refused: Refusal) -> tuple[_Http, dict[str, Any]]:
    parsed = {
        "Error": {"Code": refused.code, "Message": refused.message, "Type": "Sender"},
        "ResponseMetadata": {"HTTPStatusCode": 400, "HTTPHeaders": {}},
    }
    return _Http(400), parsed


@contextmanager
def sqs_rules(session: Any = None, *clients: Any, limit: int = SQS_MAX_BYTES) -> Iterator[SqsRules]:
    """While open, sends that SQS would refuse are refused as SQS does; see the module docstring.
    ``session``: a boto3 session whose clients made from now on are hooked; ``clients``: clients
    made already."""
    rules = SqsRules(limit)

    def keep(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        fifo = str(params.get("QueueUrl", "")).endswith(".fifo")
        if "Entries" not in params:
            context[_CONTEXT] = refusal(params, fifo=fifo, limit=limit)
            return
        # A batch: the entries SQS refuses are taken out of the request and reported as failed.
        failed, kept = [], []
        for entry in params["Entries"]:
            why = refusal(entry, fifo=fifo, limit=limit)
            if why is None:
                kept.append(entry)
            else:
                failed.append(
                    {"Id": entry.get("Id", ""), "SenderFault": True, "Code": why.code, "Message": why.message}
                )
                rules.refuse("SendMessageBatch", why)
        params["Entries"] = kept
        context[_CONTEXT] = failed
        context[_CONTEXT + "-empty"] = not kept

    def answer(context: dict[str, Any], **_: Any) -> Any:
        kept = context.get(_CONTEXT)
        if isinstance(kept, Refusal):
            rules.refuse("SendMessage", kept)
            return _answer(kept)
        return None

    def batch_answer(context: dict[str, Any], **_: Any) -> Any:
        failed = context.get(_CONTEXT) or []
        if failed and context.get(_CONTEXT + "-empty"):  # every entry refused: nothing reaches SQS
            # after-call, which runs for this answer too, reports the refused entries
            return _Http(200), {"Successful": [], "Failed": [], "ResponseMetadata": {"HTTPStatusCode": 200}}
        return None

    def add_failed(parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        failed = context.get(_CONTEXT) or []
        if failed and "Error" not in parsed:
            parsed.setdefault("Failed", []).extend(failed)

    hooks = [
        ("before-parameter-build.sqs.SendMessage", keep),
        ("before-parameter-build.sqs.SendMessageBatch", keep),
        ("before-call.sqs.SendMessage", answer),
        ("before-call.sqs.SendMessageBatch", batch_answer),
        ("after-call.sqs.SendMessageBatch", add_failed),
    ]
    emitters = [client.meta.events for client in clients]
    if session is not None:
        emitters.append(session.events)
    for emitter in emitters:
        for event, hook in hooks:
            emitter.register(event, hook)
    try:
        yield rules
    finally:
        for emitter in emitters:
            for event, hook in hooks:
                emitter.unregister(event, hook)

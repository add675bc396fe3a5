"""Turn a raw SQS message into a ``Payload`` or an ``InvalidPayload`` with a reason.

Rules (the same for ``sluice enqueue`` and for the launcher):

* the body is UTF-8 JSON, an object, not empty, nested at most ``MAX_DEPTH`` levels, with no lone
  surrogate in any string, and at most 262,144 bytes (the Step Functions input limit);
* the payload key is the ``id`` field when it is a non-empty string, else the field named by
  ``--key-field`` at enqueue time, else the SHA-256 of the canonical JSON (sorted keys, no spaces).
  ``sluice enqueue`` sends the key it chose as the ``sluice-key`` message attribute; the launcher
  uses that attribute when present and derives the key the same way when it is missing (a message
  sent with the AWS CLI, say);
* a key is at most ``MAX_KEY_LENGTH`` characters with no control character.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sluice.errors import InvalidPayload
from sluice.model import Message, Payload

MAX_INPUT_BYTES = 262_144
MAX_DEPTH = 64
MAX_KEY_LENGTH = 512
KEY_ATTRIBUTE = "sluice-key"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def parse_object(text: str) -> dict[str, Any]:
    """Parse and check one JSON object; raise ``InvalidPayload`` with a reason a person can act on."""
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidPayload("body is not valid UTF-8 (it holds a lone surrogate)") from None
    if size > MAX_INPUT_BYTES:
        raise InvalidPayload(
            f"payload is {size:,} bytes; Step Functions accepts at most {MAX_INPUT_BYTES:,} bytes of input"
        )
    try:
        value = json.loads(text)
    except RecursionError:
        raise InvalidPayload(f"JSON is nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise InvalidPayload(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(value, dict):
        raise InvalidPayload(f"payload must be a JSON object, got {_json_type(value)}")
    if not value:
        raise InvalidPayload("payload is an empty JSON object: nothing to run and no key")
    _check_tree(value)
    return value


def payload_key(obj: dict[str, Any], *, key_field: str | None = None) -> str:
    """The key that identifies a payload: ``id``, then ``key_field``, then the content hash."""
    for field_name in ("id", key_field):
        candidate = obj.get(field_name) if field_name else None
        if isinstance(candidate, str) and candidate:
            return check_key(candidate, source=f"field {field_name!r}")
    return content_hash(obj)


def check_key(key: str, *, source: str = "key") -> str:
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidPayload(f"{source} is {len(key):,} characters; keys are at most {MAX_KEY_LENGTH}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
        raise InvalidPayload(f"{source} contains a control character")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPayload(f"{source} holds a lone surrogate") from None
    return key


def validate_message(message: Message) -> Payload:
    attribute_key = message.attributes.get(KEY_ATTRIBUTE)
    if attribute_key:
        attribute_key = check_key(attribute_key, source=f"message attribute {KEY_ATTRIBUTE!r}")
    try:
        obj = parse_object(message.body)
    except InvalidPayload as exc:
        exc.key = attribute_key  # known from the attribute: the refusal is recorded on the payload
        raise
    key = attribute_key or payload_key(obj)
    return Payload(key=key, body=message.body, message=message)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array"}.get(
        type(value), type(value).__name__
    )


def _check_tree(value: Any) -> None:
    """Depth limit and lone surrogates, iteratively (a recursive walk would be the crash it prevents)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InvalidPayload(f"JSON is nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, dict):
            for k, v in node.items():
                _check_string(k)
                stack.append((v, depth + 1))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
        elif isinstance(node, str):
            _check_string(node)


def _check_string(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPayload(
            "a string holds a lone surrogate (\\ud800-\\udfff), which is not valid Unicode"
        ) from None

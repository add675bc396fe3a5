"""Turn a raw SQS message into a ``Payload`` or an ``InvalidPayload`` with a reason.

Rules (the same for ``sluice enqueue`` and for the launcher):

* the body is UTF-8 JSON, an object, not empty, nested at most ``MAX_DEPTH`` levels, with no lone
  surrogate in any string, and at most 262,144 bytes (the Step Functions input limit);
* the payload key is the ``id`` field when it is a non-empty string, else the field named by
  ``--key-field`` at enqueue time, else the SHA-256 of the canonical JSON (sorted keys, no spaces).
  ``sluice enqueue`` sends the key it chose as the ``sluice-key`` message attribute; the launcher
  uses that attribute when present and derives the key the same way when it is missing (a message
  sent with the AWS CLI, say);
* a key is at most ``MAX_KEY_BYTES`` bytes of UTF-8 with no control character: the table's item
  keys are ``PAYLOAD#<key>``, and DynamoDB refuses a partition key over 2,048 bytes;
* every number is one Python and Step Functions can take: an integer has at most
  ``MAX_INT_DIGITS`` digits (Python's limit on reading integers), a float is finite (``1e999``
  would become ``Infinity``), and ``NaN`` and ``Infinity``, which Python reads, are not JSON;
* a message carrying ``TRUNCATED_ATTRIBUTE`` is a dead-letter note standing in for a body too big to
  keep (redriven by mistake), not a payload.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator
from typing import Any, NoReturn

from sluice.core.errors import ConfigurationError, InvalidPayload
from sluice.core.model import Message, Payload

MAX_INPUT_BYTES = 262_144
MAX_DEPTH = 64
MAX_KEY_BYTES = 1_024  # with the longest prefix (PAYLOAD#), well under DynamoDB's 2,048
MAX_INT_DIGITS = 4_300  # Python's default int_max_str_digits
KEY_ATTRIBUTE = "sluice-key"
TRUNCATED_ATTRIBUTE = "sluice-body-truncated"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def parse_object(text: str, *, max_bytes: int = MAX_INPUT_BYTES) -> dict[str, Any]:
    """Parse and check one JSON object; raise ``InvalidPayload`` with a reason a person can act on.
    ``max_bytes``: larger for a payload ``sluice enqueue`` stores in the bucket (``sluice.features.pointers``)."""
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidPayload("body is not valid UTF-8 (it holds a lone surrogate)") from None
    if size > max_bytes:
        if max_bytes == MAX_INPUT_BYTES:
            raise InvalidPayload(
                f"payload is {size:,} bytes; Step Functions accepts at most {MAX_INPUT_BYTES:,} bytes of input"
            )
        raise InvalidPayload(f"payload is {size:,} bytes; at most {max_bytes:,} bytes can be stored")
    try:
        value = json.loads(
            text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_refuse_constant
        )
    except RecursionError:
        raise InvalidPayload(f"JSON is nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise InvalidPayload(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:  # a number Python will not read (a lower int_max_str_digits, say)
        raise InvalidPayload(f"JSON cannot be read: {exc}") from None
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
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidPayload(f"{source} holds a lone surrogate") from None
    if size > MAX_KEY_BYTES:
        raise InvalidPayload(f"{source} is {size:,} bytes in UTF-8; keys are at most {MAX_KEY_BYTES:,} bytes")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
        raise InvalidPayload(f"{source} contains a control character")
    return key


def validate_message(message: Message) -> Payload:
    attribute_key = message.attributes.get(KEY_ATTRIBUTE)
    if attribute_key:
        attribute_key = check_key(attribute_key, source=f"message attribute {KEY_ATTRIBUTE!r}")
    try:
        if TRUNCATED_ATTRIBUTE in message.attributes:
            raise InvalidPayload(
                f"a dead-letter note (message attribute {TRUNCATED_ATTRIBUTE!r}) stands in for a body "
                "too big to keep; it cannot run: send the original payload again"
            )
        obj = parse_object(message.body)
    except InvalidPayload as exc:
        exc.key = attribute_key  # known from the attribute: the refusal is recorded on the payload
        raise
    key = attribute_key or payload_key(obj)
    return Payload(key=key, body=message.body, message=message)


def json_structure(text: str) -> Iterator[tuple[int, int, str]]:
    """(index, depth before it, character) of each bracket and comma of JSON text outside its strings,
    read without parsing it."""
    depth, in_string, escaped = 0, False, False
    for i, c in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            yield i, depth, c
            depth += 1
        elif c in "]}":
            depth -= 1
            yield i, depth, c
        elif c == ",":
            yield i, depth, c


def json_depth(text: str) -> int:
    """How deep JSON text's arrays and objects nest (strings skipped), without parsing it: a guard
    to take before ``json.loads``, whose recursion a deep text exhausts."""
    return max((depth + 1 for _, depth, c in json_structure(text) if c in "[{"), default=0)


def _parse_int(digits: str) -> int:
    n = len(digits) - digits.startswith("-")
    if n > MAX_INT_DIGITS:
        raise InvalidPayload(f"a number has more than {MAX_INT_DIGITS:,} digits ({n:,})")
    return int(digits)


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        shown = text if len(text) <= 40 else f"{text[:37]}..."
        raise InvalidPayload(f"number {shown} is out of range for a 64-bit float")
    return value


def _refuse_constant(name: str) -> NoReturn:
    raise InvalidPayload(f"{name} is not JSON")


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


MAX_CEILING = 10_000  # MAX's ceiling, and a lane's or a key's: maxConcurrency's in stack/config.js
WHOLE = re.compile(r"[0-9]+", re.ASCII)  # str.isdigit and int() also take "²" and other scripts' digits


class MaxAboveCeiling(ConfigurationError):
    """A whole number above ``MAX_CEILING``: refused, never put in force."""


def whole_number(raw: str, *, ceiling: int) -> int | None:
    """``raw`` as a whole number from 0 to ``ceiling``, in ASCII digits; None when it is not one.
    Raises ``MaxAboveCeiling`` for a larger one, however many digits it has (no ``int`` is built)."""
    text = str(raw).strip()
    if not WHOLE.fullmatch(text):
        return None
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(ceiling)) or int(digits) > ceiling:
        shown = digits if len(digits) <= 30 else f"a number of {len(digits):,} digits"
        raise MaxAboveCeiling(f"{shown} is above the ceiling: at most {ceiling:,}")
    return int(digits)

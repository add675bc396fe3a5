import json
import sys

import pytest

from sluice.core.errors import InvalidPayload
from sluice.core.model import Message
from sluice.core.validation import (
    KEY_ATTRIBUTE,
    MAX_DEPTH,
    MAX_INPUT_BYTES,
    TRUNCATED_ATTRIBUTE,
    canonical_json,
    content_hash,
    parse_object,
    payload_key,
    validate_message,
)


def msg(body: str, **attributes: str) -> Message:
    return Message("mid-1", "rh-1", body, "g", 1, attributes)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("not json", "not JSON: Expecting value at line 1 column 1"),
        ("[1, 2]", "payload must be a JSON object, got an array"),
        ("42", "payload must be a JSON object, got a number"),
        ("null", "payload must be a JSON object, got null"),
        ('"text"', "payload must be a JSON object, got a string"),
        ("{}", "payload is an empty JSON object: nothing to run and no key"),
        ('{"id": "\\ud800"}', "a string holds a lone surrogate"),
        ('{"a": 1', "not JSON: Expecting ',' delimiter at line 1 column 8"),
    ],
)
def test_unusable_bodies_are_refused_with_a_reason(body, reason):
    with pytest.raises(InvalidPayload) as err:
        validate_message(msg(body))
    assert err.value.reason.startswith(reason)


def test_too_big_for_step_functions():
    body = json.dumps({"id": "x", "blob": "a" * MAX_INPUT_BYTES})
    with pytest.raises(
        InvalidPayload, match=r"payload is 262,\d{3} bytes; Step Functions accepts at most 262,144"
    ):
        parse_object(body)


def test_exactly_at_the_limit_is_accepted():
    skeleton = json.dumps({"id": "x", "blob": ""})
    body = json.dumps({"id": "x", "blob": "a" * (MAX_INPUT_BYTES - len(skeleton))})
    assert len(body.encode()) == MAX_INPUT_BYTES
    assert parse_object(body)["id"] == "x"


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 100_000])
def test_deep_nesting_is_refused_not_a_crash(depth):
    body = '{"id":"x","n":' + "[" * depth + "]" * depth + "}"
    with pytest.raises(InvalidPayload, match="nested deeper than"):
        parse_object(body)


def test_key_is_id_then_key_field_then_content_hash():
    assert payload_key({"id": "scene-1", "other": "o"}, key_field="other") == "scene-1"
    assert payload_key({"id": "", "other": "o"}, key_field="other") == "o"
    assert payload_key({"id": 7, "other": "o"}, key_field="other") == "o"
    obj = {"b": 1, "a": [1, 2]}
    assert payload_key(obj) == content_hash(obj) == content_hash({"a": [1, 2], "b": 1})
    assert canonical_json(obj) == '{"a":[1,2],"b":1}'


def test_key_attribute_from_enqueue_wins_and_is_checked():
    assert validate_message(msg('{"id": "from-body"}', **{KEY_ATTRIBUTE: "from-attr"})).key == "from-attr"
    with pytest.raises(InvalidPayload, match="message attribute 'sluice-key' is 10,000 bytes in UTF-8"):
        validate_message(msg('{"id": "x"}', **{KEY_ATTRIBUTE: "k" * 10_000}))


def test_missing_attributes_fall_back_to_the_body():
    assert validate_message(msg('{"id": "scene-1"}')).key == "scene-1"


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("k" * 10_000, "field 'id' is 10,000 bytes in UTF-8; keys are at most 1,024 bytes"),
        ("a\nb", "control character"),
    ],
)
def test_unusable_ids(key, reason):
    with pytest.raises(InvalidPayload, match=reason):
        validate_message(msg(json.dumps({"id": key})))


@pytest.mark.parametrize(
    ("key", "size"),
    [("\U0001f600" * 511, 2_044), ("é" * 512 + "a", 1_025), ("k" * 1_025, 1_025), ("日" * 342, 1_026)],
)
def test_keys_are_limited_by_utf8_bytes(key, size):
    """511 four-byte characters passed a 512-character rule, but ``PAYLOAD#<key>`` is then over
    DynamoDB's 2,048-byte partition key limit: every claim failed as a configuration error."""
    reason = f"is {size:,} bytes in UTF-8; keys are at most 1,024 bytes"
    for body in (json.dumps({"id": key}), json.dumps({"id": key}, ensure_ascii=False)):
        with pytest.raises(InvalidPayload, match=f"field 'id' {reason}"):
            validate_message(msg(body))
    with pytest.raises(InvalidPayload, match=f"attribute 'sluice-key' {reason}"):
        validate_message(msg('{"id": "x"}', **{KEY_ATTRIBUTE: key}))


@pytest.mark.parametrize("key", ["\U0001f600" * 256, "k" * 1_024, "é" * 512, "ключ/" * 100])
def test_keys_at_the_byte_limit_are_accepted(key):
    assert validate_message(msg(json.dumps({"id": key}))).key == key
    assert validate_message(msg('{"id": "x"}', **{KEY_ATTRIBUTE: key})).key == key


@pytest.mark.parametrize(
    ("number", "reason"),
    [
        ("1" * 5_000, "a number has more than 4,300 digits (5,000)"),
        ("-" + "9" * 4_301, "a number has more than 4,300 digits (4,301)"),
        ("1" * 100_000, "a number has more than 4,300 digits (100,000)"),
        ("1e999", "number 1e999 is out of range for a 64-bit float"),
        ("-1.5e400", "number -1.5e400 is out of range for a 64-bit float"),
        ("NaN", "NaN is not JSON"),
        ("Infinity", "Infinity is not JSON"),
        ("-Infinity", "-Infinity is not JSON"),
    ],
)
def test_numbers_python_or_step_functions_cannot_take_are_refused_not_a_crash(number, reason):
    """A 5,000-digit integer made ``json.loads`` raise ``ValueError`` (Python's limit on integer
    digits), which crashed every tick. Non-finite numbers would reach Step Functions as ``Infinity``."""
    for where in ('{"id": "x", "n": %s}', '{"id": "x", "deep": [{"n": %s}]}'):
        with pytest.raises(InvalidPayload) as err:
            validate_message(msg(where % number, **{KEY_ATTRIBUTE: "k"}))
        assert err.value.reason == reason
        assert err.value.key == "k"  # recorded on the payload, as for any refused body


def test_numbers_at_the_limits_are_accepted():
    digits = "7" * 4_300
    obj = parse_object(f'{{"id": "x", "big": {digits}, "neg": -{digits}, "f": 1.7e308, "tiny": 1e-999}}')
    assert obj["big"] == int("7" * 4_300) and obj["neg"] == -obj["big"]
    assert content_hash(obj)  # the key of a payload without an id


def test_the_body_is_passed_on_exactly_as_sent():
    body = '{ "id": "x",\n  "z": 1.50, "a": "\\u00e9" }'
    assert validate_message(msg(body)).body == body


def test_a_lower_python_digit_limit_is_a_refusal_too():
    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        with pytest.raises(InvalidPayload, match=r"^JSON cannot be read: Exceeds the limit \(640 digits\)"):
            parse_object('{"id": "x", "n": ' + "1" * 1_000 + "}")
    finally:
        sys.set_int_max_str_digits(previous)


def test_a_dead_letter_note_redriven_by_mistake_does_not_run():
    """When a body was too big for its dead-letter copy, the DLQ holds a JSON note marked with the
    ``sluice-body-truncated`` attribute. Sent back to the queue, that note is not the payload."""
    note = json.dumps({"sluice-dead-letter-note": "…", "bytes": 262_144, "sha256": "0" * 64})
    with pytest.raises(InvalidPayload, match=r"a dead-letter note .* cannot run") as err:
        validate_message(msg(note, **{TRUNCATED_ATTRIBUTE: "262144", KEY_ATTRIBUTE: "k"}))
    assert err.value.key == "k"

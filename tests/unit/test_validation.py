import json

import pytest

from sluice.errors import InvalidPayload
from sluice.model import Message
from sluice.validation import (
    KEY_ATTRIBUTE,
    MAX_DEPTH,
    MAX_INPUT_BYTES,
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
    with pytest.raises(InvalidPayload, match="message attribute 'sluice-key' is 10,000 characters"):
        validate_message(msg('{"id": "x"}', **{KEY_ATTRIBUTE: "k" * 10_000}))


def test_missing_attributes_fall_back_to_the_body():
    assert validate_message(msg('{"id": "scene-1"}')).key == "scene-1"


@pytest.mark.parametrize(
    ("key", "reason"),
    [("k" * 10_000, "field 'id' is 10,000 characters; keys are at most 512"), ("a\nb", "control character")],
)
def test_unusable_ids(key, reason):
    with pytest.raises(InvalidPayload, match=reason):
        validate_message(msg(json.dumps({"id": key})))


def test_the_body_is_passed_on_exactly_as_sent():
    body = '{ "id": "x",\n  "z": 1.50, "a": "\\u00e9" }'
    assert validate_message(msg(body)).body == body

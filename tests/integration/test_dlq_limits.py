"""A dead-letter copy always fits SQS's size limit, so dead-lettering never fails.

SQS counts a message as its body plus each attribute's name, data type and value, in bytes, and
refuses one over 262,144 bytes. moto counts only the body's characters (against 1 MiB), so the SQS
client here carries ``sqs_size_limit``: a hook that answers an over-size ``SendMessage`` with the
error SQS gives, and keeps what was sent. Its size rule is written apart from Sluice's.
"""

from __future__ import annotations

import hashlib
import json
import uuid

import pytest

from sluice.adapters.aws.sqs import SqsQueue, dead_letter_copy, message_size
from sluice.core.model import Message, Outcome
from tests.support.bad_input import SQS_MAX_BYTES, sqs_message_size, sqs_size_limit

LIMIT = SQS_MAX_BYTES
SHORT_REASON = "payload must be a JSON object, got an array"
LONG_REASON = "Step Functions refused the input: " + "\U0001f600" * 2_000  # cut at 1,000 characters
KEY = "k" * 1_024


def message(body: str, **attributes: str) -> Message:
    return Message(str(uuid.uuid4()), "rh", body, "g", 3, attributes)


def body_of(size: int, char: str = "x") -> str:
    width = len(char.encode())
    return char * (size // width) + "y" * (size % width)


# -- the size computation ------------------------------------------------------------------------


def test_size_counts_body_and_each_attributes_name_type_and_value_in_bytes():
    attributes = {
        "sluice-key": {"DataType": "String", "StringValue": "ключ"},  # 10 + 6 + 8
        "n": {"DataType": "Number", "StringValue": "12"},  # 1 + 6 + 2
    }
    assert message_size("é\U0001f600", attributes) == 6 + 24 + 9
    assert message_size("é\U0001f600", attributes) == sqs_message_size("é\U0001f600", attributes)


@pytest.mark.parametrize("char", ["x", "é", "\U0001f600"])
@pytest.mark.parametrize("under", [0, 1, 40, 150, 200, 400, 1_500, 5_000, 20_000])
@pytest.mark.parametrize("reason", [SHORT_REASON, LONG_REASON])
@pytest.mark.parametrize("attributes", [{}, {"sluice-key": KEY, "trace": "t" * 4_000}])
def test_every_copy_fits(char, under, reason, attributes):
    original = message(body_of(LIMIT - under, char), **attributes)
    copy = dead_letter_copy(original, reason)
    assert sqs_message_size(copy.body, copy.attributes) <= LIMIT
    assert copy.attributes["sluice-source-message-id"]["StringValue"] == original.message_id
    assert copy.attributes["sluice-receive-count"] == {"DataType": "Number", "StringValue": "3"}


def test_a_copy_that_fits_is_the_message_with_the_reason():
    original = message('{"id": "x", "n": NaN}', **{"sluice-key": "x", "trace": "abc"})
    copy = dead_letter_copy(original, SHORT_REASON)
    assert copy.body == original.body
    assert {n: v["StringValue"] for n, v in copy.attributes.items()} == {
        "sluice-error": SHORT_REASON,
        "sluice-source-message-id": original.message_id,
        "sluice-receive-count": "3",
        "sluice-key": "x",
        "trace": "abc",
    }


def test_copied_attributes_go_first_the_largest_first():
    original = message(body_of(LIMIT - 6_000), **{"sluice-key": KEY, "trace": "t" * 4_900})
    copy = dead_letter_copy(original, SHORT_REASON)
    assert copy.body == original.body
    assert copy.attributes["sluice-error"]["StringValue"] == SHORT_REASON
    assert "trace" not in copy.attributes and copy.attributes["sluice-key"]["StringValue"] == KEY


def test_then_the_reason_is_shortened():
    original = message(body_of(LIMIT - 1_000), **{"sluice-key": KEY})
    copy = dead_letter_copy(original, LONG_REASON)
    assert copy.body == original.body and "sluice-key" not in copy.attributes
    reason = copy.attributes["sluice-error"]["StringValue"]
    assert reason.endswith("…") and LONG_REASON.startswith(reason[:-1])
    assert 128 <= len(reason.encode()) < 1_000
    assert copy.size == sqs_message_size(copy.body, copy.attributes) > LIMIT - 4


@pytest.mark.parametrize("under", [0, 100])
def test_last_the_body_is_replaced_by_a_note_that_points_at_it(under):
    original = message(body_of(LIMIT - under, "é"), **{"sluice-key": KEY})
    copy = dead_letter_copy(original, LONG_REASON)
    raw = original.body.encode()
    note = json.loads(copy.body)
    assert "too large" in note.pop("sluice-dead-letter-note")
    assert note == {
        "source_message_id": original.message_id,
        "bytes": len(raw),
        "sha256": hashlib.sha256(raw).hexdigest(),
    }
    assert copy.attributes["sluice-body-truncated"] == {"DataType": "Number", "StringValue": str(len(raw))}
    # with the body gone there is room again: the whole reason (1,000 characters) and the key
    assert copy.attributes["sluice-error"]["StringValue"] == LONG_REASON[:1_000]
    assert copy.attributes["sluice-key"]["StringValue"] == KEY


def test_a_reason_sqs_would_refuse_is_made_printable():
    copy = dead_letter_copy(message("x"), "bad \x00 byte and a lone \ud800 surrogate")
    assert copy.attributes["sluice-error"]["StringValue"] == "bad \ufffd byte and a lone \ufffd surrogate"


# -- against moto, with SQS's size rule ------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "attributes", "reason", "kept"),
    [
        (body_of(LIMIT), {}, SHORT_REASON, False),
        (body_of(LIMIT - 100, "é"), {}, SHORT_REASON, False),
        (body_of(LIMIT - 200, "é"), {}, SHORT_REASON, True),
        (body_of(LIMIT - 6_000), {"sluice-key": KEY, "trace": "t" * 4_900}, SHORT_REASON, True),
        (body_of(LIMIT - 1_000), {"sluice-key": KEY}, LONG_REASON, True),
        ('{"id": "x"}', {"sluice-key": "x"}, LONG_REASON, True),
    ],
    ids=[
        "at the limit",
        "100 bytes under",
        "200 bytes under",
        "with big attributes",
        "with a long reason",
        "small",
    ],
)
def test_send_to_dlq_sends_what_sqs_accepts(stack, body, attributes, reason, kept):
    sqs = stack.client("sqs")
    queue = SqsQueue(sqs, stack.settings.queue_url, stack.settings.dlq_url)
    original = message(body, **attributes)

    with sqs_size_limit(sqs) as log:
        queue.send_to_dlq(original, reason)

    [sent] = log.to(stack.settings.dlq_url)
    assert log.refused == [] and sqs_message_size(sent["MessageBody"], sent["MessageAttributes"]) <= LIMIT
    [dead] = stack.dlq_messages()
    assert (dead["Body"] == body) is kept
    assert dead["MessageAttributes"]["sluice-source-message-id"]["StringValue"] == original.message_id
    assert reason.startswith(dead["MessageAttributes"]["sluice-error"]["StringValue"].removesuffix("…"))


def test_a_message_at_the_sqs_maximum_is_dead_lettered_and_its_group_runs_on(stack):
    """The message fills SQS's limit with its body and ``sluice-key`` attribute; the reason
    attributes would push its copy over. The copy leaves the attribute out and keeps the body."""
    key_attribute = sqs_message_size("", {"sluice-key": {"DataType": "String", "StringValue": KEY}})
    body = '["' + "a" * (LIMIT - key_attribute - 4) + '"]'
    assert sqs_message_size(body, {"sluice-key": {"DataType": "String", "StringValue": KEY}}) == LIMIT
    bad = stack.send(body, group="g", sluice_key=KEY)
    stack.send({"id": "behind"}, group="g")

    rt = stack.runtime()
    with sqs_size_limit(rt.client("sqs")) as log:
        summary = rt.launcher().tick()

    assert (summary.n(Outcome.INVALID), summary.n(Outcome.STARTED)) == (1, 1)
    assert stack.inputs() == [{"id": "behind"}]
    assert log.refused == []
    [dead] = stack.dlq_messages()
    assert dead["Body"] == body
    assert dead["MessageAttributes"]["sluice-error"]["StringValue"] == SHORT_REASON
    assert dead["MessageAttributes"]["sluice-source-message-id"]["StringValue"] == bad
    assert "sluice-key" not in dead["MessageAttributes"]
    assert stack.queue_counts() == (0, 0)


def test_a_copy_keeps_its_lane_before_any_other_attribute():
    """A redrive sends a dead letter back to its lane's queue (``sluice-lane``): of ten attributes,
    the seven a copy has room for include the lane, however small the others are."""
    others = {f"a{i}": "x" for i in range(9)}
    original = message('{"id": "x", "n": NaN}', **{**others, "sluice-lane": "gpu-batch"})
    copy = dead_letter_copy(original, SHORT_REASON)
    assert copy.attributes["sluice-lane"]["StringValue"] == "gpu-batch"

"""The reference model (tests/support/model.py) judges an effect's send after its release as SQS
would: a copy is enqueued unless SQS took one with the same deduplication id in the last five minutes,
and each copy SQS takes opens a new five minutes (a dropped copy opens none). Seed 1204211244
(tests/explorer/README.md) was a false report of a model that counted the five minutes from the first
copy ever sent."""

from __future__ import annotations

import hashlib

from sluice.core.clock import FakeClock
from tests.support.model import Model, effect_origin
from tests.support.steps import ORIGIN_ATTRIBUTE, Call

QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/main.fifo"
NAME = "p1-8f261759a4e5a5b2240b4804227d13ba"


def model() -> Model:
    m = Model(dlq_url="", clock=FakeClock(), max_concurrency=5, visibility_timeout=30)
    m.expect_effects(NAME, 1)
    return m


def send_effect(m: Model, container: str = "B") -> None:
    """The effect's message as the release sends it (``SqsQueue.requeue``: its origin id, and a
    deduplication id of that origin and the execution's name)."""
    origin = effect_origin(NAME, 0)
    holder = hashlib.sha256(NAME.encode()).hexdigest()[:32]
    params = {
        "QueueUrl": QUEUE,
        "MessageBody": '{"id": "p0", "effect": 0}',
        "MessageGroupId": "g",
        "MessageDeduplicationId": f"{origin}-{holder}",
        "MessageAttributes": {ORIGIN_ATTRIBUTE: {"DataType": "String", "StringValue": origin}},
    }
    m.saw(Call(container, "sqs", "SendMessage", "effect", params), 200, {"MessageId": "sqs-id"})


def mark(m: Model) -> None:
    """``EFFECTS#<name>`` written: the effects' mark (a release, or a later success)."""
    item = {"pk": {"S": f"EFFECTS#{NAME}"}}
    m.saw(
        Call(
            "B",
            "dynamodb",
            "TransactWriteItems",
            "later_success",
            {"TransactItems": [{"Put": {"Item": item}}]},
        ),
        200,
        {},
    )


def test_a_copy_within_five_minutes_of_the_last_copy_taken_is_dropped_by_sqs() -> None:
    """The seed's timeline: a copy sent long ago (a release that crashed before its commit), then two
    releases at once 1,000 s later: B's copy is taken (five minutes passed), B commits, C's copy 10 s
    after B's is dropped. Nothing reaches the queue after the mark."""
    m = model()
    send_effect(m, "A")
    m.clock.advance(1000)
    send_effect(m, "B")
    mark(m)
    m.clock.advance(10)
    send_effect(m, "C")
    assert m.violations == []


def test_a_copy_five_minutes_after_the_last_copy_taken_is_enqueued_again() -> None:
    m = model()
    send_effect(m, "B")
    mark(m)
    m.clock.advance(301)
    send_effect(m, "C")
    assert len(m.violations) == 1 and "effects once:" in m.violations[0], m.violations


def test_a_dropped_copy_opens_no_new_five_minutes() -> None:
    """Copies at 0 s (taken), 200 s (dropped) and 400 s: the last is enqueued, 400 s after the copy
    SQS took, whatever was dropped between."""
    m = model()
    send_effect(m, "A")
    m.clock.advance(200)
    send_effect(m, "B")
    mark(m)
    m.clock.advance(200)
    send_effect(m, "C")
    assert len(m.violations) == 1 and "effects once:" in m.violations[0], m.violations

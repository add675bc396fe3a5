"""The reference model (tests/support/model.py) holds a parker to "no receive while parked": a
message it parked in its key's line and then returned to the queue is a broken promise, unless its
read of the payload's place after a lost park answer failed too (it cannot know it parked:
docs/protocol.md), and only for that container and that payload."""

from __future__ import annotations

import pytest

from sluice.core.clock import FakeClock
from tests.support.model import Model, Sent
from tests.support.steps import Call

DLQ = "https://sqs.us-east-1.amazonaws.com/123456789012/dlq.fifo"


def parked_by_a() -> Model:
    """Message m (payload p) received by container A and parked by it in key k's line."""
    m = Model(dlq_url=DLQ, clock=FakeClock(), max_concurrency=5, visibility_timeout=30)
    m.sent_message(Sent("m", '{"id": "p"}', "g", "m", "p"))
    m.saw(
        Call("A", "sqs", "ReceiveMessage", "receive", {}),
        200,
        {"Messages": [{"MessageId": "m", "ReceiptHandle": "r"}]},
    )
    item = {"pk": {"S": "KWAIT#k#0"}, "message_id": {"S": "m"}}
    m.saw(
        Call("A", "dynamodb", "TransactWriteItems", "key_park", {"TransactItems": [{"Put": {"Item": item}}]}),
        200,
        {},
    )
    return m


def place_read(container: str, key: str = "p") -> Call:
    return Call(container, "dynamodb", "GetItem", "read", {"Key": {"pk": {"S": f"KWAITOF#{key}"}}})


def returned(m: Model) -> list[str]:
    entries = [{"Id": "0", "ReceiptHandle": "r", "VisibilityTimeout": 0}]
    call = Call("A", "sqs", "ChangeMessageVisibilityBatch", "return", {"Entries": entries})
    m.saw(call, 200, {"Successful": [{"Id": "0"}]})
    return m.violations


def test_a_parked_message_returned_to_the_queue_breaks_the_promise():
    (violation,) = returned(parked_by_a())
    assert violation.startswith("key line (no receive while parked): message m was returned")


@pytest.mark.parametrize("failed", ["refused", "answer lost"])
def test_a_return_after_the_parkers_place_read_failed_is_accepted(failed):
    m = parked_by_a()
    if failed == "refused":
        m.saw(place_read("A"), 400, {"Error": {"Code": "ThrottlingException"}})
    else:
        m.saw(place_read("A"), 200, {"Item": {}})
        m.answer_lost(place_read("A"))
    assert returned(m) == []


@pytest.mark.parametrize("read", [place_read("B"), place_read("A", key="q")])
def test_a_failed_read_of_another_containers_or_payloads_place_excuses_nothing(read):
    m = parked_by_a()
    m.saw(read, 400, {"Error": {"Code": "ThrottlingException"}})
    assert len(returned(m)) == 1

"""The reference model (tests/support/model.py) holds a parker to "no receive while parked": a
message it parked in its key's line and then returned to the queue is a broken promise, unless its
read of its place (the line's item for its ticket) after a lost park answer failed too (it cannot
know it parked: docs/protocol.md), and only for that container and that place. When the parker holds two copies
of one message (a parker died before its delete, and the woken copy came back beside the
original), returning one of them while it deletes the other breaks nothing."""

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


def place_read(container: str, place: str = "KWAIT#k#0") -> Call:
    items = {"t": {"Keys": [{"pk": {"S": place}}], "ConsistentRead": True}}
    return Call(container, "dynamodb", "BatchGetItem", "read", {"RequestItems": items})


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
        m.saw(place_read("A"), 200, {"Responses": {"t": []}})
        m.answer_lost(place_read("A"))
    assert returned(m) == []


@pytest.mark.parametrize("read", [place_read("B"), place_read("A", place="KWAIT#k#1")])
def test_a_failed_read_of_another_containers_or_payloads_place_excuses_nothing(read):
    m = parked_by_a()
    m.saw(read, 400, {"Error": {"Code": "ThrottlingException"}})
    assert len(returned(m)) == 1


def two_copies_parked_by_a() -> Model:
    """Message m waited in key k's line; its parker died before deleting it, so m came back beside
    w, the copy of m its wake re-sent. A receives both in one batch and parks one of them again."""
    m = Model(dlq_url=DLQ, clock=FakeClock(), max_concurrency=5, visibility_timeout=30)
    m.sent_message(Sent("m", '{"id": "p"}', "g", "m", "p"))
    item = {"pk": {"S": "KWAIT#k#0"}, "message_id": {"S": "m"}}
    park = Call(
        "C", "dynamodb", "TransactWriteItems", "key_park", {"TransactItems": [{"Put": {"Item": item}}]}
    )
    m.saw(park, 200, {})
    wake = {"MessageAttributes": {"sluice-origin-message-id": {"StringValue": "m"}}}
    m.saw(Call("B", "sqs", "SendMessage", "key_wake", wake), 200, {"MessageId": "w"})
    messages = [{"MessageId": "m", "ReceiptHandle": "r"}, {"MessageId": "w", "ReceiptHandle": "rw"}]
    m.saw(Call("A", "sqs", "ReceiveMessage", "receive", {}), 200, {"Messages": messages})
    item = {"pk": {"S": "KWAIT#k#1"}, "message_id": {"S": "m"}}
    park = Call(
        "A", "dynamodb", "TransactWriteItems", "key_park", {"TransactItems": [{"Put": {"Item": item}}]}
    )
    m.saw(park, 200, {})
    return m


def give_back(m: Model, handle: str, step: str) -> list[str]:
    entries = [{"Id": "0", "ReceiptHandle": handle, "VisibilityTimeout": 60}]
    operation = "DeleteMessageBatch" if step == "delete" else "ChangeMessageVisibilityBatch"
    m.saw(Call("A", "sqs", operation, step, {"Entries": entries}), 200, {"Successful": [{"Id": "0"}]})
    return m.violations


def test_one_of_two_copies_returned_while_the_other_is_deleted_breaks_nothing():
    m = two_copies_parked_by_a()
    assert give_back(m, "rw", "return") == []
    assert give_back(m, "r", "delete") == []
    m.invocation_ended("A", "ok")
    assert m.violations == []


def test_both_copies_returned_break_the_promise():
    m = two_copies_parked_by_a()
    give_back(m, "rw", "return")
    (violation,) = give_back(m, "r", "return")
    assert violation.startswith("key line (no receive while parked): message m was returned")


def test_one_copy_returned_and_the_other_left_at_the_end_breaks_the_promise():
    m = two_copies_parked_by_a()
    give_back(m, "rw", "return")
    m.invocation_ended("A", "ok")
    (violation,) = m.violations
    assert "returned without deleting it" in violation


def test_a_copy_received_again_after_its_parker_died_may_be_returned_by_its_new_holder():
    """A parked m and died before its delete (a Lambda timeout): m came back when its visibility
    timeout ran out, and completion B received it and returned it (throttled). B's return is no
    breach of A's park (explorer seed 1208200707); A returning it before then still is."""
    m = parked_by_a()
    m.saw(
        Call("B", "sqs", "ReceiveMessage", "receive", {}),
        200,
        {"Messages": [{"MessageId": "m", "ReceiptHandle": "r2"}]},
    )
    entries = [{"Id": "0", "ReceiptHandle": "r2", "VisibilityTimeout": 0}]
    m.saw(
        Call("B", "sqs", "ChangeMessageVisibilityBatch", "return", {"Entries": entries}),
        200,
        {"Successful": [{"Id": "0"}]},
    )
    assert m.violations == []

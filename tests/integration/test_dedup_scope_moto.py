"""Deduplication on the stack's queues in both of SQS's scopes, with the real adapters on moto.

The stack's queues are high-throughput FIFO (``DeduplicationScope: messageGroup``): SQS drops a
repeated deduplication id within 5 minutes only in the same message group. moto ignores the scope,
and forgets an id once its message is deleted, so ``tests.support.sqs_dedup`` answers every send as
SQS does for the queue's scope. Every re-send Sluice makes goes to the group of the message it
re-sends, so both scopes drop it; a copy that does reach the queue in another group (which
``messageGroup`` lets through) carries the same origin id, names the same execution, and runs once
(docs/protocol.md "Execution names")."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from freezegun import freeze_time

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import Outcome, ParkedMessage
from sluice.core.names import execution_name
from sluice.features.effects import EFFECTS_FIELD
from sluice.features.parking import sweep
from sluice.launch.settings import DuplicatePolicy
from tests.support.aws import build_stack
from tests.support.hooks import Crash, crash_after
from tests.support.sqs_dedup import SqsDedup, sqs_dedup

SCOPES = {"queue": False, "messageGroup": True}  # scope → the stack's high_throughput


@pytest.fixture(params=sorted(SCOPES))
def scope(request) -> str:
    return request.param


@pytest.fixture
def dedup(session) -> Iterator[SqsDedup]:
    with sqs_dedup(session) as d:
        yield d


def _stack(session: Any, scope: str, **settings: Any) -> Any:
    stack = build_stack(session, high_throughput=SCOPES[scope], **settings)
    attrs = stack.client("sqs").get_queue_attributes(
        QueueUrl=stack.settings.queue_url, AttributeNames=["All"]
    )
    assert attrs["Attributes"]["DeduplicationScope"] == scope
    return stack


def _bodies(stack: Any) -> list[tuple[str, str]]:
    """The main queue's messages (drained): (body, group)."""
    return [(m["Body"], m["Attributes"]["MessageGroupId"]) for m in stack.drain(stack.settings.queue_url)]


# -- the hook: SQS's answer for each scope -----------------------------------------------------------


def test_a_repeat_in_its_group_is_dropped_in_both_scopes_for_5_minutes_even_after_a_delete(
    session, dedup, scope
):
    with freeze_time("2027-01-01 00:00:00") as frozen:
        stack = _stack(session, scope)
        first = stack.send({"id": "a"}, group="g", dedup="d1")
        assert _bodies(stack) == [('{"id": "a"}', "g")]  # received and deleted
        again = stack.send({"id": "a"}, group="g", dedup="d1")
        assert again == first  # accepted, with the first send's id, and not delivered
        assert _bodies(stack) == [] and dedup.dropped == [
            (stack.settings.queue_url, "g" * SCOPES[scope], "d1")
        ]
        frozen.tick(301)
        stack.send({"id": "a"}, group="g", dedup="d1")
        assert _bodies(stack) == [('{"id": "a"}', "g")]  # a new message past the window


def test_the_same_id_in_another_group_is_dropped_by_queue_scope_and_delivered_by_message_group_scope(
    session, dedup, scope
):
    stack = _stack(session, scope)
    stack.send({"id": "a"}, group="g1", dedup="d1")
    stack.send({"id": "a"}, group="g2", dedup="d1")
    groups = [group for _, group in _bodies(stack)]
    assert groups == (["g1", "g2"] if scope == "messageGroup" else ["g1"])


def test_a_batch_repeat_is_answered_as_sent_and_received_with_the_id_it_was_sent_with(session, dedup, scope):
    stack = _stack(session, scope)
    sqs = stack.client("sqs")
    url = stack.settings.queue_url
    entries = [
        {"Id": str(i), "MessageBody": f'{{"n": {i}}}', "MessageGroupId": group, "MessageDeduplicationId": "d"}
        for i, group in enumerate(["g1", "g1", "g2"])
    ]
    answer = sqs.send_message_batch(QueueUrl=url, Entries=entries)
    assert sorted(s["Id"] for s in answer["Successful"]) == ["0", "1", "2"] and not answer.get("Failed")
    ids = {s["Id"]: s["MessageId"] for s in answer["Successful"]}
    assert ids["1"] == ids["0"]  # the repeat in its group: the first one's message id
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])["Messages"]
    expected = ["0", "2"] if scope == "messageGroup" else ["0"]
    assert sorted(json.loads(m["Body"])["n"] for m in received) == [int(i) for i in expected]
    assert {m["Attributes"]["MessageDeduplicationId"] for m in received} == {"d"}
    again = sqs.send_message_batch(QueueUrl=url, Entries=entries[:1])  # every entry a repeat
    assert [s["MessageId"] for s in again["Successful"]] == [ids["0"]]


# -- Sluice's re-sends: always in the message's own group ---------------------------------------------


def test_an_effect_resent_after_a_crash_is_dropped_in_both_scopes(session, dedup, scope):
    stack = _stack(session, scope)
    stack.send({"id": "parent"}, group="parent")
    stack.launcher().tick(reconcile_first=False)
    [name] = stack.running()
    effects = [{"payload": {"id": "child-a"}}, {"payload": {"id": "child-b"}, "group": "fan"}]
    event = stack.finish(name, output=json.dumps({EFFECTS_FIELD: effects}))
    rt = stack.runtime()
    crash_after(rt.client("sqs"), "SendMessage", after=1)  # effect 0 sent, then the handler dies
    with pytest.raises(Crash):
        rt.launcher().on_status_change(StatusChange.from_event(event))
    assert [json.loads(b)["id"] for b, _ in _bodies(stack)] == ["child-a"]  # taken off the queue
    stack.launcher().on_status_change(StatusChange.from_event(event))  # EventBridge's retry, then a refill
    assert sorted(i["id"] for i in stack.inputs()) == ["child-b", "parent"]  # e0's copy was dropped
    assert stack.queue_counts() == (0, 0)
    assert [group for _, group, _ in dedup.dropped] == ["child-a" * SCOPES[scope]]


def test_a_wake_up_sent_again_by_the_sweep_is_dropped_in_both_scopes(session, dedup, scope):
    stack = _stack(session, scope, clock=FakeClock(), duplicate_policy=DuplicatePolicy.DEFER)
    stack.send({"id": "same", "v": 1}, group="g")
    stack.launcher().tick()
    (first,) = stack.running()
    waiting = stack.send({"id": "same", "v": 2}, group="g")
    assert stack.launcher().tick().n(Outcome.DEFERRED) == 1
    completion = stack.runtime()
    crash_after(completion.client("sqs"), "SendMessage")  # the wake-up sent, then the process dies
    with pytest.raises(Crash):
        completion.launcher().on_status_change(StatusChange.from_event(stack.finish(first, "SUCCEEDED")))
    stack.launcher().admit()  # the woken copy runs, and is deleted
    store = stack.runtime().store()
    assert sweep(store=store, queue=stack.runtime().queue(), now=stack.clock.now()) == 1  # sent again
    assert stack.launcher().admit().received == 0  # dropped, in its group, in both scopes
    assert stack.running() == [execution_name("same", waiting)] and len(stack.executions()) == 2
    assert len(dedup.dropped) == 1 and stack.queue_counts() == (0, 0)


# -- a copy in another group: delivered by messageGroup scope, and still one run ---------------------


def test_a_copy_of_one_origin_in_another_group_reaches_the_queue_only_in_message_group_scope_and_runs_once(
    session, dedup, scope
):
    """Sluice never re-sends to another group (every copy keeps the group its message came in); were
    one sent, ``messageGroup`` scope would deliver it, and the origin id makes it the same run."""
    stack = _stack(session, scope, consistency_window_seconds=0)
    queue = stack.runtime().queue()
    origin = "0b3c6a52-4d0f-4bd1-9d9e-000000000001"
    for group in ("g1", "g2"):  # one holder: the same deduplication id
        copy = ParkedMessage(
            message_id=origin,
            key="k",
            holder="holder",
            body='{"id": "k"}',
            group_id=group,
            attributes={"sluice-key": "k"},
            parked_at=0.0,
        )
        queue.requeue(copy)
    assert stack.queue_counts()[0] == (2 if scope == "messageGroup" else 1)
    stack.launcher().tick(reconcile_first=False)
    name = execution_name("k", origin)
    assert stack.running() == [name]
    stack.launcher().on_status_change(StatusChange.from_event(stack.finish(name, "SUCCEEDED")))
    for _ in range(2):
        stack.launcher().tick(reconcile_first=False)
    assert [e["name"] for e in stack.executions()] == [name]  # one run, whatever the scope
    assert stack.queue_counts() == (0, 0)


@pytest.mark.parametrize("once", [True, False])
def test_a_producer_resend_to_another_group_within_5_minutes_is_a_new_message_in_message_group_scope(
    session, dedup, scope, once
):
    """A producer's deduplication id holds within its group only: the same payload sent again to
    another group within 5 minutes, after its first run ended, is a second message and a second
    run, as a re-submission after 5 minutes is in either scope (``sluice enqueue`` derives the
    group from the payload, so its own re-sends keep it). A run-once payload still succeeds once."""
    stack = _stack(session, scope, consistency_window_seconds=0)
    digest = hashlib.sha256(b"job-1").hexdigest()
    attributes = {"sluice_once": "true"} if once else {}
    stack.send({"id": "job-1"}, group="g1", dedup=digest, **attributes)
    stack.launcher().tick(reconcile_first=False)
    [first] = stack.running()
    stack.launcher().on_status_change(StatusChange.from_event(stack.finish(first, "SUCCEEDED")))
    stack.send({"id": "job-1"}, group="g2", dedup=digest, **attributes)
    delivered = scope == "messageGroup"
    assert stack.queue_counts()[0] == int(delivered)
    summary = stack.launcher().tick(reconcile_first=False)
    assert summary.n(Outcome.ALREADY_DONE) == int(delivered and once)
    assert len(stack.executions()) == (2 if delivered and not once else 1)
    assert stack.queue_counts() == (0, 0)

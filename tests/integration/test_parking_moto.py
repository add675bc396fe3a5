"""The waiting room on moto: deferred duplicates leave the queue, wait in the table, come back
when their key is free, and never run twice however often a wake-up is repeated."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import Claim, Ending, Outcome, ParkedMessage, PayloadState
from sluice.core.names import ORIGIN_ATTRIBUTE, execution_name, named_entry
from sluice.features.parking import sweep
from sluice.launch.completion import complete
from sluice.launch.settings import DuplicatePolicy
from tests.support.aws import build_stack
from tests.support.hooks import Crash, count_calls, crash_after


@pytest.fixture
def deferring(session):
    return build_stack(session, clock=FakeClock(), duplicate_policy=DuplicatePolicy.DEFER)


def test_a_deferred_duplicate_waits_in_the_table_and_runs_once_its_key_is_free(deferring):
    stack = deferring
    stack.send({"id": "same", "v": 1}, group="g")
    launcher = stack.launcher()
    launcher.tick()
    (first,) = stack.running()
    waiting_id = stack.send({"id": "same", "v": 2}, group="g")
    behind = stack.send({"id": "other"}, group="g")  # behind it in the same FIFO group
    summary = launcher.tick()
    assert (summary.n(Outcome.DEFERRED), summary.n(Outcome.STARTED)) == (1, 1)
    assert stack.queue_counts() == (0, 0)  # nothing held on the queue while it waits
    assert len(stack.running()) == 2 and behind  # the group went on

    calls = count_calls(launcher.queue.client)
    launcher.tick()
    assert calls["ReceiveMessage"] == 1  # one empty receive: the parked message spends none

    released, _, _ = launcher.on_status_change(StatusChange.from_event(stack.finish(first, "SUCCEEDED")))
    assert released
    name = execution_name("same", waiting_id)  # the original message id names the execution
    assert name in stack.running()
    assert {"id": "same", "v": 2} in stack.inputs()
    assert stack.runtime().store().parked_holders() == frozenset()


def test_a_wake_up_lost_to_a_crash_is_swept_and_a_second_copy_does_not_run_twice(deferring):
    stack = deferring
    stack.send({"id": "same", "v": 1}, group="g")
    launcher = stack.launcher()
    launcher.tick()
    (first,) = stack.running()
    waiting_id = stack.send({"id": "same", "v": 2}, group="g")
    launcher.tick()

    completion = stack.runtime()
    fired = crash_after(completion.client("sqs"), "SendMessage")  # re-sent, then the process dies
    event = stack.finish(first, "SUCCEEDED")
    with pytest.raises(Crash):
        completion.launcher().on_status_change(StatusChange.from_event(event))
    assert fired["calls"] == 1
    store = stack.runtime().store()
    assert store.parked_holders() == {first}  # the index still names it: the sweep will look

    # The re-sent copy runs; then the sweep wakes the same holder again (moto, unlike SQS, forgets
    # a deduplication id once its message is deleted, so the second copy really arrives).
    stack.launcher().admit()
    name = execution_name("same", waiting_id)
    assert stack.running() == [name]
    woken = sweep(store=store, queue=stack.runtime().queue(), now=stack.clock.now())
    assert woken == 1 and store.parked_holders() == frozenset()
    summary = stack.launcher().admit()
    assert summary.n(Outcome.STARTED) == 0 and summary.received == 1
    assert stack.running() == [name] and len(stack.executions()) == 2
    assert stack.queue_counts() == (0, 0)


def test_a_parked_message_goes_back_in_its_group_with_its_attributes_and_original_id(deferring):
    stack = deferring
    stack.send({"id": "k"}, group="tenant-1")
    launcher = stack.launcher()
    launcher.tick()
    (first,) = stack.running()
    original = stack.send({"id": "k", "v": 2}, group="tenant-1", sluice_key="k")
    launcher.tick()
    sent: list[dict] = []
    launcher.queue.client.meta.events.register(
        "before-parameter-build.sqs.SendMessage", lambda params, **_: sent.append(dict(params))
    )
    launcher.on_status_change(StatusChange.from_event(stack.finish(first, "FAILED")))
    (resent,) = sent
    assert resent["MessageGroupId"] == "tenant-1"
    assert {k: v["StringValue"] for k, v in resent["MessageAttributes"].items()} == {
        "sluice-key": "k",
        ORIGIN_ATTRIBUTE: original,
    }
    assert stack.running() == [execution_name("k", original)]  # the completion's refill ran it
    assert stack.runtime().store().payload("k").holder == execution_name("k", original)


def test_a_park_that_lands_while_the_release_is_on_its_way_is_woken_by_that_release(deferring):
    """The release reads the holder's record, then writes. A duplicate parked in between (another
    launcher, between the read and the write) must be woken by this release: nothing else would,
    once the holder's name is claimed again before reconciliation looks."""
    stack = deferring
    stack.send({"id": "same", "v": 1}, group="g")
    stack.launcher().tick()
    (first,) = stack.running()
    waiting_id = stack.send({"id": "same", "v": 2}, group="g2")

    completion = stack.runtime()
    fired: Counter = Counter()

    def park_in_between(params: dict[str, Any], **_: Any) -> None:
        ends = [
            i
            for i in params["TransactItems"]
            if "ended_at" in i.get("Update", {}).get("UpdateExpression", "")
        ]
        if ends and not fired["parked"]:
            summary = stack.launcher().tick()  # another launcher, its own clients
            fired["parked"] += summary.n(Outcome.DEFERRED)

    completion.client("dynamodb").meta.events.register(
        "before-parameter-build.dynamodb.TransactWriteItems", park_in_between
    )
    # The release every end takes (the execution still runs in Step Functions here, so the other
    # launcher's duplicate is deferred rather than settling the holder itself).
    released = complete(
        store=completion.store(),
        queue=completion.queue(),
        name=first,
        ending=Ending(PayloadState.SUCCEEDED, 1.0),
    )
    assert released is not None and fired["parked"] == 1  # the fault fired: parked as the holder ended
    assert released.parked == {named_entry("same", waiting_id)}, (
        "the message parked during the release is not in what it woke"
    )
    assert stack.runtime().store().parked_holders() == frozenset()  # woken by the release itself
    assert stack.queue_counts() == (1, 0)  # back on the queue
    stack.finish(first, "SUCCEEDED")
    stack.launcher().tick()
    assert stack.running() == [execution_name("same", waiting_id)]
    assert stack.queue_counts() == (0, 0)


def test_a_late_wake_up_leaves_what_parked_behind_a_new_claim_of_the_name(deferring):
    """A holder is released with M1 parked behind it. While its completion wakes M1 (after the
    send, before the wake-up's unpark), the holder's name is claimed again (its own message, back
    after a rollback) and M2 parks behind the new claim. The late unpark must take out M1 alone:
    M2 stays listed on the new claim and its holder stays on the index, so it is woken."""
    stack = deferring
    first_id = stack.send({"id": "same", "v": 1}, group="g")
    stack.launcher().tick()
    (first,) = stack.running()
    m1 = stack.send({"id": "same", "v": 2}, group="g")
    assert stack.launcher().tick().n(Outcome.DEFERRED) == 1

    other = stack.runtime().store()  # another launcher's store, its own client
    fired: Counter = Counter()

    def claim_again_and_park(http_response: Any = None, **_: Any) -> None:
        if fired["sent"]:
            return
        fired["sent"] += 1  # M1 is back on the queue; the wake-up has not unparked it yet
        other.claim(
            Claim(
                key="same",
                name=first,
                message_id=first_id,
                now=2.0,
                claim_expires_at=902.0,
                arn=other.execution(first).arn,
            )
        )
        fired["parked"] += other.park(
            ParkedMessage("m2", "same", first, '{"id": "same", "v": 3}', "g", {"sluice-key": "same"}, 3.0)
        )

    completion = stack.runtime()
    completion.client("sqs").meta.events.register("after-call.sqs.SendMessage", claim_again_and_park)
    released = complete(
        store=completion.store(),
        queue=completion.queue(),
        name=first,
        ending=Ending(PayloadState.RELEASED, 1.0),
    )
    assert released is not None and released.parked == {named_entry("same", m1)}
    assert fired == {"sent": 1, "parked": 1}  # the fault fired: a new claim and a park mid-wake-up
    store = stack.runtime().store()
    m2 = named_entry("same", "m2")
    assert store.execution(first).parked == {m2}, "the late wake-up erased what parked behind the new claim"
    assert store.parked_holders() == {first}, "the late wake-up took the new claim off the index"

    again = complete(
        store=store, queue=stack.runtime().queue(), name=first, ending=Ending(PayloadState.RELEASED, 4.0)
    )
    assert again is not None and again.parked == {m2}
    assert store.parked_holders() == frozenset()
    assert stack.queue_counts() == (2, 0)  # M1, then M2, back on the queue

"""A completion's refill by hand-over, on moto with the real adapters (``sluice.launch.handover``): the
freed slot passes to the next payload in the release's own transaction. Calls counted by
operation; crashes and refusals injected through botocore hooks, each asserted to have fired."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import Outcome, PayloadState
from sluice.core.names import execution_name
from sluice.ops.maximum import set_max
from tests.support.aws import build_stack
from tests.support.hooks import Crash, count_calls, crash_after, error_answer, receipts_of, throttle


@pytest.fixture
def stack(session):
    return build_stack(session, clock=FakeClock(), max_concurrency=2)


def warm(stack) -> Any:
    """A completion container that has run before (its state machine check is done)."""
    rt = stack.runtime()
    rt.launcher().tick()
    return rt


def end(rt, stack, name: str, status: str = "SUCCEEDED"):
    return rt.launcher().on_status_change(StatusChange.from_event(stack.finish(name, status)))


def test_a_refill_is_a_read_a_receive_one_write_a_start_and_a_delete(stack):
    stack.send({"id": "p0"}, group="g0")
    stack.send({"id": "p1"}, group="g1")
    rt = warm(stack)
    first = sorted(stack.running())[0]
    waiting = stack.send({"id": "p2"}, group="g2")
    calls = count_calls(rt.client("dynamodb"), rt.client("sqs"), rt.client("stepfunctions"))
    released, refill, _ = end(rt, stack, first)
    assert released and refill.n(Outcome.STARTED) == 1
    # No UpdateItem: the claim in the hand-over's transaction carries its start mark, the fence
    # against reconciliation's block (sluice.launch.per_message).
    assert calls == Counter(
        BatchGetItem=1,
        ReceiveMessage=1,
        TransactWriteItems=1,
        StartExecution=1,
        DeleteMessageBatch=1,
    )
    name = execution_name("p2", waiting)
    assert name in stack.running() and stack.queue_counts() == (0, 0)
    store = stack.runtime().store()
    assert store.payload("p2").holder == name and store.execution(name).state is PayloadState.CLAIMED
    assert store.payload(store.execution(first).key).state is PayloadState.SUCCEEDED
    assert len(store.ledger().holders) == 2


def test_a_refill_under_a_lowered_max_receives_nothing(stack):
    """MAX lowered below the runs: the pool is frozen, so the completion receives no message it
    could not start (each receive would walk a healthy message toward the DLQ)."""
    stack.send({"id": "p0"}, group="g0")
    stack.send({"id": "p1"}, group="g1")
    rt = warm(stack)
    stack.send({"id": "p2"}, group="g2")
    set_max(stack.runtime(), 1)
    calls = count_calls(rt.client("sqs"))
    released, refill, _ = end(rt, stack, sorted(stack.running())[0])
    assert released and refill.n(Outcome.STARTED) == 0
    assert calls["ReceiveMessage"] == 0 and stack.queue_counts() == (1, 0)
    assert len(stack.running()) == 1


def test_a_crash_after_the_hand_over_resumes_the_claim_and_runs_it_once(stack):
    stack.send({"id": "p0"}, group="g0")
    rt = warm(stack)
    (first,) = stack.running()
    waiting = stack.send({"id": "p1"}, group="g1")
    received = receipts_of(rt.client("sqs"))
    fired = crash_after(rt.client("dynamodb"), "TransactWriteItems")  # the hand-over, then dies
    with pytest.raises(Crash):
        end(rt, stack, first)
    assert fired["calls"] == 1
    name = execution_name("p1", waiting)
    store = stack.runtime().store()
    assert store.payload("p1").holder == name and stack.running() == []  # claimed, not started
    stack.visible_again(received)  # its visibility timeout runs out
    summary = stack.launcher().admit()
    assert summary.n(Outcome.RESUMED) == 1 and stack.running() == [name]
    assert stack.queue_counts() == (0, 0) and len(stack.executions()) == 2


def test_a_start_refused_for_sure_after_the_hand_over_gives_the_claim_back(stack):
    stack.send({"id": "p0"}, group="g0")
    rt = warm(stack)
    (first,) = stack.running()
    waiting = stack.send({"id": "p1"}, group="g1")
    refused = throttle(rt.client("stepfunctions"), "StartExecution")
    released, _, _ = end(rt, stack, first)
    assert released and refused["throttled"] == 5  # backed off and called again, then gave up
    name = execution_name("p1", waiting)
    store = stack.runtime().store()
    assert store.payload("p1").holder is None and store.execution(name).state is PayloadState.RELEASED
    assert store.ledger().holders == frozenset() and stack.queue_counts() == (1, 0)  # back, visible
    stack.launcher().admit()
    assert stack.running() == [name]


def test_an_unsure_start_after_the_hand_over_keeps_the_claim(stack):
    stack.send({"id": "p0"}, group="g0")
    rt = warm(stack)
    (first,) = stack.running()
    waiting = stack.send({"id": "p1"}, group="g1")
    fired: Counter = Counter()

    def unsure(**_: Any):
        fired["calls"] += 1
        return error_answer("InternalServerError", 500)

    rt.client("stepfunctions").meta.events.register("before-call.sfn.StartExecution", unsure)
    received = receipts_of(rt.client("sqs"))
    released, _, _ = end(rt, stack, first)
    assert released and fired["calls"] == 1
    name = execution_name("p1", waiting)
    store = stack.runtime().store()
    assert store.payload("p1").holder == name  # it may have started: the claim stays
    assert stack.queue_counts() == (0, 1)  # away for the consistency window
    stack.visible_again(received)  # the window over (moto's visibility runs in real time)
    stack.launcher().admit()  # the message is back: the same name resumes
    assert stack.running() == [name] and stack.queue_counts() == (0, 0)


def test_a_message_that_cannot_ride_the_release_is_claimed_its_own_way(stack):
    """The head of the queue is a second message of the ended run's own key: the release goes
    alone, and the message claims the key it has just freed."""
    first_id = stack.send({"id": "p0"}, group="g0")
    rt = warm(stack)
    (first,) = stack.running()
    again = stack.send({"id": "p0", "v": 2}, group="g0")
    released, refill, _ = end(rt, stack, first)
    assert released and refill.n(Outcome.STARTED) == 1
    assert stack.running() == [execution_name("p0", again)] and first == execution_name("p0", first_id)
    assert stack.runtime().store().payload("p0").holder == execution_name("p0", again)


def test_max_lowered_between_the_read_and_the_hand_over_is_obeyed(stack):
    """The operator lowers MAX below the runs after the hand-over read the pool (not frozen then)
    and before its write: the swap is conditioned on the shard's cap, which the lowering froze,
    so the release goes alone and the message goes back to the queue, unstarted."""
    stack.send({"id": "p0"}, group="g0")
    stack.send({"id": "p1"}, group="g1")
    rt = warm(stack)
    waiting = stack.send({"id": "p2"}, group="g2")
    fired: Counter = Counter()

    def lower(http_response: Any = None, **_: Any) -> None:
        if not fired["lowered"]:
            fired["lowered"] += 1
            set_max(stack.runtime(), 1)  # another process: the operator's `sluice set-max 1`

    rt.client("sqs").meta.events.register("after-call.sqs.ReceiveMessage", lower)
    released, refill, _ = end(rt, stack, sorted(stack.running())[0])
    assert released and fired["lowered"] == 1  # the fault fired: lowered between read and write
    assert len(stack.running()) == 1, "the hand-over started a payload past the lowered MAX"
    assert refill.n(Outcome.STARTED) == 0 and stack.queue_counts() == (1, 0)
    set_max(stack.runtime(), 2)
    stack.launcher().admit()
    assert execution_name("p2", waiting) in stack.running()


# -- found by an independent attempt to break the hand-over (each failed before its fix) ------------------


def test_a_message_with_a_bad_attribute_is_dead_lettered_by_a_completion_too(stack):
    """A Sluice attribute the hand-over does not know (here an awaits policy that is neither 'run'
    nor 'dead-letter') sends the message the normal way, which checks it: dead-lettered with its
    reason, as a tick would, never started by the hand-over."""
    stack.send({"id": "p0"}, group="g0")
    rt = warm(stack)
    (first,) = stack.running()
    stack.send({"id": "p1"}, group="g1", sluice_on_await_failure="bogus")
    released, refill, _ = end(rt, stack, first)
    assert released and refill.n(Outcome.INVALID) == 1 and stack.running() == []
    (dead,) = stack.dlq_messages()
    assert "sluice-on-await-failure" in dead["MessageAttributes"]["sluice-error"]["StringValue"]


def test_a_resumed_message_does_not_fill_the_slot_it_freed(stack):
    """The hand-over received a message whose run is going already (its launcher died after the
    start): resuming it takes no slot, so the freed one is filled by the next message."""
    stack.send({"id": "p0"}, group="g0")
    stack.send({"id": "p1"}, group="g1")
    rt = warm(stack)
    first, second = sorted(stack.running())
    behind = stack.send({"id": "p2"}, group="g2")
    received = receipts_of(rt.client("sqs"))
    fired = crash_after(rt.client("stepfunctions"), "StartExecution")
    with pytest.raises(Crash):
        end(rt, stack, first)  # p2 handed the slot and started, then the container died
    assert fired["calls"] == 1
    stack.visible_again(received)
    later = stack.send({"id": "p3"}, group="g3")
    released, refill, _ = end(stack.runtime(), stack, second)
    assert released and refill.n(Outcome.RESUMED) == 1 and refill.n(Outcome.STARTED) == 1
    assert sorted(stack.running()) == sorted([execution_name("p2", behind), execution_name("p3", later)])


def test_a_throttled_receive_does_not_keep_the_ended_run_holding(stack):
    stack.send({"id": "p0"}, group="g0")
    rt = warm(stack)
    (first,) = stack.running()
    stack.send({"id": "p1"}, group="g1")
    refused = throttle(rt.client("sqs"), "ReceiveMessage", times=1)
    released, refill, _ = end(rt, stack, first)
    assert refused["throttled"] == 1 and released
    assert not stack.runtime().store().execution(first).state.holds_lease
    assert refill is not None and refill.n(Outcome.STARTED) == 1  # the refill after it received


def test_a_throttled_state_machine_check_does_not_keep_the_ended_run_holding(stack):
    stack.send({"id": "p0"}, group="g0")
    stack.launcher().tick()
    (first,) = stack.running()
    rt = stack.runtime()  # a cold completion container: it checks the state machine first
    stack.send({"id": "p1"}, group="g1")
    refused = throttle(rt.client("stepfunctions"), "DescribeStateMachine", times=1)
    released, _, _ = end(rt, stack, first)
    assert refused["throttled"] == 1 and released
    assert not stack.runtime().store().execution(first).state.holds_lease


def test_an_event_delivered_twice_at_once_costs_the_loser_one_receive_and_loses_nothing(stack):
    """EventBridge delivers one status event twice at once. Both read the run holding its slot and
    receive a message; one hands the slot over, the other's release finds nothing to free. The
    loser's message is claimed its own way: with the pool full it goes back to the queue, visible at
    once, having spent one receive (of maxReceiveCount 10). It then starts at the next free slot."""
    stack.send({"id": "p0"}, group="g0")
    stack.send({"id": "p1"}, group="g1")
    rt_a = warm(stack)
    rt_b = stack.runtime()
    head = stack.send({"id": "p2"}, group="g2")
    behind = stack.send({"id": "p3"}, group="g3")
    first = sorted(stack.running())[0]
    change = StatusChange.from_event(stack.finish(first))
    other: dict[str, Any] = {}

    def the_other_delivery(http_response: Any = None, **_: Any) -> None:
        if not other:
            other["result"] = rt_b.launcher().on_status_change(change)

    rt_a.client("sqs").meta.events.register("after-call.sqs.ReceiveMessage", the_other_delivery)
    released_a, refill_a, _ = rt_a.launcher().on_status_change(change)
    assert other["result"][0] and not released_a  # the fault fired: B released first, A freed nothing
    assert execution_name("p3", behind) in stack.running() and len(stack.running()) == 2
    assert refill_a.n(Outcome.RETURNED) == 1 and stack.queue_counts() == (1, 0)
    end(rt_b, stack, sorted(n for n in stack.running() if not n.startswith("p3"))[0])
    assert execution_name("p2", head) in stack.running()


def test_a_message_whose_run_ended_is_refused_in_the_hand_over_and_settled_as_already_ran(stack):
    """x ran, its message was not deleted (a throttled delete), and its end released it. The message
    comes back while another run ends: the hand-over receives it, the successor's claim in the
    release's transaction is refused (x's record says it ran), the release goes alone, and x is
    settled as already ran. Nothing starts, and the queue is empty."""
    stack.send({"id": "x"}, group="gx")
    rt = stack.runtime()
    received = receipts_of(rt.client("sqs"))
    refused = throttle(rt.client("sqs"), "DeleteMessageBatch", times=1)
    assert rt.launcher().tick().stopped == "transient"  # the tick ends, it does not fail
    assert refused["throttled"] == 1
    x_receipts = list(received)
    (x,) = stack.running()
    assert end(rt, stack, x)[0]  # released; its message still in flight
    stack.send({"id": "e"}, group="ge")
    rt.launcher().tick()
    (e,) = stack.running()
    stack.visible_again(x_receipts)
    calls = count_calls(rt.client("stepfunctions"))
    released, refill, _ = end(rt, stack, e)
    assert released and refill.n(Outcome.ALREADY_RAN) == 1 and refill.n(Outcome.STARTED) == 0
    assert calls["StartExecution"] == 0 and stack.running() == [] and stack.queue_counts() == (0, 0)
    store = stack.runtime().store()
    assert store.execution(x).state is PayloadState.SUCCEEDED and store.ledger().holders == frozenset()
    runs = stack.client("stepfunctions").list_executions(stateMachineArn=stack.settings.state_machine_arn)
    assert sorted(r["name"] for r in runs["executions"]) == sorted([x, e])

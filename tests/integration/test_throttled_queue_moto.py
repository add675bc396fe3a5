"""SQS refusing the launcher's calls past its quota (300 calls a second per action on a FIFO queue
without high throughput, past the SDK's retries): the tick ends early with ``transient`` instead of
failing the invocation, and nothing is lost or started twice. Real adapters on moto; the refusals
come from botocore hooks."""

from __future__ import annotations

import contextlib

from sluice.core.clock import FakeClock
from sluice.core.model import Outcome
from tests.support.aws import build_stack
from tests.support.hooks import count_calls, receipts_of, throttle


def test_a_throttled_receive_ends_the_tick_and_the_next_one_starts_the_message(session):
    stack = build_stack(session, clock=FakeClock(), max_concurrency=3)
    stack.send({"id": "a"}, group="g")
    rt = stack.runtime()
    refused = throttle(rt.client("sqs"), "ReceiveMessage", times=1)
    summary = rt.launcher().tick()
    assert refused["throttled"] == 1  # the fault fired
    assert summary.stopped == "transient" and summary.received == 0 and stack.running() == []
    assert rt.launcher().tick().n(Outcome.STARTED) == 1 and len(stack.running()) == 1


def test_a_throttled_delete_ends_the_tick_tries_every_batch_and_starts_nothing_twice(session):
    """12 messages start; the first of the two DeleteMessageBatch calls is refused. The second is
    still made, so only the first batch's 10 stay in flight. When they come back they are settled
    by their leases as running already: deleted, not started again."""
    stack = build_stack(session, clock=FakeClock(), max_concurrency=20, start_concurrency=12)
    for i in range(12):
        stack.send({"id": f"p{i}"}, group=f"g{i}")
    rt = stack.runtime()
    received = receipts_of(rt.client("sqs"))
    calls = count_calls(rt.client("sqs"))
    refused = throttle(rt.client("sqs"), "DeleteMessageBatch", times=1)
    summary = rt.launcher().tick()
    assert refused["throttled"] == 1  # the fault fired
    assert summary.stopped == "transient" and summary.n(Outcome.STARTED) == 12
    assert calls["DeleteMessageBatch"] == 2  # the batch after the refused one was still deleted
    assert stack.queue_counts() == (0, 10)  # (visible, in flight): the refused batch's 10
    sqs = stack.client("sqs")
    for receipt in received:  # the visibility timeout, by the fake clock; the deleted ones are gone
        with contextlib.suppress(sqs.exceptions.ReceiptHandleIsInvalid):
            sqs.change_message_visibility(
                QueueUrl=stack.settings.queue_url, ReceiptHandle=receipt, VisibilityTimeout=0
            )
    again = stack.runtime().launcher().tick()
    assert again.n(Outcome.RESUMED) == 10 and again.n(Outcome.STARTED) == 0
    assert len(stack.running()) == 12 and stack.queue_counts() == (0, 0)

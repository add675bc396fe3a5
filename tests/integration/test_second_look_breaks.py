"""Attacks on the duplicate check's second look (``MessageBranches._duplicate``,
``_first_sighting``; the launcher's ``Outcome.RECHECK``): a message refused by a holder that reads
RUNNING goes back to the queue for the consistency window, with its FIFO group's later messages,
and is dropped only when refused again. Each test runs the real launcher on moto."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest

from sluice.clock import FakeClock
from sluice.model import Outcome
from tests.support.aws import build_stack
from tests.support.hooks import receipts_of


def _visible_again(stack: Any, receipts: list[str]) -> None:
    """What the visibility timeout does by the fake clock: messages in flight visible again."""
    sqs = stack.client("sqs")
    for receipt in receipts:
        with contextlib.suppress(sqs.exceptions.ClientError):  # deleted already
            sqs.change_message_visibility(
                QueueUrl=stack.settings.queue_url, ReceiptHandle=receipt, VisibilityTimeout=0
            )
    receipts.clear()


def _started_keys(stack: Any) -> list[str]:
    return [json.loads(i)["id"] if isinstance(i, str) else i["id"] for i in stack.inputs()]


@pytest.mark.xfail(
    strict=True,
    reason="each recheck returns its FIFO group's later messages: duplicates ahead walk a fresh message to the DLQ",
)
def test_duplicates_ahead_in_a_group_walk_a_fresh_message_to_the_dlq(session):
    """k runs (for real, fresh answers: no staleness needed). Its producer re-submits k five times
    in group g, then sends j (a key nobody runs) in g. Each re-submission is a first sighting in
    turn: back for the window, and every later message of g received with it is returned with it,
    one receive each time. j is received once per duplicate ahead of it (before the second look,
    duplicates were dropped at once and j was received once) and SQS's redrive moves it to the DLQ
    without a reason before its turn: promise 3 (nothing lost) as deployed (maxReceiveCount 10: ten
    duplicates ahead, with a receive of ten)."""
    clock = FakeClock()
    # As deployed the queue's maxReceiveCount is 10 (docs/reliability.md); 5 here, as build_stack's.
    stack = build_stack(session, max_concurrency=20, max_receive_count=5, clock=clock)
    launcher = stack.launcher()
    receipts = receipts_of(launcher.queue.client)
    stack.send({"id": "k"}, group="g0")
    assert launcher.tick().n(Outcome.STARTED) == 1  # k runs, and keeps running
    for _ in range(5):
        stack.send({"id": "k"}, group="g")  # re-submissions of k while it runs: duplicates
    stack.send({"id": "j"}, group="g")  # j: no run of its key anywhere; it must start
    seen: dict[str, int] = {}
    for _ in range(10):
        summary = launcher.tick()
        for outcome, n in summary.outcomes.items():
            seen[outcome] = seen.get(outcome, 0) + n
        clock.advance(stack.settings.consistency_window_seconds)
        _visible_again(stack, receipts)
    dlq = stack.drain(stack.settings.dlq_url)
    by_sqs = [m["Body"] for m in dlq if "sluice-error" not in m.get("MessageAttributes", {})]
    assert seen.get(Outcome.RECHECK.value, 0) >= 1  # the second look happened
    assert "j" in _started_keys(stack), (
        f"promise 3: j never started; moved to the DLQ by SQS, no reason: {by_sqs}; outcomes {seen}"
    )

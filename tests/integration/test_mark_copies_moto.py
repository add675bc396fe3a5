"""Two copies of one message: the same ``sluice-origin-message-id`` in two FIFO groups, one name.
A claim's start mark belongs to the copy that wrote it (``copy_id``): a copy finding another copy's
mark goes back for a claim timeout, since no clock says when the invocation that marked is over.
A claiming copy that never comes back (moved to the DLQ, deleted) leaves its claim to
reconciliation, which releases it as abandoned; the other copy then claims it afresh and starts it
once. Found by an attack on moto (the copy was rechecked every consistency window until SQS moved
it to the DLQ too, and nothing ran)."""

from __future__ import annotations

import json

from sluice.core.clock import FakeClock
from tests.support.aws import build_stack
from tests.support.hooks import Crash, crash_before, receipts_of


def runs_of(stack, key: str) -> list[str]:
    sfn = stack.client("stepfunctions")
    return sorted(
        e["name"]
        for e in stack.executions()
        if json.loads(sfn.describe_execution(executionArn=e["executionArn"])["input"]).get("id") == key
    )


def test_a_copy_of_a_claim_whose_copy_never_returns_starts_once_reconciliation_releases_it(session):
    clock = FakeClock()
    stack = build_stack(session, clock=clock, max_concurrency=3)
    m = stack.send({"id": "k"}, group="g1")
    dying = stack.runtime()
    crash_before(dying.client("stepfunctions"), "StartExecution")
    received = receipts_of(dying.client("sqs"))
    try:
        dying.launcher().tick()
        raise AssertionError("the launcher should have died before its start")
    except Crash:
        pass
    store = stack.runtime().store()
    name = store.payload("k").holder
    claim = store.execution(name)
    assert claim.starting_at is not None and claim.copy_id == m
    # m never comes back (moved to the DLQ after its receives, say); a copy of it does.
    stack.client("sqs").delete_message(QueueUrl=stack.settings.queue_url, ReceiptHandle=received[0])
    stack.send({"id": "k"}, group="g2", sluice_origin_message_id=m)
    delays: list[int] = []
    copies: list[str] = []
    launcher = stack.runtime()
    launcher.client("sqs").meta.events.register(
        "before-parameter-build.sqs.ChangeMessageVisibilityBatch",
        lambda params, **_: delays.extend(e["VisibilityTimeout"] for e in params["Entries"]),
    )
    copies = receipts_of(launcher.client("sqs"))
    clock.advance(61)
    launcher.launcher().tick()  # reconciliation's first sighting of the claim; the copy goes back
    assert runs_of(stack, "k") == [], "nothing starts while the mark is the other copy's"
    assert delays == [stack.settings.claim_timeout_seconds], "back for a claim timeout, not a window"
    assert store.execution(name).copy_id == m and store.execution(name).suspect_since is not None
    clock.advance(stack.settings.claim_timeout_seconds + 1)
    stack.visible_again(copies[-1:])  # moto's visibility runs in real time
    launcher.launcher().tick()  # released as abandoned, then the copy claims it afresh
    assert runs_of(stack, "k") == [name], "the copy started the released claim, once"
    assert store.execution(name).copy_id not in (None, m)
    assert len(copies) == 2, "the copy was received twice in all"
    assert stack.queue_counts() == (0, 0) and stack.queue_counts(stack.settings.dlq_url) == (0, 0)

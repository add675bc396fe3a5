"""A run-once key's success outlives ``retentionDays`` whatever is written to its payload record after
it (sluice.features.receipts): a dead-lettered message of the key and a plain run of it leave the record
without expiry. The real Launcher and completion on moto; DynamoDB's TTL played as
``tests.reliability.actors.BehindTheBack.expire_ttl`` plays it (the clock past the expiry, the item
deleted)."""

from __future__ import annotations

from collections import Counter

import pytest

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import Outcome
from tests.support.aws import Stack, build_stack

DAY = 86_400


def complete(stack: Stack, event: dict) -> None:
    stack.launcher().on_status_change(StatusChange.from_event(event))


def started(stack: Stack) -> list[str]:
    return [e["name"] for e in stack.executions()]


def payload_item(stack: Stack, key: str) -> dict:
    found = stack.client("dynamodb").get_item(
        TableName=stack.settings.table_name, Key={"pk": {"S": f"PAYLOAD#{key}"}}, ConsistentRead=True
    )
    return found.get("Item", {})


def expire_ttl(stack: Stack) -> Counter[str]:
    """DynamoDB's TTL process: delete every item whose ``expires_at`` has passed by the stack's clock.
    Returns the items deleted, by kind (``PAYLOAD``, ``EXEC``...)."""
    ddb, table = stack.client("dynamodb"), stack.settings.table_name
    deleted: Counter[str] = Counter()
    for page in ddb.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
        for item in page["Items"]:
            expires = item.get("expires_at", {}).get("N")
            if expires is not None and float(expires) <= stack.clock.now():
                ddb.delete_item(TableName=table, Key={"pk": item["pk"]})
                deleted[item["pk"]["S"].split("#", 1)[0]] += 1
    return deleted


DEAD_LETTER, PLAIN_RUN = "a dead letter of k", "a plain run of k"


def run_once_then_touch_the_key(stack: Stack, touches: tuple[str, ...]) -> str:
    """A once-message of k SUCCEEDED; then, in order, ``touches``: a bad message carrying
    ``sluice-key: k`` (dead-lettered), a plain run of k that SUCCEEDED too. Returns the once-run."""
    stack.send({"id": "k"}, group="a", sluice_once="true")
    assert stack.launcher().tick().n(Outcome.STARTED) == 1
    [once_run] = started(stack)
    complete(stack, stack.finish(once_run))
    assert "expires_at" not in payload_item(stack, "k")  # a once-key's success is kept
    for touch in touches:
        stack.clock.advance(60)
        if touch == DEAD_LETTER:
            stack.send("\x7fnot json", group="b", sluice_key="k")
            assert stack.launcher().tick().n(Outcome.INVALID) == 1
            [dead] = stack.dlq_messages()
            assert dead["MessageAttributes"]["sluice-key"]["StringValue"] == "k"
            assert payload_item(stack, "k")["state"]["S"] == "INVALID"  # its reason is recorded
        else:
            before = set(started(stack))
            stack.send({"id": "k"}, group="c")
            assert stack.launcher().tick().n(Outcome.STARTED) == 1  # a plain message runs as before
            [plain_run] = set(started(stack)) - before
            complete(stack, stack.finish(plain_run))
    return once_run


@pytest.mark.parametrize(
    "touches", [(DEAD_LETTER,), (PLAIN_RUN,), (DEAD_LETTER, PLAIN_RUN), (PLAIN_RUN, DEAD_LETTER)]
)
def test_a_once_success_outlives_retention_whatever_touches_its_key_after_it(session, touches):
    stack = build_stack(session, clock=FakeClock(), retention_days=1)
    once_run = run_once_then_touch_the_key(stack, touches)
    stack.clock.advance(16 * DAY)  # past retentionDays, and the 15 days a name that ran is kept
    deleted = expire_ttl(stack)
    assert deleted["EXEC"] == 1 + touches.count(PLAIN_RUN)  # the runs' records went

    stack.send({"id": "k"}, group="d", sluice_once="true")
    summary = stack.launcher().tick()
    runs = 1 + touches.count(PLAIN_RUN)
    assert len(started(stack)) == runs, f"a once key that SUCCEEDED ran again after retentionDays ({touches})"
    assert summary.n(Outcome.ALREADY_DONE) == 1 and summary.n(Outcome.STARTED) == 0
    assert "PAYLOAD" not in deleted and "expires_at" not in payload_item(stack, "k")
    item = payload_item(stack, "k")
    assert item["already_done"]["N"] == "1" and item["once_by"]["S"] == once_run
    assert stack.queue_counts() == (0, 0)

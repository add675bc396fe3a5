"""A redriven message is the message it came from: it runs under that message's name, so a message
that was dead-lettered and also ran (its delete from the queue lost, and the reason gone by its next
receipt) runs once, however often its dead-letter copy is redriven. ``dlq redrive --new-name`` runs a
copy under a name of its own (explorer seed 1165232952)."""

from __future__ import annotations

import json

import pytest

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import Outcome
from sluice.core.names import execution_name
from sluice.ops.dlq import dlq_redrive
from tests.support.aws import build_stack
from tests.support.hooks import receipts_of, throttle


@pytest.fixture
def stack(session):
    return build_stack(session, clock=FakeClock())


def runs_of(stack, key: str) -> list[str]:
    store = stack.runtime().store()
    return [e["name"] for e in stack.executions() if store.execution(e["name"]).key == key]


def end(stack, name: str, status: str) -> None:
    stack.launcher().on_status_change(StatusChange.from_event(stack.finish(name, status)))


def dead_lettered_and_ran(stack) -> str:
    """a FAILED; c (awaiting a) is dead-lettered, but its delete from the queue is throttled, so it
    comes back; a runs again and succeeds; c's next receipt starts it, and it succeeds. Returns c's message id."""
    stack.send({"id": "a"}, group="a")
    stack.launcher().tick()
    (a1,) = runs_of(stack, "a")
    end(stack, a1, "FAILED")
    c = stack.send({"id": "c"}, group="c", sluice_awaits=json.dumps(["a"]))
    rt = stack.runtime()
    seen = receipts_of(rt.client("sqs"))
    deletes = throttle(rt.client("sqs"), "DeleteMessageBatch")
    rt.launcher().tick()
    assert deletes["throttled"] >= 1, "the fault did not fire"
    assert stack.queue_counts(stack.settings.dlq_url) == (1, 0)
    stack.send({"id": "a"}, group="a2")
    stack.launcher().tick()
    (a2,) = [n for n in runs_of(stack, "a") if n != a1]
    end(stack, a2, "SUCCEEDED")
    stack.visible_again(seen)
    stack.launcher().tick()
    assert runs_of(stack, "c") == [execution_name("c", c)], "the test's premise: c ran from the queue"
    end(stack, execution_name("c", c), "SUCCEEDED")
    return c


def test_a_redriven_copy_of_a_message_that_ran_does_not_run_again(stack):
    c = dead_lettered_and_ran(stack)
    stack.clock.advance(600)  # past SQS's deduplication window: each redrive sends a copy
    for _ in range(2):
        report = dlq_redrive(stack.runtime())
        assert report.ok and len(report.done) <= 1
        summary = stack.launcher().tick()
        assert summary.n(Outcome.STARTED) == 0
    assert runs_of(stack, "c") == [execution_name("c", c)]
    assert stack.queue_counts() == (0, 0)


def test_a_redriven_copy_that_never_ran_runs_under_its_own_name(stack):
    stack.send({"id": "a"}, group="a")
    stack.launcher().tick()
    (a1,) = runs_of(stack, "a")
    end(stack, a1, "FAILED")
    c = stack.send({"id": "c"}, group="c", sluice_awaits=json.dumps(["a"]))
    stack.launcher().tick()
    assert runs_of(stack, "c") == []
    stack.send({"id": "a"}, group="a2")
    stack.launcher().tick()
    (a2,) = [n for n in runs_of(stack, "a") if n != a1]
    end(stack, a2, "SUCCEEDED")
    assert dlq_redrive(stack.runtime()).ok
    assert stack.launcher().tick().n(Outcome.STARTED) == 1
    assert runs_of(stack, "c") == [execution_name("c", c)]


def test_new_name_runs_the_copy_again_under_a_name_of_its_own(stack):
    c = dead_lettered_and_ran(stack)
    report = dlq_redrive(stack.runtime(), new_name=True)
    assert report.ok and len(report.done) == 1
    assert stack.launcher().tick().n(Outcome.STARTED) == 1
    (again,) = [n for n in runs_of(stack, "c") if n != execution_name("c", c)]
    assert again == execution_name("c", report.done[0]["message_id"])

"""Receipts and run-once keys with the real adapters on moto (sluice.features.receipts)."""

from __future__ import annotations

import hashlib
import json

from sluice.core.events import StatusChange
from sluice.core.model import Outcome, PayloadState
from sluice.features.receipts import read_receipt
from tests.support.aws import REGION, build_stack


def started(stack) -> list[str]:
    return [e["name"] for e in stack.executions()]


def complete(stack, event):
    return stack.launcher().on_status_change(StatusChange.from_event(event))


def test_a_succeeded_run_gets_a_receipt_with_its_output_inline(stack):
    stack.send({"id": "k1"})
    stack.launcher().tick()
    [name] = started(stack)
    complete(stack, stack.finish(name, output='{"answer": 42}'))
    receipt = read_receipt(stack.runtime().store(), "k1")
    assert (receipt.name, receipt.outcome, receipt.output) == (name, PayloadState.SUCCEEDED, '{"answer": 42}')
    assert receipt.arn.endswith(f":{name}") and receipt.started_at and receipt.stopped_at
    assert receipt.succeeded_by == name


def test_a_failed_run_gets_a_receipt_with_error_and_cause(stack):
    stack.send({"id": "k1"})
    stack.launcher().tick()
    [name] = started(stack)
    complete(stack, stack.finish(name, "FAILED", error="Work.Failed"))
    receipt = read_receipt(stack.runtime().store(), "k1")
    assert (receipt.outcome, receipt.error, receipt.cause) == (
        PayloadState.FAILED,
        "Work.Failed",
        "Work.Failed cause",
    )
    assert receipt.output is None and receipt.succeeded_by is None


def test_a_large_output_is_stored_in_the_bucket_as_a_pointer(session):
    session.client("s3", region_name=REGION).create_bucket(Bucket="sluice-test-payloads")
    stack = build_stack(session, payload_bucket="sluice-test-payloads", receipt_inline_bytes=100)
    stack.send({"id": "k1"})
    stack.launcher().tick()
    [name] = started(stack)
    output = json.dumps({"rows": ["x" * 50] * 10})
    complete(stack, stack.finish(name, output=output))
    receipt = read_receipt(stack.runtime().store(), "k1")
    digest = hashlib.sha256(output.encode()).hexdigest()
    assert receipt.output is None
    assert receipt.output_pointer == {
        "uri": f"s3://sluice-test-payloads/outputs/{digest}",
        "sha256": digest,
        "size": len(output),
    }
    stored = (
        stack.client("s3").get_object(Bucket="sluice-test-payloads", Key=f"outputs/{digest}")["Body"].read()
    )
    assert stored.decode() == output


def test_an_output_left_out_of_the_event_is_read_from_step_functions(stack):
    stack.send({"id": "k1"})
    stack.launcher().tick()
    [name] = started(stack)
    complete(stack, stack.finish(name, output='{"big": true}', output_in_event=False))
    assert read_receipt(stack.runtime().store(), "k1").output == '{"big": true}'


def test_reconciliation_writes_the_receipt_of_a_lost_event(stack):
    stack.send({"id": "k1"})
    stack.launcher().tick()
    [name] = started(stack)
    stack.finish(name, output='{"n": 1}')  # its event is lost
    launcher = stack.launcher(consistency_window_seconds=0)  # judge the young holder at once
    launcher.tick()
    receipt = read_receipt(stack.runtime().store(), "k1")
    assert (receipt.outcome, receipt.output) == (PayloadState.SUCCEEDED, '{"n": 1}')


def test_a_repeated_or_late_event_never_replaces_a_newer_runs_receipt(stack):
    stack.send({"id": "k1"}, group="a")
    stack.launcher().tick()
    [first] = started(stack)
    first_event = stack.finish(first, "FAILED", error="E")
    complete(stack, first_event)
    stack.send({"id": "k1"}, group="b")
    stack.launcher().tick()
    [second] = [n for n in started(stack) if n != first]
    complete(stack, stack.finish(second, output='{"v": 2}'))
    complete(stack, first_event)  # late, repeated
    complete(stack, first_event)
    receipt = read_receipt(stack.runtime().store(), "k1")
    assert (receipt.name, receipt.outcome, receipt.output) == (second, PayloadState.SUCCEEDED, '{"v": 2}')


def test_a_once_key_that_succeeded_is_acknowledged_not_started(stack):
    stack.send({"id": "k1"}, sluice_once="true")
    stack.launcher().tick()
    [name] = started(stack)
    complete(stack, stack.finish(name))
    stack.send({"id": "k1"}, sluice_once="true")
    summary = stack.launcher().tick()
    assert started(stack) == [name]
    assert summary.n(Outcome.ALREADY_DONE) == 1 and summary.as_dict()["already_done"] == 1
    assert stack.queue_counts() == (0, 0)
    assert stack.runtime().store().payload("k1").already_done == 1


def test_a_once_key_that_failed_runs_again(stack):
    stack.send({"id": "k1"}, sluice_once="true")
    stack.launcher().tick()
    [name] = started(stack)
    complete(stack, stack.finish(name, "FAILED", error="E"))
    stack.send({"id": "k1"}, sluice_once="true")
    stack.launcher().tick()
    assert len(started(stack)) == 2


def once_race(stack) -> None:
    """The first run SUCCEEDED with its event still on the way when a once-message of its key
    arrives: the launcher settles the holder itself, and its claim again must find the success."""
    stack.send({"id": "k1"}, group="a", sluice_once="true")
    stack.launcher().tick()
    [name] = started(stack)
    late = stack.finish(name)  # ended; its event not delivered yet
    stack.send({"id": "k1"}, group="b", sluice_once="true")
    summary = stack.launcher().tick()
    assert started(stack) == [name], "a once key started a second time"
    assert summary.n(Outcome.ALREADY_DONE) == 1
    complete(stack, late)  # the event arrives: nothing left to release
    receipt = read_receipt(stack.runtime().store(), "k1")
    assert (receipt.name, receipt.outcome) == (name, PayloadState.SUCCEEDED)
    assert stack.queue_counts() == (0, 0)


def test_a_once_message_racing_the_completion_is_not_started(stack):
    once_race(stack)

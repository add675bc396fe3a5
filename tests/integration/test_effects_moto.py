"""Effects with the real adapters on moto (sluice.features.effects): follow-up payloads of a SUCCEEDED
execution enqueued once, whatever happens to its events and to the handler.

moto's FIFO deduplication compares a message only with those still in the queue, by real time; real
SQS also drops a copy of a message already deleted, for 5 minutes. So the tests drain the queue
before a repeat: a copy that reached the queue could only have been kept out by the durable mark
(``EFFECTS#<name>``), never by deduplication."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from freezegun import freeze_time

from sluice.core.events import StatusChange
from sluice.core.model import Outcome
from sluice.core.names import ORIGIN_ATTRIBUTE
from sluice.features.effects import EFFECTS_FIELD, MAX_EFFECTS, effect_id
from sluice.launch.completion import settle_status_change
from tests.support.aws import REGION, build_stack
from tests.support.hooks import Crash, count_calls, crash_after, receipts_of

BUCKET = "sluice-test-payloads"


def output(*effects: dict[str, Any], **more: Any) -> str:
    return json.dumps({"result": 1, EFFECTS_FIELD: list(effects), **more})


def started(stack) -> list[str]:
    return [e["name"] for e in stack.executions()]


def deliver(stack, event) -> bool:
    """The completion handler's release, without its refill (which would take an effect off the queue
    at once and start it: ``test_the_effects_run_as_payloads_of_their_own``)."""
    launcher = stack.launcher()
    released = settle_status_change(
        StatusChange.from_event(event),
        store=launcher.store,
        queue=launcher.queue,
        state_machine_arn=launcher.executions.state_machine_arn,
        now=launcher.clock.now(),
        executions=launcher.executions,
        outputs=launcher.outputs,
        effects=launcher.effects,
    )
    return released is not None


def ids(stack, *, but: tuple[str, ...] = ("parent",)) -> list[str]:
    """Every effect enqueued so far: on the queue (drained) or started from it."""
    runs = [i["id"] for i in stack.inputs() if i.get("id") not in but]
    return sorted(runs + [m["body"]["id"] for m in queued(stack)])


def run_one(stack, key: str = "parent") -> str:
    stack.send({"id": key}, group=key)
    stack.launcher().tick(reconcile_first=False)
    [name] = [n for n in started(stack) if n.startswith(key)]
    return name


def queued(stack) -> list[dict[str, Any]]:
    """The main queue's messages (drained), as (body, group, attributes, dedup id)."""
    return [
        {
            "body": json.loads(m["Body"]),
            "group": m["Attributes"]["MessageGroupId"],
            "dedup": m["Attributes"].get("MessageDeduplicationId"),
            "attributes": {k: v["StringValue"] for k, v in m.get("MessageAttributes", {}).items()},
        }
        for m in stack.drain(stack.settings.queue_url)
    ]


TWO = (
    {"payload": {"id": "child-a", "n": 1}},
    {
        "payload": {"id": "child-b"},
        "group": "fan",
        "once": True,
        "awaits": ["child-a", "x"],
        "lane": "default",
    },
)

# The same effects with nothing to await: each runs as soon as a slot is free.
RUNNABLE = (TWO[0], {k: v for k, v in TWO[1].items() if k != "awaits"})


def test_effects_are_enqueued_on_succeeded_with_their_keys_groups_and_attributes(stack):
    name = run_one(stack)
    assert deliver(stack, stack.finish(name, output=output(*TWO)))
    messages = queued(stack)
    assert [m["body"] for m in messages] == [{"id": "child-a", "n": 1}, {"id": "child-b"}]
    assert [m["group"] for m in messages] == ["child-a", "fan"]
    a, b = (m["attributes"] for m in messages)
    assert a == {"sluice-key": "child-a", ORIGIN_ATTRIBUTE: effect_id(name, 0)}
    assert b == {
        "sluice-key": "child-b",
        "sluice-once": "true",
        "sluice-awaits": '["child-a","x"]',
        ORIGIN_ATTRIBUTE: effect_id(name, 1),
    }
    holder = hashlib.sha256(name.encode()).hexdigest()[:32]
    assert [m["dedup"] for m in messages] == [f"{effect_id(name, i)}-{holder}" for i in (0, 1)]
    log = stack.runtime().store().effects(name)
    assert (log.count, log.sent, log.rejected, log.key) == (2, ("child-a", "child-b"), (), "parent")


def test_the_effects_run_as_payloads_of_their_own(stack):
    name = run_one(stack)
    launcher = stack.launcher()
    launcher.on_status_change(StatusChange.from_event(stack.finish(name, output=output(*RUNNABLE))))
    assert sorted(i["id"] for i in stack.inputs()) == ["child-a", "parent"]  # the refill started it
    launcher.tick(reconcile_first=False)
    assert sorted(i["id"] for i in stack.inputs()) == ["child-a", "child-b", "parent"]


def test_an_effect_that_awaits_a_sibling_waits_for_its_success(stack):
    """Fan-out with a join: child-b awaits child-a (sluice-awaits, honoured as from any producer)."""
    name = run_one(stack)
    joined = ({"payload": {"id": "child-a"}}, {"payload": {"id": "child-b"}, "awaits": ["child-a"]})
    launcher = stack.launcher()
    launcher.on_status_change(StatusChange.from_event(stack.finish(name, output=output(*joined))))
    summary = launcher.tick(reconcile_first=False)
    assert sorted(i["id"] for i in stack.inputs()) == ["child-a", "parent"]
    assert summary.n(Outcome.WAITING) == 1  # child-b parked, its message deleted
    [child_a] = [n for n in started(stack) if n.startswith("child-a")]
    launcher.on_status_change(StatusChange.from_event(stack.finish(child_a)))
    launcher.tick(reconcile_first=False)
    assert sorted(i["id"] for i in stack.inputs()) == ["child-a", "child-b", "parent"]


@pytest.mark.parametrize("status", ["FAILED", "TIMED_OUT", "ABORTED"])
def test_nothing_is_enqueued_when_the_execution_did_not_succeed(stack, status):
    name = run_one(stack)
    event = stack.finish(name, status, error="E" if status == "FAILED" else None, output=output(*TWO))
    assert deliver(stack, event)
    assert queued(stack) == [] and stack.dlq_messages() == []
    assert stack.runtime().store().effects(name) is None


def test_an_output_without_effects_writes_no_effects_record(stack):
    name = run_one(stack)
    deliver(stack, stack.finish(name, output='{"done": true}'))
    assert queued(stack) == []
    assert stack.runtime().store().effects(name) is None


def test_a_repeated_or_late_event_sends_nothing_more(stack):
    name = run_one(stack)
    event = stack.finish(name, output=output(*TWO))
    deliver(stack, event)
    assert len(queued(stack)) == 2  # drained: moto would not drop a copy now
    assert not deliver(stack, event)
    stack.launcher().tick(reconcile_first=False)
    assert not deliver(stack, event)  # late, after the effects ran
    assert [e["name"] for e in stack.executions()].count(name) == 1
    assert queued(stack) == []


def test_a_crash_between_sending_and_releasing_then_a_retry_sends_each_effect_once(stack):
    name = run_one(stack)
    event = stack.finish(name, output=output(*TWO))
    rt = stack.runtime()
    crash_after(rt.client("sqs"), "SendMessage", after=1)  # effect 0 sent, then the handler dies
    with pytest.raises(Crash):
        rt.launcher().on_status_change(StatusChange.from_event(event))
    assert stack.runtime().store().effects(name) is None  # not marked: the lease is still held
    assert deliver(stack, event)  # EventBridge's retry, within SQS's window
    messages = queued(stack)
    assert [m["body"]["id"] for m in messages] == ["child-a", "child-b"]  # the copy of e0 was dropped
    assert stack.runtime().store().effects(name).sent == ("child-a", "child-b")


def test_a_crash_after_the_release_sends_nothing_again(stack):
    name = run_one(stack)
    event = stack.finish(name, output=output(*RUNNABLE))
    rt = stack.runtime()
    received = receipts_of(rt.client("sqs"))
    crash_after(rt.client("dynamodb"), "TransactWriteItems", after=1)  # the release, then dies
    with pytest.raises(Crash):
        rt.launcher().on_status_change(StatusChange.from_event(event))
    # The release handed its slot to the first effect (received before it, claimed in it), which
    # is in flight until its visibility timeout runs out.
    assert stack.queue_counts() == (1, 1) and len(received) == 1
    stack.visible_again(received)
    assert not deliver(stack, event)
    stack.launcher(consistency_window_seconds=0).tick()
    assert ids(stack) == ["child-a", "child-b"]  # started by that tick; nothing sent again
    assert stack.runtime().store().effects(name).count == 2


def test_a_crash_mid_send_and_a_retry_past_the_dedup_window_runs_each_effect_once(session):
    """Past SQS's 5 minutes a resent copy reaches the queue; it names the same execution as the
    first, so the effect still runs once; and the durable mark keeps every later end from sending."""
    with freeze_time("2027-01-01 00:00:00") as frozen:
        stack = build_stack(session, consistency_window_seconds=0)
        name = run_one(stack)
        event = stack.finish(name, output=output(*RUNNABLE))
        rt = stack.runtime()
        crash_after(rt.client("sqs"), "SendMessage", after=1)
        with pytest.raises(Crash):
            rt.launcher().on_status_change(StatusChange.from_event(event))
        frozen.tick(301)  # the event is lost; reconciliation finds the end after SQS's window
        stack.launcher().tick(reconcile_first=True)
        frozen.tick(1)
        for _ in range(3):
            stack.launcher().tick(reconcile_first=False)
        log = stack.runtime().store().effects(name)
        assert log is not None and log.sent == ("child-a", "child-b")
        assert stack.queue_counts() == (0, 0)  # both copies of e0 taken off the queue
        runs = [i["id"] for i in stack.inputs()]
        assert sorted(runs) == ["child-a", "child-b", "parent"]  # each effect ran once
        assert stack.runtime().store().payload("child-a").attempts == 1
        assert not deliver(stack, event)  # the event, very late: nothing more


def test_reconciliation_after_a_lost_event_sends_them_once(stack):
    name = run_one(stack)
    event = stack.finish(name, output=output(*RUNNABLE))  # its event is lost
    stack.launcher(consistency_window_seconds=0).tick()  # reconciles, then admits what it sent
    log = stack.runtime().store().effects(name)
    assert log is not None and log.sent == ("child-a", "child-b")
    stack.launcher(consistency_window_seconds=0).tick()
    assert not deliver(stack, event)  # the event after all, late
    assert ids(stack) == ["child-a", "child-b"]


def test_a_redelivered_message_that_already_ran_sends_nothing_again(session):
    """The parent's message comes back after its execution ended and sent its effects: the claim
    refuses the name that ran (``AlreadyRan``), so nothing is released a second time and nothing is
    sent. (Were it claimed again, the mark, an item of its own, would stop a second send: the broken
    variants check that guard too.)"""
    with freeze_time("2027-01-01 00:00:00") as frozen:
        stack = build_stack(session, visibility_timeout=400)  # returns past SQS's 5-minute window
        stack.send({"id": "parent"}, group="parent")
        rt = stack.runtime()
        crash_after(rt.client("stepfunctions"), "StartExecution")  # started, message not deleted
        with pytest.raises(Crash):
            rt.launcher().tick(reconcile_first=False)
        [name] = started(stack)
        deliver(stack, stack.finish(name, output=output(*RUNNABLE)))
        frozen.tick(401)  # the message returns after its visibility timeout
        again = stack.runtime()
        calls = count_calls(again.client("sqs"))
        summary = again.launcher().tick(reconcile_first=False)
        assert summary.n(Outcome.ALREADY_RAN) == 1
        # Nothing sent: a copy sent now would be past SQS's window (the launcher would resume its
        # execution by name and run nothing twice, but the effect would be enqueued twice).
        assert calls["SendMessage"] == 0, f"effects sent again: {calls}"
        assert ids(stack) == ["child-a", "child-b"]


def test_invalid_effects_are_recorded_and_dead_lettered_and_the_rest_sent(stack):
    name = run_one(stack)
    effects = [
        {"payload": {"id": "ok"}},
        {"payload": "not an object"},
        {"payload": {"n": 1}},  # no key
        {"payload": {"id": "gpu-job"}, "lane": "gpu"},
        {"payload": {"id": "big", "blob": "x" * 270_000}},  # no bucket to store it in
        {"payload": {"id": "odd"}, "colour": "red"},
        {"payload": {"id": "bad-group"}, "group": "é"},
        "just a string",
    ]
    assert deliver(stack, stack.finish(name, output=output(*effects)))
    assert [m["body"]["id"] for m in queued(stack)] == ["ok"]
    log = stack.runtime().store().effects(name)
    assert (log.count, log.sent) == (8, ("ok",))
    reasons = dict(log.rejected)
    assert sorted(reasons) == [1, 2, 3, 4, 5, 6, 7]
    assert "must be a JSON object, got a string" in reasons[1]
    assert "no key" in reasons[2]
    assert "lane \"gpu\" refused: the stack's lanes are 'default' only (no lanes configured)" in reasons[3]
    assert "at most 262,144 bytes" in reasons[4]
    assert "unknown field(s) 'colour'" in reasons[5]
    assert "'group'" in reasons[6]
    dead = stack.dlq_messages()
    by_index = {int(m["MessageAttributes"]["sluice-effect-index"]["StringValue"]): m for m in dead}
    assert sorted(by_index) == [1, 2, 3, 4, 5, 6, 7]
    assert by_index[3]["MessageAttributes"]["sluice-error"]["StringValue"] == reasons[3]
    assert by_index[3]["MessageAttributes"]["sluice-effect-of"]["StringValue"] == name
    assert json.loads(by_index[3]["Body"]) == {"id": "gpu-job"}
    assert by_index[4]["MessageAttributes"].get("sluice-body-truncated")  # too big: a note stands in


def test_too_many_effects_are_refused_as_a_whole(stack):
    name = run_one(stack)
    many = [{"payload": {"id": f"c{i}"}} for i in range(MAX_EFFECTS + 1)]
    assert deliver(stack, stack.finish(name, output=output(*many)))
    assert queued(stack) == []
    log = stack.runtime().store().effects(name)
    assert log.count == MAX_EFFECTS + 1 and log.sent == ()
    [(index, reason)] = log.rejected
    assert index == -1 and f"at most {MAX_EFFECTS}" in reason
    [dead] = stack.dlq_messages()
    assert dead["MessageAttributes"]["sluice-error"]["StringValue"] == reason


def test_effects_not_a_list_are_refused(stack):
    name = run_one(stack)
    deliver(stack, stack.finish(name, output=json.dumps({EFFECTS_FIELD: {"payload": {"id": "a"}}})))
    assert queued(stack) == []
    assert "must be a JSON array, got an object" in stack.runtime().store().effects(name).rejected[0][1]
    assert len(stack.dlq_messages()) == 1


def test_a_large_output_in_the_bucket_still_sends_its_effects_and_a_large_effect_goes_as_a_pointer(session):
    session.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
    stack = build_stack(session, payload_bucket=BUCKET, receipt_inline_bytes=100, pointer_threshold=1_000)
    name = run_one(stack)
    big = {"id": "big-child", "rows": ["y" * 100] * 20}
    text = output({"payload": {"id": "small-child"}}, {"payload": big})
    deliver(stack, stack.finish(name, output=text))
    store = stack.runtime().store()
    assert store.execution(name).output_ref is not None  # the receipt keeps the output in the bucket
    small, pointer = queued(stack)
    assert small["body"] == {"id": "small-child"}
    raw = json.dumps(big, separators=(",", ":")).encode()
    digest = hashlib.sha256(raw).hexdigest()
    assert pointer["body"] == {
        "id": "big-child",
        "sluicePayload": {"uri": f"s3://{BUCKET}/payloads/{digest}", "sha256": digest, "size": len(raw)},
    }
    assert pointer["attributes"]["sluice-key"] == "big-child"
    stored = stack.client("s3").get_object(Bucket=BUCKET, Key=f"payloads/{digest}")["Body"].read()
    assert stored == raw

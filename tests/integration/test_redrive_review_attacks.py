"""A reviewer's attacks on two protocol changes, on moto with the real adapters.

``dlq redrive`` sends a dead-letter copy back carrying the id of the message it came from
(``sluice-origin-message-id``, ``sluice.adapters.aws.sqs_dead_letters.logical_id``), so the copy
runs under that message's execution name, at most once. Reconciliation saves its count of
executions started outside Sluice only together with the caps that carry it
(``sluice.launch.reconcile``).

Two scenarios broke a promise when written (a producer's source id on a message SQS moved; a
dead-letter copy that dropped its origin); both are fixed and pass, as the others do.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from typing import Any

import pytest

from sluice.core.clock import FakeClock
from sluice.core.errors import TransientError
from sluice.core.events import StatusChange
from sluice.core.names import ORIGIN_ATTRIBUTE, execution_name
from sluice.features.pointers import POINTER_FIELD, object_key
from sluice.launch.settings import DuplicatePolicy
from sluice.ops.dlq import dlq_list, dlq_redrive
from tests.support.aws import REGION, Stack, build_stack
from tests.support.hooks import Crash, crash_before, receipts_of, throttle

BUCKET = "sluice-review-payloads"


# -- helpers -----------------------------------------------------------------------------------------


def names_of(stack: Stack) -> list[str]:
    return sorted(e["name"] for e in stack.executions())


def inputs_with(stack: Stack, **fields: Any) -> list[Any]:
    """The inputs of every execution whose input holds ``fields``."""
    return [i for i in stack.inputs() if all(i.get(k) == v for k, v in fields.items())]


def dlq_only(stack: Stack) -> Any:
    """The one message the DLQ holds, looked at (not consumed)."""
    listing = dlq_list(stack.runtime())
    assert len(listing.messages) == 1, listing.messages
    return listing.messages[0]


def end(stack: Stack, name: str, status: str = "SUCCEEDED") -> None:
    """``name`` ends; its status event reaches the completion handler."""
    event = stack.finish(name, status, output="{}")
    stack.launcher().on_status_change(StatusChange.from_event(event))


def move_to_dlq_by_sqs(stack: Stack, max_receive_count: int, fault: Any) -> None:
    """Tick until SQS has received the message ``max_receive_count`` times without a delete; the
    next receive moves it to the DLQ (``fault`` keeps each tick from finishing it)."""
    rt = stack.runtime()
    sqs = rt.client("sqs")
    receipts = receipts_of(sqs)
    fault(rt)
    launcher = rt.launcher()
    for _ in range(max_receive_count):
        with contextlib.suppress(Crash):
            launcher.tick(reconcile_first=False)
        assert receipts, "the tick received nothing"
        stack.visible_again(receipts)
        receipts.clear()
    # The next receive: SQS moves it to the DLQ instead of delivering it.
    launcher.tick(reconcile_first=False)
    assert receipts == []
    assert stack.queue_counts() == (0, 0)


def pointer_stack(session: Any, **settings: Any) -> Stack:
    s3 = session.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    return build_stack(session, payload_bucket=BUCKET, clock=FakeClock(), **settings)


def stored(body: dict[str, Any]) -> tuple[bytes, str, str]:
    """A payload stored by pointer: its bytes, the object's key, and the pointer body."""
    raw = json.dumps(body).encode()
    sha = hashlib.sha256(raw).hexdigest()
    spec = {"uri": f"s3://{BUCKET}/{object_key(sha)}", "sha256": sha, "size": len(raw)}
    return raw, object_key(sha), json.dumps({"id": body["id"], POINTER_FIELD: spec})


# -- change 1: redrive under the message's own name -----------------------------------------------


def test_a_producer_source_id_on_a_message_sqs_moved_names_another_run(session):
    """m1 of k runs and SUCCEEDS; m2 of k (another payload) is sent with sluice-source-message-id =
    m1 (the catalogue accepts it: "ignored on the queue"); every claim of m2 is throttled, so SQS
    moves m2 to the DLQ after maxReceiveCount receives (no sluice-error: SQS moved it); the
    operator redrives it: logical_id reads the producer's attribute, the copy carries origin m1,
    its name is name(k, m1), which ran: settled as already ran, deleted. m2 never ran."""
    stack = build_stack(session, max_concurrency=2, max_receive_count=2, clock=FakeClock())
    m1 = stack.send({"id": "k", "n": 1}, group="a")
    stack.launcher().tick()
    (e1,) = stack.running()
    end(stack, e1)
    assert stack.running() == []

    stack.send({"id": "k", "n": 2}, group="b", sluice_source_message_id=m1)
    throttled: dict[str, Any] = {}

    def no_claim(rt: Any) -> None:
        throttled["claims"] = throttle(rt.client("dynamodb"), "TransactWriteItems")

    move_to_dlq_by_sqs(stack, 2, no_claim)
    assert throttled["claims"]["throttled"] >= 2, "the claim was never throttled"
    dead = dlq_only(stack)
    assert dead.reason.startswith("moved by SQS")

    report = dlq_redrive(stack.runtime(), [dead.message_id])
    assert report.ok, report
    stack.launcher().tick()
    assert stack.queue_counts() == (0, 0) and stack.queue_counts(stack.settings.dlq_url) == (0, 0)
    assert inputs_with(stack, id="k", n=2), "m2 was redriven, never ran, and is nowhere any more"


def test_a_parked_message_with_many_attributes_keeps_its_origin_in_the_dlq_and_runs_once(session):
    """Defer policy. e0 runs k; m (k, by pointer, 9 small producer attributes) arrives and is parked
    behind e0; the stored object expires; e0 ends and m is re-sent as m' (origin m, 10 attributes);
    m' is dead-lettered (pointer's object missing) but its delete is lost (throttled); the
    producer stores the object again; m' comes back and runs as name(k, m); the operator redrives
    the dead-letter copy: it names m's run, which ran, and does not run again. (Found breaking: the
    copy kept 7 attributes smallest first and dropped the origin; it now keeps the origin.)"""
    stack = pointer_stack(session, max_concurrency=2, duplicate_policy=DuplicatePolicy.DEFER)
    s3 = stack.client("s3")
    raw, key, pointer = stored({"id": "k", "big": "x"})
    s3.put_object(Bucket=BUCKET, Key=key, Body=raw)
    stack.send({"id": "k"}, group="a")
    stack.launcher().tick()
    (e0,) = stack.running()
    extra = {f"a{i}": "x" for i in range(9)}
    m = stack.send(pointer, group="b", **extra)
    stack.launcher().tick()
    assert stack.running() == [e0], "m was not parked behind e0"

    s3.delete_object(Bucket=BUCKET, Key=key)  # the object's lifecycle expiry
    rt = stack.runtime()
    sqs = rt.client("sqs")
    receipts = receipts_of(sqs)
    lost = [throttle(sqs, "DeleteMessageBatch"), throttle(sqs, "DeleteMessage")]
    launcher = rt.launcher()
    launcher.on_status_change(StatusChange.from_event(stack.finish(e0, "SUCCEEDED", output="{}")))
    launcher.tick(reconcile_first=False)
    assert sum(t["throttled"] for t in lost) >= 1, "no delete was lost"
    dead = dlq_only(stack)
    assert "sluicePayload" in dead.body
    assert dead.source_message_id != m  # m', the re-sent copy
    assert dead.attributes[ORIGIN_ATTRIBUTE]["StringValue"] == m, "the DLQ copy dropped the origin"

    s3.put_object(Bucket=BUCKET, Key=key, Body=raw)  # the producer stores it again
    stack.visible_again(receipts)
    stack.launcher().tick()
    ran = execution_name("k", m)
    assert ran in stack.running(), "m' did not run under m's name"

    report = dlq_redrive(stack.runtime(), [dead.message_id])
    assert report.ok, report
    end(stack, ran)
    stack.launcher().tick()
    assert stack.queue_counts() == (0, 0)
    assert names_of(stack) == sorted([e0, ran]), "the redriven copy of m ran a second time"


@pytest.mark.parametrize("released_first", [False, True], ids=["still-claimed", "released"])
def test_a_claim_never_started_then_moved_by_sqs_runs_once_when_redriven(session, released_first):
    """m of k is claimed as N and the launcher dies before StartExecution, at every receive; SQS
    moves m to the DLQ (maxReceiveCount). Either N is still CLAIMED, or reconciliation has released
    it (marked, then a claim timeout later RELEASED, never started). The operator redrives m: the
    copy carries origin m, so the same name. A still CLAIMED N carries m's start mark, which only m
    lifts (no clock says m's invocation is over): the copy goes back for a claim timeout, while
    reconciliation releases N as abandoned, then claims it afresh. Either way it starts N once:
    the payload that never ran is not dropped as already ran, and a second redrive runs nothing
    more."""
    stack = build_stack(session, max_concurrency=2, max_receive_count=2, clock=FakeClock())
    m = stack.send({"id": "k"}, group="a")
    name = execution_name("k", m)
    crashes: list[int] = []

    def no_start(rt: Any) -> None:
        crash_before(rt.client("stepfunctions"), "StartExecution")
        crashes.append(1)

    move_to_dlq_by_sqs(stack, 2, no_start)
    store = stack.runtime().store()
    assert store.execution(name).state.value == "CLAIMED", "the claim was never taken"
    assert stack.executions() == [], "the crash before StartExecution did not fire"
    if released_first:
        reconciler = stack.launcher()
        stack.clock.advance(61)
        reconciler.tick()  # marks the claim
        stack.clock.advance(stack.settings.claim_timeout_seconds + 1)
        reconciler.tick()  # releases it: never started
        assert store.execution(name).state.value == "RELEASED"
    dead = dlq_only(stack)
    assert dead.reason.startswith("moved by SQS")

    assert dlq_redrive(stack.runtime(), [dead.message_id]).ok
    rt = stack.runtime()
    back = receipts_of(rt.client("sqs"))
    stack.clock.advance(61)
    rt.launcher().tick()
    if not released_first:
        assert stack.running() == [], "the copy lifted the mark of m, whose invocation may be starting N"
        stack.clock.advance(stack.settings.claim_timeout_seconds + 1)
        stack.visible_again(back)  # back a claim timeout later (moto's visibility runs in real time)
        rt.launcher().tick()  # reconciliation releases N as abandoned; the copy claims it afresh
    assert stack.running() == [name], "the redriven payload that never ran did not start"
    assert stack.queue_counts() == (0, 0) and stack.queue_counts(stack.settings.dlq_url) == (0, 0)
    end(stack, name)
    stack.launcher().tick()
    assert names_of(stack) == [name]


def test_an_invalid_payload_redriven_unfixed_then_fixed_minutes_later_runs_once(session):
    """m of k points at a stored object not there yet: dead-lettered (copy d1). Redriven unfixed:
    the copy r1 (origin m) is dead-lettered again (copy d2, origin m). Six minutes later (past
    SQS's deduplication window) the object is stored and d2 redriven: it runs, once, under
    name(k, m). Liveness: a payload that never ran is not settled as already ran."""
    stack = pointer_stack(session, max_concurrency=2)
    raw, key, pointer = stored({"id": "k", "big": "y"})
    m = stack.send(pointer, group="a")
    stack.launcher().tick()
    d1 = dlq_only(stack)
    assert "sluicePayload" in d1.body and d1.source_message_id == m
    assert dlq_redrive(stack.runtime(), [d1.message_id]).ok
    stack.launcher().tick()
    d2 = dlq_only(stack)
    assert d2.message_id != d1.message_id
    assert d2.attributes[ORIGIN_ATTRIBUTE]["StringValue"] == m
    assert stack.executions() == []

    stack.clock.advance(6 * 60)
    stack.client("s3").put_object(Bucket=BUCKET, Key=key, Body=raw)
    assert dlq_redrive(stack.runtime(), [d2.message_id]).ok
    stack.launcher().tick()
    assert stack.running() == [execution_name("k", m)]
    assert stack.queue_counts(stack.settings.dlq_url) == (0, 0)


def test_a_waiter_dead_lettered_by_its_awaited_key_runs_once_redriven_after_the_key_succeeds(session):
    """a runs and FAILS; w of k awaits a: dead-lettered ("awaited a ended FAILED"). a is sent again,
    runs and SUCCEEDS. The operator redrives w's copy (origin w): its awaits hold now, it runs once
    under name(k, w); the same copy dead-lettered and redriven again would name that run."""
    stack = build_stack(session, max_concurrency=2, clock=FakeClock())
    stack.send({"id": "a"}, group="a")
    stack.launcher().tick()
    (a1,) = stack.running()
    end(stack, a1, "FAILED")
    w = stack.send({"id": "k"}, group="k", sluice_awaits='["a"]')
    stack.launcher().tick()
    dead = dlq_only(stack)
    assert "awaited" in dead.reason and stack.running() == []

    stack.send({"id": "a", "again": True}, group="a2")
    stack.launcher().tick()
    (a2,) = stack.running()
    end(stack, a2)
    assert dlq_redrive(stack.runtime(), [dead.message_id]).ok
    stack.launcher().tick()
    assert stack.running() == [execution_name("k", w)]
    assert stack.queue_counts() == (0, 0)


def test_a_ten_attribute_message_moved_by_sqs_stays_in_the_dlq_and_runs_under_a_new_name(session):
    """m of k has 10 attributes (the most SQS takes); the launcher's claim is throttled at every
    receive and SQS moves m to the DLQ. A redrive has no room for the origin: m stays in the DLQ
    with NO_ROOM, nothing sent. ``new_name`` sends it as a new message: it runs once."""
    stack = build_stack(session, max_concurrency=2, max_receive_count=2, clock=FakeClock())
    stack.launcher().tick()  # the pool planned before the claims are throttled
    stack.send({"id": "k"}, group="a", **{f"a{i}": "x" for i in range(10)})
    fired: list[Any] = []
    move_to_dlq_by_sqs(
        stack, 2, lambda rt: fired.append(throttle(rt.client("dynamodb"), "TransactWriteItems"))
    )
    assert fired[0]["throttled"] >= 2
    dead = dlq_only(stack)
    assert len(dead.attributes) == 10
    report = dlq_redrive(stack.runtime(), [dead.message_id])
    assert not report.ok and "no room" in report.failed[0]["reason"]
    assert stack.queue_counts() == (0, 0)
    assert dlq_only(stack).message_id == dead.message_id

    assert dlq_redrive(stack.runtime(), [dead.message_id], new_name=True).ok
    stack.launcher().tick()
    assert len(stack.running()) == 1
    assert stack.queue_counts(stack.settings.dlq_url) == (0, 0)


# -- change 2: an outside count saved only with the caps that carry it ----------------------------


def by_hand(stack: Stack, name: str) -> None:
    """An execution started by hand on the stack's state machine (outside Sluice)."""
    stack.client("stepfunctions").start_execution(
        stateMachineArn=stack.settings.state_machine_arn, name=name, input="{}"
    )


def test_max_holds_with_an_outside_run_while_max_cannot_be_read(session):
    """MAX 3. A and B run (Sluice); X is started by hand; four messages wait. A tick whose SSM is
    throttled reconciles (sees X, cannot read MAX: nothing saved) and admits nothing; A ends and
    its completion hands its slot over (3 running: B, A', X); the next tick reads MAX and counts X:
    caps 2, nothing more starts; when B ends its slot is not refilled beside X; X ends, and the
    tick after fills up to 3 of Sluice's own. Never more than 3 RUNNING, X included."""
    stack = build_stack(session, max_concurrency=3, clock=FakeClock())
    for i in range(2):
        stack.send({"id": f"p{i}"}, group=f"g{i}")
    stack.launcher().tick()
    a, b = sorted(stack.running())
    by_hand(stack, "outside-x")
    for i in range(2, 6):
        stack.send({"id": f"p{i}"}, group=f"g{i}")
    peak = [len(stack.running())]

    rt = stack.runtime()
    ssm_down = throttle(rt.client("ssm"), "GetParameter")
    throttled_tick = rt.launcher()
    stack.clock.advance(61)
    with contextlib.suppress(TransientError):  # a tick that cannot read MAX may end early
        throttled_tick.tick()
    assert ssm_down["throttled"] >= 1, "SSM was never asked"
    peak.append(len(stack.running()))
    throttled_tick.on_status_change(StatusChange.from_event(stack.finish(a, "SUCCEEDED", output="{}")))
    peak.append(len(stack.running()))

    stack.clock.advance(61)
    stack.launcher().tick()  # reads MAX: X counted
    peak.append(len(stack.running()))
    end(stack, b)
    peak.append(len(stack.running()))
    stack.launcher().tick()
    peak.append(len(stack.running()))
    assert max(peak) <= 3, f"more than MAX running, the outside run included: {peak}"
    assert "outside-x" in stack.running()

    stack.finish("outside-x", "SUCCEEDED", output="{}")  # an outside run's end: no event for Sluice
    stack.clock.advance(61)
    stack.launcher().tick()
    assert len(stack.running()) == 3, "the outside run's end never gave its slot back"


def test_max_holds_when_a_reconciler_with_an_older_listing_saves_after_a_newer_one(session):
    """MAX 3; A and B run; three messages wait. Reconciler R1 lists (A, B); then X is started by
    hand and reconciler R2 runs a whole tick (lists A, B, X: caps 2); R1, resuming with its older
    listing (no outside run), saves and admits. The newer count must stand: still 3 RUNNING
    with X, and a completion's refill keeps it so."""
    stack = build_stack(session, max_concurrency=3, clock=FakeClock())
    for i in range(2):
        stack.send({"id": f"p{i}"}, group=f"g{i}")
    stack.launcher().tick()
    a, _ = sorted(stack.running())
    for i in range(2, 5):
        stack.send({"id": f"p{i}"}, group=f"g{i}")

    rt = stack.runtime()
    sfn = rt.client("stepfunctions")
    raced: list[int] = []

    def meanwhile(**_: Any) -> None:
        if raced:
            return
        raced.append(len(stack.running()))
        by_hand(stack, "outside-x")
        stack.launcher().tick()  # R2: lists A, B, X
        raced.append(len(stack.running()))

    sfn.meta.events.register(
        f"after-call.{sfn.meta.service_model.service_id.hyphenize()}.ListExecutions", meanwhile
    )
    r1 = rt.launcher()
    stack.clock.advance(61)
    r1.tick()
    assert raced == [2, 3], f"the race did not happen as planned: {raced}"
    assert len(stack.running()) <= 3, f"R1's older listing let Sluice past MAX: {stack.running()}"
    r1.on_status_change(StatusChange.from_event(stack.finish(a, "SUCCEEDED", output="{}")))
    assert len(stack.running()) <= 3, f"a refill passed MAX beside the outside run: {stack.running()}"
    stack.clock.advance(61)
    stack.launcher().tick()
    assert len(stack.running()) <= 3

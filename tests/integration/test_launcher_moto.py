"""The launcher against moto: SQS FIFO + DLQ, DynamoDB, Step Functions, SSM."""

from __future__ import annotations

import json
import random
import threading

import pytest
from freezegun import freeze_time

from sluice.core.clock import FakeClock
from sluice.core.errors import ConfigurationError
from sluice.core.events import StatusChange
from sluice.core.model import Outcome, PayloadState
from sluice.core.names import execution_name
from sluice.launch.completion import handle_status_change
from sluice.launch.per_message import THROTTLED_STARTS
from tests.support.aws import build_stack, status_change_event
from tests.support.hooks import (
    Crash,
    count_calls,
    crash_after,
    crash_before,
    error_answer,
    receipts_of,
    throttle,
)


def deliver(stack, event) -> bool:
    rt = stack.runtime()
    return handle_status_change(
        StatusChange.from_event(event),
        store=rt.store(),
        queue=rt.queue(),
        state_machine_arn=stack.settings.state_machine_arn,
        now=stack.clock.now(),
    )


def key_of(stack, name: str) -> str:
    return stack.runtime().store().execution(name).key


def test_forty_payloads_max_five_duplicates_and_invalid(session):
    """MAX=5, 40 messages: 27 distinct payloads, 10 duplicates, 3 invalid; ticks and completions repeated.

    A duplicate is a producer retry: a new message with the same id, right behind the original in
    its FIFO group. Executions end in random order with random outcomes, except that one whose
    duplicate is still queued keeps running (a duplicate arriving after the end is a re-submission,
    which must run again). One status event in five is lost, one in five delivered twice.
    """
    clock = FakeClock()
    # A duplicate refused in a later batch than its holder's claim is sent back for the consistency
    # window (moto's visibility runs in real time): 0, so that it comes back within the test.
    stack = build_stack(session, max_concurrency=5, clock=clock, consistency_window_seconds=0)
    rng = random.Random(7)
    distinct = [f"scene-{i:02d}" for i in range(27)]
    duplicated = set(rng.sample(distinct, 10))
    for key in distinct:
        stack.send({"id": key, "n": 1}, group=key)
        if key in duplicated:
            stack.send({"id": key, "n": 2}, group=key)
    stack.send("{not json", group="bad-1")
    stack.send(json.dumps([1, 2]), group="bad-2")
    stack.send(json.dumps({"id": "huge", "blob": "x" * 270_000}), group="bad-3")

    rt = stack.runtime()
    launcher, store = rt.launcher(), rt.store()
    peak = 0
    for _ in range(60):
        summary = launcher.tick()
        running = stack.running()
        peak = max(peak, len(running))
        assert len(running) <= 5
        for name in rng.sample(running, len(running)):
            key = store.execution(name).key
            if key in duplicated and store.payload(key).duplicates == 0:
                continue
            event = stack.finish(name, rng.choice(["SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"]))
            roll = rng.random()
            if roll < 0.2:
                continue  # lost: reconciliation must find it
            deliver(stack, event)
            if roll > 0.8:
                assert not deliver(stack, event)  # a second delivery frees nothing
        clock.advance(61)  # past the consistency window, so reconciliation can act on lost events
        if not stack.running() and stack.queue_counts() == (0, 0) and summary.received == 0:
            break

    inputs = stack.inputs()
    keys = [i["id"] for i in inputs]
    assert sorted(keys) == sorted(distinct)  # each distinct payload started exactly once
    assert all(i["n"] == 1 for i in inputs)
    assert peak == 5
    assert stack.queue_counts() == (0, 0)
    dead = stack.dlq_messages()
    reasons = sorted(m["MessageAttributes"]["sluice-error"]["StringValue"] for m in dead)
    assert len(reasons) == 3
    assert reasons[0].startswith("not JSON")
    assert reasons[1].startswith("payload is 270,")
    assert reasons[2] == "payload must be a JSON object, got an array"
    assert store.ledger().holders == frozenset()
    assert sum(store.payload(k).duplicates for k in duplicated) == 10
    assert all(
        store.payload(k).state.value in {"SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"} for k in distinct
    )


def test_two_ticks_at_once_never_exceed_max(session):
    stack = build_stack(session, max_concurrency=5)
    for i in range(20):
        stack.send({"id": f"p{i}"}, group=f"p{i}")
    launchers = [stack.launcher(), stack.launcher()]  # separate runtimes, separate clients
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def run(launcher):
        try:
            barrier.wait()
            launcher.tick(reconcile_first=False)
        except BaseException as exc:  # pragma: no cover - asserted below
            errors.append(exc)

    for _ in range(3):
        threads = [threading.Thread(target=run, args=(launcher,)) for launcher in launchers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert len(stack.running()) == 5
        assert len(stack.runtime().store().ledger().holders) == 5
        for name in stack.running()[:3]:
            deliver(stack, stack.finish(name))
    ids = [i["id"] for i in stack.inputs()]
    assert len(ids) == len(set(ids)) == 5 + 3 + 3


@pytest.mark.parametrize(
    ("service", "operation", "where"),
    [
        ("stepfunctions", "StartExecution", "after"),  # started, not deleted (no mark is written)
        ("sqs", "DeleteMessageBatch", "before"),  # about to delete
        ("dynamodb", "TransactWriteItems", "after-claim"),  # claimed, not started
    ],
)
def test_killed_mid_message_then_retried_after_the_visibility_timeout_starts_nothing_twice(
    session, service, operation, where
):
    with freeze_time("2027-01-01 00:00:00") as frozen:
        stack = build_stack(session, max_concurrency=5, visibility_timeout=180)
        stack.send({"id": "only"}, group="only")
        rt = stack.runtime()
        client = rt.client(service)
        if where == "before":
            crash_before(client, operation)
        else:
            # The stack's first claim creates the slot pool first (one TransactWriteItems of its own).
            crash_after(client, operation, after={"after": 1, "after-claim": 2}[where])
        with pytest.raises(Crash):
            rt.launcher().tick(reconcile_first=False)
        assert stack.queue_counts() == (0, 1)  # in flight, not deleted
        frozen.tick(181)
        summary = stack.launcher().tick(reconcile_first=False)
    assert summary.n(Outcome.RESUMED) == 1
    assert [i["id"] for i in stack.inputs()] == ["only"]
    assert stack.queue_counts() == (0, 0)
    record = stack.runtime().store().payload("only")
    assert (record.state, record.attempts, len(record.executions)) == (PayloadState.CLAIMED, 1, 1)


def test_max_change_in_ssm_takes_effect_on_the_next_tick(stack):
    for i in range(10):
        stack.send({"id": f"p{i}"}, group=f"p{i}")
    ssm = stack.client("ssm")
    ssm.put_parameter(Name=stack.settings.max_parameter, Value="2", Overwrite=True)
    assert stack.launcher().tick().n(Outcome.STARTED) == 2
    ssm.put_parameter(Name=stack.settings.max_parameter, Value="4", Overwrite=True)
    summary = stack.launcher().tick()
    assert (summary.max_concurrency, summary.n(Outcome.STARTED)) == (4, 2)
    assert len(stack.running()) == 4
    ssm.put_parameter(Name=stack.settings.max_parameter, Value="0", Overwrite=True)
    for name in stack.running():
        deliver(stack, stack.finish(name))
    assert stack.launcher().tick().stopped == "paused"
    assert stack.running() == [] and stack.queue_counts() == (6, 0)


def test_a_max_written_to_the_parameter_alone_reaches_the_caps_at_the_next_tick(stack):
    """The console or a deploy writes only the parameter: until a tick reads it, completions
    refill under the caps in force. `sluice set-max` writes both (tests/integration/test_cli.py)."""
    for i in range(6):
        stack.send({"id": f"p{i}"}, group=f"p{i}")
    ssm = stack.client("ssm")
    ssm.put_parameter(Name=stack.settings.max_parameter, Value="2", Overwrite=True)
    stack.launcher().tick()
    ssm.put_parameter(Name=stack.settings.max_parameter, Value="1", Overwrite=True)
    completion = stack.launcher()

    def complete(name: str) -> None:
        assert completion.on_status_change(StatusChange.from_event(stack.finish(name)))[0]

    complete(stack.running()[0])
    assert len(stack.running()) == 2  # refilled under the caps in force (2)
    assert stack.runtime().store().ledger().in_force == 2
    stack.launcher().tick()
    assert stack.runtime().store().ledger().in_force == 1  # the tick moved the caps
    for name in stack.running():
        complete(name)
    assert len(stack.running()) == 1  # 2 ended: 1 refilled, under 1


def test_a_bad_max_value_fails_loudly_and_touches_nothing(stack):
    stack.send({"id": "p"})
    stack.client("ssm").put_parameter(Name=stack.settings.max_parameter, Value="lots", Overwrite=True)
    with pytest.raises(ConfigurationError, match="MAX must be a whole number"):
        stack.launcher().tick()
    assert stack.queue_counts() == (1, 0) and stack.running() == []


def test_missing_max_parameter_falls_back_to_the_deployed_default(stack):
    stack.client("ssm").delete_parameter(Name=stack.settings.max_parameter)
    for i in range(7):
        stack.send({"id": f"p{i}"}, group=f"p{i}")
    assert stack.launcher(max_concurrency=3).tick().n(Outcome.STARTED) == 3


def test_throttled_start_ends_the_tick_cleanly(session):
    stack = build_stack(session, clock=FakeClock())
    for i in range(4):
        stack.send({"id": f"p{i}"}, group=f"p{i}")
    rt = stack.runtime()
    seen = throttle(rt.client("stepfunctions"), "StartExecution")
    summary = rt.launcher().tick()
    # It backed off between its calls (through the injected sleep: nothing really waits) ...
    assert seen["throttled"] == THROTTLED_STARTS and stack.naps == [0.25, 0.5, 1.0, 2.0]
    # ... then gave up for this tick: nothing started, so the claim went back with the messages.
    assert summary.stopped == "transient"
    assert stack.running() == []
    assert rt.store().ledger().holders == frozenset()
    assert stack.queue_counts() == (4, 0)  # all returned at once
    after = stack.launcher().tick()
    assert after.n(Outcome.STARTED) == 4 and len(stack.running()) == 4


def test_a_throttled_start_backs_off_and_keeps_its_claim_and_message(session):
    """Throttling slows the fill down; no message goes back to the queue, where each return would
    spend one of its maxReceiveCount receives."""
    stack = build_stack(session, clock=FakeClock())
    for i in range(4):
        stack.send({"id": f"p{i}"}, group=f"p{i}")
    rt = stack.runtime()
    seen = throttle(rt.client("stepfunctions"), "StartExecution", times=3)
    calls = count_calls(rt.client("sqs"))
    summary = rt.launcher().tick()
    assert seen["throttled"] == 3 and stack.naps == [0.25, 0.5, 1.0]
    assert summary.n(Outcome.STARTED) == 4 and summary.n(Outcome.INTERRUPTED) == 0
    assert calls["ChangeMessageVisibilityBatch"] == 0
    assert len(stack.running()) == 4 and stack.queue_counts() == (0, 0)


def test_an_unsure_start_keeps_the_claim_and_the_retry_resolves_it(stack):
    stack.send({"id": "p"})
    rt = stack.runtime()
    sfn = rt.client("stepfunctions")

    def answer_lost(params, **_):
        # Step Functions starts it, but the answer is a 500: the launcher cannot know it started.
        stack.client("stepfunctions").start_execution(**json.loads(params["body"]))
        return error_answer("InternalFailure", 500)

    sfn.meta.events.register("before-call.sfn.StartExecution", answer_lost)
    received = receipts_of(rt.client("sqs"))
    summary = rt.launcher().tick()
    assert summary.stopped == "transient"
    assert len(stack.running()) == 1 and len(rt.store().ledger().holders) == 1  # claim kept: slot counted
    # Away for the consistency window, so that the retry's DescribeExecution can no longer be stale.
    assert stack.queue_counts() == (0, 1) and stack.launcher().tick().n(Outcome.RESUMED) == 0
    stack.visible_again(received)  # the window over (moto's visibility runs in real time)
    retry = stack.launcher().tick()
    assert retry.n(Outcome.RESUMED) == 1
    assert len(stack.executions()) == 1 and stack.queue_counts() == (0, 0)


def test_missing_state_machine_fails_loudly_and_touches_nothing(stack):
    stack.send({"id": "p"})
    stack.client("stepfunctions").delete_state_machine(stateMachineArn=stack.settings.state_machine_arn)
    with pytest.raises(ConfigurationError, match="StateMachineDoesNotExist"):
        stack.launcher().tick()
    assert stack.queue_counts() == (1, 0)
    assert stack.runtime().store().ledger().holders == frozenset()


def test_poison_message_does_not_block_its_group(stack):
    stack.send("\x7fnot json", group="tenant-a")
    stack.send({"id": "after-poison"}, group="tenant-a")
    summary = stack.launcher().tick()
    assert (summary.n(Outcome.INVALID), summary.n(Outcome.STARTED)) == (1, 1)
    ((dead,),) = [stack.dlq_messages()]
    assert dead["Body"] == "\x7fnot json"
    attributes = dead["MessageAttributes"]
    assert attributes["sluice-error"]["StringValue"].startswith("not JSON")
    assert attributes["sluice-receive-count"]["StringValue"] == "1"
    assert "sluice-source-message-id" in attributes
    assert stack.queue_counts() == (0, 0)


def test_invalid_payload_with_a_known_key_records_its_reason(stack):
    stack.send(json.dumps({"id": "k", "blob": "x" * 270_000}), sluice_key="k")
    stack.launcher().tick()
    record = stack.runtime().store().payload("k")
    assert record.state is PayloadState.INVALID and record.reason.startswith("payload is 270,")


def test_the_workflow_receives_the_payload_exactly_as_sent(stack):
    body = '{"id": "exact",  "values": [1.50, 2], "note": "caf\\u00e9"}'
    stack.send(body)
    stack.launcher().tick()
    arn = stack.executions()[0]["executionArn"]
    assert stack.client("stepfunctions").describe_execution(executionArn=arn)["input"] == body


def test_records_never_expire_while_live_and_expire_the_retention_after_the_end(session):
    clock = FakeClock(1_800_000_000)
    stack = build_stack(session, clock=clock, retention_days=7)
    stack.send({"id": "p"})
    stack.launcher().tick()
    store = stack.runtime().store()
    (name,) = stack.running()
    table = stack.client("dynamodb")
    for pk in ("PAYLOAD#p", f"EXEC#{name}"):
        item = table.get_item(TableName=stack.settings.table_name, Key={"pk": {"S": pk}})["Item"]
        assert "expires_at" not in item  # TTL can never delete a live lease or execution
    clock.advance(400 * 86_400)  # runs for more than a year
    stack.finish(name, "SUCCEEDED")
    deliver(stack, status_change_event(stack.settings.state_machine_arn, name, "SUCCEEDED"))
    ended = 1_800_000_000 + 400 * 86_400
    assert store.payload("p").expires_at == ended + 7 * 86_400
    assert (
        store.execution(name).expires_at == ended + 15 * 86_400
    )  # a name that ran: past the queue's 14 days


def test_api_calls_per_start_and_tick_cost_independent_of_backlog(session):
    """Three calls per start (claim, start mark, StartExecution) in a tick that fills 10 slots,
    plus a fixed 14."""

    def measure(backlog: int) -> tuple[float, int]:
        # MAX cached for 5 s, as deployed: the read before each claim costs no call within a tick.
        stack = build_stack(session, name=f"cost-{backlog}", max_concurrency=10, max_cache_seconds=5)
        for i in range(backlog):
            stack.send({"id": f"p{i}"}, group=f"p{i}")
        rt = stack.runtime()
        # The slot pool exists with MAX in force (the first tick of a stack's life, or of a MAX
        # change, moves the caps: 4 calls, once).
        store = rt.store()
        store.set_limit(store.ledger().source(rt.max_source().reading()))
        calls = count_calls(
            rt.client("sqs"), rt.client("dynamodb"), rt.client("stepfunctions"), rt.client("ssm")
        )
        summary = rt.launcher().tick()
        return sum(calls.values()) / summary.n(Outcome.STARTED), sum(calls.values())

    small_per_start, small_total = measure(12)
    _, large_total = measure(60)
    assert small_total == large_total  # same work for 12 or 60 queued
    # Per start: claim (with its start mark, the fence against a block: sluice.launch.per_message), StartExecution. Per tick: DescribeStateMachine, reconciliation (2 ledger
    # reads, ListExecutions of the RUNNING and of the redriven executions, the waiting rooms' three
    # indexes in one read, numbering its count, GetParameter and the count recorded on the caps,
    # save), the read before the receive, the rate limits' book (no rate in force: read once per
    # 5 s, sluice.features.rate_limits), receive, delete (no RUNNING mark).
    assert small_total == 2 * 10 + 14 and small_per_start == 3.4


def test_switching_the_state_machine_with_executions_running_leaks_no_slot(session):
    """The stack is pointed at another state machine while one of the old one's executions runs:
    reconciliation asks about it by the ARN recorded at its claim, and frees its slot when it ends."""
    clock = FakeClock()
    stack = build_stack(session, clock=clock, max_concurrency=1)
    stack.send({"id": "old"})
    stack.launcher().tick()
    (old,) = stack.running()
    new_arn = stack.client("stepfunctions").create_state_machine(
        name="sluice-test-workflow-v2",
        definition=json.dumps({"StartAt": "W", "States": {"W": {"Type": "Pass", "End": True}}}),
        roleArn="arn:aws:iam::123456789012:role/sluice-test-sfn",
    )["stateMachineArn"]
    switched = stack.runtime(state_machine_arn=new_arn)
    stack.send({"id": "new"})
    clock.advance(61)
    assert switched.launcher().tick().n(Outcome.STARTED) == 0  # the old execution still holds MAX 1
    stack.finish(old, "SUCCEEDED")  # its status event matches the old rule only: never delivered
    clock.advance(61)
    summary = switched.launcher().tick()
    assert (summary.released_by_reconcile, summary.n(Outcome.STARTED)) == (1, 1)
    assert switched.store().payload("old").state is PayloadState.SUCCEEDED
    new_runs = stack.client("stepfunctions").list_executions(stateMachineArn=new_arn)["executions"]
    assert [e["name"].split("-")[0] for e in new_runs] == ["new"]


# -- a claim that comes back after the stack was switched to another state machine -------------------
# No RUNNING mark is written after a start, so a returning message of a started claim is told apart
# from an unstarted one by Step Functions, asked by the ARN the claim recorded (found by an
# independent attempt to break the change; each failed before the fix).


def new_machine(stack) -> str:
    return stack.client("stepfunctions").create_state_machine(
        name="sluice-test-workflow-v2",
        definition=json.dumps({"StartAt": "W", "States": {"W": {"Type": "Pass", "End": True}}}),
        roleArn="arn:aws:iam::123456789012:role/sluice-test-sfn",
    )["stateMachineArn"]


def runs_of_key(stack, key: str, *machines: str) -> list[tuple[str, str]]:
    sfn = stack.client("stepfunctions")
    return [
        (machine.rsplit(":", 1)[1], e["name"])
        for machine in machines
        for e in sfn.list_executions(stateMachineArn=machine, statusFilter="RUNNING")["executions"]
        if e["name"].startswith(f"{key}-")
    ]


def start_x_and_fail_its_delete(stack, fault: str) -> list[str]:
    """x starts and its message is not deleted: the launcher dies before the delete (``crash``), or
    the delete is throttled (the tick ends early, "transient"). Returns the receipts, to make it visible again."""
    stack.send({"id": "x"}, group="gx")
    rt = stack.runtime()
    received = receipts_of(rt.client("sqs"))
    if fault == "crash":
        crash_before(rt.client("sqs"), "DeleteMessageBatch")
        with pytest.raises(Crash):
            rt.launcher().tick()
    else:
        refused = throttle(rt.client("sqs"), "DeleteMessageBatch", times=1)
        assert rt.launcher().tick().stopped == "transient"  # the tick ends, it does not fail
        assert refused["throttled"] == 1
    return list(received)


@pytest.mark.parametrize("fault", ["crash", "throttled delete"])
def test_a_started_claim_back_after_a_switch_is_not_started_on_the_new_machine(session, fault):
    """x starts on the old machine and its message is not deleted (the launcher died, or the delete
    was throttled). The stack is switched; x's message comes back: it runs already, on the old
    machine, so it is resumed there, and nothing starts on the new one."""
    clock = FakeClock()
    stack = build_stack(session, clock=clock, max_concurrency=2)
    old_arn = stack.settings.state_machine_arn
    received = start_x_and_fail_its_delete(stack, fault)
    new_arn = new_machine(stack)
    switched = stack.runtime(state_machine_arn=new_arn)
    stack.visible_again(received)
    clock.advance(5)
    summary = switched.launcher().tick()
    assert summary.n(Outcome.RESUMED) == 1 and stack.queue_counts() == (0, 0)
    assert [m for m, _ in runs_of_key(stack, "x", old_arn, new_arn)] == ["sluice-test-workflow"]


@pytest.mark.parametrize("fault", ["crash", "throttled delete"])
def test_a_message_whose_run_ended_before_a_switch_is_not_run_again_on_the_new_machine(session, fault):
    """x starts on the old machine and its message is not deleted; x ends and its event releases it.
    The stack is switched, and x's message comes back. Names are unique per state machine only, so
    StartExecution on the new machine would accept x's name: the claim itself refuses a name that
    ran and ended (``AlreadyRan``), and nothing starts anywhere."""
    clock = FakeClock()
    stack = build_stack(session, clock=clock, max_concurrency=2)
    old_arn = stack.settings.state_machine_arn
    received = start_x_and_fail_its_delete(stack, fault)
    (x,) = stack.running()
    released, _, _ = stack.runtime().launcher().on_status_change(StatusChange.from_event(stack.finish(x)))
    assert released
    new_arn = new_machine(stack)
    switched = stack.runtime(state_machine_arn=new_arn)
    starts = count_calls(switched.client("stepfunctions"))
    stack.visible_again(received)
    clock.advance(5)
    summary = switched.launcher().tick()
    assert summary.n(Outcome.ALREADY_RAN) == 1 and summary.n(Outcome.STARTED) == 0
    assert starts["StartExecution"] == 0 and stack.queue_counts() == (0, 0)
    sfn = stack.client("stepfunctions")
    assert sfn.list_executions(stateMachineArn=new_arn)["executions"] == []
    assert [e["status"] for e in sfn.list_executions(stateMachineArn=old_arn)["executions"]] == ["SUCCEEDED"]
    assert switched.store().execution(x).state is PayloadState.SUCCEEDED  # its record stands


def test_a_re_submission_after_a_switch_asks_about_its_holder_on_the_old_machine(session):
    """x runs on the old machine when the stack is switched, and ends there; its event matches the
    old rule only and is lost. x is sent again: the duplicate check asks Step Functions about the
    holder by the ARN it was claimed on, finds it ended, settles it and starts the re-submission on
    the new machine. Asked on the new machine, it would take the holder as running and drop x."""
    clock = FakeClock()
    stack = build_stack(session, clock=clock, max_concurrency=2)
    stack.send({"id": "x"}, group="g1")
    stack.launcher().tick()
    (old,) = stack.running()
    new_arn = new_machine(stack)
    switched = stack.runtime(state_machine_arn=new_arn)
    stack.finish(old, "SUCCEEDED")
    clock.advance(5)
    stack.send({"id": "x", "v": 2}, group="g2")
    asked: list[str] = []
    switched.client("stepfunctions").meta.events.register(
        "before-call.sfn.DescribeExecution",
        lambda params, **_: asked.append(json.loads(params.get("body") or b"{}").get("executionArn", "")),
    )
    summary = switched.launcher().tick()
    assert asked and all(":execution:sluice-test-workflow:" in arn for arn in asked), asked
    assert summary.n(Outcome.DUPLICATE) == 0 and summary.n(Outcome.STARTED) == 1
    assert [m for m, _ in runs_of_key(stack, "x", new_arn)] == ["sluice-test-workflow-v2"]
    assert switched.store().execution(old).state is PayloadState.SUCCEEDED


def test_an_unstarted_claim_back_after_a_switch_starts_on_the_new_machine_and_records_it(session):
    """x is claimed on the old machine and its launcher dies before the start. The stack is
    switched; x comes back and starts on the new machine, and its record names that execution:
    reconciliation, asking by it, finds its end when the status event is lost. Its success stands:
    a run-once message of x afterwards is already done."""
    clock = FakeClock()
    stack = build_stack(session, clock=clock, max_concurrency=2)
    x_id = stack.send({"id": "x"}, group="gx", sluice_once="true")
    rt = stack.runtime()
    received = receipts_of(rt.client("sqs"))
    crash_before(rt.client("stepfunctions"), "StartExecution")
    with pytest.raises(Crash):
        rt.launcher().tick()
    new_arn = new_machine(stack)
    switched = stack.runtime(state_machine_arn=new_arn)
    stack.visible_again(received)
    clock.advance(5)
    assert switched.launcher().tick().n(Outcome.RESUMED) == 1
    name = execution_name("x", x_id)
    store = switched.store()
    assert store.execution(name).arn.startswith(new_arn.replace(":stateMachine:", ":execution:"))
    stack.finish(name, "SUCCEEDED")  # its status event lost
    for step in (61, 901):
        clock.advance(step)
        switched.launcher().tick()
    assert store.payload("x").state is PayloadState.SUCCEEDED and store.payload("x").succeeded_by == name
    stack.send({"id": "x"}, group="gx2", sluice_once="true")
    assert switched.launcher().tick().n(Outcome.ALREADY_DONE) == 1


def test_a_claim_back_after_a_switch_without_leave_to_describe_the_old_machine_is_dead_lettered(session):
    """Switched without previousStateMachineArn, the role may not describe the old machine's
    executions: whether the claim runs there cannot be known, so it is not started on the new one.
    Its message goes to the DLQ with the reason (what to set), never a crash, never a second run."""
    clock = FakeClock()
    stack = build_stack(session, clock=clock, max_concurrency=2)
    old_arn = stack.settings.state_machine_arn
    stack.send({"id": "x"}, group="gx")
    rt = stack.runtime()
    received = receipts_of(rt.client("sqs"))
    crash_before(rt.client("sqs"), "DeleteMessageBatch")
    with pytest.raises(Crash):
        rt.launcher().tick()
    new_arn = new_machine(stack)
    switched = stack.runtime(state_machine_arn=new_arn)
    old_executions = old_arn.replace(":stateMachine:", ":execution:")
    denied = {"calls": 0}

    def deny_the_old_machine(params, **_):
        asked = json.loads(params.get("body") or b"{}").get("executionArn", "")  # the request as sent
        if asked.startswith(old_executions + ":"):
            denied["calls"] += 1
            return error_answer("AccessDeniedException", 400)
        return None

    switched.client("stepfunctions").meta.events.register(
        "before-call.sfn.DescribeExecution", deny_the_old_machine
    )
    stack.visible_again(received)
    clock.advance(5)
    summary = switched.launcher().tick(reconcile_first=False)
    assert denied["calls"] >= 1 and summary.n(Outcome.INVALID) == 1
    (dead,) = stack.dlq_messages()
    assert "previousStateMachineArn" in dead["MessageAttributes"]["sluice-error"]["StringValue"]
    assert [m for m, _ in runs_of_key(stack, "x", old_arn, new_arn)] == ["sluice-test-workflow"]

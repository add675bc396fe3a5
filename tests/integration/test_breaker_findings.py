"""Breaks of the protocol found by an independent review, on moto with the real adapters and the
real launcher and handlers. Each is strict-xfail: it fails on the code as it is, and flips when fixed."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from moto.core import DEFAULT_ACCOUNT_ID
from moto.stepfunctions.models import stepfunctions_backends

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import PayloadState
from sluice.launch.completion import handle_status_change
from tests.support.aws import REGION, build_stack, new_machine
from tests.support.hooks import Crash, crash_after, error_answer, receipts_of


def deliver(stack, event) -> bool:
    rt = stack.runtime()
    return handle_status_change(
        StatusChange.from_event(event),
        store=rt.store(),
        queue=rt.queue(),
        state_machine_arn=stack.settings.state_machine_arn,
        now=stack.clock.now(),
    )


def redrive(stack, name: str) -> None:
    """An operator's RedriveExecution of an ended run: RUNNING again, same name and ARN (moto has
    no RedriveExecution: the reverse of ``Stack.finish`` on moto's record)."""
    arn = stack.runtime().store().execution(name).arn
    execution = stepfunctions_backends[DEFAULT_ACCOUNT_ID][REGION].describe_execution(arn)
    assert execution.status in ("FAILED", "TIMED_OUT", "ABORTED")
    execution.status, execution.stop_date = "RUNNING", None
    execution.error = execution.cause = None


def crash_before_start(client: Any) -> Counter:
    """The launcher dies between its start mark and StartExecution (the mark is written)."""
    seen: Counter = Counter()

    def hook(**_: Any) -> None:
        seen["crashed"] += 1
        raise Crash("stopped after the start mark, before StartExecution")

    client.meta.events.register("before-call.sfn.StartExecution", hook)
    return seen


def running_of_key(stack, key: str) -> list[str]:
    store = stack.runtime().store()
    return [n for n in stack.running() if (r := store.execution(n)) is not None and r.key == key]


def test_a_crash_after_the_start_mark_then_a_redrive_runs_the_key_twice(session):
    """e1 of key j FAILED and was released. n2 of j is claimed and marked starting; the launcher
    dies before StartExecution. The operator redrives e1. Reconciliation lists e1 running: adopt
    refused (n2 holds j), block(n2) refused (n2's mark). n2's message returns: the resumed claim
    renews (lifting the mark), marks again and starts: e1 and n2 of j run at once."""
    stack = build_stack(session, max_concurrency=5, clock=FakeClock())
    stack.send({"id": "j", "n": 1}, group="a")
    stack.launcher().tick()
    (e1,) = stack.running()
    assert deliver(stack, stack.finish(e1, "FAILED", error="Boom"))

    stack.send({"id": "j", "n": 2}, group="b")
    rt = stack.runtime()
    crashed = crash_before_start(rt.client("stepfunctions"))
    receipts = receipts_of(rt.client("sqs"))
    with pytest.raises(Crash):
        rt.launcher().tick(reconcile_first=False)
    assert crashed["crashed"] == 1
    store = stack.runtime().store()
    (n2,) = [h for h in store.ledger().holders]
    assert store.execution(n2).starting_at is not None and store.execution(n2).state is PayloadState.CLAIMED

    redrive(stack, e1)
    stack.launcher().tick()  # reconciliation: adopt(e1) refused, block(n2) refused by the mark
    assert store.payload("j").redriven == e1 and store.execution(n2).blocked_by is None
    assert running_of_key(stack, "j") == [e1]

    stack.visible_again(receipts)  # n2's message back after its visibility timeout
    stack.launcher().tick()
    assert len(running_of_key(stack, "j")) <= 1, f"two runs of key j at once: {running_of_key(stack, 'j')}"


def stale_once(client: Any, name: str) -> Counter:
    """Step Functions answers about ``name`` as it was just before its end, once each: ListExecutions
    still lists it RUNNING, DescribeExecution still says RUNNING (both within the 60 s bound)."""
    seen: Counter = Counter()

    def listing(parsed: dict[str, Any], **_: Any) -> None:
        if seen["listed"] == 0 and not any(e["name"] == name for e in parsed.get("executions", [])):
            seen["listed"] += 1
            parsed.setdefault("executions", []).append({"name": name, "status": "RUNNING"})

    def describe(parsed: dict[str, Any], **_: Any) -> None:
        if seen["described"] == 0 and parsed.get("name") == name and parsed.get("status") != "RUNNING":
            seen["described"] += 1
            parsed["status"] = "RUNNING"
            for field in ("stopDate", "error", "cause", "output"):
                parsed.pop(field, None)

    client.meta.events.register("after-call.sfn.ListExecutions", listing)
    client.meta.events.register("after-call.sfn.DescribeExecution", describe)
    return seen


def test_an_adoption_on_a_stale_running_answer_leaks_its_slot_for_good(session):
    """p ends FAILED and its event releases it. Within seconds a tick's reconciliation gets the
    stale answers the bound allows: ListExecutions lists p RUNNING, DescribeExecution says RUNNING.
    p is adopted (slot and lease back), its record's end kept as ``earlier_end_at``. Every later
    answer is that same end, which reconciliation takes for a stale one ("it runs; asked again
    later"): p holds a slot and its key for good, though nothing runs."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=2, clock=clock)
    stack.send({"id": "p"}, group="a")
    stack.launcher().tick()
    (p,) = stack.running()
    assert deliver(stack, stack.finish(p, "FAILED", error="Boom"))
    store = stack.runtime().store()
    assert store.ledger().holders == frozenset()

    rt = stack.runtime()
    stale = stale_once(rt.client("stepfunctions"), p)
    rt.launcher().tick()
    assert stale == Counter(listed=1, described=1)
    assert store.ledger().holders == {p}  # adopted on the stale answer

    for _ in range(20):  # twenty minutes of ticks, every answer fresh: p FAILED, nothing runs
        clock.advance(61)
        stack.launcher().tick()
    assert stack.running() == []
    stack.send({"id": "q1"}, group="q1")
    stack.send({"id": "q2"}, group="q2")
    stack.launcher().tick()
    assert len(stack.running()) == 2, f"MAX 2, nothing else runs, yet only {stack.running()} started"
    assert store.ledger().holders == set(stack.running())


def test_a_vanished_run_once_success_lets_the_key_run_once_more(session):
    """A once-message of k starts e1 on machine M1. The stack switches to M2 (the documented upgrade
    path); a tick marks e1 RUNNING by its ARN. e1 SUCCEEDED, its status event lost; the operator
    deletes M1. Reconciliation: e1 does not exist, so it is released with an unknown outcome, and
    no ``succeeded_by`` is written. A new once-message of k then claims and starts: k, run-once,
    runs successfully twice."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=2, clock=clock)
    stack.send({"id": "k"}, group="a", sluice_once="true")
    stack.launcher().tick()
    (e1,) = stack.running()
    m2 = new_machine(stack)
    m1 = stack.settings.state_machine_arn
    stack.settings = replace(stack.settings, state_machine_arn=m2)
    clock.advance(61)
    stack.launcher().tick()
    store = stack.runtime().store()
    assert store.execution(e1).once
    assert store.execution(e1).state is PayloadState.RUNNING  # asked by its ARN on M1: running

    stack.finish(e1, "SUCCEEDED", output="{}")  # its status event is lost
    stack.client("stepfunctions").delete_state_machine(stateMachineArn=m1)
    clock.advance(61)
    stack.launcher().tick()
    assert store.ledger().holders == frozenset()

    stack.send({"id": "k"}, group="b", sluice_once="true")
    stack.launcher().tick()
    assert stack.running() == [], "a run-once key whose run SUCCEEDED started again"


def test_a_stale_running_answer_marks_a_key_redriven_and_holds_its_messages_back_for_good(session):
    """e1 of k FAILED and its event released it. n2 of k is claimed and started. Within seconds a
    reconciliation gets the stale answers the bound allows for e1 (listed RUNNING, described
    RUNNING): adoption is refused (n2 holds k), so k is marked redriven by e1. n2 ends and is
    released. A new message n3 of k: the claim finds the mark, DescribeExecution(e1) says FAILED at
    the stop date e1's record holds, taken for a stale answer ("it runs"): e1 is adopted and n3 is
    its duplicate. e1 never runs again, and n3 never starts, however long the ticks go on."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=3, clock=clock)
    stack.send({"id": "k", "n": 1}, group="a")
    stack.launcher().tick()
    (e1,) = stack.running()
    assert deliver(stack, stack.finish(e1, "FAILED", error="Boom"))
    stack.send({"id": "k", "n": 2}, group="b")
    stack.launcher().tick(reconcile_first=False)
    (n2,) = stack.running()
    store = stack.runtime().store()
    assert n2 != e1 and store.payload("k").holder == n2
    rt = stack.runtime()
    stale = stale_once(rt.client("stepfunctions"), e1)
    rt.launcher().tick()  # adopt(e1) refused: n2 holds k; k marked redriven by e1
    assert stale == Counter(listed=1, described=1)
    assert store.payload("k").redriven == e1
    assert deliver(stack, stack.finish(n2, "SUCCEEDED"))

    stack.send({"id": "k", "n": 3}, group="c")
    for _ in range(20):  # twenty minutes of ticks, every answer fresh
        clock.advance(61)
        stack.launcher().tick()
    started = {json.dumps(i, sort_keys=True) for i in stack.inputs()}
    assert json.dumps({"id": "k", "n": 3}, sort_keys=True) in started, (
        f"n3 of k never started; k held by {store.payload('k').holder} (e1 is {e1}), queue {stack.queue_counts()}"
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("Sluice-Concurrency-Key", {"DataType": "String", "StringValue": "c"}),
        ("SLUICE-CONCURRENCY-KEY", {"DataType": "String", "StringValue": "c"}),
        ("sluice_concurrency_key", {"DataType": "String", "StringValue": "c"}),
        ("sluice-concurrency-key", {"DataType": "Binary", "BinaryValue": b"c"}),
    ],
    ids=["title-case", "upper-case", "underscores", "binary"],
)
def test_a_misspelt_concurrency_key_is_refused_not_run_uncapped(session, name, value):
    """The catalogue refuses an unknown ``sluice-*`` name so that a misspelt concurrency key does not
    run uncapped. SQS names are case-sensitive: a name spelt another way (its case, an underscore)
    is Sluice's all the same, and refused; so is a Binary one, which the queue adapter carries by
    name and type for the catalogue to see. Were either read as the producer's own, both payloads of
    key c would run at once under a cap of 1, and nothing would say why."""
    stack = build_stack(session, max_concurrency=5, clock=FakeClock())
    sqs = stack.client("sqs")
    for i in range(2):
        sqs.send_message(
            QueueUrl=stack.settings.queue_url,
            MessageBody=json.dumps({"id": f"p{i}"}),
            MessageGroupId=f"g{i}",
            MessageDeduplicationId=f"d{i}",
            MessageAttributes={name: value},
        )
    stack.launcher().tick()
    dead = stack.dlq_messages()
    assert len(stack.running()) <= 1 or len(dead) == 2, (
        f"{name}: {len(stack.running())} of concurrency key c run under a cap of 1; dead-lettered {len(dead)}"
    )


def test_a_resumed_claim_on_a_deleted_machine_starts_its_payload_again(session):
    """The launcher starts N (payload p) on M1 and dies before deleting its message. The stack
    switches to M2 (its completion ignores M1's events); N SUCCEEDED; the operator deletes M1 (its
    executions have ended). The message returns: the resume asks about N by its ARN on M1;
    DescribeExecution answers ExecutionDoesNotExist (moto; AWS may say StateMachineDoesNotExist,
    which ``describe`` now reads the same way for a machine the stack no longer uses), taken for
    "never started": the claim is renewed onto M2 and N starts again: p ran twice from one message."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=2, clock=clock)
    stack.send({"id": "p"}, group="a")
    rt = stack.runtime()
    crashed = crash_after(rt.client("stepfunctions"), "StartExecution")
    receipts = receipts_of(rt.client("sqs"))
    with pytest.raises(Crash):
        rt.launcher().tick()
    assert crashed["calls"] == 1
    (n,) = stack.running()
    m1 = stack.settings.state_machine_arn
    m2 = new_machine(stack)
    stack.finish(n, "SUCCEEDED")  # its event is M1's: the switched stack's completion ignores it
    stack.settings = replace(stack.settings, state_machine_arn=m2)
    stack.client("stepfunctions").delete_state_machine(stateMachineArn=m1)

    stack.visible_again(receipts)
    stack.launcher().tick()
    assert stack.executions() == [], f"p started again on M2: {[e['name'] for e in stack.executions()]}"


def test_two_redriven_runs_of_a_held_key_leave_one_unmarked_and_a_refill_starts_beside_it(session):
    """e1 and e2 of k FAILED and were released; n3 of k runs. The operator redrives e1 and e2. A
    reconciliation is refused both adoptions (n3 holds k) and marks k redriven by e1, then by e2
    (with one attribute, e1's mark was gone). n3 ends; n4 of k finds a mark and adopts its run (its
    duplicate). That run ends: its completion releases it and refills the freed slot with n5 of k,
    which must find the other run's mark (adopt it; n5 its duplicate), not a free, unmarked lease
    to start beside the other run, which Sluice saw running."""
    from sluice.core.events import StatusChange

    clock = FakeClock()
    stack = build_stack(session, max_concurrency=5, clock=clock)
    ended = []
    for n in (1, 2):
        stack.send({"id": "k", "n": n}, group=f"g{n}")
        stack.launcher().tick()
        (e,) = stack.running()
        assert deliver(stack, stack.finish(e, "FAILED", error="Boom"))
        ended.append(e)
    e1, e2 = sorted(ended)  # reconciliation goes through unknown runs in name order
    stack.send({"id": "k", "n": 3}, group="g3")
    stack.launcher().tick()
    (n3,) = stack.running()
    redrive(stack, e1)
    redrive(stack, e2)
    stack.launcher().tick()  # both adoptions refused: n3 holds k
    store = stack.runtime().store()
    assert store.payload("k").holder == n3
    assert deliver(stack, stack.finish(n3, "SUCCEEDED"))

    stack.send({"id": "k", "n": 4}, group="g4")
    stack.launcher().tick(reconcile_first=False)  # n4: a mark → its run adopted; n4 its duplicate
    adopted = store.payload("k").holder
    assert adopted in (e1, e2)
    (other,) = {e1, e2} - {adopted}
    stack.send({"id": "k", "n": 5}, group="g5")
    stack.launcher().on_status_change(StatusChange.from_event(stack.finish(adopted, "SUCCEEDED")))
    assert running_of_key(stack, "k") == [other], f"runs of k at once: {running_of_key(stack, 'k')}"
    assert store.payload("k").holder == other  # n5 found the other mark: adopted, n5 its duplicate


def test_an_unsure_start_after_the_mark_then_a_redrive_runs_the_key_twice(session):
    """As above without a crash: n2's StartExecution answers 500 and did not start it (an unsure
    start: claim and mark kept, the message returned). e1 of j is redriven; the next tick's
    reconciliation is refused the adoption and the block (the mark), then its admission resumes n2:
    renewal (the mark lifted), mark, StartExecution: e1 and n2 of j run at once."""
    stack = build_stack(session, max_concurrency=5, clock=FakeClock())
    stack.send({"id": "j", "n": 1}, group="a")
    stack.launcher().tick()
    (e1,) = stack.running()
    assert deliver(stack, stack.finish(e1, "FAILED", error="Boom"))

    stack.send({"id": "j", "n": 2}, group="b")
    rt = stack.runtime()
    seen: Counter = Counter()

    def unsure(**_: Any) -> Any:
        if seen["answered"]:
            return None
        seen["answered"] += 1
        return error_answer("InternalFailure", 500)

    rt.client("stepfunctions").meta.events.register("before-call.sfn.StartExecution", unsure)
    received = receipts_of(rt.client("sqs"))
    assert rt.launcher().tick(reconcile_first=False).stopped == "transient"
    assert seen["answered"] == 1 and stack.running() == []
    store = stack.runtime().store()
    (n2,) = store.ledger().holders
    assert store.execution(n2).starting_at is not None

    redrive(stack, e1)
    stack.clock.advance(61)  # n2's message is away for the consistency window
    stack.visible_again(received)
    stack.launcher().tick()  # reconciliation: adopt(e1) refused, block(n2) refused; then n2 resumed
    assert len(running_of_key(stack, "j")) <= 1, f"two runs of key j at once: {running_of_key(stack, 'j')}"
    # n2's resume yields to the key's redriven mark: n2 rolled back, e1 adopted (the mark lifted).
    assert store.payload("j").holder == e1 and store.payload("j").redriven is None

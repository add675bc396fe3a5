"""Attacks on reconciliation's adoption of a run listed RUNNING whose record ended and was released,
when DescribeExecution disagrees (``sluice.launch.redriven.ran_again``, explorer seed 818180473):
past the consistency window of the record's end (Step Functions' stop date, by the reconciler's
clock) the run is adopted whatever DescribeExecution says; within it, nothing is adopted and the
key is marked for the run (``Rerun.UNSURE``): its claims adopt the run instead, for the window.

On moto with the real adapters, launcher and completion path. Stale answers are botocore hooks on
the deciding container's client, each counted and asserted to have fired. moto's stop dates come
from the wall clock, so every clock here starts at ``time.time()``. A scenario that breaks a
promise is a strict xfail naming the break."""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import PayloadState
from sluice.runtime import Runtime
from tests.integration.test_breaker_findings import redrive, running_of_key
from tests.support.aws import NO_RETRY, Stack, build_stack, status_change_event

WINDOW = 60  # settings.consistency_window_seconds in build_stack


# -- helpers -------------------------------------------------------------------------------------------


def runtime_at(stack: Stack, clock: FakeClock) -> Runtime:
    """A container of the stack whose clock is ``clock`` (another launcher, another time)."""
    return Runtime(
        stack.settings, session=stack.session, clock=clock, client_config=NO_RETRY, sleep=clock.sleep
    )


def run_and_end(stack: Stack, key: str, status: str = "ABORTED", *, group: str = "a") -> str:
    """One run of ``key`` started, ended with ``status``, its event delivered: released."""
    stack.send({"id": key, "n": 1}, group=group)
    stack.launcher().tick()
    (name,) = running_of_key(stack, key)
    event = stack.finish(name, status, error=None if status == "SUCCEEDED" else "Boom")
    released, _, _ = stack.launcher().on_status_change(StatusChange.from_event(event))
    assert released
    record = stack.runtime().store().execution(name)
    assert record.state is PayloadState(status) and not record.state.holds_lease
    assert record.ended_at is not None
    return name


def stale_describe(client: Any, name: str, **answer: Any) -> Counter:
    """DescribeExecution of ``name`` answered from an older view: the fields of ``answer`` replace
    moto's (``stopDate`` as epoch seconds); ``redriveCount=None`` removes it."""
    fired: Counter = Counter()

    def hook(parsed: dict[str, Any], **_: Any) -> None:
        if parsed.get("name") != name:
            return
        fired["describe"] += 1
        for field, value in answer.items():
            if value is None:
                parsed.pop(field, None)
            elif field == "stopDate":
                parsed[field] = datetime.fromtimestamp(value, UTC)
            else:
                parsed[field] = value

    client.meta.events.register("after-call.sfn.DescribeExecution", hook)
    return fired


def ended_at(stack: Stack, name: str) -> dict[str, Any]:
    """The answer DescribeExecution gave for ``name``'s end, before its redrive."""
    record = stack.runtime().store().execution(name)
    return {
        "status": record.state.value,
        "stopDate": record.ended_at,
        "error": "Boom",
        "cause": "Boom cause",
    }


def stale_listing(client: Any, name: str, arn: str) -> Counter:
    """ListExecutions(RUNNING) still shows ``name``, which has ended (a listing behind its end)."""
    fired: Counter = Counter()

    def before(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        raw = params.get("body", b"")
        request = json.loads(raw.decode() if isinstance(raw, bytes) else raw or "{}")
        context["status_filter"] = request.get("statusFilter")

    def after(parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        if context.get("status_filter") != "RUNNING":
            return
        if any(e["name"] == name for e in parsed.get("executions", [])):
            return
        fired["listing"] += 1
        machine = arn.replace(":execution:", ":stateMachine:").rsplit(":", 1)[0]
        parsed.setdefault("executions", []).append(
            {
                "executionArn": arn,
                "stateMachineArn": machine,
                "name": name,
                "status": "RUNNING",
                "startDate": datetime.now(UTC),
            }
        )

    client.meta.events.register("before-call.sfn.ListExecutions", before)
    client.meta.events.register("after-call.sfn.ListExecutions", after)
    return fired


def deliver(stack: Stack, rt: Runtime, event: dict[str, Any]) -> bool:
    """The completion function, on container ``rt``."""
    released, _, _ = rt.launcher().on_status_change(StatusChange.from_event(event))
    return released


def settle_everything(stack: Stack, clock: FakeClock, *, rounds: int = 8) -> None:
    """Every run ends (its event lost), and reconciliation runs past the window several times."""
    for _ in range(rounds):
        for name in stack.running():
            stack.finish(name, "SUCCEEDED")
        clock.advance(WINDOW + 1)
        stack.launcher().tick()


def assert_nothing_leaks(stack: Stack, clock: FakeClock, max_concurrency: int) -> None:
    """Promise 4: once all ended and reconciliation ran, all MAX slots are usable."""
    settle_everything(stack, clock)
    store = stack.runtime().store()
    assert store.ledger().holders == frozenset(), f"slots leaked: {sorted(store.ledger().holders)}"
    for i in range(max_concurrency):
        stack.send({"id": f"fresh-{i}"}, group=f"fresh-{i}")
    stack.launcher().tick()
    fresh = [n for n in stack.running() if store.execution(n).key.startswith("fresh-")]
    assert len(fresh) == max_concurrency, f"only {len(fresh)} of {max_concurrency} slots usable"


def started_keys(stack: Stack) -> list[str]:
    store = stack.runtime().store()
    return [store.execution(e["name"]).key for e in stack.executions()]


# -- the scenarios -------------------------------------------------------------------------------------


def test_a_redrive_hidden_past_the_window_is_adopted_and_the_key_next_message_waits_then_runs(session):
    """e1 of k ABORTED at s, released. 70 s later the operator redrives e1; DescribeExecution
    (stale) still says ABORTED at s. The reconciliation adopts e1 (its end is the window old);
    k's next message, claimed in the same tick, is parked behind e1, not started. A late repeat of
    e1's ABORTED event (stop date s) releases nothing. e1's new end arrives as an event while
    DescribeExecution is stale the other way (RUNNING): nothing released; reconciliation releases
    e1 later, k's message is woken and runs; nothing leaks."""
    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=2, clock=clock)
    e1 = run_and_end(stack, "k")
    earlier = ended_at(stack, e1)
    first_event = stack.runtime().store().execution(e1)
    clock.advance(WINDOW + 10)
    redrive(stack, e1)

    rt = stack.runtime()
    fired = stale_describe(rt.client("stepfunctions"), e1, **earlier, redriveCount=None)
    stack.send({"id": "k", "n": 2}, group="b")
    rt.launcher().tick()
    assert fired["describe"] >= 2  # reconciliation's question, then the duplicate check's
    store = stack.runtime().store()
    assert store.execution(e1).state is PayloadState.RUNNING and store.execution(e1).adopted_at == clock.now()
    assert store.payload("k").holder == e1
    assert running_of_key(stack, "k") == [e1], "k runs twice"
    assert e1 in store.ledger().holders
    assert store.execution(e1).parked, "k's next message was not parked behind e1"

    # A late repeat of e1's first end (stop date s), with DescribeExecution still stale: ignored.
    rt2 = stack.runtime()
    fired2 = stale_describe(rt2.client("stepfunctions"), e1, **earlier, redriveCount=None)
    late = status_change_event(
        stack.settings.state_machine_arn,
        e1,
        "ABORTED",
        error="Boom",
        stop=datetime.fromtimestamp(first_event.ended_at, UTC),
    )
    assert not deliver(stack, rt2, late)
    assert store.execution(e1).state is PayloadState.RUNNING and store.payload("k").holder == e1
    assert fired2["describe"] == 0  # an earlier end's event is refused without asking

    # e1 ends (FAILED); its event arrives while DescribeExecution still says RUNNING (stale).
    clock.advance(5)
    event = stack.finish(e1, "FAILED", error="Again")
    rt3 = stack.runtime()
    fired3 = stale_describe(rt3.client("stepfunctions"), e1, status="RUNNING", stopDate=None, redriveCount=1)
    assert not deliver(stack, rt3, event)
    assert fired3["describe"] == 0  # within the adoption's window: refused without asking
    assert store.execution(e1).state is PayloadState.RUNNING  # held still: the event was not believed

    # Reconciliation past the adoption's window releases e1 on its new end; k's message runs.
    for _ in range(3):
        clock.advance(WINDOW + 1)
        stack.launcher().tick()
        if running_of_key(stack, "k"):
            break
    assert store.execution(e1).state is PayloadState.FAILED
    (n2,) = running_of_key(stack, "k")
    assert n2 != e1 and store.execution(n2).key == "k"
    assert stack.dlq_messages() == []
    assert_nothing_leaks(stack, clock, 2)


def test_a_reconciler_clock_behind_step_functions_holds_the_key_for_the_redrive(session):
    """e1 of k ABORTED at s (Step Functions' stop date), released. At s + 70 (real time) the operator
    redrives e1. A launcher whose clock reads 30 s behind (s + 40) ticks: the listing shows e1
    RUNNING, DescribeExecution (stale, within S of the redrive) says ABORTED at s. By its clock the
    end is 40 s old, within the window: not adopted. Its admission then claims k's next message
    (the lease is free) and starts it: e1 and n2 of k run at once. Now the key is marked for e1:
    n2's claim adopts e1 instead (strict xfail until the mark on a free key)."""
    wall = time.time()
    clock = FakeClock(wall)
    stack = build_stack(session, max_concurrency=3, clock=clock)
    e1 = run_and_end(stack, "k")
    earlier = ended_at(stack, e1)
    redrive(stack, e1)  # real time: s + 70

    behind = FakeClock(wall + WINDOW + 10 - 30)  # this container's clock: 30 s behind
    rt = runtime_at(stack, behind)
    fired = stale_describe(rt.client("stepfunctions"), e1, **earlier, redriveCount=None)
    stack.send({"id": "k", "n": 2}, group="b")
    rt.launcher().tick()
    assert fired["describe"] >= 1
    assert e1 in stack.running()

    # Later reconciliations, by correct clocks and fresh answers, cannot undo a start.
    clock.advance(2 * WINDOW)
    stack.launcher().tick()
    assert len(running_of_key(stack, "k")) <= 1, f"k runs twice: {running_of_key(stack, 'k')}"


def test_a_redrive_within_the_window_of_the_end_holds_the_key_for_it(session):
    """e1 of k ABORTED at s, released; the operator redrives it at s + 20. A tick at s + 25: the
    listing shows e1, DescribeExecution (stale) ABORTED at s: within the window, not adopted. Its
    admission claimed k's next message and started it beside e1 (strict xfail until the mark on a
    free key); now the key is marked for e1, and the claim adopts e1 instead."""
    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=3, clock=clock)
    e1 = run_and_end(stack, "k")
    earlier = ended_at(stack, e1)
    clock.advance(20)
    redrive(stack, e1)
    clock.advance(5)

    rt = stack.runtime()
    fired = stale_describe(rt.client("stepfunctions"), e1, **earlier, redriveCount=None)
    stack.send({"id": "k", "n": 2}, group="b")
    rt.launcher().tick()
    assert fired["describe"] >= 1
    assert e1 in stack.running()
    clock.advance(WINDOW + 1)
    stack.launcher().tick()
    assert len(running_of_key(stack, "k")) <= 1, f"k runs twice: {running_of_key(stack, 'k')}"


def test_a_clock_ahead_adopts_an_ended_run_then_slot_lease_and_the_key_message_come_back(session):
    """MAX 1. e1 of k ABORTED at s, released. A launcher whose clock runs 120 s ahead ticks at s + 1
    with a listing still behind the end (e1 RUNNING) and a fresh DescribeExecution (ABORTED at s):
    by its clock the end is the window old, so it adopts e1, which ended (as documented). k's next
    message, and j's, arrive. Launchers with correct clocks tick from then on, the time advanced
    past the window several times: the adoption, written 120 s in their future, is judged once
    their clocks pass it by the window; e1 is released on its end (never run again), k's message
    and j's (left in the queue while e1 holds the only slot) start, one at a time, nothing is lost and nothing
    leaks (promises 3 and 4)."""
    wall = time.time()
    clock = FakeClock(wall + 1)
    stack = build_stack(session, max_concurrency=1, clock=clock)
    e1 = run_and_end(stack, "k")
    ahead = FakeClock(wall + 1 + 120)
    rt = runtime_at(stack, ahead)
    record = stack.runtime().store().execution(e1)
    fired = stale_listing(rt.client("stepfunctions"), e1, record.arn)
    stack.send({"id": "k", "n": 2}, group="b")
    stack.send({"id": "j"}, group="c")
    rt.launcher().tick()
    assert fired["listing"] >= 1
    store = stack.runtime().store()
    assert store.execution(e1).adopted_at == ahead.now(), "not adopted: the attack's premise failed"
    assert store.payload("k").holder == e1
    assert stack.queue_counts() == (2, 0)  # full: k's and j's messages wait in the queue
    assert stack.running() == [], "nothing may start: e1 holds the only slot"

    ticks = 0
    while len(stack.executions()) < 3 and ticks < 8:
        clock.advance(WINDOW + 1)
        stack.launcher().tick()
        for name in stack.running():
            stack.finish(name, "SUCCEEDED")  # events lost: reconciliation releases them
        ticks += 1
    assert sorted(started_keys(stack)) == ["j", "k", "k"], f"lost: started {started_keys(stack)}"
    assert store.execution(e1).state is PayloadState.ABORTED
    assert stack.dlq_messages() == []
    assert_nothing_leaks(stack, clock, 1)


@pytest.mark.parametrize("redrive_count", [0, None], ids=["redriveCount-0", "redriveCount-absent"])
def test_a_succeeded_record_is_never_held_for_a_stale_running_answer(session, redrive_count):
    """e1 of k SUCCEEDED at s, released. A launcher whose clock runs 300 s ahead ticks with the
    listing behind the end (e1 RUNNING) and DescribeExecution behind too (RUNNING). A success is
    never redriven: k's next message starts in that same tick (with ``redriveCount`` absent e1 may
    be adopted, but the duplicate check's fresh answer then releases it), and nothing leaks."""
    wall = time.time()
    clock = FakeClock(wall + 1)
    stack = build_stack(session, max_concurrency=2, clock=clock)
    e1 = run_and_end(stack, "k", "SUCCEEDED")
    ahead = FakeClock(wall + 301)
    rt = runtime_at(stack, ahead)
    arn = stack.runtime().store().execution(e1).arn
    listed = stale_listing(rt.client("stepfunctions"), e1, arn)
    counted: Counter = Counter()

    def once_stale(parsed: dict[str, Any], **_: Any) -> None:
        # Only reconciliation's question is stale: the duplicate check's comes later.
        if parsed.get("name") == e1 and counted["describe"] == 0:
            counted["describe"] += 1
            parsed.update(status="RUNNING")
            parsed.pop("stopDate", None)
            parsed.pop("output", None)
            if redrive_count is None:
                parsed.pop("redriveCount", None)
            else:
                parsed["redriveCount"] = redrive_count

    rt.client("stepfunctions").meta.events.register("after-call.sfn.DescribeExecution", once_stale)
    stack.send({"id": "k", "n": 2}, group="b")
    rt.launcher().tick()
    assert listed["listing"] >= 1 and counted["describe"] == 1
    keyed = running_of_key(stack, "k")
    assert len(keyed) == 1 and keyed[0] != e1, f"k's next message did not start: {keyed}"
    store = stack.runtime().store()
    assert store.execution(e1).state is PayloadState.SUCCEEDED
    assert store.payload("k").holder == keyed[0]
    assert_nothing_leaks(stack, clock, 2)


def test_two_reconcilers_racing_over_one_redriven_run_leave_no_leak_and_no_second_run(session):
    """MAX 2. e1 of k ABORTED at s, released; redriven at s + 70; both reconcilers' DescribeExecution
    stale (ABORTED at s). Reconciler B reads e1 as unknown; between its DescribeExecution and its
    adoption, reconciler A runs a whole tick: it adopts e1, parks k's next message behind it and
    starts j. B's adoption is then refused (e1 holds k itself), so B counts e1 as external beside
    its slot: its caps admit one run fewer (limit 1 with 2 running), never more. k's next message
    never starts beside e1; the next reconciliation recounts (limit 2 again); k's message runs once
    e1 ends; once all end, nothing leaks."""
    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=2, clock=clock)
    e1 = run_and_end(stack, "k")
    earlier = ended_at(stack, e1)
    clock.advance(WINDOW + 10)
    redrive(stack, e1)

    rt_a, rt_b = stack.runtime(), stack.runtime()
    fired_a = stale_describe(rt_a.client("stepfunctions"), e1, **earlier, redriveCount=None)
    fired_b = stale_describe(rt_b.client("stepfunctions"), e1, **earlier, redriveCount=None)
    raced: Counter = Counter()

    def a_runs_first(parsed: dict[str, Any], **_: Any) -> None:
        if parsed.get("name") == e1 and raced["a"] == 0:
            raced["a"] += 1
            rt_a.launcher().tick()

    rt_b.client("stepfunctions").meta.events.register("after-call.sfn.DescribeExecution", a_runs_first)
    stack.send({"id": "k", "n": 2}, group="b")
    stack.send({"id": "j"}, group="c")
    report_b = rt_b.launcher().tick()
    assert raced["a"] == 1 and fired_a["describe"] >= 1 and fired_b["describe"] >= 1
    store = stack.runtime().store()
    assert store.payload("k").holder == e1
    assert running_of_key(stack, "k") == [e1], "k runs twice"
    assert sorted(started_keys(stack)) == ["j", "k"]
    assert report_b.limit == 1 and report_b.running_after == 2  # e1 counted twice by B: fewer, not more

    clock.advance(WINDOW + 1)
    after = stack.launcher().tick()  # fresh answers: e1 runs and is held, no longer external
    assert after.limit == 2
    assert running_of_key(stack, "k") == [e1]
    stack.finish(e1, "FAILED", error="Again")  # its event lost
    for _ in range(3):
        clock.advance(WINDOW + 1)
        stack.launcher().tick()
    assert len(running_of_key(stack, "k")) == 1 and running_of_key(stack, "k") != [e1]
    assert_nothing_leaks(stack, clock, 2)
    assert sorted(started_keys(stack)).count("k") == 2  # e1, then k's next message after it


@pytest.mark.parametrize("new_end", ["FAILED", "SUCCEEDED"])
def test_the_redriven_run_ends_and_its_event_lands_before_a_stale_reconciliation(session, new_end):
    """e1 of k ABORTED at s, released; redriven at s + 70; it ends again (``new_end``) at s + 72 and
    its event is delivered at once, while e1 holds nothing (nothing released; a success is written
    as a redriven run's). A reconciliation at s + 75 gets a listing behind that end (e1 RUNNING) and
    a DescribeExecution behind the redrive (ABORTED at s). A FAILED e1 is adopted though it ended
    (the record still holds s); a SUCCEEDED one is not. k's next message is not lost either way:
    it starts once e1 is released (at once for the success), and nothing leaks."""
    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=2, clock=clock)
    e1 = run_and_end(stack, "k")
    earlier = ended_at(stack, e1)
    clock.advance(WINDOW + 10)
    redrive(stack, e1)
    clock.advance(2)
    event = stack.finish(e1, new_end, error="Again" if new_end == "FAILED" else None, output="{}")
    assert not deliver(stack, stack.runtime(), event)
    store = stack.runtime().store()
    clock.advance(3)

    rt = stack.runtime()
    arn = store.execution(e1).arn
    listed = stale_listing(rt.client("stepfunctions"), e1, arn)
    fired = stale_describe(rt.client("stepfunctions"), e1, **earlier, redriveCount=None)
    stack.send({"id": "k", "n": 2}, group="b")
    rt.launcher().tick()
    assert listed["listing"] >= 1 and fired["describe"] >= 1
    if new_end == "SUCCEEDED":
        assert store.execution(e1).state is PayloadState.SUCCEEDED
        assert len(running_of_key(stack, "k")) == 1
    else:
        assert store.payload("k").holder == e1  # adopted, though it ended at s + 72
        assert running_of_key(stack, "k") == []

    for _ in range(4):
        if running_of_key(stack, "k"):
            break
        clock.advance(WINDOW + 1)
        stack.launcher().tick()
    (n2,) = running_of_key(stack, "k")
    assert n2 != e1
    assert store.execution(e1).state is PayloadState(new_end)
    assert stack.dlq_messages() == []
    assert_nothing_leaks(stack, clock, 2)

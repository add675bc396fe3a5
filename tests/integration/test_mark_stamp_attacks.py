"""Attacks on 9f944cc (a key's redriven mark judged old only by the clock that stamped it) by a
reviewer who had not seen its tests, on moto with the real adapters. Stale answers and listings
come only from botocore hooks; every fault asserts it fired.

Four broke promise 2 with that commit and held before it: the stamp stayed at the mark's first
sighting while reconciliation saw the marked run redriven again (it wrote nothing: the key named
the run already), so the stamping clock judged the mark old seconds after a redrive and believed
a stale end. Before, any later write of the record (the holder's release) had moved
``updated_at`` and kept the mark young by chance. Two more broke before it too: a resume's yield
judging the same old stamp, and a claim lifting a mark on a fresh end while a reconciler saw the
run redriven again between that answer and the lift. Now every sighting moves the stamp (by the
same clock) or removes it (another clock's, or a further mark), a lift is conditioned on the stamp
it judged, and an adoption removes the stamp with the mark. The liveness attacks (marks no live
clock can judge; promise 4) held as written."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from typing import Any

import pytest

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import PayloadState
from sluice.runtime import Runtime
from tests.integration.test_breaker_findings import crash_before_start, redrive, running_of_key
from tests.integration.test_redrive_adoption_attacks import stale_listing
from tests.support.aws import NO_RETRY, build_stack
from tests.support.hooks import Crash, error_answer, receipts_of

WINDOW = 60


def run_and_end(stack, key, status="FAILED", group="a"):
    stack.send({"id": key, "n": 1}, group=group)
    stack.launcher().tick()
    (name,) = running_of_key(stack, key)
    event = stack.finish(name, status, error="Boom")
    released, _, _ = stack.launcher().on_status_change(StatusChange.from_event(event))
    assert released
    return name


def describe_answer(stack, name) -> dict[str, Any]:
    sfn = stack.client("stepfunctions")
    arn = stack.runtime().store().execution(name).arn
    return sfn.describe_execution(executionArn=arn)


def stale_describe(client, name, answer: dict[str, Any]) -> Counter:
    fired: Counter = Counter()

    def hook(parsed: dict[str, Any], **_: Any) -> None:
        if parsed.get("name") != name:
            return
        fired["describe"] += 1
        for field in ("status", "stopDate", "error", "cause"):
            if field in answer:
                parsed[field] = answer[field]
            else:
                parsed.pop(field, None)
        parsed.pop("redriveCount", None)
        parsed.pop("redriveDate", None)

    client.meta.events.register("after-call.sfn.DescribeExecution", hook)
    return fired


def holder_ends(stack, name: str) -> None:
    """``name``, the key's holder, SUCCEEDS and its event releases it."""
    event = stack.finish(name, "SUCCEEDED")
    released, _, _ = stack.launcher().on_status_change(StatusChange.from_event(event))
    assert released


def key_runs_once(stack, e1: str) -> None:
    assert e1 in stack.running()
    assert len(running_of_key(stack, "k")) <= 1, f"two runs of key k at once: {running_of_key(stack, 'k')}"


def _setup_second_redrive(session):
    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=3, clock=clock)
    e1 = run_and_end(stack, "k")
    # n2 of k claims and runs
    stack.send({"id": "k", "n": 2}, group="b")
    stack.launcher().tick()
    (n2,) = running_of_key(stack, "k")
    assert n2 != e1
    store = stack.runtime().store()

    # operator redrives e1 (first), 2 windows after its end; reconciliation marks k (n2 holds)
    clock.advance(2 * WINDOW + 5)
    redrive(stack, e1)
    stack.launcher().tick()
    p = store.payload("k")
    assert p.redriven == e1 and p.holder == n2, p
    stamp = p.redriven_at
    assert stamp == clock.now()

    # e1 fails again (its event lost or ignored: e1 holds nothing)
    time.sleep(0.01)
    stack.finish(e1, "FAILED", error="Again")
    second_end = describe_answer(stack, e1)
    assert second_end["status"] == "FAILED"

    # ten minutes later the operator redrives e1 again; a reconciliation sees it RUNNING again
    clock.advance(600)
    redrive(stack, e1)
    stack.launcher().tick()
    p = store.payload("k")
    assert p.redriven == e1 and p.holder == n2
    return clock, stack, e1, n2, second_end, stamp


def test_second_redrive_seen_by_reconciliation_then_stale_describe_at_claim(session):
    """e1 FAILED, released; n2 holds k; e1 redriven; reconciliation (clock A) marks k: e1, stamped
    (A, t0). e1 fails again. 10 minutes later e1 is redriven again; reconciliation lists it RUNNING,
    adopt refused (n2 holds): mark names e1 already, not re-stamped. n2 ends, released. A message of
    k comes, a refill tick on clock A (no reconciliation): DescribeExecution(e1) within S of the
    second redrive answers FAILED (the second end). The mark is 600 s old by A: lifted, k claimed."""
    clock, stack, e1, n2, second_end, _ = _setup_second_redrive(session)

    clock.advance(5)
    holder_ends(stack, n2)
    assert e1 in stack.running()

    clock.advance(5)
    stack.send({"id": "k", "n": 3}, group="c")
    rt = stack.runtime()
    fired = stale_describe(rt.client("stepfunctions"), e1, second_end)
    rt.launcher().tick(reconcile_first=False)
    assert fired["describe"] >= 1
    key_runs_once(stack, e1)


def test_second_redrive_then_claim_with_reconciliation_and_stale_listing(session):
    """As above, but the claim's tick reconciles first: its listing is behind the second redrive
    (e1 not listed, within S) and DescribeExecution stale (FAILED at the second end)."""
    clock, stack, e1, n2, second_end, _ = _setup_second_redrive(session)
    clock.advance(5)
    holder_ends(stack, n2)

    clock.advance(5)
    stack.send({"id": "k", "n": 3}, group="c")
    rt = stack.runtime()
    sfn = rt.client("stepfunctions")
    fired = stale_describe(sfn, e1, second_end)
    hidden: Counter = Counter()

    def hide(parsed: dict[str, Any], **_: Any) -> None:
        before = len(parsed.get("executions", []))
        parsed["executions"] = [e for e in parsed.get("executions", []) if e["name"] != e1]
        hidden["listing"] += before - len(parsed["executions"])

    sfn.meta.events.register("after-call.sfn.ListExecutions", hide)
    rt.launcher().tick()
    assert fired["describe"] >= 1 and hidden["listing"] >= 1
    key_runs_once(stack, e1)


def test_second_redrive_then_the_completion_of_the_holder_hands_k_to_its_next_message(session):
    """As the first, but k's next message waits in the queue when n2's status event arrives: the
    completion (container on clock A) releases n2 and claims the message itself; its
    DescribeExecution(e1) within S of the second redrive says FAILED (the second end)."""
    clock, stack, e1, n2, second_end, _ = _setup_second_redrive(session)
    clock.advance(5)
    stack.send({"id": "k", "n": 3}, group="c")
    clock.advance(5)
    event = stack.finish(n2, "SUCCEEDED")
    rt = stack.runtime()
    fired = stale_describe(rt.client("stepfunctions"), e1, second_end)
    released, _, _ = rt.launcher().on_status_change(StatusChange.from_event(event))
    assert released
    assert fired["describe"] >= 1
    key_runs_once(stack, e1)


def test_second_redrive_claim_by_another_clock_adopts(session):
    """Control: the same, but k's next message is claimed by a container on another clock (an
    hour ahead): the stamp is not its own, the mark is young, e1 is adopted, k runs once."""

    clock, stack, e1, n2, second_end, _ = _setup_second_redrive(session)
    clock.advance(5)
    holder_ends(stack, n2)
    clock.advance(5)
    other = FakeClock(clock.now() + 3600)
    stack.send({"id": "k", "n": 3}, group="c")
    rt = Runtime(
        stack.settings, session=stack.session, clock=other, client_config=NO_RETRY, sleep=other.sleep
    )
    fired = stale_describe(rt.client("stepfunctions"), e1, second_end)
    rt.launcher().tick(reconcile_first=False)
    assert fired["describe"] >= 1
    assert running_of_key(stack, "k") == [e1]
    assert stack.runtime().store().payload("k").holder == e1


def test_one_real_redrive_after_a_mark_from_a_stale_listing(session):
    """Only one real redrive. e1 of k FAILED at s1, released; n2 of k holds k. Within S of e1's end
    a reconciliation (clock A) gets a listing and DescribeExecution behind that end (e1 RUNNING):
    adopt refused (n2 holds), k marked e1, stamped (A, t0). Ten minutes later the operator
    redrives e1; a reconciliation lists it RUNNING: adopt refused (n2 holds), mark names e1
    already, not re-stamped. n2 ends, released. k's next message on clock A, within S of the
    redrive: DescribeExecution(e1) says FAILED at s1 (from before the redrive); the mark is 600 s
    old by A: lifted, k claimed and started beside e1."""
    from tests.integration.test_breaker_findings import stale_once

    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=3, clock=clock)
    e1 = run_and_end(stack, "k")
    earlier = describe_answer(stack, e1)
    stack.send({"id": "k", "n": 2}, group="b")
    stack.launcher().tick(reconcile_first=False)
    (n2,) = running_of_key(stack, "k")
    store = stack.runtime().store()
    rt = stack.runtime()
    stale = stale_once(rt.client("stepfunctions"), e1)
    rt.launcher().tick()
    assert stale == Counter(listed=1, described=1)
    p = store.payload("k")
    assert p.redriven == e1 and p.holder == n2
    stamp = p.redriven_at
    assert stamp == clock.now()

    clock.advance(600)
    redrive(stack, e1)
    stack.launcher().tick()  # e1 listed RUNNING again: adopt refused (n2 holds)
    assert store.payload("k").redriven == e1 and store.payload("k").holder == n2

    clock.advance(5)
    holder_ends(stack, n2)
    clock.advance(5)
    stack.send({"id": "k", "n": 3}, group="c")
    rt2 = stack.runtime()
    fired = stale_describe(rt2.client("stepfunctions"), e1, earlier)
    rt2.launcher().tick(reconcile_first=False)
    assert fired["describe"] >= 1
    key_runs_once(stack, e1)


def test_an_adoption_removes_the_stamp_with_the_mark(session):
    """An adoption removed ``redriven`` but left ``redriven_at`` / ``redriven_by``: harmless to this
    version (its next first mark stamps anew), but an older version's mark (``SET redriven`` only)
    during a rolling deploy would have inherited that stamp. The stamp goes with the mark."""

    clock, stack, e1, n2, _, _ = _setup_second_redrive(session)
    holder_ends(stack, n2)
    other = FakeClock(clock.now() + 3600)
    stack.send({"id": "k", "n": 3}, group="c")
    rt = Runtime(
        stack.settings, session=stack.session, clock=other, client_config=NO_RETRY, sleep=other.sleep
    )
    rt.launcher().tick(reconcile_first=False)
    p = stack.runtime().store().payload("k")
    assert p.holder == e1 and p.redriven is None
    assert (p.redriven_at, p.redriven_by) == (None, None), f"stamp left: {(p.redriven_at, p.redriven_by)}"


# -- a resume's yield -----------------------------------------------------------------------------


@pytest.mark.parametrize("reconcile_first", [False, True])
def test_resume_yields_on_old_stamp_after_second_redrive(session, reconcile_first):
    """e1 of k FAILED, released. N of k claimed with its start mark; the launcher dies before
    StartExecution. e1 redriven; reconciliation marks k: e1 (stamp t0), block(N) refused (start
    mark). e1 fails again; 150 s later redriven again, seen RUNNING by a reconciliation (no
    re-mark: the mark names e1). N's message back (visibility 180 s): renewal, _yield_to_redriven:
    DescribeExecution(e1) within S of the second redrive says FAILED (second end); the stamp is
    older than two windows: the mark is lifted and N starts beside e1."""
    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=3, clock=clock)
    e1 = run_and_end(stack, "k")
    clock.advance(2 * WINDOW + 5)

    stack.send({"id": "k", "n": 2}, group="b")
    rt = stack.runtime()
    crashed = crash_before_start(rt.client("stepfunctions"))
    receipts = receipts_of(rt.client("sqs"))
    with pytest.raises(Crash):
        rt.launcher().tick(reconcile_first=False)
    assert crashed["crashed"] == 1
    store = stack.runtime().store()
    n = store.payload("k").holder
    assert store.execution(n).state is PayloadState.CLAIMED and store.execution(n).starting_at is not None

    clock.advance(1)
    redrive(stack, e1)
    stack.launcher().tick()
    p = store.payload("k")
    assert p.redriven == e1 and p.holder == n and store.execution(n).blocked_by is None
    stamp = p.redriven_at

    clock.advance(2)
    time.sleep(0.01)
    stack.finish(e1, "FAILED", error="Again")
    second_end = describe_answer(stack, e1)

    clock.advance(150)
    redrive(stack, e1)
    stack.launcher().tick()  # sees e1 RUNNING again: adopt refused (N holds), mark names e1 already
    p = store.payload("k")
    assert p.redriven == e1 and p.holder == n

    clock.advance(30)  # N's message back after its visibility timeout; 30 s after the second redrive
    assert clock.now() - stamp >= 2 * WINDOW
    stack.visible_again(receipts)
    rt2 = stack.runtime()
    fired = stale_describe(rt2.client("stepfunctions"), e1, second_end)
    rt2.launcher().tick(reconcile_first=reconcile_first)
    assert fired["describe"] >= 1
    key_runs_once(stack, e1)


# -- a lift raced by a sighting ------------------------------------------------------------------


def test_claim_clears_a_mark_a_reconciler_just_saw_running(session):
    """e1 of k FAILED at s1, released. A stale listing within S of the end (clock A): UNSURE, k
    marked e1, stamped (A, t0); lease free. 125 s later (by A) k's next message, a wake on A:
    claim refused, the mark is old by A, DescribeExecution(e1): FAILED at s1 (fresh). Between that
    answer and the clear: the operator redrives e1, it fails at once (s2), is redriven again; a
    reconciler B (correct clock) lists e1 RUNNING, DescribeExecution (stale) FAILED at s2, within S
    of s2: UNSURE, the lease free, k is marked e1 already: no write. A then clears the mark and
    claims k: e1 and k's new run RUNNING at once."""
    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=3, clock=clock)
    e1 = run_and_end(stack, "k")
    store = stack.runtime().store()
    rt0 = stack.runtime()
    listed = stale_listing(rt0.client("stepfunctions"), e1, store.execution(e1).arn)
    rt0.launcher().tick()
    assert listed["listing"] >= 1
    p = store.payload("k")
    assert p.redriven == e1 and p.holder is None
    assert p.redriven_by == clock.identity

    clock.advance(2 * WINDOW + 5)
    stack.send({"id": "k", "n": 2}, group="b")
    rt_a = stack.runtime()
    raced: Counter = Counter()

    def between(parsed: dict[str, Any], **_: Any) -> None:
        if parsed.get("name") != e1 or raced["b"]:
            return
        raced["b"] += 1
        assert parsed["status"] == "FAILED"  # A's answer: fresh, e1 ended at s1
        redrive(stack, e1)
        time.sleep(0.01)
        stack.finish(e1, "FAILED", error="Again")
        second = describe_answer(stack, e1)
        redrive(stack, e1)
        b = FakeClock(time.time() + 2)
        rt_b = Runtime(stack.settings, session=stack.session, clock=b, client_config=NO_RETRY, sleep=b.sleep)
        fired_b = stale_describe(rt_b.client("stepfunctions"), e1, second)
        rt_b.launcher().tick()
        assert fired_b["describe"] >= 1
        raced["b_saw"] = int(store.payload("k").redriven == e1 and store.payload("k").holder is None)

    rt_a.client("stepfunctions").meta.events.register("after-call.sfn.DescribeExecution", between)
    rt_a.launcher().tick(reconcile_first=False)
    assert raced["b"] == 1 and raced["b_saw"] == 1
    key_runs_once(stack, e1)


# -- liveness: marks no live clock can judge (promise 4) ----------------------------------------


def runtime_at(stack, clock):
    return Runtime(
        stack.settings, session=stack.session, clock=clock, client_config=NO_RETRY, sleep=clock.sleep
    )


def _k_runs_once_then_nothing_left(stack, runs: list[str], clocks: tuple, step) -> None:
    """Rounds a window apart (``step(round, claiming)`` ticks) until k's message runs, never beside
    another run of k; then everything ends, and more rounds leave no mark, slot or dead letter."""
    store = stack.runtime().store()
    started: set[str] = set()
    for round_ in range(12):
        for c in clocks:
            c.advance(WINDOW + 1)
        step(round_, True)
        keyed = running_of_key(stack, "k")
        assert len(keyed) <= 1, f"two runs of k: {keyed}"
        started |= set(keyed)
        if started:
            break
    assert started and not started & set(runs), f"k's message never ran: {store.payload('k')}"
    for name in stack.running():
        stack.finish(name, "SUCCEEDED")
    for round_ in range(6):
        for c in clocks:
            c.advance(WINDOW + 1)
        step(round_, False)
    p = store.payload("k")
    assert p.holder is None and p.redriven is None and not p.redriven_more, p
    assert store.ledger().holders == frozenset(), f"slots leaked: {sorted(store.ledger().holders)}"
    assert stack.dlq_messages() == []


def _marked_by_gone_container(session, two_marks: bool):
    wall = time.time()
    clock = FakeClock(wall)
    stack = build_stack(session, max_concurrency=2, clock=clock)
    e1 = run_and_end(stack, "k", group="a")
    runs = [e1]
    if two_marks:
        runs.append(run_and_end(stack, "k", group="b"))
    store = stack.runtime().store()
    gone = FakeClock(wall + 3)  # the marker: a container that never runs again
    rt = runtime_at(stack, gone)
    sfn = rt.client("stepfunctions")
    fired = [stale_listing(sfn, name, store.execution(name).arn) for name in runs]
    rt.launcher().tick()
    assert all(f["listing"] >= 1 for f in fired)
    p = store.payload("k")
    assert p.holder is None and p.redriven in runs, p
    if two_marks:
        assert {p.redriven, *p.redriven_more} == set(runs) and p.redriven_at is None
    else:
        assert p.redriven_by == gone.identity
    return wall, clock, stack, runs


@pytest.mark.parametrize("two_marks", [False, True], ids=["stamped-by-gone", "redriven_more"])
def test_key_runs_again_when_no_clock_can_judge_its_marks(session, two_marks):
    """k's ended runs marked by a stale listing of a container that then goes away (and, with two,
    the second mark unstamped). k's next message comes; containers B (an hour ahead), C (an hour
    behind) and the main one tick in turn, time passing. k's message must run once, nothing twice,
    and at the end no mark and no slot is left."""
    wall, clock, stack, runs = _marked_by_gone_container(session, two_marks)
    ahead, behind = FakeClock(wall + 3600), FakeClock(wall - 3600)
    stack.send({"id": "k", "n": 9}, group="c")
    containers = [runtime_at(stack, ahead), runtime_at(stack, behind), stack.runtime()]
    _k_runs_once_then_nothing_left(
        stack, runs, (clock, ahead, behind), lambda round_, _: containers[round_ % 3].launcher().tick()
    )


@pytest.mark.parametrize("two_marks", [False, True], ids=["stamped-by-gone", "redriven_more"])
def test_key_runs_again_with_wake_ticks_only_from_other_clocks(session, two_marks):
    """As above, but the claims come from producer wakes (no reconciliation in their ticks) on
    container B, and the scheduled reconciliation on container C only."""
    wall, clock, stack, runs = _marked_by_gone_container(session, two_marks)
    b, c = FakeClock(wall + 10), FakeClock(wall + 20)
    rb, rc = runtime_at(stack, b), runtime_at(stack, c)
    stack.send({"id": "k", "n": 9}, group="c")

    def step(_: int, claiming: bool) -> None:
        if claiming:
            rb.launcher().tick(reconcile_first=False)
        rc.launcher().tick()

    _k_runs_once_then_nothing_left(stack, runs, (clock, b, c), step)
    assert stack.dlq_messages() == []


def test_key_marked_by_gone_container_runs_again_after_a_switch_and_delete(session):
    """k's ended run e1 marked by a stale listing of a container that goes away (stamp only it can
    judge). The stack switches to a new state machine and deletes the old: DescribeExecution(e1)
    says "no such execution", which a young mark takes for "may run" (before the change: lifted
    past two windows). k's next message, claimed by other containers: k must run again on the new
    machine, and nothing leak."""
    from dataclasses import replace

    from tests.support.aws import new_machine

    wall, clock, stack, runs = _marked_by_gone_container(session, False)
    (e1,) = runs
    store = stack.runtime().store()
    m1 = stack.settings.state_machine_arn
    m2 = new_machine(stack)
    stack.settings = replace(stack.settings, state_machine_arn=m2)
    stack.client("stepfunctions").delete_state_machine(stateMachineArn=m1)
    b = FakeClock(wall + 10)
    receipts: list[str] = []

    def rb():  # settings read anew: the switch
        rt = runtime_at(stack, b)
        rt.client("sqs").meta.events.register(
            "after-call.sqs.ReceiveMessage",
            lambda parsed, **_: receipts.extend(m["ReceiptHandle"] for m in parsed.get("Messages", [])),
        )
        return rt

    stack.send({"id": "k", "n": 9}, group="c")
    started: set[str] = set()
    for _ in range(12):
        for cl in (clock, b):
            cl.advance(WINDOW + 1)
        for receipt in receipts:  # moto's visibility runs in real time: the window has passed
            with contextlib.suppress(Exception):
                stack.visible_again([receipt])
        receipts.clear()
        rb().launcher().tick(reconcile_first=False)
        stack.launcher().tick()
        keyed = running_of_key(stack, "k")
        assert len(keyed) <= 1, f"two runs of k: {keyed}"
        started |= set(keyed)
        if started:
            break
    assert started and e1 not in started, f"k's message never ran: {store.payload('k')} {store.execution(e1)}"
    for name in stack.running():
        stack.finish(name, "SUCCEEDED")
    for _ in range(6):
        clock.advance(WINDOW + 1)
        stack.launcher().tick()
    p = store.payload("k")
    assert p.holder is None and p.redriven is None and not p.redriven_more, p
    assert store.ledger().holders == frozenset(), f"slots leaked: {sorted(store.ledger().holders)}"
    assert stack.dlq_messages() == []


# -- an adoption of a further mark -----------------------------------------------------------------


def missing_once(client: Any, name: str) -> Counter:
    seen: Counter = Counter()

    def hook(params: dict[str, Any], **_: Any) -> Any:
        body = params.get("body", b"")
        body = body.decode() if isinstance(body, bytes) else str(body)
        if (":" + name + '"') not in body or seen["missing"]:
            return None
        seen["missing"] += 1
        return error_answer("ExecutionDoesNotExist", 400)

    client.meta.events.register("before-call.sfn.DescribeExecution", hook)
    return seen


def end(stack, name: str, status: str) -> bool:
    event = stack.finish(name, status, error="Boom")
    released, _, _ = stack.launcher().on_status_change(StatusChange.from_event(event))
    return released


def test_adopting_a_further_mark_keeps_the_first(session):
    """Two ended runs of k, F and S, redriven while n3 holds k: k marked F, then S (further). n3
    ends. A pass: F described missing (UNSURE, held), S adopted, whose write removed ``redriven``
    whichever run it named: F ran on unmarked, and once S ended a message of k started beside F.
    An adoption now lifts only its own mark."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=5, clock=clock)
    runs = []
    for n in (1, 2):
        stack.send({"id": "k", "n": n}, group=f"g{n}")
        stack.launcher().tick(reconcile_first=False)
        (r,) = running_of_key(stack, "k")
        assert end(stack, r, "FAILED")
        runs.append(r)
    first, second = sorted(runs)
    stack.send({"id": "k", "n": 3}, group="g3")
    stack.launcher().tick(reconcile_first=False)
    (n3,) = running_of_key(stack, "k")
    clock.advance(200)
    redrive(stack, first)
    redrive(stack, second)
    stack.launcher().tick()
    store = stack.runtime().store()
    p = store.payload("k")
    assert p.holder == n3 and p.redriven == first and p.redriven_more == {second}, p
    assert end(stack, n3, "SUCCEEDED")
    clock.advance(5)
    rt = stack.runtime()
    seen = missing_once(rt.client("stepfunctions"), first)
    rt.launcher().tick()
    assert seen["missing"] == 1
    p = store.payload("k")
    assert p.holder == second
    assert end(stack, second, "SUCCEEDED")
    clock.advance(5)
    stack.send({"id": "k", "n": 4}, group="g4")
    stack.launcher().tick(reconcile_first=False)
    assert first in stack.running()
    assert len(running_of_key(stack, "k")) <= 1, f"two runs of key k at once: {running_of_key(stack, 'k')}"

"""Attacks on 72ca556 by a reviewer who had not seen its tests, on moto: a run whose record ended,
redriven, and described as missing (a view older than it). Five broke promise 2 (its key ran twice)
while the claim side (``MessageBranches._still_runs``, used by a claim, a resume and a hand-over)
still took "no such execution" for "ended" and lifted the key's mark; within the mark's windows it
is now taken as "may run", as reconciliation takes it (``listed_again``)."""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import replace
from typing import Any

from botocore.exceptions import ClientError

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from tests.integration.test_breaker_findings import deliver, redrive
from tests.support.aws import build_stack, new_machine
from tests.support.hooks import error_answer


def missing_for(client: Any, name: str, times: int | None) -> Counter:
    """DescribeExecution of ``name`` answers "no such execution" (a view from before its start,
    within the 60 s bound), ``times`` times (None: always)."""
    seen: Counter = Counter()

    def hook(params: dict[str, Any], **_: Any) -> Any:
        body = params.get("body", b"")
        body = body.decode() if isinstance(body, bytes) else str(body)
        if (":" + name + '"') not in body:
            return None
        if times is not None and seen["missing"] >= times:
            seen["fresh"] += 1
            return None
        seen["missing"] += 1
        return error_answer("ExecutionDoesNotExist", 400)

    client.meta.events.register("before-call.sfn.DescribeExecution", hook)
    return seen


def runs_of_key(stack, key: str) -> list[str]:
    store = stack.runtime().store()
    return sorted(n for n in stack.running() if (r := store.execution(n)) is not None and r.key == key)


def redriven_e1(stack) -> str:
    """e1 of k starts, FAILS, its event releases it; the operator redrives it (RUNNING again)."""
    stack.send({"id": "k", "n": 1}, group="a")
    stack.launcher().tick()
    (e1,) = stack.running()
    assert deliver(stack, stack.finish(e1, "FAILED", error="Boom"))
    assert stack.runtime().store().ledger().holders == frozenset()
    redrive(stack, e1)
    return e1


# -- A1: the claim's own stale "missing" lifted the mark: k ran twice -------------------------------


def test_a1_stale_missing_at_reconciliation_and_claim_keeps_the_key_for_the_run(session):
    """e1 of k FAILED, released, redriven. n2 of k is sent. One tick, seconds later: its
    reconciliation lists e1 RUNNING and DescribeExecution says no such execution (UNSURE now: k
    marked e1, counted external); its admission receives n2, the claim finds the mark and asks
    DescribeExecution(e1) again, within the same 60 s: again no such execution. ``_still_runs``
    takes None for "ended": the mark is lifted, n2 claims and starts beside e1."""
    stack = build_stack(session, max_concurrency=3, clock=FakeClock())
    e1 = redriven_e1(stack)
    stack.send({"id": "k", "n": 2}, group="b")
    rt = stack.runtime()
    seen = missing_for(rt.client("stepfunctions"), e1, times=2)
    rt.launcher().tick()
    assert seen["missing"] == 2, seen
    assert runs_of_key(stack, "k") == [e1], f"k runs twice at once: {runs_of_key(stack, 'k')} (e1 {e1})"


def test_a1_control_stale_only_at_reconciliation_holds(session):
    """As A1, but the claim's answer is fresh (RUNNING): e1 adopted, n2 its duplicate."""
    stack = build_stack(session, max_concurrency=3, clock=FakeClock())
    e1 = redriven_e1(stack)
    stack.send({"id": "k", "n": 2}, group="b")
    rt = stack.runtime()
    seen = missing_for(rt.client("stepfunctions"), e1, times=1)
    rt.launcher().tick()
    assert seen["missing"] == 1, seen
    assert runs_of_key(stack, "k") == [e1], f"k runs twice at once: {runs_of_key(stack, 'k')}"
    assert stack.runtime().store().payload("k").holder == e1


def test_a1b_missing_across_two_ticks_keeps_the_key_for_the_run(session):
    """A1 split over two ticks 10 s apart (both answers within 60 s of e1's start): tick 1
    reconciles only (nothing queued of k), marks k; n2 arrives; tick 2's reconciliation marks again
    (stale), its claim is answered missing again: the mark lifted, n2 starts beside e1."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=3, clock=clock)
    e1 = redriven_e1(stack)
    rt = stack.runtime()
    seen = missing_for(rt.client("stepfunctions"), e1, times=3)
    rt.launcher().tick()
    assert stack.runtime().store().payload("k").redriven == e1
    clock.advance(10)
    stack.send({"id": "k", "n": 2}, group="b")
    rt.launcher().tick()
    assert seen["missing"] == 3, seen
    assert runs_of_key(stack, "k") == [e1], f"k runs twice at once: {runs_of_key(stack, 'k')} (e1 {e1})"


# -- A2: a run described missing forever: a leak? -------------------------------------------------


def test_a2_missing_forever_leaks_nothing_once_it_ends(session):
    """e1 redriven; DescribeExecution(e1) answers missing forever (a view that never catches up).
    Twenty ticks (each marks k, counts e1 external). e1 then ends (its second end, event of a
    released record: nothing). Afterwards: the ledger holds what runs; MAX full is usable; k is
    claimable."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=2, clock=clock)
    e1 = redriven_e1(stack)
    rt = stack.runtime()
    missing_for(rt.client("stepfunctions"), e1, times=None)
    for _ in range(20):
        clock.advance(61)
        rt.launcher().tick()
    store = stack.runtime().store()
    assert store.payload("k").redriven == e1
    deliver(stack, stack.finish(e1, "FAILED", error="Again"))
    clock.advance(61)
    rt.launcher().tick()
    stack.send({"id": "k", "n": 2}, group="b")
    stack.send({"id": "x"}, group="c")
    for _ in range(3):
        clock.advance(61)
        rt.launcher().tick()
    assert len(stack.running()) == 2, f"MAX 2, only {stack.running()} run; queue {stack.queue_counts()}"
    assert store.ledger().holders == set(stack.running())
    assert store.payload("k").redriven is None


def test_a2b_missing_forever_while_it_runs_keeps_k_for_it(session):
    """e1 redriven and running; DescribeExecution(e1) missing forever. n2 of k sent, ticks a minute
    apart: does n2 start beside e1 (the mark lifted on the claim's "missing")?"""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=3, clock=clock)
    e1 = redriven_e1(stack)
    rt = stack.runtime()
    missing_for(rt.client("stepfunctions"), e1, times=None)
    stack.send({"id": "k", "n": 2}, group="b")
    for _ in range(3):
        rt.launcher().tick()
        clock.advance(61)
    assert runs_of_key(stack, "k") == [e1], f"k runs twice: {runs_of_key(stack, 'k')}"


# -- A3: a blocked unstarted claim whose redriven run reads as missing ----------------------------


def _a3(session, stale_answers: int):
    """n2 of k is claimed, start-marked, its StartExecution answers 500 and did not start it (an
    unsure start: claim and mark kept, the message back later). e1 of k is then redriven. A tick's
    reconciliation: e1 listed RUNNING, described missing (UNSURE): k marked e1, the block of n2
    refused (its start mark). n2's message comes back: resume n2, renew, ``_yield_to_redriven``
    asks DescribeExecution(e1): the ``stale_answers``-th answer and on are fresh."""
    from tests.support.hooks import receipts_of

    clock = FakeClock()
    stack = build_stack(session, max_concurrency=3, clock=clock)
    stack.send({"id": "k", "n": 1}, group="a")
    stack.launcher().tick()
    (e1,) = stack.running()
    assert deliver(stack, stack.finish(e1, "FAILED", error="Boom"))
    stack.send({"id": "k", "n": 2}, group="b")
    rt = stack.runtime()
    sfn = rt.client("stepfunctions")
    receipts = receipts_of(rt.client("sqs"))
    fails: Counter = Counter()

    def unsure(**_: Any) -> Any:
        if fails["n"]:
            return None
        fails["n"] += 1
        return error_answer("InternalServerError", 500)

    sfn.meta.events.register("before-call.sfn.StartExecution", unsure)
    rt.launcher().tick(reconcile_first=False)
    store = stack.runtime().store()
    n2 = store.payload("k").holder
    assert n2 and n2 != e1 and stack.running() == []
    redrive(stack, e1)
    missing = missing_for(sfn, e1, times=stale_answers)
    seen = []
    for _ in range(6):
        for r in list(receipts):
            with contextlib.suppress(ClientError):  # a receipt of a message deleted since
                stack.visible_again([r])
        rt.launcher().tick()
        seen.append(runs_of_key(stack, "k"))
        clock.advance(61)
    info = {n: (r.state, r.blocked_by, r.adopted_at) for n in (e1, n2) if (r := store.execution(n))}
    detail = (
        f"e1={e1} n2={n2} holders={store.ledger().holders} running={stack.running()} seen={seen} "
        f"missing={missing} records={info} payload={store.payload('k')} queue={stack.queue_counts()}"
    )
    assert all(len(r) <= 1 for r in seen), f"k twice at once: {detail}"
    assert store.ledger().holders == set(stack.running()), detail


def test_a3_resumed_claim_fresh_answer_holds(session):
    _a3(session, stale_answers=1)


def test_a3b_resumed_claim_stale_missing_twice_keeps_k_for_the_run(session):
    _a3(session, stale_answers=2)


# -- A4: switch of stateMachineArn: record on old, deleted machine; the name runs on the new one ----


def test_a4_record_on_deleted_old_machine_name_running_on_new(session):
    """e1 of k ran on M1, FAILED, released. The stack switches to M2 and M1 is deleted. Someone
    starts an execution named e1 on M2 (names are unique per machine only). Reconciliation: e1
    listed RUNNING on M2, its record (ARN on M1) described: M1 gone → None → UNSURE: counted
    external, k marked. Does anything leak once it ends, and is k claimable?"""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=2, clock=clock)
    stack.send({"id": "k", "n": 1}, group="a")
    stack.launcher().tick()
    (e1,) = stack.running()
    assert deliver(stack, stack.finish(e1, "FAILED", error="Boom"))
    m1 = stack.settings.state_machine_arn
    m2 = new_machine(stack)
    stack.settings = replace(stack.settings, state_machine_arn=m2)
    sfn = stack.client("stepfunctions")
    sfn.delete_state_machine(stateMachineArn=m1)
    sfn.start_execution(stateMachineArn=m2, name=e1, input="{}")
    for _ in range(3):
        clock.advance(61)
        stack.launcher().tick()
    store = stack.runtime().store()
    mark = store.payload("k").redriven
    stack.send({"id": "k", "n": 2}, group="b")
    clock.advance(61)
    stack.launcher().tick()
    # e1 on M2 is not Sluice's: MAX 2 minus it leaves one slot, k's message takes it
    assert len(stack.running()) == 2, (mark, stack.running(), stack.queue_counts())


# -- A5: the completion's hand-over ---------------------------------------------------------------


def _a5(session, stale_answers: int):
    """e1 of k FAILED, released, redriven. A tick: reconciliation (e1 missing: k marked e1) and x
    started. n2 of k sent. x SUCCEEDS: its completion releases x and offers the freed slot to n2
    (hand-over): the successor's lease is refused by the mark, so n2 is claimed its own way, and
    the claim asks DescribeExecution(e1)."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=3, clock=clock)
    e1 = redriven_e1(stack)
    rt = stack.runtime()
    missing = missing_for(rt.client("stepfunctions"), e1, times=stale_answers)
    stack.send({"id": "x"}, group="x")
    rt.launcher().tick()
    store = stack.runtime().store()
    assert store.payload("k").redriven == e1
    (x,) = [n for n in stack.running() if n != e1]
    stack.send({"id": "k", "n": 2}, group="b")
    rt.launcher().on_status_change(StatusChange.from_event(stack.finish(x, "SUCCEEDED")))
    detail = f"e1={e1} runs of k={runs_of_key(stack, 'k')} missing={missing} payload={store.payload('k')}"
    assert runs_of_key(stack, "k") == [e1], f"k twice at once: {detail}"
    assert store.payload("k").holder == e1, detail


def test_a5_handover_fresh_answer_holds(session):
    _a5(session, stale_answers=1)


def test_a5b_handover_stale_missing_twice_keeps_k_for_the_run(session):
    _a5(session, stale_answers=2)

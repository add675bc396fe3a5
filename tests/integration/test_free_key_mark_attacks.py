"""Attacks on the mark on a free key (commit eb944da, ``Rerun.UNSURE``), on moto with the real
adapters, launcher and handlers.

A run listed RUNNING within the consistency window of the end its record holds, which
DescribeExecution says ended with that end, is no longer adopted: it counts as external and its
key is marked ``redriven`` even when the lease is free. A claim of a marked key is refused; within
the window of the mark (the payload record's ``updated_at``) the run is adopted and the message
waits behind it; past it, a fresh "ended" answer lifts the mark.

Stale answers come only from botocore hooks on one runtime's Step Functions client: a listing
that still shows an ended run RUNNING (``stale_listing``), and a DescribeExecution that still
answers with the end before a redrive (``stale_describe``). An operator's RedriveExecution is
``tests.integration.test_breaker_findings.redrive`` (moto has none). Every fault asserts it fired.
Eleven held as written. Three broke, and now hold after their fixes: a mark stamped by a slow
clock read as old by a claimer on time (the mark now holds claims two windows), an adoption
refused by contention that lifted the mark of a run that runs (the mark now stays), and an awaits
waiter dead-lettered by the earlier end of a marked key (a young mark now holds the verdict).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.runtime import Runtime
from tests.integration.test_breaker_findings import deliver, redrive, running_of_key
from tests.support.aws import NO_RETRY, Stack, build_stack
from tests.support.hooks import _Http, receipts_of

# -- faults ----------------------------------------------------------------------------------------


def api_params(request: dict[str, Any]) -> dict[str, Any]:
    """The call's parameters, from the request dict a ``before-call`` hook gets (a JSON body)."""
    body = request.get("body") or b"{}"
    return json.loads(body.decode() if isinstance(body, bytes) else body)


def stale_listing(client: Any, name: str, *, times: int = 1) -> Counter:
    """ListExecutions still lists ``name`` RUNNING (just after its end), ``times`` times."""
    seen: Counter = Counter()

    def hook(parsed: dict[str, Any], **_: Any) -> None:
        if seen["listed"] >= times or any(e["name"] == name for e in parsed.get("executions", [])):
            return
        seen["listed"] += 1
        parsed.setdefault("executions", []).append({"name": name, "status": "RUNNING"})

    client.meta.events.register("after-call.sfn.ListExecutions", hook)
    return seen


def stale_describe(client: Any, name: str, *, status: str, stop: float, times: int = 1) -> Counter:
    """DescribeExecution of ``name`` answers with its end before a redrive (``status`` at ``stop``,
    no redrive reported), ``times`` times: what it may say within S of a RedriveExecution."""
    seen: Counter = Counter()

    def hook(params: dict[str, Any], **_: Any) -> Any:
        arn = api_params(params).get("executionArn", "")
        if seen["described"] >= times or not arn.endswith(f":{name}"):
            return None
        seen["described"] += 1
        parsed = {
            "executionArn": arn,
            "stateMachineArn": arn.replace(":execution:", ":stateMachine:").rsplit(":", 1)[0],
            "name": name,
            "status": status,
            "startDate": datetime.fromtimestamp(stop - 5, UTC),
            "stopDate": datetime.fromtimestamp(stop, UTC),
            "input": "{}",
            "error": "Boom",
            "cause": "Boom cause",
            "redriveCount": 0,
            "ResponseMetadata": {"HTTPStatusCode": 200, "HTTPHeaders": {}},
        }
        return _Http(200), parsed

    client.meta.events.register("before-call.sfn.DescribeExecution", hook)
    return seen


def adoption_contended(client: Any, *, rounds: int = 3) -> Counter:
    """The adoption's slot conditions fail ``rounds`` times: the pool moved under it each time
    (other launchers' claims and releases on the shard it read), as ``Store.adopt`` retries for."""
    seen: Counter = Counter()

    def hook(params: dict[str, Any], **_: Any) -> Any:
        items = api_params(params).get("TransactItems", [])
        adopting = any("adopted_at" in i.get("Update", {}).get("UpdateExpression", "") for i in items)
        if not adopting or seen["contended"] >= rounds:
            return None
        seen["contended"] += 1
        reasons = [{"Code": "None"} for _ in items]
        reasons[-1] = {"Code": "ConditionalCheckFailed", "Message": "The conditional request failed"}
        parsed = {
            "Error": {"Code": "TransactionCanceledException", "Message": "Transaction cancelled (injected)"},
            "CancellationReasons": reasons,
            "ResponseMetadata": {"HTTPStatusCode": 400, "HTTPHeaders": {}},
        }
        return _Http(400), parsed

    client.meta.events.register("before-call.dynamodb.TransactWriteItems", hook)
    return seen


# -- helpers ---------------------------------------------------------------------------------------


def new_stack(session: Any, max_concurrency: int = 5) -> Stack:
    return build_stack(session, max_concurrency=max_concurrency, clock=FakeClock(time.time()))


def ended_run(stack: Stack, key: str, group: str = "a") -> tuple[str, float]:
    """A run of ``key`` started, ended FAILED, and released by its event. Its name and stop date."""
    stack.send({"id": key, "n": 1}, group=group)
    stack.launcher().tick()
    (e1,) = running_of_key(stack, key)
    assert deliver(stack, stack.finish(e1, "FAILED", error="Boom"))
    record = stack.runtime().store().execution(e1)
    assert record is not None and record.ended_at is not None
    return e1, record.ended_at


def started_inputs(stack: Stack) -> list[str]:
    return sorted(json.dumps(i, sort_keys=True) for i in stack.inputs())


def skewed(stack: Stack, offset: float) -> Runtime:
    """A runtime (a container) whose clock reads ``offset`` seconds off the stack's."""
    clock = FakeClock(stack.clock.now() + offset)
    return Runtime(
        stack.settings, session=stack.session, clock=clock, client_config=NO_RETRY, sleep=clock.sleep
    )


def unsure_mark_by_stale_listing(stack: Stack, e1: str) -> None:
    """A tick whose ListExecutions still shows e1 (ended a moment ago) RUNNING; DescribeExecution
    says FAILED at the end e1's record holds: UNSURE, so e1's free key is marked."""
    rt = stack.runtime()
    listed = stale_listing(rt.client("stepfunctions"), e1)
    rt.launcher().tick()
    assert listed["listed"] == 1


def unsure_mark_by_stale_describe(stack: Stack, e1: str, ended_at: float, rt: Runtime | None = None) -> None:
    """e1 was redriven (RUNNING again, listed so); the tick's DescribeExecution still answers with
    its earlier end: UNSURE, so e1's free key is marked."""
    rt = rt or stack.runtime()
    described = stale_describe(rt.client("stepfunctions"), e1, status="FAILED", stop=ended_at)
    rt.launcher().tick()
    assert described["described"] == 1


# -- cases -----------------------------------------------------------------------------------------


def redriven_and_marked(stack: Stack, *, after: float = 10) -> tuple[str, float, Any]:
    """e1 of k FAILED and released; the operator redrives it ``after`` s later; 5 s on, a tick
    marks k UNSURE on a stale DescribeExecution. Returns (e1, its end, the store)."""
    e1, ended_at = ended_run(stack, "k")
    stack.clock.advance(after)
    redrive(stack, e1)
    stack.clock.advance(5)
    unsure_mark_by_stale_describe(stack, e1, ended_at)
    store = stack.runtime().store()
    assert store.payload("k").redriven == e1 and store.payload("k").holder is None
    return e1, ended_at, store


def test_a_listing_behind_an_end_marks_the_free_key_and_its_next_message_still_starts(session):
    """e1 of k FAILED, released. A tick lists it RUNNING (behind its end), DescribeExecution says
    FAILED: k is marked, e1 counted external, not adopted. n2 of k within the mark's window adopts
    e1 (a dead run) and waits parked behind it; a window later reconciliation releases e1 on its
    fresh end, which wakes n2, and n2 starts. No run of k twice, no slot or mark left over."""
    stack = new_stack(session)
    e1, _ = ended_run(stack, "k")
    stack.clock.advance(5)
    unsure_mark_by_stale_listing(stack, e1)
    store = stack.runtime().store()
    assert store.payload("k").redriven == e1 and store.payload("k").holder is None
    assert store.ledger().holders == frozenset()  # not adopted: no slot for a listing's lag

    stack.clock.advance(5)
    stack.send({"id": "k", "n": 2}, group="b")
    stack.launcher().tick()
    assert stack.running() == []
    assert store.payload("k").holder == e1  # adopted by the claim that found the mark
    assert stack.queue_counts() == (0, 0)  # parked behind e1, not lost

    for _ in range(3):
        stack.clock.advance(61)
        stack.launcher().tick()
    assert started_inputs(stack) == sorted(
        json.dumps(b, sort_keys=True) for b in ({"id": "k", "n": 1}, {"id": "k", "n": 2})
    )
    (n2,) = running_of_key(stack, "k")
    payload = store.payload("k")
    assert payload.holder == n2 and payload.redriven is None and not payload.redriven_more
    assert deliver(stack, stack.finish(n2, "SUCCEEDED"))
    assert store.ledger().holders == frozenset()


def test_a_leftover_mark_with_no_message_of_its_key_leaks_no_slot_and_lifts_on_the_next_claim(session):
    """The listing's lag marks k (e1 never ran again) and no message of k comes for minutes: MAX
    slots stay usable by other keys (the external count falls back to 0), and when a message of k
    finally comes, past the mark's window, the fresh "FAILED" lifts the mark and it starts."""
    stack = new_stack(session, max_concurrency=2)
    e1, _ = ended_run(stack, "k")
    stack.clock.advance(5)
    unsure_mark_by_stale_listing(stack, e1)
    store = stack.runtime().store()
    assert store.payload("k").redriven == e1

    for _ in range(3):
        stack.clock.advance(61)
        stack.launcher().tick()
    stack.send({"id": "a"}, group="a")
    stack.send({"id": "b"}, group="b")
    stack.launcher().tick()
    assert len(stack.running()) == 2, f"MAX 2, nothing else runs: only {stack.running()} started"
    assert store.payload("k").redriven == e1  # left over: nothing claimed k yet
    for name in stack.running():
        assert deliver(stack, stack.finish(name, "SUCCEEDED"))

    stack.send({"id": "k", "n": 2}, group="k")
    stack.launcher().tick()
    (n2,) = running_of_key(stack, "k")
    assert store.payload("k").holder == n2 and store.payload("k").redriven is None


def test_an_unsure_redrive_is_adopted_by_the_next_claim_and_the_key_runs_once(session):
    """e1 of k FAILED, released; the operator redrives it 10 s later. A tick lists e1 RUNNING and
    DescribeExecution still gives the earlier end: UNSURE, k marked. n2 of k comes: the claim
    finds the mark, e1 runs (a fresh answer), so e1 is adopted and n2 waits behind it. e1 ends:
    its release hands the key on and n2 starts. k never runs twice."""
    stack = new_stack(session)
    e1, _ended_at, store = redriven_and_marked(stack)

    stack.clock.advance(5)
    stack.send({"id": "k", "n": 2}, group="b")
    rt = stack.runtime()
    receipts = receipts_of(rt.client("sqs"))
    rt.launcher().tick()
    assert running_of_key(stack, "k") == [e1]
    assert store.payload("k").holder == e1
    assert receipts  # n2 received: a first look, back to the queue for the window

    event = stack.finish(e1, "SUCCEEDED")
    stack.launcher().on_status_change(StatusChange.from_event(event))
    stack.clock.advance(61)
    stack.visible_again(receipts)
    stack.launcher().tick()
    # n2 was sent while e1 (its key's run) ran: it starts after e1, or is recorded its duplicate.
    started = running_of_key(stack, "k")
    assert e1 not in started and len(started) <= 1
    assert stack.queue_counts() == (0, 0)
    assert started or store.payload("k").duplicates >= 1


def test_a_mark_stamped_by_a_slow_reconciler_holds_claims_while_the_redriven_run_runs(session):
    """e1 of k FAILED at s, released. The operator redrives it at s+45. A reconciler whose clock
    reads 30 s behind ticks at s+50 (its clock: s+20): listed RUNNING, DescribeExecution still
    FAILED at s: UNSURE, k marked with updated_at = s+20 (as docs/protocol.md's Clocks says: "a
    clock behind only marks the key instead"). n2 of k at s+85 on a launcher whose clock is on
    time: DescribeExecution(e1), 40 s after the redrive, may still give FAILED at s; the mark
    reads 65 s old, past the window, so it was lifted and n2 claimed and started beside e1 (before
    the fix: a mark now holds claims two windows)."""
    stack = new_stack(session)
    e1, ended_at = ended_run(stack, "k")
    stack.clock.advance(45)
    redrive(stack, e1)
    stack.clock.advance(5)
    slow = skewed(stack, -30)  # its clock is fixed here: 30 s behind from now on
    unsure_mark_by_stale_describe(stack, e1, ended_at, rt=slow)
    store = stack.runtime().store()
    assert store.payload("k").redriven == e1 and store.payload("k").holder is None
    assert store.payload("k").updated_at == pytest.approx(stack.clock.now() - 30)

    stack.clock.advance(35)
    stack.send({"id": "k", "n": 2}, group="b")
    rt = stack.runtime()
    described = stale_describe(rt.client("stepfunctions"), e1, status="FAILED", stop=ended_at, times=5)
    rt.launcher().tick(reconcile_first=False)
    assert described["described"] >= 1
    assert len(running_of_key(stack, "k")) <= 1, f"k runs twice: {running_of_key(stack, 'k')}"


def test_a_mark_stamped_by_a_reconciler_an_hour_behind_holds_claims_on_another_clock(session):
    """Explorer seed 247667414: the timeline above with the reconciler's clock an hour behind.
    The mark's stamp, by its clock, read by a claimer on time, was an hour old: the stale "FAILED"
    lifted it and n2 started beside e1. A mark's age is now judged only by the clock that stamped
    it; another takes it for young, so e1 is adopted and n2 waits behind it."""
    stack = new_stack(session)
    e1, ended_at = ended_run(stack, "k")
    stack.clock.advance(45)
    redrive(stack, e1)
    stack.clock.advance(5)
    slow = skewed(stack, -3600)
    unsure_mark_by_stale_describe(stack, e1, ended_at, rt=slow)
    store = stack.runtime().store()
    assert store.payload("k").redriven == e1 and store.payload("k").holder is None

    stack.clock.advance(35)
    stack.send({"id": "k", "n": 2}, group="b")
    rt = stack.runtime()
    described = stale_describe(rt.client("stepfunctions"), e1, status="FAILED", stop=ended_at, times=5)
    rt.launcher().tick(reconcile_first=False)
    assert described["described"] >= 1
    assert running_of_key(stack, "k") == [e1], f"k runs twice: {running_of_key(stack, 'k')}"
    assert store.payload("k").holder == e1


def test_a_mark_stamped_by_a_reconciler_on_time_holds_the_same_claim(session):
    """The same timeline with the reconciler's clock on time: the mark is 35 s old at n2's claim,
    within its window, so the stale "FAILED" is not taken for an end: e1 is adopted, n2 waits."""
    stack = new_stack(session)
    e1, ended_at, store = redriven_and_marked(stack, after=45)

    stack.clock.advance(35)
    stack.send({"id": "k", "n": 2}, group="b")
    rt = stack.runtime()
    described = stale_describe(rt.client("stepfunctions"), e1, status="FAILED", stop=ended_at, times=5)
    rt.launcher().tick(reconcile_first=False)
    assert described["described"] >= 1
    assert running_of_key(stack, "k") == [e1]
    assert store.payload("k").holder == e1


def test_an_adoption_lost_to_contention_keeps_the_mark_of_a_run_that_runs(session):
    """e1 of k redriven, marked UNSURE. n2 of k: the claim finds the mark, DescribeExecution says
    e1 RUNNING (fresh), so it adopts; the pool moves under the adoption three times (its slot
    conditions fail: ``Store.adopt`` gives up, "counted as external this tick, adopted at the
    next" in reconciliation's eyes). ``_take_redriven`` read the False as "ended" and cleared the
    mark: the claim looked again, found the lease free and started n2 beside the running e1 (before
    the fix: a refused adoption now keeps the mark)."""
    stack = new_stack(session)
    e1, _ended_at, _store = redriven_and_marked(stack)

    stack.clock.advance(5)
    stack.send({"id": "k", "n": 2}, group="b")
    rt = stack.runtime()
    contended = adoption_contended(rt.client("dynamodb"))
    rt.launcher().tick(reconcile_first=False)
    assert contended["contended"] == 3
    assert e1 in stack.running()
    assert len(running_of_key(stack, "k")) <= 1, f"k runs twice: {running_of_key(stack, 'k')}"


def test_a_marked_run_that_ends_for_real_before_any_claim_lets_the_next_message_start(session):
    """e1 redriven, marked UNSURE; it ends FAILED again (a new stop date) and its event arrives
    before any message of k. n2 of k within the mark's window: DescribeExecution gives the new
    end, which may be a stale one (between two redrives, ``test_redrive_date_attacks.py``), so
    e1 is adopted and n2 waits behind it; reconciliation past the adoption's window releases e1
    on its end, and n2 starts, alone: the cost of the mark, a window."""
    stack = new_stack(session)
    e1, _ended_at, store = redriven_and_marked(stack)
    time.sleep(0.01)  # moto's stop date is the wall clock's: a new end, not the earlier one
    deliver(stack, stack.finish(e1, "FAILED", error="Again"))
    assert stack.running() == []

    stack.clock.advance(5)
    stack.send({"id": "k", "n": 2}, group="b")
    stack.launcher().tick(reconcile_first=False)
    assert running_of_key(stack, "k") == [] and store.payload("k").holder == e1  # adopted: n2 waits
    stack.clock.advance(121)
    stack.launcher().tick()  # e1 released on its end, which wakes n2
    stack.clock.advance(1)
    stack.launcher().tick()
    (n2,) = running_of_key(stack, "k")
    assert n2 != e1
    assert store.payload("k").holder == n2 and store.payload("k").redriven is None


def test_a_run_once_key_whose_run_succeeded_is_never_marked_and_stays_done(session):
    """A run-once e1 of k SUCCEEDED, released. The listing still shows it RUNNING: a success is
    its last end (never redriven), so k is not marked; a run-once message of k is already done,
    a plain one starts."""
    stack = new_stack(session)
    stack.send({"id": "k", "n": 1}, group="a", sluice_once="true")
    stack.launcher().tick()
    (e1,) = stack.running()
    assert deliver(stack, stack.finish(e1, "SUCCEEDED", output="{}"))
    stack.clock.advance(5)
    unsure_mark_by_stale_listing(stack, e1)
    store = stack.runtime().store()
    assert store.payload("k").redriven is None and not store.payload("k").redriven_more

    stack.send({"id": "k", "n": 2}, group="b", sluice_once="true")
    summary = stack.launcher().tick(reconcile_first=False)
    assert stack.running() == [] and stack.queue_counts() == (0, 0)
    assert summary.outcomes, summary
    stack.send({"id": "k", "n": 3}, group="c")
    stack.launcher().tick(reconcile_first=False)
    assert len(running_of_key(stack, "k")) == 1


def test_an_unsure_run_counted_external_and_adopted_in_one_tick_never_passes_max(session):
    """MAX 2. e1 of k redriven; the tick's reconciliation marks k UNSURE and counts e1 external
    (caps MAX - 1), and its admission adopts e1 for n2 of k (a slot too): e1 is counted twice in
    that tick. a, b, c of other keys wait in the queue: never more than 2 RUNNING, and a tick
    later (e1 held, no longer external) the second slot is used."""
    stack = new_stack(session, max_concurrency=2)
    e1, ended_at = ended_run(stack, "k")
    stack.clock.advance(10)
    redrive(stack, e1)
    stack.clock.advance(5)
    stack.send({"id": "k", "n": 2}, group="k")
    for other in ("a", "b", "c"):
        stack.send({"id": other}, group=other)
    rt = stack.runtime()
    described = stale_describe(rt.client("stepfunctions"), e1, status="FAILED", stop=ended_at)
    rt.launcher().tick()
    assert described["described"] == 1
    store = stack.runtime().store()
    assert len(stack.running()) <= 2, stack.running()
    assert store.payload("k").holder == e1
    for _ in range(2):
        stack.clock.advance(61)
        stack.launcher().tick()
        assert len(stack.running()) <= 2, stack.running()
    assert len(stack.running()) == 2, f"MAX 2 with e1 running: {stack.running()}"
    assert len(running_of_key(stack, "k")) == 1


def test_a_hand_over_to_a_message_of_a_marked_key_does_not_start_beside_the_run(session):
    """MAX 2: h of key j holds one slot; e1 of k redriven, marked UNSURE and counted external (the
    other). n2 of k waits in the queue. h ends: its completion hands the freed slot to n2, whose
    lease item is refused by the mark; n2 is claimed its own way, adopts e1 and waits. Only e1
    runs of k, and MAX holds."""
    stack = new_stack(session, max_concurrency=2)
    e1, ended_at = ended_run(stack, "k")
    stack.send({"id": "j"}, group="j")
    stack.launcher().tick(reconcile_first=False)
    (h,) = running_of_key(stack, "j")
    stack.clock.advance(10)
    redrive(stack, e1)
    stack.clock.advance(5)
    unsure_mark_by_stale_describe(stack, e1, ended_at)
    store = stack.runtime().store()
    assert store.payload("k").redriven == e1

    stack.send({"id": "k", "n": 2}, group="k")
    event = stack.finish(h, "SUCCEEDED")
    released, _, _ = stack.launcher().on_status_change(StatusChange.from_event(event))
    assert released
    assert running_of_key(stack, "k") == [e1]
    assert len(stack.running()) <= 2
    assert store.payload("k").holder == e1


def test_a_waiter_on_a_marked_key_is_not_dead_lettered_while_its_run_runs_again(session):
    """e1 of k FAILED, released; redriven 10 s later; a tick marks k UNSURE (stale describe). W
    awaits k (no run-anyway). The gate read k free and ended FAILED, and W was dead-lettered while
    e1 ran again and then SUCCEEDED (before the fix: a young redriven mark now holds the verdict,
    so W waits, as it would for an adopted run, and runs)."""
    stack = new_stack(session)
    e1, _ended_at, store = redriven_and_marked(stack)

    stack.send({"id": "w"}, group="w", sluice_awaits='["k"]')
    stack.launcher().tick(reconcile_first=False)
    assert stack.running() == [e1]  # k's redriven run runs, marked on its free key
    early = stack.dlq_messages()
    if early:  # dead-lettered now, while e1 runs: for the reason "k ended FAILED"
        reasons = [str(m.get("MessageAttributes", {})) for m in early]
        assert all("awaited k ended FAILED" in r for r in reasons), reasons
    event = stack.finish(e1, "SUCCEEDED", output="{}")
    stack.launcher().on_status_change(StatusChange.from_event(event))
    for _ in range(2):
        stack.clock.advance(61)
        stack.launcher().tick()
    dead = early + stack.dlq_messages()
    assert store.payload("k").succeeded_by == e1
    assert dead == [], f"W dead-lettered while k ran again: {[m['Body'] for m in dead]}"


def test_a_mark_and_an_adoption_by_two_reconcilers_leave_nothing_behind(session):
    """e1 of k redriven. Reconciler A (on time, within the window of e1's end, stale describe)
    marks k UNSURE; reconciler B, whose clock reads 70 s ahead, reads the end as past the window
    and adopts e1: the adoption takes the mark away with the lease. e1 ends, its event releases
    it: k is free and unmarked, and its next message starts at once."""
    stack = new_stack(session)
    e1, ended_at, store = redriven_and_marked(stack)

    fast = skewed(stack, 70)
    described = stale_describe(fast.client("stepfunctions"), e1, status="FAILED", stop=ended_at)
    fast.launcher().tick()
    assert described["described"] == 1
    payload = store.payload("k")
    assert payload.holder == e1 and payload.redriven is None and store.ledger().holders == {e1}

    assert deliver(stack, stack.finish(e1, "FAILED", error="Again"))
    payload = store.payload("k")
    assert payload.holder is None and payload.redriven is None and not payload.redriven_more
    stack.send({"id": "k", "n": 2}, group="b")
    stack.launcher().tick(reconcile_first=False)
    (n2,) = running_of_key(stack, "k")
    assert n2 != e1 and store.ledger().holders == {n2}


def test_a_run_once_key_whose_failed_run_is_marked_runs_its_next_once_message(session):
    """A run-once e1 of k FAILED, released; the listing's lag marks k. A run-once message of k in
    the mark's window adopts e1 (dead) and waits; reconciliation releases e1 a window later on its
    fresh FAILED, and the run-once message starts: the key is not blocked for good."""
    stack = new_stack(session)
    stack.send({"id": "k", "n": 1}, group="a", sluice_once="true")
    stack.launcher().tick()
    (e1,) = stack.running()
    assert deliver(stack, stack.finish(e1, "FAILED", error="Boom"))
    stack.clock.advance(5)
    unsure_mark_by_stale_listing(stack, e1)
    store = stack.runtime().store()
    assert store.payload("k").redriven == e1

    stack.clock.advance(5)
    stack.send({"id": "k", "n": 2}, group="b", sluice_once="true")
    stack.launcher().tick()
    assert stack.running() == [] and stack.queue_counts() == (0, 0)
    for _ in range(3):
        stack.clock.advance(61)
        stack.launcher().tick()
    (n2,) = running_of_key(stack, "k")
    assert n2 != e1 and store.payload("k").redriven is None


def test_two_leftover_marks_on_one_free_key_cost_windows_not_the_key(session):
    """e1 and e2 of k both FAILED and were released seconds apart; one listing, behind both ends,
    shows both RUNNING: k is marked by e1 and (``redriven_more``) by e2, neither adopted. n3 of k:
    adopts e1 (dead), waits, is woken by e1's release; then finds e2's mark, whose window the
    release's write restarted, adopts e2 and waits again; woken by e2's release, it starts. Two
    windows and two slots for a while, but k is not blocked for good and never runs twice."""
    stack = new_stack(session)
    e1, _ = ended_run(stack, "k", group="a")
    stack.send({"id": "k", "n": 2}, group="b")
    stack.launcher().tick(reconcile_first=False)
    (e2,) = running_of_key(stack, "k")
    assert deliver(stack, stack.finish(e2, "FAILED", error="Boom"))
    stack.clock.advance(5)
    rt = stack.runtime()
    first, second = (
        stale_listing(rt.client("stepfunctions"), e1),
        stale_listing(rt.client("stepfunctions"), e2),
    )
    rt.launcher().tick()
    assert first["listed"] == 1 and second["listed"] == 1
    store = stack.runtime().store()
    payload = store.payload("k")
    assert {payload.redriven, *payload.redriven_more} == {e1, e2} and payload.holder is None

    stack.clock.advance(5)
    stack.send({"id": "k", "n": 3}, group="c")
    stack.launcher().tick()
    assert stack.running() == []
    for _ in range(6):
        stack.clock.advance(61)
        stack.launcher().tick()
        assert len(running_of_key(stack, "k")) <= 1
    (n3,) = running_of_key(stack, "k")
    assert n3 not in (e1, e2)
    payload = store.payload("k")
    assert payload.holder == n3 and payload.redriven is None and not payload.redriven_more
    assert store.ledger().holders == {n3}

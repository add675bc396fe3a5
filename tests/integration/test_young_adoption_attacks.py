"""Attacks on the young adoption rule (``completion.young_adoption``, ``redriven.ran_again``'s new
end, ``MessageBranches._still_runs``), on moto with the real adapters.

Verdicts (the young adoption is two consistency windows, ``OTHER_CLOCK_WINDOWS``, since attack 3):

1. HOLDS, two windows of delay. An adopted run ends while its adoption is young; its only event
   comes then (twice), and is ignored. The key's next message parks behind it, another key waits
   under MAX 1. The first tick past two windows releases it, wakes the parked message; one run at
   a time starts (MAX 1 kept), nothing leaks. Same after an hour with no tick at all.
2. HOLDS, a delay of two windows from its first sighting. A reconciler whose clock runs 50 s
   behind the adopter's records its own sighting of the adoption (125 s after it) and releases the
   ended adopted run two windows later by its own clock (246 s after the adoption).
3. BROKE (promise 2) with a young adoption of one window; holds with two. A judge whose clock
   runs ahead of the adopter's (a completion with a late event, a reconciliation, or the
   duplicate check of the key's next message) read a young adoption as the window old: an end
   between two redrives that Sluice never recorded, confirmed by a DescribeExecution as stale as
   the bound allows, released the adopted run while it ran again, and the key's next message
   started beside it. 50 s ahead broke 10 s after the adoption; 6 s ahead, 54.5 s after it. The
   rule measured one window by another container's clock, as the marks do not (``MARK_WINDOWS``).
   Two windows still broke for a judge an hour ahead (explorer seed 629934866); a clock now
   judges an adoption from its own first sighting only (``Clock.identity``): the three judges an
   hour ahead hold.
4. HOLDS, a delay. An unrecorded end within the window by a stale listing: UNSURE, the key
   marked; a run-once message of the key adopts the ended run and waits behind it; past the
   young adoption it is released, and the message runs (once).
5. HOLDS. A young adopted run that SUCCEEDED unheard is released by the duplicate check (a
   success is believed at once); a run-once message of its key never runs.
6. HOLDS, two windows of delay. Adopted, ended young (ignored), redriven again and ended again
   young (its last event ignored): the tick past two windows releases it; the key's message,
   sent back for its second look meanwhile, starts then.
7. HOLDS. Paused (MAX 0): reconciliation still releases the ended adopted run past the young
   adoption; nothing starts until resumed, then the parked message of its key starts.
8. HOLDS. An UNSURE mark left alone for an hour holds nothing back: the key's next message
   starts at once (the mark, two windows old, is lifted).
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from moto.core import DEFAULT_ACCOUNT_ID
from moto.stepfunctions.models import stepfunctions_backends

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from tests.integration.test_breaker_findings import redrive, running_of_key
from tests.integration.test_free_key_mark_attacks import skewed
from tests.support.aws import REGION, build_stack, status_change_event
from tests.support.hooks import receipts_of


def at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def finish_at(stack, name: str, status: str, *, error: str | None = "Boom") -> dict[str, Any]:
    """``stack.finish`` with the stop date of the stack's (fake) clock, as Step Functions would."""
    stack.finish(name, status, error=error)
    arn = stack.runtime().store().execution(name).arn
    execution = stepfunctions_backends[DEFAULT_ACCOUNT_ID][REGION].describe_execution(arn)
    execution.stop_date = at(stack.clock.now())
    return status_change_event(
        execution.state_machine_arn, name, status, error=error, stop=execution.stop_date
    )


def settle(rt, event) -> bool:
    """The completion function's path (DescribeExecution asked, hand-over offered)."""
    released, _, _ = rt.launcher().on_status_change(StatusChange.from_event(event))
    return released


def first_run_released(stack) -> str:
    stack.send({"id": "k", "n": 1}, group="a")
    stack.launcher().tick()
    (e1,) = stack.running()
    assert settle(stack.runtime(), finish_at(stack, e1, "FAILED"))
    assert stack.runtime().store().payload("k").holder is None
    return e1


def adopted_then_ended_young(stack, clock) -> str:
    e1 = first_run_released(stack)
    clock.advance(1_000)
    redrive(stack, e1)
    stack.launcher().tick()
    store = stack.runtime().store()
    assert store.payload("k").holder == e1 and store.ledger().holders == {e1}  # adopted
    clock.advance(10)
    event = finish_at(stack, e1, "FAILED")  # the redriven run ends, within the window
    assert not settle(stack.runtime(), event)  # its only event: young, not believed
    assert not settle(stack.runtime(), event)  # repeated, then lost for good
    assert store.ledger().holders == {e1}
    return e1


@pytest.mark.parametrize("gap", [115, 3_600], ids=["next-tick", "an-hour-without-ticks"])
def test_an_adopted_run_ended_young_is_released_past_the_window_and_wakes_its_waiters(session, gap):
    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=1, clock=clock)
    e1 = adopted_then_ended_young(stack, clock)
    store = stack.runtime().store()

    stack.send({"id": "k", "n": 2}, group="b")  # the key's next message
    stack.send({"id": "x"}, group="c")  # another key, under MAX 1
    stack.launcher().tick()
    assert stack.running() == [] and store.ledger().holders == {e1}  # parked / waiting

    clock.advance(gap)  # the adoption is now past the window
    started: list[str] = []
    for _ in range(6):
        stack.launcher().tick()
        now_running = stack.running()
        assert len(now_running) <= 1, f"MAX 1 but {now_running} run"
        assert store.ledger().holders == set(now_running)
        for name in now_running:
            started.append(store.execution(name).key)
            settle(stack.runtime(), finish_at(stack, name, "SUCCEEDED", error=None))
        clock.advance(61)
    assert sorted(started) == ["k", "x"], started
    assert store.ledger().holders == frozenset() and store.payload("k").holder is None
    assert stack.queue_counts() == (0, 0) and stack.dlq_messages() == []


def test_a_reconciler_behind_the_adopter_releases_it_two_windows_after_it_first_saw_it(session):
    """A reconciler 50 s behind the adopter judges no stamp of the adopter's clock: it records its
    own first sighting of the adoption, and releases the ended run two windows after it by its own
    clock."""
    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=1, clock=clock)
    e1 = adopted_then_ended_young(stack, clock)  # adopted 10 s ago by the stack's clock
    store = stack.runtime().store()
    behind = skewed(stack, -50)

    clock.advance(115)
    behind.clock.advance(115)  # 125 s after the adoption: its first sighting
    behind.launcher().tick()
    assert store.ledger().holders == {e1}
    assert store.execution(e1).seen_by(behind.clock.identity) == behind.clock.now()
    clock.advance(119)
    behind.clock.advance(119)  # 119 s after its sighting: young still (two windows)
    behind.launcher().tick()
    assert store.ledger().holders == {e1}
    clock.advance(2)
    behind.clock.advance(2)  # 121 s after it
    behind.launcher().tick()
    assert store.ledger().holders == frozenset()
    assert store.payload("k").holder is None


def adopted_between_two_redrives(stack, clock) -> tuple[str, dict[str, Any], float, float]:
    """e1 released; redriven (r1); FAILED at s2 (its event late); redriven again (r2); adopted on
    a DescribeExecution answer from between r1 and s2 (RUNNING, redriveDate r1). Returns e1, the
    late event, r1 and s2."""
    e1 = first_run_released(stack)
    clock.advance(1_000)
    r1 = clock.now()
    redrive(stack, e1)
    clock.advance(30)
    late = finish_at(stack, e1, "FAILED")  # s2: its event is late
    s2 = clock.now()
    clock.advance(5)
    redrive(stack, e1)  # r2
    clock.advance(5)
    seen: Counter = Counter()

    def adopting_answer(parsed: dict[str, Any], **_: Any) -> None:  # 10 to 40 s stale
        if seen["adopting"] == 0 and parsed.get("name") == e1:
            seen["adopting"] += 1
            parsed["status"] = "RUNNING"
            parsed.pop("stopDate", None)
            parsed["redriveCount"], parsed["redriveDate"] = 1, at(r1)

    rt = stack.runtime()
    rt.client("stepfunctions").meta.events.register("after-call.sfn.DescribeExecution", adopting_answer)
    rt.launcher().tick()
    assert seen["adopting"] == 1
    assert rt.store().payload("k").holder == e1  # adopted at t1+40: redriven_at r1
    return e1, late, r1, s2


def stale_between(rt, e1: str, r1: float, s2: float) -> Counter:
    """The judge's Step Functions answers as of just after s2 (before r2), 15 to 20 s stale:
    DescribeExecution FAILED at s2, ListExecutions without e1. Once each."""
    seen: Counter = Counter()

    def describe(parsed: dict[str, Any], **_: Any) -> None:
        if seen["described"] == 0 and parsed.get("name") == e1:
            seen["described"] += 1
            parsed["status"], parsed["stopDate"] = "FAILED", at(s2)
            parsed["error"], parsed["cause"] = "Boom", "Boom cause"
            parsed["redriveCount"], parsed["redriveDate"] = 1, at(r1)

    def listing(parsed: dict[str, Any], **_: Any) -> None:
        if seen["listed"] == 0 and any(e["name"] == e1 for e in parsed.get("executions", [])):
            seen["listed"] += 1
            parsed["executions"] = [e for e in parsed["executions"] if e["name"] != e1]

    rt.client("stepfunctions").meta.events.register("after-call.sfn.DescribeExecution", describe)
    rt.client("stepfunctions").meta.events.register("after-call.sfn.ListExecutions", listing)
    return seen


@pytest.mark.parametrize(
    ("judge", "skew", "wait"),
    [
        pytest.param("completion", 0, 10, id="completion-same-clock"),
        pytest.param("reconciliation", 0, 10, id="reconciliation-same-clock"),
        pytest.param("completion", 50, 10, id="completion-50s-ahead"),
        pytest.param("reconciliation", 50, 10, id="reconciliation-50s-ahead"),
        pytest.param("duplicate-check", 0, 10, id="duplicate-check-same-clock"),
        pytest.param("duplicate-check", 50, 10, id="duplicate-check-50s-ahead"),
        # 54.5 s after the adoption (59.5 after r2), an answer from just before r2 is 59.8 s old:
        # a judge 6 s ahead reads the adoption 60.5 s old
        pytest.param("completion", 0, 54.5, id="completion-same-clock-late"),
        pytest.param("completion", 6, 54.5, id="completion-6s-ahead-late"),
        # an hour ahead, past any window by another clock: the adoption is judged by its own only
        pytest.param("completion", 3600, 10, id="completion-an-hour-ahead"),
        pytest.param("reconciliation", 3600, 10, id="reconciliation-an-hour-ahead"),
        pytest.param("duplicate-check", 3600, 10, id="duplicate-check-an-hour-ahead"),
    ],
)
def test_a_judge_ahead_of_the_adopter_believes_a_stale_end_of_a_young_adoption(session, judge, skew, wait):
    """
        t1     e1 redriven (r1)
        t1+30  e1 FAILED at s2, its event late; t1+35 redriven again (r2)
        t1+40  tick (stack clock): listed RUNNING, DescribeExecution RUNNING with redriveDate r1
               (an answer from t1+20, 20 s stale) → adopt(e1): redriven_at r1
        t1+50  a judge (completion with the late FAILED s2 event, a reconciliation, or the
               duplicate check of the key's next message), clock
               +50 (reads t1+100): the adoption reads 60 s old → not young; DescribeExecution
               FAILED s2 (an answer from t1+32, 18 s stale), s2 after r1 → e1 released while it runs
        t1+51  the key's next message: claim ✓ → k runs twice (promise 2)
    Same clock: the adoption reads 10 s old → the end is not believed; holds.
    """
    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=3, clock=clock)
    e1, late, r1, s2 = adopted_between_two_redrives(stack, clock)
    store = stack.runtime().store()

    clock.advance(wait)
    judging = skewed(stack, skew)
    stale = stale_between(judging, e1, r1, s2)
    if judge == "completion":
        settle(judging, late)
        assert stale["described"] == 0  # young: never asked
    elif judge == "reconciliation":
        judging.launcher().tick()
        assert stale["listed"] == 1
        assert stale["described"] == 0  # young: not judged (an hour ahead: taken over, young again)
    else:  # the claim of the key's next message, by a launcher that does not reconcile
        stack.send({"id": "k", "n": 2}, group="b")
        judging.launcher().tick(reconcile_first=False)
        assert stale["described"] == 1  # its holder's answer: FAILED at s2
    assert running_of_key(stack, "k") == [e1]  # e1 runs (its second redrive)

    if judge != "duplicate-check":
        stack.send({"id": "k", "n": 2}, group="b")
        stack.launcher().tick(reconcile_first=False)
    assert running_of_key(stack, "k") == [e1], f"k runs {running_of_key(stack, 'k')}"
    assert store.payload("k").holder == e1


def test_an_unsure_new_end_marks_the_key_and_a_run_once_message_runs_past_the_window(session):
    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=3, clock=clock)
    e1 = first_run_released(stack)
    clock.advance(1_000)
    redrive(stack, e1)
    clock.advance(20)
    finish_at(stack, e1, "FAILED")  # s2, unrecorded: its event lost
    clock.advance(5)

    listed: Counter = Counter()

    def listing(parsed: dict[str, Any], **_: Any) -> None:  # 5 s behind s2
        if listed["listed"] == 0 and not any(e["name"] == e1 for e in parsed.get("executions", [])):
            listed["listed"] += 1
            parsed.setdefault("executions", []).append({"name": e1, "status": "RUNNING"})

    rt = stack.runtime()
    rt.client("stepfunctions").meta.events.register("after-call.sfn.ListExecutions", listing)
    rt.launcher().tick()
    store = rt.store()
    assert listed["listed"] == 1
    assert store.payload("k").redriven == e1 and store.payload("k").holder is None  # UNSURE: marked

    stack.send({"id": "k", "n": 2}, group="b", sluice_once="true")
    stack.launcher().tick()
    assert running_of_key(stack, "k") == []  # waits behind e1 (adopted, or the mark)
    for _ in range(4):
        clock.advance(61)
        stack.launcher().tick()
    (n2,) = running_of_key(stack, "k")
    assert n2 != e1 and store.ledger().holders == {n2}
    assert stack.queue_counts() == (0, 0) and stack.dlq_messages() == []


def test_a_young_adopted_run_that_succeeded_unheard_is_released_and_a_run_once_message_never_runs(session):
    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=3, clock=clock)
    e1 = first_run_released(stack)
    clock.advance(1_000)
    redrive(stack, e1)
    stack.launcher().tick()
    store = stack.runtime().store()
    assert store.payload("k").holder == e1  # adopted
    clock.advance(10)
    finish_at(stack, e1, "SUCCEEDED", error=None)  # its event lost

    stack.send({"id": "k", "n": 2}, group="b", sluice_once="true")
    for _ in range(3):
        stack.launcher().tick()
        assert running_of_key(stack, "k") == []
        clock.advance(61)
    assert store.ledger().holders == frozenset() and store.payload("k").holder is None
    assert store.execution(e1).state.value == "SUCCEEDED"
    assert running_of_key(stack, "k") == [] and stack.queue_counts() == (0, 0)


def test_a_young_adopted_run_redriven_again_within_the_window_keeps_its_key_then_is_released(session):
    """adopt(e1) at t; FAILED at t+10 (event ignored); redriven again at t+20; FAILED at t+30, its
    event ignored (young), the last one. The tick at t+125 must see e1's end (not listed) and free it;
    a tick at t+25 (e1 running again, adoption young) must not free it."""
    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=3, clock=clock)
    e1 = adopted_then_ended_young(stack, clock)
    store = stack.runtime().store()
    clock.advance(10)
    redrive(stack, e1)
    clock.advance(5)
    stack.send({"id": "k", "n": 2}, group="b")
    rt = stack.runtime()
    receipts = receipts_of(rt.client("sqs"))
    rt.launcher().tick()  # a first look behind a running holder: back for the window
    assert running_of_key(stack, "k") == [e1] and store.payload("k").holder == e1
    clock.advance(5)
    assert not settle(stack.runtime(), finish_at(stack, e1, "FAILED"))  # young: ignored
    clock.advance(95)  # t+125: two windows
    stack.launcher().tick()
    assert store.ledger().holders == frozenset() and store.payload("k").holder is None
    assert stack.queue_counts() == (0, 1)  # the message, in flight for its second look
    stack.visible_again(receipts)  # the window of its recheck ends (moto's runs in real time)
    stack.launcher().tick()
    (n2,) = running_of_key(stack, "k")
    assert n2 != e1 and store.ledger().holders == {n2}


def set_max(stack, value: int) -> None:
    stack.session.client("ssm", region_name=REGION).put_parameter(
        Name=stack.settings.max_parameter, Value=str(value), Type="String", Overwrite=True
    )


def test_a_paused_stack_still_releases_a_young_adopted_run_past_the_window(session):
    """Paused (MAX 0) while an adopted run that ended young holds its slot: the ticks past the
    window still reconcile and release it; nothing starts while paused; resumed, the parked message
    of its key starts."""
    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=1, clock=clock)
    e1 = adopted_then_ended_young(stack, clock)
    store = stack.runtime().store()
    stack.send({"id": "k", "n": 2}, group="b")
    set_max(stack, 0)
    stack.launcher().tick()
    assert store.ledger().holders == {e1}
    clock.advance(115)
    stack.launcher().tick()
    assert store.ledger().holders == frozenset() and stack.running() == []
    set_max(stack, 1)
    clock.advance(61)
    stack.launcher().tick()
    (n2,) = running_of_key(stack, "k")
    assert n2 != e1 and store.ledger().holders == {n2}


def test_an_unsure_mark_left_alone_for_an_hour_holds_nothing_back(session):
    """UNSURE on an unrecorded end (a stale listing 5 s after it); no message of the key for an
    hour; then one: the mark is two windows old, lifted, and the message starts at once."""
    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=3, clock=clock)
    e1 = first_run_released(stack)
    clock.advance(1_000)
    redrive(stack, e1)
    clock.advance(20)
    finish_at(stack, e1, "FAILED")  # its event lost
    clock.advance(5)
    listed: Counter = Counter()

    def listing(parsed: dict[str, Any], **_: Any) -> None:
        if listed["listed"] == 0 and not any(e["name"] == e1 for e in parsed.get("executions", [])):
            listed["listed"] += 1
            parsed.setdefault("executions", []).append({"name": e1, "status": "RUNNING"})

    rt = stack.runtime()
    rt.client("stepfunctions").meta.events.register("after-call.sfn.ListExecutions", listing)
    rt.launcher().tick()
    store = rt.store()
    assert listed["listed"] == 1 and store.payload("k").redriven == e1
    for _ in range(60):  # an hour of ticks, every answer fresh
        clock.advance(60)
        stack.launcher().tick()
    stack.send({"id": "k", "n": 2}, group="b")
    stack.launcher().tick()
    (n2,) = running_of_key(stack, "k")
    assert n2 != e1 and store.ledger().holders == {n2}


@pytest.mark.parametrize("judge", ["completion", "reconciliation", "duplicate-check"])
def test_an_adoption_judged_by_any_clock_is_caught(session, monkeypatch, judge):
    """The variant ``adoption_judged_by_any_clock`` (tests/explorer/broken.py, the code before
    explorer seed 629934866's fix: two windows, by whatever clock judged) fails attack 3 for each
    judge an hour ahead: the judge asks DescribeExecution, or the key runs twice."""
    from tests.explorer.broken import VARIANTS

    for owner, attr, value in VARIANTS["adoption_judged_by_any_clock"][1]:
        monkeypatch.setattr(owner, attr, value)
    with pytest.raises(AssertionError):
        test_a_judge_ahead_of_the_adopter_believes_a_stale_end_of_a_young_adoption(session, judge, 3600, 10)


def test_a_duplicate_check_that_read_an_end_before_a_redrive_and_its_adoption_releases_nothing(session):
    """Explorer seed 1206301599 (a long swarm run; the code of a453497 failed it the same way).
    e1 of key k FAILED, its event not yet applied; m2, another message of k, arrives.

        tick A                               meanwhile
        claim m2: refused (e1 holds k)
        DescribeExecution(e1): FAILED
                                             e1's event releases it; the operator redrives e1;
                                             a reconciliation adopts e1 (RUNNING again)
        settle e1 as ended → released ✗     (an end from before the redrive, of a young adoption)
        claim m2 ✓, start: two runs of k

    The settle re-judges the end against the record its release reads: an adopted run's end from
    before its redrive, or any end but a success within the window of its adoption, releases
    nothing (``MessageBranches._holder_ended``), and m2 waits behind e1."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=5, clock=clock)
    stack.send({"id": "k", "n": 1}, group="a")
    stack.launcher().tick()
    (e1,) = stack.running()
    clock.advance(5)
    event = finish_at(stack, e1, "FAILED")  # its event on the way
    clock.advance(5)
    stack.send({"id": "k", "n": 2}, group="b")
    fired: list[str] = []

    def redriven_and_adopted(**kwargs: Any) -> None:
        if fired or kwargs.get("model").name != "DescribeExecution":
            return
        fired.append("described")
        assert settle(stack.runtime(), event)  # released on its event
        redrive(stack, e1)
        stack.launcher().tick()  # another launcher's reconciliation adopts it
        assert stack.runtime().store().payload("k").holder == e1
        fired.append("adopted")

    a = stack.runtime()
    a.client("stepfunctions").meta.events.register("after-call.sfn.DescribeExecution", redriven_and_adopted)
    a.launcher().tick()
    assert fired == ["described", "adopted"]
    assert running_of_key(stack, "k") == [e1]  # m2 did not start beside the redriven e1
    assert stack.runtime().store().payload("k").holder == e1


def _release_of(params: dict[str, Any], name: str) -> bool:
    return any(
        (u := i.get("Update"))
        and u["Key"]["pk"]["S"] == f"EXEC#{name}"
        and "ended_at" in u["UpdateExpression"]
        for i in params.get("TransactItems", [])
    )


def test_an_adoption_between_the_releases_read_and_its_write_is_not_released(session, monkeypatch):
    """A helper's attack on the fix above: the adoption lands after the release read e1's record
    (not adopted: nothing to judge again) and before its transaction, on e1's old slot shard, so
    the slot, the lease and the record's state all still read as e1's::

        tick A                                   meanwhile
        claim m2 of k: refused (e1 holds k); DescribeExecution(e1): FAILED
        release(e1): reads EXEC#e1, not adopted
                                                 e1 released on its event; redriven; adopted
        TransactWriteItems: released ✗          → m2 claimed and started beside e1

    The release's record condition holds the adoption as read (``NOT_ADOPTED``): refused, it reads
    again, and the end is judged against the adopted record."""
    import sluice.adapters.dynamo.slots as dynamo_slots

    clock = FakeClock()
    stack = build_stack(session, max_concurrency=5, clock=clock)
    stack.send({"id": "k", "n": 1}, group="a")
    stack.launcher().tick()
    (e1,) = stack.running()
    old_shard = stack.runtime().store().execution(e1).shard
    clock.advance(5)
    event = finish_at(stack, e1, "FAILED")  # its event on the way
    clock.advance(5)
    stack.send({"id": "k", "n": 2}, group="b")
    fired: list[str] = []
    real = dynamo_slots.candidates

    def adopted_before_the_write(**kwargs: Any) -> None:
        if fired or not _release_of(kwargs["params"], e1):
            return
        fired.append("release write")
        assert settle(stack.runtime(), event)  # released on its event
        redrive(stack, e1)
        # the adoption's shard pick lands on e1's old shard (about one in the shards, unforced)
        monkeypatch.setattr(
            dynamo_slots,
            "candidates",
            lambda view, rng: sorted(real(view, rng), key=lambda s: s != old_shard),
        )
        stack.launcher().tick()  # another launcher's reconciliation adopts it
        monkeypatch.setattr(dynamo_slots, "candidates", real)
        adopted = stack.runtime().store().execution(e1)
        assert adopted.adopted_at is not None and adopted.shard == old_shard
        fired.append("adopted")

    a = stack.runtime()
    a.client("dynamodb").meta.events.register(
        "before-parameter-build.dynamodb.TransactWriteItems", adopted_before_the_write
    )
    a.launcher().tick()
    assert fired == ["release write", "adopted"]
    assert running_of_key(stack, "k") == [e1]
    assert stack.runtime().store().payload("k").holder == e1


def test_a_settle_that_does_not_judge_the_end_again_is_caught(session, monkeypatch):
    """The variant ``settle_unconfirmed`` (tests/explorer/broken.py) fails the test above."""
    from tests.explorer.broken import VARIANTS

    for owner, attr, value in VARIANTS["settle_unconfirmed"][1]:
        monkeypatch.setattr(owner, attr, value)
    with pytest.raises(AssertionError, match="Left contains one more item"):
        test_a_duplicate_check_that_read_an_end_before_a_redrive_and_its_adoption_releases_nothing(session)


def test_a_release_that_does_not_hold_the_adoption_as_read_is_caught(session, monkeypatch):
    """The variant ``release_ignores_adoption`` (tests/explorer/broken.py) fails the test above."""
    from tests.explorer.broken import VARIANTS

    for owner, attr, value in VARIANTS["release_ignores_adoption"][1]:
        monkeypatch.setattr(owner, attr, value)
    with pytest.raises(AssertionError, match="Left contains one more item"):
        test_an_adoption_between_the_releases_read_and_its_write_is_not_released(session, monkeypatch)

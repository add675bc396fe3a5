"""A reviewer's attacks on rate limits (docs/protocol.md, "Rate limits"; promise 8), on moto with the
real adapters: for each scope with rate N per period P, at most N grants (and so StartExecution
calls, by the shared FakeClock) in any window [t, t + P), whatever races and crashes; a payload a
rate holds is never received; starts resume when the window has room.

Each StartExecution is timed by an after-call hook on the runtime's Step Functions client. The
first four broke promise 8 when written (a hand-over's grant given back while its message started
its own way; a resumed claim's start not counted; a launcher whose clock ran ahead pruning the
grants of one behind; a lengthened period forgetting what the old one pruned); fixed, they pass.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import Outcome
from sluice.features.rate_limits import STACK, Rate, RateDefaults, lane_scope
from sluice.runtime import Runtime
from tests.contract.slots_fixtures import in_threads
from tests.reliability.actors import SkewedClock
from tests.support.aws import NO_RETRY, build_stack
from tests.support.hooks import Crash, crash_before, receipts_of, throttle
from tests.support.moto_patches import atomic_fast_moto


def timed_starts(rt: Runtime, clock: Any, times: list[float]) -> list[float]:
    """Append ``clock.now()`` to ``times`` at each StartExecution ``rt`` makes."""

    def hook(http_response: Any, **_: Any) -> None:
        if http_response.status_code < 300:
            times.append(clock.now())

    rt.client("stepfunctions").meta.events.register("after-call.sfn.StartExecution", hook)
    return times


def busiest_window(times: list[float], period: float) -> int:
    """The most of ``times`` in one window [t, t + period), in whole milliseconds as the rate book
    counts a grant's time (``int(now * 1000)``): in floats, two grants one period apart on a skewed
    clock (6,599 ms and 7,599 ms) can read 0.9999997 s apart."""
    ordered = sorted(int(t * 1000) for t in times)
    span = round(period * 1000)
    return max((sum(1 for u in ordered if t <= u < t + span) for t in ordered), default=0)


def completion(stack: Any, name: str, rt: Runtime | None = None) -> Any:
    event = stack.finish(name)
    return (rt or stack.runtime()).launcher().on_status_change(StatusChange.from_event(event))


def test_hand_over_of_a_successor_claimed_its_own_way_starts_on_the_hand_overs_grant(session):
    """Rate 2/minute, no lanes, MAX 5.

    t=0    A sent; tick: A started (grant 1 of 2).
    t=1    B sent, its body with a \\u escape (not plain: a hand-over cannot claim it in the release).
           A ends; its completion's hand-over takes a grant (2 of 2), receives B, cannot hand it the
           slot; B is claimed its own way and STARTED, on that grant (found breaking: the grant
           was given back, and C started too: three in [0, 60)).
    t=2    C sent; tick: no room: C waits.
    """
    clock = FakeClock()
    stack = build_stack(session, clock=clock, rates=RateDefaults(stack=Rate(2, 60)))
    times: list[float] = []
    rt = stack.runtime()
    timed_starts(rt, clock, times)
    stack.send({"n": "A"}, group="a")
    assert rt.launcher().tick().n(Outcome.STARTED) == 1
    (a,) = stack.running()

    clock.advance(1)
    stack.send('{"n": "B \\u00e9"}', group="b")
    released, refill, _ = completion(stack, a, rt)
    assert released and refill is not None

    clock.advance(1)
    stack.send({"n": "C"}, group="c")
    rt.launcher().tick()

    assert refill.received == 1 and refill.n(Outcome.STARTED) == 1  # B, by the hand-over's receive
    assert len(stack.executions()) == len(times) == 2
    assert busiest_window(times, 60) <= 2, f"starts at {[t - times[0] for t in times]}"


def test_a_resumed_claim_spends_its_rounds_grant(session):
    """Rate 1/minute, MAX 5.

    t=0    A sent; a launcher takes the grant, receives A, claims it, dies before StartExecution
           (the grant stays spent at t=0: fewer starts, as promised).
    t=61   A visible again; B sent. A tick: grant 1 of 1, receives A, resumes its claim and
           STARTS it (RESUMED, filled 0): the grant is given back; the next round takes it again,
           receives B and starts B. Two StartExecutions at t=61 at 1/minute.
    """
    clock = FakeClock()
    stack = build_stack(session, clock=clock, rates=RateDefaults(stack=Rate(1, 60)))
    dying = stack.runtime()
    receipts = receipts_of(dying.client("sqs"))
    crash_before(dying.client("stepfunctions"), "StartExecution")
    stack.send({"n": "A"}, group="a")
    with pytest.raises(Crash):
        dying.launcher().tick()
    assert len(receipts) == 1 and stack.executions() == []  # the fault fired: claimed, not started

    clock.advance(61)
    stack.visible_again(receipts)
    stack.send({"n": "B"}, group="b")
    times: list[float] = []
    rt = stack.runtime()
    timed_starts(rt, clock, times)
    summary = rt.launcher().tick()

    assert summary.n(Outcome.RESUMED) == 1  # A, by its own claim
    assert busiest_window(times, 60) <= 1, f"{len(times)} starts at t=61: {summary.outcomes}"


def test_a_launcher_ahead_keeps_the_grants_of_one_behind(session):
    """Rate 2/minute; launcher A on the shared clock, launcher B 30 s ahead of it.

    t=0    (A: 0)   A1, A2 sent; A ticks: 2 grants at A-time 0, both started.
    t=31   (B: 61)  B ticks on an empty queue: its window (1, 61] has room, it takes 2 grants and
                    gives them back; that write drops every grant at or before B-time 1: A's two.
    t=32   (A: 32)  A3, A4 sent; A ticks: its window is empty, 2 grants at A-time 32, started.
    A's own clock saw 4 grants in [0, 60) at 2/minute (and AWS 4 starts in 32 s).
    """
    clock = FakeClock()
    stack = build_stack(session, clock=clock, rates=RateDefaults(stack=Rate(2, 60)), max_concurrency=10)
    a = stack.runtime()
    times: list[float] = []
    timed_starts(a, clock, times)  # A's clock is the shared one
    b = Runtime(stack.settings, session=stack.session, clock=SkewedClock(clock, 30), client_config=NO_RETRY)
    b_receipts = receipts_of(b.client("sqs"))

    for i in (1, 2):
        stack.send({"n": f"A{i}"}, group=f"g{i}")
    assert a.launcher().tick().n(Outcome.STARTED) == 2

    clock.advance(31)
    assert b.launcher().tick().n(Outcome.STARTED) == 0 and b_receipts == []
    assert b.rates().status([STACK], clock.now() + 30)[0].in_window == 0  # B gave its grants back

    clock.advance(1)
    for i in (3, 4):
        stack.send({"n": f"A{i}"}, group=f"g{i}")
    a.launcher().tick()

    assert busiest_window(times, 60) <= 2, f"A's starts at {[t - times[0] for t in times]}"


def test_a_lengthened_period_counts_the_grants_of_the_last_minute(session):
    """Rate 5/second, MAX 20.

    t=0    5 sent; tick: 5 started.
    t=1.2  a tick on an empty queue takes 5 grants and gives them back: the write prunes t=0.
    t=1.5  `set-rate stack 5/minute`.
    t=2    5 sent; tick: the minute's window reads empty: 5 more started, 10 in [0, 60).
    (Without the empty tick at 1.2 the t=0 grants are still in the book and hold the minute.)
    """
    clock = FakeClock()
    stack = build_stack(session, clock=clock, rates=RateDefaults(stack=Rate(5, 1)), max_concurrency=20)
    rt = stack.runtime()
    times: list[float] = []
    timed_starts(rt, clock, times)
    for i in range(5):
        stack.send({"n": i}, group=f"g{i}")
    assert rt.launcher().tick().n(Outcome.STARTED) == 5

    clock.advance(1.2)
    assert rt.launcher().tick().stopped == "empty"

    clock.advance(0.3)
    rt.rates().set(STACK, Rate(5, 60))
    clock.advance(0.5)
    for i in range(5, 10):
        stack.send({"n": i}, group=f"g{i}")
    rt.launcher().tick()

    assert busiest_window(times, 60) <= 5, f"{len(times)} starts in [0, 60) at 5/minute"


@pytest.mark.slow
def test_launchers_and_completions_racing_keep_the_rate(session):
    """Rate 3/second, MAX 20, 24 payloads in their own groups.

    Every 0.25 s: three launchers tick and every running execution's completion is handled, all
    in threads at once (moto serialised); a quarter of the runs end each round. Over 12 s at most 3
    StartExecutions in any 1-s window, every payload started, nothing dead-lettered.
    """
    clock = FakeClock()
    stack = build_stack(session, clock=clock, rates=RateDefaults(stack=Rate(3, 1)), max_concurrency=20)
    for i in range(24):
        stack.send({"n": i}, group=f"g{i}")
    times: list[float] = []

    def actor(jobs: list[Any]) -> Any:
        def work(i: int) -> Any:
            kind, arg = jobs[i]
            rt = stack.runtime()
            timed_starts(rt, clock, times)
            if kind == "tick":
                return rt.launcher().tick()
            return rt.launcher().on_status_change(StatusChange.from_event(arg))

        return work

    for _ in range(48):
        running = stack.running()
        events = (
            [("done", stack.finish(name)) for name in running[: max(1, len(running) // 4)]] if running else []
        )
        jobs = [("tick", None)] * 3 + events
        with atomic_fast_moto():
            in_threads(len(jobs), actor(jobs))
        clock.advance(0.25)
        if len(stack.executions()) == 24:
            break

    assert len(stack.executions()) == len(times) == 24
    assert busiest_window(times, 1) <= 3, sorted(t - times[0] for t in times)
    assert stack.dlq_messages() == []


def test_a_payload_held_by_the_rate_is_never_received_and_starts_later(session):
    """Rate 2/minute, MAX 10, maxReceiveCount 1 (a second receive would dead-letter a payload).

    t=0    5 sent; tick: 2 received and started, stopped by the rate.
    t=1, t=30, t=59.9: ticks and a completion's hand-over: nothing received, 3 left visible.
    t=60   tick: 2 more; t=120: the last. 5 receives in all, starts at 0,0,60,60,120, DLQ empty.
    """
    clock = FakeClock()
    stack = build_stack(
        session, clock=clock, rates=RateDefaults(stack=Rate(2, 60)), max_concurrency=10, max_receive_count=1
    )
    rt = stack.runtime()
    receipts = receipts_of(rt.client("sqs"))
    times: list[float] = []
    timed_starts(rt, clock, times)
    for i in range(5):
        stack.send({"n": i}, group=f"g{i}")
    first = rt.launcher().tick()
    assert first.n(Outcome.STARTED) == 2 and first.stopped == "rate"
    t0 = clock.now()

    for at in (1, 30, 59.9):
        clock.t = t0 + at
        assert rt.launcher().tick().stopped == "rate"
    released, _, _ = completion(stack, stack.running()[0], rt)
    assert released
    assert len(receipts) == 2 and stack.queue_counts() == (3, 0)

    clock.t = t0 + 60
    assert rt.launcher().tick().n(Outcome.STARTED) == 2
    clock.t = t0 + 120
    assert rt.launcher().tick().n(Outcome.STARTED) == 1
    assert len(receipts) == 5 and stack.queue_counts() == (0, 0)
    assert [t - t0 for t in times] == [0, 0, 60, 60, 120]
    assert stack.dlq_messages() == []


def test_a_throttled_rate_book_receives_nothing_and_a_crashed_grant_stays_spent(session):
    """Rate 3/minute, MAX 10.

    t=0    4 sent; a launcher whose PutItem is throttled: no grant, no receive, no start.
    t=1    a launcher dies right after the grant's PutItem (3 grants written): no receive.
    t=2    a tick: the window is full of the dead launcher's grants: nothing received.
    t=62   a tick: 3 started; t=122: the last. No message received before its start.
    """
    clock = FakeClock()
    stack = build_stack(session, clock=clock, rates=RateDefaults(stack=Rate(3, 60)), max_concurrency=10)
    for i in range(4):
        stack.send({"n": i}, group=f"g{i}")

    throttled = stack.runtime()
    fired = throttle(throttled.client("dynamodb"), "PutItem")
    seen = receipts_of(throttled.client("sqs"))
    assert throttled.launcher().tick().n(Outcome.STARTED) == 0
    assert fired["throttled"] >= 1 and seen == [] and stack.executions() == []

    clock.advance(1)
    dying = stack.runtime()
    seen_dying = receipts_of(dying.client("sqs"))
    crashed = {"n": 0, "rates": 0}

    def aim(params: Any, **_: Any) -> None:
        crashed["rates"] = int("RATES" in str(params))

    def die(http_response: Any, **_: Any) -> None:
        if http_response.status_code < 300 and crashed["rates"]:
            crashed["n"] += 1
            raise Crash("after the grant")

    dying.client("dynamodb").meta.events.register("before-call.dynamodb.PutItem", aim)
    dying.client("dynamodb").meta.events.register("after-call.dynamodb.PutItem", die)
    with pytest.raises(Crash):
        dying.launcher().tick()
    assert crashed["n"] == 1 and seen_dying == []

    rt = stack.runtime()
    times: list[float] = []
    timed_starts(rt, clock, times)
    receipts = receipts_of(rt.client("sqs"))
    clock.advance(1)
    assert rt.launcher().tick().stopped == "rate" and receipts == []
    clock.advance(60)
    assert rt.launcher().tick().n(Outcome.STARTED) == 3
    clock.advance(60)
    assert rt.launcher().tick().n(Outcome.STARTED) == 1
    assert len(receipts) == 4 and stack.queue_counts() == (0, 0)


def test_a_lane_rate_holds_across_ticks_and_lane_refills(session):
    """Lanes gpu (cap 5, priority 1) and default (cap 5); gpu at 2/second, the stack unlimited.

    t=0     6 gpu and 4 default payloads; tick: 2 gpu (the rate) and 4 default started.
    t=0.5   both gpu runs end: their refills start no gpu payload (rate full) and receive none.
    t=1..3  ticks: 2 gpu a second, until all 6 ran. At most 2 gpu starts in any 1-s window.
    """
    clock = FakeClock()
    stack = build_stack(
        session,
        clock=clock,
        max_concurrency=10,
        lanes="gpu:5:1,default:5:0",
        rates=RateDefaults(lanes={"gpu": Rate(2, 1)}),
    )
    rt = stack.runtime()
    arns: list[tuple[float, str]] = []

    def hook(http_response: Any, parsed: Any, **_: Any) -> None:
        if http_response.status_code < 300:
            arns.append((clock.now(), parsed["executionArn"]))

    rt.client("stepfunctions").meta.events.register("after-call.sfn.StartExecution", hook)
    for i in range(6):
        stack.send({"lane": "gpu", "n": i}, group=f"g{i}", lane="gpu")
    for i in range(4):
        stack.send({"lane": "default", "n": i}, group=f"d{i}")
    rt.launcher().tick()
    assert len(arns) == 6

    clock.advance(0.5)
    sfn = stack.client("stepfunctions")

    def lane_of(arn: str) -> str:
        return json.loads(sfn.describe_execution(executionArn=arn)["input"])["lane"]

    for _, arn in list(arns):
        if lane_of(arn) == "gpu":
            completion(stack, arn.rsplit(":", 1)[1], rt)
    for _ in range(4):
        clock.advance(1)
        rt.launcher().tick()

    gpu = [t for t, arn in arns if lane_of(arn) == "gpu"]
    assert len(gpu) == 6
    assert busiest_window(gpu, 1) <= 2, sorted(t - gpu[0] for t in gpu)
    assert rt.rates().status([lane_scope("gpu")], clock.now())[0].rate == Rate(2, 1)


def test_a_lingering_tick_waits_for_the_rate_and_starts_the_backlog(session):
    """Rate 2/minute, MAX 10, the scheduled tick lingering 120 s (its sleep moves the fake clock).

    t=0    5 sent; one tick: 2 started; the rate is full: it sleeps to t=60, 2 more, sleeps to
           t=120, the last. Five receives, starts at 0,0,60,60,120, the tick's naps 60 and 60.
    """
    clock = FakeClock()
    stack = build_stack(
        session, clock=clock, rates=RateDefaults(stack=Rate(2, 60)), max_concurrency=10, linger_seconds=120
    )
    rt = stack.runtime()
    receipts = receipts_of(rt.client("sqs"))
    times: list[float] = []
    timed_starts(rt, clock, times)
    for i in range(5):
        stack.send({"n": i}, group=f"g{i}")
    t0 = clock.now()
    summary = rt.launcher().tick()

    assert summary.n(Outcome.STARTED) == 5
    assert [t - t0 for t in times] == [0, 0, 60, 60, 120]
    assert len(receipts) == 5 and stack.queue_counts() == (0, 0)
    assert [n for n in stack.naps if n > 0] == [60, 60]

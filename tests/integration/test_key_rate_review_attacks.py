"""A reviewer's attacks on the rate per concurrency key (``keyRateLimit``, ``sluice set-rate --key``;
docs/protocol.md promise 8), on moto with the real adapters.

For each key with rate N per period P: at most N grants in any window [t, t + P) of the granting
clock, across launchers and completions, whatever crashes; every start of a keyed message under a key
rate has a grant; a message the rate holds waits in the key's line (never repeatedly received, never
towards the DLQ) and starts once the rate has room; other keys and unkeyed messages go on.

Each StartExecution is timed by botocore hooks on the runtime's Step Functions client, by the clock of
the runtime that made it (with the fake clock, no time passes between a grant and its start). Faults
are botocore ``before-call``/``after-call`` hooks only.

Four broke the promise when written (1: a key spelt ``lane:x`` escaped its rate; 2: a clock ahead
pruned grants a clock behind still counted, past 32 entries; 3: ``set-rate --key`` dying between its
two writes left the status and the launchers disagreeing; 10: a fair lane's slot given to a tenant
its rate held, holding up another); fixed, they pass.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections import Counter
from typing import Any

import pytest

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import Outcome
from sluice.features.rate_limits import Rate, RateDefaults, key_scope
from sluice.runtime import Runtime
from tests.contract.slots_fixtures import in_threads
from tests.reliability.actors import SkewedClock
from tests.support.aws import NO_RETRY, build_stack
from tests.support.hooks import Crash, count_calls, error_answer, receipts_of
from tests.support.moto_patches import atomic_fast_moto

Starts = list[tuple[float, str]]  # (the starting runtime's clock, the execution's name)


def timed_starts(rt: Runtime, clock: Any, starts: Starts, *, step: float = 0.0) -> Starts:
    """Append (``clock.now()``, name) to ``starts`` at each StartExecution ``rt`` makes that AWS
    accepted; ``step``: the shared fake clock moves on that far before each call (so that the grants
    of one batch fall on distinct milliseconds)."""

    def name_of(params: Any, context: Any, **_: Any) -> None:
        context["sluice_review_name"] = params["name"]

    def before(**_: Any) -> None:
        if step:
            base = getattr(clock, "base", clock)
            base.advance(step)

    def after(http_response: Any, context: Any, **_: Any) -> None:
        if http_response.status_code < 300:
            starts.append((clock.now(), context.get("sluice_review_name", "?")))

    events = rt.client("stepfunctions").meta.events
    events.register("provide-client-params.states.StartExecution", name_of)
    events.register("before-call.sfn.StartExecution", before)
    events.register("after-call.sfn.StartExecution", after)
    return starts


def of_key(starts: Starts, letter: str) -> list[float]:
    """The start times of the payloads whose id (so whose execution name) begins with ``letter``."""
    return sorted(t for t, name in starts if name.startswith(letter))


def busiest_window(times: list[float], period: float) -> int:
    """The most of ``times`` in one window [t, t + period), in whole milliseconds as the rate book
    counts a grant's time (``int(now * 1000)``): in floats, two grants one period apart on a skewed
    clock (6,599 ms and 7,599 ms) can read 0.9999997 s apart."""
    ordered = sorted(int(t * 1000) for t in times)
    span = round(period * 1000)
    return max((sum(1 for u in ordered if t <= u < t + span) for t in ordered), default=0)


def waiters(stack: Any) -> list[str]:
    items = stack.client("dynamodb").scan(TableName=stack.settings.table_name)["Items"]
    return sorted(i["pk"]["S"] for i in items if i["pk"]["S"].startswith("KWAIT#"))


def visible_again(stack: Any, receipts: list[str]) -> None:
    """Messages a dead launcher received become visible again (those it deleted are gone)."""
    sqs = stack.client("sqs")
    for receipt in receipts:
        with contextlib.suppress(Exception):
            sqs.change_message_visibility(
                QueueUrl=stack.settings.queue_url, ReceiptHandle=receipt, VisibilityTimeout=0
            )


# -- 1. a key spelt like a fair lane's tenant -----------------------------------------------------


def test_a_key_spelt_lane_colon_is_held_by_the_key_rate(session):
    """keyRateLimit 1/minute, key cap 10, MAX 20, no lanes at all.

    t=0    a0..a2 under key "a", x0..x2 under key "lane:x" (a valid concurrency key: check_key takes
           any text without control characters); one tick.
    Key "a": 1 start, 2 parked. Key "lane:x" has the same rate (RateDefaults.key is every key's), so
    1 start is the promise. Found: the key scope took any key beginning with "lane:" for a fair
    lane's unkeyed tenant and gave it no rate: all three started at t=0. Every line key now has its
    key's rate (a fair lane's messages without a key: ``lane:<name>``'s).
    """
    clock = FakeClock()
    stack = build_stack(
        session, max_concurrency=20, clock=clock, key_concurrency=10, rates=RateDefaults(key=Rate(1, 60))
    )
    rt = stack.runtime()
    starts = timed_starts(rt, clock, [])
    for i in range(3):
        stack.send({"id": f"a{i}"}, group=f"a{i}", sluice_concurrency_key="a")
        stack.send({"id": f"x{i}"}, group=f"x{i}", sluice_concurrency_key="lane:x")
    rt.launcher().tick()

    assert len(of_key(starts, "a")) == 1  # the control: key "a" is held
    assert busiest_window(of_key(starts, "x"), 60) <= 1, (
        f"key 'lane:x' at 1/minute started {len(of_key(starts, 'x'))} payloads at t=0 with no grant "
        f"(its book: {rt.rates().status([key_scope('lane:x')], clock.now())})"
    )


# -- 2. a clock ahead prunes what a clock behind still counts (N > KEPT_PAST) ----------------------


def test_a_clock_ahead_keeps_every_grant_of_one_behind_at_40_a_minute(session):
    """keyRateLimit 40/minute, key cap 100, MAX 100. Launcher A on the shared clock, B 120 s ahead.

    t≈0..0.2 (A)  40 payloads of key "a": A starts all 40, each grant on its own millisecond
                  (the fake clock moves 5 ms per start): the book holds 40 entries.
    t≈0.2 (B: 120.2)  one more "a" payload; B's window (60.2, 120.2] is empty: B grants it (right,
                  by B's clock). Its write prunes the entries past B's period to the latest
                  KEPT_PAST = 32: 8 of A's grants, still in A's window, are erased.
    t≈0.3 (A)     10 more "a" payloads; A's window shows 32: A grants 8 more: 48 grants in
                  [0, 60) of A's clock at 40/minute. Fixed: a write keeps the latest N past
                  entries (32 to 1,000: here 40), and what it still drops is kept as spans of
                  time that no window may reach.
    """
    clock = FakeClock()
    stack = build_stack(
        session,
        max_concurrency=100,
        clock=clock,
        key_concurrency=100,
        rates=RateDefaults(key=Rate(40, 60)),
    )
    a = stack.runtime()
    a_starts = timed_starts(a, clock, [], step=0.005)
    for i in range(40):
        stack.send({"id": f"a{i}"}, group=f"g{i}", sluice_concurrency_key="a")
    for _ in range(6):
        a.launcher().tick()
    assert len(a_starts) == 40 and busiest_window([t for t, _ in a_starts], 60) == 40

    b = Runtime(stack.settings, session=stack.session, clock=SkewedClock(clock, 120), client_config=NO_RETRY)
    b_starts = timed_starts(b, SkewedClock(clock, 120), [])
    stack.send({"id": "aB"}, group="gB", sluice_concurrency_key="a")
    b.launcher().tick()
    assert len(b_starts) == 1  # B's grant, in B's own empty window: the prune fired

    for i in range(10):
        stack.send({"id": f"aL{i}"}, group=f"l{i}", sluice_concurrency_key="a")
    a.launcher().tick()

    a_times = [t for t, _ in a_starts]
    assert busiest_window(a_times, 60) <= 40, (
        f"A's clock granted {busiest_window(a_times, 60)} starts of key 'a' in [0, 60) at 40/minute "
        f"({len(a_times) - 40} after B's grant pruned A's entries)"
    )


# -- 3. set-rate --key that died between its two writes --------------------------------------------


def test_a_key_rate_the_status_shows_holds_after_set_rate_died_between_its_writes(session):
    """No keyRateLimit. `sluice set-rate 1/minute --key a` writes the copy in the stack's book
    (RATES) and the key's book (RATES#key:a); it dies between the two (a Lambda/CLI killed, or the
    second PutItem throttled past retries). What `status` shows is what the launchers do.

    Found when the key's book was written first: the status said 1/minute while the launchers,
    reading only the stack's copy, started three "a" payloads at once. The copy now comes first
    when a rate is set (last when one is lifted): here the key's book was not written, the status
    shows no rate and the launchers start all three; the command run again holds from then on.
    """
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=20, clock=clock, key_concurrency=10)
    operator = stack.runtime()
    fired = Counter()

    def die_after_first_rates_put(http_response: Any, **_: Any) -> None:
        if http_response.status_code < 300 and not fired["crash"]:
            fired["crash"] += 1
            raise Crash("set-rate stopped after its first write")

    operator.client("dynamodb").meta.events.register("after-call.dynamodb.PutItem", die_after_first_rates_put)
    with pytest.raises(Crash):
        operator.rates().set(key_scope("a"), Rate(1, 60))
    assert fired["crash"] == 1

    clock.advance(10)
    rt = stack.runtime()
    starts = timed_starts(rt, clock, [])
    for i in range(3):
        stack.send({"id": f"a{i}"}, group=f"a{i}", sluice_concurrency_key="a")
    rt.launcher().tick()
    (status,) = rt.rates().status([key_scope("a")], clock.now())
    if status.rate is not None:
        assert busiest_window(of_key(starts, "a"), 60) <= 1, f"{len(starts)} starts under {status.rate}"
    else:
        assert len(of_key(starts, "a")) == 3

    stack.runtime().rates().set(key_scope("a"), Rate(1, 60))  # run again: both writes land
    clock.advance(10)
    for i in range(3, 6):
        stack.send({"id": f"a{i}"}, group=f"a{i}", sluice_concurrency_key="a")
    rt.launcher().tick()
    later = [t for t in of_key(starts, "a") if t >= clock.now() - 1]
    (status,) = rt.rates().status([key_scope("a")], clock.now())
    assert status.rate == Rate(1, 60) and len(later) == 1


# -- 4. launchers with skewed clocks and completions, racing ---------------------------------------


@pytest.mark.slow
def test_skewed_launchers_and_completions_racing_keep_each_keys_rate_and_start_all(session):
    """keyRateLimit 2/second, key cap 20, MAX 40; keys "a" and "b" (12 each) and 4 unkeyed "u".

    Every round (the shared clock +0.2..0.8 s): launcher L0 (shared clock), L1 (+0.4 s) and L2
    (-0.3 s) tick, and a completion (by a runtime on the shared clock) ends a random run, all in
    threads at once. Every grant, on its own granting clock: at most 2 of a key in any 1-s window.
    Then plain ticks until idle: everything started, queue, DLQ and lines empty.
    """
    clock = FakeClock()
    stack = build_stack(
        session, max_concurrency=40, clock=clock, key_concurrency=20, rates=RateDefaults(key=Rate(2, 1))
    )
    for i in range(12):
        stack.send({"id": f"a{i}"}, group=f"g{i % 5}", sluice_concurrency_key="a")
        stack.send({"id": f"b{i}"}, group=f"h{i % 5}", sluice_concurrency_key="b")
    for i in range(4):
        stack.send({"id": f"u{i}"}, group=f"u{i}")
    starts: Starts = []
    lock, rng = threading.Lock(), random.Random(11)
    skews = [0.0, 0.4, -0.3]
    runtimes = []
    for skew in skews:
        own = SkewedClock(clock, skew)
        rt = Runtime(stack.settings, session=stack.session, clock=own, client_config=NO_RETRY)
        timed_starts(rt, own, starts)
        runtimes.append(rt)
    finisher = stack.runtime()
    timed_starts(finisher, clock, starts)

    def act(i: int) -> None:
        if i < 3:
            runtimes[i].launcher().tick()
            return
        with lock:
            running = stack.running()
            event = stack.finish(running[rng.randrange(len(running))]) if running else None
        if event is not None:
            finisher.launcher().on_status_change(StatusChange.from_event(event))

    with atomic_fast_moto():
        for _ in range(25):
            clock.advance(rng.choice([0.2, 0.35, 0.5, 0.8]))
            in_threads(4, act)
    for _ in range(20):
        clock.advance(1)
        rt = stack.runtime()
        timed_starts(rt, clock, starts)
        rt.launcher().tick()
        if len(stack.executions()) == 28 and not waiters(stack) and stack.queue_counts() == (0, 0):
            break

    for key in "ab":
        assert busiest_window(of_key(starts, key), 1.0) <= 2, (key, of_key(starts, key))
    left = waiters(stack)
    assert len(stack.executions()) == len(starts) == 28, (
        len(starts),
        stack.queue_counts(),
        left,
        [stack.runtime().store().key_state(k) for k in "ab"],
    )
    assert stack.dlq_messages() == []
    assert (stack.queue_counts(), left) == ((0, 0), []), (
        stack.runtime().store().key_state(left[0][6:7] if left else "a")
    )


# -- 5. a held message waits in its line, costs nothing, and starts; others go on -----------------


def test_held_messages_wait_in_the_line_without_receives_and_start_one_a_minute(session):
    """keyRateLimit 1/minute, key cap 10, MAX 20, maxReceiveCount 1 (a second receive of one SQS
    message dead-letters it).

    t=0     a0..a3 (key a), b0 b1 (key b), u0 u1 (unkeyed); tick: a0, b0, u0, u1 start; 3+1 park.
    t=1,10 (a0's completion and its hand-over), 30, 59.9: ticks: nothing received, nothing sent
            back, no start; each a handful of calls.
    t=60    a1 and b1; t=120 a2; t=180 a3. DLQ, queue and lines empty.
    """
    clock = FakeClock()
    stack = build_stack(
        session,
        max_concurrency=20,
        clock=clock,
        key_concurrency=10,
        max_receive_count=1,
        rates=RateDefaults(key=Rate(1, 60)),
    )
    rt = stack.runtime()
    starts = timed_starts(rt, clock, [])
    receipts = receipts_of(rt.client("sqs"))
    for i in range(4):
        stack.send({"id": f"a{i}"}, group=f"a{i}", sluice_concurrency_key="a")
    for i in range(2):
        stack.send({"id": f"b{i}"}, group=f"b{i}", sluice_concurrency_key="b")
        stack.send({"id": f"u{i}"}, group=f"u{i}")
    t0 = clock.now()
    first = rt.launcher().tick()
    assert first.n(Outcome.STARTED) == 4 and first.n(Outcome.KEY_WAITING) == 4
    assert sorted(n[:2] for _, n in starts) == ["a0", "b0", "u0", "u1"]

    calls = count_calls(rt.client("sqs"), rt.client("dynamodb"), rt.client("stepfunctions"))
    before = len(receipts)
    for at in (1, 10, 30, 59.9):
        clock.t = t0 + at
        if at == 10:
            a0 = next(n for n in stack.running() if n.startswith("a0"))
            rt.launcher().on_status_change(StatusChange.from_event(stack.finish(a0)))
        rt.launcher().tick()
    assert len(receipts) == before and calls["SendMessage"] == 0 and calls["StartExecution"] == 0
    assert calls["ReceiveMessage"] <= 8, calls  # an empty receive per tick or refill, no loop
    assert sum(calls.values()) < 80, calls

    for at in (60, 120, 180):
        clock.t = t0 + at
        rt.launcher().tick()
    assert [t - t0 for t in of_key(starts, "a")] == [0, 60, 120, 180]
    assert [t - t0 for t in of_key(starts, "b")] == [0, 60]
    assert stack.dlq_messages() == [] and stack.queue_counts() == (0, 0) and waiters(stack) == []


# -- 6. a paused key and run-time rate changes while messages wait -------------------------------


def test_a_paused_key_and_rate_changes_at_run_time_while_messages_wait(session):
    """keyRateLimit 1/minute, key cap 10.

    t=0    a0..a4; tick: a0 starts, 4 park.
    t=5    key a paused (cap 0); t=60: tick: nothing (paused, though the rate has room).
    t=61   cap back to the default; tick: a1 (the rate: one).
    t=62   set-rate none --key a; tick: a2, a3, a4 (no rate: no grants taken).
    t=63   set-rate default --key a; a5 sent; tick: the window holds a1 (61): a5 waits.
    t=121  tick: a5 starts. Nothing in the DLQ or left in the line.
    """
    clock = FakeClock()
    stack = build_stack(
        session, max_concurrency=20, clock=clock, key_concurrency=10, rates=RateDefaults(key=Rate(1, 60))
    )
    starts: Starts = []

    def tick() -> Any:
        rt = stack.runtime()
        timed_starts(rt, clock, starts)
        return rt.launcher().tick()

    t0 = clock.now()
    for i in range(5):
        stack.send({"id": f"a{i}"}, group=f"a{i}", sluice_concurrency_key="a")
    assert tick().n(Outcome.STARTED) == 1

    clock.t = t0 + 5
    stack.runtime().store().set_key_cap("a", 0)
    clock.t = t0 + 60
    tick()
    assert len(starts) == 1 and stack.queue_counts() == (0, 0)

    clock.t = t0 + 61
    stack.runtime().store().set_key_cap("a", None)
    tick()
    clock.t = t0 + 62
    stack.runtime().rates().set(key_scope("a"), "none")
    tick()
    assert [t - t0 for t in of_key(starts, "a")] == [0, 61, 62, 62, 62]

    clock.t = t0 + 63
    stack.runtime().rates().set(key_scope("a"), None)
    stack.send({"id": "a5"}, group="a5", sluice_concurrency_key="a")
    tick()
    assert len(starts) == 5
    clock.t = t0 + 121
    tick()
    assert [t - t0 for t in of_key(starts, "a")] == [0, 61, 62, 62, 62, 121]
    assert stack.dlq_messages() == [] and stack.queue_counts() == (0, 0) and waiters(stack) == []


# -- 7. forged attributes and duplicates ---------------------------------------------------------


def test_forged_tickets_origins_and_duplicates_take_no_grant_they_do_not_use(session):
    """keyRateLimit 1/minute, key cap 10, MAX 20.

    t=0    a0; a1 with a forged ``sluice-key-ticket`` 0@0; a2 with 99@99999999999999 (a far-future
           send time); a0 again (a duplicate, new message id); a3 forging a0's
           ``sluice-origin-message-id`` (a0's execution name). One tick: one start only.
    t=60 ... 360: ticks (a message sent back for a second look visible again at each). a1 and a2 start one a minute, the copies of a0 never again; the
           rate is kept at every step; nothing left in the queue or the lines.
    """
    clock = FakeClock()
    stack = build_stack(
        session, max_concurrency=20, clock=clock, key_concurrency=10, rates=RateDefaults(key=Rate(1, 60))
    )
    starts: Starts = []
    receipts: list[str] = []

    def tick() -> Any:
        visible_again(stack, receipts)  # a minute passed: a message sent back for a second look returns
        rt = stack.runtime()
        timed_starts(rt, clock, starts)
        rt.client("sqs").meta.events.register(
            "after-call.sqs.ReceiveMessage",
            lambda parsed, **_: receipts.extend(m["ReceiptHandle"] for m in parsed.get("Messages", [])),
        )
        return rt.launcher().tick()

    t0 = clock.now()
    a0_id = stack.send({"id": "a0"}, group="a0", sluice_concurrency_key="a")
    tick()
    stack.send({"id": "a1"}, group="a1", sluice_concurrency_key="a", sluice_key_ticket="0@0")
    stack.send({"id": "a2"}, group="a2", sluice_concurrency_key="a", sluice_key_ticket="99@99999999999999")
    stack.send({"id": "a0"}, group="a0", sluice_concurrency_key="a")
    stack.send({"id": "a0"}, group="a0x", sluice_concurrency_key="a", sluice_origin_message_id=a0_id)
    tick()
    assert len(starts) == 1, starts
    for minute in (1, 2, 3, 4, 5, 6):
        clock.t = t0 + 60 * minute
        tick()
    times = of_key(starts, "a")
    assert busiest_window(times, 60) <= 1, [t - t0 for t in times]
    assert sorted(n[:2] for _, n in starts) == ["a0", "a1", "a2"]
    assert stack.queue_counts() == (0, 0) and waiters(stack) == []


# -- 8. a throttled key book ---------------------------------------------------------------------


def test_a_throttled_key_book_parks_its_messages_and_holds_up_nobody_else(session):
    """keyRateLimit 1/minute, key cap 10, MAX 20, maxReceiveCount 1.

    t=0    a0..a2, b0, u0. A launcher whose every read of RATES#key:a is throttled: b0 and u0 start,
           a0..a2 wait in a's line (unsure of the room: none taken), not in the queue.
    t=1    a healthy tick: a0; t=61: a1; t=121: a2. The rate held, nothing dead-lettered.
    """
    clock = FakeClock()
    stack = build_stack(
        session,
        max_concurrency=20,
        clock=clock,
        key_concurrency=10,
        max_receive_count=1,
        rates=RateDefaults(key=Rate(1, 60)),
    )
    sick = stack.runtime()
    starts = timed_starts(sick, clock, [])
    fired = Counter()

    def throttle_key_book(params: Any, **_: Any) -> Any:
        if "RATES#key:a" in str(params):
            fired["throttled"] += 1
            return error_answer("ProvisionedThroughputExceededException", 400)
        return None

    sick.client("dynamodb").meta.events.register("before-call.dynamodb.GetItem", throttle_key_book)
    for i in range(3):
        stack.send({"id": f"a{i}"}, group=f"a{i}", sluice_concurrency_key="a")
    stack.send({"id": "b0"}, group="b0", sluice_concurrency_key="b")
    stack.send({"id": "u0"}, group="u0")
    t0 = clock.now()
    sick.launcher().tick()
    assert fired["throttled"] >= 3
    assert sorted(n[:2] for _, n in starts) == ["b0", "u0"]
    assert stack.queue_counts() == (0, 0) and len(waiters(stack)) == 3

    for at in (1, 61, 121):
        clock.t = t0 + at
        rt = stack.runtime()
        timed_starts(rt, clock, starts)
        rt.launcher().tick()
    assert [t - t0 for t in of_key(starts, "a")] == [1, 61, 121]
    assert stack.dlq_messages() == [] and stack.queue_counts() == (0, 0) and waiters(stack) == []


# -- 9. a crash at every call of a keyed tick ----------------------------------------------------


@pytest.mark.slow
def test_a_crash_at_any_call_of_a_keyed_tick_never_breaks_the_rate_and_all_start(session):
    """keyRateLimit 1/minute, key cap 10, MAX 20. For each call k of a tick that finds a0, a1
    (key a) and u0 (unkeyed) at t=0: a fresh stack, a launcher that dies just before its k-th AWS
    call, then healthy ticks every 61 s (what the dead launcher received visible again). Key a: at
    most 1 StartExecution in any minute; all three payloads start within 6 ticks; queue, DLQ and
    lines empty.
    """
    k = 0
    while True:
        k += 1
        clock = FakeClock()
        stack = build_stack(
            session,
            name=f"crash-{k}",
            max_concurrency=20,
            clock=clock,
            key_concurrency=10,
            rates=RateDefaults(key=Rate(1, 60)),
        )
        stack.send({"id": "a0"}, group="a0", sluice_concurrency_key="a")
        stack.send({"id": "a1"}, group="a1", sluice_concurrency_key="a")
        stack.send({"id": "u0"}, group="u0")
        dying = stack.runtime()
        starts = timed_starts(dying, clock, [])
        receipts = receipts_of(dying.client("sqs"))
        seen = Counter()

        def die(model: Any, _k: int = k, _seen: Counter = seen, **_: Any) -> None:
            _seen["calls"] += 1
            if _seen["calls"] == _k:
                _seen["crashed"] += 1
                raise Crash(f"before call {_k}: {model.name}")

        for service in ("sqs", "dynamodb", "stepfunctions", "ssm"):
            dying.client(service).meta.events.register("before-call.*.*", die)
        with contextlib.suppress(Crash):
            dying.launcher().tick()
        if not seen["crashed"]:
            break  # past the tick's last call: every crash point was tried
        for _ in range(6):
            clock.advance(61)
            visible_again(stack, receipts)
            rt = stack.runtime()
            timed_starts(rt, clock, starts)
            rt.launcher().tick()
            if len({n[:2] for _, n in starts}) == 3 and stack.queue_counts() == (0, 0) and not waiters(stack):
                break  # all three started and nothing is left: later ticks would start nothing
        names = sorted({n[:2] for _, n in starts})
        assert busiest_window(of_key(starts, "a"), 60) <= 1, (k, of_key(starts, "a"))
        assert names == ["a0", "a1", "u0"], (k, names)
        assert stack.queue_counts() == (0, 0) and stack.dlq_messages() == [] and waiters(stack) == [], k
    assert k > 10  # the sweep went past many crash points


# -- 10. a fair lane's tenant held by its rate keeps the lane's free slot from the others -------


def test_a_rate_held_tenant_of_a_fair_lane_does_not_hold_up_another_tenant(session):
    """Lanes shared (MAX 2, fair) and default; MAX 10; tenant (key) A at 1/minute (set at run
    time), tenant B with no rate.

    t=0    A-0 alone: started (A's grant at 0). B-0, B-1: B-0 started (the lane full), B-1 parked.
           A-1 parked.
    t=1    A-0 ends: one slot of the lane free. The lane's waker gives it to A (the fewest runs:
           0 against B's 1); A's wake sends nobody (its rate is full until 60).
    t=2, 30, 59  ticks: the same share each time. B-1, whose key has no rate and whose lane has a
           free slot, is held up by A's rate: it should have started by t=2. Fixed: the waker
           shares the slots within each tenant's rate room.
    """
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=10, clock=clock, lanes="shared:2:0:1:fair,default:4")
    stack.runtime().rates().set(key_scope("A"), Rate(1, 60))
    starts: Starts = []

    def runtime() -> Runtime:
        rt = stack.runtime()
        timed_starts(rt, clock, starts)
        return rt

    def send(tenant: str, i: int) -> None:
        stack.send(
            {"id": f"{tenant}-{i}"}, group=f"{tenant}-{i}", lane="shared", sluice_concurrency_key=tenant
        )

    t0 = clock.now()
    send("A", 0)
    runtime().launcher().tick()
    send("B", 0)
    send("B", 1)
    runtime().launcher().tick()
    send("A", 1)
    runtime().launcher().tick()
    assert sorted(n[:3] for _, n in starts) == ["A-0", "B-0"]

    clock.t = t0 + 1
    a0 = next(n for n in stack.running() if n.startswith("A-0"))
    runtime().launcher().on_status_change(StatusChange.from_event(stack.finish(a0)))
    for at in (2, 30, 59):
        clock.t = t0 + at
        runtime().launcher().tick()
    assert busiest_window(of_key(starts, "A"), 60) <= 1  # A's rate holds
    b1 = [t - t0 for t, n in starts if n.startswith("B-1")]
    assert b1 and b1[0] <= 2, (
        f"B-1 (no rate, a free slot in its lane from t=1) started at {b1 or 'never'} by t=59: "
        f"the lane's waker gave the slot to A, whose rate sent nobody; running {stack.running()}"
    )

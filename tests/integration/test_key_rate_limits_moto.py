"""A concurrency key's rate on moto with the real adapters (``keyRateLimit``, ``sluice set-rate
--key``): at most N starts of the key in any window of the period, what the rate holds waits in
the key's line (never back in the queue), other keys keep starting, each key's book is its own."""

from __future__ import annotations

import random
import threading

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import Outcome
from sluice.features.rate_limits import Rate, RateDefaults, key_scope
from tests.contract.slots_fixtures import in_threads
from tests.integration.test_rate_limits_moto import most_in_any_window
from tests.support.aws import build_stack
from tests.support.hooks import receipts_of
from tests.support.moto_patches import atomic_fast_moto


def keyed_starts(stack, rt) -> dict[str, list[float]]:
    """The clock at each StartExecution the runtime ``rt`` makes, by the payload's concurrency key
    (its id's first letter)."""
    log: dict[str, list[float]] = {}

    def note(params, **_) -> None:
        key = params["name"][0]
        log.setdefault(key, []).append(stack.clock.now())

    rt.client("stepfunctions").meta.events.register("provide-client-params.states.StartExecution", note)
    return log


def long_poll_on(clock: FakeClock, sqs):
    """A long poll on the fake clock (moto's waits in real time): the clock moves by the wait
    asked of a poll of an empty queue; the poll itself returns at once."""

    def hook(params, **_) -> None:
        wait = params.get("WaitTimeSeconds", 0)
        params["WaitTimeSeconds"] = 0
        waiting = sqs.get_queue_attributes(
            QueueUrl=params["QueueUrl"], AttributeNames=["ApproximateNumberOfMessages"]
        )
        if wait and waiting["Attributes"]["ApproximateNumberOfMessages"] == "0":
            clock.advance(wait)

    return hook


def test_a_keys_rate_parks_what_it_holds_and_other_keys_go_on(session):
    stack = build_stack(
        session, max_concurrency=50, clock=FakeClock(), key_concurrency=10, rates=RateDefaults(key=Rate(2, 1))
    )
    for i in range(6):
        stack.send({"id": f"a{i}"}, group=f"a{i}", sluice_concurrency_key="a")
        stack.send({"id": f"b{i}"}, group=f"b{i}", sluice_concurrency_key="b")
    stack.send({"id": "plain"}, group="plain")
    first = stack.launcher().tick()
    assert first.n(Outcome.STARTED) == 5 and first.n(Outcome.KEY_WAITING) == 8
    assert sorted(body["id"][0] for body in stack.inputs()) == ["a", "a", "b", "b", "p"]
    assert stack.queue_counts() == (0, 0), "what a key's rate holds waits in its line, not the queue"
    rt = stack.runtime()
    receipts = receipts_of(rt.client("sqs"))
    assert rt.launcher().tick().n(Outcome.STARTED) == 0 and stack.queue_counts() == (0, 0)
    assert all(r.get("sluice-key-ticket") for r in receipts), "only woken waiters come back"
    stack.clock.advance(1)
    for _ in range(3):
        rt.launcher().tick()  # the sweep wakes each key as its rate has room; the waiters start
    assert len(stack.inputs()) == 9
    assert sorted(body["id"][0] for body in stack.inputs()).count("a") == 4


def test_launchers_racing_never_start_a_third_of_a_key_in_any_second(session):
    stack = build_stack(
        session, max_concurrency=40, clock=FakeClock(), key_concurrency=20, rates=RateDefaults(key=Rate(2, 1))
    )
    for i in range(24):
        key = "ab"[i % 2]
        stack.send({"id": f"{key}{i}"}, group=f"g{i % 8}", sluice_concurrency_key=key)
    runtimes = [stack.runtime() for _ in range(4)]
    logs = [keyed_starts(stack, rt) for rt in runtimes]
    rng, lock = random.Random(7), threading.Lock()

    def act(i: int) -> None:
        launcher = runtimes[i].launcher()
        if i < 2:
            launcher.tick()
            return
        with lock:
            running = stack.running()
            name = running[rng.randrange(len(running))] if running else None
            event = stack.finish(name) if name else None
        if event is not None:
            launcher.on_status_change(StatusChange.from_event(event))

    with atomic_fast_moto():
        for _ in range(30):
            stack.clock.advance(rng.choice([0.2, 0.35, 0.5, 0.8]))
            in_threads(4, act)
    for key in "ab":
        starts = sorted(t for log in logs for t in log.get(key, []))
        assert len(starts) >= 8, f"key {key}: the test should start, not only refuse"
        assert most_in_any_window(starts, 1.0) == 2, key


def test_a_keys_rate_set_at_run_time_holds_it_alone(session):
    stack = build_stack(session, max_concurrency=50, clock=FakeClock(), key_concurrency=10)
    stack.runtime().rates().set(key_scope("a"), Rate(1, 60))
    for i in range(3):
        stack.send({"id": f"a{i}"}, group=f"a{i}", sluice_concurrency_key="a")
        stack.send({"id": f"b{i}"}, group=f"b{i}", sluice_concurrency_key="b")
    summary = stack.launcher().tick()
    assert summary.n(Outcome.STARTED) == 4 and summary.n(Outcome.KEY_WAITING) == 2
    rates = stack.runtime().rates()
    assert rates.keys_set() == [key_scope("a")]
    (a, b) = rates.status([key_scope("a"), key_scope("b")], stack.clock.now())
    assert (a.rate, a.in_window, a.next_due is not None) == (Rate(1, 60), 1, True)
    assert (b.rate, b.in_window) == (None, 0)
    items = {
        i["pk"]["S"] for i in stack.client("dynamodb").scan(TableName=stack.settings.table_name)["Items"]
    }
    assert "RATES#key:a" in items and "RATES#key:b" not in items, "a key without a rate has no book"


def test_a_key_grant_not_used_is_given_back(session):
    """A duplicate of a running payload takes its key's grant, then gives it back."""
    stack = build_stack(
        session,
        max_concurrency=50,
        clock=FakeClock(),
        key_concurrency=10,
        rates=RateDefaults(key=Rate(3, 60)),
    )
    stack.send({"id": "a0"}, group="a0", sluice_concurrency_key="a")
    assert stack.launcher().tick().n(Outcome.STARTED) == 1
    stack.send({"id": "a0"}, group="a0", sluice_concurrency_key="a")  # a second message of a0
    stack.launcher().tick()
    (status,) = stack.runtime().rates().status([key_scope("a")], stack.clock.now())
    assert status.in_window == 1


def test_a_lingering_tick_wakes_what_a_keys_rate_held_when_its_room_comes(session):
    """Key rate 2/minute, the scheduled tick lingering 150 s: 2 of key a start at once, 3 wait in
    its line; the tick wakes the key as its window moves on (its long poll no longer than that)
    and starts them within the same tick, not at the next one's sweep."""
    clock = FakeClock()
    stack = build_stack(
        session,
        clock=clock,
        max_concurrency=10,
        key_concurrency=10,
        linger_seconds=150,
        rates=RateDefaults(key=Rate(2, 60)),
    )
    rt = stack.runtime()
    times = keyed_starts(stack, rt)
    rt.client("sqs").meta.events.register(
        "provide-client-params.sqs.ReceiveMessage", long_poll_on(clock, stack.client("sqs"))
    )
    for i in range(5):
        stack.send({"id": f"a{i}"}, group=f"a{i}", sluice_concurrency_key="a")
    t0 = clock.now()
    summary = rt.launcher().tick()
    assert summary.n(Outcome.STARTED) == 5 and summary.n(Outcome.KEY_WAITING) == 3
    assert [round(t - t0) for t in times["a"]] == [0, 0, 60, 60, 120]

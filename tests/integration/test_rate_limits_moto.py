"""Rate limits on moto with the real adapters (``sluice.features.rate_limits``): at most N starts in
any window of the period, a payload held by a rate never received, launchers and completions
racing, a lane's rate beside the stack's, a rate set at run time, AWS failing."""

from __future__ import annotations

import random
import threading

import pytest

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import Outcome
from sluice.features.rate_limits import STACK, Rate, RateDefaults, lane_scope
from tests.contract.slots_fixtures import in_threads
from tests.support.aws import build_stack
from tests.support.hooks import receipts_of, throttle
from tests.support.moto_patches import atomic_fast_moto


def starts_log(stack, rt) -> list[float]:
    """The clock at each StartExecution the runtime ``rt`` makes."""
    log: list[float] = []
    rt.client("stepfunctions").meta.events.register(
        "after-call.states.StartExecution", lambda **_: log.append(stack.clock.now())
    )
    return log


def most_in_any_window(times: list[float], period: float) -> int:
    return max((sum(1 for u in times if t <= u < t + period) for t in times), default=0)


def test_a_rate_starts_n_a_period_and_never_receives_what_it_holds(session):
    stack = build_stack(session, max_concurrency=50, clock=FakeClock(), rates=RateDefaults(stack=Rate(5, 1)))
    for i in range(30):
        stack.send({"id": f"p{i}"}, group=f"g{i}")
    rt = stack.runtime()
    receipts = receipts_of(rt.client("sqs"))
    first = rt.launcher().tick()
    assert first.n(Outcome.STARTED) == 5 and first.stopped == "rate"
    assert len(receipts) == 5, "a payload the rate holds is never received"
    assert rt.launcher().tick().n(Outcome.STARTED) == 0 and len(receipts) == 5
    stack.clock.advance(0.999)
    assert rt.launcher().tick().n(Outcome.STARTED) == 0
    stack.clock.advance(0.001)
    assert rt.launcher().tick().n(Outcome.STARTED) == 5
    assert len(stack.running()) == 10 and stack.queue_counts() == (20, 0)


def test_launchers_and_completions_racing_never_start_a_sixth_in_any_second(session):
    stack = build_stack(session, max_concurrency=40, clock=FakeClock(), rates=RateDefaults(stack=Rate(5, 1)))
    for i in range(60):
        stack.send({"id": f"p{i}"}, group=f"g{i % 20}")
    runtimes = [stack.runtime() for _ in range(4)]
    logs = [starts_log(stack, rt) for rt in runtimes]
    rng, lock = random.Random(5), threading.Lock()

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
        for _ in range(25):
            stack.clock.advance(rng.choice([0.1, 0.3, 0.45, 0.7]))
            in_threads(4, act)
    starts = sorted(t for log in logs for t in log)
    assert len(starts) >= 30, "the test should start, not only refuse"
    assert most_in_any_window(starts, 1.0) == 5


def test_a_lanes_rate_holds_beside_the_stacks(session):
    stack = build_stack(
        session,
        max_concurrency=20,
        lanes="gpu:10:1,default:10:0",
        clock=FakeClock(),
        rates=RateDefaults(stack=Rate(6, 60), lanes={"gpu": Rate(2, 60)}),
    )
    for i in range(5):
        stack.send({"id": f"g{i}"}, group=f"g{i}", lane="gpu")
        stack.send({"id": f"d{i}"}, group=f"d{i}")
    assert stack.launcher().tick().n(Outcome.STARTED) == 6
    inputs = [body["id"] for body in stack.inputs()]
    assert sum(1 for k in inputs if k.startswith("g")) == 2 and len(inputs) == 6
    rates, now = stack.runtime().rates(), stack.clock.now()
    assert {s.scope: s.in_window for s in rates.status([STACK, lane_scope("gpu")], now)} == {
        STACK: 6,
        lane_scope("gpu"): 2,
    }
    later = {s.scope: s.in_window for s in rates.status([STACK, lane_scope("gpu")], now + 60)}
    assert later == {STACK: 0, lane_scope("gpu"): 0}


def test_a_rate_set_at_run_time_holds_from_the_next_start(session):
    stack = build_stack(session, max_concurrency=20, clock=FakeClock())
    for i in range(8):
        stack.send({"id": f"p{i}"}, group=f"g{i}")
    stack.runtime().rates().set(STACK, Rate(3, 60))
    assert stack.launcher().tick().n(Outcome.STARTED) == 3
    stack.runtime().rates().set(STACK, None)  # the stack's parameter again: none
    stack.clock.advance(6)  # past the launcher's 5 s read of a book with no rate in force
    assert stack.launcher().tick().n(Outcome.STARTED) == 5


def test_a_completion_hands_over_only_with_a_grant(session):
    stack = build_stack(session, max_concurrency=2, clock=FakeClock(), rates=RateDefaults(stack=Rate(2, 60)))
    for i in range(4):
        stack.send({"id": f"p{i}"}, group=f"g{i}")
    assert stack.launcher().tick().n(Outcome.STARTED) == 2
    rt = stack.runtime()
    receipts = receipts_of(rt.client("sqs"))
    released, refill, _ = rt.launcher().on_status_change(
        StatusChange.from_event(stack.finish(stack.running()[0]))
    )
    assert released and refill.n(Outcome.STARTED) == 0 and receipts == []
    stack.clock.advance(60)
    released, refill, _ = rt.launcher().on_status_change(
        StatusChange.from_event(stack.finish(stack.running()[0]))
    )
    assert released and len(stack.running()) == 1 and len(receipts) == 1


def test_a_rate_book_that_cannot_be_written_starts_nothing_and_crashes_nothing(session):
    stack = build_stack(session, max_concurrency=5, clock=FakeClock(), rates=RateDefaults(stack=Rate(5, 1)))
    stack.send({"id": "p"}, group="g")
    rt = stack.runtime()
    puts = throttle(rt.client("dynamodb"), "PutItem")
    summary = rt.launcher().tick()
    assert puts["throttled"] >= 1, "the fault did not fire"
    assert summary.n(Outcome.STARTED) == 0 and stack.queue_counts() == (1, 0)
    assert stack.runtime().launcher().tick().n(Outcome.STARTED) == 1


@pytest.mark.parametrize("raw", ["5/day", "0/second", "5 per second", "1.5/minute", "10001/hour"])
def test_a_rate_that_is_not_one_is_refused_with_its_name(raw):
    from sluice.core.errors import ConfigurationError
    from sluice.launch.settings import Settings

    with pytest.raises(ConfigurationError, match="SLUICE_RATE_LIMIT"):
        Settings.from_env({"SLUICE_RATE_LIMIT": raw})

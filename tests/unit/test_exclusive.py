"""``@exclusive`` and ``exclusive.hold`` on MemoryLeases and a FakeClock: no AWS, no sleeping.
The same behaviour on moto, with threads: tests/integration/test_exclusive_moto.py."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.adapters.memory.lease import MemoryLeases
from sluice.concurrency import Busy, MissingKey, Reentered, StateError, exclusive
from sluice.core.clock import FakeClock
from sluice.core.errors import ConfigurationError
from sluice.primitives.lease import ERROR_MESSAGE_CHARS, LeaseLost
from tests.support.aws import LambdaContext
from tests.support.hooks import Crash

MARGIN = 5.0


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def leases():
    return MemoryLeases(rng=random.Random(0))


def held_by(leases, key, name="orders", limit=1):
    return [item.holder for item in leases.inspect(name, key, limit)]


def make(leases, clock, expression="detail.orderId", **options):
    options.setdefault("name", "orders")
    sleeps: list[float] = []
    options.setdefault("sleep", sleeps.append)
    return exclusive(expression, leases=leases, clock=clock, rng=random.Random(1), **options), sleeps


def event(order="o-1"):
    return {"detail": {"orderId": order}}


def test_a_run_holds_its_key_until_the_lambda_deadline_plus_margin_and_releases(leases, clock):
    seen = []
    guard, _ = make(leases, clock)

    @guard
    def handler(evt, context):
        (item,) = leases.inspect("orders", "o-1")
        seen.append((item.holder, item.expires_at))
        return "done"

    context = LambdaContext(remaining_ms=30_000)
    assert handler(event(), context) == "done"
    assert seen == [(context.aws_request_id, clock.now() + 30 + MARGIN)]
    assert held_by(leases, "o-1") == [None]
    assert handler.__name__ == "handler"


def test_busy_names_the_holder_and_the_function_does_not_run(leases, clock):
    ran = []
    guard, _ = make(leases, clock)
    handler = guard(lambda evt, context: ran.append(1))
    other = exclusive.hold("orders", "o-1", ttl=60, holder="other", leases=leases, clock=clock)
    with other, pytest.raises(Busy) as caught:
        handler(event(), LambdaContext())
    assert (caught.value.key, caught.value.holder, caught.value.until) == (
        "o-1",
        "other",
        clock.now() + 60 + MARGIN,
    )
    assert ran == []
    handler(event(), LambdaContext())  # released when the block ended
    assert ran == [1]


def test_an_exception_releases_the_key_and_propagates(leases, clock):
    guard, _ = make(leases, clock)

    @guard
    def handler(evt, context):
        raise ValueError("bad order")

    with pytest.raises(ValueError, match="bad order"):
        handler(event(), LambdaContext())
    assert held_by(leases, "o-1") == [None]


def test_a_timeout_leaves_the_key_held_until_its_expiry_then_it_is_taken_over(leases, clock):
    guard, _ = make(leases, clock)
    crash = [True]

    @guard
    def handler(evt, context):
        if crash.pop():
            raise Crash("Task timed out after 10.00 seconds")  # not an Exception: nothing runs after it
        return "ran"

    timed_out = LambdaContext(remaining_ms=10_000)
    with pytest.raises(Crash):
        handler(event(), timed_out)
    assert held_by(leases, "o-1") == [timed_out.aws_request_id]
    clock.advance(10 + MARGIN - 0.01)
    with pytest.raises(Busy):
        handler(event(), LambdaContext())
    clock.advance(0.01)
    crash.append(False)
    assert handler(event(), LambdaContext()) == "ran"
    assert held_by(leases, "o-1") == [None]


def test_a_lambda_retry_of_a_crashed_attempt_takes_its_own_lease_back(leases, clock):
    guard, _ = make(leases, clock)
    attempts = []

    @guard
    def handler(evt, context):
        attempts.append(context.aws_request_id)
        if len(attempts) == 1:
            raise Crash("killed")
        return "ok"

    context = LambdaContext()
    with pytest.raises(Crash):
        handler(event(), context)
    assert handler(event(), context) == "ok"  # async retries keep the request id: no wait for expiry


def test_waiting_backs_off_with_jitter_and_gets_in_after_the_holder_leaves(leases, clock):
    delays: list[float] = []

    def sleep(seconds: float) -> None:
        delays.append(seconds)
        clock.sleep(seconds)

    guard, _ = make(leases, clock, on_busy="wait", sleep=sleep)
    handler = guard(lambda evt, context: clock.now())
    exclusive.hold("orders", "o-1", ttl=30, holder="other", leases=leases, clock=clock).__enter__()
    start = clock.now()  # "other" never releases: its lease expires at +30 + MARGIN
    entered = handler(event(), LambdaContext(remaining_ms=120_000))
    assert (
        start + 30 + MARGIN <= entered < start + 30 + MARGIN + 2.0
    )  # polled until the expiry, a cap late at most
    assert max(delays) <= 2.0 and len(delays) < 30
    for i, d in enumerate(delays):  # equal jitter: half of each step fixed, half random
        step = min(2.0, 0.1 * 2**i)
        assert step / 2 <= d <= step


def test_waiting_gives_up_at_the_deadline_with_busy(leases, clock):
    guard, _ = make(leases, clock, on_busy="wait", wait_seconds=7, sleep=clock.sleep)
    handler = guard(lambda evt, context: "ran")
    with exclusive.hold("orders", "o-1", ttl=600, holder="other", leases=leases, clock=clock):
        start = clock.now()
        with pytest.raises(Busy) as caught:
            handler(event(), LambdaContext())
        assert clock.now() == pytest.approx(start + 7)  # the last try lands on the deadline
        assert caught.value.holder == "other"


def test_by_default_waiting_ends_a_margin_before_the_lambda_deadline(leases, clock):
    guard, _ = make(leases, clock, on_busy="wait", sleep=clock.sleep)
    handler = guard(lambda evt, context: "ran")
    with exclusive.hold("orders", "o-1", ttl=600, holder="other", leases=leases, clock=clock):
        start = clock.now()
        with pytest.raises(Busy):
            handler(event(), LambdaContext(remaining_ms=60_000))
        assert clock.now() == pytest.approx(start + 60 - MARGIN)


@pytest.mark.parametrize(
    "evt", [{}, {"detail": {}}, {"detail": {"orderId": None}}, {"detail": {"orderId": ""}},
            {"detail": {"orderId": ["a"]}}, {"detail": {"orderId": {"x": 1}}}, {"detail": {"orderId": True}}]
)  # fmt: skip
def test_a_key_missing_from_the_event_is_a_value_error_naming_the_expression(leases, clock, evt):
    guard, _ = make(leases, clock)
    handler = guard(lambda e, c: "ran")
    with pytest.raises(ValueError, match=r"detail\.orderId") as caught:
        handler(evt, LambdaContext())
    assert isinstance(caught.value, MissingKey)
    assert leases.inspect("orders", "None")[0].version == 0  # no lock on "None"


def test_numbers_are_keys_and_an_oversized_key_is_refused(leases, clock):
    guard, _ = make(leases, clock, expression="n")
    handler = guard(lambda e, c: leases.inspect("orders", "42")[0].holder)
    assert handler({"n": 42}, LambdaContext()) is not None
    with pytest.raises(ValueError, match="1,025 bytes"):
        handler({"n": "x" * 1_025}, LambdaContext())


def test_record_errors_keeps_the_last_exception_on_the_key(leases, clock):
    guard, _ = make(leases, clock, record_errors=True)
    outcomes = iter([RuntimeError("boom " * 400), None])

    @guard
    def handler(evt, context):
        exc = next(outcomes)
        if exc:
            raise exc

    context = LambdaContext()
    with pytest.raises(RuntimeError):
        handler(event(), context)
    error = exclusive.inspect("orders", "o-1", leases=leases)[0].last_error
    assert (error.type, error.holder, error.at) == ("RuntimeError", context.aws_request_id, clock.now())
    assert error.message == ("boom " * 400)[:ERROR_MESSAGE_CHARS]
    handler(event(), LambdaContext())  # a success keeps the last error
    assert exclusive.inspect("orders", "o-1", leases=leases)[0].last_error == error


def test_state_is_passed_to_the_next_run_with_the_same_key(leases, clock):
    guard, _ = make(leases, clock, state=True)

    @guard
    def handler(evt, context, state):
        state["runs"] = state.get("runs", 0) + 1
        if evt.get("fail"):
            raise KeyError("half done")
        return state["runs"]

    assert [handler(event(), LambdaContext()) for _ in range(3)] == [1, 2, 3]
    with pytest.raises(KeyError):
        handler({**event(), "fail": True}, LambdaContext())  # written back on an exception too
    assert handler(event(), LambdaContext()) == 5
    assert handler(event("o-2"), LambdaContext()) == 1  # per key
    assert exclusive.inspect("orders", "o-1", leases=leases)[0].state == {"runs": 5}


def test_a_state_too_large_is_refused_after_the_key_is_released(leases, clock):
    guard, _ = make(leases, clock, state=True)

    @guard
    def handler(evt, context, state):
        state["blob"] = "x" * evt["size"]

    handler({**event(), "size": 10}, LambdaContext())
    with pytest.raises(StateError):
        handler({**event(), "size": 10_000}, LambdaContext())
    (item,) = leases.inspect("orders", "o-1")
    assert item.holder is None and item.state == {"blob": "x" * 10}  # released; the old state kept


def test_state_needs_a_mutex_and_on_busy_is_checked():
    with pytest.raises(ValueError, match="limit=1"):
        exclusive("k", limit=2, state=True, name="x")(lambda e, c, state: None)
    with pytest.raises(ValueError, match="on_busy"):
        exclusive("k", on_busy="spin", name="x")(lambda e, c: None)


def test_limit_three_lets_three_in_per_tenant(leases, clock):
    guard, _ = make(leases, clock, expression="tenant", limit=3, name="reports")
    inner = []

    @guard
    def report(evt, context):
        if evt.get("nested", 0) < 3:  # a run that triggers another, with its own context, while inside
            try:
                report({**evt, "nested": evt.get("nested", 0) + 1}, LambdaContext())
            except Busy as busy:
                inner.append(len(busy.holders))
        return "ok"

    assert report({"tenant": "t1"}, LambdaContext()) == "ok"
    assert inner == [3]  # the fourth found three holders
    assert held_by(leases, "t1", "reports", limit=3) == [None, None, None]


def test_outside_lambda_the_ttl_and_the_margin_apply_and_the_holder_is_a_uuid(leases, clock):
    guard, _ = make(leases, clock, ttl=120)

    @guard
    def job(evt):
        return leases.inspect("orders", "o-1")[0]

    item = job(event())
    assert item.expires_at == clock.now() + 120 + MARGIN and len(item.holder) == 32


def test_hold_is_a_context_manager_that_renews_and_releases(leases, clock):
    with exclusive.hold("orders", "o-1", ttl=60, leases=leases, clock=clock, state=True) as held:
        assert held_by(leases, "o-1") == [held.lease.holder]
        held.state["seen"] = True
        clock.advance(50)
        held.renew(60)
        clock.advance(50)  # past the first expiry: still held
        with pytest.raises(Busy):
            exclusive.hold("orders", "o-1", ttl=60, leases=leases, clock=clock).__enter__()
    assert held.released is True and held_by(leases, "o-1") == [None]
    assert leases.inspect("orders", "o-1")[0].state == {"seen": True}
    with exclusive.hold("orders", "o-1", ttl=1, leases=leases, clock=clock) as first:
        clock.advance(1 + MARGIN)  # the run's second and the lock's margin
        taker = exclusive.hold("orders", "o-1", ttl=60, leases=leases, clock=clock)
        with taker, pytest.raises(LeaseLost):
            first.renew(60)
    assert first.released is False  # taken over: its release freed nothing


def test_a_nested_run_of_the_same_key_and_invocation_is_refused(leases, clock):
    guard, _ = make(leases, clock)

    @guard
    def handler(evt, context):
        with pytest.raises(Reentered):
            handler(evt, context)  # same request id: releasing the inner run would free the outer
        return held_by(leases, "o-1")

    context = LambdaContext()
    assert handler(event(), context) == [context.aws_request_id]
    assert held_by(leases, "o-1") == [None]


def test_the_table_is_read_at_the_first_call_not_at_decoration(monkeypatch):
    monkeypatch.delenv("SLUICE_TABLE_NAME", raising=False)
    handler = exclusive("id", name="late")(lambda e, c: None)  # no table, no client: fine until called
    with pytest.raises(ConfigurationError, match="SLUICE_TABLE_NAME"):
        handler({"id": "a"}, LambdaContext())


def test_importing_it_loads_no_launcher_and_no_aws_client():
    lib = Path(__file__).resolve().parents[2] / "lib"
    code = (
        f"import sys; sys.path.insert(0, {str(lib)!r}); import sluice.concurrency; "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('sluice', 'boto')))))"
    )
    loaded = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True)
    assert set(loaded.stdout.split()) == {
        "sluice",
        "sluice.core",
        "sluice.core.clock",
        "sluice.concurrency",
        "sluice.core.errors",
        "sluice.primitives",
        "sluice.primitives.lease",
        "sluice.core.model",
        "sluice.core.names",
        "sluice.core.validation",
    }

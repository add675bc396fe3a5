"""``@exclusive`` on moto's DynamoDB: concurrent invocations in threads, expiring locks, Lambda
timeouts, clock skew, and Powertools ``@idempotent`` inside it. Time is a FakeClock; nothing sleeps."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from sluice import concurrency
from sluice.adapters.dynamo.codec import plain
from sluice.adapters.dynamo.store import create_table
from sluice.concurrency import Busy, MissingKey, exclusive
from sluice.core.clock import FakeClock
from sluice.core.errors import TransientError
from tests.contract.slots_fixtures import in_threads
from tests.support.aws import NO_RETRY, LambdaContext
from tests.support.hooks import Crash, count_calls, throttle

TABLE = "exclusive-table"
MARGIN = 5.0
REMAINING_MS = 60_000


@pytest.fixture
def client(session):
    ddb = session.client("dynamodb", config=NO_RETRY)
    create_table(ddb, TABLE)
    return ddb


@pytest.fixture
def clock():
    return FakeClock()


def item(client: Any, key: str, name: str = "orders", slot: int = 0) -> dict[str, Any]:
    raw = client.get_item(
        TableName=TABLE, Key={"pk": {"S": f"LEASE#{name}#{key}#{slot}"}}, ConsistentRead=True
    )
    return plain(raw.get("Item") or {})


@dataclass
class Timeline:
    """Entries and exits numbered from one shared counter: two runs overlap when one enters between
    the other's entry and exit."""

    spans: list[tuple[int, int, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ticks: Any = field(default_factory=itertools.count)

    def tick(self) -> int:
        with self._lock:
            return next(self._ticks)

    def record(self, enter: int, who: str) -> None:
        with self._lock:
            self.spans.append((enter, next(self._ticks), who))

    def assert_one_at_a_time(self) -> None:
        spans = sorted(self.spans)
        for (_, left, a), (enter, _, b) in itertools.pairwise(spans):
            assert left < enter, f"{b} entered at {enter} while {a} was inside until {left}"


def guard(client: Any, clock: Any, **options: Any) -> Any:
    options.setdefault("name", "orders")
    return exclusive("detail.orderId", client=client, table_name=TABLE, clock=clock, **options)


def event(order: str = "o-1", **more: Any) -> dict[str, Any]:
    return {"detail": {"orderId": order, **more}}


def test_sixteen_concurrent_invocations_of_one_key_never_overlap(client, clock):
    timeline, spins = Timeline(), []

    @guard(client, clock, on_busy="wait", sleep=spins.append)  # waiting: no time passes, it retries
    def handler(evt, context):
        enter = timeline.tick()
        assert item(client, "o-1")["holder"] == context.aws_request_id  # the table agrees, mid-run
        timeline.record(enter, context.aws_request_id)
        return context.aws_request_id

    contexts = [LambdaContext(remaining_ms=REMAINING_MS) for _ in range(16)]
    ran = in_threads(16, lambda i: handler(event(), contexts[i]))
    assert sorted(ran) == sorted(c.aws_request_id for c in contexts)
    assert len(timeline.spans) == 16 and spins  # they did contend
    timeline.assert_one_at_a_time()
    lease = item(client, "o-1")
    assert "holder" not in lease and lease["version"] == 16


def test_sixteen_invocations_with_timeouts_and_expiring_locks_never_overlap(client, clock, caplog):
    """Some invocations time out while holding: their lock stays until it expires (the clock jumps
    past it as they die), then a waiter takes over. Waiters whose own deadline passed give up with
    Busy and are invoked again, as an event source retries. A waiter that read the clock before a
    jump and found the lock free after it is granted a lease whose run had ended: it gives it back,
    and asks again, or past its own deadline (alive here, as no Lambda is) fails with TransientError."""
    timeline, crashers = Timeline(), {2, 5, 9, 13}

    @guard(client, clock, on_busy="wait", sleep=lambda _s: None)
    def handler(evt, context):
        enter = timeline.tick()
        assert item(client, "o-1")["holder"] == context.aws_request_id
        timeline.record(enter, evt["detail"]["who"])
        if evt["detail"]["who"] in crashers:
            clock.advance(REMAINING_MS / 1000 + MARGIN)  # dead at its deadline; the lock expires
            raise Crash("Task timed out")
        return "ok"

    def invoke(i: int) -> str:
        while True:
            try:
                return handler(event(who=i), LambdaContext(remaining_ms=REMAINING_MS))
            except (Busy, TransientError):
                continue  # the event comes back with a new request id
            except Crash:
                return "timed out"

    outcomes = in_threads(16, invoke)
    assert outcomes.count("timed out") == 4 and outcomes.count("ok") == 12
    assert sorted(who for *_, who in timeline.spans) == list(range(16))  # each entered once
    timeline.assert_one_at_a_time()
    given_back = sum(
        "granted after the run's time under it had ended" in r.getMessage() for r in caplog.records
    )
    assert item(client, "o-1")["version"] == 16 + given_back


def late_grants(client: Any, clock: FakeClock, *, by: float, times: int) -> list[float]:
    """The first ``times`` UpdateItems are answered ``by`` seconds after they were sent: the clock moves
    on while they are on their way (a pause, retries). The dates each one moved the clock at."""
    moved: list[float] = []

    def hook(**_: Any) -> None:
        if len(moved) < times:
            moved.append(clock.now())
            clock.advance(by)

    client.meta.events.register("after-call.dynamodb.UpdateItem", hook)
    return moved


def test_a_lease_granted_after_its_end_is_given_back_and_asked_again(client, clock, caplog):
    """``hold(ttl=10)`` reads the clock, then its acquire comes back 11 s later: the item says the lease
    ended 1 s ago, and another run may take it. The section runs only under the second grant."""
    moved = late_grants(client, clock, by=11, times=1)
    calls = count_calls(client)
    with exclusive.hold("orders", "o-1", ttl=10, client=client, table_name=TABLE, clock=clock) as held:
        inside = item(client, "o-1")
        assert inside["holder"] == held.lease.holder and inside["expires_at"] > clock.now()
    assert moved == [1_800_000_000.0]  # the fault fired on the first acquire
    assert held.lease.version == 2  # the first grant (v1) was given back
    assert calls["UpdateItem"] == 4  # acquire, give back, acquire, release
    assert any("granted after the run's time under it had ended" in r.getMessage() for r in caplog.records)
    assert "holder" not in item(client, "o-1")


def test_grants_that_keep_coming_back_ended_fail_with_a_clear_error_and_hold_nothing(client, clock):
    moved = late_grants(client, clock, by=11, times=6)  # every acquire and give back is late
    ran = []
    refused = pytest.raises(
        TransientError, match="3 grants came back after the run's time under them had ended"
    )
    with refused, exclusive.hold("orders", "o-1", ttl=10, client=client, table_name=TABLE, clock=clock):
        ran.append(True)
    assert ran == [] and len(moved) == 6
    assert "holder" not in item(client, "o-1")  # each one given back


def test_a_stuck_holder_is_taken_over_after_expiry_and_its_release_frees_nothing(client, clock):
    stuck, let_go, seen = threading.Event(), threading.Event(), {}

    @guard(client, clock)
    def handler(evt, context):
        who = evt["detail"]["who"]
        if who == "A":
            stuck.set()
            assert let_go.wait(30)
        if who == "B":
            let_go.set()
            a.join(30)  # A returns and releases while B is inside
            seen["after A"] = item(client, "o-1")["holder"]
            with pytest.raises(Busy) as caught:
                handler(event(who="C"), LambdaContext())
            seen["C saw"] = caught.value.holder
        return who

    ctx_a, ctx_b = LambdaContext(remaining_ms=REMAINING_MS), LambdaContext(remaining_ms=REMAINING_MS)
    a = threading.Thread(target=handler, args=(event(who="A"), ctx_a))
    a.start()
    assert stuck.wait(30)
    with pytest.raises(Busy):
        handler(event(who="B"), ctx_b)
    clock.advance(REMAINING_MS / 1000 + MARGIN)  # A's lease expires while A is stuck
    assert handler(event(who="B"), ctx_b) == "B"
    assert seen == {"after A": ctx_b.aws_request_id, "C saw": ctx_b.aws_request_id}
    lease = item(client, "o-1")
    assert "holder" not in lease and lease["version"] == 2  # B released its own


def test_a_lambda_timeout_mid_hold_keeps_the_lock_until_its_expiry(client, clock):
    @guard(client, clock)
    def handler(evt, context):
        if evt["detail"].get("hang"):
            raise Crash("Task timed out after 60.00 seconds")
        return "ran"

    dead = LambdaContext(remaining_ms=REMAINING_MS)
    start = clock.now()
    with pytest.raises(Crash):
        handler(event(hang=True), dead)
    lease = item(client, "o-1")
    assert (lease["holder"], lease["expires_at"]) == (dead.aws_request_id, start + 60 + MARGIN)
    clock.advance(60 + MARGIN - 0.5)
    with pytest.raises(Busy) as caught:
        handler(event(), LambdaContext())
    assert caught.value.holder == dead.aws_request_id
    clock.advance(0.5)
    assert handler(event(), LambdaContext()) == "ran"
    assert "holder" not in item(client, "o-1")


def test_an_exception_releases_and_busy_names_the_holder(client, clock):
    @guard(client, clock)
    def handler(evt, context):
        raise ValueError("card declined")

    with pytest.raises(ValueError, match="card declined"):
        handler(event(), LambdaContext())
    assert "holder" not in item(client, "o-1")
    other = exclusive.hold(
        "orders", "o-1", ttl=90, holder="batch-7", client=client, table_name=TABLE, clock=clock
    )
    with other, pytest.raises(Busy) as caught:
        handler(event(), LambdaContext())
    busy = caught.value
    assert (busy.key, busy.holder, busy.until) == ("o-1", "batch-7", clock.now() + 90 + MARGIN)
    assert "batch-7" in str(busy)


def test_waiting_polls_with_backoff_through_the_injected_sleep(client, clock):
    calls = count_calls(client)

    @guard(client, clock, on_busy="wait", sleep=clock.sleep)
    def handler(evt, context):
        return clock.now()

    start = clock.now()
    with exclusive.hold(
        "orders", "o-1", ttl=20, holder="other", client=client, table_name=TABLE, clock=clock
    ):
        calls.clear()
        entered = handler(event(), LambdaContext(remaining_ms=REMAINING_MS))  # "other" never lets go
    assert start + 20 + MARGIN <= entered < start + 22 + MARGIN  # the lock's ttl and margin
    assert calls["UpdateItem"] < 30  # tries 0.1, 0.2, 0.4 … then every ~2 s (about 18 in 20 s), not a spin


def test_record_errors_and_state_are_kept_on_the_key(client, clock):
    @guard(client, clock, record_errors=True, state=True)
    def handler(evt, context, state):
        state["attempts"] = state.get("attempts", 0) + 1
        if evt["detail"].get("fail"):
            raise RuntimeError(f"partner API said no ({'x' * 2_000})")
        return state["attempts"]

    failing = LambdaContext()
    with pytest.raises(RuntimeError):
        handler(event(fail=True), failing)
    assert handler(event(), LambdaContext()) == 2
    lease = item(client, "o-1")
    assert lease["state"] == '{"attempts":2}'
    error = lease["last_error"]
    assert (error["type"], error["holder"]) == ("RuntimeError", failing.aws_request_id)
    assert error["message"].startswith("partner API said no (") and len(error["message"]) == 1_000
    (slot,) = exclusive.inspect("orders", "o-1", client=client, table_name=TABLE)
    assert slot.state == {"attempts": 2} and slot.last_error.type == "RuntimeError"


def test_a_missing_key_is_refused_before_any_call(client, clock):
    calls = count_calls(client)
    handler = guard(client, clock)(lambda evt, context: "ran")
    with pytest.raises(MissingKey, match=r"detail\.orderId"):
        handler({"detail": {"customer": "c-1"}}, LambdaContext())
    assert sum(calls.values()) == 0


@dataclass
class SkewedClock:
    """A host's clock: real time (a FakeClock) plus its own offset."""

    real: FakeClock
    offset: float

    def now(self) -> float:
        return self.real.now() + self.offset


@pytest.mark.parametrize("skew", [4.9, -30.0])
def test_clocks_differing_by_less_than_the_margin_never_let_two_in(client, skew):
    real = FakeClock()
    deadline = real.now() + 60
    b = guard(client, SkewedClock(real, skew))(lambda evt, context: "B ran")

    @guard(client, SkewedClock(real, 0.0))
    def a(evt, context):
        while real.now() < deadline:  # A runs to its very deadline; B tries every 0.5 s of it
            with pytest.raises(Busy):
                b(event(), LambdaContext())
            real.advance(0.5)
        raise Crash("Task timed out")  # killed at the deadline: no release

    with pytest.raises(Crash):
        a(event(), LambdaContext(remaining_ms=60_000))
    real.advance(MARGIN - max(skew, 0) - 0.01)
    with pytest.raises(Busy):
        b(event(), LambdaContext())
    real.advance(0.01 + max(-skew, 0))  # A's expiry by B's clock: its deadline + margin - skew
    assert b(event(), LambdaContext()) == "B ran"


def test_a_skew_beyond_the_margin_lets_a_second_in_while_the_first_runs(client):
    """The documented bound is tight: a taker 6 s ahead sees a 5 s margin run out 1 s early."""
    real = FakeClock()
    b = guard(client, SkewedClock(real, 6.0))(lambda evt, context: "B ran")
    inside = []

    @guard(client, SkewedClock(real, 0.0))
    def a(evt, context):
        real.advance(59.5)  # A is still inside, before its deadline
        inside.append(b(event(), LambdaContext()))

    a(event(), LambdaContext(remaining_ms=60_000))
    assert inside == ["B ran"]


def test_exclusive_outside_powertools_idempotent_holds_the_lock_around_it(client, clock, monkeypatch):
    from aws_lambda_powertools.utilities.idempotency import (
        DynamoDBPersistenceLayer,
        IdempotencyConfig,
        idempotent,
    )

    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "charge")
    # One table for both: Powertools' records under their own pk, expiring through the table's TTL.
    layer = DynamoDBPersistenceLayer(
        table_name=TABLE, key_attr="pk", expiry_attr="expires_at", boto3_client=client
    )
    runs, during = [], {}

    @exclusive("orderId", name="orders", client=client, table_name=TABLE, clock=clock)
    @idempotent(persistence_store=layer, config=IdempotencyConfig(event_key_jmespath="orderId"))
    def handler(evt, context):
        runs.append(context.aws_request_id)
        during["holder"] = item(client, evt["orderId"])["holder"]
        with pytest.raises(Busy):  # a duplicate delivered meanwhile: refused before Powertools' record
            handler(evt, LambdaContext())
        return {"charged": evt["orderId"]}

    first = LambdaContext()
    assert handler({"orderId": "o-9"}, first) == {"charged": "o-9"}
    assert during["holder"] == first.aws_request_id  # the lock was held around the idempotent call
    assert "holder" not in item(client, "o-9")
    assert handler({"orderId": "o-9"}, LambdaContext()) == {"charged": "o-9"}  # Powertools' cached result
    assert runs == [first.aws_request_id]
    assert "holder" not in item(client, "o-9")  # released after the cached answer too
    records = [
        plain(r) for r in client.scan(TableName=TABLE)["Items"] if not r["pk"]["S"].startswith("LEASE#")
    ]
    assert len(records) == 1 and records[0]["status"] == "COMPLETED"


def test_the_client_and_table_come_at_the_first_call(session, monkeypatch):
    monkeypatch.setattr(concurrency, "_client", None)  # the process-wide client, made on first use
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "SLUICE_TABLE_NAME"):
        monkeypatch.delenv(name, raising=False)
    handler = exclusive("id", name="jobs")(lambda evt, context: "ran")  # no region, no table: no client yet
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("SLUICE_TABLE_NAME", TABLE)
    create_table(session.client("dynamodb", region_name="us-east-1"), TABLE)
    assert handler({"id": "j-1"}, LambdaContext()) == "ran"
    assert concurrency._client is not None
    lease = item(session.client("dynamodb", region_name="us-east-1"), "j-1", name="jobs")
    assert lease["version"] == 1 and "holder" not in lease


@pytest.mark.parametrize("keep_state", [False, True])
def test_a_throttled_release_leaves_the_lock_to_expire(client, clock, caplog, keep_state):
    @guard(client, clock, state=keep_state)
    def handler(evt, context, **state):
        if evt["detail"].get("throttle"):
            throttle(client, "UpdateItem", times=1)  # the release is refused once
        return "done"

    context = LambdaContext(remaining_ms=REMAINING_MS)
    if keep_state:
        with pytest.raises(TransientError):  # the state it wrote would be lost without a word
            handler(event(throttle=True), context)
    else:
        assert handler(event(throttle=True), context) == "done"  # the run's outcome stands
    assert "release of orders/'o-1' failed" in caplog.text
    assert item(client, "o-1")["holder"] == context.aws_request_id
    clock.advance(REMAINING_MS / 1000 + MARGIN)
    assert handler(event(), LambdaContext()) == "done"  # expired: the next run takes over
    assert "holder" not in item(client, "o-1")

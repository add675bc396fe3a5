"""Attacks on ``@exclusive`` / ``exclusive.hold`` (lib/sluice/concurrency.py) on moto.

Each test drives one or two "processes" (each its own DynamoDB client, clock and holder) against one
table, injects its faults only through botocore hooks on a client, and checks what the table holds
(ConsistentRead) and who was inside the guarded section when. A test that fails shows a break.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from sluice.adapters.dynamo.store import create_table
from sluice.concurrency import Busy, Reentered, exclusive
from sluice.core.clock import FakeClock
from sluice.core.errors import TransientError
from sluice.primitives.lease import LeaseLost
from tests.support.aws import NO_RETRY, LambdaContext
from tests.support.hooks import Crash, count_calls, error_answer

TABLE = "attacks"
SCOPE = "orders"
KEY = "o-1"
TTL = 60.0
MARGIN = 5.0  # the default: outside Lambda the lock lasts TTL + MARGIN

ACQUIRE, RENEW, RELEASE = "SET holder", "SET expires_at = :until", "REMOVE holder"


# -- the world ----------------------------------------------------------------------------------------


@pytest.fixture
def client(session):
    made = session.client("dynamodb", config=NO_RETRY)
    create_table(made, TABLE)
    return made


@pytest.fixture
def other(session, client):
    """A second process's client on the same table (hooks on ``client`` do not touch it)."""
    return session.client("dynamodb", config=NO_RETRY)


@pytest.fixture
def manual():
    """Holds entered by hand (another process inside a hook): exited at teardown if still inside, so
    a failing test leaves no mark behind in the process (``Reentered`` in the next test)."""
    opened: list[Any] = []

    def track(handle: Any) -> Any:
        opened.append(handle)
        return handle

    yield track
    for handle in opened:
        if handle.held is not None and handle.held.released is None:
            handle.__exit__(None, None, None)


class Skewed:
    """Another host's clock: ``base`` + ``ahead`` seconds."""

    def __init__(self, base: FakeClock, ahead: float) -> None:
        self.base, self.ahead = base, ahead

    def now(self) -> float:
        return self.base.now() + self.ahead


class Room:
    """Who is inside the guarded section, and the most that ever were at once."""

    def __init__(self) -> None:
        self.inside: set[str] = set()
        self.most = 0
        self.log: list[tuple[str, str, float]] = []

    def enter(self, who: str, at: float) -> None:
        self.inside.add(who)
        self.most = max(self.most, len(self.inside))
        self.log.append(("enter", who, at))

    def leave(self, who: str, at: float) -> None:
        self.inside.discard(who)
        self.log.append(("leave", who, at))

    def tries(self, who: str, handle: Any, clock: Any) -> None:
        """``who`` tries to enter through ``handle()`` (a hold), in and out at once; Busy: stays out."""
        try:
            with handle():
                self.enter(who, clock.now())
                self.leave(who, clock.now())
        except Busy:
            pass


def item(client: Any, slot: int = 0, scope: str = SCOPE, key: str = KEY) -> dict[str, Any]:
    raw = client.get_item(
        TableName=TABLE, Key={"pk": {"S": f"LEASE#{scope}#{key}#{slot}"}}, ConsistentRead=True
    ).get("Item")
    if not raw:
        return {}
    out: dict[str, Any] = {}
    for name, value in raw.items():
        ((kind, inner),) = value.items()
        out[name] = float(inner) if kind == "N" else inner
    return out


def _kind(body: bytes | str) -> str:
    expression = json.loads(body or "{}").get("UpdateExpression", "")
    for kind in (ACQUIRE, RENEW, RELEASE):
        if expression.startswith(kind):
            return kind
    return "?"


class Late:
    """The answers of ``kind`` UpdateItems (the write has landed) reach the caller late: ``clock``
    moves ``seconds`` on, and ``then`` (another process acting meanwhile) runs, ``times`` times."""

    def __init__(
        self, client: Any, kind: str, clock: FakeClock, seconds: float, *, times: int = 1, then=None
    ):
        self.kind, self.clock, self.seconds, self.times, self.then = kind, clock, seconds, times, then
        self.fired = 0
        client.meta.events.register("before-call.dynamodb.UpdateItem", self._before)
        client.meta.events.register("after-call.dynamodb.UpdateItem", self._after)

    def _before(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["attack_kind"] = _kind(params.get("body", b""))

    def _after(self, http_response: Any, context: dict[str, Any], **_: Any) -> None:
        if context.get("attack_kind") != self.kind or self.fired >= self.times:
            return
        if http_response.status_code >= 300:
            return  # refused: nothing landed, nothing late
        self.fired += 1
        self.clock.advance(self.seconds)
        if self.then is not None:
            self.then()


def answer_kind(client: Any, kind: str, code: str, status: int = 400, *, times: int = 1) -> list[int]:
    """Answer the first ``times`` UpdateItems of ``kind`` with ``code`` (nothing is sent)."""
    fired = [0]

    def hook(params: dict[str, Any], **_: Any):
        if _kind(params.get("body", b"")) == kind and fired[0] < times:
            fired[0] += 1
            return error_answer(code, status)
        return None

    client.meta.events.register("before-call.dynamodb.UpdateItem", hook)
    return fired


def hold(client: Any, clock: Any, **options: Any):
    options.setdefault("ttl", TTL)
    return exclusive.hold(
        SCOPE, KEY, table_name=TABLE, client=client, clock=clock, sleep=_no_sleep, **options
    )


def _no_sleep(_seconds: float) -> None:
    raise AssertionError("nothing should wait here")


# -- the give-back path -------------------------------------------------------------------------------


def test_stale_grant_is_given_back_and_asked_again(client):
    """A's first grant comes back 61 s after it was asked for (ttl 60): given back, then held anew."""
    clock = FakeClock()
    late = Late(client, ACQUIRE, clock, TTL + MARGIN + 1)
    calls = count_calls(client)
    with hold(client, clock, holder="A") as held:
        assert late.fired == 1
        now = clock.now()
        assert held.lease.expires_at > now
        row = item(client)
        assert row["holder"] == "A" and row["version"] == 2 == held.lease.version
        assert row["expires_at"] == held.lease.expires_at
    assert calls["UpdateItem"] == 4  # acquire (stale), give-back, acquire, release
    row = item(client)
    assert "holder" not in row and row["version"] == 2


def test_stale_grant_taken_over_while_on_its_way_is_not_freed(client, other, manual):
    """While A's stale grant is on its way, B (same clock) takes the ended lease. A's give-back must
    not free B's lease; A must not enter; B's fencing token is above A's."""
    clock = FakeClock()
    room = Room()
    b_hold = manual(hold(other, clock, holder="B"))
    b_held = []

    def b_takes_over() -> None:
        b_held.append(b_hold.__enter__())
        room.enter("B", clock.now())

    late = Late(client, ACQUIRE, clock, TTL + MARGIN + 1, then=b_takes_over)
    with pytest.raises(Busy) as refused, hold(client, clock, holder="A"):
        room.enter("A", clock.now())
    assert late.fired == 1 and b_held
    assert refused.value.holder == "B"
    row = item(client)
    assert row["holder"] == "B" and row["version"] == 2 == b_held[0].lease.version
    assert room.most == 1
    b_hold.__exit__(None, None, None)
    assert b_held[0].released is True and "holder" not in item(client)


def test_stale_grant_taken_over_then_wait_enters_only_after_b_ends(client, other, manual):
    """As above with on_busy="wait": A waits, and enters only once B's lease has ended; B's late
    release then frees nothing of A's."""
    clock = FakeClock()
    b_hold = manual(
        exclusive.hold(SCOPE, KEY, ttl=TTL, holder="B", table_name=TABLE, client=other, clock=clock)
    )
    b_held = []
    late = Late(client, ACQUIRE, clock, TTL + MARGIN + 1, then=lambda: b_held.append(b_hold.__enter__()))
    naps: list[float] = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        clock.advance(seconds)

    with exclusive.hold(
        SCOPE,
        KEY,
        ttl=TTL,
        holder="A",
        on_busy="wait",
        wait_seconds=300,
        table_name=TABLE,
        client=client,
        clock=clock,
        sleep=nap,
    ) as held:
        assert late.fired == 1 and naps
        assert clock.now() >= b_held[0].lease.expires_at  # B's lease had ended
        assert held.lease.version == 3 and item(client)["holder"] == "A"
        b_hold.__exit__(None, None, None)  # B outlived its ttl: its release is fenced
        assert b_held[0].released is False
        assert item(client)["holder"] == "A"
    assert "holder" not in item(client)


def test_three_stale_grants_raise_transient_and_hold_nothing(client, other):
    clock = FakeClock()
    late = Late(client, ACQUIRE, clock, TTL + MARGIN + 1, times=3)
    with pytest.raises(TransientError), hold(client, clock, holder="A"):
        pytest.fail("entered with a stale grant")
    assert late.fired == 3
    row = item(client)
    assert "holder" not in row and row["version"] == 3
    # the same holder may ask again (no Reentered left behind), and someone else too
    with hold(client, clock, holder="A") as again:
        assert again.lease.version == 4
    with hold(other, clock, holder="B") as b:
        assert b.lease.version == 5


def test_give_back_keeps_state_and_last_error(client):
    """A run leaves state and an error; the next run's grant is stale (given back, asked again): it
    must still read both, and its own state must be written on release."""
    clock = FakeClock()
    opts = {"state": True, "record_errors": True}
    with pytest.raises(ValueError), hold(client, clock, holder="first", **opts) as first:
        first.state["cursor"] = 7
        raise ValueError("boom")
    late = Late(client, ACQUIRE, clock, TTL + MARGIN + 1)
    with hold(client, clock, holder="second", **opts) as second:
        assert late.fired == 1
        assert second.state == {"cursor": 7}
        assert second.last_error is not None and second.last_error.message == "boom"
        assert second.last_error.holder == "first"
        second.state["cursor"] = 8
    row = item(client)
    assert json.loads(row["state"]) == {"cursor": 8}
    assert row["last_error"]["message"]["S"] == "boom"
    assert row["version"] == 3


def test_all_stale_keeps_state_and_last_error(client):
    clock = FakeClock()
    opts = {"state": True, "record_errors": True}
    with pytest.raises(KeyError), hold(client, clock, holder="first", **opts) as first:
        first.state["n"] = 1
        raise KeyError("k")
    late = Late(client, ACQUIRE, clock, TTL + MARGIN + 1, times=3)
    with pytest.raises(TransientError), hold(client, clock, holder="second", **opts):
        pass
    assert late.fired == 3
    row = item(client)
    assert json.loads(row["state"]) == {"n": 1} and row["last_error"]["type"]["S"] == "KeyError"
    assert "holder" not in row


def test_throttled_give_back_leaves_nothing_blocking(client, other):
    """A's grant is stale and its give-back is throttled: A must not enter; the lease A still names
    has ended, so B enters at once."""
    clock = FakeClock()
    late = Late(client, ACQUIRE, clock, TTL + MARGIN + 1)
    throttled = answer_kind(client, RELEASE, "ThrottlingException")
    with pytest.raises(TransientError), hold(client, clock, holder="A"):
        pytest.fail("entered with a stale grant")
    assert late.fired == 1 and throttled[0] == 1
    assert item(client)["holder"] == "A"  # left to its (past) expiry
    with hold(other, clock, holder="B") as b:
        assert b.lease.previous is not None and b.lease.previous.holder == "A"
        assert item(client)["holder"] == "B"


def test_crash_during_give_back_leaves_nothing_blocking(client, other):
    clock = FakeClock()
    late = Late(client, ACQUIRE, clock, TTL + MARGIN + 1)
    crashed = [0]

    def crash(params: dict[str, Any], **_: Any) -> None:
        if _kind(params.get("body", b"")) == RELEASE:
            crashed[0] += 1
            raise Crash("killed during the give-back")

    client.meta.events.register("before-call.dynamodb.UpdateItem", crash)
    with pytest.raises(Crash), hold(client, clock, holder="A"):
        pytest.fail("entered with a stale grant")
    assert late.fired == 1 and crashed[0] == 1
    with hold(other, clock, holder="B"):
        assert item(client)["holder"] == "B"


def test_limit_two_stale_grant_never_three_inside(client, other, session, manual):
    """limit 2: C holds one item; A's grant of the other comes back stale and B takes that item
    meanwhile. A's give-back frees nothing of B's; A's second ask takes C's (ended) item; never more
    than 2 live holders, and C's late release frees nothing."""
    clock = FakeClock()
    third = session.client("dynamodb", config=NO_RETRY)
    c_hold = manual(hold(third, clock, holder="C", limit=2))
    c = c_hold.__enter__()
    b_held = []
    clock.advance(1)

    def b_takes_as_item() -> None:
        a_slot = 0 if item(client, 0).get("holder") == "A" else 1
        seed = next(n for n in range(100) if _first_of_two(n) == a_slot)  # B tries A's item first
        b_hold = manual(hold(other, clock, holder="B", limit=2, rng=random.Random(seed)))
        b_held.append(b_hold.__enter__())
        assert b_held[0].lease.slot == a_slot

    # A's grant lands at t+1 with ttl 60; back at t+62, when C's lease (t+60) has ended too.
    late = Late(client, ACQUIRE, clock, TTL + MARGIN + 1, then=b_takes_as_item)
    with hold(client, clock, holder="A", limit=2) as a:
        # B took A's item; C's item had ended: A's second ask takes C's item.
        assert late.fired == 1 and b_held
        assert a.lease.slot == c.lease.slot != b_held[0].lease.slot
        live = [
            r for r in (item(client, 0), item(client, 1)) if r.get("holder") and r["expires_at"] > clock.now()
        ]
        assert sorted(r["holder"] for r in live) == ["A", "B"]
    c_hold.__exit__(None, None, None)
    assert c.released is False
    assert item(client, b_held[0].lease.slot)["holder"] == "B"


# -- fencing and failures around the section ---------------------------------------------------------


def test_late_release_after_takeover_frees_nothing(client, other, manual):
    clock = FakeClock()
    a_hold = manual(hold(client, clock, holder="A"))
    a = a_hold.__enter__()
    clock.advance(TTL + MARGIN)  # A outlived its ttl (outside the assumption: only its release is checked)
    with hold(other, clock, holder="B") as b:
        a_hold.__exit__(None, None, None)
        assert a.released is False
        assert item(client)["holder"] == "B" and b.lease.version == a.lease.version + 1
    assert b.released is True


def test_exception_with_throttled_release_keeps_users_exception(client, other):
    clock = FakeClock()
    fired = answer_kind(client, RELEASE, "ProvisionedThroughputExceededException")
    with (
        pytest.raises(ZeroDivisionError),
        hold(client, clock, holder="A", record_errors=True, state=True) as a,
    ):
        a.state["x"] = 1
        raise ZeroDivisionError("section failed")
    assert fired[0] == 1
    assert item(client)["holder"] == "A"
    with pytest.raises(Busy), hold(other, clock, holder="B"):
        pass
    clock.advance(TTL + MARGIN)
    with hold(other, clock, holder="B"):
        assert item(client)["holder"] == "B"


def test_crash_after_grant_leaves_lease_to_expire_and_process_can_hold_again(client):
    clock = FakeClock()
    crashed = [0]

    def crash(http_response: Any, context: dict[str, Any], **_: Any) -> None:
        if crashed[0] == 0:
            crashed[0] += 1
            raise Crash("killed with the grant on its way")

    client.meta.events.register("after-call.dynamodb.UpdateItem", crash)
    with pytest.raises(Crash), hold(client, clock, holder="A"):
        pytest.fail("entered")
    assert crashed[0] == 1 and item(client)["holder"] == "A"
    with pytest.raises(Busy), hold(client, clock, holder="A2"):
        pass
    # the same holder (a retry keeping the request id) takes its own lease back at once
    with hold(client, clock, holder="A") as again:
        assert again.lease.version == 2


def test_lambda_reentry_and_retry_with_same_request_id(client):
    clock = FakeClock()
    context = LambdaContext(remaining_ms=30_000, aws_request_id="req-1")
    seen: list[tuple[int, float]] = []

    @exclusive("id", name=SCOPE, table_name=TABLE, client=client, clock=clock, sleep=_no_sleep)
    def handler(event, ctx, again=False):
        row = item(client, key=event["id"])
        seen.append((int(row["version"]), row["expires_at"]))
        if again:
            handler(event, ctx)
        if event.get("die"):
            raise Crash("timeout")
        return "ok"

    with pytest.raises(Reentered):
        handler({"id": KEY}, context, again=True)
    assert seen == [(1, clock.now() + 30 + 5)]
    assert "holder" not in item(client)  # the outer run released on the way out
    with pytest.raises(Crash):
        handler({"id": KEY, "die": True}, context)
    assert item(client)["holder"] == "req-1"
    with pytest.raises(Busy):
        handler({"id": KEY}, LambdaContext(remaining_ms=30_000, aws_request_id="req-2"))
    assert handler({"id": KEY}, context) == "ok"  # the retry with the same request id
    assert [v for v, _ in seen] == [1, 2, 3]
    assert "holder" not in item(client)


# -- the clock bound outside Lambda -------------------------------------------------------------------


def test_outside_lambda_skew_below_margin_two_inside(client, other):
    """Assumptions kept: clocks differ by 3 s < margin (5 s); A's section ends within its ttl (it
    runs 58 s of 60). B's clock is 3 s ahead: at real t+58 it reads t+61 and takes the lease."""
    clock = FakeClock()
    b_clock = Skewed(clock, 3.0)
    room = Room()
    with hold(client, clock, holder="A", margin=5) as a:
        room.enter("A", clock.now())
        clock.advance(TTL - 2)  # A still inside, 2 s before the end of its ttl
        try:
            with hold(other, b_clock, holder="B", margin=5):
                room.enter("B", clock.now())
                room.leave("B", clock.now())
        except Busy:
            pass
        room.leave("A", clock.now())
    assert room.most == 1, f"two inside at once: {room.log}"
    assert a.released is True


def test_grant_back_just_before_its_end_with_skew_two_inside(client, other, manual):
    """The new re-read of the clock, against a skew below the margin. A's grant lands at t; its
    answer comes back at A's t+58 (ttl 60: not past its end, so A enters). Meanwhile B, clock 3 s
    ahead (reading t+61), took the lease. A enters while B is inside, however short A's section."""
    clock = FakeClock()
    b_clock = Skewed(clock, 3.0)
    room = Room()
    b_hold = manual(hold(other, b_clock, holder="B", margin=5))

    def b_takes() -> None:
        try:
            b_hold.__enter__()
        except Busy:
            return
        room.enter("B", clock.now())

    late = Late(client, ACQUIRE, clock, TTL - 2, then=b_takes)
    try:
        with hold(client, clock, holder="A", margin=5):
            room.enter("A", clock.now())
            room.leave("A", clock.now())
    except (Busy, TransientError):
        pass
    finally:
        if b_hold.held is not None:
            b_hold.__exit__(None, None, None)
    assert late.fired == 1
    assert room.most == 1, f"two inside at once: {room.log}"


@pytest.mark.xfail(
    strict=True,
    reason="documented limit (docs/concurrency.md): ttl counts from the acquire's request, so a "
    "section entered 59.5 s after it with a ttl of 60 that runs 10 s outlives its ttl",
)
def test_grant_back_just_before_its_end_no_skew(client, other):
    """Same clock for both. A's grant comes back 59.5 s after it was asked for (ttl 60): A enters
    with 0.5 s of its time left, runs 10 s (within its ttl counted from entering, not from the
    request) and B enters meanwhile."""
    clock = FakeClock()
    room = Room()
    late = Late(client, ACQUIRE, clock, TTL - 0.5)
    with hold(client, clock, holder="A"):
        room.enter("A", clock.now())
        clock.advance(10)
        room.tries("B", lambda: hold(other, clock, holder="B"), clock)
        room.leave("A", clock.now())
    assert late.fired == 1
    assert room.most == 1, f"two inside at once: {room.log}"


def test_renew_answer_back_after_its_end(client, other):
    """The acquire check has no twin in renew: A renews at t+50 for 60 s more; the answer comes back
    61 s later, after the renewed lease's own end. renew returns as if A had 60 s more; B takes
    over at once while A goes on, 1 s after its renew returned."""
    clock = FakeClock()
    room = Room()
    with hold(client, clock, holder="A") as a:
        room.enter("A", clock.now())
        clock.advance(50)
        late = Late(client, RENEW, clock, TTL + 1)
        try:
            renewed = a.renew(TTL)
        except LeaseLost as lost:
            assert "the renewal came back after the 60 s it asked for" in str(lost)
            renewed = None
        assert late.fired == 1
        if renewed is not None:
            clock.advance(1)
            room.tries("B", lambda: hold(other, clock, holder="B"), clock)
        room.leave("A", clock.now())
    assert room.most == 1, (
        f"renew returned an ended lease (expires {renewed and renewed.expires_at}): {room.log}"
    )


def test_lambda_skew_below_margin_holds(client, other):
    """The same skew in Lambda: A's lease lasts to its deadline + margin, and Lambda stops A at the
    deadline. B, 4.9 s ahead, is refused until A's deadline has passed in real time."""
    clock = FakeClock()
    b_clock = Skewed(clock, 4.9)
    room = Room()
    deadline = clock.now() + 30

    @exclusive("id", name=SCOPE, table_name=TABLE, client=client, clock=clock, sleep=_no_sleep)
    def a_handler(event, context):
        room.enter("A", clock.now())
        clock.advance(30)  # runs to its deadline, where Lambda stops it
        raise Crash("timeout")

    @exclusive("id", name=SCOPE, table_name=TABLE, client=other, clock=b_clock, sleep=_no_sleep)
    def b_handler(event, context):
        room.enter("B", clock.now())
        room.leave("B", clock.now())

    with pytest.raises(Crash):
        a_handler({"id": KEY}, LambdaContext(remaining_ms=30_000, aws_request_id="a"))
    room.leave("A", clock.now())
    assert clock.now() == deadline and item(client)["holder"] == "a"
    b_context = LambdaContext(remaining_ms=30_000, aws_request_id="b")
    with pytest.raises(Busy):
        b_handler({"id": KEY}, b_context)
    clock.advance(0.1)
    b_handler({"id": KEY}, b_context)
    assert room.most == 1 and room.log[-2][1] == "B"


def test_limit_two_same_holder_taken_over_between_read_and_write(client, other, manual):
    """Liveness, not safety: R (a request id) crashed holding item i of a limit-2 key; its retry
    reads the items, then tries only item i. B takes item i (ended) between that read and R's write:
    R gets Busy though the other item is free."""
    clock = FakeClock()

    @exclusive("id", name=SCOPE, limit=2, table_name=TABLE, client=client, clock=clock, sleep=_no_sleep)
    def handler(event, context):
        if event.get("die"):
            raise Crash("timeout")
        return "ran"

    context = LambdaContext(remaining_ms=10_000, aws_request_id="R")
    with pytest.raises(Crash):
        handler({"id": KEY, "die": True}, context)
    slot = 0 if item(client, 0).get("holder") == "R" else 1
    clock.advance(3600)  # the retry comes an hour later: R's item has long ended
    seed = next(n for n in range(100) if _first_of_two(n) == slot)  # B tries R's item first
    b_hold = manual(hold(other, clock, holder="B", limit=2, rng=random.Random(seed)))
    b_entered = []

    def b_takes_r_item(**_: Any) -> None:
        if not b_entered:
            b_entered.append(b_hold.__enter__())

    client.meta.events.register("after-call.dynamodb.BatchGetItem", b_takes_r_item)
    try:
        try:
            result: Any = handler({"id": KEY}, context)
        except Busy as busy:
            result = busy
        assert b_entered and b_entered[0].lease.slot == slot
        assert not item(client, 1 - slot).get("holder")  # the other item is free all along
        assert result == "ran", f"R refused with a free item: {result}"
    finally:
        if b_hold.held is not None:
            b_hold.__exit__(None, None, None)


def _first_of_two(seed: int) -> int:
    order = [0, 1]
    random.Random(seed).shuffle(order)
    return order[0]

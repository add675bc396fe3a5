"""The lease contract, run against MemoryLeases and DynamoLeases (moto). DynamoDB-only checks (the
item's layout, calls per acquire, translated errors) are at the end."""

from __future__ import annotations

import random
from typing import Any

import pytest

from sluice.adapters.dynamo.codec import plain
from sluice.adapters.dynamo.lease import DynamoLeases, lease_pk
from sluice.adapters.dynamo.store import create_table
from sluice.core.errors import ConfigurationError, TransientError
from sluice.primitives.lease import (
    STATE_MAX_BYTES,
    BadLeaseName,
    Busy,
    Holding,
    LastError,
    Lease,
    LeaseLost,
    StateError,
)
from tests.contract.lease_fixtures import NOW, RETENTION, TABLE, Inside, open_harness, try_acquire
from tests.contract.slots_fixtures import in_threads
from tests.support.hooks import error_answer, throttle

S = "orders"
TTL = 30.0


@pytest.fixture(params=["memory", "dynamodb"])
def harness(request):
    return open_harness(request)


def test_a_free_key_is_held_until_its_expiry(harness):
    leases = harness.open()
    lease = leases.acquire(S, "o-1", "a", NOW, TTL)
    assert (lease.holder, lease.slot, lease.version) == ("a", 0, 1)
    assert (lease.acquired_at, lease.expires_at, lease.previous, lease.state) == (NOW, NOW + TTL, None, None)
    (item,) = leases.inspect(S, "o-1")
    assert (item.holder, item.expires_at, item.version) == ("a", NOW + TTL, 1) and item.live(NOW)
    assert leases.inspect(S, "o-2")[0].holder is None  # another key, never written


def test_a_held_key_is_busy_naming_its_holder_and_expiry(harness):
    leases = harness.open()
    leases.acquire(S, "o-1", "a", NOW, TTL)
    busy = try_acquire(harness.beside(leases), S, "o-1", "b", NOW + 10, TTL)
    assert isinstance(busy, Busy)
    assert (busy.scope, busy.key, busy.holder, busy.until) == (S, "o-1", "a", NOW + TTL)
    assert busy.holders == (Holding("a", NOW + TTL, 0),)
    assert leases.inspect(S, "o-1")[0].holder == "a"  # the refusal wrote nothing
    leases.acquire(S, "o-2", "b", NOW, TTL)  # keys are independent
    leases.acquire("reports", "o-1", "b", NOW, TTL)  # and so are scopes


def test_acquiring_again_as_the_same_holder_keeps_the_lease(harness):
    leases = harness.open()
    first = leases.acquire(S, "o-1", "a", NOW, TTL)
    again = leases.acquire(S, "o-1", "a", NOW + 1, TTL)  # an answer lost, asked again
    assert (again.slot, again.version, again.expires_at) == (first.slot, 2, NOW + 1 + TTL)
    assert again.previous is None


def test_takeover_only_after_expiry(harness):
    leases = harness.open()
    first = leases.acquire(S, "o-1", "a", NOW, TTL)
    other = harness.beside(leases)
    assert isinstance(try_acquire(other, S, "o-1", "b", first.expires_at - 0.001, TTL), Busy)
    taken = other.acquire(S, "o-1", "b", first.expires_at, TTL)  # expires_at <= now: expired
    assert (taken.holder, taken.version, taken.previous) == ("b", 2, Holding("a", first.expires_at, 0))
    assert isinstance(try_acquire(leases, S, "o-1", "c", first.expires_at + 1, TTL), Busy)


def test_a_release_frees_once_and_only_its_own_lease(harness):
    leases = harness.open()
    a = leases.acquire(S, "o-1", "a", NOW, TTL)
    assert leases.release(a)
    assert not leases.release(a)  # a second release is a no-op
    b = leases.acquire(S, "o-1", "b", NOW + 1, TTL)
    assert not leases.release(a)  # a's stale lease frees nothing of b's
    assert leases.inspect(S, "o-1")[0].holder == "b"
    assert isinstance(try_acquire(leases, S, "o-1", "c", NOW + 2, TTL), Busy)
    assert leases.release(b)
    (item,) = leases.inspect(S, "o-1")
    assert item.holder is None and not item.live(NOW + 2)
    assert item.expires_at == b.expires_at + RETENTION  # kept for retention, then the table's TTL
    assert leases.acquire(S, "o-1", "c", NOW + 3, TTL).version == 3


def test_a_late_release_after_a_takeover_frees_nothing(harness):
    leases = harness.open()
    stuck = leases.acquire(S, "o-1", "a", NOW, TTL)
    taker = harness.beside(leases).acquire(S, "o-1", "b", NOW + TTL + 1, TTL)
    assert not leases.release(stuck, state={"from": "a"}, error=LastError("E", "late", NOW, "a"))
    (item,) = leases.inspect(S, "o-1")
    assert (item.holder, item.version, item.state, item.last_error) == ("b", 2, None, None)
    assert isinstance(try_acquire(leases, S, "o-1", "c", NOW + TTL + 2, TTL), Busy)
    assert taker.version > stuck.version  # the fencing token a resource can check


def test_renewal_is_fenced_by_the_holder(harness):
    leases = harness.open()
    a = leases.acquire(S, "o-1", "a", NOW, TTL)
    renewed = leases.renew(a, NOW + 20, TTL)
    assert renewed.expires_at == NOW + 20 + TTL and renewed.version == a.version
    assert isinstance(try_acquire(leases, S, "o-1", "b", NOW + TTL + 1, TTL), Busy)  # the old expiry passed
    b = leases.acquire(S, "o-1", "b", renewed.expires_at, TTL)
    with pytest.raises(LeaseLost):
        leases.renew(renewed, renewed.expires_at + 1, TTL)
    assert leases.inspect(S, "o-1")[0].expires_at == b.expires_at  # b's expiry untouched
    assert leases.release(b)
    with pytest.raises(LeaseLost):
        leases.renew(b, NOW, TTL)  # released: nothing to renew


def test_state_and_last_error_outlive_their_holders(harness):
    leases = harness.open()
    a = leases.acquire(S, "o-1", "a", NOW, TTL)
    error = LastError("ValueError", "bad row 7", NOW + 1, "a")
    assert leases.release(a, state={"cursor": 7, "seen": ["x", "é"]}, error=error)
    b = leases.acquire(S, "o-1", "b", NOW + 2, TTL)
    assert b.state == {"cursor": 7, "seen": ["x", "é"]} and b.last_error == error
    assert leases.release(b)  # neither given: both kept
    c = leases.acquire(S, "o-1", "c", NOW + 3, TTL)
    assert c.state == {"cursor": 7, "seen": ["x", "é"]} and c.last_error == error
    # c never releases: d takes over after expiry and still finds them
    d = leases.acquire(S, "o-1", "d", c.expires_at, TTL)
    assert d.state == c.state and d.last_error == error and d.previous.holder == "c"
    assert leases.release(d, state={})
    assert leases.inspect(S, "o-1")[0].state == {}


def test_a_state_that_is_not_small_json_is_refused_before_anything_is_written(harness):
    leases = harness.open()
    a = leases.acquire(S, "o-1", "a", NOW, TTL)
    with pytest.raises(StateError, match="bytes"):
        leases.release(a, state={"blob": "x" * STATE_MAX_BYTES})
    with pytest.raises(StateError, match="JSON"):
        leases.release(a, state={"when": object()})
    with pytest.raises(StateError):
        leases.release(a, state={"n": float("nan")})
    assert leases.inspect(S, "o-1")[0].holder == "a"  # still held
    assert leases.release(a, state={"blob": "x" * (STATE_MAX_BYTES - 20)})


def test_keys_are_limited_in_utf8_bytes(harness):
    leases = harness.open()
    longest = "é" * 512  # 1,024 bytes in 1,024 / 2 characters
    assert leases.acquire(S, longest, "a", NOW, TTL).key == longest
    assert leases.inspect(S, longest)[0].holder == "a"
    with pytest.raises(BadLeaseName, match="1,025 bytes"):
        leases.acquire(S, longest + "x", "a", NOW, TTL)
    for bad in ("", "\ud800"):
        with pytest.raises(BadLeaseName):
            leases.acquire(S, bad, "a", NOW, TTL)
    for scope in ("", "a#b", "x" * 129):
        with pytest.raises(BadLeaseName):
            leases.acquire(scope, "k", "a", NOW, TTL)
    for limit in (0, 101, True):
        with pytest.raises(BadLeaseName):
            leases.acquire(S, "k", "a", NOW, TTL, limit=limit)
    with pytest.raises(BadLeaseName):
        leases.acquire(S, "k", "", NOW, TTL)
    assert leases.acquire(S, "a#0", "a", NOW, TTL).key == "a#0"  # '#' inside a key is fine


def test_sixteen_acquirers_of_a_mutex_one_wins(harness):
    leases = harness.open()
    mine = [harness.beside(leases, seed=i) for i in range(16)]
    got = in_threads(16, lambda i: try_acquire(mine[i], S, "o-1", f"h{i}", NOW, TTL))
    won = [g for g in got if isinstance(g, Lease)]
    assert len(won) == 1
    assert {b.holder for b in got if isinstance(b, Busy)} == {won[0].holder}
    assert leases.inspect(S, "o-1")[0].holder == won[0].holder


def test_sixteen_acquirers_of_limit_five_exactly_five_win(harness):
    leases = harness.open()
    mine = [harness.beside(leases, seed=i) for i in range(16)]
    got = in_threads(16, lambda i: try_acquire(mine[i], S, "t-1", f"h{i}", NOW, TTL, limit=5))
    won = [g for g in got if isinstance(g, Lease)]
    assert len(won) == 5 and {w.slot for w in won} == set(range(5))
    holders = {w.holder for w in won}
    assert {item.holder for item in leases.inspect(S, "t-1", limit=5)} == holders
    refusals = [b for b in got if isinstance(b, Busy)]
    assert all({h.holder for h in b.holders} <= holders for b in refusals)
    assert refusals and all(len(b.holders) == 5 for b in refusals)  # every item tried, each held


def test_with_limit_n_an_acquire_asked_again_takes_no_second_item(harness):
    leases = harness.open()
    first = leases.acquire(S, "t-1", "a", NOW, TTL, limit=3)
    for _ in range(5):
        assert leases.acquire(S, "t-1", "a", NOW, TTL, limit=3).slot == first.slot
    assert [i.holder for i in leases.inspect(S, "t-1", limit=3)].count("a") == 1


@pytest.mark.parametrize("limit", [1, 3])
def test_acquirers_in_a_loop_are_never_more_than_the_limit(harness, limit):
    leases = harness.open()
    inside = Inside()

    def work(i: int) -> int:
        me, rng, held = harness.beside(leases, seed=i), random.Random(i), 0
        for j in range(6):
            got = try_acquire(me, S, "hot", f"w{i}-{j}", NOW, TTL, limit=limit)
            if isinstance(got, Busy):
                continue
            inside.enter()
            held += 1
            if rng.random() < 0.5:
                me.inspect(S, "hot", limit)  # some work while holding
            inside.leave()
            assert me.release(got)
        return held

    total = sum(in_threads(8, work))
    assert inside.peak <= limit and total == inside.entries > 0
    assert all(item.holder is None for item in leases.inspect(S, "hot", limit))


# -- DynamoDB only ---------------------------------------------------------------------------------


@pytest.fixture
def table(session):
    client = session.client("dynamodb")
    create_table(client, TABLE)
    return client


def raw_item(client: Any, pk: str) -> dict[str, Any]:
    return plain(client.get_item(TableName=TABLE, Key={"pk": {"S": pk}}, ConsistentRead=True)["Item"])


def calls(client: Any) -> list[str]:
    seen: list[str] = []
    client.meta.events.register("before-call.dynamodb.*", lambda model, **_: seen.append(model.name))
    return seen


def test_the_item_holds_the_lease_as_documented(table):
    leases = DynamoLeases(table, TABLE)
    lease = leases.acquire(S, "o-1", "a", NOW + 0.25, TTL)
    assert lease_pk(S, "o-1", 0) == "LEASE#orders#o-1#0"
    item = raw_item(table, "LEASE#orders#o-1#0")
    assert {
        k: item[k] for k in ("holder", "expires_at", "acquired_at", "version", "scope", "key", "slot")
    } == {
        "holder": "a",
        "expires_at": NOW + 0.25 + TTL,
        "acquired_at": NOW + 0.25,
        "version": 1,
        "scope": S,
        "key": "o-1",
        "slot": 0,
    }
    leases.release(lease, state={"b": 1, "a": [2]}, error=LastError("E", "m", NOW, "a"))
    item = raw_item(table, "LEASE#orders#o-1#0")
    assert "holder" not in item and item["state"] == '{"a":[2],"b":1}'
    assert item["last_error"] == {"type": "E", "message": "m", "at": NOW, "holder": "a"}


def test_a_mutex_acquire_is_one_write_and_limit_n_one_read_and_at_most_n_writes(table):
    leases = DynamoLeases(table, TABLE, rng=random.Random(3))
    seen = calls(table)
    leases.acquire(S, "o-1", "a", NOW, TTL)
    assert seen == ["UpdateItem"]
    seen.clear()
    assert isinstance(try_acquire(leases, S, "o-1", "b", NOW, TTL), Busy)
    assert seen == ["UpdateItem"]  # the refusal carries the holder: no read
    for i in range(3):
        leases.acquire(S, "t-1", f"h{i}", NOW, TTL, limit=3)
    seen.clear()
    assert isinstance(try_acquire(leases, S, "t-1", "x", NOW, TTL, limit=3), Busy)
    assert seen == ["BatchGetItem"] + ["UpdateItem"] * 3


def test_client_errors_never_escape(table, session):
    leases = DynamoLeases(table, TABLE)
    lease = leases.acquire(S, "o-1", "a", NOW, TTL)
    throttle(table, "UpdateItem", times=3)
    with pytest.raises(TransientError):
        leases.acquire(S, "o-2", "a", NOW, TTL)
    with pytest.raises(TransientError):
        leases.renew(lease, NOW, TTL)
    with pytest.raises(TransientError):
        leases.release(lease)
    assert leases.release(lease)  # the throttling is over: the lease was never lost
    table.meta.events.register(
        "before-call.dynamodb.BatchGetItem", lambda **_: error_answer("InternalServerError", 500)
    )
    with pytest.raises(TransientError):
        leases.inspect(S, "o-1")
    with pytest.raises(ConfigurationError):
        DynamoLeases(session.client("dynamodb"), "no-such-table").acquire(S, "o-1", "a", NOW, TTL)

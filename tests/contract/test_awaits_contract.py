"""The store's side of awaits (``sluice.awaits.AwaitStore``), on MemoryStore and DynamoStore (moto)."""

from __future__ import annotations

from sluice.awaits import Waiter
from sluice.model import PayloadState
from tests.contract.stores import NOW, claim


def waiter(message_id: str = "m1", *awaits: str, at: float = NOW) -> Waiter:
    return Waiter(
        message_id=message_id,
        key=f"w-{message_id}",
        body='{"id": "w"}',
        group_id="g",
        attributes={"sluice-awaits": '["a", "b"]'},
        awaits=awaits or ("a", "b"),
        run_anyway=False,
        parked_at=at,
    )


def test_payloads_reads_the_records_that_exist(store):
    claim(store, "a", "na")
    store.release(name="na", state=PayloadState.SUCCEEDED, now=NOW)
    found = store.payloads(["a", "missing"])
    assert set(found) == {"a"} and found["a"].succeeded_by == "na"
    assert store.payloads([]) == {}


def test_a_waiter_is_parked_on_each_missing_key_and_indexed(store):
    store.park_waiter(waiter("m1"), ["a", "b"])
    store.park_waiter(waiter("m2", "b"), ["b"])
    assert store.waiters_on("a") == {"m1"} and store.waiters_on("b") == {"m1", "m2"}
    assert store.waiters_on("c") == frozenset()
    assert store.waiting() == {"m1", "m2"}
    (first,) = store.waiters(["m1", "unknown"])
    assert first == waiter("m1")
    assert first.parked


def test_parking_again_is_a_no_op_and_keeps_the_first_time(store):
    store.park_waiter(waiter("m1"), ["a", "b"])
    store.park_waiter(waiter("m1", at=NOW + 50), ["a", "b"])
    assert store.waiting() == {"m1"} and store.waiters_on("a") == {"m1"}
    assert store.waiters(["m1"])[0].parked_at == NOW


def test_release_marks_it_once_and_takes_it_off_every_set(store):
    w = waiter("m1")
    store.park_waiter(w, ["a", "b"])
    assert store.release_waiter(w, how="dead-lettered", reason="awaited a ended FAILED", now=NOW + 5)
    assert not store.release_waiter(w, how="sent", reason=None, now=NOW + 6)
    assert store.waiting() == frozenset() and store.waiters_on("a") == store.waiters_on("b") == frozenset()
    (released,) = store.waiters(["m1"])
    assert (released.parked, released.released_at, released.how, released.reason) == (
        False,
        NOW + 5,
        "dead-lettered",
        "awaited a ended FAILED",
    )


def test_a_released_waiter_parks_afresh(store):
    w = waiter("m1")
    store.park_waiter(w, ["a"])
    store.release_waiter(w, how="sent", reason=None, now=NOW + 5)
    store.park_waiter(waiter("m1", at=NOW + 9), ["a"])
    (again,) = store.waiters(["m1"])
    assert again.parked and again.parked_at == NOW + 9 and store.waiting() == {"m1"}

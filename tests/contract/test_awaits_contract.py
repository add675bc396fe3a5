"""The store's side of awaits (``sluice.features.awaits.AwaitStore``), on MemoryStore and DynamoStore (moto)."""

from __future__ import annotations

from dataclasses import replace

from sluice.core.model import Ending, PayloadState
from sluice.features.awaits import Waiter
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
    store.release("na", Ending(PayloadState.SUCCEEDED, NOW))
    found = store.payloads(["a", "missing"])
    assert set(found) == {"a"} and found["a"].succeeded_by == "na"
    assert store.payloads([]) == {}


def test_waiters_of_two_keys_with_one_origin_park_apart(store):
    """A producer's message of another key carrying the same ``sluice-origin-message-id`` is another
    waiter (another name): it parks beside the one waiting, under its name, never taken for its
    redelivery; a redelivery of either parks again as a no-op."""
    a, b = waiter("m1", "a"), replace(waiter("m1", "a"), key="other")
    assert store.park_waiter(a, ["a"]) == a
    beside = store.park_waiter(b, ["a"])
    assert beside == replace(b, by_name=True) and beside.entry not in {a.entry, b.entry}
    assert store.park_waiter(a, ["a"]) == a and store.park_waiter(b, ["a"]) == beside
    assert store.waiters_on("a") == store.waiting() == {a.entry, beside.entry}
    assert {w.key: w for w in store.waiters([a.entry, beside.entry])} == {"w-m1": a, "other": beside}
    assert store.release_waiter(beside, how="sent", reason=None, now=NOW + 1)
    assert store.waiters_on("a") == {a.entry} and store.waiters([a.entry])[0].parked


def test_a_waiter_of_another_key_parks_beside_a_released_waiter_under_its_id(store):
    """The released waiter's release may still be taking its id off the sets: parked under that id,
    the other key's waiter would be taken off with it. It parks under its name; the same waiter
    parks afresh under its id."""
    a, b = waiter("m1", "a"), replace(waiter("m1", "a"), key="other")
    store.park_waiter(a, ["a"])
    assert store.release_waiter(a, how="sent", reason=None, now=NOW + 1)
    assert store.park_waiter(b, ["a"]) == replace(b, by_name=True)
    assert (
        store.park_waiter(
            a,
            ["a"],
        )
        == a
        and store.waiters([a.entry])[0].parked
    )


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


def test_a_release_says_whether_its_key_was_ever_awaited(store):
    """The release tells the completion whether to read the key's waiters: only once a waiter
    parked on it, before or during its run (a flag on the key's record that a release never lifts)."""
    claim(store, "a", "na")
    assert store.release("na", Ending(PayloadState.SUCCEEDED, NOW)).awaited is False
    store.park_waiter(waiter("m1", "b"), ["b"])
    assert store.payload("b") is None  # the flag of a key never seen is no payload record
    claim(store, "b", "nb")
    claim(store, "a", "na2")
    store.park_waiter(waiter("m2", "a"), ["a"])  # parked while a's run is live
    assert store.release("nb", Ending(PayloadState.FAILED, NOW + 1)).awaited is True
    assert store.release("na2", Ending(PayloadState.SUCCEEDED, NOW + 2)).awaited is True
    claim(store, "b", "nb2", now=NOW + 3)
    assert store.release("nb2", Ending(PayloadState.SUCCEEDED, NOW + 4)).awaited is True  # kept


def test_a_park_of_more_keys_than_one_transaction_holds_flags_them_all(store):
    keys = [f"k{i:02d}" for i in range(60)]
    store.park_waiter(waiter("m1", *keys), keys)
    assert store.waiters_on("k59") == {"m1"}
    claim(store, "k59", "n59")
    assert store.release("n59", Ending(PayloadState.SUCCEEDED, NOW)).awaited is True

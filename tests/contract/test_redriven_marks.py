"""The Store port's redriven marks, on MemoryStore and DynamoStore (moto): a key keeps a mark for
each redriven run seen while another run held its lease, and no claim takes the lease until each
is lifted."""

from __future__ import annotations

import pytest

from sluice.core.errors import LeaseHeld
from sluice.core.model import Ending, PayloadState
from tests.contract.stores import NOW, claim


def test_a_second_redriven_mark_is_kept_beside_the_first(store):
    claim(store, "k", "n1")
    assert store.mark_redriven(key="k", name="r1", now=NOW)
    assert store.mark_redriven(key="k", name="r2", now=NOW)
    assert store.mark_redriven(key="k", name="r1", now=NOW)  # seen again: unchanged
    payload = store.payload("k")
    assert (payload.redriven, payload.redriven_more) == ("r1", frozenset({"r2"}))
    assert not store.mark_redriven(key="k", name="n1", now=NOW)  # the holder itself


def test_no_claim_takes_the_lease_until_every_redriven_mark_is_lifted(store):
    claim(store, "k", "n1")
    store.mark_redriven(key="k", name="r1", now=NOW)
    store.mark_redriven(key="k", name="r2", now=NOW)
    assert store.release("n1", Ending(PayloadState.SUCCEEDED, NOW)) is not None
    assert store.clear_redriven(key="k", name="r1")
    with pytest.raises(LeaseHeld) as held:
        claim(store, "k", "n2")
    assert held.value.existing.holder is None and held.value.existing.redriven_more == {"r2"}
    assert store.clear_redriven(key="k", name="r2")
    assert not store.clear_redriven(key="k", name="r2")
    claim(store, "k", "n2")
    assert store.payload("k").holder == "n2"


def test_an_adoption_lifts_its_own_further_mark(store):
    claim(store, "k", "r2")
    assert store.release("r2", Ending(PayloadState.FAILED, NOW)) is not None
    claim(store, "k", "n1")
    store.mark_redriven(key="k", name="r1", now=NOW)
    store.mark_redriven(key="k", name="r2", now=NOW)  # r2 redriven: a further mark
    assert store.release("n1", Ending(PayloadState.SUCCEEDED, NOW)) is not None
    assert store.adopt(name="r2", now=NOW + 1)
    payload = store.payload("k")
    assert payload.holder == "r2" and payload.redriven_more == frozenset()
    assert payload.redriven == "r1"  # another run's mark stays: r1 may run beside r2


def test_an_adoption_keeps_the_redrive_date_it_was_given(store):
    """The record of an adopted run keeps Step Functions' redrive date: no end before it is that
    run's (``completion.before_its_redrive``). An adoption with no date reported keeps the one
    before, which no end of a later run can be older than."""
    claim(store, "k", "e1")
    assert store.release("e1", Ending(PayloadState.FAILED, NOW, ended_at=NOW - 5)) is not None
    assert store.adopt(name="e1", now=NOW + 10, redriven_at=NOW + 3)
    record = store.execution("e1")
    assert (record.earlier_end_at, record.redriven_at) == (NOW - 5, NOW + 3)
    assert store.release("e1", Ending(PayloadState.FAILED, NOW + 20, ended_at=NOW + 15)) is not None
    assert store.adopt(name="e1", now=NOW + 30)
    record = store.execution("e1")
    assert (record.earlier_end_at, record.redriven_at) == (NOW + 15, NOW + 3)


def test_a_keys_one_mark_is_stamped_by_its_clock_and_moved_only_by_it(store):
    """The stamp a claim judges the mark's age by (``PayloadRecord.marks_age``): written by a first
    mark, moved by that clock's next sighting, removed by another clock's or by a further mark."""
    claim(store, "k", "n1")
    assert store.mark_redriven(key="k", name="r1", now=NOW, by="A")
    assert store.payload("k").marks_age(NOW + 5, "A") == 5
    assert store.payload("k").marks_age(NOW + 5, "B") is None  # another clock's stamp: unknown
    assert store.mark_redriven(key="k", name="r1", now=NOW + 10, by="A")  # seen again by A
    assert store.payload("k").marks_age(NOW + 15, "A") == 5
    assert store.mark_redriven(key="k", name="r1", now=NOW + 20, by="B")  # seen by B: unstamped
    payload = store.payload("k")
    assert (payload.redriven, payload.redriven_at, payload.redriven_by) == ("r1", None, None)
    assert payload.sighting_moves_nothing("r1")
    assert store.mark_redriven(key="k", name="r1", now=NOW + 30, by="A")  # stays unstamped
    assert store.payload("k").redriven_at is None


def test_a_further_mark_removes_the_stamp(store):
    claim(store, "k", "n1")
    store.mark_redriven(key="k", name="r1", now=NOW, by="A")
    assert store.mark_redriven(key="k", name="r2", now=NOW + 1, by="A")
    payload = store.payload("k")
    assert payload.redriven_more == {"r2"} and payload.redriven_at is None
    assert payload.marks_age(NOW + 500, "A") is None


def test_a_lift_judged_on_a_stamp_keeps_a_mark_stamped_since(store):
    """A claim that judged the mark old by the stamp it read lifts it only while that stamp is there:
    a sighting since (moved, or removed by another clock) keeps the mark."""
    claim(store, "k", "n1")
    store.mark_redriven(key="k", name="r1", now=NOW, by="A")
    judged = store.payload("k")
    store.mark_redriven(key="k", name="r1", now=NOW + 10, by="A")
    assert not store.clear_redriven(key="k", name="r1", as_read=judged)
    assert store.payload("k").redriven == "r1"
    assert store.clear_redriven(key="k", name="r1", as_read=store.payload("k"))
    payload = store.payload("k")
    assert (payload.redriven, payload.redriven_at, payload.redriven_by) == (None, None, None)


def test_an_adoption_removes_the_stamp(store):
    claim(store, "k", "r1")
    assert store.release("r1", Ending(PayloadState.FAILED, NOW)) is not None
    store.mark_redriven(key="k", name="r1", now=NOW + 1, by="A")
    assert store.adopt(name="r1", now=NOW + 2)
    payload = store.payload("k")
    assert (payload.holder, payload.redriven, payload.redriven_at, payload.redriven_by) == (
        "r1",
        None,
        None,
        None,
    )

"""The store contract for the caps, on MemoryStore and DynamoStore (moto) alike: the external count
ordered by its listing.

A reconciliation numbers its listing on both sides (``listed_after`` before ListExecutions, ``count``
after it): a count replaces the one in force only when its listing began after that one was
numbered; two listings that overlap keep the larger count (``sluice.external``).
"""

from __future__ import annotations

from sluice.model import LimitSource
from tests.contract.stores import NOW

MAX_AT = 1000.0  # when MAX was last set: both sources read the same MAX


def listing(store) -> tuple[int, int]:
    """The two numbers a reconciliation takes around its listing."""
    return store.next_count(), store.next_count()


def source(external: int, numbers: tuple[int, int], max_value: int = 4) -> LimitSource:
    listed_after, count = numbers
    return LimitSource(max_value, MAX_AT, external, count, 0, listed_after)


def test_an_overlapping_listing_numbered_last_never_lowers_the_count_it_did_not_see(store):
    """Tick A lists (0 outside), X is started by hand, tick B lists (1) and saves; A saves last."""
    a_before = store.next_count()
    b = listing(store)
    a = (a_before, store.next_count())
    assert store.set_limit(source(1, b)) == 3
    assert store.save_reconciliation(external=1, drift=1, now=NOW, count=b[1], listed_after=b[0])
    assert store.set_limit(source(0, a)) == 3  # A's listing may be the older one: the larger count stands
    store.save_reconciliation(external=0, drift=0, now=NOW + 1, count=a[1], listed_after=a[0])
    ledger = store.ledger()
    assert (ledger.external, ledger.count) == (1, a[1])


def test_an_overlapping_listing_numbered_first_keeps_its_larger_count(store):
    """The other order: A numbers first and lists late (it sees X); B numbers after A, lists before X
    was started and saves last with the higher number."""
    a_before, b_before = store.next_count(), store.next_count()
    a = (a_before, store.next_count())  # A lists after X started: 1 outside
    b = (b_before, store.next_count())  # B listed before X started: 0
    assert store.set_limit(source(1, a)) == 3
    store.save_reconciliation(external=1, drift=0, now=NOW, count=a[1], listed_after=a[0])
    assert store.set_limit(source(0, b)) == 3
    assert store.save_reconciliation(external=0, drift=0, now=NOW + 1, count=b[1], listed_after=b[0])
    assert store.ledger().external == 1


def test_a_listing_begun_after_the_count_in_force_was_numbered_lowers_it(store):
    first = listing(store)
    assert store.set_limit(source(2, first)) == 2
    store.save_reconciliation(external=2, drift=0, now=NOW, count=first[1], listed_after=first[0])
    later = listing(store)  # the executions outside ended before this listing
    assert store.set_limit(source(0, later)) == 4
    assert store.save_reconciliation(external=0, drift=0, now=NOW + 1, count=later[1], listed_after=later[0])
    ledger = store.ledger()
    assert (ledger.external, ledger.count, ledger.listed_after) == (0, later[1], later[0])


def test_a_launcher_holding_the_ledger_of_an_overlapping_listing_keeps_the_larger_count(store):
    """The launcher puts MAX − LEDGER's count in force: LEDGER keeps the merged count, so a launcher
    that read it after both saves puts the larger count in force, not the last saved."""
    a_before = store.next_count()
    b = listing(store)
    a = (a_before, store.next_count())
    store.save_reconciliation(external=1, drift=0, now=NOW, count=b[1], listed_after=b[0])
    store.save_reconciliation(external=0, drift=0, now=NOW + 1, count=a[1], listed_after=a[0])
    ledger = store.ledger()
    assert store.set_limit(LimitSource(4, MAX_AT, ledger.external, ledger.count, 0, ledger.listed_after)) == 3


def test_a_listing_older_than_the_count_in_force_changes_nothing(store):
    old = listing(store)
    new = listing(store)
    assert store.set_limit(source(1, new)) == 3
    store.save_reconciliation(external=1, drift=0, now=NOW, count=new[1], listed_after=new[0])
    assert store.set_limit(source(0, old)) == 3
    assert not store.save_reconciliation(external=3, drift=0, now=NOW + 1, count=old[1], listed_after=old[0])
    ledger = store.ledger()
    assert (ledger.external, ledger.count, ledger.reconciled_at) == (1, new[1], NOW)

"""Attacks on the launcher pool's limit in force when writers race its creation (``only_new``).

Promise: the limit in force (read fresh) is never above MAX − the larger external count of two
overlapping listings (the newer listing's when one began after the other was numbered), whatever
order the launchers (``DynamoStore`` instances, each with its own cached view) read and write in.
Writers are interleaved with botocore ``before-call`` hooks on each store's own client.
"""

from __future__ import annotations

from itertools import permutations

import pytest

from sluice.adapters.dynamo.store import DynamoStore, create_table
from sluice.core.limits import LimitSource, MaxReading

TABLE = "attacks"
MAX = 10
T0 = 1_000.0  # when MAX last changed


@pytest.fixture
def make(session):
    create_table(session.client("dynamodb"), TABLE)
    return lambda: DynamoStore(session.client("dynamodb"), TABLE, retention_seconds=3600)


def in_force(make) -> int | None:
    return make().ledger().in_force


def src(external: int, count: int, listed_after: int, *, value: int = MAX, at: float = T0, version: int = 1):
    return LimitSource(value, at, external, count, version, listed_after)


def before(store: DynamoStore, operation: str, action) -> list[bool]:
    """Run ``action`` once, just before ``store``'s next ``operation`` call goes out (the list: fired)."""
    fired: list[bool] = []

    def hook(**_kwargs):
        if not fired:
            fired.append(True)
            action()

    store.client.meta.events.register(f"before-call.dynamodb.{operation}", hook)
    return fired


def listing(store: DynamoStore) -> int:
    """``listed_after`` of a listing that starts now (as reconcile takes it)."""
    return store.ledger().numbered + 1


def test_stale_no_pool_view_merges_with_pool_created_since(make):
    a, b = make(), make()
    la = listing(a)
    assert listing(b) == la and a.ledger().in_force is None  # both saw no pool
    cb = b.next_count()  # B listed 1 outside (started by hand while the listings overlapped)
    ca = a.next_count()  # A listed 0 outside, numbered after B
    b.set_limit(src(1, cb, la))
    assert a.set_limit(src(0, ca, la)) is not None
    assert in_force(make) == MAX - 1


@pytest.mark.parametrize("a_first", [True, False])
@pytest.mark.parametrize(("ext_a", "ext_b"), [(0, 1), (1, 0), (2, 1), (0, 0)])
def test_create_lost_inside_the_transaction(make, ext_a, ext_b, a_first):
    a, b = make(), make()
    la = listing(a)
    listing(b)
    ca, cb = (a.next_count(), b.next_count()) if a_first else reversed((b.next_count(), a.next_count()))
    fired = before(a, "TransactWriteItems", lambda: b.set_limit(src(ext_b, cb, la)))
    a.set_limit(src(ext_a, ca, la))
    assert fired
    assert in_force(make) <= MAX - max(ext_a, ext_b)


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 2, 0)])
@pytest.mark.parametrize("exts", list(permutations((0, 1, 2))))
def test_three_nested_creates(make, exts, order):
    stores = [make(), make(), make()]
    la = listing(stores[0])
    for s in stores[1:]:
        listing(s)
    numbered = {i: stores[i].next_count() for i in order}  # the order the three number in
    counts = [numbered[i] for i in range(3)]
    sources = [src(e, c, la) for e, c in zip(exts, counts, strict=True)]
    # A's create runs B's inside it, whose create runs C's inside it.
    outer = before(stores[0], "TransactWriteItems", lambda: stores[1].set_limit(sources[1]))
    inner = before(stores[1], "TransactWriteItems", lambda: stores[2].set_limit(sources[2]))
    stores[0].set_limit(sources[0])
    assert outer and inner
    assert in_force(make) <= MAX - 2
    for s, source in zip(stores, sources, strict=True):  # each again, in any later order
        s.set_limit(source)
        assert in_force(make) <= MAX - 2


def test_stale_older_listing_does_not_undo_newer_created_pool(make):
    a, b = make(), make()
    la_a = listing(a)
    listing(b)  # B's view: no pool either
    ca = a.next_count()  # A listed 0 outside
    la_b = b.ledger().numbered + 1  # B's listing begins after A's was numbered
    cb = b.next_count()
    assert la_b > ca
    b.set_limit(src(2, cb, la_b))  # B, newer, saw 2 outside
    a.set_limit(src(0, ca, la_a))  # A's view still has no pool
    assert in_force(make) <= MAX - 2


@pytest.mark.parametrize(
    ("max_a", "max_b", "ext_a", "ext_b", "bound"),
    [
        ((12, T0 + 5, 1), (MAX, T0, 1), 0, 1, 11),  # A raised MAX, B counted 1
        ((MAX, T0, 1), (6, T0 + 5, 1), 2, 0, 4),  # B lowered MAX, A counted 2
        ((MAX, T0, 1), (7, T0, 2), 3, 0, 4),  # same change time, B's version newer
        ((5, T0 + 9, 3), (MAX, T0, 1), 0, 4, 1),  # A lowered MAX under B's count
    ],
)
def test_max_changes_while_creates_race(make, max_a, max_b, ext_a, ext_b, bound):
    a, b = make(), make()
    la = listing(a)
    listing(b)
    ca, cb = a.next_count(), b.next_count()
    sa = src(ext_a, ca, la, value=max_a[0], at=max_a[1], version=max_a[2])
    sb = src(ext_b, cb, la, value=max_b[0], at=max_b[1], version=max_b[2])
    fired = before(a, "TransactWriteItems", lambda: b.set_limit(sb))
    a.set_limit(sa)
    assert fired
    assert in_force(make) <= bound
    b.set_limit(sb)  # B, whose view is the pool it wrote, once more
    assert in_force(make) <= bound


def test_restamp_raced_by_larger_overlapping_count(make):
    w, a, b = make(), make(), make()
    w.set_limit(src(1, w.next_count(), listing(w)))  # pool: MAX 10 − 1
    la = listing(a)
    listing(b)
    ca, cb = a.next_count(), b.next_count()
    # A: MAX raised to 11 and 2 outside: the same limit 9, so only a restamp (an UpdateItem)...
    fired = before(a, "UpdateItem", lambda: b.set_limit(src(3, cb, la)))  # ...raced by B's 3 outside
    a.set_limit(src(2, ca, la, value=11, at=T0 + 1))
    assert fired
    assert in_force(make) <= 11 - 3


@pytest.mark.parametrize("pool_before_tick", [True, False])
def test_tick_with_ledger_read_before_a_newer_reconciliation(make, pool_before_tick):
    r, tick = make(), make()
    la0 = listing(r)
    c0 = r.next_count()
    if pool_before_tick:
        r.set_limit(src(0, c0, la0))
    r.save_reconciliation(external=0, drift=0, now=T0, count=c0, listed_after=la0)
    seen = tick.ledger()  # the tick reads LEDGER (count c0) and the pool
    la1 = listing(r)  # a newer reconciliation lists: 1 outside now
    c1 = r.next_count()
    r.set_limit(src(1, c1, la1))
    r.save_reconciliation(external=1, drift=1, now=T0 + 1, count=c1, listed_after=la1)
    tick.set_limit(seen.source(MaxReading(MAX, T0, 1)))
    assert in_force(make) <= MAX - 1


def test_adoption_create_raced_by_reconciliation(make):
    """An adoption that finds no pool creates one (limit 0) only while none exists: a pool a
    reconciliation made meanwhile keeps its limit and its count's stamp, which a stale tick's
    write then merges with (before, the create overwrote it, the stamp went, and the tick put
    MAX − 0 in force)."""
    r, adopter, tick = make(), make(), make()
    la0 = listing(r)
    c0 = r.next_count()
    r.save_reconciliation(external=0, drift=0, now=T0, count=c0, listed_after=la0)  # no MAX read yet
    seen = tick.ledger()  # LEDGER: 0 outside, count c0; no pool

    def reconcile():  # a newer listing (began after c0): 1 outside; caps first, then saved
        la1 = listing(r)
        c1 = r.next_count()
        r.set_limit(src(1, c1, la1))

    fired = before(adopter, "TransactWriteItems", reconcile)
    adopter.launch_slots.adopt_items("redriven", T0)  # read: no pool; creates it with limit 0
    assert fired and in_force(make) <= MAX - 1
    tick.set_limit(seen.source(MaxReading(MAX, T0, 1)))  # the tick's LEDGER read predates the save
    assert in_force(make) <= MAX - 1


def test_an_adoption_create_that_overwrites_the_pool_is_caught(make, monkeypatch):
    """The variant ``adoption_create_overwrites`` (tests/explorer/broken.py, the code before the fix)
    fails the attack above."""
    from tests.explorer.broken import VARIANTS

    for owner, attr, value in VARIANTS["adoption_create_overwrites"][1]:
        monkeypatch.setattr(owner, attr, value)
    with pytest.raises(AssertionError):
        test_adoption_create_raced_by_reconciliation(make)

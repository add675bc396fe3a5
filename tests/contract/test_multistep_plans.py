"""A plan of more than 99 cap moves takes several transactions (``DynamoSlots._plan``), and other
planners, claimers and adopters act between them. Each case interleaves real adapters on moto call by
call (tests/support/stepper.py) and checks the pool as stored with the world's check
(``pool_ceilings``: no pool may admit past its limit without a re-plan), then claims whatever the
stored caps admit."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.adapters.dynamo.slots import DynamoSlots
from sluice.adapters.dynamo.store import create_table
from sluice.primitives.slots import Capacity
from tests.reliability.promises import pool_ceilings
from tests.support.stepper import Stepper

TABLE, POOL, NOW = "multistep", "launcher", 1_800_000_000.0


@pytest.fixture
def actors(session):
    """A table and three planners of shards of one holder, each with a client of its own."""
    create_table(session.client("dynamodb"), TABLE)
    return [
        DynamoSlots(session.client("dynamodb"), TABLE, per_shard=1, sleep=lambda _s: None) for _ in range(3)
    ]


def stored(slots: DynamoSlots) -> dict[str, dict[str, Any]]:
    items: dict[str, dict[str, Any]] = {}
    pages = slots.client.get_paginator("scan").paginate(TableName=TABLE, ConsistentRead=True)
    for page in pages:
        items.update({item["pk"]["S"]: item for item in page["Items"]})
    return items


def admitted(slots: DynamoSlots) -> int:
    """Claims on every shard with room, as a crowd of launchers would make them."""
    got = 0
    for shard in slots.occupancy(POOL).shards:
        for i in range(shard.room):
            slots.claim(POOL, shard.index, f"c{shard.index}-{i}", NOW)
            got += 1
    return got


def assert_bounded(slots: DynamoSlots) -> None:
    assert pool_ceilings(stored(slots)) == []
    view = slots.occupancy(POOL)
    running = view.running + admitted(slots)
    assert running <= max(view.limit, view.running), f"{running} run under limit {view.limit}"


def test_a_lowering_read_between_a_raises_transactions_never_keeps_caps_it_did_not_see(actors):
    """Limit 40 on 150 shards. A raises it to 150 (110 moves: two transactions); B lowers it to 30,
    reading after A's first transaction and writing after A's second. B's plan never saw the caps A's
    second transaction raised: its write must not land as planned."""
    base, a, b = actors
    base.set_limit(Capacity(POOL, 150))
    base.set_limit(Capacity(POOL, 40))
    raising = Stepper(a.client, lambda: a.set_limit(Capacity(POOL, 150)))
    lowering = Stepper(b.client, lambda: b.set_limit(Capacity(POOL, 30)))
    raising.until_write(2)
    lowering.until_write(1)
    raising.go()
    lowering.finish()
    raising.finish()
    assert b.occupancy(POOL).limit == 30
    assert_bounded(b)


def test_a_lowering_read_between_a_thaws_transactions_leaves_no_free_cap_in_a_frozen_pool(actors):
    """150 ran under 150, MAX lowered to 140 froze the pool; 20 ended. A thaws (130 caps raised: two
    transactions); B lowers the limit to 100, reading between A's transactions: 130 run, so B freezes
    again, and no cap A raised meanwhile may be left with room."""
    base, a, b = actors
    base.set_limit(Capacity(POOL, 150))
    for i in range(150):
        base.claim(POOL, i, f"h{i}", NOW)
    base.set_limit(Capacity(POOL, 140))
    for i in range(20):
        assert base.release(POOL, i, f"h{i}")
    assert base.occupancy(POOL).frozen
    thaw = Stepper(a.client, lambda: a.rebalance(POOL))
    lowering = Stepper(b.client, lambda: b.set_limit(Capacity(POOL, 100)))
    thaw.until_write(2)
    lowering.until_write(1)
    thaw.go()
    lowering.finish()
    thaw.finish()
    view = b.occupancy(POOL)
    assert (view.limit, view.frozen, view.running) == (100, True, 130)
    assert_bounded(b)
    assert admitted(b) == 0


def test_a_lowering_that_dies_between_its_transactions_admits_no_more_than_its_stored_limit(actors):
    """150 → 50 (100 moves: two transactions). The planner dies after its first: whatever the pool
    as stored says, its caps must not admit past the limit it stores, and the next plan finishes."""
    base, a, b = actors
    base.set_limit(Capacity(POOL, 150))
    dies = Stepper(a.client, lambda: a.set_limit(Capacity(POOL, 50)))
    dies.until_write(2)  # never let go: it died there
    assert pool_ceilings(stored(b)) == []
    half = b.occupancy(POOL)
    assert half.caps <= half.limit and half.caps < 150, "the first transaction lowered no cap"
    assert b.set_limit(Capacity(POOL, 50)) is not None
    view = b.occupancy(POOL)
    assert (view.limit, view.caps) == (50, 50)


@pytest.mark.parametrize("limit", [50, 150])
def test_a_planner_overtaken_between_its_transactions_never_puts_its_older_stamp_back(actors, limit):
    """A plans limit ``limit`` from a reading stamped 5 (two transactions from 150 or 40); between
    them B sets the same limit from a newer reading (9). A must not write its stamp back over B's:
    a writer stamped 7 comes after and is refused."""
    base, a, b = actors
    base.set_limit(Capacity(POOL, 150 if limit == 50 else 40, stamp=(1.0,)))
    older = Stepper(a.client, lambda: a.set_limit(Capacity(POOL, limit, stamp=(5.0,))))
    older.until_write(2)
    assert b.set_limit(Capacity(POOL, limit, stamp=(9.0,))) is not None
    older.finish()
    assert b.occupancy(POOL).stamp == (9.0,)
    assert b.set_limit(Capacity(POOL, 200, stamp=(7.0,))) is None
    assert_bounded(b)


def test_the_plan_with_its_limit_first_is_caught(actors, monkeypatch):
    """The variant ``plan_steps_unversioned`` (tests/explorer/broken.py: the new limit first, then
    shards that only check the version) fails the first race above."""
    from tests.explorer.broken import VARIANTS

    for owner, attr, value in VARIANTS["plan_steps_unversioned"][1]:
        monkeypatch.setattr(owner, attr, value)
    with pytest.raises(AssertionError, match="admits past its limit 30"):
        test_a_lowering_read_between_a_raises_transactions_never_keeps_caps_it_did_not_see(actors)

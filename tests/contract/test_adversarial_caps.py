"""Attempts to break "the caps are the limit", made by a reviewer who had not seen the other tests
(moto, the real adapters). Each test asserts the promise; the first three failed on the code they
were written against (a lowering cut short left the caps above the limit for good; a store whose
first read was a completion's shard ignored the legacy holders) and pass since the fix."""

from __future__ import annotations

import pytest

from sluice.adapters.dynamo.launch_slots import LEDGER_PK, POOL
from sluice.adapters.dynamo.store import DynamoStore, create_table
from sluice.core.errors import SlotsFull
from sluice.core.limits import LimitSource

NOW = 1_800_000_000.0
T = "adv"


@pytest.fixture
def session_clients(session):
    create_table(session.client("dynamodb"), T)
    return session


def make(session, per_shard: int = 8) -> DynamoStore:
    return DynamoStore(session.client("dynamodb"), T, slots_per_shard=per_shard)


def shards(client) -> dict[int, dict]:
    items = client.scan(TableName=T)["Items"]
    return {
        int(i["pk"]["S"].rsplit("#", 1)[1]): i for i in items if i["pk"]["S"].startswith(f"SLOTS#{POOL}#")
    }


def caps_sum(client) -> int:
    return sum(int(i["cap"]["N"]) for i in shards(client).values())


def pool_limit(client) -> int:
    item = client.get_item(TableName=T, Key={"pk": {"S": f"SLOTS#{POOL}"}}, ConsistentRead=True)["Item"]
    return int(item["limit"]["N"])


def once(client, operation: str, action):
    fired = []

    def hook(**_):
        if not fired:
            fired.append(1)
            action()

    client.meta.events.register(f"before-call.dynamodb.{operation}", hook)
    return fired


def test_a_chunked_lowering_interrupted_by_a_claim_still_brings_the_caps_to_the_limit(session_clients):
    """> 99 cap moves: the pool item (limit, new stamp, version v+1) is written first, then the shards.
    A claim on a shard of the first chunk fails that chunk; the next round reads the pool carrying the
    planner's own new stamp. Before the fix that was refused as "not the stamp it replaces", the caps
    stayed at the old limit while the pool said the new one, and every later set_limit wrote nothing."""
    session = session_clients
    a, b, tick = make(session, 1), make(session, 1), make(session, 1)
    a.set_limit(LimitSource(150, 1000.0))
    client = session.client("dynamodb")
    assert caps_sum(client) == 150
    a.ledger()
    # A claim lands on shard 5 (one of the 100 shards the lowering takes to cap 0) between the
    # planner's read and its first shard transaction.
    fired = once(
        a.launch_slots.slots.client,
        "TransactWriteItems",
        lambda: b.launch_slots.slots.claim(POOL, 5, "intruder", NOW),
    )
    a.set_limit(LimitSource(50, 2000.0))
    assert fired and caps_sum(client) <= 50  # the planner itself finished, around the claim
    # The next tick, reading the same newest MAX.
    tick.ledger()
    tick.set_limit(LimitSource(50, 2000.0))
    a.set_limit(LimitSource(50, 2000.0))
    assert pool_limit(client) == 50
    assert caps_sum(client) <= 50, f"caps add up to {caps_sum(client)} while the limit in force is 50"


def test_after_a_chunked_lowering_interrupted_by_a_claim_no_more_than_max_hold(session_clients):
    """The same sequence, then claimers fill what the caps admit: never more than MAX."""
    session = session_clients
    a, b = make(session, 1), make(session, 1)
    a.set_limit(LimitSource(150, 1000.0))
    a.ledger()
    fired = once(
        a.launch_slots.slots.client,
        "TransactWriteItems",
        lambda: b.launch_slots.slots.claim(POOL, 5, "intruder", NOW),
    )
    a.set_limit(LimitSource(50, 2000.0))
    assert fired
    a.set_limit(LimitSource(50, 2000.0))  # the tick again
    held = 1
    slots = b.launch_slots.slots
    for i in range(150):
        try:
            slots.claim(POOL, i, f"n{i}", NOW)
            held += 1
        except SlotsFull:
            pass
    assert held <= 50, f"{held} hold a slot under MAX 50"


def test_stale_fenced_writer_after_unfenced_writer_is_not_fenced(session_clients):
    """Pool: MAX 2 @2000 (fenced). The parameter is deleted; a tick writes the deployed default 2,
    unfenced (default 3): the stamp is cleared. A launcher holding MAX 5 read @1000 then merges with no stamp
    and writes 5. Documented ("the deployed default applies unfenced"); the next tick puts 3 back."""
    session = session_clients
    op, tick, stale = make(session), make(session), make(session)
    op.set_limit(LimitSource(2, 2000.0))
    tick.ledger()
    tick.set_limit(LimitSource(3, None))  # the default differs: the stamp is cleared
    stale.ledger()
    stale.set_limit(LimitSource(5, 1000.0))
    client = session.client("dynamodb")
    assert pool_limit(client) == 5  # held as documented: an unfenced write drops the fence
    tick.look()  # the tick reads before it sets (admit)
    tick.set_limit(LimitSource(3, None))
    assert pool_limit(client) == 3 and caps_sum(client) == 3


def test_legacy_holders_counted_after_a_refill_look(session_clients):
    """A fresh store whose first read is a completion's ``look([shard])`` (no LEDGER read), then
    set_limit: legacy holders as last read are none, so the caps would ignore LEDGER.holders."""
    session = session_clients
    client = session.client("dynamodb")
    make(session).set_limit(LimitSource(5, 1000.0))
    client.update_item(
        TableName=T,
        Key={"pk": {"S": LEDGER_PK}},
        UpdateExpression="ADD holders :h",
        ExpressionAttributeValues={":h": {"SS": ["old1", "old2"]}},
    )
    make(session).set_limit(LimitSource(5, 1000.0, count=0))
    assert pool_limit(client) == 3  # MAX 5 less 2 legacy holders
    fresh = make(session)
    fresh.look([0])
    fresh.set_limit(LimitSource(5, 1500.0))
    assert pool_limit(client) == 3, f"pool limit {pool_limit(client)} with 2 legacy holders under MAX 5"


def test_save_reconciliation_refuses_an_older_count(session_clients):
    session = session_clients
    store = make(session)
    one, two = store.next_count(), store.next_count()
    assert store.save_reconciliation(external=0, drift=0, now=NOW, count=two)
    assert not store.save_reconciliation(external=3, drift=0, now=NOW, count=one)
    assert store.ledger().external == 0


def test_a_lowering_whose_planner_died_between_its_transactions_is_planned_again(session_clients):
    """The planner wrote one chunk of its decreases, then its Lambda died: the old limit is still
    stored (the new one comes with the last decreases), the caps admit less, and the next set_limit
    with the same source plans again."""
    from tests.support.hooks import Crash, crash_after

    session = session_clients
    client = session.client("dynamodb")
    a = make(session, 1)
    a.set_limit(LimitSource(150, 1000.0))
    dying = make(session, 1)
    dying.ledger()
    seen = crash_after(dying.launch_slots.slots.client, "TransactWriteItems", after=1)
    with pytest.raises(Crash):
        dying.set_limit(LimitSource(40, 2000.0))  # 110 decreases: two chunks, the pool item with the last
    assert seen["calls"] == 1 and pool_limit(client) == 150 and 40 < caps_sum(client) < 150
    tick = make(session, 1)
    tick.ledger()
    tick.set_limit(LimitSource(40, 2000.0))
    assert caps_sum(client) == 40


def test_the_slots_planner_finishes_its_own_stamped_change_around_a_claim(session_clients):
    """The primitive itself: once a planner has taken the pool's version with its new stamp, a later
    round of the same change is not refused as "not the stamp it replaces"."""
    from sluice.adapters.dynamo.slots import DynamoSlots
    from sluice.primitives.slots import Capacity

    session = session_clients
    client = session.client("dynamodb")
    a, b = DynamoSlots(client, T, per_shard=1), DynamoSlots(session.client("dynamodb"), T, per_shard=1)
    a.set_limit(Capacity(POOL, 150, stamp=(1.0,)))
    fired = once(client, "TransactWriteItems", lambda: b.claim(POOL, 5, "intruder", NOW))
    plan = a.set_limit(Capacity(POOL, 50, stamp=(2.0,), replaces=(1.0,)))
    assert fired and plan is not None and plan.limit == 50
    assert caps_sum(client) == 50

"""DynamoStore's slots: the launcher's holders in shards whose caps carry the limit, and the holders
a version before the shards left in LEDGER (an update in place with executions running)."""

from __future__ import annotations

import pytest

from sluice.adapters.dynamo_launch_slots import LEDGER_PK, POOL
from sluice.adapters.dynamo_slots import DynamoSlots
from sluice.adapters.dynamodb import DynamoStore, create_table, execution_pk, payload_pk
from sluice.errors import SlotsFull
from sluice.model import PayloadState
from tests.contract.stores import NOW, claim


@pytest.fixture
def table(session):
    client = session.client("dynamodb")
    create_table(client, "shards")
    return client


def make(client, per_shard: int = 2) -> DynamoStore:
    return DynamoStore(client, "shards", slots_per_shard=per_shard)


def shard_items(client) -> dict[int, dict]:
    items = client.scan(TableName="shards")["Items"]
    return {
        int(i["pk"]["S"].rsplit("#", 1)[1]): i for i in items if i["pk"]["S"].startswith(f"SLOTS#{POOL}#")
    }


def test_holders_spread_over_shards_whose_caps_add_up_to_the_limit(table):
    store = make(table)
    for i in range(6):
        claim(store, f"k{i}", f"n{i}", limit=6)
    with pytest.raises(SlotsFull):
        claim(store, "k6", "n6", limit=6)
    shards = shard_items(table)
    assert len(shards) == 3
    assert sum(int(s["cap"]["N"]) for s in shards.values()) == 6
    assert all(len(s["holders"]["M"]) <= 2 for s in shards.values())
    for i in range(6):
        shard = store.execution(f"n{i}").shard
        assert f"n{i}" in shards[shard]["holders"]["M"]  # the record names the holder's shard
    assert store.ledger().holders == {f"n{i}" for i in range(6)}


def test_a_release_frees_the_holders_own_shard_and_a_second_store_claims_it(table):
    a, b = make(table), make(table)
    for i in range(4):
        claim(a, f"k{i}", f"n{i}", limit=4)
    released = a.execution("n2")
    assert a.release(name="n2", state=PayloadState.SUCCEEDED, now=NOW) is not None
    assert "n2" not in shard_items(table)[released.shard]["holders"]["M"]
    b.ledger()
    claim(b, "k9", "n9", limit=4)  # b read the pool itself: the freed shard is the one with room
    assert b.execution("n9").shard == released.shard
    with pytest.raises(SlotsFull):
        claim(a, "k10", "n10", limit=4)  # a's view is stale: it reads again and finds no room


def test_a_stale_view_never_admits_past_the_caps(table):
    a, b = make(table), make(table)
    a.ledger()
    b.ledger()
    claim(a, "ka", "na", limit=1)
    with pytest.raises(SlotsFull):
        claim(b, "kb", "nb", limit=1)  # b's view showed room: the shard's own condition refuses
    assert b.ledger().holders == {"na"}


def test_lowering_the_limit_below_the_holders_admits_nothing_until_they_fit(table):
    store = make(table)
    for i in range(4):
        claim(store, f"k{i}", f"n{i}", limit=4)
    for limit in (2, 3):
        with pytest.raises(SlotsFull):
            claim(store, "kx", "nx", limit=limit)
    pool = DynamoSlots(table, "shards").occupancy(POOL)
    assert (pool.limit, pool.frozen, pool.caps) == (3, True, 0)
    for i in range(2):
        store.release(name=f"n{i}", state=PayloadState.SUCCEEDED, now=NOW)
    claim(store, "kx", "nx", limit=3)  # 2 held under 3: unfrozen, one admitted
    with pytest.raises(SlotsFull):
        claim(store, "ky", "ny", limit=3)
    assert len(store.ledger().holders) == 3


def write_legacy_holder(client, name: str, key: str) -> None:
    """What a version before the shards wrote for a running execution: LEDGER.holders, the lease,
    and an execution record without a shard."""
    client.update_item(
        TableName="shards",
        Key={"pk": {"S": LEDGER_PK}},
        UpdateExpression="ADD holders :n",
        ExpressionAttributeValues={":n": {"SS": [name]}},
    )
    client.put_item(
        TableName="shards",
        Item={
            "pk": {"S": payload_pk(key)},
            "key": {"S": key},
            "state": {"S": "RUNNING"},
            "holder": {"S": name},
            "executions": {"L": [{"S": name}]},
        },
    )
    client.put_item(
        TableName="shards",
        Item={
            "pk": {"S": execution_pk(name)},
            "name": {"S": name},
            "key": {"S": key},
            "message_id": {"S": "m"},
            "state": {"S": "RUNNING"},
            "claimed_at": {"N": str(NOW)},
            "claim_expires_at": {"N": str(NOW + 900)},
        },
    )


def test_holders_left_in_the_ledger_by_the_previous_version_count_and_release(table):
    write_legacy_holder(table, "old1", "a")
    write_legacy_holder(table, "old2", "b")
    store = make(table)
    assert store.ledger().holders == {"old1", "old2"}
    claim(store, "k1", "n1", limit=3)
    with pytest.raises(SlotsFull):
        claim(store, "k2", "n2", limit=3)  # 2 old + 1 new = MAX 3
    assert store.release(name="old1", state=PayloadState.SUCCEEDED, now=NOW) is not None
    assert store.payload("a").holder is None
    assert store.ledger().holders == {"old2", "n1"}
    claim(store, "k2", "n2", limit=3)  # the old holder's slot is free again
    with pytest.raises(SlotsFull):
        claim(store, "k3", "n3", limit=3)
    assert store.ledger().holders == {"old2", "n1", "n2"}


def test_a_store_that_forgets_the_legacy_holders_is_caught(table, monkeypatch):
    """Broken on purpose: caps set to the whole limit, as if LEDGER.holders were empty."""
    from sluice.adapters.dynamo_launch_slots import LaunchSlots

    prepare = LaunchSlots.prepare

    def forgetting(self, limit):
        self.legacy = frozenset()
        return prepare(self, limit)

    monkeypatch.setattr(LaunchSlots, "prepare", forgetting)
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        test_holders_left_in_the_ledger_by_the_previous_version_count_and_release(table)


def test_an_adoption_by_a_store_that_has_read_nothing_keeps_the_caps(table):
    a = make(table)
    for i in range(3):
        claim(a, f"k{i}", f"n{i}", limit=4)
    a.release(name="n0", state=PayloadState.FAILED, now=NOW)
    fresh = make(table)  # a new container: no view of the pool yet
    assert fresh.adopt(name="n0", now=NOW + 1)  # n0 was redriven
    pool = DynamoSlots(table, "shards").occupancy(POOL)
    assert (pool.limit, pool.caps, pool.frozen) == (4, 4, False)
    assert fresh.ledger().holders == {"n0", "n1", "n2"}
    assert "n0" in shard_items(table)[fresh.execution("n0").shard]["holders"]["M"]

"""The store's lanes (sluice.features.lanes), the same contract on the in-memory store and on DynamoDB (moto):
a claim in a lane takes a slot of the lane and of the global pool at once, the release and the
adoption free and take both, and a lane's limit is stamped."""

from __future__ import annotations

import pytest

from sluice.core.errors import SlotsFull
from sluice.core.model import Ending, PayloadState
from sluice.core.records import LaneSetting
from tests.contract.stores import NOW
from tests.contract.stores import claim as claim_under


def claim(store, key: str, name: str, lane: str | None = "gpu", *, limit: int = 5) -> None:
    claim_under(store, key, name, limit=limit, message_id=f"m-{name}", **({"lane": lane} if lane else {}))


def test_a_lane_admits_up_to_its_limit_and_the_global_pool_counts_it(store):
    assert store.set_lane_limit("gpu", 2, 0.0) == 2
    claim(store, "k1", "n1")
    claim(store, "k2", "n2")
    with pytest.raises(SlotsFull):
        claim(store, "k3", "n3")
    assert store.payload("k3") is None, "a claim refused by its lane takes nothing"
    assert store.ledger().holders == {"n1", "n2"}
    room = store.lane_rooms(["gpu"])["gpu"]
    assert (room.limit, room.running, room.free, room.exists) == (2, 2, 0, True)
    assert (store.execution("n1").lane, store.execution("n1").lane_shard is not None) == ("gpu", True)


def test_the_global_limit_binds_a_lane_with_room(store):
    store.set_lane_limit("gpu", 10, 0.0)
    claim(store, "k1", "n1", limit=1)
    with pytest.raises(SlotsFull):
        claim(store, "k2", "n2", limit=1)
    assert store.lane_rooms(["gpu"])["gpu"].running == 1


def test_a_lane_without_a_limit_admits_nothing(store):
    with pytest.raises(SlotsFull):
        claim(store, "k1", "n1")
    assert store.lane_rooms(["gpu"])["gpu"].exists is False


def test_the_release_frees_the_lane_slot(store):
    store.set_lane_limit("gpu", 1, 0.0)
    claim(store, "k1", "n1")
    assert store.release("n1", Ending(PayloadState.SUCCEEDED, NOW + 1)) is not None
    assert store.lane_rooms(["gpu"])["gpu"].running == 0
    claim(store, "k2", "n2")
    assert store.release("n1", Ending(PayloadState.SUCCEEDED, NOW + 2)) is None, "released once"
    assert store.lane_rooms(["gpu"])["gpu"].running == 1


def test_an_adopted_run_takes_its_lane_slot_back_past_the_cap(store):
    store.set_lane_limit("gpu", 1, 0.0)
    claim(store, "k1", "n1")
    store.release("n1", Ending(PayloadState.FAILED, NOW + 1))
    claim(store, "k2", "n2")  # the lane is full again
    assert store.adopt(name="n1", now=NOW + 2)  # n1 was redriven: it runs, so it holds a slot
    assert store.lane_rooms(["gpu"])["gpu"].running == 2
    store.release("n2", Ending(PayloadState.SUCCEEDED, NOW + 3))
    with pytest.raises(SlotsFull):
        claim(store, "k3", "n3")  # still at the lane's limit: the adopted run counts


def test_lanes_are_counted_apart(store):
    store.set_lane_limit("gpu", 1, 0.0)
    store.set_lane_limit("cpu", 1, 0.0)
    claim(store, "k1", "n1", "gpu")
    claim(store, "k2", "n2", "cpu")
    claim(store, "k3", "n3", None)  # no lane: the global pool alone
    rooms = store.lane_rooms(["gpu", "cpu"])
    assert (rooms["gpu"].running, rooms["cpu"].running) == (1, 1)
    assert store.ledger().holders == {"n1", "n2", "n3"}


def test_a_lane_limit_with_an_older_stamp_is_refused_and_a_lowered_one_evicts_nobody(store):
    assert store.set_lane_limit("gpu", 3, 10.0) == 3
    assert store.set_lane_limit("gpu", 1, 5.0) is None
    claim(store, "k1", "n1")
    claim(store, "k2", "n2")
    assert store.set_lane_limit("gpu", 1, 20.0) == 1
    room = store.lane_rooms(["gpu"])["gpu"]
    assert (room.limit, room.running, room.free) == (1, 2, 0)
    with pytest.raises(SlotsFull):
        claim(store, "k3", "n3")


def test_lane_settings_round_trip(store):
    assert store.lane_settings(["gpu"]) == {}
    store.write_lane_setting(LaneSetting("gpu", max=3, paused=False, changed_at=12.5))
    store.write_lane_setting(LaneSetting("cpu", max=None, paused=True, changed_at=13.0))
    assert store.lane_settings(["gpu", "cpu", "other"]) == {
        "gpu": LaneSetting("gpu", max=3, paused=False, changed_at=12.5),
        "cpu": LaneSetting("cpu", max=None, paused=True, changed_at=13.0),
    }
    store.write_lane_setting(LaneSetting("gpu", max=None, paused=False, changed_at=14.0))
    assert store.lane_settings(["gpu"])["gpu"].max is None

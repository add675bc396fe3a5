"""Lanes' configuration and how free slots are shared among them (sluice.features.lanes): no AWS."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.core.errors import ConfigurationError
from sluice.core.records import Lane, LaneSetting
from sluice.features.lanes import by_priority, parse_lane_queues, parse_lanes, refill_order, split


def test_no_lanes_is_one_lane_without_a_pool():
    assert parse_lanes("", 10) == ()
    assert parse_lanes("  ", 10) == ()


def test_lanes_with_defaults_and_the_implied_default_lane():
    lanes = parse_lanes("gpu:2:1,backfill:8:0:3", 10)
    assert lanes == (
        Lane("gpu", 2, 1, 1),
        Lane("backfill", 8, 0, 3),
        Lane("default", 10, implied=True),
    )
    assert parse_lanes("default:4:2", 10) == (Lane("default", 4, 2),)


def test_a_lane_may_be_fair():
    assert parse_lanes("shared:20:0:1:fair", 10) == (
        Lane("shared", 20, 0, 1, fair=True),
        Lane("default", 10, implied=True),
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu", "use name:max"),
        ("gpu:2:1:1:fair:x", "use name:max"),
        ("gpu:x", "max must be a whole number from 0 to 10000"),
        ("gpu:10001", "max must be a whole number from 0 to 10000"),
        ("gpu:2:101", "priority must be a whole number from 0 to 100"),
        ("gpu:2:1:0", "weight must be a whole number from 1 to 100"),
        ("gpu:2:1:1:unfair", "the fifth field may only be 'fair'"),
        ("gpu:2,,cpu:3", "an empty lane"),
        ("gpu:2,gpu:3", "'gpu' is named twice"),
        ("GPU:2", "bad lane name 'GPU'"),
        ("gpu--x:2", "bad lane name"),
        ("a-1b:2,a1b:3", "'a-1b' and 'a1b' would share the resource name LaneA1bQueue"),
        ("a" * 21 + ":2", "at most 20 characters"),
        (",".join(f"l{i}:1" for i in range(20)), "21 lanes, at most 20"),
    ],
)
def test_a_bad_lanes_setting_names_what_is_wrong(text, message):
    with pytest.raises(ConfigurationError, match=message):
        parse_lanes(text, 10)


def test_lane_queues():
    assert parse_lane_queues("gpu=https://q/1, backfill=https://q/2") == {
        "gpu": "https://q/1",
        "backfill": "https://q/2",
    }
    with pytest.raises(ConfigurationError, match="use name=queue-url"):
        parse_lane_queues("gpu")


def test_a_setting_overrides_the_configured_max_and_a_pause_wins():
    lane = Lane("gpu", 2)
    assert LaneSetting("gpu").limit(lane) == 2
    assert LaneSetting("gpu", max=5).limit(lane) == 5
    assert LaneSetting("gpu", max=5, paused=True).limit(lane) == 0


def test_priorities_highest_first_in_declared_order():
    lanes = parse_lanes("a:1:0,b:1:2,c:1:0,d:1:2", 10)
    assert [[lane.name for lane in g] for g in by_priority(lanes)] == [["b", "d"], ["a", "c", "default"]]


def test_split_by_weight_capped_by_each_lanes_room():
    lanes = [Lane("backfill", 8, 0, 3), Lane("default", 10, 0, 1)]
    assert split(3, lanes, {"backfill": 8, "default": 10}) == {"backfill": 2, "default": 1}
    assert split(8, lanes, {"backfill": 8, "default": 10}) == {"backfill": 6, "default": 2}
    # A lane with less room than its share gives the rest to the others.
    assert split(8, lanes, {"backfill": 1, "default": 10}) == {"backfill": 1, "default": 7}
    assert split(8, lanes, {"backfill": 0, "default": 0}) == {"backfill": 0, "default": 0}


@given(
    room=st.integers(0, 200),
    weights=st.lists(st.integers(1, 100), min_size=1, max_size=6),
    rooms=st.lists(st.integers(0, 60), min_size=6, max_size=6),
)
def test_split_never_gives_more_than_the_room_or_a_lanes_room_and_wastes_none(room, weights, rooms):
    lanes = [Lane(f"l{i}", 10, 0, w) for i, w in enumerate(weights)]
    room_of = {lane.name: rooms[i] for i, lane in enumerate(lanes)}
    shares = split(room, lanes, room_of)
    assert sum(shares.values()) == min(room, sum(room_of.values()))
    assert all(0 <= shares[n] <= room_of[n] for n in shares)


def test_the_refill_order_is_by_priority_and_by_weight_within_one():
    lanes = parse_lanes("gpu:2:1,backfill:8:0:3", 10)
    rng = random.Random(7)
    firsts = Counter(refill_order(lanes, rng)[0].name for _ in range(4000))
    assert firsts == {"gpu": 4000}
    seconds = Counter(refill_order(lanes, rng)[1].name for _ in range(4000))
    assert 0.70 < seconds["backfill"] / 4000 < 0.80  # weight 3 of 4

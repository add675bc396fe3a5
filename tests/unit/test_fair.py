"""Fair lanes' pure parts (``sluice.features.fair``): a message's tenant, and free slots shared out to the
backlogged tenant with the fewest runs."""

from __future__ import annotations

import random

import pytest

from sluice.core.errors import InvalidPayload
from sluice.core.model import Message
from sluice.core.records import KeyState, Lane
from sluice.features.fair import share_out, tenant
from sluice.features.keys import entry

NOW = 1_000.0
LANE = Lane("shared", 8, fair=True)


def state(
    key: str, *, running: int = 0, waiting: int = 0, woken: int = 0, cap: int | None = None
) -> KeyState:
    return KeyState(
        key,
        holders=frozenset(f"{key}-{i}" for i in range(running)),
        cap=cap,
        tickets=waiting + woken,
        woken=woken,
        inflight=frozenset(entry(t, NOW) for t in range(woken)),
        fair="shared",
    )


def message(**attributes: str) -> Message:
    return Message(message_id="m", receipt_handle="r", body="{}", group_id="g", attributes=attributes)


def test_a_messages_tenant_is_its_concurrency_key_else_its_lane():
    assert tenant(message(**{"sluice-concurrency-key": "acme"}), LANE) == "acme"
    assert tenant(message(), LANE) == "lane:shared"
    with pytest.raises(InvalidPayload, match="control character"):
        tenant(message(**{"sluice-concurrency-key": "a\x00"}), LANE)


def test_slots_go_to_the_tenants_with_the_fewest_runs_until_they_are_even():
    states = {"heavy": state("heavy", running=3, waiting=500), "light": state("light", waiting=10)}
    assert share_out(3, states, now=NOW, rng=random.Random(1)) == {"light": 3}
    assert share_out(5, states, now=NOW, rng=random.Random(1)) == {"light": 4, "heavy": 1}


def test_woken_waiters_count_as_runs_and_a_tenant_gets_no_more_than_it_waits_for():
    states = {"a": state("a", woken=2, waiting=5), "b": state("b", waiting=1), "c": state("c", waiting=5)}
    given = share_out(4, states, now=NOW, rng=random.Random(2))
    # b takes its one, c catches up with a's two woken, then a tie: one more to a or c.
    assert given["b"] == 1 and given["c"] >= 2 and sum(given.values()) == 4


def test_a_tenants_own_cap_and_an_empty_line_take_nothing():
    states = {
        "capped": state("capped", running=2, waiting=9, cap=2),
        "idle": state("idle"),
        "x": state("x", waiting=1),
    }
    assert share_out(5, states, now=NOW, rng=random.Random(3)) == {"x": 1}
    assert share_out(0, states, now=NOW, rng=random.Random(3)) == {}
    assert share_out(-2, states, now=NOW, rng=random.Random(3)) == {}


def test_ties_are_drawn_so_no_tenant_is_always_first():
    states = {k: state(k, waiting=3) for k in "abcd"}
    firsts = {next(iter(share_out(1, states, now=NOW, rng=random.Random(seed)))) for seed in range(40)}
    assert firsts == set("abcd")

"""Broken variants of the caps' fences: each patched in for one test, the scenario that pins the
fence down (tests/integration/test_caps_breaks.py) must then fail with a broken promise.

A variant is caught only by ``PromiseBroken`` (more RUNNING than MAX, or a claim the model judges
past it), or, on the store alone, by more claims admitted than the limit leaves room for; any other
error fails the test, so a variant cannot pass by crashing the scenario.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import pytest

from sluice.adapters.dynamo.slots import DynamoSlots, take_item
from sluice.core.external import ExternalCount
from sluice.primitives.slots import candidates
from tests.contract import test_caps_fences as fences
from tests.integration import test_caps_breaks as breaks
from tests.reliability.world import PromiseBroken, World

Scenario = Callable[[list[World]], None]


def run(scenario: Scenario) -> None:
    worlds: list[World] = []
    try:
        scenario(worlds)
    finally:
        for world in worlds:
            world.close()


def caught(scenario: Scenario) -> PromiseBroken:
    with pytest.raises(PromiseBroken) as failure:
        run(scenario)
    print(failure.value)
    return failure.value


# -- break 1: the external count ordered by its listing ---------------------------------------------


def test_the_stale_listing_scenario_holds():
    run(breaks.test_a_listing_taken_before_a_newer_one_never_raises_the_caps_back)


def test_counts_ordered_by_the_number_taken_after_the_listing_are_caught(monkeypatch):
    """The count as it was: one number, taken once the listing was done; the higher number wins."""
    monkeypatch.setattr(ExternalCount, "began", property(lambda self: self.count))
    caught(breaks.test_a_listing_taken_before_a_newer_one_never_raises_the_caps_back)


def test_counts_ordered_by_one_number_are_caught_in_the_other_order(monkeypatch):
    monkeypatch.setattr(ExternalCount, "began", property(lambda self: self.count))
    caught(breaks.test_a_listing_overlapping_a_fresher_one_never_lowers_its_count_whichever_saves_last)


# -- break 2: an adoption past the caps --------------------------------------------------------------


def past_the_cap(self, pool, name, now, view):
    """The adoption as it was: a shard with room if the view shows one, else past a full shard's cap,
    the pool not frozen first and no condition on the slot (the re-plan after it did the rest)."""
    roomy = candidates(view, self.rng)
    shard = roomy[0] if roomy else zlib.crc32(name.encode()) % view.shard_count
    return shard, [take_item(self.table, pool, shard, name, now)]


def test_the_crash_after_an_adoption_scenario_holds():
    run(breaks.test_a_crash_right_after_an_adoption_past_the_caps_admits_nothing_past_max)


def test_an_adoption_past_a_full_shards_cap_without_the_freeze_is_caught(monkeypatch):
    monkeypatch.setattr(DynamoSlots, "adoption", past_the_cap)
    caught(breaks.test_a_crash_right_after_an_adoption_past_the_caps_admits_nothing_past_max)


def test_an_adoption_past_a_full_shards_cap_is_caught_on_the_table_before_anything_ends(monkeypatch):
    """The world's check of the table (``pool_ceilings``) needs no end and no refill after the crash:
    the shard past its cap beside caps that still sum to MAX is the broken promise."""
    monkeypatch.setattr(DynamoSlots, "adoption", past_the_cap)
    failure = caught(breaks.test_the_pool_an_adopter_dies_in_admits_nothing_past_max_before_anything_ends)
    assert "pool 'launcher' admits past its limit 4 without a re-plan" in str(failure)


def test_the_replan_between_freeze_and_take_scenario_holds():
    run(breaks.test_a_replan_between_the_adopters_freeze_and_its_take_never_lets_it_past_the_caps)


def test_a_take_not_conditioned_on_the_pool_still_frozen_is_caught(monkeypatch):
    """The freeze, then the take past the cap with no check that the pool is still frozen: a re-plan
    in between leaves unfrozen caps summing to MAX beside a shard past its cap."""
    adoption = DynamoSlots.adoption

    def unchecked(self, pool, name, now, view):
        shard, items = adoption(self, pool, name, now, view)
        pool_item = {"pk": {"S": f"SLOTS#{pool}"}}
        return shard, [item for item in items if next(iter(item.values()))["Key"] != pool_item]

    monkeypatch.setattr(DynamoSlots, "adoption", unchecked)
    caught(breaks.test_a_replan_between_the_adopters_freeze_and_its_take_never_lets_it_past_the_caps)


@pytest.mark.parametrize("lane", [None, "gpu"])
def test_an_adopter_dying_before_its_replan_without_the_freeze_is_caught(session, monkeypatch, lane):
    """The same on the store alone, the launcher's pool and a lane's (a crash right after the
    adoption's transaction): more admitted than the limit leaves room for."""
    monkeypatch.setattr(DynamoSlots, "adoption", past_the_cap)
    with pytest.raises(AssertionError, match="admitted beside"):
        fences.test_an_adopter_that_dies_before_it_plans_again_leaves_caps_that_admit_nothing_past_the_limit(
            session, lane
        )

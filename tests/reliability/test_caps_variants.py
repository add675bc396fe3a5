"""Broken variants of the caps' fences: each patched in for one test, the scenario that pins the
fence down (tests/integration/test_caps_breaks.py) must then fail with a broken promise.

A variant is caught only by ``PromiseBroken`` (more RUNNING than MAX, or a claim the model judges
past it); any other error fails the test, so a variant cannot pass by crashing the scenario.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sluice.external import ExternalCount
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

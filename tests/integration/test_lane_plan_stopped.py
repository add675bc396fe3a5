"""A lane's caps planned in several transactions (more than 99 shards move; here one a transaction)
by a planner that stops between them: the lane's limit is stored with its caps short of it, and the
next tick's lane sync, which writes only a lane whose limit moved, must still finish the plan
(explorer seed 1128060156: two of a lane's slots idle for good)."""

from __future__ import annotations

import pytest

import sluice.adapters.dynamo.slots
from sluice.core.records import LaneSetting
from tests.support.aws import build_stack
from tests.support.hooks import Crash, crash_after


def lane_caps(stack, lane: str) -> tuple[int, int]:
    """The lane's limit and the sum of its caps, as stored."""
    view = stack.runtime().store().lane_slots.slots.occupancy(f"lane-{lane}")
    return view.limit, view.caps


def test_a_lanes_plan_stopped_between_its_transactions_is_finished_by_the_next_tick(session, monkeypatch):
    monkeypatch.setattr(sluice.adapters.dynamo.slots, "SHARDS_PER_TRANSACTION", 1)
    stack = build_stack(session, max_concurrency=6, lanes="gpu:2", slots_per_shard=1)
    stack.launcher().tick()
    assert lane_caps(stack, "gpu") == (2, 2)
    store = stack.runtime().store()
    planner = store.lane_slots.slots
    seen = crash_after(planner.client, "TransactWriteItems", after=1)
    # sluice set-max 5 --lane gpu, whose planner stops after its first transaction
    store.write_lane_setting(LaneSetting("gpu", max=5, changed_at=stack.clock.now()))
    with pytest.raises(Crash):
        store.set_lane_limit("gpu", 5, stack.clock.now())  # 3 new shards, the limit with the first
    assert seen["calls"] == 1 and lane_caps(stack, "gpu") == (5, 3)
    stack.launcher().tick()
    assert lane_caps(stack, "gpu") == (5, 5)

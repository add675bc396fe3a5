"""Lanes on moto with the real adapters: a queue per lane, a slot of the lane and one of the global
pool in each claim's transaction, free slots shared by priority then weight, on the tick and on the
completion path, and each lane's MAX changed at run time."""

from __future__ import annotations

import json

import pytest

from sluice.core.clock import FakeClock
from sluice.core.errors import ConfigurationError
from sluice.core.events import StatusChange
from sluice.core.model import Claim, Outcome
from sluice.core.records import LaneSetting
from sluice.features.lanes import LANE_ATTRIBUTE
from tests.support.aws import build_stack
from tests.support.hooks import count_calls

LANES = "gpu:2:1,backfill:8:0:3,default:10"


@pytest.fixture
def stack(session):
    return build_stack(session, clock=FakeClock(), max_concurrency=5, lanes=LANES)


def lane_of(stack, name: str) -> str | None:
    return stack.runtime().store().execution(name).lane


def running_by_lane(stack) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in stack.running():
        lane = lane_of(stack, name) or "?"
        out[lane] = out.get(lane, 0) + 1
    return out


def fill(stack, gpu: int = 10, backfill: int = 20, default: int = 10) -> None:
    for lane, n in (("gpu", gpu), ("backfill", backfill), ("default", default)):
        for i in range(n):
            stack.send({"id": f"{lane}-{i}"}, group=f"{lane}-{i}", lane=lane)


def end(stack, launcher, name: str, status: str = "SUCCEEDED"):
    return launcher.on_status_change(StatusChange.from_event(stack.finish(name, status)))


def test_the_tick_serves_the_priority_lane_first_then_splits_the_rest_by_weight(stack):
    fill(stack)
    summary = stack.launcher().tick()
    # MAX 5: gpu (priority 1) takes its 2; the other 3 go 3:1 to backfill and default.
    assert running_by_lane(stack) == {"gpu": 2, "backfill": 2, "default": 1}
    assert summary.n(Outcome.STARTED) == 5
    assert summary.lanes["gpu"]["started"] == 2
    rooms = stack.runtime().store().lane_rooms(["gpu", "backfill", "default"])
    assert (rooms["gpu"].limit, rooms["gpu"].running) == (2, 2)
    assert (rooms["backfill"].limit, rooms["backfill"].running) == (8, 2)


def test_a_lane_never_passes_its_own_max_whatever_the_global_room(session):
    stack = build_stack(session, clock=FakeClock(), max_concurrency=20, lanes=LANES)
    fill(stack, gpu=10, backfill=0, default=0)
    launcher = stack.launcher()
    launcher.tick()
    launcher.tick()
    assert running_by_lane(stack) == {"gpu": 2}
    assert stack.queue_counts(stack.settings.lane_queue_url("gpu")) == (8, 0)


def test_a_slot_freed_in_a_low_lane_goes_to_the_priority_lane_when_it_has_room_and_work(stack):
    fill(stack)
    launcher = stack.launcher()
    launcher.tick()
    gpu_runs = [n for n in stack.running() if lane_of(stack, n) == "gpu"]
    backfill_run = next(n for n in stack.running() if lane_of(stack, n) == "backfill")
    # gpu is at its MAX: a backfill end refills backfill or default, never past gpu's 2.
    _, refill, _ = end(stack, launcher, backfill_run)
    assert refill.n(Outcome.STARTED) == 1 and "gpu" not in refill.lanes
    assert running_by_lane(stack)["gpu"] == 2
    # A gpu end: gpu has room and work, and priority: the slot goes back to gpu.
    _, refill, _ = end(stack, launcher, gpu_runs[0])
    assert refill.lanes["gpu"]["started"] == 1
    assert running_by_lane(stack)["gpu"] == 2 and sum(running_by_lane(stack).values()) == 5


def test_the_release_frees_the_lane_slot_with_the_global_one(stack):
    fill(stack, gpu=1, backfill=0, default=0)
    launcher = stack.launcher()
    launcher.tick()
    (name,) = stack.running()
    store = stack.runtime().store()
    assert store.lane_rooms(["gpu"])["gpu"].running == 1
    end(stack, launcher, name)
    assert store.lane_rooms(["gpu"])["gpu"].running == 0
    assert store.ledger().holders == frozenset()


def test_a_lanes_max_changed_at_run_time_holds_until_set_back(stack):
    fill(stack, gpu=5, backfill=0, default=0)
    store = stack.runtime().store()
    launcher = stack.launcher()
    launcher.tick()
    assert running_by_lane(stack) == {"gpu": 2}
    store.write_lane_setting(LaneSetting("gpu", max=3, changed_at=stack.clock.now()))
    launcher.tick()  # the tick puts the operator's MAX in force, not the configured 2
    assert running_by_lane(stack) == {"gpu": 3}
    store.write_lane_setting(LaneSetting("gpu", max=3, paused=True, changed_at=stack.clock.now() + 1))
    launcher.tick()
    assert store.lane_rooms(["gpu"])["gpu"].limit == 0 and running_by_lane(stack) == {"gpu": 3}
    for name in list(stack.running()):
        end(stack, launcher, name)
    assert stack.running() == [], "a paused lane refills nothing"


def test_an_older_limit_never_undoes_a_newer_one(stack):
    store = stack.runtime().store()
    stack.launcher().tick()
    assert store.set_lane_limit("gpu", 4, 100.0) == 4
    assert store.set_lane_limit("gpu", 2, 50.0) is None, "a tick holding an older setting"
    assert store.lane_rooms(["gpu"])["gpu"].limit == 4


def test_a_parked_waiter_goes_back_to_its_lanes_queue(stack):
    stack.send({"id": "a"}, group="a", lane="backfill")
    stack.send({"id": "w"}, group="w", lane="gpu", sluice_awaits=json.dumps(["a"]))
    launcher = stack.launcher()
    summary = launcher.tick()
    assert summary.n(Outcome.WAITING) == 1
    (a,) = stack.running()
    released, refill, _ = end(stack, launcher, a)
    assert released and refill.lanes["gpu"]["started"] == 1, "woken into gpu's queue and started there"
    (w,) = stack.running()
    assert lane_of(stack, w) == "gpu"


def test_a_message_claiming_a_lane_from_another_queue_keeps_the_queues_lane(stack):
    stack.send({"id": "x"}, group="x", lane="default", **{LANE_ATTRIBUTE.replace("-", "_"): "gpu"})
    stack.launcher().tick()
    (x,) = stack.running()
    assert lane_of(stack, x) == "default"


def test_an_unknown_lane_is_a_clear_error():
    from sluice.launch.settings import Settings

    with pytest.raises(ConfigurationError, match="no lane 'gpux'"):
        Settings(lanes=()).lane("gpux")
    with pytest.raises(ConfigurationError, match="names no queue for lane"):
        Settings.from_env({"SLUICE_LANES": "gpu:2"})


def test_an_effect_names_its_lane_and_runs_there(stack):
    stack.send({"id": "parent"}, group="parent")
    launcher = stack.launcher()
    launcher.tick()
    (parent,) = stack.running()
    effects = {
        "sluiceEffects": [
            {"payload": {"id": "child"}, "lane": "gpu"},
            {"payload": {"id": "x"}, "lane": "nope"},
        ]
    }
    event = stack.finish(parent, "SUCCEEDED", output=json.dumps(effects))
    released, refill, _ = launcher.on_status_change(StatusChange.from_event(event))
    assert released and refill.lanes["gpu"]["started"] == 1, "sent to gpu's queue and started there"
    (child,) = stack.running()
    assert lane_of(stack, child) == "gpu"
    log = stack.runtime().store().effects(parent)
    assert (
        log.sent == ("child",) and "lane \"nope\" refused: the stack's lanes are 'gpu'" in log.rejected[0][1]
    )


def test_a_completion_under_a_lowered_max_receives_from_no_lane(stack):
    """MAX lowered below the running count: the freed slot is not free, so no lane receives (each
    receive without room would spend one of the message's maxReceiveCount)."""
    fill(stack)
    rt = stack.runtime()
    launcher = rt.launcher()
    launcher.tick()
    rt.client("ssm").put_parameter(Name=stack.settings.max_parameter, Value="2", Overwrite=True)
    launcher.tick()  # the caps come down to 2 with 5 running
    calls = count_calls(rt.client("sqs"))
    _, refill, _ = end(stack, launcher, stack.running()[0])
    assert refill.n(Outcome.STARTED) == 0 and calls["ReceiveMessage"] == 0


def test_a_completions_refill_checks_the_state_machine_once_for_every_lane_it_tries(stack):
    """Each lane admits through its own view of the launcher: they share one record of the state
    machine's check, so refills that try every lane check it once per interval, not per lane."""
    fill(stack, gpu=0, backfill=4, default=0)
    rt = stack.runtime()
    launcher = rt.launcher()
    launcher.tick()  # checks the state machine
    calls = count_calls(rt.client("stepfunctions"), rt.client("sqs"))
    for name in list(stack.running())[:3]:
        end(stack, launcher, name)
    assert calls["DescribeStateMachine"] == 0
    # Every lane but the last tried is asked without waiting: gpu's and default's empty queues first.
    assert calls["ReceiveMessage"] >= 3


def test_an_implied_default_lane_follows_the_global_max_in_force(session):
    stack = build_stack(session, clock=FakeClock(), max_concurrency=5, lanes="gpu:2:1")
    rt = stack.runtime()
    store = rt.store()
    launcher = rt.launcher()
    launcher.tick()
    assert store.lane_rooms(["default"])["default"].limit == 5
    rt.client("ssm").put_parameter(Name=stack.settings.max_parameter, Value="3", Overwrite=True)
    launcher.tick()
    assert store.lane_rooms(["default"])["default"].limit == 3, "the run-time MAX, not the deployed one"
    assert store.lane_rooms(["gpu"])["gpu"].limit == 2


def test_a_big_lanes_room_is_read_by_a_sample_whose_cost_does_not_grow_with_its_max(session):
    """A lane of MAX 100 in shards of 2 (50 shards, more than its half of one read's 98): admission
    reads one BatchGetItem of a sample, whatever the lane's size, and its room counts the shards read;
    status reads it whole. Near full, a sample would miss the last free slots: that lane is read whole."""
    stack = build_stack(session, clock=FakeClock(), max_concurrency=120, lanes="big:100")
    rt = stack.runtime()
    rt.launcher().tick()  # the caps of the global pool and of each lane
    store = rt.store()
    store.lane_rooms(["big", "default"])  # learns the pools' sizes
    calls = count_calls(rt.client("dynamodb"))
    sampled = store.lane_rooms(["big", "default"])["big"]
    assert calls["BatchGetItem"] == 1
    assert not sampled.complete and 0 < sampled.free < 100 and sampled.limit == 100
    whole = store.lane_rooms(["big"], whole=True)["big"]
    assert whole.complete and whole.free == 100
    for i in range(95):
        store.claim(
            Claim(key=f"k{i}", name=f"n{i}", message_id=f"m{i}", now=1.0, claim_expires_at=901.0, lane="big")
        )
    near_full = store.lane_rooms(["big", "default"])["big"]
    assert near_full.complete and near_full.free == 5, "near full: read whole, every free slot seen"

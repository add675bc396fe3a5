"""Each promise under each fault, as a fixed scenario: the cases the property suite explores at
random, pinned down so that every protocol step is crashed at least once on every run.

Every scenario ends with ``World.settle``: all executions end, events are lost or delivered,
reconciliation runs, and the promises that hold at rest are checked (queue empty, every payload
with a final record, no slot or lease held, all MAX slots usable, every message started, a
duplicate, or in the DLQ with a reason). Promises 1 to 3 are checked at every call on the way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.reliability.world import VISIBILITY, WINDOW, World
from tests.support.faults import CRASH_POINTS, CrashAt, StaleList, Throttle

COMPLETION_POINTS = (
    "before_release",  # with the queue empty: the release goes alone, then the refill receives
    "after_release",
    "after_receive",  # with a payload waiting: received, then handed the slot in the release
    "before_hand_over",
    "after_hand_over",
    "after_start",
    "before_delete",
)
RELEASED_ALONE = ("before_release", "after_release")


@pytest.fixture
def world() -> Iterator[World]:
    w = World(max_concurrency=3)
    try:
        yield w
    finally:
        w.close()


def body(key: str) -> str:
    return json.dumps({"id": key})


def prepare_busy_tick(world: World) -> None:
    """A state in which one tick passes every protocol step: an execution that ended with its
    event lost (reconciliation describes and releases it), then a batch holding a payload, an
    unusable message behind it in its group, a second message for the same payload, and another."""
    world.send(body("old"), group="g9")
    assert world.tick("A") == "ok"
    world.end(next(iter(world.model.running)), "SUCCEEDED")
    world.lose(0)
    world.advance(WINDOW + 1)
    world.send(body("p0"), group="g0")
    world.send("not JSON", group="g0", valid=False)
    world.send(body("p0"), group="g1")
    world.send(body("p1"), group="g2")
    world.send(body("p2"), group="g3")


@pytest.mark.parametrize("point", sorted(CRASH_POINTS))
def test_a_launcher_dying_at_any_step_loses_and_repeats_nothing(point):
    world = World(max_concurrency=3, duplicate_policy="defer" if point == "after_return" else "suppress")
    try:
        prepare_busy_tick(world)

        assert world.tick("A", [CrashAt(point)]) == "crashed", f"the tick never reached {point}"
        world.check()
        world.advance(VISIBILITY + 1)  # what the dead launcher held comes back
        world.tick("B")
        world.check()
        world.settle()
        assert {s.key for s in world.model.starts} >= {"old", "p0", "p1", "p2"}
    finally:
        world.close()


@pytest.mark.parametrize(
    ("point", "then"), [(p, "retried" if i % 2 else "lost") for i, p in enumerate(COMPLETION_POINTS)]
)
def test_the_completion_function_dying_at_any_step(world, point, then):
    """The event is then retried by Lambda, or lost: reconciliation finishes the release."""
    for i in range(3 if point in RELEASED_ALONE else 4):
        world.send(body(f"p{i}"), group=f"g{i}")
    world.tick("A")
    first = world.model.starts[0].name

    event = world.end(first, "SUCCEEDED")
    assert world.deliver(world.pending.index(event), [CrashAt(point)]) == "crashed"
    world.check()
    if then == "retried":
        world.deliver(0)
    else:
        world.lose(0)
    world.advance(VISIBILITY + WINDOW + 1)
    world.tick("B")
    world.settle()


@pytest.mark.parametrize(
    ("point", "inner"),
    [
        ("after_receive", "tick"),
        ("after_claim", "tick"),
        ("after_start", "finish_newest"),
        ("after_start", "tick"),
        ("before_delete", "finish_newest"),
    ],
)
def test_two_actors_at_the_same_moment(world, point, inner):
    """Launcher B's whole tick (or an execution ending and its event arriving) happens while
    launcher A stands at a protocol step: the last slot is taken once, no key runs twice."""
    world.set_max(2)
    for i in range(5):
        world.send(body(f"p{i % 3}"), group=f"g{i}")
    world.tick_interleaved("A", point, inner)
    world.check()
    world.ticks_at_once(("A", "B"))
    world.settle()


def test_two_launchers_in_threads_never_exceed_max(world):
    world.set_max(3)
    for round_ in range(4):
        for i in range(4):
            world.send(body(f"r{round_}-{i}"), group=f"g{i}")
        world.ticks_at_once(("A", "B"))
        world.check()
        assert len(world.model.running) <= 3
        for name in list(world.model.running)[:2]:
            world.end(name)
            world.deliver(len(world.pending) - 1)
    world.settle()


def test_after_max_is_lowered_nothing_starts_until_below_it(world):
    for i in range(3):
        world.send(body(f"early-{i}"), group=f"g{i}")
    world.tick("A")
    assert len(world.model.running) == 3
    world.set_max(1)
    for i in range(2):
        world.send(body(f"late-{i}"), group=f"h{i}")

    running = sorted(world.model.running)
    world.tick("A")
    world.end(running[0])
    world.deliver(0)  # 2 running, MAX 1: the freed slot is not refilled
    world.tick("B")
    world.end(running[1])
    world.deliver(0)  # 1 running: still not below MAX
    world.tick("A")
    assert not [s for s in world.model.starts if s.key.startswith("late")]

    world.end(running[2])
    world.deliver(0)  # 0 running: one may start, and only one
    world.tick("A")
    assert len([s for s in world.model.starts if s.key.startswith("late")]) == 1
    world.settle()


def test_max_zero_pauses_and_resuming_fills_every_slot(world):
    world.set_max(0)
    for i in range(4):
        world.send(body(f"p{i}"), group=f"g{i}")
    world.tick("A")
    world.tick("B")
    assert not world.model.starts
    world.set_max(4)
    world.tick("A")
    assert len(world.model.running) == 4
    world.settle()


def test_max_lowered_while_ssm_throttles_starts_nothing_new(world):
    """A warm launcher read MAX=3; the operator lowers it to 1; the next GetParameter is throttled.
    Starting under the remembered 3 would break promise 1."""
    for i in range(2):
        world.send(body(f"early-{i}"), group=f"g{i}")
    world.tick("A")
    world.set_max(1)
    world.send(body("late"), group="g9")
    world.tick("A", [Throttle("GetParameter", times=10)])
    world.check()
    assert not [s for s in world.model.starts if s.key == "late"]
    world.settle()


@pytest.mark.parametrize(
    "target", ["claim", "StartExecution", "DeleteMessageBatch", "release", "ListExecutions"]
)
def test_throttling_ends_the_tick_cleanly(world, target):
    prepare_busy_tick(world)
    outcome = world.tick("A", [Throttle(target, times=1_000)])
    assert outcome in ("ok", "refused")
    world.check()
    world.advance(VISIBILITY + 1)
    world.tick("A")
    world.settle()


@pytest.mark.parametrize("mode", ["empty", "drop_newest", "previous"])
def test_stale_listings_never_free_a_running_slot(world, mode):
    """ListExecutions misses executions or lists ended ones: reconciliation asks DescribeExecution
    before freeing anything, so no slot of a RUNNING execution is given away."""
    for i in range(3):
        world.send(body(f"p{i}"), group=f"g{i}")
    world.tick("A")
    world.advance(WINDOW + 1)
    world.tick("B", [StaleList(mode)])
    world.tick("A", [StaleList(mode)])
    for i in range(3, 6):
        world.send(body(f"p{i}"), group=f"g{i}")
    world.tick("B", [StaleList(mode)])
    assert len(world.model.running) == 3
    world.settle()


@pytest.mark.parametrize("skew", [-600.0, 600.0])
def test_clock_skew_between_launchers(skew):
    """B's clock is off by ``skew``: its reconciliation judges A's claims and starts by a wrong
    age, but releases only what DescribeExecution says ended or never started."""
    world = World(max_concurrency=2, skew=skew)
    try:
        for i in range(4):
            world.send(body(f"p{i}"), group=f"g{i}")
        world.tick("A", [CrashAt("after_claim", nth=2)])  # A dies holding a claim it never started
        world.advance(VISIBILITY + 1)
        world.tick_interleaved("B", "after_claim", "tick")
        world.advance(WINDOW + 1)
        world.tick("B")
        world.settle()
    finally:
        world.close()


def test_events_late_twice_out_of_order_or_never(world):
    world.set_max(4)
    for i in range(4):
        world.send(body(f"p{i}"), group=f"g{i}")
    world.tick("A")
    names = [s.name for s in world.model.starts]
    for name, status in zip(names, ["SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"], strict=True):
        world.end(name, status)
    world.deliver(3)  # the last first
    world.redeliver(0)  # and again
    world.deliver_running_event(names[0])  # a RUNNING event after the end
    world.lose(0)  # never
    world.tick("A")  # two slots came back: refill
    world.deliver(1)
    world.deliver(0)  # late
    world.redeliver(1)
    world.settle()

"""Promise 1 (never more than MAX) against the slot pool's caps: a stale listing of the executions
outside Sluice, and a crash between an adoption and the caps it moves.

Each scenario runs the real ``Launcher.tick`` of two containers on moto (the reliability world:
atomic requests, a fake clock), with interleavings and crashes injected through botocore hooks
that count what fired. Each judges what Step Functions itself runs (ListExecutions, RUNNING: Sluice's
and those started behind its back) against MAX, besides the world's model of every claim.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.reliability.world import WINDOW, PromiseBroken, World
from tests.support.faults import Interleave


@pytest.fixture
def worlds() -> Iterator[list[World]]:
    made: list[World] = []
    try:
        yield made
    finally:
        for world in made:
            world.close()


def make(worlds: list[World], **kwargs: object) -> World:
    worlds.append(World(**kwargs))  # type: ignore[arg-type]
    return worlds[-1]


def body(key: str) -> str:
    return json.dumps({"id": key})


def claimed(world: World) -> set[str]:
    return set(world.model.claims)


def at_most(world: World, limit: int) -> None:
    running = world.running_in_step_functions()
    if len(running) > limit:
        raise PromiseBroken(f"promise 1 (MAX): {len(running)} RUNNING under MAX {limit}: {sorted(running)}")
    world.check()


# -- break 1: a stale listing numbered last --------------------------------------------------------


def stale_listing_numbered_last(world: World) -> Interleave:
    """Tick A lists the executions (none outside Sluice). Before it goes on, X is started by hand on
    the stack's state machine and tick B runs whole: it counts X (external 1) and fills MAX − 1.
    Then A finishes its reconciliation with its own, older listing, and admits."""
    for i in range(3):
        world.send(body(f"p{i}"), group=f"g{i}")

    def behind_a() -> None:
        world.start_by_hand("x")
        assert world.tick("B") == "ok"
        at_most(world, 2)

    meanwhile = Interleave("after_list", behind_a)
    assert world.tick("A", [meanwhile]) == "ok"
    assert meanwhile.seen == 1
    return meanwhile


def test_a_listing_taken_before_a_newer_one_never_raises_the_caps_back(worlds):
    """Break 1. Failed before the fix: promise 1: A's external 0 was numbered after B's external 1
    (the number was taken when the count was saved), so the caps went back to MAX and A claimed a
    second payload beside X and B's: 3 under MAX 2."""
    world = make(worlds, max_concurrency=2)
    stale_listing_numbered_last(world)
    at_most(world, 2)
    assert len(claimed(world)) == 1  # B's: X takes the other slot
    world.advance(WINDOW + 1)
    assert world.tick("A") == "ok"  # a listing taken after B's agrees with it: still full
    at_most(world, 2)
    assert len(claimed(world)) == 1

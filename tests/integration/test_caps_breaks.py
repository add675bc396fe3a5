"""Promise 1 (never more than MAX) against the slot pool's caps: a stale listing of the executions
outside Sluice, and a crash between an adoption and the caps it moves.

Each scenario runs the real ``Launcher.tick`` of two containers on moto (the reliability world:
atomic requests, a fake clock), with interleavings and crashes injected through botocore hooks
that count what fired. Each judges what Step Functions itself runs (ListExecutions, RUNNING: Sluice's
and those started behind its back) against MAX, besides the world's model of every claim.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.reliability.world import WINDOW, PromiseBroken, World
from tests.support.faults import CrashAt, Fault, Interleave


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


def test_a_listing_overlapping_a_fresher_one_never_lowers_its_count_whichever_saves_last(worlds):
    """The other order. Tick B lists (none outside Sluice); X is started by hand and tick A runs
    whole: it lists X, counts external 1 and fills MAX − 1. B then numbers and saves last, with the
    higher number: its listing overlapped A's, so the larger count stands and B admits nothing."""
    world = make(worlds, max_concurrency=2)
    for i in range(3):
        world.send(body(f"p{i}"), group=f"g{i}")

    def behind_b() -> None:
        world.start_by_hand("x")
        assert world.tick("A") == "ok"
        at_most(world, 2)

    meanwhile = Interleave("after_list", behind_b)
    assert world.tick("B", [meanwhile]) == "ok"
    assert meanwhile.seen == 1
    at_most(world, 2)
    assert len(claimed(world)) == 1  # A's: X takes the other slot


# -- break 2: a crash between an adoption and its re-plan --------------------------------------------


def shards_of(world: World) -> dict[int, set[str]]:
    """The launcher pool's holders, by shard."""
    out: dict[int, set[str]] = {}
    for pk, item in world.table("holders").items():
        if pk.startswith("SLOTS#launcher#"):
            out[int(pk.rsplit("#", 1)[1])] = set(item.get("holders", {}).get("M", {}))
    return out


def full_pool_with_a_redriven_run(world: World) -> str:
    """MAX 4 on two shards of 2, full; p0, which ran before them and failed, runs again (redriven)."""
    world.send(body("p0"), group="g0")
    assert world.tick("A") == "ok"
    (p0,) = world.model.running
    world.end(p0, "FAILED")
    assert world.deliver(0) == "ok"
    for i in range(1, 5):
        world.send(body(f"p{i}"), group=f"g{i}")
    assert world.tick("A") == "ok"
    assert len(world.model.running) == 4 and all(len(h) == 2 for h in shards_of(world).values())
    for i in range(5, 8):
        world.send(body(f"q{i}"), group=f"h{i}")  # waiting for a slot
    world.redrive(p0)
    world.advance(WINDOW + 1)
    return p0


def ends_elsewhere(world: World, adopted: str) -> None:
    """A holder on a shard other than the adopted run's ends; its completion refills what it frees."""
    shards = shards_of(world)
    (elsewhere,) = [names for names in shards.values() if adopted not in names]
    event = world.end(sorted(elsewhere)[0])
    assert world.deliver(world.pending.index(event)) == "ok"


def test_a_crash_right_after_an_adoption_past_the_caps_admits_nothing_past_max(worlds):
    """Break 2. Failed before the fix: promise 1: reconciliation adopted p0 past its shard's cap and
    died before re-planning; the caps still summed to MAX, so the completion refilled the slot an end
    freed on the other shard: 5 RUNNING under MAX 4 (then a tick did the same)."""
    world = make(worlds, max_concurrency=4)
    p0 = full_pool_with_a_redriven_run(world)
    died = CrashAt("after_adopt")
    assert world.tick("A", [died]) == "crashed"
    assert died.seen == 1
    assert p0 in world.holders(world.table("holders"))  # adopted: 5 run, 5 hold a slot
    ends_elsewhere(world, p0)
    at_most(world, 4)
    assert world.tick("B") == "ok"
    at_most(world, 4)
    ends_elsewhere(world, p0)  # 3 run: one more may start
    assert world.tick("B") == "ok"
    at_most(world, 4)
    assert len(world.running_in_step_functions()) == 4


def test_the_pool_an_adopter_dies_in_admits_nothing_past_max_before_anything_ends(worlds):
    """Break 2 on the table, as the world checks it after every step (``pool_ceilings``): right after
    the adopter's crash, before any holder ends, the pool it left frozen admits nothing."""
    world = make(worlds, max_concurrency=4)
    p0 = full_pool_with_a_redriven_run(world)
    died = CrashAt("after_adopt")
    assert world.tick("A", [died]) == "crashed"
    assert died.seen == 1
    items = world.table("holders", "cap", "limit", "frozen")
    assert sum(len(items[f"SLOTS#launcher#{i}"]["holders"]["M"]) for i in range(2)) == 5
    world.check()
    assert items["SLOTS#launcher"]["frozen"] == {"BOOL": True}
    assert p0 in world.holders(items)


@dataclass
class AfterTheFreeze(Fault):
    """Run ``action`` once, right after the container froze the launcher's pool and read it again
    (the adopter's freeze, before its take): another writer re-plans the caps in between."""

    action: Callable[[], None]
    froze: bool = False
    seen: int = 0

    def after(self, injector: Any, call: Any, status: int, parsed: dict[str, Any]) -> None:
        if status >= 300 or self.seen:
            return
        if call.operation == "TransactWriteItems" and call.step == "limit" and froze_pool(call.params):
            self.froze = True
        elif self.froze and call.operation == "BatchGetItem":
            self.seen += 1
            self.action()


def froze_pool(params: dict[str, Any]) -> bool:
    for item in params.get("TransactItems", []):
        update = item.get("Update", {})
        if update.get("Key", {}).get("pk", {}).get("S") == "SLOTS#launcher":
            return update.get("ExpressionAttributeValues", {}).get(":frozen") == {"BOOL": True}
    return False


def test_a_replan_between_the_adopters_freeze_and_its_take_never_lets_it_past_the_caps(worlds):
    """The adopter froze the full pool; before its take, the operator's `sluice set-max 4` re-plans
    it (caps 2 + 2 again, the holders fit). The take is conditioned on the pool still frozen at the
    version the adopter read: refused, the adopter freezes again and takes; it then dies before its
    own re-plan. Nothing is admitted beside the 5 running under MAX 4."""
    world = make(worlds, max_concurrency=4)
    p0 = full_pool_with_a_redriven_run(world)
    replan = AfterTheFreeze(lambda: world.set_max(4))
    died = CrashAt("after_adopt")
    assert world.tick("A", [replan, died]) == "crashed"
    assert (replan.seen, died.seen) == (1, 1)
    assert p0 in world.holders(world.table("holders"))
    ends_elsewhere(world, p0)
    at_most(world, 4)
    assert world.tick("B") == "ok"
    at_most(world, 4)

"""Fair lanes (``sluice.features.fair``) under attack: processes dying at each step of the fair path, wakers
racing, AWS throttling the park, the wake and the waker's reads, the operator moving a lane's MAX or a
tenant's cap while tenants wait, a fair lane beside others, duplicates, a redrive, a stack
reconfigured under parked tenants.

Each scenario asserts what can be observed (executions started, messages left in the queue or in a
tenant's line, items in the table), that every fault it arms did fire, the model's checks at every
call (``World.check``: MAX, each lane's MAX, each key's cap, no receive spent by a parked message)
and at the end ``World.settle``: every payload starts exactly once, nothing is left parked, no slot
leaks.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from sluice.core.records import INFLIGHT_SECONDS
from sluice.features.lanes import parse_lanes
from sluice.launch.per_message import THROTTLED_STARTS
from sluice.runtime import Runtime
from tests.reliability.actors import Container
from tests.reliability.test_promise_breaks import (
    body,
    keyed,
    lane_runs,
    runs_of,
    tenants_running,
)
from tests.reliability.world import VISIBILITY, WINDOW, World
from tests.support.faults import (
    Call,
    Crash,
    CrashAt,
    Fault,
    Injector,
    Interleave,
    Throttle,
    count,
    throttled,
)

FAIR = "shared:4:0:1:fair"


# -- faults aimed at calls the named points do not name ------------------------------------------


@dataclass
class CrashWhen(Fault):
    """Kill the container before the first call ``aim`` picks (``label`` names it in the report)."""

    aim: Callable[[Call], bool]
    label: str
    fired: int = 0

    def before(self, injector: Injector, call: Call) -> None:
        if not self.fired and self.aim(call):
            self.fired += 1
            count(f"crash:before_{self.label}")
            injector.dead = True
            raise Crash(f"{injector.name} died before {self.label}")


@dataclass
class ThrottleWhen(Throttle):
    """Refuse the first ``times`` calls ``aim`` picks, after letting the first ``skip`` of them through
    (``target`` only names it in the report)."""

    aim: Callable[[Call], bool] = field(default=lambda call: False)

    def before(self, injector: Injector, call: Call) -> Any:
        if self.fired >= self.times or not self.aim(call):
            return None
        if self.skip > 0:
            self.skip -= 1
            return None
        self.fired += 1
        count(f"throttle:{self.target}")
        return throttled(call.service)


def reads_keys_waiting(call: Call) -> bool:
    """The waker's first read: ``KEYS_WAITING`` alone (reconciliation reads it with the other rooms)."""
    return call.operation == "GetItem" and call.params.get("Key", {}).get("pk", {}).get("S") == "KEYS_WAITING"


def reads_tenants(call: Call) -> bool:
    """A read of a fair lane's tenants' ``CKEY#`` items (one BatchGetItem): a pass's, for the shares of
    the newcomers in hand of two tenants or more, and the waker's."""
    if call.operation != "BatchGetItem":
        return False
    keys = [k for request in call.params.get("RequestItems", {}).values() for k in request.get("Keys", [])]
    return any(k.get("pk", {}).get("S", "").startswith("CKEY#") for k in keys)


# -- helpers -------------------------------------------------------------------------------------------


def send_tenant(
    world: World, tenant: str | None, n: int, *, lane: str = "shared", first: int = 0
) -> list[str]:
    """``n`` payloads of ``tenant`` (None: no key), each in its own group; their message ids."""
    label = tenant or "none"
    return [
        world.send(
            body(f"{label}{i}"),
            group=f"{label}{i}",
            lane=lane,
            attributes=keyed(tenant) if tenant is not None else None,
        )
        for i in range(first, first + n)
    ]


def line(world: World, tenant: str) -> dict[str, int]:
    """``CKEY#<tenant>`` as the table holds it: waiting, woken on the way, holders, and its mark."""
    item = world.table().get(f"CKEY#{tenant}", {})
    tickets = int(item.get("tickets", {}).get("N", 0))
    woken = int(item.get("woken", {}).get("N", 0))
    return {
        "waiting": tickets - woken,
        "inflight": len(item.get("inflight", {}).get("SS", [])),
        "holders": len(item.get("holders", {}).get("SS", [])),
        "fair": item.get("fair", {}).get("S"),
    }


def free_the_lane(world: World, lane: str = "shared") -> None:
    """Every run of ``lane`` ends while the operator has it paused, then its MAX is back: its slots
    are free and its waiters still wait in their lines (a paused lane's completions wake nobody), so
    that the next admission's pass finds nobody new and its waker shares the whole lane out."""
    world.set_lane_max(lane, 0)
    for name in lane_runs(world, lane):
        event = world.end(name)
        assert world.deliver(world.pending.index(event)) == "ok"
        world.check()
    world.set_lane_max(lane, None)
    assert not lane_runs(world, lane)


def once_each(world: World, keys: list[str]) -> None:
    """Every one of these payloads started, and exactly once."""
    for key in keys:
        assert len(runs_of(world, key)) == 1, f"{key} ran {runs_of(world, key)}"


def no_receive_spent(world: World) -> None:
    """No message was received twice: nothing of the fair lane went back to its queue for want of
    room (a woken waiter comes back as a new message, received once)."""
    assert world.model.max_receive_count <= 1, f"a message was received {world.model.max_receive_count} times"


def keys_of(world: World, ids: list[str]) -> list[str]:
    return [world.model.sent[m].key for m in ids]


# -- a process dying at each step of the fair path ----------------------------------------------


def two_tenants(world: World) -> list[str]:
    """heavy's 3 payloads then light's 2, in fair lane ``shared`` (MAX 4 under a global 4). A tick's
    pass holds both tenants: heavy0 and light0 claim the lane's first share (2) at once, heavy1,
    heavy2 and light1 line up, and the waker sends heavy1 and light1 into the lane's other 2 slots."""
    return keys_of(world, send_tenant(world, "heavy", 3) + send_tenant(world, "light", 2))


def test_tenants_arriving_together_claim_their_shares_at_once(make_world):
    """heavy's 6 payloads are queued before light's 2, each in its own group, and nobody waits in any
    line: the pass's first receive holds both tenants, so each claims its part of the lane's first
    share (2: the implied default lane has the other half) at once, heavy0 and light0, before the
    waker runs; only the 6 beyond it line up. The waker then shares the lane's other 2 slots, one
    each (heavy1, light1), and heavy's other 4 wait in its line."""
    world = make_world(max_concurrency=4, lanes=FAIR)
    keys = keys_of(world, send_tenant(world, "heavy", 6) + send_tenant(world, "light", 2))
    at_wake: dict[str, int] = {}
    first_wake = Interleave("before_key_wake", lambda: at_wake.update(tenants_running(world, "shared")))
    assert world.tick("A", [first_wake]) == "ok" and first_wake.seen >= 1
    world.check()
    assert at_wake == {"heavy": 1, "light": 1}, "the newcomers lined up rather than claim their shares"
    assert world.model.key_parks == 6, "a newcomer within its tenant's share lined up"
    assert world.model.key_wakes == 2
    assert tenants_running(world, "shared") == {"heavy": 2, "light": 2}
    assert sorted(s.key for s in world.model.starts) == ["heavy0", "heavy1", "light0", "light1"]
    assert line(world, "heavy")["waiting"] == 4 and line(world, "light")["waiting"] == 0
    assert world.queue_depth("shared") == 0
    no_receive_spent(world)
    world.settle()
    once_each(world, keys)


@pytest.mark.parametrize(
    "point, nth",
    [
        ("after_key_park", 1),  # a new message parked, before its delete
        ("after_key_park", 3),  # the last of the batch parked (heavy1, heavy2, light1)
        ("before_key_wake", 1),  # the waker about to send a tenant's oldest waiter
        ("after_key_wake", 1),  # a waiter sent back, before the move of ``woken``
        ("after_key_advance", 1),  # the line's head moved, before the woken are received
        ("after_claim", 3),  # a woken waiter's claim (heavy1), before StartExecution
        ("after_start", 3),  # a woken waiter started (heavy1), before its mark and its delete
    ],
)
def test_dying_on_the_fair_path_starts_every_payload_once(make_world, point, nth):
    world = make_world(max_concurrency=4, lanes=FAIR)
    keys = two_tenants(world)
    crash = CrashAt(point, nth)
    assert world.tick("A", [crash]) == "crashed", f"never reached {point} #{nth}"
    assert crash.seen == nth
    world.check()
    no_receive_spent(world)
    world.advance(VISIBILITY + 1)  # whatever the dead launcher held comes back
    world.tick("B")
    world.check()
    # A payload parked twice (the crash before a delete) is woken twice: its second copy finds its
    # own run and gives back the slot it was woken into, which the next admission fills.
    world.tick("A")
    world.check()
    assert len(lane_runs(world, "shared")) == 4
    assert sorted(tenants_running(world, "shared").values()) in ([1, 3], [2, 2])
    for name in list(world.model.running):
        world.end(name)
        assert world.deliver(0) == "ok"
        world.check()
    world.settle()
    once_each(world, keys)


def test_a_waker_dying_after_it_sent_a_waiter_twice_starts_it_once(make_world):
    """Two tenants' payloads arrive together: heavy0 and light0 claim the lane's first share at once,
    heavy1 lines up. The waker sends heavy's oldest waiter and dies before the move of ``woken``: the
    waiter is in the queue and still first in its line. The next admission claims the copy in the
    queue, then sends the waiter again (the lane has a slot left): the second copy finds its own run
    (one execution name) and gives its kept slot back; each payload runs once."""
    world = make_world(max_concurrency=4, lanes=FAIR)
    keys = keys_of(world, send_tenant(world, "heavy", 2) + send_tenant(world, "light", 1))
    crash = CrashAt("after_key_wake")
    assert world.tick("A", [crash]) == "crashed" and crash.seen == 1
    assert line(world, "heavy")["waiting"] == 1, "a move of woken happened"
    assert world.queue_depth("shared") == 1, "the waiter was not sent"
    world.tick("B")
    world.check()
    assert all(len(runs_of(world, k)) == 1 for k in keys)
    world.advance(VISIBILITY + 1)
    world.tick("B")
    world.check()
    assert all(len(runs_of(world, k)) == 1 for k in keys), "the waiter sent twice ran twice"
    for tenant in ("heavy", "light"):
        assert line(world, tenant)["waiting"] == 0 and line(world, tenant)["inflight"] == 0
    world.settle()
    once_each(world, keys)


def test_a_completion_dying_between_its_sort_and_its_wake_loses_nothing(make_world):
    """A light run ends; the completion's refill parks light's new payload in its line and dies
    before the waker reads the lane. Lambda retries the event, which finds nothing to release and so
    refills nothing: the scheduled tick gives the freed slot to light."""
    world = make_world(max_concurrency=4, lanes=FAIR)
    keys = two_tenants(world) + keys_of(world, send_tenant(world, "heavy", 2, first=3))
    world.tick("A")
    assert tenants_running(world, "shared") == {"heavy": 2, "light": 2}
    keys += keys_of(world, send_tenant(world, "light", 1, first=2))
    light = next(n for n in lane_runs(world, "shared") if world.model.ckey_of(n) == "light")
    world.end(light)
    crash = CrashWhen(reads_keys_waiting, "the waker's read")
    assert world.deliver(0, [crash]) == "crashed" and crash.fired == 1
    world.check()
    assert world.queue_depth("shared") == 0, "the new payload was not parked and deleted"
    assert line(world, "light")["waiting"] == 1
    assert world.deliver(0) == "ok"  # the retry: released already, nothing refilled
    assert len(lane_runs(world, "shared")) == 3
    world.tick("B")
    world.check()
    assert tenants_running(world, "shared") == {"heavy": 2, "light": 2}, "the freed slot left light"
    world.settle()
    once_each(world, keys)


def test_a_woken_waiter_parked_again_and_dying_before_its_delete_runs_once(make_world):
    """heavy0 and light0 claim the lane's first share at once and heavy1, heavy2, light1 line up. The
    operator lowers the lane's MAX to 0 between the wake (heavy1, light1) and the woken claims: they
    find no room and park again, at the back; the launcher dies after parking the first of them
    again, before the batch's delete. The copy comes back with its ticket (and is in its line once
    more): it runs once."""
    world = make_world(max_concurrency=4, lanes=FAIR)
    keys = two_tenants(world)
    lowered = Interleave("after_key_advance", lambda: world.set_lane_max("shared", 0))
    crash = CrashAt("after_key_park", 4)  # 3 new ones parked, then the first woken one again
    assert world.tick("A", [lowered, crash]) == "crashed"
    assert lowered.seen >= 1 and crash.seen == 4
    world.check()
    started = sorted(s.key for s in world.model.starts)
    assert started == ["heavy0", "light0"], "a woken claim passed a lane MAX of 0"
    world.set_lane_max("shared", None)
    world.advance(VISIBILITY + 1)
    world.tick("B")
    world.check()
    assert len(lane_runs(world, "shared")) == 4
    world.settle()
    once_each(world, keys)


# -- wakers racing ------------------------------------------------------------------------------------


def test_two_launchers_at_once_on_one_fair_lane_never_pass_its_max(make_world):
    """A and B tick at once over a fair lane of 3 tenants: both park, both wake the same room (too
    many waiters sent), both claim. The claims are exact: the lane's MAX and the global MAX hold,
    the extra waiters park again rather than go back to the queue, and nothing is received twice."""
    world = make_world(max_concurrency=6, lanes="shared:4:0:1:fair,default:2")
    keys = []
    for tenant in ("a", "b", "c"):
        keys += keys_of(world, send_tenant(world, tenant, 4))
    world.ticks_at_once()
    world.check()
    no_receive_spent(world)
    assert len(lane_runs(world, "shared")) <= 4
    assert world.queue_depth("shared") == 0 or len(lane_runs(world, "shared")) < 4
    world.tick("A")
    world.check()
    assert len(lane_runs(world, "shared")) == 4
    # Not the shares: two wakers reading the same room each send a tenant its share, and which
    # of the waiters sent claim first is the threads' order (sluice.features.fair: the claim, not
    # the waker, is exact). A lone waker's shares are checked by the other tests here.
    no_receive_spent(world)
    world.settle()
    once_each(world, keys)


def test_a_completion_waking_between_the_ticks_wake_and_its_claims_oversends_safely(make_world):
    """Lane MAX 2. x0 and y0 take its 2 slots at once and x1, x2, y1, y2 line up; the operator pauses
    the lane while x0 and y0 end (their completions wake nobody) and puts it back: 2 free slots, 4
    waiters, nobody woken. The tick's waker shares the 2 slots and sends x1; before it sends y1, d0
    (another lane's run) ends and its completion refills the lane: its sort claims and starts the
    tick's woken x1, and its waker reads the lane's room (the slot the tick meant for y1, still free)
    and wakes and starts y1. Then the tick finds ``woken`` moved, reads again and sends y2, who finds
    no room and parks again. Never more than 2 in the lane, nothing back to the queue."""
    world = make_world(max_concurrency=3, lanes="shared:2:0:1:fair,default:1")
    world.send(body("d0"), group="d0")
    world.tick("A")
    (d0,) = lane_runs(world, "default")
    keys = keys_of(world, send_tenant(world, "x", 3) + send_tenant(world, "y", 3))
    world.tick("A")
    assert tenants_running(world, "shared") == {"x": 1, "y": 1}
    assert line(world, "x")["waiting"] == line(world, "y")["waiting"] == 2
    free_the_lane(world)
    assert len(world.key_waiters_in_table()) == 4
    world.end(d0)

    meanwhile = Interleave("after_key_advance", lambda: world.deliver(0))
    assert world.tick("A", [meanwhile]) == "ok"
    assert meanwhile.seen >= 1 and not world.pending
    world.check()
    no_receive_spent(world)
    assert tenants_running(world, "shared") == {"x": 1, "y": 1}
    assert world.queue_depth() == 0
    world.settle()
    once_each(world, keys)


def test_wakers_over_sending_the_same_room_park_the_extra_waiters_again(make_world):
    """x0 and y0 take the lane's 2 slots at once, x1..x3 and y1..y3 line up; the lane's runs end while
    it is paused (``free_the_lane``): 2 free slots, 6 waiters. Tick A's waker sends its first waiter,
    x1; before it moves ``woken``, tick B runs whole (time has moved on: its sends are not SQS's
    repeats): it claims x1, wakes the lane's other slot (y1), claims, fills the lane. A then finds
    ``woken`` moved, reads again and sends the next waiter, who finds no room: it parks again. The
    lane never passes its MAX and no message is received twice."""
    world = make_world(max_concurrency=4, lanes="shared:2:0:1:fair,default:2")
    keys = keys_of(world, send_tenant(world, "x", 4) + send_tenant(world, "y", 4))
    world.tick("A")
    free_the_lane(world)
    assert len(world.key_waiters_in_table()) == 6
    parked = world.model.key_parks  # the 6 newcomers that lined up

    def other() -> None:
        world.clock.advance(1)
        world.tick("B")

    meanwhile = Interleave("after_key_wake", other)
    assert world.tick("A", [meanwhile]) == "ok" and meanwhile.seen >= 1
    world.check()
    no_receive_spent(world)
    assert len(lane_runs(world, "shared")) == 2
    assert world.queue_depth("shared") == 0, "an extra waiter was left in the queue"
    assert world.model.key_parks > parked, "no waiter was sent too many, the race did not happen"
    world.settle()
    once_each(world, keys)


def test_a_launcher_with_a_slow_clock_waking_the_same_lane_oversends_safely(make_world):
    """B's clock is 400 s behind: the waiters it wakes look, to A, woken longer ago than a kept slot
    lasts. B's pass claims its first share at once (x0, y0) and lines up the other 6; its waker then
    sends x1 and moves ``woken``. A runs whole between B's wake and B's claims: it drops B's entries,
    claims x1's copy, wakes the lane's room again and claims first (y1); B's next woken waiter (y2)
    finds no room and parks again."""
    world = make_world(max_concurrency=4, lanes=FAIR, skew=-400.0)
    keys = keys_of(world, send_tenant(world, "x", 4) + send_tenant(world, "y", 4))
    meanwhile = Interleave("after_key_advance", lambda: world.tick("A"))
    assert world.tick("B", [meanwhile]) == "ok" and meanwhile.seen >= 1
    world.check()
    no_receive_spent(world)
    assert tenants_running(world, "shared") == {"x": 2, "y": 2}
    assert world.queue_depth("shared") == 0
    lined_up = len(keys) - 2  # x0 and y0 claimed at once, the others parked once each
    assert world.model.key_parks > lined_up, "no waiter was sent too many, the race did not happen"
    world.settle()
    once_each(world, keys)


def test_the_global_max_lowered_between_the_wake_and_the_claims_is_obeyed(make_world):
    """heavy0 and light0 claim the lane's first share at once; heavy1, heavy2 and light1 line up. The
    operator lowers MAX from 4 to 2 after the lane's waker sent heavy1 back (and before it sends
    light1): the 2 woken find no room and park again, at the back of their lines; none goes back to
    the queue."""
    world = make_world(max_concurrency=4, lanes=FAIR)
    keys = two_tenants(world)
    lowered = Interleave("after_key_advance", lambda: world.lower_max_mid_tick(2))
    assert world.tick("A", [lowered]) == "ok" and lowered.seen >= 1
    world.check()
    assert len(world.model.running) == 2
    assert world.queue_depth("shared") == 0
    assert len(world.key_waiters_in_table()) == 3, "a woken waiter with no room left its line"
    no_receive_spent(world)
    world.settle()
    once_each(world, keys)


def test_a_tenant_capped_between_the_wake_and_its_claims_parks_the_extra_again(make_world):
    """heavy's and light's first 2 payloads each claim the lane at once and the other 3 of each line
    up; the lane's runs end while it is paused (``free_the_lane``). The next tick's waker wakes heavy
    into 2 slots (heavy2, heavy3), light into 2; before the claims the operator gives heavy its own
    cap of 1 (the command's wake-up leaves a fair lane's tenant alone): one claims, the other parks
    again; light's last payload gets the slot at the next admission."""
    world = make_world(max_concurrency=4, lanes="shared:4:1:1:fair")  # above default: all 4 at once
    keys = keys_of(world, send_tenant(world, "heavy", 5) + send_tenant(world, "light", 5))
    world.tick("A")
    assert tenants_running(world, "shared") == {"heavy": 2, "light": 2}
    free_the_lane(world)
    assert line(world, "heavy")["waiting"] == line(world, "light")["waiting"] == 3
    capped = Interleave("after_key_advance", lambda: world.set_key_cap("heavy", 1))
    assert world.tick("A", [capped]) == "ok" and capped.seen >= 1
    world.check()
    assert tenants_running(world, "shared") == {"heavy": 1, "light": 2}
    assert line(world, "heavy") == {"waiting": 2, "inflight": 0, "holders": 1, "fair": "shared"}
    no_receive_spent(world)
    world.tick("B")
    world.check()
    assert tenants_running(world, "shared") == {"heavy": 1, "light": 3}
    world.settle()
    once_each(world, keys)


# -- AWS throttling ------------------------------------------------------------------------------------


def test_a_throttled_park_hands_back_only_what_it_did_not_park(make_world):
    """The second park of the batch is throttled: what was parked is deleted, the rest goes back to
    the queue (a transient error, not a want of room) and is parked by the next tick."""
    world = make_world(max_concurrency=4, lanes=FAIR)
    keys = two_tenants(world)
    throttle = Throttle("key_park", skip=1)
    assert world.tick("A", [throttle]) == "ok"
    assert throttle.fired == 1
    world.check()
    assert world.queue_depth("shared") > 0, "nothing was handed back"
    world.advance(VISIBILITY + 1)
    world.tick("B")
    world.check()
    assert world.queue_depth("shared") == 0
    assert len(lane_runs(world, "shared")) == 4
    world.settle()
    once_each(world, keys)


@pytest.mark.parametrize("skip", [0, 1])
def test_a_throttled_wake_leaves_the_waiters_in_their_lines(make_world, skip):
    """The wake's SendMessage is throttled (the first, or the second after one went through): the
    tick ends as interrupted (it returns; before, it failed) after starting the newcomers' share and
    parking and deleting the rest; nothing is lost, nothing runs twice."""
    world = make_world(max_concurrency=4, lanes=FAIR)
    keys = two_tenants(world)
    throttle = Throttle("key_wake", skip=skip)
    assert world.tick("A", [throttle]) == "ok"
    assert throttle.fired == 1
    world.check()
    # The lane's first share is 2 (the implied default lane has the other half): heavy0 and light0
    # claim it at once, heavy1, heavy2 and light1 line up. The waker's share is 2 as well: heavy's
    # oldest waiter, then light's. The send refused leaves light's in its line, and the tick ends there.
    assert tenants_running(world, "shared") == {"heavy": 1, "light": 1}
    assert world.queue_depth("shared") == skip, "a new message was left in the queue"
    assert len(world.key_waiters_in_table()) == 3 - skip, "a waiter left its line unsent"
    world.tick("B")
    world.check()
    assert len(lane_runs(world, "shared")) == 4
    no_receive_spent(world)
    world.settle()
    once_each(world, keys)


def test_a_throttled_wake_in_the_completion_leaves_the_slot_to_the_tick(make_world):
    world = make_world(max_concurrency=4, lanes=FAIR)
    keys = two_tenants(world)
    world.tick("A")
    (light,) = [n for n in lane_runs(world, "shared") if world.model.ckey_of(n) == "light"][:1]
    world.end(light)
    throttle = Throttle("key_wake")
    assert world.deliver(0, [throttle]) == "ok" and throttle.fired == 1
    world.check()
    assert len(lane_runs(world, "shared")) == 3
    world.tick("B")
    world.check()
    assert len(lane_runs(world, "shared")) == 4
    world.settle()
    once_each(world, keys)


def test_a_throttled_read_of_the_tenants_wakes_nobody_and_loses_nobody(make_world):
    """The pass reads heavy's and light's items for the newcomers' shares: heavy0 and light0 claim at
    once, heavy1, heavy2 and light1 line up. The waker's read of the tenants is throttled: the tick
    ends as interrupted having woken nobody, the waiters stay in their lines, and the next tick wakes them."""
    world = make_world(max_concurrency=4, lanes=FAIR)
    keys = two_tenants(world)
    throttle = ThrottleWhen("BatchGetItem:CKEY", aim=reads_tenants, skip=1)  # the pass's read goes through
    assert world.tick("A", [throttle]) == "ok" and throttle.fired == 1
    world.check()
    assert tenants_running(world, "shared") == {"heavy": 1, "light": 1}
    assert world.queue_depth("shared") == 0 and len(world.key_waiters_in_table()) == 3
    world.tick("B")
    world.check()
    assert tenants_running(world, "shared") == {"heavy": 2, "light": 2}
    world.settle()
    once_each(world, keys)


def test_a_throttled_read_for_the_shares_lines_the_newcomers_up(make_world):
    """The pass's read of heavy's and light's items (their shares) is throttled: the newcomers in hand
    line up, as a pass's did before the shares, rather than go back to the queue and spend a receive
    each (maxReceiveCount would move them to the DLQ after as many throttled passes); the waker then
    shares the lane out."""
    world = make_world(max_concurrency=4, lanes=FAIR)
    keys = two_tenants(world)
    throttle = ThrottleWhen("BatchGetItem:CKEY", aim=reads_tenants)
    assert world.tick("A", [throttle]) == "ok" and throttle.fired == 1
    world.check()
    no_receive_spent(world)
    assert world.queue_depth("shared") == 0, "a newcomer went back to the queue"
    assert tenants_running(world, "shared") == {"heavy": 2, "light": 2}
    world.settle()
    once_each(world, keys)


def test_a_woken_waiter_whose_start_is_refused_keeps_its_slot(make_world):
    """t0 and u0 claim the lane's first share at once, the others line up and the waker wakes t1 and
    u1 into the lane's other 2 slots; the lane's runs end while it is paused (``free_the_lane``). The
    next tick wakes t2 and u2; Step Functions throttles every StartExecution of the first woken
    waiter (the launcher backs off and gives up): its claim is rolled back, the messages go back to
    the queue (a refusal, not a want of room) keeping their slots in their tenants, and the next
    tick starts each, once."""
    world = make_world(max_concurrency=4, lanes=FAIR)
    keys = keys_of(world, send_tenant(world, "t", 3) + send_tenant(world, "u", 3))
    world.tick("A")
    assert tenants_running(world, "shared") == {"t": 2, "u": 2}
    free_the_lane(world)
    assert line(world, "t")["waiting"] == line(world, "u")["waiting"] == 1
    throttle = Throttle("StartExecution", times=THROTTLED_STARTS)
    assert world.tick("A", [throttle]) == "ok"
    assert throttle.fired == THROTTLED_STARTS
    world.check()
    assert len(world.model.running) <= 1
    kept = line(world, "t")["inflight"] + line(world, "u")["inflight"]
    assert kept == world.queue_depth("shared") >= 1, "a woken waiter lost its kept slot"
    world.advance(VISIBILITY + 1)
    world.tick("B")
    world.check()
    assert all(len(runs_of(world, k)) == 1 for k in keys)
    assert line(world, "t")["inflight"] == 0 and line(world, "u")["inflight"] == 0
    world.settle()


# -- the operator -------------------------------------------------------------------------------------


def test_a_lane_max_lowered_while_tenants_wait_holds_every_refill(make_world):
    """4 run, 5 wait; the operator lowers the lane to 1. Each end releases a slot and its completion
    refills: nothing starts until one runs; raised again, the tick fills the lane fairly."""
    world = make_world(max_concurrency=4, lanes=FAIR)
    keys = keys_of(world, send_tenant(world, "heavy", 8) + send_tenant(world, "light", 5))
    world.tick("A")
    assert tenants_running(world, "shared") == {"heavy": 2, "light": 2}
    world.set_lane_max("shared", 1)
    for name in lane_runs(world, "shared"):
        world.end(name)
        assert world.deliver(0) == "ok"
        world.check()
        assert len(lane_runs(world, "shared")) <= 3
    assert len(lane_runs(world, "shared")) == 1, "the last refill did not start one"
    world.tick("B")
    world.check()
    assert len(lane_runs(world, "shared")) == 1
    no_receive_spent(world)
    world.set_lane_max("shared", None)
    world.tick("B")
    world.check()
    assert len(lane_runs(world, "shared")) == 4
    assert sorted(tenants_running(world, "shared").values()) == [2, 2]
    world.settle()
    once_each(world, keys)


def test_a_tenant_paused_while_it_waits_gets_nothing_until_its_cap_is_back(make_world):
    """light's own cap goes to 0 while its payloads wait: its runs end, and their slots go to heavy;
    light gets none. Its cap back to the default (none, in a fair lane), the next admission gives it
    the slots heavy's ends free, until both have the same."""
    world = make_world(max_concurrency=4, lanes=FAIR)
    keys = keys_of(world, send_tenant(world, "heavy", 8) + send_tenant(world, "light", 5))
    world.tick("A")
    world.set_key_cap("light", 0)
    for name in [n for n in lane_runs(world, "shared") if world.model.ckey_of(n) == "light"]:
        world.end(name)
        assert world.deliver(0) == "ok"
        world.check()
    world.tick("B")
    world.check()
    assert tenants_running(world, "shared") == {"heavy": 4}
    assert line(world, "light")["waiting"] == 3
    world.set_key_cap("light", None)
    assert line(world, "light")["waiting"] == 3, "set-max --key woke a fair lane's tenant itself"
    for name in [n for n in lane_runs(world, "shared") if world.model.ckey_of(n) == "heavy"][:2]:
        world.end(name)
        assert world.deliver(0) == "ok"
        world.check()
    assert tenants_running(world, "shared") == {"heavy": 2, "light": 2}
    world.settle()
    once_each(world, keys)


def test_a_tenant_capped_at_one_in_a_fair_lane_runs_one(make_world):
    """heavy's own cap is 1: its share of an idle lane is one, whatever else waits; the rest goes to
    the others (and stays free if nobody else waits)."""
    world = make_world(max_concurrency=4, lanes=FAIR)
    world.set_key_cap("heavy", 1)
    keys = keys_of(world, send_tenant(world, "heavy", 4) + send_tenant(world, "light", 1))
    world.tick("A")
    world.check()
    assert tenants_running(world, "shared") == {"heavy": 1, "light": 1}
    world.settle()
    once_each(world, keys)


# -- a fair lane among others -------------------------------------------------------------------------


def test_a_fair_lane_beside_an_ordinary_and_a_priority_lane(make_world):
    """urgent (priority 1, MAX 1), shared (fair, MAX 2), default (MAX 2), under a global MAX of 4.
    shared serves a keyed tenant and its unkeyed messages (one tenant, ``lane:shared``) side by
    side; default serves keyed messages at their key's cap of 1. A freed slot goes to urgent first."""
    world = make_world(max_concurrency=4, lanes="urgent:1:1,shared:2:0:1:fair,default:2")
    keys = keys_of(world, send_tenant(world, "t", 3) + send_tenant(world, None, 3))
    keys += keys_of(world, send_tenant(world, "k", 3, lane="default", first=10))
    world.tick("A")
    world.check()
    assert tenants_running(world, "shared") == {"t": 1, "lane:shared": 1}
    assert len(lane_runs(world, "default")) == 1, "the key k ran beyond its cap, or not at all"
    assert world.queue_depth("shared") == 0
    keys += keys_of(world, send_tenant(world, None, 1, lane="urgent", first=20))
    name = lane_runs(world, "shared")[0]
    world.end(name)
    assert world.deliver(0) == "ok"
    world.check()
    assert len(lane_runs(world, "urgent")) == 1, "the freed slot did not go to the priority lane"
    world.settle()
    once_each(world, keys)


def test_a_key_used_in_a_fair_lane_and_an_ordinary_one_keeps_its_cap_in_the_ordinary_one(make_world):
    """k runs twice in fair lane shared (a claim from a fair lane has no default key cap). A payload
    of k waits in the ordinary lane default, and a default run ends: the completion's refill may not
    claim it there, where k's cap is the default, 1, whatever k's runs in the fair lane."""
    world = make_world(max_concurrency=6, lanes="shared:2:0:1:fair,default:4")
    world.send(body("d0"), group="d0")
    keys = keys_of(world, send_tenant(world, "k", 2))
    world.tick("A")
    assert tenants_running(world, "shared") == {"k": 2} and len(lane_runs(world, "default")) == 1
    keys += keys_of(world, send_tenant(world, "k", 1, lane="default", first=10))
    world.end(lane_runs(world, "default")[0])
    assert world.deliver(0) == "ok"
    world.check()
    assert not lane_runs(world, "default"), "k ran a third time, in the ordinary lane, over its cap of 1"
    world.settle()
    once_each(world, keys)


def test_a_fair_lanes_payloads_that_await_keys_or_run_once_take_their_turn(make_world):
    """w (tenant t) awaits a, which runs in the default lane: w waits in the table, not in t's line;
    a's success sends it to the fair lane's queue, where it lines up and starts. A run-once copy of
    w, sent after w succeeded, is woken and acknowledged as already done, its kept slot given back."""
    world = make_world(max_concurrency=4, lanes="shared:2:0:1:fair,default:2")
    world.send(body("a"), group="ga")
    w = world.send(
        body("w"), group="gw", lane="shared", attributes={**keyed("t"), "sluice-awaits": json.dumps(["a"])}
    )
    world.tick("A")
    world.check()
    assert world.waiters_in_table() == {w: ["a"]} and line(world, "t")["waiting"] == 0
    (a,) = lane_runs(world, "default")
    world.end(a)
    assert world.deliver(0) == "ok"
    world.check()
    if w not in world.model.started_by_message:
        world.tick("A")
        world.check()
    assert w in world.model.started_by_message, "the woken waiter did not start"
    assert tenants_running(world, "shared") == {"t": 1}
    (wn,) = lane_runs(world, "shared")
    world.end(wn)
    assert world.deliver(0) == "ok"
    again = world.send(
        body("w"), group="gw2", lane="shared", attributes={**keyed("t"), "sluice-once": "true"}
    )
    world.tick("A")
    world.check()
    assert again in world.model.already_done
    assert line(world, "t")["inflight"] == 0 and line(world, "t")["waiting"] == 0
    assert len(runs_of(world, "w")) == 1
    world.settle()


def test_effects_sent_to_a_fair_lane_line_up_with_its_tenants(make_world):
    """p0 succeeds with two effects for fair lane shared, tenant t: they are new messages there, each
    parked in t's line and started in its turn beside u's backlog."""
    world = make_world(max_concurrency=4, lanes="shared:2:0:1:fair,default:2")
    world.send(body("p0"), group="g0")
    keys = keys_of(world, send_tenant(world, "u", 4))
    world.tick("A")
    assert tenants_running(world, "shared") == {"u": 2}
    (p0,) = lane_runs(world, "default")
    effects = [
        {"payload": {"id": f"fx{i}"}, "lane": "shared", "concurrency_key": "t", "group": f"fx{i}"}
        for i in range(2)
    ]
    world.end(p0, effects=effects)
    assert world.deliver(0) == "ok"
    world.check()
    assert world.queue_depth("shared") <= 2
    u = next(n for n in lane_runs(world, "shared") if world.model.ckey_of(n) == "u")
    world.end(u)
    assert world.deliver(0) == "ok"
    world.check()
    assert tenants_running(world, "shared") == {"u": 1, "t": 1}, "the freed slot did not go to t"
    world.settle()
    once_each(world, [*keys, "fx0", "fx1"])


@pytest.mark.parametrize("policy", ["suppress", "defer"])
def test_a_payload_sent_twice_to_a_fair_lane_runs_once_at_a_time(make_world, policy):
    """Two copies of p0 (two groups, tenant t) wait in t's line; both are woken into an idle lane.
    One runs; the other is a duplicate (suppressed, or deferred behind it and run after it)."""
    world = make_world(max_concurrency=4, lanes=FAIR, duplicate_policy=policy)
    world.send(body("p0"), group="g0", lane="shared", attributes=keyed("t"))
    second = world.send(body("p0"), group="g1", lane="shared", attributes=keyed("t"))
    world.tick("A")
    world.check()
    assert len(runs_of(world, "p0")) == 1
    if policy == "suppress":
        assert second in world.model.duplicates
    else:
        assert len(world.parked_in_table()) == 1
    assert line(world, "t")["inflight"] == 0, "the duplicate's kept slot was not given back"
    (p0,) = world.model.running
    world.end(p0)
    assert world.deliver(0) == "ok"
    world.check()
    assert len(runs_of(world, "p0")) == (1 if policy == "suppress" else 2)
    world.settle()


def test_a_deferred_duplicate_comes_back_to_its_tenants_line(make_world):
    """Tenant a runs p0 and a1 (the lane's MAX 2) and a2 waits in its line; a's copy of p0, woken
    earlier, was deferred behind p0; b's two payloads wait. p0 ends and its release sends the copy
    back to the lane's queue: it is a new message there, to a's line, and the freed slot goes to the
    tenant with the fewest runs, b (0 against a's 1), not back to a."""
    world = make_world(max_concurrency=3, lanes="shared:2:0:1:fair", duplicate_policy="defer")
    world.send(body("p0"), group="g0", lane="shared", attributes=keyed("a"))
    world.tick("A")
    (p0,) = world.model.running
    world.send(body("p0"), group="g1", lane="shared", attributes=keyed("a"))
    world.tick("A")
    assert len(world.parked_in_table()) == 1, "the copy of p0 was not deferred"
    keys = keys_of(world, send_tenant(world, "a", 2, first=1))
    world.tick("A")
    assert tenants_running(world, "shared") == {"a": 2} and line(world, "a")["waiting"] == 1
    keys += keys_of(world, send_tenant(world, "b", 2))
    world.tick("A")  # the lane has no room: b's payloads wait in its queue, not received
    assert not tenants_running(world, "shared").get("b") and world.queue_depth("shared") == 2
    no_receive_spent(world)
    world.end(p0)
    assert world.deliver(0) == "ok"
    world.check()
    assert tenants_running(world, "shared") == {"a": 1, "b": 1}, "the freed slot went back to a"
    world.settle()
    once_each(world, keys)
    assert len(runs_of(world, "p0")) == 2


def test_a_fair_tenants_run_redriven_behind_sluices_back_counts_in_its_lane(make_world):
    """t's p0 failed and was released; an operator redrives it while the lane is full (t and u run
    one each). Reconciliation adopts it, a slot of the lane too whatever its room, and t's key holds
    it: nothing is admitted beside it while the lane is over its MAX, and once the others end the
    one free slot goes to u, the tenant with the fewest runs (t has p0)."""
    world = make_world(max_concurrency=3, lanes="shared:2:0:1:fair,default:1")
    world.send(body("p0"), group="g0", lane="shared", attributes=keyed("t"))
    world.tick("A")
    (p0,) = world.model.running
    world.end(p0, "FAILED")
    assert world.deliver(0) == "ok"
    keys = keys_of(world, send_tenant(world, "u", 3) + send_tenant(world, "t", 2, first=1))
    world.tick("A")
    assert tenants_running(world, "shared") == {"u": 1, "t": 1}
    world.redrive(p0)
    world.advance(WINDOW + 1)
    world.tick("B")  # reconciliation adopts p0: 3 in a lane of 2, nothing admitted beside it
    world.check()
    assert p0 in world.holders(world.table())
    assert line(world, "t")["holders"] == 2
    for name in [n for n in lane_runs(world, "shared") if n != p0]:
        world.end(name)
        assert world.deliver(0) == "ok"
        world.check()
    # p0 (t) runs; the one free slot goes to u, the tenant with the fewest runs.
    assert tenants_running(world, "shared") == {"t": 1, "u": 1}
    world.settle()
    once_each(world, keys)


# -- the stack reconfigured under parked tenants -------------------------------------------------------


def reconfigure(world: World, lanes: str) -> None:
    """Deploy ``lanes`` on the same stack (same table, same queues: the lanes keep their names): the
    containers start again with the new settings, and the model judges by them from now on."""
    settings = replace(world.settings, lanes=parse_lanes(lanes, world.settings.max_concurrency))
    assert {lane.name for lane in settings.lanes} == set(world.lane_names()), "a lane was added or removed"
    world.settings = world.stack.settings = settings
    world.model.fair_lanes = frozenset(lane.name for lane in settings.lanes if lane.fair)
    for lane in settings.lanes:
        world.model.lanes[lane.name] = world.model.lane_limits[lane.name] = None if lane.implied else lane.max
    world.operator = Runtime(settings, session=world.session, clock=world.clock)
    for name, old in list(world.containers.items()):
        world.containers[name] = Container(name, world, old.clock, old.config)
    world.count("stack:reconfigured")


def test_a_lane_no_longer_fair_serves_its_parked_tenants_at_their_key_cap(make_world):
    """shared is fair; 4 of heavy's payloads and 2 unkeyed ones wait in their lines when a deploy makes
    shared an ordinary lane. Reconciliation's sweep wakes its former tenants as any key: heavy at its
    key's cap (the default, 1), the unkeyed ones as payloads without a key."""
    world = make_world(max_concurrency=4, lanes="shared:1:0:1:fair")
    keys = keys_of(world, send_tenant(world, "heavy", 5) + send_tenant(world, None, 2))
    world.tick("A")
    assert len(lane_runs(world, "shared")) == 1
    reconfigure(world, "shared:4")
    world.tick("A")
    world.check()
    assert world.model.ckey_of(lane_runs(world, "shared")[0]) in ("heavy", None)
    for _ in range(3):
        world.advance(INFLIGHT_SECONDS + 1)
        world.tick("A")
        world.check()
    heavy = [n for n in lane_runs(world, "shared") if world.model.ckey_of(n) == "heavy"]
    assert len(heavy) <= 1, f"heavy runs {len(heavy)} at once under its key's cap of 1"
    world.settle()
    once_each(world, keys)


def test_a_lane_made_fair_serves_the_keys_waiting_in_it(make_world):
    """shared is ordinary: heavy's payloads wait in heavy's line at its key's cap (1). A deploy makes
    shared fair: heavy's waiters and the new tenant's payloads share the lane, every payload once."""
    world = make_world(max_concurrency=4, lanes="shared:4")
    keys = keys_of(world, send_tenant(world, "heavy", 4))
    world.tick("A")
    assert len(lane_runs(world, "shared")) == 1 and line(world, "heavy")["waiting"] == 3
    reconfigure(world, "shared:4:0:1:fair")
    keys += keys_of(world, send_tenant(world, "light", 2))
    world.tick("A")
    world.check()
    assert tenants_running(world, "shared").get("light") == 2
    world.settle()
    once_each(world, keys)


def test_the_default_lane_can_be_fair(make_world):
    world = make_world(max_concurrency=4, lanes="default:4:0:1:fair")
    keys = keys_of(
        world, send_tenant(world, "heavy", 6, lane="default") + send_tenant(world, "light", 2, lane="default")
    )
    world.tick("A")
    world.check()
    assert tenants_running(world, "default") == {"heavy": 2, "light": 2}
    assert world.queue_depth() == 0
    world.settle()
    once_each(world, keys)

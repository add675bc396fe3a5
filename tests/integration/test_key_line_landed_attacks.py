"""A reviewer's attacks on a69e307 (a woken copy that parks again or gives its slot back notes its
entry ``landed``; forged future-dated entries dropped), on moto with the real adapters.

Interleavings are forced by botocore ``before-parameter-build`` hooks on the waker's DynamoDB client
(the ``TransactWriteItems`` that moves ``woken``); forged tickets are message attributes a producer
sets. Each test asserts its hook fired and what AWS holds afterwards.
"""

from __future__ import annotations

from typing import Any

import pytest

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from tests.integration.test_key_line_landed_moto import at_the_wake
from tests.support.aws import build_stack


def _items(stack: Any, prefix: str) -> list[dict[str, Any]]:
    items = stack.client("dynamodb").scan(TableName=stack.settings.table_name)["Items"]
    return [i for i in items if i["pk"]["S"].startswith(prefix)]


def _run_once_to_success(stack: Any, payload: str) -> None:
    """Payload ``payload`` (run-once, no key) starts and SUCCEEDS: later run-once copies are done."""
    stack.send({"id": payload}, group=f"once-{payload}", sluice_once="true")
    stack.runtime().launcher().tick()
    (name,) = [n for n in stack.running() if n.startswith(f"{payload}-")]
    stack.runtime().launcher().on_status_change(StatusChange.from_event(stack.finish(name)))
    assert name not in stack.running()


# -- 1. a woken copy that will not claim (already done), handled before its wake notes it ----------


def test_a_woken_copy_already_done_before_its_wake_noted_it_does_not_stall_the_line(session):
    """Key a, cap 1. a0 runs; p (run-once) and a2 wait in a's line. p SUCCEEDS meanwhile by
    another message. a0 ends: its wake sends p; before the wake moves ``woken``, another launcher
    receives p: ALREADY_DONE, so it forgoes its entry (now: ``landed``). The entry the wake notes
    after keeps no slot: a2 starts within a few ticks, far within INFLIGHT_SECONDS."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=10, clock=clock, key_concurrency=1)
    stack.send({"id": "a0"}, group="g0", sluice_concurrency_key="a")
    stack.runtime().launcher().tick()
    (a0,) = stack.running()
    stack.send({"id": "p"}, group="g1", sluice_concurrency_key="a", sluice_once="true")
    stack.send({"id": "a2"}, group="g2", sluice_concurrency_key="a")
    stack.runtime().launcher().tick()
    assert stack.runtime().store().key_state("a").waiting == 2
    _run_once_to_success(stack, "p")

    clock.advance(1)
    completion = stack.runtime()
    # the tick receives p: already done, it forgoes its entry
    fired = at_the_wake(completion.client("dynamodb"), "a", lambda: stack.runtime().launcher().tick())
    completion.launcher().on_status_change(StatusChange.from_event(stack.finish(a0)))
    assert fired, "the wake never moved woken: the interleaving was not forced"
    state = stack.runtime().store().key_state("a")
    assert state.inflight <= state.landed and state.kept(clock.now()) == 0, state

    for _ in range(3):
        clock.advance(1)
        stack.runtime().launcher().tick()
    assert [n[:2] for n in stack.running()] == ["a2"], f"a2 not started: {stack.running()}"
    assert len([e for e in stack.executions() if e["name"].startswith("p-")]) == 1  # p ran once
    assert stack.queue_counts() == (0, 0) and stack.dlq_messages() == []


# -- 2. forged tickets on a key that has no item ---------------------------------------------------


def test_a_forged_ticket_of_a_key_without_an_item_creates_no_item(session):
    """A producer sends run-once copies of a payload that SUCCEEDED, naming key "ghost" (never
    used) and a forged ticket: each is ALREADY_DONE and forgoes its entry. No ``CKEY#ghost``
    appears, the tick does not fail, nothing is left in the queues."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=10, clock=clock, key_concurrency=1)
    _run_once_to_success(stack, "p")
    now_ms = int(clock.now() * 1000)
    for i, ticket in enumerate(["0@0", f"1@{now_ms}", f"2@{now_ms + 10**12}", "3@999999999999999999"]):
        stack.send(
            {"id": "p"},
            group=f"f{i}",
            sluice_once="true",
            sluice_concurrency_key="ghost",
            sluice_key_ticket=ticket,
        )
    stack.runtime().launcher().tick()
    assert _items(stack, "CKEY#ghost") == []
    assert stack.queue_counts() == (0, 0) and stack.dlq_messages() == []
    assert len(stack.executions()) == 1


# -- 3. forged tickets on an idle key: the landed set -----------------------------------------------


def test_forged_tickets_forgone_on_an_idle_key_do_not_pile_up_in_landed(session):
    """Key a ran once and is idle (an item, nobody waiting, not on the sweep's list). A producer
    sends run-once copies of a SUCCEEDED payload under key a with forged tickets ("i@now"): each is
    ALREADY_DONE and forgoes its entry. Only a wake of key a drops ``landed`` entries, and an idle
    key has none (no release, not swept): a forgo that noted each forged entry ``landed`` left one
    per forged message for good (30 of 30, the break this test found in a69e307). A forgo notes
    ``landed`` only for a ticket in the line not yet woken (then the key has waiters, and a wake)."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=10, clock=clock, key_concurrency=1)
    stack.send({"id": "a0"}, group="g0", sluice_concurrency_key="a")
    stack.runtime().launcher().tick()
    (a0,) = stack.running()
    stack.runtime().launcher().on_status_change(StatusChange.from_event(stack.finish(a0)))
    _run_once_to_success(stack, "p")
    assert stack.runtime().store().key_state("a").landed == frozenset()

    forged = 30
    for round_ in range(3):
        now_ms = int(clock.now() * 1000)
        for i in range(forged // 3):
            stack.send(
                {"id": "p"},
                group=f"f{round_}-{i}",
                sluice_once="true",
                sluice_concurrency_key="a",
                sluice_key_ticket=f"{round_ * 100 + i}@{now_ms}",
            )
        for _ in range(2):
            stack.runtime().launcher().tick()
        clock.advance(200)
    for _ in range(3):  # well past INFLIGHT_SECONDS since every forged entry
        clock.advance(200)
        stack.runtime().launcher().tick()
    assert stack.queue_counts() == (0, 0) and stack.dlq_messages() == []
    state = stack.runtime().store().key_state("a")
    assert len(state.landed) <= 1, (
        f"key a keeps {len(state.landed)} forged landed entries: {sorted(state.landed)[:3]}..."
    )


def test_forged_tickets_forgone_in_a_line_that_stands_still_are_kept_to_a_bound(session):
    """Key a is paused (cap 0) and w waits in its line, so ticket 0 stays in the line. A producer
    sends run-once copies of a SUCCEEDED payload under key a with forged tickets "0@<ms>": each is
    ALREADY_DONE and forgoes its entry, which is noted ``landed`` (its ticket is in the line). A
    ``landed`` note in the line is kept whatever its date (explorer seed 1206004492), so with no
    bound they piled up for as long as the line stood still: one per message, until the key's item
    passed DynamoDB's 400 KB and every tick failed on it. At most ``LANDED_KEPT`` stay."""
    from sluice.core.model import Outcome
    from sluice.core.records import LANDED_KEPT

    clock = FakeClock()
    stack = build_stack(session, max_concurrency=10, clock=clock, key_concurrency=1)
    _run_once_to_success(stack, "p")
    stack.runtime().store().set_key_cap("a", 0)
    stack.send({"id": "w"}, group="gw", sluice_concurrency_key="a")
    stack.runtime().launcher().tick()
    forged = LANDED_KEPT + 6
    for i in range(forged):
        stack.send(
            {"id": "p"},
            group=f"f{i}",
            sluice_once="true",
            sluice_concurrency_key="a",
            sluice_key_ticket=f"0@{i}",
        )
    forgone = 0
    while stack.queue_counts() != (0, 0):
        forgone += stack.runtime().launcher().tick().n(Outcome.ALREADY_DONE)
    assert forgone == forged, forgone
    clock.advance(3600)
    stack.runtime().launcher().tick()  # the sweep wakes key a: nothing to send, the notes judged
    state = stack.runtime().store().key_state("a")
    assert (state.woken, state.tickets) == (0, 1)  # the line stood still
    assert len(state.landed) == LANDED_KEPT, len(state.landed)
    stack.runtime().store().set_key_cap("a", None)
    clock.advance(60)
    stack.runtime().launcher().tick()  # w is sent back and claims
    stack.runtime().launcher().tick()
    assert [n.split("-")[0] for n in stack.running()] == ["w"]
    clock.advance(60)
    stack.runtime().launcher().tick()
    assert stack.runtime().store().key_state("a").landed == frozenset()  # behind the line now


def test_landed_notes_kept_without_a_bound_are_caught(session, monkeypatch):
    """The variant ``landed_kept_unbounded`` (tests/explorer/broken.py) fails the test above."""
    from tests.explorer.broken import VARIANTS

    for owner, attr, value in VARIANTS["landed_kept_unbounded"][1]:
        monkeypatch.setattr(owner, attr, value)
    with pytest.raises(AssertionError, match="assert 70 == 64"):
        test_forged_tickets_forgone_in_a_line_that_stands_still_are_kept_to_a_bound(session)


# -- 4. a forged future-dated ticket while the key is full -----------------------------------------


def test_a_forged_future_ticket_on_a_full_key_parks_keeps_no_slot_and_is_dropped(session):
    """Key a, cap 1, a0 runs. A producer sends f with a forged ticket dated ~31 years ahead: its
    claim is refused for the cap, so it parks again ``replacing`` the forged entry, which lands in
    ``landed``. The next wake drops it (dated past any clock); f starts once a0 ends, alone."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=10, clock=clock, key_concurrency=1)
    stack.send({"id": "a0"}, group="g0", sluice_concurrency_key="a")
    stack.runtime().launcher().tick()
    (a0,) = stack.running()
    forged = f"7@{int(clock.now() * 1000) + 10**12}"
    stack.send({"id": "f"}, group="gf", sluice_concurrency_key="a", sluice_key_ticket=forged)
    stack.runtime().launcher().tick()
    state = stack.runtime().store().key_state("a")
    assert stack.running() == [a0] and state.waiting == 1
    assert forged not in state.inflight and state.kept(clock.now()) == 0
    stack.runtime().launcher().on_status_change(StatusChange.from_event(stack.finish(a0)))
    for _ in range(3):
        clock.advance(1)
        stack.runtime().launcher().tick()
        assert len(stack.running()) <= 1
    assert [n[:1] for n in stack.running()] == ["f"]
    state = stack.runtime().store().key_state("a")
    assert forged not in state.inflight | state.landed, state
    assert stack.queue_counts() == (0, 0) and stack.dlq_messages() == []


# -- 5. a crash between a wake's send and its note -------------------------------------------------


def test_a_wake_dying_between_its_send_and_its_note_loses_nothing_and_keeps_the_cap(session):
    """Key a, cap 1: a0 runs, a1 and a2 wait. a0 ends; its wake sends a1, then dies before moving
    ``woken`` (a botocore hook raises). a1's copy claims on the ``landed`` path and runs; the sweep
    sends a1 again (still parked), a copy that does not claim and forgoes its entry. Never two of a
    at once; a1 runs once and a2 runs after it; nothing left in the queues."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=10, clock=clock, key_concurrency=1)
    for i in range(3):
        stack.send({"id": f"a{i}"}, group=f"g{i}", sluice_concurrency_key="a")
    stack.runtime().launcher().tick()
    (a0,) = stack.running()
    completion = stack.runtime()

    class Died(Exception):
        pass

    def die() -> None:
        raise Died("the wake died after its send")

    fired = at_the_wake(completion.client("dynamodb"), "a", die)
    event = stack.finish(a0)
    with pytest.raises(Died):
        completion.launcher().on_status_change(StatusChange.from_event(event))
    assert fired and stack.runtime().store().key_state("a").woken == 0

    seen: list[list[str]] = []
    for step in range(12):
        clock.advance(5)
        stack.runtime().launcher().tick()
        running = stack.running()
        seen.append(running)
        assert len(running) <= 1, f"key a ran {running} at once"
        if running and step % 3 == 2:
            stack.runtime().launcher().on_status_change(StatusChange.from_event(stack.finish(running[0])))
    names = sorted({e["name"][:2] for e in stack.executions()})
    assert names == ["a0", "a1", "a2"], (names, seen)
    assert len(stack.executions()) == 3  # a1 once, whatever its second copy did
    assert stack.queue_counts() == (0, 0) and stack.dlq_messages() == []
    state = stack.runtime().store().key_state("a")
    assert state.waiting == 0 and state.kept(clock.now()) == 0, state

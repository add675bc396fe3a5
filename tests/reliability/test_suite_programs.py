"""The programs the property suite found for its whole-run variants, replayed as explicit
(variant × program) items.

``test_broken_variants.py`` requires a property suite to break a promise with a variant patched in,
searching its derandomised budget from the first program on (a minute or more on moto each). Here
each variant meets the program that search reaches it with: the program holds on Sluice as it is,
and breaks the same promise with the variant in. The whole searches run in `make soak`
(``SOAK_VARIANTS`` in mk/soak.mk); a change to the machines' strategies does not change a program
written here, so a program that stops catching its variant fails here, never passes silently.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import sluice.launch.completion
import sluice.launch.per_message
import sluice.runtime
from tests.reliability.machine import (
    Deliver,
    End,
    EndWithEffects,
    Enqueue,
    EnqueueAwaiting,
    EnqueueKeyed,
    EnqueueOnce,
    Lose,
    Outside,
    Redeliver,
    SetKeyCap,
    SetLaneMax,
    SluiceMachine,
    Tick,
)
from tests.reliability.test_broken_variants import (
    AwaitsOnceEffectsMachine,
    CountingStore,
    claims_ignoring_the_keys_cap,
    effects_sent_from_every_event,
    successor_without_its_lease,
)
from tests.reliability.world import PromiseBroken, World


def replay(machine: type, program: Callable[[Any], None]) -> None:
    """Run ``program`` on a fresh ``machine`` as Hypothesis runs a step list: the promises checked
    after each step, and the machine's teardown (settle, then the promises at rest) at the end."""
    state = machine()
    try:
        program(state)
    finally:
        state.teardown()


def broken(machine: type, program: Callable[[Any], None]) -> PromiseBroken:
    with pytest.raises(PromiseBroken) as failure:
        replay(machine, program)
    print(failure.value)
    return failure.value


# -- the focused suite (AwaitsOnceEffectsMachine) --------------------------------------------------


def once_program(state: Any) -> None:
    """Found by test_a_claim_that_ignores_sluice_once_is_caught_by_the_suite at its 4th program
    (unshrunk, as the budget runs it): run-once messages of a/b and p1 arrive after their keys'
    run-once runs SUCCEEDED."""
    state.build(
        history=0,
        policy="suppress",
        fill=1,
        backlog=(
            ("p2", "g0", False, False),
            ("p1", "g1", False, False),
            ("a:b", "g2", False, True),
            ("a/b", "g1", True, False),
        ),
        max_concurrency=1,
        skew=-3600.0,
        lanes="a:1:0:2,b:2:0:1",
        key_concurrency=2,
    )
    state.promises_hold()
    state.act(action=Deliver(5, ("interleave", "after_release", "tick")))
    state.promises_hold()
    state.act(action=Tick(launcher="A", wait=181, fault=("crash_on_call", "before", 6), new_max=None))
    state.promises_hold()
    state.act(action=Tick(launcher="both", wait=181, fault=None, new_max=5))
    state.promises_hold()
    state.act(action=Deliver(5, None))
    state.promises_hold()
    state.act(action=EnqueueOnce(name="p2", group="g0"))
    state.promises_hold()
    state.act(action=End(execution=7, status="ABORTED", delivery="now"))
    state.promises_hold()
    state.act(
        action=Tick(
            launcher="B", wait=901, fault=("throttle_after", "key_wake", "DeleteMessageBatch"), new_max=3
        )
    )
    state.promises_hold()
    state.act(action=Deliver(6, ("throttle", "SendMessage", 1000000)))
    state.promises_hold()
    state.act(action=Tick(launcher="both", wait=901, fault=("throttle", "lane_limit", 2), new_max=None))
    state.promises_hold()
    state.act(action=Deliver(6, ("throttle", "BatchGetItem", 1)))
    state.promises_hold()
    state.act(action=Tick(launcher="A", wait=5, fault=("crash_on_call", "before", 1), new_max=None))
    state.promises_hold()
    state.act(action=End(execution=0, status="ABORTED", delivery="later"))
    state.promises_hold()
    state.act(action=Redeliver(6))
    state.promises_hold()
    state.act(action=Deliver(5, ("crash", "after_key_advance", 1)))
    state.promises_hold()
    state.act(action=Tick(launcher="both", wait=61, fault=("crash_on_call", "after", 1), new_max=None))
    state.promises_hold()
    state.act(action=Tick(launcher="both", wait=61, fault=("crash_on_call", "after", 2), new_max=None))
    state.promises_hold()
    state.act(action=EnqueueOnce(name="a/b", group="g2"))
    state.promises_hold()
    state.act(
        action=EnqueueAwaiting(
            name="w2", group="g2", awaits=("w0", "p0", "never-enqueued"), once=False, lane=None
        )
    )
    state.promises_hold()
    state.act(action=Enqueue((("a:b", "g0", True, False), ("a/b", "g2", False, False))))
    state.promises_hold()
    state.act(action=Enqueue((("p0", "g2", True, False),)))
    state.promises_hold()
    state.act(
        action=Tick(launcher="A", wait=0, fault=("throttle_after", "key_park", "SendMessage"), new_max=None)
    )
    state.promises_hold()
    state.act(action=EndWithEffects(execution=2, effects=(("fx1", True, ()),), delivery="later"))
    state.promises_hold()
    state.act(action=EnqueueOnce(name="p1", group="g1"))
    state.promises_hold()
    state.act(action=EnqueueOnce(name="hash", group="g1"))
    state.promises_hold()


def test_the_once_program_holds():
    replay(AwaitsOnceEffectsMachine, once_program)


def test_a_claim_that_ignores_sluice_once_is_caught_by_its_program(monkeypatch):
    monkeypatch.setattr(sluice.launch.per_message, "is_once", lambda message: False)
    assert "run once:" in str(broken(AwaitsOnceEffectsMachine, once_program))


def effects_program(state: Any) -> None:
    """Found by test_effects_sent_on_every_event_are_caught_by_the_suite at its 5th program: an end
    with effects whose status event is delivered again after its release."""
    state.build(
        history=0,
        backlog=(
            ("lone_surrogate", "g0", False, False),
            ("p2", "g2", False, False),
            ("lone_surrogate", "g1", False, False),
            ("hash", "g2", False, False),
            ("a:b", "g1", True, False),
            ("p2", "g0", False, False),
            ("a/b", "g1", False, True),
            ("p2", "g2", True, True),
        ),
        skew=45.0,
        max_concurrency=2,
        policy="defer",
        key_concurrency=1,
        lanes="",
        fill=1,
    )
    state.promises_hold()
    state.act(action=Tick(launcher="both", wait=901, fault=("crash", "after_already_done", 2), new_max=None))
    state.promises_hold()
    state.act(action=Lose(1))
    state.promises_hold()
    state.act(action=Tick(launcher="both", wait=0, fault=("crash", "after_lane_limit", 1), new_max=None))
    state.promises_hold()
    state.act(action=EnqueueAwaiting(name="w2", group="g0", awaits=("w1",), once=True, lane=0))
    state.promises_hold()
    state.act(action=Tick(launcher="both", wait=181, fault=("crash_on_call", "before", 8), new_max=None))
    state.promises_hold()
    state.act(action=Tick(launcher="B", wait=0, fault=("interleave", "after_list", "set_max"), new_max=None))
    state.promises_hold()
    state.act(action=EnqueueAwaiting(name="w0", group="g1", awaits=("w0", "p1", "p2"), once=False, lane=5))
    state.promises_hold()
    state.act(action=Tick(launcher="both", wait=901, fault=("throttle_call", "", 11), new_max=None))
    state.promises_hold()
    state.act(
        action=Tick(
            launcher="A", wait=181, fault=("throttle_after", "key_park", "TransactWriteItems"), new_max=None
        )
    )
    state.promises_hold()
    state.act(action=Tick(launcher="both", wait=181, fault=("throttle", "ReceiveMessage", 2), new_max=None))
    state.promises_hold()
    state.act(
        action=EndWithEffects(
            execution=3,
            effects=(("w0", False, ()), ("fx1", False, ()), ("fx1", True, ("w0", "never-enqueued"))),
            delivery="now",
        )
    )
    state.promises_hold()
    state.act(action=Redeliver(7))
    state.promises_hold()
    state.act(action=Deliver(3, None))
    state.promises_hold()
    state.act(action=Redeliver(3))
    state.promises_hold()
    state.act(action=Enqueue((("lone_surrogate", "g1", False, True), ("a:b", "g0", False, True))))
    state.promises_hold()
    state.act(
        action=Enqueue(
            (("hash", "g0", True, False), ("hash", "g0", True, False), ("p0", "g2", True, False)),
        )
    )
    state.promises_hold()
    state.act(action=End(execution=5, status="FAILED", delivery="now"))
    state.promises_hold()
    state.act(action=Enqueue((("array", "g2", False, False),)))
    state.promises_hold()
    state.act(action=End(execution=2, status="ABORTED", delivery="twice"))
    state.promises_hold()
    state.act(action=Tick(launcher="B", wait=181, fault=("throttle_call", "", 5), new_max=0))
    state.promises_hold()
    state.act(action=Tick(launcher="A", wait=181, fault=("stale", "empty", 0), new_max=3))
    state.promises_hold()
    state.act(action=Redeliver(3))
    state.promises_hold()


def test_the_effects_program_holds():
    replay(AwaitsOnceEffectsMachine, effects_program)


def test_effects_sent_on_every_event_are_caught_by_their_program(monkeypatch):
    monkeypatch.setattr(sluice.launch.completion, "around", effects_sent_from_every_event)
    assert "effects once:" in str(broken(AwaitsOnceEffectsMachine, effects_program))


# -- the property suite's usual mix (SluiceMachine) ------------------------------------------------


def counter_program(state: Any) -> None:
    """Found by test_the_promises_alone_catch_the_counter at its 8th program (ends whose events are
    lost, delivered twice and late, with redriven executions, on a stack with lanes), and by
    test_a_counter_decremented_per_event_is_caught at the same program's 8th action; shrunk to the
    three actions that break the variant: a retried start throttled every time, keyed messages, and
    an end with effects whose event is delivered twice."""
    state.build(
        policy="defer",
        fill=4,
        lanes="fast:1:1,default:2",
        skew=0.0,
        max_concurrency=3,
        key_concurrency=2,
        history=0,
        backlog=(("p2", "g0", False, False), ("long_id", "g2", False, True), ("hash", "g1", False, True)),
    )
    state.promises_hold()
    state.act(
        action=Tick(launcher="both", wait=0, fault=("attempts", "throttled_every_time", 0), new_max=None)
    )
    state.promises_hold()
    state.act(action=EnqueueKeyed((("k2", "g0", "t0"), ("p2", "g1", "t1")), lane=3))
    state.promises_hold()
    state.act(
        action=EndWithEffects(
            execution=4,
            effects=(("fx0", False, ("never-enqueued",)), ("fx0", False, ("p0", "never-enqueued"))),
            delivery="twice",
        )
    )
    state.promises_hold()


def test_the_counter_program_holds():
    replay(SluiceMachine, counter_program)


def test_a_counter_decremented_per_event_is_caught_by_its_program(monkeypatch):
    """A slot freed for every status event: the ledger against the leases breaks."""
    monkeypatch.setattr(sluice.runtime, "DynamoStore", CountingStore)
    failure = broken(SluiceMachine, counter_program)
    assert "slot without lease or lease without slot" in str(failure), failure


def test_the_promises_alone_catch_the_counter_with_its_program(monkeypatch):
    """A slot freed for every status event, the ledger-against-leases check off: promise 1 (MAX) or
    4 (nothing leaks) breaks."""
    monkeypatch.setattr(sluice.runtime, "DynamoStore", CountingStore)
    monkeypatch.setattr(World, "check_ledger", False)
    failure = broken(SluiceMachine, counter_program)
    assert "promise 1" in str(failure) or "promise 4" in str(failure), failure


def keys_program(state: Any) -> None:
    """Found by test_a_keyed_claim_that_ignores_the_keys_cap_is_caught_by_the_property_suite at its
    1st program (unshrunk, as the budget runs it): keyed messages of ``t0`` and ``t1``, then ``t0``'s
    cap set to 0 while one of its messages still waits."""
    state.build(
        skew=45.0,
        fill=1,
        policy="suppress",
        lanes="",
        backlog=(
            ("p2", "g1", False, True),
            ("a/b", "g0", False, True),
            ("hash", "g2", False, False),
            ("a/b", "g0", False, False),
            ("long_id", "g1", True, True),
        ),
        max_concurrency=5,
        key_concurrency=2,
        history=0,
    )
    state.promises_hold()
    state.act(action=End(execution=6, status="FAILED", delivery="lost"))
    state.promises_hold()
    state.act(action=End(execution=3, status="FAILED", delivery="twice"))
    state.promises_hold()
    state.act(action=SetLaneMax(lane=0, value=2, paused=False, interrupted=True))
    state.promises_hold()
    state.act(action=Tick(launcher="both", wait=0, fault=None, new_max=None))
    state.promises_hold()
    state.act(
        action=Tick(launcher="both", wait=0, fault=("throttle_after", "key_park", "GetItem"), new_max=2)
    )
    state.promises_hold()
    state.act(
        action=EnqueueKeyed(
            messages=(("p2", "g1", "t0"), ("k1", "g1", "t1"), ("p2", "g2", "t0"), ("new", "g0", "t1")), lane=2
        )
    )
    state.promises_hold()
    state.act(action=EnqueueAwaiting(name="w0", group="g2", awaits=("never-enqueued",), once=True, lane=1))
    state.promises_hold()
    state.act(action=Outside(kind="start", execution=2, delivery="lost"))
    state.promises_hold()
    state.act(
        action=EndWithEffects(
            execution=3,
            effects=(("fx0", False, ()), ("fx1", False, ("fx0",)), ("w0", False, ())),
            delivery="now",
        )
    )
    state.promises_hold()
    state.act(action=Enqueue((("p0", "g2", False, True), ("p2", "g0", False, True)), None))
    state.promises_hold()
    state.act(action=End(execution=5, status="FAILED", delivery="now"))
    state.promises_hold()
    state.act(action=Tick(launcher="A", wait=61, fault=("crash", "after_delete", 2), new_max=None))
    state.promises_hold()
    state.act(action=EnqueueAwaiting(name="w1", group="g2", awaits=("p0", "p1", "p2"), once=True, lane=1))
    state.promises_hold()
    state.act(action=SetKeyCap(ckey="lane:<fair>", cap=1))
    state.promises_hold()
    state.act(action=Outside(kind="redrive", execution=7, delivery="later"))
    state.promises_hold()
    state.act(action=End(execution=5, status="ABORTED", delivery="now"))
    state.promises_hold()
    state.act(action=Redeliver(0))
    state.promises_hold()
    state.act(action=Redeliver(7))
    state.promises_hold()
    state.act(
        action=EnqueueKeyed(
            messages=(("new", "g1", "t1"), ("p2", "g2", "t1"), ("new", "g1", "t1"), ("k1", "g2", "t0")),
            lane=None,
        )
    )
    state.promises_hold()
    state.act(
        action=Tick(launcher="A", wait=0, fault=("throttle_after", "key_park", "SendMessage"), new_max=None)
    )
    state.promises_hold()
    state.act(action=SetKeyCap(ckey="t0", cap=0))
    state.promises_hold()
    state.act(action=Enqueue((("a:b", "g1", True, True),), 2))
    state.promises_hold()
    state.act(action=End(execution=6, status="ABORTED", delivery="now"))
    state.promises_hold()


def test_the_keys_program_holds():
    replay(SluiceMachine, keys_program)


def test_a_keyed_claim_that_ignores_the_keys_cap_is_caught_by_its_program(monkeypatch):
    claims_ignoring_the_keys_cap(monkeypatch)
    assert "key cap:" in str(broken(SluiceMachine, keys_program))


def handover_program(state: Any) -> None:
    """Found by test_a_hand_over_whose_claim_keeps_no_lease_is_caught at its 1st program (the keys
    program above and one more end, broken at rest); shrunk to the six of its actions that break the
    variant at the last of them: two ticks, one under a lowered MAX, a payload of the pool sent
    again, and ends whose release hands the freed slot over."""
    state.build(
        skew=45.0,
        fill=1,
        policy="suppress",
        lanes="",
        backlog=(
            ("p2", "g1", False, True),
            ("a/b", "g0", False, True),
            ("hash", "g2", False, False),
            ("a/b", "g0", False, False),
            ("long_id", "g1", True, True),
        ),
        max_concurrency=5,
        key_concurrency=2,
        history=0,
    )
    state.promises_hold()
    state.act(action=Tick(launcher="both", wait=0, fault=None, new_max=None))
    state.promises_hold()
    state.act(
        action=Tick(launcher="both", wait=0, fault=("throttle_after", "key_park", "GetItem"), new_max=2)
    )
    state.promises_hold()
    state.act(action=Enqueue((("p0", "g2", False, True), ("p2", "g0", False, True)), None))
    state.promises_hold()
    state.act(action=End(execution=5, status="FAILED", delivery="now"))
    state.promises_hold()
    state.act(action=Tick(launcher="A", wait=61, fault=("crash", "after_delete", 2), new_max=None))
    state.promises_hold()
    state.act(action=End(execution=5, status="ABORTED", delivery="now"))
    state.promises_hold()


def test_the_handover_program_holds():
    replay(SluiceMachine, handover_program)


def test_a_hand_over_whose_claim_keeps_no_lease_is_caught_by_its_program(monkeypatch):
    """The successor holds a slot without its payload's lease: the ledger against the leases breaks."""
    successor_without_its_lease(monkeypatch)
    failure = broken(SluiceMachine, handover_program)
    assert "slot without lease or lease without slot" in str(failure), failure

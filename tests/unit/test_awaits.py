"""Awaits on in-memory adapters and a fake clock: parking, wake-up, failures, horizon, reconciliation."""

import json

import pytest

from sluice.core.errors import InvalidPayload
from sluice.core.model import Ending, Outcome, PayloadRecord, PayloadState
from sluice.core.validation import validate_message
from sluice.enqueue import find_cycle
from sluice.features.awaits import (
    AWAITS_ATTRIBUTE,
    ON_FAILURE_ATTRIBUTE,
    ReadAhead,
    gate,
    judge,
    parse_awaits,
    read_ahead,
    sweep,
)
from tests.unit.test_launcher import World

HORIZON = 7 * 86_400


def send(w: World, key: str, *awaits: str, run_anyway: bool = False) -> str:
    attributes = {AWAITS_ATTRIBUTE: json.dumps(list(awaits))} if awaits else {}
    if run_anyway:
        attributes[ON_FAILURE_ATTRIBUTE] = "run"
    return w.queue.send(json.dumps({"id": key}), key, attributes)


def running_key(w: World, key: str) -> str:
    (name,) = [n for n in w.sfn.running if w.store.execution(n).key == key]
    return name


def started_keys(w: World) -> set[str]:
    names = set(w.sfn.running) | set(w.sfn.ended)
    return {w.store.execution(n).key for n in names}


def test_a_waiter_is_parked_its_message_deleted_and_it_starts_on_the_last_receipt():
    w = World(max_concurrency=5)
    send(w, "a")
    send(w, "b")
    send(w, "c", "a", "b")
    s = w.launcher.tick()
    assert s.n(Outcome.STARTED) == 2 and s.n(Outcome.WAITING) == 1
    assert len(w.queue) == 0  # parked in the table, not in the queue
    assert started_keys(w) == {"a", "b"}
    assert w.store.waiters_on("a") == w.store.waiters_on("b") and len(w.store.waiting()) == 1

    w.finish(running_key(w, "a"))
    assert len(w.queue) == 0  # b has not SUCCEEDED yet
    w.finish(running_key(w, "b"))
    assert len(w.queue) == 1  # the last receipt released it into admission
    assert w.store.waiting() == frozenset()
    s = w.launcher.tick()
    assert s.n(Outcome.STARTED) == 1 and "c" in started_keys(w)


def test_a_payload_satisfied_at_arrival_starts_at_once_without_parking():
    w = World()
    send(w, "a")
    w.launcher.tick()
    w.finish(running_key(w, "a"))
    send(w, "c", "a")
    s = w.launcher.tick()
    assert s.n(Outcome.STARTED) == 1 and s.n(Outcome.WAITING) == 0
    assert w.store.waiting() == frozenset()


def test_an_awaited_key_that_fails_dead_letters_the_waiter_with_the_reason():
    w = World()
    send(w, "a")
    send(w, "c", "a")
    w.launcher.tick()
    w.finish(running_key(w, "a"), "FAILED")
    assert [reason for _, reason in w.queue.dead] == ["awaited a ended FAILED"]
    assert len(w.queue) == 0 and "c" not in started_keys(w)
    assert w.store.payload("c").state is PayloadState.INVALID
    assert w.store.payload("c").reason == "awaited a ended FAILED"


def test_a_failed_key_at_arrival_dead_letters_at_once():
    w = World()
    send(w, "a")
    w.launcher.tick()
    w.finish(running_key(w, "a"), "TIMED_OUT")
    send(w, "c", "a")
    s = w.launcher.tick()
    assert s.n(Outcome.INVALID) == 1 and w.queue.dead[-1][1] == "awaited a ended TIMED_OUT"


def test_run_anyway_releases_the_waiter_once_every_awaited_key_has_ended():
    w = World()
    send(w, "a")
    send(w, "b")
    send(w, "c", "a", "b", run_anyway=True)
    w.launcher.tick()
    w.finish(running_key(w, "a"), "ABORTED")
    assert len(w.queue) == 0  # b still runs
    w.finish(running_key(w, "b"))
    assert w.queue.dead == [] and len(w.queue) == 1
    w.launcher.tick()
    assert "c" in started_keys(w)


def test_a_key_that_failed_then_runs_again_is_waited_for():
    w = World()
    send(w, "a")
    w.launcher.tick()
    w.finish(running_key(w, "a"), "FAILED")
    send(w, "a")
    w.launcher.tick()  # a runs again: its lease is live
    send(w, "c", "a")
    s = w.launcher.tick()
    assert s.n(Outcome.WAITING) == 1
    w.finish(running_key(w, "a"))
    w.launcher.tick()
    assert "c" in started_keys(w)


def test_reconciliation_wakes_a_waiter_whose_wake_up_was_lost():
    w = World()
    send(w, "a")
    send(w, "c", "a")
    w.launcher.tick()
    # The completion dies between the receipt and the wake-up: release alone.
    name = running_key(w, "a")
    info = w.sfn.finish(name, "SUCCEEDED")
    w.store.release(name, Ending(PayloadState.SUCCEEDED, w.clock.now(), ended_at=info.stop_date))
    assert len(w.queue) == 0 and len(w.store.waiting()) == 1
    w.clock.advance(60)
    w.launcher.tick()  # reconciliation's sweep sends it; admission starts it in the same tick
    assert "c" in started_keys(w)
    assert w.store.waiting() == frozenset()


def test_a_waiter_woken_twice_runs_once():
    w = World()
    send(w, "a")
    send(w, "c", "a")
    w.launcher.tick()
    (waiter,) = w.store.waiters(w.store.waiting())
    w.finish(running_key(w, "a"))
    # A second send of the same waiter (the mark lost, reconciliation sending it again later).
    w.queue.requeue(_parked_copy(waiter))
    w.launcher.tick()
    w.clock.advance(10)
    w.launcher.tick()
    runs = [n for n in set(w.sfn.running) | set(w.sfn.ended) if w.store.execution(n).key == "c"]
    assert len(runs) == 1
    w.finish(runs[0])
    w.queue.requeue(_parked_copy(waiter))  # a copy after the run ended: settled as already run
    s = w.launcher.tick()
    assert s.n(Outcome.ALREADY_RAN) == 1
    assert len([n for n in set(w.sfn.running) | set(w.sfn.ended) if w.store.execution(n).key == "c"]) == 1


def _parked_copy(waiter):
    from sluice.features.awaits import _parked

    return _parked(waiter)


def test_the_horizon_dead_letters_a_waiter_on_a_key_never_seen():
    w = World()
    send(w, "c", "never")
    w.launcher.tick()
    w.clock.advance(HORIZON - 1)
    w.launcher.tick()
    assert w.queue.dead == []
    w.clock.advance(1)
    w.launcher.tick()
    assert [r for _, r in w.queue.dead] == [f"awaited never not seen within the await horizon ({HORIZON} s)"]
    assert w.store.waiting() == frozenset()


def test_the_horizon_waits_for_a_key_that_is_running():
    w = World()
    send(w, "a")
    send(w, "c", "a")
    w.launcher.tick()
    w.clock.advance(HORIZON + 1)
    w.launcher.tick()
    assert w.queue.dead == [] and len(w.store.waiting()) == 1


def test_the_horizon_comes_from_the_settings():
    w = World(await_horizon_seconds=100)
    send(w, "c", "never")
    w.launcher.tick()
    w.clock.advance(100)
    w.launcher.tick()
    assert len(w.queue.dead) == 1


def test_a_redelivered_waiter_parks_once():
    w = World()
    send(w, "a")
    send(w, "c", "a")
    w.launcher.tick()
    (waiter,) = w.store.waiters(w.store.waiting())
    # The same message again (the delete lost): parked again, no second waiter.
    w.queue.send(
        waiter.body, waiter.group_id, {**waiter.attributes, "sluice-origin-message-id": waiter.message_id}
    )
    w.launcher.tick()
    assert len(w.store.waiting()) == 1
    w.finish(running_key(w, "a"))
    assert len(w.queue) == 1


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("not json", "is not JSON"),
        ('{"a": 1}', "JSON array"),
        ('["a", 3]', "non-empty string"),
        ('[""]', "non-empty string"),
        (json.dumps([f"k{i}" for i in range(99)]), "at most 98"),
        ('["c"]', "awaits itself"),
    ],
)
def test_a_bad_awaits_attribute_is_dead_lettered_with_its_reason(raw, reason):
    w = World()
    w.queue.send(json.dumps({"id": "c"}), "c", {AWAITS_ATTRIBUTE: raw})
    s = w.launcher.tick()
    assert s.n(Outcome.INVALID) == 1 and reason in w.queue.dead[0][1]


def test_a_bad_on_failure_attribute_is_dead_lettered():
    w = World()
    w.queue.send(json.dumps({"id": "c"}), "c", {AWAITS_ATTRIBUTE: '["a"]', ON_FAILURE_ATTRIBUTE: "maybe"})
    assert w.launcher.tick().n(Outcome.INVALID) == 1


def test_judge_reads_succeeded_by_not_the_latest_state():
    ran = PayloadRecord(key="a", state=PayloadState.FAILED, succeeded_by="a-1", receipt="a-2")
    assert judge(["a"], {"a": ran}, run_anyway=False).kind == "ready"
    held = PayloadRecord(key="a", state=PayloadState.CLAIMED, holder="a-3")
    assert judge(["a"], {"a": held}, run_anyway=False).kind == "wait"


def test_parse_awaits_keeps_order_without_repeats():
    assert parse_awaits('["b", "a", "b"]') == ("b", "a")
    with pytest.raises(InvalidPayload):
        parse_awaits("[]x")


def test_find_cycle():
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}, "a") == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["b"], "b": ["c"]}, "a") is None


def test_sweep_with_nothing_parked_reads_one_item():
    w = World()
    assert sweep(store=w.store, queue=w.queue, now=0.0, horizon=HORIZON) == {}


def test_a_batchs_read_ahead_that_says_failed_is_checked_again_before_a_dead_letter():
    """The gate takes a whole receive's read of the awaited keys, made a moment earlier. A key that
    had FAILED then may be running again by the time its waiter is judged: it waits instead of
    being dead-lettered on that earlier read."""
    w = World()
    send(w, "a")
    w.launcher.tick()
    w.finish(running_key(w, "a"), "FAILED")
    before = ReadAhead(frozenset({"a"}), w.store.payloads(["a"]))
    send(w, "a")
    w.launcher.tick()  # a runs again
    send(w, "c", "a")
    (message,) = w.queue.receive(1, 0)
    payload = validate_message(message)
    assert gate(store=w.store, queue=w.queue, payload=payload, now=w.clock.now(), ahead=before)
    assert w.queue.dead == [] and w.store.waiters_on("a") == {message.message_id}


def test_read_ahead_reads_nothing_for_one_waiter_and_skips_a_malformed_attribute():
    w = World()
    send(w, "c", "a")
    send(w, "d")
    w.queue.send(json.dumps({"id": "e"}), "e", {AWAITS_ATTRIBUTE: "not json"})
    messages = w.queue.receive(10, 0)
    assert read_ahead(w.store, messages) == ReadAhead()  # one waiter reads its own, at the same cost
    send(w, "f", "a", "b")
    messages += w.queue.receive(10, 0)
    assert read_ahead(w.store, messages).keys == {"a", "b"}

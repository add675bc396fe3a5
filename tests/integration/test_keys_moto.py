"""Concurrency keys on moto, through the launcher, the completion and reconciliation: a key's
runs never pass its cap, the rest wait out of the queue and start oldest-first as its slots free,
and other keys are never held up."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import Outcome
from sluice.core.names import execution_name
from sluice.features.keys import CONCURRENCY_KEY_ATTRIBUTE
from tests.support.aws import build_stack
from tests.support.faults import AttemptFaults, Fault, Injector, throttled
from tests.support.hooks import Crash, count_calls, crash_after, error_answer


def keyed_stack(session):
    return build_stack(session, clock=FakeClock(), max_concurrency=10, key_concurrency=2)


@pytest.fixture
def stack(session):
    return keyed_stack(session)


def send(stack, n: int, key: str = "tenant-a", group: str = "g") -> str:
    return stack.send({"id": f"{key}-{n}"}, group=group, **{CONCURRENCY_KEY_ATTRIBUTE.replace("-", "_"): key})


def running_of(stack, key: str) -> list[str]:
    return [name for name in stack.running() if key in name]


def test_a_key_runs_at_most_its_cap_the_rest_wait_out_of_the_queue_and_others_go_on(stack):
    ids = [send(stack, n) for n in range(5)]
    other = send(stack, 0, key="tenant-b")
    plain = stack.send({"id": "no-key"})
    launcher = stack.launcher()
    summary = launcher.tick()
    assert (summary.n(Outcome.STARTED), summary.n(Outcome.KEY_WAITING)) == (4, 3)
    assert len(running_of(stack, "tenant-a")) == 2
    assert execution_name("tenant-b-0", other) in stack.running()
    assert execution_name("no-key", plain) in stack.running()
    assert stack.queue_counts() == (0, 0)  # the three waiters hold nothing on the queue
    state = stack.runtime().store().key_state("tenant-a")
    assert (len(state.holders), state.waiting) == (2, 3)

    calls = count_calls(launcher.queue.client)
    launcher.tick()
    assert calls["ReceiveMessage"] == 1  # one empty receive: the waiters spend none
    assert set(running_of(stack, "tenant-a")) == {execution_name(f"tenant-a-{n}", ids[n]) for n in range(2)}


def test_a_freed_slot_goes_to_the_oldest_waiter_within_the_completion(stack):
    ids = [send(stack, n) for n in range(5)]
    launcher = stack.launcher()
    launcher.tick()
    first = execution_name("tenant-a-0", ids[0])
    # Arrives while three wait, just before a slot frees: the woken waiter is sent back behind it
    # in their group, so the refill meets the newcomer first, with room. It must queue behind them.
    newcomer = send(stack, 9)
    released, _, _ = launcher.on_status_change(StatusChange.from_event(stack.finish(first, "SUCCEEDED")))
    assert released
    assert execution_name("tenant-a-2", ids[2]) in stack.running()  # woken and refilled at once
    assert len(running_of(stack, "tenant-a")) == 2

    order = []
    for _ in range(4):
        (ended, *_) = sorted(running_of(stack, "tenant-a"), key=stack.running().index)
        launcher.on_status_change(StatusChange.from_event(stack.finish(ended, "SUCCEEDED")))
        launcher.tick()
        order.append(ended)
    started = [e["name"] for e in sorted(stack.executions(), key=lambda e: e["startDate"])]
    expected = [execution_name(f"tenant-a-{n}", i) for n, i in [*enumerate(ids), (9, newcomer)]]
    assert started == expected  # oldest first, the newcomer last
    assert stack.queue_counts() == (0, 0)


def test_a_wake_up_lost_to_a_crash_is_found_by_reconciliation(stack):
    ids = [send(stack, n) for n in range(3)]
    stack.launcher().tick()
    first = execution_name("tenant-a-0", ids[0])
    completion = stack.runtime()
    fired = crash_after(
        completion.client("dynamodb"), "TransactWriteItems"
    )  # the release commits, then it dies
    with pytest.raises(Crash):
        completion.launcher().on_status_change(StatusChange.from_event(stack.finish(first, "SUCCEEDED")))
    assert fired["calls"] == 1
    store = stack.runtime().store()
    assert store.key_state("tenant-a").waiting == 1 and store.keys_waiting() == {"tenant-a"}
    assert stack.queue_counts() == (0, 0)

    stack.launcher().tick()  # the scheduled tick: reconciliation sweeps the key, then the fill
    assert execution_name("tenant-a-2", ids[2]) in stack.running()
    assert store.key_state("tenant-a").inflight == frozenset()  # its claim landed
    stack.launcher().tick()
    assert store.keys_waiting() == frozenset()  # the next sweep finds the line empty


def test_a_bad_concurrency_key_is_dead_lettered_with_its_reason(stack):
    stack.send({"id": "bad"}, sluice_concurrency_key="x" * 2_000)
    summary = stack.launcher().tick()
    assert summary.n(Outcome.INVALID) == 1 and stack.running() == []
    (dead,) = stack.dlq_messages()
    reason = dead["MessageAttributes"]["sluice-error"]["StringValue"]
    assert (
        reason
        == "message attribute 'sluice-concurrency-key' is 2,000 bytes in UTF-8; keys are at most 1,024 bytes"
    )


def throttle_the_read_after_a_park(client) -> Counter:
    """Throttle the first GetItem after a park commits: the parker's own wake-up reads the key."""
    seen: Counter = Counter()

    def parked(http_response, params=None, **_):
        items = (params or {}).get("TransactItems", [])
        if http_response.status_code < 300 and any(
            i.get("Put", {}).get("Item", {}).get("pk", {}).get("S", "").startswith("KWAIT#") for i in items
        ):
            seen["parks"] += 1

    def hook(**_):
        if seen["parks"] and not seen["throttled"]:
            seen["throttled"] += 1
            return error_answer("ThrottlingException", 400)
        return None

    def keep(params, context, **_):
        context["params"] = params

    client.meta.events.register("before-parameter-build.dynamodb.TransactWriteItems", keep)
    client.meta.events.register(
        "after-call.dynamodb.TransactWriteItems",
        lambda http_response, context, **kw: parked(http_response, context.get("params")),
    )
    client.meta.events.register("before-call.dynamodb.GetItem", hook)
    return seen


def test_a_parked_message_whose_wake_up_is_throttled_is_deleted_all_the_same(stack):
    """Parked, then its own wake-up throttled: the park committed, so the message is done. Returned
    to the queue instead, it would be received and parked again (a second place in the line) and
    spend receives while it waits."""
    ids = [send(stack, n, group=f"g{n}") for n in range(3)]
    launcher = stack.launcher()
    seen = throttle_the_read_after_a_park(launcher.store.client)
    summary = launcher.tick()
    assert seen["throttled"] == 1
    assert summary.n(Outcome.KEY_WAITING) == 1
    assert stack.queue_counts() == (0, 0)  # deleted, not handed back to the queue
    store = stack.runtime().store()
    assert (store.key_state("tenant-a").tickets, store.key_state("tenant-a").waiting) == (1, 1)

    calls = count_calls(launcher.queue.client)
    launcher.tick()
    assert calls["ReceiveMessage"] == 1 and store.key_state("tenant-a").tickets == 1  # no receive spent
    first = execution_name("tenant-a-0", ids[0])
    launcher.on_status_change(StatusChange.from_event(stack.finish(first, "SUCCEEDED")))
    assert execution_name("tenant-a-2", ids[2]) in stack.running()  # woken by the release, as ever


def test_a_park_whose_answer_is_lost_is_deleted_and_parked_once(stack):
    """The park's transaction commits and its answer is lost (a read timeout: a TransientError). The
    message is parked all the same, so it is done: deleted, never handed back to the queue, where it
    would be received while it waits and parked a second time. It starts when its key has room."""
    ids = [send(stack, n) for n in range(3)]
    launcher = stack.launcher()
    lost = AttemptFaults("key_park", ("lost",))
    Injector("launcher", faults=[lost]).attach(launcher.store.client)
    summary = launcher.tick()
    assert lost.fired == {"lost": 1}  # the park landed, its answer did not
    assert stack.queue_counts() == (0, 0)  # deleted, not handed back to the queue
    assert summary.n(Outcome.STARTED) == 2 and summary.n(Outcome.KEY_WAITING) == 1
    store = stack.runtime().store()
    assert (store.key_state("tenant-a").tickets, store.key_state("tenant-a").waiting) == (1, 1)

    calls = count_calls(launcher.queue.client)
    launcher.tick()
    assert calls["ReceiveMessage"] == 1 and store.key_state("tenant-a").tickets == 1  # parked once
    first = execution_name("tenant-a-0", ids[0])
    launcher.on_status_change(StatusChange.from_event(stack.finish(first, "SUCCEEDED")))
    assert execution_name("tenant-a-2", ids[2]) in stack.running()  # the line moved: it starts


@dataclass
class ThrottledPlace(Fault):
    """Refuse the first read of a parker's place in a key's line (the line's item for its ticket,
    ``KWAIT#<key>#<ticket>``, read alone)."""

    fired: int = 0

    def before(self, injector: Any, call: Any) -> Any:
        keys = [k for t in call.params.get("RequestItems", {}).values() for k in t.get("Keys", [])]
        alone = len(keys) == 1 and keys[0]["pk"]["S"].startswith("KWAIT#")
        if self.fired or call.operation != "BatchGetItem" or not alone:
            return None
        self.fired += 1
        return throttled(call.service)


def test_a_park_whose_answer_is_lost_and_whose_place_cannot_be_read_returns_and_runs_once(stack):
    """The park lands, its answer is lost, and the read of its place is refused too: whether it
    parked cannot be known, so the message returns to the queue, as after a crash between the park
    and the delete. Received again, it parks a second time; woken twice, it runs once."""
    ids = [send(stack, n) for n in range(3)]
    launcher = stack.launcher()
    lost, refused = AttemptFaults("key_park", ("lost",)), ThrottledPlace()
    injector = Injector("launcher", faults=[lost, refused])
    injector.attach(launcher.store.client)
    assert launcher.tick().n(Outcome.INTERRUPTED) == 1
    assert lost.fired == {"lost": 1} and refused.fired == 1
    assert stack.queue_counts() == (1, 0)  # back in the queue: it may not have parked
    injector.faults.clear()
    assert launcher.tick().n(Outcome.KEY_WAITING) == 1 and stack.queue_counts() == (0, 0)
    store = stack.runtime().store()
    assert (store.key_state("tenant-a").tickets, store.key_state("tenant-a").waiting) == (2, 2)
    for n in range(2):
        name = execution_name(f"tenant-a-{n}", ids[n])
        launcher.on_status_change(StatusChange.from_event(stack.finish(name, "SUCCEEDED")))
        launcher.tick()
    third = execution_name("tenant-a-2", ids[2])
    assert [e["name"] for e in stack.executions()].count(third) == 1 and third in stack.running()
    state = store.key_state("tenant-a")
    assert (state.waiting, state.inflight, stack.queue_counts()) == (0, frozenset(), (0, 0))

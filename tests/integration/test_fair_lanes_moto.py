"""Fair lanes on moto with the real adapters: a fair lane's tenants (concurrency keys) share its
slots round-robin, on the tick and on the completion path, whatever order their messages came in;
nothing of a fair lane waits in its queue, and the limits stay exact."""

from __future__ import annotations

from collections import Counter

import pytest

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import Outcome
from sluice.features.keys import CONCURRENCY_KEY_ATTRIBUTE
from tests.support.aws import build_stack
from tests.support.hooks import count_calls

LANES = "shared:8:0:1:fair,default:4"
KEY = CONCURRENCY_KEY_ATTRIBUTE.replace("-", "_")


@pytest.fixture
def stack(session):
    return build_stack(session, clock=FakeClock(), max_concurrency=10, lanes=LANES)


def enqueue(stack, tenant: str | None, n: int, lane: str = "shared", first: int = 0) -> None:
    for i in range(first, first + n):
        extra = {KEY: tenant} if tenant is not None else {}
        stack.send({"id": f"{tenant}-{i}"}, group=f"{tenant}-{i}", lane=lane, **extra)


def tenant_of(stack, name: str) -> str | None:
    return stack.runtime().store().execution(name).ckey


def running_by_tenant(stack) -> Counter[str]:
    return Counter(tenant_of(stack, name) or "-" for name in stack.running())


def end(stack, launcher, name: str):
    return launcher.on_status_change(StatusChange.from_event(stack.finish(name, "SUCCEEDED")))


def test_a_burst_of_several_tenants_is_shared_out_not_taken_by_the_first(stack):
    enqueue(stack, "heavy", 3)
    for light in ("a", "b", "c"):
        enqueue(stack, light, 2)
    enqueue(stack, "heavy", 27, first=3)
    summary = stack.launcher().tick()
    # 8 slots, 4 tenants in sight: 2 each, not 8 for the tenant whose messages came first.
    assert running_by_tenant(stack) == {"heavy": 2, "a": 2, "b": 2, "c": 2}
    assert summary.lanes["shared"]["started"] == 8
    # Nothing of the fair lane waits in its queue: every new message is in its tenant's line.
    assert stack.queue_counts(stack.settings.lane_queue_url("shared")) == (0, 0)
    store = stack.runtime().store()
    assert store.key_state("heavy").waiting == 28 and store.key_state("a").waiting == 0


def test_a_heavy_tenant_queued_first_does_not_keep_the_light_ones_behind_its_backlog(stack):
    enqueue(stack, "heavy", 30)
    enqueue(stack, "light", 3)
    launcher = stack.launcher()
    launcher.tick()
    # Alone in sight with nobody waiting, heavy takes the lane at once (work-conserving); the rest
    # of its backlog and light's payloads line up.
    assert running_by_tenant(stack) == {"heavy": 8}
    assert stack.queue_counts(stack.settings.lane_queue_url("shared")) == (0, 0)
    # Each slot heavy frees goes to light, the tenant with fewer runs, until light has none waiting.
    for _ in range(4):
        heavy_run = next(n for n in sorted(stack.running()) if tenant_of(stack, n) == "heavy")
        end(stack, launcher, heavy_run)
    assert running_by_tenant(stack) == {"heavy": 5, "light": 3}


def test_freed_slots_go_to_the_tenant_with_the_fewest_runs(stack):
    for i in range(4):  # a burst of both tenants: shared out
        enqueue(stack, "heavy", 1, first=i)
        enqueue(stack, "light", 1, first=i)
    enqueue(stack, "heavy", 16, first=4)
    launcher = stack.launcher()
    launcher.tick()
    assert running_by_tenant(stack) == {"heavy": 4, "light": 4}
    # A light run ends while heavy has 16 waiting: light still has fewer runs, it gets the slot.
    light_run = next(n for n in stack.running() if tenant_of(stack, n) == "light")
    enqueue(stack, "light", 1, first=4)
    _, refill, _ = end(stack, launcher, light_run)
    assert refill.lanes["shared"]["started"] == 1
    assert running_by_tenant(stack) == {"heavy": 4, "light": 4}
    # Light's line is empty now: the slots it frees go to heavy, the lane stays full.
    for name in [n for n in stack.running() if tenant_of(stack, n) == "light"]:
        end(stack, launcher, name)
    assert running_by_tenant(stack) == {"heavy": 8}


def test_a_tenant_alone_gets_the_whole_lane_and_the_limits_hold(stack):
    enqueue(stack, "solo", 12)
    enqueue(stack, None, 2, lane="default")
    launcher = stack.launcher()
    launcher.tick()
    launcher.tick()
    assert running_by_tenant(stack)["solo"] == 8, "no default key cap: the lane's MAX holds it"
    rooms = stack.runtime().store().lane_rooms(["shared", "default"])
    assert rooms["shared"].running == 8 and stack.runtime().store().ledger().running <= 10
    assert len(stack.running()) == 10


def test_messages_without_a_key_are_one_tenant_of_their_lane(stack):
    enqueue(stack, None, 5)
    enqueue(stack, "k", 5)
    stack.launcher().tick()
    assert running_by_tenant(stack) == {"lane:shared": 4, "k": 4}


def test_a_tenants_own_cap_still_holds(stack):
    stack.runtime().store().set_key_cap("heavy", 1)
    enqueue(stack, "heavy", 10)
    enqueue(stack, "light", 2)
    stack.launcher().tick()
    assert running_by_tenant(stack) == {"heavy": 1, "light": 2}


def test_every_payload_starts_once_and_nothing_is_dead_lettered(stack):
    enqueue(stack, "heavy", 12)
    enqueue(stack, "light", 3)
    launcher = stack.launcher()
    launcher.tick()
    while stack.running():
        for name in list(stack.running()):
            end(stack, launcher, name)
    inputs = sorted(i["id"] for i in stack.inputs())
    assert inputs == sorted([f"heavy-{i}" for i in range(12)] + [f"light-{i}" for i in range(3)])
    assert stack.dlq_messages() == []
    store = stack.runtime().store()
    assert store.keys_waiting() == frozenset(), "every line emptied and tidied"
    assert store.key_state("heavy").fair is None, "no longer the lane's tenant"


def test_a_bad_tenant_key_is_dead_lettered_with_its_reason(stack):
    stack.send({"id": "bad"}, group="g", lane="shared", **{KEY: "bad\x01key"})
    summary = stack.launcher().tick()
    assert summary.n(Outcome.INVALID) == 1
    assert stack.queue_counts(stack.settings.lane_queue_url("shared")) == (0, 0)


def test_with_nobody_waiting_a_new_message_starts_at_once_without_lining_up(stack):
    enqueue(stack, "solo", 3)
    rt = stack.runtime()
    calls = count_calls(rt.client("sqs"), rt.client("dynamodb"))
    summary = rt.launcher().tick()
    assert summary.lanes["shared"]["started"] == 3
    assert summary.n(Outcome.KEY_WAITING) == 0
    assert calls["SendMessage"] == 0, "nothing parked, so nothing woken"
    store = rt.store()
    assert store.keys_waiting() == frozenset() and store.key_state("solo").holders != frozenset()


def test_a_newcomer_lines_up_once_anyone_waits(stack):
    enqueue(stack, "heavy", 9)  # one more than the lane: the ninth lines up
    launcher = stack.launcher()
    launcher.tick()
    assert running_by_tenant(stack) == {"heavy": 8}
    enqueue(stack, "light", 1)
    launcher.tick()  # the lane is full: no share, no receive; light waits in the queue
    assert stack.queue_counts(stack.settings.lane_queue_url("shared")) == (1, 0)
    heavy_run = next(iter(stack.running()))
    end(stack, launcher, heavy_run)
    assert running_by_tenant(stack) == {"heavy": 7, "light": 1}, (
        "the freed slot went to the tenant with fewer runs"
    )

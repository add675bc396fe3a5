"""Parallel fill on moto with the real adapters: a tick keeps several claims and starts in flight
(``SLUICE_START_CONCURRENCY``), message groups side by side and each group in its order, and stays
exact under MAX when two such launchers race."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from sluice.core.clock import FakeClock
from sluice.core.model import Outcome
from tests.support.aws import build_stack
from tests.support.hooks import count_calls
from tests.support.moto_patches import atomic_fast_moto


@pytest.fixture
def atomic():
    # Each AWS request is atomic, as in AWS; the launcher's threads interleave between requests.
    with atomic_fast_moto():
        yield


def payload_id(params: dict[str, Any]) -> str:
    """The id of the payload a StartExecution request (as botocore's before-call sees it) starts."""
    return json.loads(json.loads(params["body"])["input"])["id"]


class InFlight:
    """The most StartExecution calls a client had in flight at once, and the payload ids in call order."""

    def __init__(self, client: Any) -> None:
        self.now = 0
        self.most = 0
        self.order: list[str] = []
        self._lock = threading.Lock()
        client.meta.events.register("before-call.sfn.StartExecution", self.before)
        client.meta.events.register("after-call.sfn.StartExecution", self.after)

    def before(self, params: dict[str, Any], **_: Any) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.order.append(payload_id(params))

    def after(self, **_: Any) -> None:
        with self._lock:
            self.now -= 1

    @contextmanager
    def held(self) -> Iterator[None]:
        """A call a hook holds back before it is sent (and before ``before`` sees it) is in flight
        for its caller meanwhile."""
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            yield
        finally:
            with self._lock:
                self.now -= 1


def test_a_tick_fills_its_slots_with_starts_in_flight_at_once(session, atomic):
    stack = build_stack(session, clock=FakeClock(), max_concurrency=25, start_concurrency=10)
    for i in range(40):
        stack.send({"id": f"p{i}"}, group=f"g{i}")
    rt = stack.runtime()
    sfn = rt.client("stepfunctions")
    flight = InFlight(sfn)
    first, second = threading.Lock(), threading.Event()

    def hold_the_first(**_: Any) -> None:
        # The first start waits (counted in flight) until a second begins: a fill that starts one
        # at a time never sends a second while the first is held, whatever the machine's load.
        if first.acquire(blocking=False):
            with flight.held():
                second.wait(10)
        else:
            second.set()

    sfn.meta.events.register_first("before-call.sfn.StartExecution", hold_the_first)
    summary = rt.launcher().tick()
    assert summary.n(Outcome.STARTED) == 25
    assert flight.most > 1, "the starts ran side by side"
    assert len(stack.running()) == 25 and len(rt.store().ledger().holders) == 25
    assert stack.queue_counts() == (15, 0)  # the rest stay queued, none in flight


def test_the_messages_of_one_group_start_in_their_order(session, atomic):
    stack = build_stack(session, clock=FakeClock(), max_concurrency=20, start_concurrency=10)
    for i in range(5):
        stack.send({"id": f"ordered{i}"}, group="one")
        stack.send({"id": f"other{i}"}, group=f"g{i}")
    rt = stack.runtime()
    sfn = rt.client("stepfunctions")
    flight = InFlight(sfn)
    others, first_held = threading.Semaphore(0), threading.Event()

    def hold_the_first(params: dict[str, Any], **_: Any) -> None:
        # The group's first start waits until the other groups' five have begun: a fill that ran
        # the group's messages side by side would start ordered1..4 meanwhile.
        if payload_id(params) == "ordered0":
            with flight.held():
                first_held.set()
                for _ in range(5):
                    assert others.acquire(timeout=10), "the other groups did not start beside this one"

    def other_began(params: dict[str, Any], **_: Any) -> None:
        # Counted in flight by now; it lets the first go on only once the first is held, so that
        # both are in flight at once whatever the machine's load.
        if payload_id(params).startswith("other"):
            first_held.wait(10)
            others.release()

    # Before InFlight's hook, so that a fill running the group side by side records ordered1..4
    # first; the held start counts as in flight meanwhile (``InFlight.held``).
    sfn.meta.events.register_first("before-call.sfn.StartExecution", hold_the_first)
    sfn.meta.events.register("before-call.sfn.StartExecution", other_began)
    assert rt.launcher().tick().n(Outcome.STARTED) == 10
    assert [key for key in flight.order if key.startswith("ordered")] == [f"ordered{i}" for i in range(5)]
    assert flight.most > 1


def test_room_for_more_than_one_receive_receives_side_by_side(session, atomic):
    stack = build_stack(session, clock=FakeClock(), max_concurrency=40, start_concurrency=30)
    for i in range(60):
        stack.send({"id": f"p{i}"}, group=f"g{i}")
    rt = stack.runtime()
    calls = count_calls(rt.client("sqs"))
    summary = rt.launcher().tick()
    assert summary.n(Outcome.STARTED) == 40 and len(stack.running()) == 40
    # 30 at a time: one receive of 10 and two more beside each other, then 10 more in one receive.
    assert calls["ReceiveMessage"] == 4 and calls["DeleteMessageBatch"] == 4
    assert stack.queue_counts() == (20, 0)


def test_two_parallel_launchers_racing_never_pass_max(session, atomic):
    stack = build_stack(session, clock=FakeClock(), max_concurrency=15, start_concurrency=8)
    for i in range(60):
        stack.send({"id": f"p{i}"}, group=f"g{i}")
    launchers = [stack.runtime().launcher(), stack.runtime().launcher()]
    barrier = threading.Barrier(2)
    started: Counter[str] = Counter()
    errors: list[BaseException] = []

    def race(launcher: Any) -> None:
        try:
            barrier.wait(10)
            summary = launcher.tick()
            started[threading.current_thread().name] = summary.n(Outcome.STARTED)
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=race, args=(launcher,)) for launcher in launchers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    running = stack.running()
    assert len(running) == 15 and sum(started.values()) == 15
    assert len(stack.runtime().store().ledger().holders) == 15
    assert len({body["id"] for body in stack.inputs()}) == 15  # no payload twice


def test_a_tick_paces_its_starts_to_the_token_bucket(session):
    stack = build_stack(session, clock=FakeClock(), max_concurrency=12, start_rate=10, start_burst=4)
    for i in range(12):
        stack.send({"id": f"p{i}"}, group=f"g{i}")
    assert stack.launcher().tick().n(Outcome.STARTED) == 12
    # A burst of 4, then 8 more at 10 a second: each waited a tenth of a second for its token.
    assert stack.naps == pytest.approx([0.1] * 8)

"""A fair lane's admission paced like an ordinary lane's: a lingering tick polls an idle fair lane
about once a second, not as fast as its calls return; and a backlog queued ahead of the waiters it
wakes does not keep the tick from starting them. In memory (no AWS): the queue counts its receives."""

from __future__ import annotations

import json

import pytest

from sluice.adapters.memory.aws import MemoryExecutions, MemoryQueue
from sluice.adapters.memory.store import MemoryStore
from sluice.core.clock import FakeClock
from sluice.core.limits import MaxReading
from sluice.features.lanes import parse_lanes
from sluice.launch.launcher import Launcher
from sluice.launch.settings import Settings


class Max:
    def __init__(self, value: int) -> None:
        self.value = value

    def reading(self) -> MaxReading:
        return MaxReading(self.value, 1.0)


class LongPollQueue(MemoryQueue):
    """As SQS: a receive takes 10 ms; an empty one with ``wait_seconds`` waits that long."""

    def receive(self, max_messages: int, wait_seconds: int):
        got = super().receive(max_messages, wait_seconds)
        self.clock.advance(wait_seconds if not got and wait_seconds else 0.01)
        return got


def launcher(
    lanes: str, *, maximum: int = 4, linger: int = 0
) -> tuple[Launcher, LongPollQueue, MemoryExecutions]:
    clock = FakeClock()
    queue = LongPollQueue(clock=clock, visibility_timeout=180)
    executions = MemoryExecutions(clock=clock)
    settings = Settings(receive_wait_seconds=1, linger_seconds=linger, lanes=parse_lanes(lanes, maximum))
    run = Launcher(
        queue=queue,
        executions=executions,
        store=MemoryStore(key_concurrency=1),
        max_source=Max(maximum),
        clock=clock,
        settings=settings,
        sleep=clock.advance,
        lane_queues={"default": queue},
    )
    return run, queue, executions


@pytest.mark.parametrize("lanes", ["default:4", "default:4:0:1:fair"])
def test_a_lingering_tick_on_an_idle_lane_polls_about_once_a_second(lanes):
    run, queue, _ = launcher(lanes, linger=55)
    run.tick()
    # One long poll a second (about 56); a fair lane without the wait made about 5,500.
    assert queue.calls["ReceiveMessage"] <= 2 * 55


def test_a_fair_lane_starts_its_share_behind_a_backlog_of_600_in_one_tick():
    run, queue, executions = launcher("default:4:0:1:fair")
    for i in range(600):
        queue.send(
            json.dumps({"id": f"p{i}"}), group_id=f"p{i}", attributes={"sluice-concurrency-key": "heavy"}
        )
    summary = run.tick()
    assert summary.lanes["default"]["started"] == 4
    assert len(executions.running) == 4, "the woken waiters were left behind the unparked backlog"

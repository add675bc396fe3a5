"""How many claims and starts a tick's round keeps in flight (``startConcurrency``, sluice.primitives.fanout):
``auto`` follows the room to fill under the MAX in force at that tick; a whole number is that many."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from sluice.adapters.memory.aws import MemoryExecutions, MemoryQueue
from sluice.adapters.memory.store import MemoryStore
from sluice.core.clock import FakeClock
from sluice.core.limits import MaxReading
from sluice.core.model import Ending, Message, PayloadState
from sluice.core.records import Done
from sluice.launch.completion import complete
from sluice.launch.launcher import Launcher
from sluice.launch.settings import Settings
from sluice.primitives.fanout import AUTO_WIDEST, Serial, pool_size


class Max:
    """MAX as the parameter gives it: each change a newer reading."""

    def __init__(self, value: int) -> None:
        self.value, self.changed_at = value, 1.0

    def set(self, value: int) -> None:
        self.value, self.changed_at = value, self.changed_at + 1

    def reading(self) -> MaxReading:
        return MaxReading(self.value, self.changed_at)


class Rounds(MemoryQueue):
    """The queue, noting the messages each round deletes: the round's claims and starts, all handled."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.rounds: list[int] = []

    def delete(self, messages: Sequence[Message]) -> None:
        self.rounds.append(len(messages))
        super().delete(messages)


class Pool:
    """``sluice.primitives.fanout.Threads`` of ``workers`` threads, run one call after another: notes how many
    of each batch of message groups the threads would have in flight at once."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.at_once: list[int] = []

    def each(self, calls: Sequence[Callable[[], Any]]) -> list[Done[Any]]:
        self.at_once.append(min(len(calls), self.workers))
        return Serial().each(calls)


class World:
    def __init__(self, max_concurrency: int, start_concurrency: int | None) -> None:
        self.clock = FakeClock()
        self.queue = Rounds(clock=self.clock, visibility_timeout=180)
        self.sfn = MemoryExecutions(clock=self.clock)
        self.store = MemoryStore()
        self.max = Max(max_concurrency)
        settings = Settings(receive_wait_seconds=0, start_concurrency=start_concurrency)
        self.pool = Pool(pool_size(start_concurrency))
        self.launcher = Launcher(
            queue=self.queue,
            executions=self.sfn,
            store=self.store,
            max_source=self.max,
            clock=self.clock,
            settings=settings,
            fan=self.pool,
        )
        for i in range(200):  # each payload its own group: a round's groups all run side by side
            self.queue.send(json.dumps({"id": f"p{i}"}), group_id=f"g{i}")

    def tick(self) -> list[int]:
        """The starts each round of one tick kept in flight at once."""
        self.queue.rounds.clear()
        self.launcher.tick(reconcile_first=False)
        return [min(n, self.pool.workers) for n in self.queue.rounds]

    def finish_all(self) -> None:
        for name in list(self.sfn.running):
            info = self.sfn.finish(name)
            complete(
                store=self.store,
                queue=self.queue,
                name=name,
                ending=Ending(PayloadState.SUCCEEDED, self.clock.now(), ended_at=info.stop_date),
            )


def test_auto_follows_the_max_in_force_at_each_tick():
    w = World(max_concurrency=12, start_concurrency=None)
    assert w.tick() == [12]  # the whole room in one round
    w.finish_all()
    w.max.set(AUTO_WIDEST + 15)
    assert w.tick() == [AUTO_WIDEST, 15]  # no wider than AWS's quotas reward
    w.finish_all()
    w.max.set(3)
    assert w.tick() == [3]
    assert len(w.sfn.running) == 3


def test_auto_fills_only_the_room_left_beside_running_executions():
    w = World(max_concurrency=12, start_concurrency=None)
    assert w.tick() == [12]
    w.max.set(20)  # 12 still running: 8 to fill
    assert w.tick() == [8]
    assert len(w.sfn.running) == 20


def test_a_whole_number_keeps_exactly_that_many_whatever_the_max():
    w = World(max_concurrency=12, start_concurrency=4)
    assert w.tick() == [4, 2]  # a receive of 10 on 4 threads, then the 2 left
    w.finish_all()
    w.max.set(45)
    assert max(w.tick()) == 4
    assert len(w.sfn.running) == 45
    assert max(w.pool.at_once) == 4

"""What every part of a launch works with: the adapters, the settings and the clock, in one frozen
value shared by the launcher's collaborators (``sluice.launch.admission``, ``sluice.launch.lane_admission``,
``sluice.launch.per_message``, ``sluice.launch.message_branches``). A lane's admission holds the same value with
its own queue, executions and ``lane`` (``LaunchContext.for_lane``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from sluice.core.gates import OPEN, Gate
from sluice.core.ports import Clock, Executions, Fanout, MaxSource, Queue, lane_executions
from sluice.core.records import Lane
from sluice.features.effects import Effects
from sluice.features.pointers import PayloadObjects
from sluice.features.receipts import Outputs
from sluice.features.stores import LaunchStore
from sluice.launch.settings import Settings
from sluice.primitives.fanout import Pacer


@dataclass(frozen=True)
class LaunchContext:
    """The launcher's adapters and configuration; ``lane`` is set on the context of one lane's
    admission, whose claims take a slot of that lane too."""

    queue: Queue
    executions: Executions
    store: LaunchStore
    max_source: MaxSource
    clock: Clock
    settings: Settings
    log: logging.Logger | logging.LoggerAdapter
    fan: Fanout
    sleep: Callable[[float], None]
    pacer: Pacer
    payloads: PayloadObjects | None  # the bucket of stored payloads that pointers name
    outputs: Outputs  # receipts' outputs
    effects: Effects  # what outputs send, to any of the stack's lanes
    rng: random.Random
    lane_queues: Mapping[str, Queue] = field(default_factory=dict)  # each lane's queue
    lane: Lane | None = None
    gate: Gate = OPEN  # a limit beside MAX, asked before each receive and keyed claim (sluice.core.gates)

    def for_lane(self, lane: Lane) -> LaunchContext:
        """This context receiving from ``lane``'s queue (the default lane's is ``queue``), starting
        on its own state machine, if any."""
        return replace(
            self,
            queue=self.lane_queues.get(lane.name, self.queue),
            executions=lane_executions(self.executions, lane.name),
            lane=lane,
        )


class StateMachineCheck:
    """When the state machine was last checked: one holder shared by the launcher's admissions (its
    own and each lane's), so a completion checks it once per interval, not once per lane."""

    INTERVAL = 300.0  # how often a warm launcher re-checks that the state machine exists

    def __init__(self) -> None:
        self.at: float | None = None

    def check(self, executions: Executions, now: float) -> None:
        if self.at is None or now - self.at >= self.INTERVAL:
            executions.check()
            self.at = now

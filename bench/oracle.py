"""The oracles: what a launcher that knew everything at once would do, under the same AWS quotas.

- ``oracle-event`` (O-event): starts the oldest waiting payload the instant it learns of a free slot:
  at the payload's arrival when a slot is free (the first fill at arrival, no tick to wait for), and
  at the execution's status event (``EVENT_DELAY`` after its end) when none is. No call takes time
  and no Lambda runs. The bound for any launcher driven by status events.
- ``oracle-0`` (O-0): the same with no delay at all: a slot is refilled the instant it frees.
- ``oracle-fair`` (O-fair): O-event for a fair lane's tenants (each payload's concurrency key): a
  free slot goes to the oldest waiting payload of the tenant with the fewest runs (ties: the tenant
  whose waiting head arrived first), the rule a fair lane shares its slots by.

Both start on the same jobs as every system and under the same quotas: each start takes a token of
StartExecution's bucket (1,300 at once, 300 a second), waiting for it when the bucket is empty (an
oracle paces itself, so it is never refused). Their receives and deletes would stay far under SQS's
300 calls a second per action: with batches of 10, 3,000 messages a second, ten times the start
rate, so the SQS quota never binds them. They cost nothing: their calls are not counted.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from bench.aws import Meter, SimExecutions
from bench.model import Context, System
from bench.quotas import START_BURST, START_RATE, TokenBucket
from sluice.core.model import ExecutionInfo
from sluice.features.keys import CONCURRENCY_KEY_ATTRIBUTE


class ArrivalQueue:
    """The oracle's queue: a payload is known the instant it is sent, and nothing is dead-lettered."""

    dead = 0

    def __init__(self, on_arrival: Any) -> None:
        self.on_arrival = on_arrival
        self.requeued: dict[str, float] = {}
        self._sent = 0

    def send(self, body: str, group_id: str = "", attributes: dict[str, str] | None = None) -> str:
        self._sent += 1
        self.on_arrival(body, attributes or {})
        return f"oracle-{self._sent}"


class OracleEvent(System):
    name = "oracle-event"
    status_events = True

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        # Its own meter, with no simulation behind it: no call takes time or is counted.
        self.sfn = SimExecutions(Meter(ctx.sim.clock), ctx.sim.clock, lag=0, on_start=ctx.on_start)
        self.queue = ArrivalQueue(self._arrived)  # type: ignore[assignment]
        self.functions = []
        self.waiting: deque[str] = deque()
        self.free = ctx.max
        self.bucket = TokenBucket(START_RATE, START_BURST)
        self._names = 0

    def _arrived(self, body: str, attributes: dict[str, str]) -> None:
        self.waiting.append(body)
        self._fill()

    def first_tick(self, t0: float) -> float:
        return t0  # it needs no schedule: its fill is timed from the arrival

    def on_tick(self) -> None:
        pass

    def on_status_event(self, info: ExecutionInfo) -> None:
        self.free += 1
        self._fill()

    def _fill(self) -> None:
        """Every free slot to the oldest waiting payloads, each start at its StartExecution token."""
        while self.free and self.waiting:
            self.free -= 1
            at = self.bucket.next_token(self.sim.now)
            self.sim.at(at, self._start, self.waiting.popleft())

    def _start(self, body: str) -> None:
        self._names += 1
        self.sfn.start(f"oracle-{self._names:07d}", body)


class OracleZero(OracleEvent):
    name = "oracle-0"
    event_delay = 0.0


class OracleFair(OracleEvent):
    name = "oracle-fair"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.lines: dict[str, deque[tuple[int, str]]] = {}  # tenant -> (arrival number, body), oldest first
        self.runs: dict[str, int] = {}  # tenant -> its runs (started, status event not yet arrived)
        self.tenant_of: dict[str, str] = {}  # execution name -> its tenant
        self._arrivals = 0

    def _arrived(self, body: str, attributes: dict[str, str]) -> None:
        self._arrivals += 1
        tenant = attributes.get(CONCURRENCY_KEY_ATTRIBUTE, "")
        self.lines.setdefault(tenant, deque()).append((self._arrivals, body))
        self._fill()

    def on_status_event(self, info: ExecutionInfo) -> None:
        self.runs[self.tenant_of[info.name]] -= 1
        super().on_status_event(info)

    def _fill(self) -> None:
        while self.free and any(self.lines.values()):
            tenant = min(
                (t for t, line in self.lines.items() if line),
                key=lambda t: (self.runs.get(t, 0), self.lines[t][0][0]),
            )
            self.free -= 1
            self.runs[tenant] = self.runs.get(tenant, 0) + 1
            _, body = self.lines[tenant].popleft()
            self._names += 1
            name = f"oracle-{self._names:07d}"
            self.tenant_of[name] = tenant
            self.sim.at(self.bucket.next_token(self.sim.now), self.sfn.start, name, body)

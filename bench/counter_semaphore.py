"""Baseline 2: a DynamoDB counter semaphore (increment before start, decrement on status events).

Source: NASA Cumulus, "Throttling queued executions" (docs/data-cookbooks/throttling-queued-executions.md)
and its code: ``sqs2sfThrottle`` (packages/api/lambdas/sf-starter.js), the ``Consumer``
(packages/ingest/consumer.js), ``Semaphore`` (packages/common/Semaphore.js) and ``sfSemaphoreDown``
(packages/api/lambdas/sf-semaphore-down.js). As documented: "before starting new executions, the
sqs2sfThrottle Lambda attempts to increment the semaphore ... If the increment operation is successful
... an execution is started. If the increment operation fails ... no execution is started." The
consumer runs on a rate(1 minute) rule with ``messageLimit`` 500 and ``timeLimit`` 60 (the documented
example); a Step Functions status-change rule runs ``sfSemaphoreDown`` for every terminal event.

Modelled from that code:

- ``Consumer.consume``: while the message budget lasts and ``timeLimit`` has not passed, receive
  ``min(10, budget)`` messages (WaitTimeSeconds 0, VisibilityTimeout 30: the defaults of
  ``receiveSQSMessages`` when the consumer passes none) and take 10 off the budget whether or not
  messages came; the messages of one receive are processed concurrently (``Promise.all``).
- per message (``incrementAndDispatch``): ``Semaphore.up`` = a conditional PutItem that creates the
  counter item (it fails, and is charged, every time after the first) then UpdateItem
  ``semvalue = semvalue + 1`` under ``semvalue <= MAX - 1``; on success StartExecution with a uuid name
  and DeleteMessage; if the increment fails the message is left to reappear after its visibility
  timeout (no DLQ in the documented queue); if the start fails the counter is decremented.
- ``sfSemaphoreDown`` per terminal status event: ``Semaphore.down`` = PutItem + UpdateItem
  ``semvalue - 1`` under ``semvalue >= 1``. Nothing is started on completion.
- ``messageLimit`` is raised to MAX when MAX is larger, so the pattern is not capped by the example
  configuration at MAX 1,000.
"""

from __future__ import annotations

import contextlib
from typing import Any

from bench.aws import ConditionFailed, CounterTable, SimExecutions, SimQueue
from bench.model import BASELINE_ARCHITECTURE, BASELINE_MEMORY_MB, COLD_START, LIST_LAG, Context, System
from bench.sim import LambdaFunction, Parallel
from sluice.core.errors import TransientError
from sluice.core.model import ExecutionInfo, Message

MESSAGE_LIMIT = 500
TIME_LIMIT = 60.0
VISIBILITY = 30
LINE_BYTES = 250  # one Cumulus JSON log line
ERROR_BYTES = 900  # log.error(ResourcesLockedError) with its stack


class ResourcesLocked(Exception):
    """The counter is at MAX (Cumulus's ResourcesLockedError)."""


class CounterSemaphoreSystem(System):
    name = "counter-semaphore"
    status_events = True
    fifo = False  # the documented queue is a standard queue

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.queue = SimQueue(ctx.meter, ctx.sim.clock, visibility_timeout=VISIBILITY, max_receive_count=None)
        self.sfn = SimExecutions(ctx.meter, ctx.sim.clock, lag=LIST_LAG, on_start=ctx.on_start)
        self.table = CounterTable(ctx.meter)
        self.key = "backgroundJobQueue"
        self.message_limit = max(MESSAGE_LIMIT, ctx.max)
        size, arch = BASELINE_MEMORY_MB, BASELINE_ARCHITECTURE
        self.consumer = LambdaFunction(ctx.sim, "sqs2sfThrottle", size, 120, COLD_START, lambda: None, arch)
        self.down = LambdaFunction(ctx.sim, "sfSemaphoreDown", size, 30, COLD_START, lambda: None, arch)
        self.functions = [self.consumer, self.down]

    # Semaphore.add: create the item if missing, then a conditional update
    def _add(self, delta: int) -> None:
        with contextlib.suppress(ConditionFailed):  # the item exists: expected after the first call
            self.table.put_if_absent(self.key)
        if delta > 0:
            self.table.add(self.key, delta, at_most=self.max - delta)
        else:
            self.table.add(self.key, delta, at_least=-delta)

    def _up(self) -> None:
        try:
            self._add(1)
        except ConditionFailed:
            raise ResourcesLocked from None

    # sf-starter.js incrementAndDispatch
    def _increment_and_dispatch(self, message: Message) -> None:
        self._up()
        try:
            self.sfn.start(self.uuid_name(), message.body)
        except TransientError:
            self._add(-1)
            raise

    # consumer.js processMessage
    def _process(self, message: Message) -> int:
        try:
            self._increment_and_dispatch(message)
            self.queue.delete_one(message)
            return 1
        except (ResourcesLocked, TransientError):
            self.meter.log_bytes += ERROR_BYTES
            return 0

    # consumer.js consume
    def on_tick(self) -> None:
        self.consumer.invoke(self._consume)

    def _consume(self, _state: Any, _remaining_ms: Any) -> None:
        sim = self.sim
        began = sim.now
        budget = self.message_limit
        self.meter.log_bytes += LINE_BYTES  # "Attempting to process up to N messages..."
        while budget > 0:
            n = min(10, budget)
            messages = self.queue.receive(n, 0)
            if messages:
                self.meter.log_bytes += LINE_BYTES  # "processing N messages"
                together = Parallel(sim)
                for message in messages:
                    together.branch(lambda m=message: self._process(m))
                together.join()
            budget -= n
            if sim.now - began > TIME_LIMIT:
                break
        self.meter.log_bytes += LINE_BYTES  # "N messages successfully processed"

    # sf-semaphore-down.js
    def on_status_event(self, info: ExecutionInfo) -> None:
        def handler(_state: Any, _remaining_ms: Any) -> None:
            try:
                self._add(-1)
            except ConditionFailed:
                self.meter.log_bytes += ERROR_BYTES  # "decrement below 0"

        self.down.invoke(handler)

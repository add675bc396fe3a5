"""Baseline 1: the published SQS poller pattern.

Source: Yan Cui, "Step Functions: how to implement semaphores for state machines", July 2018
(theburningmonk.com; republished on freeCodeCamp and HackerNoon), section "Control the number of
concurrent executions":

    "A CloudWatch schedule will trigger a Lambda function to
     1. check how many concurrent executions there are
     2. if there are N executions, then we can start MAX-N executions
     3. poll SQS for MAX-N messages, and start a new execution for each"

and "you should use a FIFO queue so that tasks are processed in the same order they're added". The
post gives no code, so the details are the plain reading of those steps:

- the schedule is rate(1 minute); nothing runs when an execution ends (no refill on completion);
- RUNNING executions are counted with ListExecutions (statusFilter RUNNING, pages of 1,000), which is
  eventually consistent: it shows the state machine as it was ``LIST_LAG`` seconds ago, so fresh starts
  are missing and fresh ends still count;
- messages are received 10 at a time until MAX-N were taken or the queue is empty, each one started
  with a random (uuid4) execution name and then deleted with DeleteMessage;
- no lease, no ledger, no DLQ (the post names none).
"""

from __future__ import annotations

from typing import Any

from bench.aws import SimExecutions, SimQueue
from bench.model import BASELINE_ARCHITECTURE, BASELINE_MEMORY_MB, COLD_START, LIST_LAG, Context, System
from bench.sim import LambdaFunction
from sluice.core.model import ExecutionInfo

POLLER_LOG_BYTES = 200  # one line per invocation (generous: the post shows no logging)


class PollerSystem(System):
    name = "poller"
    status_events = False

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.queue = SimQueue(ctx.meter, ctx.sim.clock, visibility_timeout=30, max_receive_count=None)
        self.sfn = SimExecutions(ctx.meter, ctx.sim.clock, lag=LIST_LAG, on_start=ctx.on_start)
        self.fn = LambdaFunction(
            ctx.sim, "poller", BASELINE_MEMORY_MB, 300, COLD_START, lambda: None, BASELINE_ARCHITECTURE
        )
        self.functions = [self.fn]

    def on_tick(self) -> None:
        self.fn.invoke(self._handler)

    def _handler(self, _state: Any, _remaining_ms: Any) -> None:
        running = len(self.sfn.list_running())  # 1. how many executions run
        free = self.max - running  # 2. MAX - N may start
        while free > 0:  # 3. poll SQS for MAX - N messages, start one execution each
            messages = self.queue.receive(min(10, free), 0)
            if not messages:
                break
            for message in messages:
                self.sfn.start(self.uuid_name(), message.body)
                self.queue.delete_one(message)
            free -= len(messages)
        self.meter.log_bytes += POLLER_LOG_BYTES

    def on_status_event(self, info: ExecutionInfo) -> None:  # not subscribed
        return None

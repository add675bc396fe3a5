"""The semaphore step (issue 12): executions through a critical section limited to ``LIMIT``, three ways.

Each execution: arrives, does its pre-work, asks for the section (the *acquire phase*), runs the section,
leaves it (releases) and does its post-work. Same seed, same executions for every system:

    arrival ─ pre-work ─▶ acquire phase ─▶ section (duration d) ─▶ release ─ post-work ─▶ end

Systems:

- ``sluice-semaphore``: the REAL ``sluice.semaphore.step.Semaphores`` behind the REAL ``SemaphoreService``
  (as ``handlers/semaphore.py`` runs it) on ``MemorySemaphoreStore`` and ``MemoryTokens``, each call
  counted as ``DynamoSemaphoreStore`` / ``DynamoSlots`` / ``SfnTokens`` would make it and given a latency.
  Acquire is a ``.waitForTaskToken`` task (one state transition on entry; the wait costs nothing); the
  grant's SendTaskSuccess resumes the execution ``TOKEN_RESUME`` later. Release is a ``lambda:invoke``
  task. Every execution's end reaches the function as an EventBridge status change (``EVENT_DELAY``);
  the sweep runs every minute, as the stack deploys them.
- ``retry-loop``: aws-samples ``sam/app-control-concurrency-with-dynamodb``,
  ``statemachines/dynamodb-semaphore.asl.json``, as published: ``Get Lock`` (Parallel) → ``Acquire Lock``
  (``dynamodb:updateItem`` SET count + 1 IF count <> limit; its ``Retry`` on ``States.ALL`` retries a
  ConditionalCheckFailed 6 times, 1 s doubling: 1, 2, 4, 8, 16, 32 s) → Catch → ``Get Current Lock
  Record`` (``dynamodb:getItem``, consistent) → ``Check If Lock Already Acquired`` (Choice) → ``Wait to
  Get Lock`` (3 s) → ``Acquire Lock``. ``Release Lock``: ``dynamodb:updateItem`` count - 1. Step
  Functions calls DynamoDB itself: no Lambda. A retry is a state transition (AWS bills retries).
- ``retry-loop-wait3``: the same without the task's Retry: every failed attempt goes straight to the
  GetItem, the Choice and the 3 s Wait (the loop as it is usually described).
- ``list-polling``: the section runs as a child state machine (``states:startExecution.sync``), so that
  ListExecutions (RUNNING) of the child machine counts the executions inside it. ``Check`` (a
  ``lambda:invoke`` task) lists them; a Choice admits when fewer than ``LIMIT`` are listed, else a
  ``Wait`` of ``POLL_WAIT`` s and ``Check`` again. ListExecutions is eventually consistent
  (``LIST_LAG``, as ``bench/aws.py`` ``SimExecutions``): fresh starts are missing, so it over-admits.

Step Functions timings (assumed, constant; AWS publishes none): ``STATE_LATENCY`` from one state's
end to the next state's work, ``INVOKE_LATENCY`` for Step Functions to invoke a Lambda (and again
for its answer to come back), ``TOKEN_RESUME`` from SendTaskSuccess accepted to the next state's
work. DynamoDB and Step Functions API latencies are those of ``bench/aws.py`` (``LATENCY``), with
DeleteItem 8 ms and SendTaskSuccess / SendTaskFailure 30 ms added here.

Metrics (``SectionRecorder``):

- *waiting transitions*: state transitions of the acquire phase beyond those of an uncontended
  acquire (Sluice 1: Acquire; retry loop 2: Get Lock, Acquire Lock; polling 2: Check, Choice);
- *hand-off latency*: each section entry is paired with the oldest permit free (FIFO, as
  ``bench/harness.py`` pairs starts with slots); a permit freed by a release is free from the end of
  the holder's section. A hand-off is a pair whose execution was already waiting when the permit was
  freed: latency = section entry − section end of the holder (the Release task's dispatch included);
- *utilisation*: ∫ min(inside, LIMIT) dt / ∫ min(demand, LIMIT) dt, where *inside* counts executions in
  their section and *demand* those in their acquire phase or section: 1.0 when the section is full
  whenever enough executions want it;
- *peak*: the most executions inside the section at once.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.aws import LATENCY as AWS_LATENCY
from bench.aws import Meter, counting_logger
from bench.harness import _r, percentile, run_costs
from bench.model import (
    BASELINE_ARCHITECTURE,
    BASELINE_MEMORY_MB,
    COLD_START,
    EVENT_DELAY,
    LIST_LAG,
    SLUICE_ARCHITECTURE,
    SLUICE_COMPLETION_MEMORY_MB,
)
from bench.pricing import PRICES
from bench.sim import T0, LambdaFunction, Sim
from sluice.adapters.memory.semaphore import MemorySemaphoreStore, MemoryTokens
from sluice.core.events import DETAIL_TYPE
from sluice.primitives.slots import Capacity, Occupancy, Plan
from sluice.semaphore.model import Acquisition, Delivery, Freed, Opened, Ticket
from sluice.semaphore.service import SCHEDULED, SemaphoreService
from sluice.semaphore.step import Semaphores

NAME = "bench"
LIMIT = 5
EXECUTIONS = 200
QUICK_EXECUTIONS = 60
PRE_WORK = (0.5, 2.0)  # seconds, uniform
POST_WORK = 1.0
WORKLOADS = {"exp10": "exponential, mean 10 s", "fixed5": "every section runs 5 s"}
ARRIVALS = {
    "burst": "every execution starts at t0",
    "steady": "Poisson arrivals at 90% of the section's capacity (LIMIT / mean section)",
}
STEADY_LOAD = 0.9
RUNS = (("burst", "exp10"), ("burst", "fixed5"), ("steady", "exp10"))
SYSTEMS = ("sluice-semaphore", "retry-loop", "retry-loop-wait3", "list-polling")
LABEL = {
    "sluice-semaphore": "Sluice semaphore",
    "retry-loop": "Retry loop (aws-samples, as published)",
    "retry-loop-wait3": "Retry loop, Wait 3 s only*",
    "list-polling": "ListExecutions polling",
}

STATE_LATENCY = 0.05  # a Standard workflow going on to its next state
INVOKE_LATENCY = 0.03  # Step Functions → a Lambda handler (and its answer → Step Functions)
TOKEN_RESUME = 0.1  # SendTaskSuccess accepted → the next state runs
LATENCY = {
    **AWS_LATENCY,
    "dynamodb:DeleteItem": 0.008,
    "states:SendTaskSuccess": 0.030,
    "states:SendTaskFailure": 0.030,
}
SWEEP_SECONDS = 60.0  # semaphoreSweepRate: rate(1 minute)
SWEEP_PHASE = 30.0
EMF_BYTES = 400  # the semaphore function's EMF blob (one metric) per invocation
RETRY_INTERVALS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)  # IntervalSeconds 1, BackoffRate 2, MaxAttempts 6
LOCK_WAIT = 3.0  # "Wait to Get Lock"
POLL_WAIT = 3.0  # the polling loop's Wait, the same as the retry loop's
CHECK_LOG_BYTES = 200  # one line per Check invocation


# -- executions ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Execution:
    index: int
    arrive: float  # seconds after t0
    pre: float
    section: float
    post: float

    @property
    def arn(self) -> str:
        return f"arn:aws:states:us-east-1:123456789012:execution:bench-workflow:run-{self.index:04d}"


def executions(arrivals: str, workload: str, n: int, seed: int) -> list[Execution]:
    rng = random.Random(f"{seed}/semaphore/{arrivals}/{workload}")
    if workload == "exp10":
        sections = [round(max(0.1, rng.expovariate(1 / 10)), 3) for _ in range(n)]
        mean = 10.0
    elif workload == "fixed5":
        sections, mean = [5.0] * n, 5.0
    else:
        raise ValueError(workload)
    if arrivals == "burst":
        starts = [0.0] * n
    elif arrivals == "steady":
        rate, t, starts = STEADY_LOAD * LIMIT / mean, 0.0, []
        for _ in range(n):
            t += rng.expovariate(rate)
            starts.append(round(t, 3))
    else:
        raise ValueError(arrivals)
    pres = [round(rng.uniform(*PRE_WORK), 3) for _ in range(n)]
    return [Execution(i, starts[i], pres[i], sections[i], POST_WORK) for i in range(n)]


# -- what happened --------------------------------------------------------------------------------------


class SectionRecorder:
    """Acquire phases, section entries and exits, ends; the metrics of the module docstring."""

    def __init__(self, sim: Sim, limit: int, runs: Sequence[Execution]) -> None:
        self.sim = sim
        self.limit = limit
        self.runs = runs
        self.requested: dict[int, float] = {}
        self.entered: dict[int, float] = {}
        self.acquire_transitions = [0] * len(runs)
        self.transitions = 0  # every state transition the semaphore adds, acquire phase or not
        self.inside = 0
        self.demand = 0
        self.peak = 0
        self.over_limit_seconds = 0.0
        self.used = 0.0  # ∫ min(inside, limit)
        self.wanted = 0.0  # ∫ min(demand, limit)
        self._since = sim.t0
        self.free_since: deque[tuple[float, bool]] = deque([(sim.t0, False)] * limit)
        self.overdraft = 0
        self.handoffs: list[float] = []
        self.waits: list[float] = []
        self.ended = 0
        self.last_end = sim.t0

    def _advance(self) -> None:
        now = self.sim.now
        dt = now - self._since
        self.used += min(self.inside, self.limit) * dt
        self.wanted += min(self.demand, self.limit) * dt
        if self.inside > self.limit:
            self.over_limit_seconds += dt
        self._since = now

    def transition(self, i: int, *, acquiring: bool) -> None:
        self.transitions += 1
        if acquiring:
            self.acquire_transitions[i] += 1

    def request(self, i: int) -> None:
        self._advance()
        self.requested[i] = self.sim.now
        self.demand += 1

    def enter(self, i: int) -> None:
        self._advance()
        now = self.sim.now
        if i in self.entered:
            raise RuntimeError(f"execution {i} entered the section twice")
        self.entered[i] = now
        self.waits.append(now - self.requested[i])
        if self.free_since:
            free, released = self.free_since.popleft()
            if released and self.requested[i] <= free:
                self.handoffs.append(now - free)
        else:
            self.overdraft += 1
        self.inside += 1
        self.peak = max(self.peak, self.inside)

    def leave(self, i: int) -> None:
        self._advance()
        self.inside -= 1
        self.demand -= 1
        if self.overdraft:
            self.overdraft -= 1
        else:
            self.free_since.append((self.sim.now, True))

    def end(self, i: int) -> None:
        self.ended += 1
        self.last_end = self.sim.now

    def done(self) -> bool:
        return self.ended == len(self.runs)


# -- counting adapters for the Sluice semaphore -------------------------------------------------------------


class _Calls:
    """Counts a call as the DynamoDB / Step Functions adapters make it, then lets its latency pass."""

    def __init__(self, meter: Meter, sim: Sim) -> None:
        self.meter = meter
        self.sim = sim

    def __call__(self, api: str, *, n: int = 1, rru: float = 0.0, wru: float = 0.0) -> None:
        self.meter.call(api, n)
        self.meter.rru += rru
        self.meter.wru += wru

    def wait(self, api: str, n: int = 1) -> None:
        if n > 0 and self.sim.current is not None:
            self.sim.sleep(LATENCY[api] * n)


class CountingSlots:
    """``MemorySlots`` behind the calls ``DynamoSlots`` makes (items under 1 KB: 1 WRU, 1 RRU each)."""

    def __init__(self, inner: Any, calls: _Calls) -> None:
        self.inner = inner
        self.calls = calls
        self.per_shard = inner.per_shard

    def look(self, pool: str) -> Occupancy:
        result = self.inner.look(pool)
        self.calls("dynamodb:BatchGetItem", rru=0.5 * (1 + result.read))  # eventually consistent
        self.calls.wait("dynamodb:BatchGetItem")
        return result

    def occupancy(self, pool: str) -> Occupancy:
        result = self.inner.occupancy(pool)
        self.calls("dynamodb:GetItem", rru=1)
        batches = math.ceil(result.shard_count / 100)
        if batches:
            self.calls("dynamodb:BatchGetItem", n=batches, rru=result.shard_count)
        self.calls.wait("dynamodb:GetItem")
        self.calls.wait("dynamodb:BatchGetItem", batches)
        return result

    def claim(self, pool: str, shard: int, name: str, now: float) -> None:
        self.calls("dynamodb:UpdateItem", wru=1)
        try:
            self.inner.claim(pool, shard, name, now)
        finally:
            self.calls.wait("dynamodb:UpdateItem")

    def release(self, pool: str, shard: int, name: str) -> bool:
        self.calls("dynamodb:UpdateItem", wru=1)
        result = self.inner.release(pool, shard, name)
        self.calls.wait("dynamodb:UpdateItem")
        return result

    def swap(self, pool: str, shard: int, old: str, new: str, now: float) -> bool:
        self.calls("dynamodb:UpdateItem", wru=1)
        try:
            return self.inner.swap(pool, shard, old, new, now)
        finally:
            self.calls.wait("dynamodb:UpdateItem")

    def _planned(self, pool: str, plan: Plan | None) -> Plan | None:
        shards = self.inner.occupancy(pool).shard_count
        self.calls("dynamodb:GetItem", rru=1)
        if shards:
            self.calls("dynamodb:BatchGetItem", rru=shards)
        if plan is not None:
            self.calls("dynamodb:TransactWriteItems", wru=2 * (1 + shards))
        self.calls.wait("dynamodb:GetItem")
        self.calls.wait("dynamodb:BatchGetItem", 1 if shards else 0)
        self.calls.wait("dynamodb:TransactWriteItems", 1 if plan is not None else 0)
        return plan

    def set_limit(self, capacity: Capacity) -> Plan | None:
        return self._planned(capacity.pool, self.inner.set_limit(capacity))

    def rebalance(self, pool: str) -> Plan | None:
        return self._planned(pool, self.inner.rebalance(pool))

    def restamp(self, pool: str, stamp: tuple[float, ...], replaces: tuple[float, ...]) -> bool:
        self.calls("dynamodb:UpdateItem", wru=1)
        result = self.inner.restamp(pool, stamp, replaces)
        self.calls.wait("dynamodb:UpdateItem")
        return result


class CountingSemaphoreStore:
    """``MemorySemaphoreStore`` behind the calls ``DynamoSemaphoreStore`` makes for each method (its
    docstring's table): records, tickets and the line are under 1 KB, so a write is 1 WRU (2 per item
    in a transaction, a ConditionCheck included) and a consistent read 1 RRU. A refused conditional
    write is charged too."""

    def __init__(self, inner: MemorySemaphoreStore, calls: _Calls) -> None:
        self.inner = inner
        self.calls = calls
        self.slots = CountingSlots(inner.slots, calls)

    def _get(self, result: Any) -> Any:
        self.calls("dynamodb:GetItem", rru=1)
        self.calls.wait("dynamodb:GetItem")
        return result

    def _update(self, result: Any) -> Any:
        self.calls("dynamodb:UpdateItem", wru=1)
        self.calls.wait("dynamodb:UpdateItem")
        return result

    def _batch(self, keys: int) -> None:
        batches = math.ceil(keys / 100)
        if batches:
            self.calls("dynamodb:BatchGetItem", n=batches, rru=keys)
            self.calls.wait("dynamodb:BatchGetItem", batches)

    def acquisition(self, name: str, holder: str) -> Acquisition | None:
        return self._get(self.inner.acquisition(name, holder))

    def acquisitions(self, name: str, holders: Sequence[str]) -> dict[str, Acquisition]:
        result = self.inner.acquisitions(name, holders)
        self._batch(len(holders))
        return result

    def open(self, acquisition: Acquisition, previous_gen: int | None, now: float) -> Opened:
        result = self.inner.open(acquisition, previous_gen, now)
        self.calls("dynamodb:TransactWriteItems", wru=2 * 3)  # ticket, record, index
        self.calls.wait("dynamodb:TransactWriteItems")
        return result

    def refresh(self, name: str, holder: str, gen: int, token: str) -> Acquisition | None:
        return self._update(self.inner.refresh(name, holder, gen, token))

    def take_ticket(self, name: str) -> int:
        return self._update(self.inner.take_ticket(name))

    def line(self, name: str) -> tuple[int, int]:
        return self._get(self.inner.line(name))

    def ticket(self, name: str, number: int) -> Ticket | None:
        return self._get(self.inner.ticket(name, number))

    def tickets(self, name: str, first: int, last: int) -> list[Ticket]:
        result = self.inner.tickets(name, first, last)
        self._batch(max(0, last - first + 1))
        return result

    def tombstone(self, name: str, number: int, now: float) -> bool:
        result = self.inner.tombstone(name, number, now)
        self.calls("dynamodb:PutItem", wru=1)
        self.calls.wait("dynamodb:PutItem")
        return result

    def advance(self, name: str, number: int, *, drop: bool) -> bool:
        moved = self._update(self.inner.advance(name, number, drop=drop))
        if moved and drop:
            self.calls("dynamodb:DeleteItem", wru=1)
            self.calls.wait("dynamodb:DeleteItem")
        return moved

    def grant(self, name: str, holder: str, gen: int, ticket: int, now: float) -> Acquisition | None:
        return self._update(self.inner.grant(name, holder, gen, ticket, now))

    def ungrant(self, name: str, holder: str, gen: int, granted_at: float) -> bool:
        return self._update(self.inner.ungrant(name, holder, gen, granted_at))

    def take_over(
        self, name: str, holder: str, gen: int, granted_at: float, now: float
    ) -> Acquisition | None:
        return self._update(self.inner.take_over(name, holder, gen, granted_at, now))

    def delivered(self, name: str, holder: str, gen: int, now: float, *, sure: bool) -> None:
        self._update(self.inner.delivered(name, holder, gen, now, sure=sure))

    def end(self, name: str, holder: str, gen: int, now: float, reason: str, **kwargs: Any) -> bool:
        return self._update(self.inner.end(name, holder, gen, now, reason, **kwargs))

    def free(self, name: str, holder: str, shard: int | None) -> Freed:
        result = self.inner.free(name, holder, shard)
        items = 2 + (shard is not None)  # [slot release], index DELETE, ConditionCheck
        self.calls("dynamodb:TransactWriteItems", wru=2 * items)
        self.calls.wait("dynamodb:TransactWriteItems")
        if result is Freed.FREED:  # DeleteItem of the index IF it holds nothing more
            self.calls("dynamodb:DeleteItem", wru=1)
            self.calls.wait("dynamodb:DeleteItem")
        return result

    def held_by(self, execution_arn: str) -> list[tuple[str, str]]:
        return self._get(self.inner.held_by(execution_arn))


class SimTokens(MemoryTokens):
    """``MemoryTokens`` with SendTaskSuccess / SendTaskFailure / DescribeExecution counted and timed;
    ``on_delivered(arn)`` runs when Step Functions takes a SendTaskSuccess (the execution resumes)."""

    def __init__(self, calls: _Calls, on_delivered: Callable[[str], None]) -> None:
        super().__init__()
        self.counter = calls
        self.on_delivered = on_delivered

    def _on_delivered(self, execution_arn: str) -> None:
        self.on_delivered(execution_arn)

    def succeed(self, token: str, output: Any) -> Delivery:
        self.counter("states:SendTaskSuccess")
        answer = super().succeed(token, output)
        self.counter.wait("states:SendTaskSuccess")
        return answer

    def fail(self, token: str, error: str, cause: str) -> Delivery:
        self.counter("states:SendTaskFailure")
        answer = super().fail(token, error, cause)
        self.counter.wait("states:SendTaskFailure")
        return answer

    def execution_status(self, execution_arn: str) -> str | None:
        self.counter("states:DescribeExecution")
        status = super().execution_status(execution_arn)
        self.counter.wait("states:DescribeExecution")
        return status


# -- the systems ---------------------------------------------------------------------------------------


class SemaphoreSystem:
    """Drives executions through the acquire phase, the section and the release."""

    name = "system"
    uncontended = 0  # acquire-phase transitions with a free permit

    def __init__(self, sim: Sim, meter: Meter, recorder: SectionRecorder, seed: int) -> None:
        self.sim = sim
        self.meter = meter
        self.recorder = recorder
        self.seed = seed
        self.functions: list[LambdaFunction] = []

    def start(self, run: Execution) -> None:
        self.sim.at(self.sim.now + run.pre, self._request, run)

    def _request(self, run: Execution) -> None:
        self.recorder.request(run.index)
        self.acquire(run)

    def acquire(self, run: Execution) -> None:
        raise NotImplementedError

    def release(self, run: Execution) -> None:
        raise NotImplementedError

    def enter(self, run: Execution) -> None:
        self.recorder.enter(run.index)
        self.sim.at(self.sim.now + run.section, self._leave, run)

    def _leave(self, run: Execution) -> None:
        self.recorder.leave(run.index)
        self.release(run)

    def after_release(self, run: Execution) -> None:
        """The release task is done: the next state runs, then the post-work, then the end."""
        self.sim.at(self.sim.now + STATE_LATENCY + run.post, self.finish, run)

    def finish(self, run: Execution) -> None:
        self.recorder.end(run.index)

    def transition(self, run: Execution, *, acquiring: bool) -> None:
        self.recorder.transition(run.index, acquiring=acquiring)


class SluiceSemaphore(SemaphoreSystem):
    name = "sluice-semaphore"
    uncontended = 1  # Acquire

    def __init__(self, sim: Sim, meter: Meter, recorder: SectionRecorder, seed: int) -> None:
        super().__init__(sim, meter, recorder, seed)
        calls = _Calls(meter, sim)
        self.inner = MemorySemaphoreStore(rng=random.Random(f"{seed}/slots"))
        self.store = CountingSemaphoreStore(self.inner, calls)
        self.tokens = SimTokens(calls, self._delivered)
        self.by_arn: dict[str, Execution] = {}
        # The semaphore exists before the run (``sluice semaphore set``), uncounted.
        Semaphores(self.inner, MemoryTokens(), sim.clock).set_limit(NAME, LIMIT)
        self._containers = 0
        self.fn = LambdaFunction(
            sim,
            "semaphore",
            SLUICE_COMPLETION_MEMORY_MB,  # provider.memorySize: the function sets none of its own
            30,
            COLD_START,
            self._container_state,
            SLUICE_ARCHITECTURE,
        )
        self.functions = [self.fn]
        self.logger = counting_logger(meter, "sluice.semaphore.step.bench")
        self.sweeping = True
        sim.at(sim.t0 + SWEEP_PHASE, self._sweep)

    def _container_state(self) -> SemaphoreService:
        self._containers += 1
        rng = random.Random(f"{self.seed}/semaphore/{self._containers}")
        semaphores = Semaphores(self.store, self.tokens, self.sim.clock, rng=rng)
        return SemaphoreService(semaphores, {NAME: LIMIT}, logger=self.logger)

    def _invoke(self, event: dict[str, Any], then: Callable[[], None] | None = None) -> None:
        def handler(service: SemaphoreService, _remaining_ms: Any) -> None:
            service.handle(event)
            self.meter.log_bytes += EMF_BYTES
            if then is not None:
                then()

        self.fn.invoke(handler)

    def _delivered(self, execution_arn: str) -> None:
        run = self.by_arn[execution_arn]
        self.sim.at(self.sim.now + LATENCY["states:SendTaskSuccess"] + TOKEN_RESUME, self.enter, run)

    def acquire(self, run: Execution) -> None:
        self.transition(run, acquiring=True)
        self.by_arn[run.arn] = run
        token = self.tokens.issue(run.arn)
        event = {
            "action": "acquire",
            "semaphore": NAME,
            "acquisitionId": "section",
            "executionArn": run.arn,
            "taskToken": token,
        }
        self.sim.at(self.sim.now + STATE_LATENCY + INVOKE_LATENCY, self._invoke, event)

    def release(self, run: Execution) -> None:
        self.transition(run, acquiring=False)
        event = {"action": "release", "semaphore": NAME, "acquisitionId": "section", "executionArn": run.arn}

        def returned() -> None:
            self.sim.at(self.sim.now + INVOKE_LATENCY, self.after_release, run)

        self.sim.at(self.sim.now + STATE_LATENCY + INVOKE_LATENCY, self._invoke, event, returned)

    def finish(self, run: Execution) -> None:
        super().finish(run)
        self.tokens.end(run.arn)
        change = {
            "detail-type": DETAIL_TYPE,
            "detail": {
                "name": run.arn.rsplit(":", 1)[1],
                "status": "SUCCEEDED",
                "stateMachineArn": "arn:aws:states:us-east-1:123456789012:stateMachine:bench-workflow",
                "executionArn": run.arn,
            },
        }
        self.sim.at(self.sim.now + EVENT_DELAY, self._invoke, change)

    def _sweep(self) -> None:
        if not self.sweeping:
            return
        self._invoke({"detail-type": SCHEDULED})
        self.sim.at(self.sim.now + SWEEP_SECONDS, self._sweep)

    def stop(self) -> None:
        self.sweeping = False


class RetryLoop(SemaphoreSystem):
    """Step Functions' own DynamoDB calls (no Lambda): a counter item, conditional updates."""

    name = "retry-loop"
    uncontended = 2  # Get Lock (Parallel), Acquire Lock
    retries: tuple[float, ...] = RETRY_INTERVALS

    def __init__(self, sim: Sim, meter: Meter, recorder: SectionRecorder, seed: int) -> None:
        super().__init__(sim, meter, recorder, seed)
        self.count = 0

    def _ddb(self, api: str, *, rru: float = 0.0, wru: float = 0.0) -> float:
        self.meter.call(api)
        self.meter.rru += rru
        self.meter.wru += wru
        return LATENCY[api]

    def acquire(self, run: Execution) -> None:
        self.transition(run, acquiring=True)  # Get Lock
        self.sim.at(self.sim.now + STATE_LATENCY, self._attempt, run, 0)

    def _attempt(self, run: Execution, retry: int) -> None:
        self.transition(run, acquiring=True)  # Acquire Lock, or its retry
        took = self._ddb("dynamodb:UpdateItem", wru=1)
        if self.count < LIMIT:
            self.count += 1
            self.sim.at(self.sim.now + took + STATE_LATENCY, self.enter, run)
        elif retry < len(self.retries):
            self.sim.at(self.sim.now + took + self.retries[retry], self._attempt, run, retry + 1)
        else:
            self.sim.at(self.sim.now + took + STATE_LATENCY, self._read_lock, run)

    def _read_lock(self, run: Execution) -> None:
        self.transition(run, acquiring=True)  # Get Current Lock Record
        took = self._ddb("dynamodb:GetItem", rru=1)
        self.sim.at(self.sim.now + took + STATE_LATENCY, self._check, run)

    def _check(self, run: Execution) -> None:
        self.transition(run, acquiring=True)  # Check If Lock Already Acquired
        self.sim.at(self.sim.now + STATE_LATENCY, self._wait, run)

    def _wait(self, run: Execution) -> None:
        self.transition(run, acquiring=True)  # Wait to Get Lock
        self.sim.at(self.sim.now + LOCK_WAIT + STATE_LATENCY, self._attempt, run, 0)

    def release(self, run: Execution) -> None:
        self.sim.at(self.sim.now + STATE_LATENCY, self._release, run)

    def _release(self, run: Execution) -> None:
        self.transition(run, acquiring=False)  # Release Lock
        took = self._ddb("dynamodb:UpdateItem", wru=1)
        self.count -= 1
        self.sim.at(self.sim.now + took, self.after_release, run)


class RetryLoopWait3(RetryLoop):
    name = "retry-loop-wait3"
    retries = ()


class LaggedSection:
    """The child state machine's RUNNING executions as ListExecutions shows them, ``lag`` s late."""

    def __init__(self, clock: Any, lag: float) -> None:
        self.clock = clock
        self.lag = lag
        self.running: set[int] = set()
        self.starts: deque[tuple[float, int]] = deque()
        self.ends: deque[tuple[float, int]] = deque()

    def start(self, i: int) -> None:
        self.running.add(i)
        self.starts.append((self.clock.now(), i))

    def finish(self, i: int) -> None:
        self.running.discard(i)
        self.ends.append((self.clock.now(), i))

    def listed(self) -> set[int]:
        horizon = self.clock.now() - self.lag
        while self.starts and self.starts[0][0] <= horizon:
            self.starts.popleft()
        while self.ends and self.ends[0][0] <= horizon:
            self.ends.popleft()
        return (self.running - {i for _, i in self.starts}) | {i for _, i in self.ends}


class ListPolling(SemaphoreSystem):
    name = "list-polling"
    uncontended = 2  # Check, Choice

    def __init__(
        self, sim: Sim, meter: Meter, recorder: SectionRecorder, seed: int, *, lag: float = LIST_LAG
    ) -> None:
        super().__init__(sim, meter, recorder, seed)
        self.section = LaggedSection(sim.clock, lag)
        self.fn = LambdaFunction(
            sim, "check", BASELINE_MEMORY_MB, 30, COLD_START, lambda: None, BASELINE_ARCHITECTURE
        )
        self.functions = [self.fn]

    def acquire(self, run: Execution) -> None:
        self._check(run)

    def _check(self, run: Execution) -> None:
        self.transition(run, acquiring=True)  # Check (lambda:invoke)

        def handler(_state: Any, _remaining_ms: Any) -> None:
            listed = self.section.listed()
            pages = max(1, math.ceil(len(listed) / 1000))
            self.meter.call("states:ListExecutions", pages)
            self.sim.sleep(LATENCY["states:ListExecutions"] * pages)
            self.meter.log_bytes += CHECK_LOG_BYTES
            admit = len(listed) < LIMIT
            self.sim.at(self.sim.now + INVOKE_LATENCY + STATE_LATENCY, self._choice, run, admit)

        self.sim.at(self.sim.now + INVOKE_LATENCY, self.fn.invoke, handler)

    def _choice(self, run: Execution, admit: bool) -> None:
        self.transition(run, acquiring=True)  # the Choice
        if admit:
            self.sim.at(self.sim.now + STATE_LATENCY, self._start_child, run)
        else:
            self.sim.at(self.sim.now + STATE_LATENCY, self._wait, run)

    def _wait(self, run: Execution) -> None:
        self.transition(run, acquiring=True)  # Wait
        self.sim.at(self.sim.now + POLL_WAIT + STATE_LATENCY, self._check, run)

    def _start_child(self, run: Execution) -> None:
        self.transition(run, acquiring=False)  # Run section (states:startExecution.sync)
        self.meter.call("states:StartExecution")
        self.sim.at(self.sim.now + LATENCY["states:StartExecution"], self._child_started, run)

    def _child_started(self, run: Execution) -> None:
        self.section.start(run.index)
        self.sim.at(self.sim.now + STATE_LATENCY, self.enter, run)

    def release(self, run: Execution) -> None:
        self.section.finish(run.index)  # the child ends with its section; .sync resumes the parent
        self.after_release(run)


SYSTEM_CLASSES: dict[str, type[SemaphoreSystem]] = {
    cls.name: cls for cls in (SluiceSemaphore, RetryLoop, RetryLoopWait3, ListPolling)
}


# -- a run ----------------------------------------------------------------------------------------------


def run(
    system_name: str,
    arrivals: str,
    workload: str,
    n: int,
    seed: int,
    *,
    lag: float | None = None,
) -> dict[str, Any]:
    """Simulate ``n`` executions through the section under ``system_name``; its metrics."""
    runs = executions(arrivals, workload, n, seed)
    sim = Sim()
    meter = Meter(sim.clock, sim)
    recorder = SectionRecorder(sim, LIMIT, runs)
    cls = SYSTEM_CLASSES[system_name]
    if cls is ListPolling and lag is not None:
        system: SemaphoreSystem = ListPolling(sim, meter, recorder, seed, lag=lag)
    else:
        system = cls(sim, meter, recorder, seed)
    for r in runs:
        sim.at(T0 + r.arrive, system.start, r)
    horizon = T0 + 10 * sum(r.section for r in runs) + 3600
    try:
        sim.run(until=horizon, stop=recorder.done)
        finished = recorder.done()
        end = sim.now
        if isinstance(system, SluiceSemaphore):
            system.stop()
        sim.run(until=end + 300)  # status events and invocations in flight (billed)
    finally:
        sim.close()

    makespan = recorder.last_end - T0
    waiting = [t - system.uncontended for t in recorder.acquire_transitions]
    _, costs = run_costs(meter, system.functions, fifo=False)
    del costs["sqs"], costs["total"]
    costs["stepfunctions"] = recorder.transitions * PRICES["stepfunctions_transition"]
    costs["total"] = sum(costs.values())
    calls = sum(meter.calls.values())
    ddb = sum(v for k, v in meter.calls.items() if k.startswith("dynamodb:"))
    return {
        "system": system_name,
        "arrivals": arrivals,
        "workload": workload,
        "executions": n,
        "limit": LIMIT,
        "finished": finished,
        "entered": len(recorder.entered),
        "waiting_transitions_per_execution": _r(sum(waiting) / n, 2),
        "waiting_transitions_max": max(waiting),
        "semaphore_transitions_per_execution": _r(recorder.transitions / n, 2),
        "handoffs": len(recorder.handoffs),
        "handoff_latency_p50_s": _r(percentile(recorder.handoffs, 50)),
        "handoff_latency_p99_s": _r(percentile(recorder.handoffs, 99)),
        "wait_p50_s": _r(percentile(recorder.waits, 50), 2),
        "wait_p99_s": _r(percentile(recorder.waits, 99), 2),
        "utilisation": _r(recorder.used / recorder.wanted if recorder.wanted > 0 else None),
        "peak_inside": recorder.peak,
        "over_limit_seconds": _r(recorder.over_limit_seconds, 1),
        "makespan_s": _r(makespan, 1),
        "section_work_over_limit_s": _r(sum(r.section for r in runs) / LIMIT, 1),
        "calls_per_execution": _r(calls / n, 2),
        "dynamodb_calls_per_execution": _r(ddb / n, 2),
        "calls_by_api_per_execution": {k: round(v / n, 3) for k, v in sorted(meter.calls.items())},
        "dynamodb_capacity_per_execution": {"rru": _r(meter.rru / n, 2), "wru": _r(meter.wru / n, 2)},
        "lambda": {
            f.name: {
                "memory_mb": f.memory_mb,
                "architecture": f.architecture,
                "invocations": f.invocations,
                "gb_seconds": round(f.gb_seconds, 3),
                "cold_starts": f.cold_starts,
                "peak_concurrent": f.peak_running,
            }
            for f in system.functions
        },
        "cost_per_1000_usd": round(costs["total"] / n * 1000, 4),
        "cost_per_1000_by_service_usd": {k: round(v / n * 1000, 4) for k, v in costs.items()},
        "peak_rate_per_s": meter.peak_rates(),
        "quota_warnings": meter.quota_warnings(),
    }


def plan_runs(n: int, seed: int) -> list[tuple[str, str, str, int, int]]:
    return [(s, a, w, n, seed) for a, w in RUNS for s in SYSTEMS]


def run_task(args: tuple[str, str, str, int, int]) -> dict[str, Any]:
    system, arrivals, workload, n, seed = args
    return run(system, arrivals, workload, n, seed)

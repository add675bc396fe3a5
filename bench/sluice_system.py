"""Sluice as built: the real ``Launcher`` and its completion path on the counting adapters.

Two Lambda functions, configured as ``serverless.yml`` deploys them (arm64; launcher 128 MB, timeout
120 s; completion 256 MB, 60 s; MAX from SSM cached 5 s; receive wait 1 s; consistency window 60 s;
queue visibility 180 s; maxReceiveCount 10; the launcher lingers 55 s):

    schedule ──► launcher:   launcher.tick(reconcile_first=True, remaining_ms=...)
    status event ──► completion: launcher.on_status_change(...): the release hands its slot to the
                                 next payload in its own transaction (sluice.launch.handover)

exactly as ``handlers/launcher.py`` and ``handlers/completion.py`` do. Each warm container keeps its own
``Launcher`` (and so its own SSM cache and state machine check), like the handlers' warm runtime.

Only the scheduled tick lingers (``tick()`` calls ``admit(linger=True)``); a completion's admission
never does, whatever ``SLUICE_LINGER_SECONDS`` says. A completion refills at most the one slot it
freed: it reads the ended run's record and the pool item, receives one message and hands the slot
to it in the release's own transaction.

Systems (the ids predate the change of default; they change no core code):

- ``sluice-linger``: Sluice as deployed, ``SLUICE_LINGER_SECONDS=55`` (``lingerSeconds``' default): the
  scheduled launcher long-polls while slots are free. The completion function shares the setting and
  ignores it.
- ``sluice``: the same with ``lingerSeconds=0``: a payload enqueued between ticks waits for the next.
  The variants below are built on it, so that they differ from it by one thing only.
- ``sluice-wake``: ``sluice`` whose producer wakes the launcher after each send, as ``sluice enqueue``
  does (``sluice.enqueue.LauncherWake``): an asynchronous invoke, ``ASYNC_INVOKE_DELAY`` later the
  handler's ``Launcher.wake`` (a tick without reconciliation or linger, woken launchers taking
  turns). The schedule still ticks.
- ``sluice-release-then-refill``: ``sluice`` with the completion as it was before the hand-over: the
  release, then a refill that reads the freed shard, claims in a transaction of its own and marks
  it RUNNING. The two variants below are built on it.
- ``sluice-refill-one``: ``sluice-release-then-refill``, but a completion's admission skips its read of the freed shard and
  assumes the one slot it freed is free (``CountingStore.hint_one_free``). It prices the read that
  stays in the core: without it, a completion after MAX was lowered would receive the head of the
  queue, fail the claim (``SlotsFull``) and return the message, spending one of its
  ``maxReceiveCount`` receives per completion; the read sees there is no slot and receives nothing.
- ``sluice-wide``: ``sluice-linger`` with ``startConcurrency=100`` and ``launcherMemory=1024``, what
  docs/deploy.md gave for a MAX in the thousands before ``auto`` (MAX 10,000 runs only).
- ``sluice-lean``: ``sluice-release-then-refill`` without the mark step and without the read before a release, the
  ledger read kept: the floor of this design (ledger read, receive, claim, start, delete, release).
- ``sluice-lanes``: ``sluice-linger`` with ``SLUICE_LANES=fast:10:1,bulk:50:0`` (the lanes workload):
  one queue per lane (``default``, implied with the global MAX, is the payload queue), handed to
  the launcher as ``lane_queues``; the producer sends each job to its lane's queue.
- ``sluice-lanes-nowait``: ``sluice-lanes`` with ``SLUICE_RECEIVE_WAIT_SECONDS=0``: a completion's
  receive from a lane with no message returns at once instead of waiting a second before the next
  lane is tried.
- ``sluice-fair``: ``sluice-linger`` with ``SLUICE_LANES=default:<MAX>:0:1:fair`` (the tenants
  workload): one fair lane, the payload queue, as large as the global MAX; each job's tenant is its
  concurrency key (``sluice-concurrency-key``), served round-robin (``sluice.features.fair``). The default
  ``keyConcurrency`` (1) does not apply to a fair lane's tenants.
"""

from __future__ import annotations

import logging
import random
from dataclasses import replace
from typing import Any

from bench.aws import CountingSsmClient, CountingStore, LogBytes, SimExecutions, SimQueue, counting_logger
from bench.model import (
    ASYNC_INVOKE_DELAY,
    ASYNC_RETRIES,
    COLD_START,
    EMF_BYTES,
    LIST_LAG,
    SLUICE_ARCHITECTURE,
    SLUICE_COMPLETION_MEMORY_MB,
    SLUICE_LAUNCHER_MEMORY_MB,
    SUMMARY_BYTES,
    Context,
    System,
)
from bench.sim import LambdaFunction, Parallel, Sim
from sluice.adapters.aws.ssm import SsmMax
from sluice.adapters.memory.aws import MemoryExecutions
from sluice.adapters.memory.store import MemoryStore
from sluice.adapters.memory.wake import MemoryWakeTurns
from sluice.core.events import StatusChange
from sluice.core.gates import OPEN
from sluice.core.model import ExecutionInfo
from sluice.core.records import Done
from sluice.core.summary import TickSummary
from sluice.features.lanes import DEFAULT_LANE, parse_lanes
from sluice.features.rate_limits import RateLimiter
from sluice.launch.completion import settle_status_change
from sluice.launch.launcher import Launcher
from sluice.launch.settings import Settings
from sluice.primitives.fanout import Serial, pool_size

PARAMETER = "/sluice/bench/max-concurrency"
LINGER_SECONDS = 55
START_CONCURRENCY = None  # startConcurrency's default, auto (sluice.primitives.fanout.start_width)

MODULE_LINES = LogBytes(None)  # the module loggers' lines, counted for the system running now


def ship_module_lines(meter: Any) -> None:
    """The module loggers (``sluice.*``) ship their INFO lines too: handlers/_shared.py gives the
    "sluice" logger Powertools' handler and level. (Powertools' configuration of that logger, once
    handlers/_shared.py is imported, replaces its handlers: the counter is put back each time.)"""
    modules = logging.getLogger("sluice")
    modules.setLevel(logging.INFO)
    if MODULE_LINES not in modules.handlers:
        modules.addHandler(MODULE_LINES)
    MODULE_LINES.meter = meter


def sluice_settings(max_concurrency: int, **overrides: Any) -> Settings:
    base = Settings(
        queue_url="https://sqs.us-east-1.amazonaws.com/123456789012/sluice-bench.fifo",
        dlq_url="https://sqs.us-east-1.amazonaws.com/123456789012/sluice-bench-dlq.fifo",
        table_name="sluice-bench",
        state_machine_arn=MemoryExecutions.state_machine_arn,
        max_concurrency=max_concurrency,
        max_parameter=PARAMETER,
        max_cache_seconds=5,
        claim_timeout_seconds=900,
        receive_wait_seconds=1,
        linger_seconds=0,
        consistency_window_seconds=60,
        time_reserve_seconds=15,
        start_concurrency=START_CONCURRENCY,
    )
    return replace(base, **overrides)


class SimFanout:
    """``sluice.primitives.fanout.Threads`` in simulated time: up to ``workers`` calls at once, each round
    taking as long as its slowest call (``bench.sim.Parallel``); their effects happen in order."""

    def __init__(self, sim: Sim, workers: int) -> None:
        self.sim = sim
        self.workers = workers

    def each(self, calls: Any) -> list[Done[Any]]:
        if self.workers <= 1 or len(calls) <= 1:
            return Serial().each(calls)
        results: list[Done[Any]] = []
        for i in range(0, len(calls), self.workers):
            together = Parallel(self.sim)
            for call in calls[i : i + self.workers]:
                results.extend(together.branch(lambda call=call: Serial().each([call])))
            together.join()
        return results


class SluiceSystem(System):
    name = "sluice"
    status_events = True
    linger = 0
    start_concurrency: int | None = START_CONCURRENCY
    launcher_memory_mb = SLUICE_LAUNCHER_MEMORY_MB
    lean = False  # no read before a release
    key_concurrency = 1  # the cap of a concurrency key (only the tenants workload's jobs carry one)
    refill_one = False  # a completion's admission skips the ledger read
    # A completion hands its slot to the next payload in its release (``Launcher.on_status_change``,
    # ``sluice.launch.handover``); False: the design before it, a release and then a refill that reads the
    # freed shard (``settle_status_change``, then ``Launcher.refill``).
    hand_over = True
    lanes = ""  # SLUICE_LANES (only the lanes workload's jobs name a lane); "{max}": the global MAX
    receive_wait = 1  # SLUICE_RECEIVE_WAIT_SECONDS

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        sim, meter = ctx.sim, ctx.meter
        self.store = CountingStore(
            MemoryStore(key_concurrency=self.key_concurrency),
            meter,
            skip_mark=self.lean,
            release_without_read=self.lean,
        )
        self.queue = SimQueue(meter, sim.clock, visibility_timeout=180, max_receive_count=10)
        self.sfn = SimExecutions(meter, sim.clock, lag=LIST_LAG, on_start=ctx.on_start)
        self.log = counting_logger(meter, f"bench.{self.name}")
        ship_module_lines(meter)
        lanes = parse_lanes(self.lanes.format(max=ctx.max), ctx.max)
        self.fair = any(lane.fair for lane in lanes)
        # Each lane's queue (the default lane's is the payload queue), with the same redrive policy.
        self.lane_queues = {
            lane.name: self.queue
            if lane.name == DEFAULT_LANE
            else SimQueue(meter, sim.clock, visibility_timeout=180, max_receive_count=10)
            for lane in lanes
        }
        self._launchers = 0  # containers built: each draws its completions' lane order from its own seed
        self.rates: RateLimiter | None = None  # rate limits (bench.rates_bench); None: the book is not read
        settings = sluice_settings(
            ctx.max,
            linger_seconds=self.linger,
            start_concurrency=self.start_concurrency,
            receive_wait_seconds=self.receive_wait,
            lanes=lanes,
            lane_queue_urls={
                lane.name: f"https://sqs.us-east-1.amazonaws.com/123456789012/sluice-bench-lane-{lane.name}.fifo"
                for lane in lanes
                if lane.name != DEFAULT_LANE
            },
        )
        self.launcher_fn = LambdaFunction(
            sim,
            "launcher",
            self.launcher_memory_mb,
            120,
            COLD_START,
            lambda: self._launcher(settings),
            SLUICE_ARCHITECTURE,
        )
        self.completion_fn = LambdaFunction(
            sim,
            "completion",
            SLUICE_COMPLETION_MEMORY_MB,
            60,
            COLD_START,
            lambda: self._launcher(settings),
            SLUICE_ARCHITECTURE,
        )
        self.completion_fn.retry_after = ASYNC_RETRIES  # EventBridge invokes it asynchronously
        self.functions = [self.launcher_fn, self.completion_fn]
        self.settings = settings

    def _launcher(self, settings: Settings) -> Launcher:
        max_source = SsmMax(
            CountingSsmClient(self.meter, self.max),
            PARAMETER,
            default=self.max,
            clock=self.sim.clock,
            cache_seconds=settings.max_cache_seconds,
        )
        self._launchers += 1
        return Launcher(
            queue=self.queue,  # type: ignore[arg-type]
            executions=self.sfn,  # type: ignore[arg-type]
            store=self.store,  # type: ignore[arg-type]
            max_source=max_source,
            clock=self.sim.clock,
            settings=settings,
            logger=self.log,
            fan=SimFanout(self.sim, pool_size(settings.start_concurrency)),
            sleep=self.sim.sleep,
            lane_queues=self.lane_queues,  # type: ignore[arg-type]
            rng=random.Random(f"{self.name}/lanes/{self._launchers}"),
            gate=self.rates or OPEN,
        )

    @property
    def tenant_cap(self) -> int | None:
        """The most runs a keyed tenant may hold: ``keyConcurrency``; none of its own in a fair lane
        (its lane's MAX holds it)."""
        return None if self.fair else self.key_concurrency

    def queue_for(self, lane: str | None) -> SimQueue:
        return self.lane_queues.get(lane or DEFAULT_LANE, self.queue)

    @property
    def dead(self) -> int:
        """Dead-lettered from any lane's queue (one dead-letter queue for all)."""
        queues = {id(q): q for q in (self.queue, *self.lane_queues.values())}
        return sum(q.dead for q in queues.values())

    def _emit(self, summary: TickSummary, *, completion: bool = False) -> None:
        """handlers/_shared.emit: the metrics, and the summary's line (a completion's only when a
        message it received did not start: handlers/completion.py)."""
        shipped = not (completion and summary.all_started)
        self.meter.log_bytes += EMF_BYTES + (SUMMARY_BYTES if shipped else 0)

    # handlers/launcher.py
    def on_tick(self) -> None:
        def handler(launcher: Launcher, remaining_ms: Any) -> None:
            self._emit(launcher.tick(reconcile_first=True, remaining_ms=remaining_ms))

        self.launcher_fn.invoke(handler)

    # handlers/completion.py
    def on_status_event(self, info: ExecutionInfo) -> None:
        event = {
            "detail-type": "Step Functions Execution Status Change",
            "source": "aws.states",
            "detail": {
                "executionArn": info.arn,
                "stateMachineArn": self.sfn.state_machine_arn,
                "name": info.name,
                "status": info.status,
                "startDate": int((info.start_date or 0) * 1000),
                "stopDate": int((info.stop_date or 0) * 1000),
                # The output rides in the event (EventBridge leaves it out only past ~248 KiB).
                "output": "{}",
                "outputDetails": {"included": True},
            },
        }

        def handler(launcher: Launcher, remaining_ms: Any) -> None:
            change = StatusChange.from_event(event)
            if self.hand_over:
                _, summary, _ = launcher.on_status_change(change, remaining_ms=remaining_ms)
                if summary is not None:
                    self._emit(summary, completion=True)
                return
            released = settle_status_change(
                change,
                store=launcher.store,
                queue=launcher.queue,
                state_machine_arn=self.settings.state_machine_arn,
                now=self.sim.now,
            )
            if released is not None:
                if self.refill_one:
                    self.store.hint_one_free(self.max)
                freed = None if released.shard is None else (released.shard,)
                self._emit(launcher.refill(freed=freed, remaining_ms=remaining_ms), completion=True)
                self.store.forget_hint()

        self.completion_fn.invoke(handler)


class MeteredWakeTurns:
    """``WakeTurns`` in memory (``sluice.features.wake``), each write metered as the DynamoDB call it
    makes: one write unit, whether its condition holds or not."""

    def __init__(self, meter: Any) -> None:
        self.inner, self.meter = MemoryWakeTurns(), meter

    def _write(self, api: str) -> None:
        self.meter.call(api)
        self.meter.wru += 1
        self.meter.wait(api)

    def take(self, holder: str, *, now: float, expires_at: float) -> bool:
        self._write("dynamodb:PutItem")
        return self.inner.take(holder, now=now, expires_at=expires_at)

    def note(self, *, now: float, margin: float = 0.0) -> bool:
        self._write("dynamodb:UpdateItem")
        return self.inner.note(now=now, margin=margin)

    def again(self, holder: str) -> bool:
        self._write("dynamodb:UpdateItem")
        return self.inner.again(holder)

    def give_back(self, holder: str, *, noted_or_not: bool = False) -> bool:
        self._write("dynamodb:DeleteItem")
        return self.inner.give_back(holder, noted_or_not=noted_or_not)


class SluiceWoken(SluiceSystem):
    """``sluice``, its producer waking the launcher after each send (handlers/launcher.py on a wake:
    ``Launcher.wake``, the woken launchers taking turns on one item)."""

    name = "sluice-wake"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.turns = MeteredWakeTurns(ctx.meter)

    def on_enqueue(self) -> None:
        def handler(launcher: Launcher, remaining_ms: Any) -> None:
            self._emit(launcher.wake(self.turns, remaining_ms=remaining_ms))

        self.meter.call("lambda:Invoke")  # the producer's, answered 202 at once
        self.sim.at(self.sim.now + ASYNC_INVOKE_DELAY, self.launcher_fn.invoke, handler)


class SluiceLinger(SluiceSystem):
    name = "sluice-linger"
    linger = LINGER_SECONDS


class SluiceWide(SluiceLinger):
    """Sluice as once deployed for a MAX in the thousands: ``startConcurrency=100`` and
    ``launcherMemory=1024`` (the threads share the launcher's CPU, which this model does not
    simulate; the memory is priced)."""

    name = "sluice-wide"
    start_concurrency = 100
    launcher_memory_mb = 1024


class SluiceKeyed(SluiceLinger):
    """Sluice as deployed with ``keyConcurrency=10``: the tenants workload, each tenant a concurrency key."""

    name = "sluice-keyed"
    key_concurrency = 10


class SluiceFair(SluiceLinger):
    """Sluice as deployed with one fair lane, ``default``, as large as the global MAX: the tenants
    workload's jobs (each with its tenant as its concurrency key) served round-robin by tenant."""

    name = "sluice-fair"
    lanes = "default:{max}:0:1:fair"


class SluiceLanes(SluiceLinger):
    """Sluice as deployed with lanes: ``fast`` (MAX 10, priority 1) and ``bulk`` (MAX 50), the
    global MAX capping their sum; ``default`` is implied (the global MAX, priority 0)."""

    name = "sluice-lanes"
    lanes = "fast:10:1,bulk:50:0"


class SluiceLanesNoWait(SluiceLanes):
    name = "sluice-lanes-nowait"
    receive_wait = 0


class SluiceReleaseThenRefill(SluiceSystem):
    """The completion before the hand-over: the release, then a refill that reads the freed shard
    and claims in a transaction of its own, marked RUNNING (the variants below are built on it)."""

    name = "sluice-release-then-refill"
    hand_over = False


class SluiceLean(SluiceReleaseThenRefill):
    name = "sluice-lean"
    lean = True


class SluiceRefillOne(SluiceReleaseThenRefill):
    name = "sluice-refill-one"
    refill_one = True

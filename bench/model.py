"""What every simulated system shares: the modelled AWS timings and the shape of a system."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from bench.aws import Meter, SimExecutions, SimQueue
from bench.sim import LambdaFunction, Sim
from sluice.core.model import ExecutionInfo

# Each timing says where it comes from; those AWS publishes no figure for are assumptions, and
# docs/benchmarks.md shows how the results move with the status event's (report.sensitivity_markdown).
TICK_SECONDS = 60.0  # serverless.yml scheduleRate: rate(1 minute), for every system
# A payload arrives at a uniformly random instant of the minute: on average 30 s after a tick and 30 s
# before the next (the mean of a uniform wait; an assumption about producers, not about AWS).
TICK_PHASE = 30.0
# Assumed, no AWS figure: EventBridge reference, "AWS Step Functions events": Execution Status Change,
# "Delivery type: Best effort" (an event may be late or, rarely, never delivered), and Lambda's
# asynchronous invocation behind it. Sensitivity: 0.2 / 0.5 / 1 / 2 s in docs/benchmarks.md.
EVENT_DELAY = 0.5
SENSITIVITY_EVENT_DELAYS = (0.2, 0.5, 1.0, 2.0)
# Assumed, no AWS figure: Step Functions API Reference, ListExecutions: "This operation is eventually
# consistent. The results are best effort and may not reflect very recent updates and changes."
LIST_LAG = 3.0
# Assumed, no AWS figure (AWS Lambda Developer Guide, "Understanding the Lambda execution environment
# lifecycle", gives none): a Python init with boto3 (and Powertools for Sluice), billed.
COLD_START = 0.6
# Assumed, no AWS figure: a producer's wake (``sluice enqueue``, ``sluice.enqueue.LauncherWake``), from its
# Invoke call (InvocationType Event) to the launcher's handler starting in a warm container: the call's
# round trip and Lambda's internal event queue (AWS Lambda Developer Guide, "Asynchronous invocation",
# gives no figure). A cold container adds COLD_START.
ASYNC_INVOKE_DELAY = 0.2
# AWS Lambda Developer Guide, "How Lambda handles errors and retries with asynchronous invocation":
# two retries after a function error, the first about 1 minute after it, the second about 2 minutes.
ASYNC_RETRIES = (60.0, 120.0)
# Lambda sizes and architectures, each function priced at its own (bench/pricing.py). Sluice's are
# serverless.yml's defaults (tests/bench checks them against it): the launcher at launcherMemory, the
# completion function at provider.memorySize, both arm64.
SLUICE_ARCHITECTURE = "arm64"
SLUICE_LAUNCHER_MEMORY_MB = 128
SLUICE_COMPLETION_MEMORY_MB = 256
# The baselines' functions: their sources name no size or architecture. 256 MB, as before, on x86_64,
# Lambda's default architecture.
BASELINE_ARCHITECTURE = "x86_64"
BASELINE_MEMORY_MB = 256

# Bytes a Sluice invocation logs besides its per-message lines (handlers/_shared.emit).
EMF_BYTES = 700  # one EMF blob with the six metrics
SUMMARY_BYTES = 900  # "admission finished" with the summary


@dataclass
class Context:
    sim: Sim
    meter: Meter
    max: int
    on_start: Callable[[str, str], None]
    rng: random.Random  # for names the systems invent (uuid4 in the baselines)


class System:
    """A launcher design under test. The harness calls ``on_tick`` on the schedule and, when
    ``status_events`` is true, ``on_status_event`` ``EVENT_DELAY`` after each execution ends
    (``event_delay``, when a system sets one, instead: the oracle that waits for nothing)."""

    name = "system"
    status_events = False
    event_delay: float | None = None
    linger = 0  # seconds the scheduled launcher keeps receiving while slots are free
    fifo = True  # for the SQS price
    queue: SimQueue
    sfn: SimExecutions
    functions: list[LambdaFunction]

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.sim = ctx.sim
        self.meter = ctx.meter
        self.max = ctx.max

    def queue_for(self, lane: str | None) -> SimQueue:
        """The queue a producer sends a job of ``lane`` to (one queue unless the system has lanes)."""
        return self.queue

    @property
    def dead(self) -> int:
        """Payloads dead-lettered."""
        return self.queue.dead

    def first_tick(self, t0: float) -> float:
        """The first tick of a run whose first payloads arrive at ``t0``: ``TICK_PHASE`` later; or,
        for a launcher that lingers past the arrival, the tick before, which is still receiving when
        they arrive (``lingerSeconds`` 55 > 30: the deployed stack takes a backlog as it lands)."""
        if self.linger > TICK_SECONDS - TICK_PHASE:
            return t0 + TICK_PHASE - TICK_SECONDS
        return t0 + TICK_PHASE

    def on_tick(self) -> None:
        raise NotImplementedError

    def on_enqueue(self) -> None:
        """A producer has just sent a payload (the harness calls it after each send)."""

    def on_status_event(self, info: ExecutionInfo) -> None:
        raise NotImplementedError

    def uuid_name(self) -> str:
        """A random (uuid4) execution name, reproducible from the run's seed."""
        b = bytearray(self.ctx.rng.getrandbits(128).to_bytes(16, "big"))
        b[6] = (b[6] & 0x0F) | 0x40
        b[8] = (b[8] & 0x3F) | 0x80
        h = b.hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

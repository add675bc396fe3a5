"""What every simulated system shares: the modelled AWS timings and the shape of a system."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from bench.aws import Meter, SimExecutions, SimQueue
from bench.sim import LambdaFunction, Sim
from sluice.model import ExecutionInfo

TICK_SECONDS = 60.0  # EventBridge rate(1 minute), for every system
TICK_PHASE = 30.0  # the first tick comes 30 s after the backlog is enqueued (the average wait)
EVENT_DELAY = 0.5  # Step Functions status change → EventBridge → Lambda
LIST_LAG = 3.0  # ListExecutions shows the state machine as it was this long ago
COLD_START = 0.6  # Python Lambda init with boto3 (and Powertools for Sluice), billed
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
    ``status_events`` is true, ``on_status_event`` ``EVENT_DELAY`` after each execution ends."""

    name = "system"
    status_events = False
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

    def on_tick(self) -> None:
        raise NotImplementedError

    def on_status_event(self, info: ExecutionInfo) -> None:
        raise NotImplementedError

    def uuid_name(self) -> str:
        """A random (uuid4) execution name, reproducible from the run's seed."""
        b = bytearray(self.ctx.rng.getrandbits(128).to_bytes(16, "big"))
        b[6] = (b[6] & 0x0F) | 0x40
        b[8] = (b[8] & 0x3F) | 0x80
        h = b.hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

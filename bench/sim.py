"""Virtual time for the benchmark: an event heap, and Lambda invocations as cooperative greenlets.

The launcher and completion code under test is ordinary blocking Python. Each invocation runs in its own
greenlet, and only one runs at a time: the scheduler switches to an invocation, which switches back
when it waits (an AWS call's latency, a long poll) or finishes. The order of everything is fixed by
the heap ``(time, sequence)``, so a run is deterministic.

    scheduler ──► pop (t, seq, fn) ──► clock = t ──► fn()
                                                    │
                      an invocation's turn ─────────┘──► runs until it calls sleep(dt) or ends
                      sleep(dt): nothing due before now+dt  → advance the clock in place, keep running
                                 something due earlier      → park; a resume event goes on the heap

A callback that runs on the scheduler (a message arriving, an execution ending) never sleeps.
"""

from __future__ import annotations

import contextlib
import heapq
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from greenlet import greenlet

from sluice.core.clock import FakeClock
from sluice.core.errors import TransientError

T0 = 1_800_000_000.0  # virtual epoch of every run


class Shutdown(BaseException):
    """Unwinds a parked invocation when a run is torn down (escapes ``except Exception``)."""


class Sim:
    def __init__(self, t0: float = T0) -> None:
        self.t0 = t0
        self.clock = FakeClock(t0)
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self._main = greenlet.getcurrent()
        self.current: Container | None = None
        self.failure: BaseException | None = None
        self.closing = False
        self.containers: list[Container] = []
        # Set by ``Parallel`` while an invocation issues calls that run concurrently (Promise.all).
        self.sleep_hook: Callable[[float], None] | None = None

    @property
    def now(self) -> float:
        return self.clock.t

    # -- the heap ----------------------------------------------------------------------------------

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (max(t, self.clock.t), self._seq, fn, args))

    def run(self, until: float = math.inf, stop: Callable[[], bool] | None = None) -> None:
        self._main = greenlet.getcurrent()
        heap = self._heap
        while heap and heap[0][0] <= until:
            t, _, fn, args = heapq.heappop(heap)
            self.clock.t = t
            fn(*args)
            if self.failure is not None:
                failure, self.failure = self.failure, None
                raise RuntimeError("a simulated Lambda failed") from failure
            if stop is not None and stop():
                return

    def pending(self) -> int:
        return len(self._heap)

    # -- time inside an invocation -----------------------------------------------------------------

    def sleep(self, dt: float) -> None:
        """Let ``dt`` virtual seconds pass for the calling invocation."""
        if dt <= 0 or self.closing:
            return
        if self.sleep_hook is not None:
            self.sleep_hook(dt)
            return
        container = self.current
        if container is None:
            raise RuntimeError("sleep() outside an invocation: scheduler callbacks take no time")
        target = self.clock.t + dt
        heap = self._heap
        if not heap or target < heap[0][0]:
            self.clock.t = target  # nothing else can happen meanwhile
            return
        container.park(target)

    def _switch_to(self, container: Container) -> None:
        assert container.glet is not None
        self.current = container
        container.glet.switch()
        self.current = None

    def close(self) -> None:
        """Unwind every parked invocation with ``Shutdown``."""
        self.closing = True
        for c in self.containers:
            if c.glet is not None and not c.glet.dead:
                self.current = c
                with contextlib.suppress(Shutdown):
                    c.glet.throw(Shutdown)
                self.current = None
        self.containers.clear()
        self._heap.clear()


class Container:
    """One Lambda container: runs one invocation at a time, each in a fresh greenlet."""

    def __init__(self, sim: Sim, name: str) -> None:
        self.sim = sim
        self.name = name
        self.glet: greenlet | None = None
        self._ticket = 0
        self._parked = False
        sim.containers.append(self)

    def start(self, task: Callable[[], None]) -> None:
        """Run ``task`` now (called by the scheduler)."""
        sim = self.sim

        def body() -> None:
            try:
                task()
            except Shutdown:
                pass
            except BaseException as exc:  # reported by the scheduler
                sim.failure = exc

        self.glet = greenlet(body, parent=sim._main)
        sim._switch_to(self)

    def park(self, until: float | None) -> None:
        """Hand control back until ``until`` (or until ``wake``)."""
        self._ticket += 1
        if until is not None:
            self.sim.at(until, self._resume, self._ticket)
        self._parked = True
        try:
            self.sim._main.switch()
        finally:
            self._parked = False

    def wake(self) -> None:
        """Resume a parked invocation as soon as possible."""
        if self._parked:
            self.sim.at(self.sim.now, self._resume, self._ticket)

    def _resume(self, ticket: int) -> None:
        if ticket != self._ticket or not self._parked:
            return  # a stale wake-up: it was resumed by something else first
        self._ticket += 1
        self.sim._switch_to(self)


class Parallel:
    """Calls issued at once (JavaScript ``Promise.all``): the caller waits for the slowest branch.

    The branches run one after another, each from the moment they were issued: within a branch the
    clock reads that moment plus the branch's time so far, so each of its calls meets AWS's quotas
    (and a pacer, a backoff) at the time it would be made. The caller then waits for the longest.
    """

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.longest = 0.0

    def branch(self, fn: Callable[[], Any]) -> Any:
        total = 0.0
        issued = self.sim.clock.t

        def add(dt: float) -> None:
            nonlocal total
            total += dt
            self.sim.clock.t = issued + total

        saved, self.sim.sleep_hook = self.sim.sleep_hook, add
        try:
            return fn()
        finally:
            self.sim.sleep_hook = saved
            self.sim.clock.t = issued
            self.longest = max(self.longest, total)

    def join(self) -> None:
        self.sim.sleep(self.longest)
        self.longest = 0.0


@dataclass
class LambdaFunction:
    """A Lambda function: warm containers reused most-recent first, billed per 1 ms of duration."""

    sim: Sim
    name: str
    memory_mb: int
    timeout_s: float
    cold_start_s: float
    make_state: Callable[[], Any]
    architecture: str = "x86_64"  # Lambda's default; its price per GB-second (bench/pricing.py)
    platform_log_bytes: int = 350  # START, END and REPORT lines
    idle: list[tuple[Container, Any]] = field(default_factory=list)
    containers: int = 0
    invocations: int = 0
    billed_ms: int = 0
    cold_starts: int = 0
    over_timeout: int = 0
    running: int = 0
    peak_running: int = 0
    log_bytes: int = 0
    # An invocation that raises an AWS error it did not handle (a throttle past the SDK's retries) ends
    # in error, counted; an asynchronous one is retried after these waits (Lambda, "Asynchronous
    # invocation": two retries, about 1 and then 2 minutes after the error). The scheduled launcher's
    # has none: the next tick comes first.
    retry_after: tuple[float, ...] = ()
    errors: int = 0
    error_sites: dict[str, int] = field(default_factory=dict)  # "operation: outer → inner" -> errors

    def invoke(self, handler: Callable[[Any, Callable[[], int]], None], attempt: int = 0) -> None:
        """Invoke now (scheduler thread). ``handler(state, remaining_ms)`` runs in a container."""
        if self.idle:
            container, state = self.idle.pop()
            cold = False
        else:
            self.containers += 1
            container, state, cold = Container(self.sim, f"{self.name}-{self.containers}"), None, True
        sim = self.sim
        start = sim.now
        deadline = start + self.timeout_s

        def remaining_ms() -> int:
            return max(0, int((deadline - sim.now) * 1000))

        def task() -> None:
            nonlocal state
            self.running += 1
            self.peak_running = max(self.peak_running, self.running)
            if cold:
                self.cold_starts += 1
                sim.sleep(self.cold_start_s)
                state = self.make_state()
            try:
                handler(state, remaining_ms)
            except TransientError as exc:
                self.errors += 1
                site = _site(exc)
                self.error_sites[site] = self.error_sites.get(site, 0) + 1
                if attempt < len(self.retry_after):
                    sim.at(sim.now + self.retry_after[attempt], self.invoke, handler, attempt + 1)
            duration = sim.now - start
            self.running -= 1
            self.invocations += 1
            self.billed_ms += max(1, math.ceil(duration * 1000 - 1e-6))
            self.log_bytes += self.platform_log_bytes
            if duration > self.timeout_s:
                self.over_timeout += 1
            self.idle.append((container, state))

        # Its own event: the caller (a tick, a status event) finishes first, at its own time.
        sim.at(start, container.start, task)

    @property
    def gb_seconds(self) -> float:
        return self.billed_ms / 1000 * self.memory_mb / 1024


def _site(exc: BaseException) -> str:
    """Where an unhandled error left Sluice's code: its operation, the outermost and innermost
    functions of ``sluice`` it passed through."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/sluice/" in f.filename]
    path = f"{frames[0].name} → {frames[-1].name}" if frames else "outside sluice"
    return f"{getattr(exc, 'operation', '') or type(exc).__name__}: {path}"

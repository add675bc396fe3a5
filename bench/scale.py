"""What one scheduled tick costs as the running count and the backlog grow.

Steady state of a warm launcher: N executions run (started ten minutes ago, in the ledger and in the
listing), MAX = N + 10, a backlog waits, and 10 slots were just freed. The tick reconciles and fills
the 10 slots. Calls are counted by API and averaged over five ticks a minute apart (the state machine
check comes every fifth); CPU is ``time.process_time`` around the real ``Launcher.tick`` on the
in-memory adapters, the median of those ticks. CPU depends on the machine: it goes in its own section
of the results and is not part of the determinism check.

The baselines' ticks are counted the same way (their code is this benchmark's, so their CPU says
little about them).
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from typing import Any

from bench.aws import CountingSsmClient, CountingStore, Meter, SimExecutions, SimQueue, counting_logger
from bench.counter_semaphore import CounterSemaphoreSystem
from bench.harness import body
from bench.model import Context
from bench.poller import PollerSystem
from bench.sim import T0, Sim
from bench.sluice_system import PARAMETER, sluice_settings
from sluice.adapters.aws.ssm import SsmMax
from sluice.adapters.memory.store import MemoryStore
from sluice.core.limits import LimitSource
from sluice.core.model import Claim, Ending, Outcome, PayloadState
from sluice.core.names import execution_name
from sluice.launch.launcher import Launcher

FREE = 10
TICKS = 5


def _fill(sfn: SimExecutions, queue: SimQueue, running: int, backlog: int) -> list[str]:
    names = []
    for i in range(running):
        name = execution_name(f"run-{i:06d}", f"r-{i:08d}")
        sfn.inner.running[name] = T0
        sfn.inner.inputs[name] = "{}"
        names.append(name)
    for i in range(backlog):
        queue.send(body(f"job-{i:06d}", i), f"job-{i:06d}")
    return names


def _timed(fn: Any) -> float:
    """CPU seconds of ``fn()``, with the garbage collector held off (the backlog is many objects)."""
    gc.collect()
    gc.disable()
    try:
        t = time.process_time()
        _timed.result = fn()  # type: ignore[attr-defined]
        return time.process_time() - t
    finally:
        gc.enable()


def _row(meter: Meter, cpu: list[float], ticks: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    calls = {api: round(n / ticks, 2) for api, n in sorted(meter.calls.items())}
    return {
        "calls_per_tick": round(sum(meter.calls.values()) / ticks, 2),
        "calls_by_api_per_tick": calls,
        "_cpu_ms": round(statistics.median(cpu) * 1000, 3),
        **(extra or {}),
    }


def sluice_tick(running: int, backlog: int) -> dict[str, Any]:
    sim = Sim()  # only its clock: no latency outside a run
    clock = sim.clock
    meter = Meter(clock)
    store = CountingStore(MemoryStore(), meter)
    queue = SimQueue(meter, clock, visibility_timeout=180, max_receive_count=10)
    sfn = SimExecutions(meter, clock, lag=0)
    max_ = running + FREE
    store.inner.set_limit(LimitSource(max_, None))
    for name in _fill(sfn, queue, running, backlog):
        key = name.rsplit("-", 1)[0]
        store.inner.claim(Claim(key=key, name=name, message_id=name, now=T0, claim_expires_at=T0 + 900))
        store.inner.mark_running(key=key, name=name, arn=sfn.arn_for(name), started_at=T0, now=T0)
    store.resync()
    clock.t = T0 + 600
    # The tick's 10 starts one after another: the same calls as side by side, and a CPU figure
    # that threads do not blur.
    settings = sluice_settings(max_, start_concurrency=1)
    launcher = Launcher(
        queue=queue,  # type: ignore[arg-type]
        executions=sfn,  # type: ignore[arg-type]
        store=store,  # type: ignore[arg-type]
        max_source=SsmMax(
            CountingSsmClient(meter, max_), PARAMETER, default=max_, clock=clock, cache_seconds=5
        ),
        clock=clock,
        settings=settings,
        logger=counting_logger(meter, "bench.scale"),
    )
    launcher.tick()  # warm: the state machine check, and 10 starts

    def free_ten() -> None:
        for name in [n for n in sfn.inner.running if n.startswith("job-")]:
            sfn.finish(name)
            store.inner.release(name, Ending(PayloadState.SUCCEEDED, clock.t))
        store.resync()

    cpu: list[float] = []
    meter.calls.clear()
    for _ in range(TICKS):
        free_ten()
        clock.t += 60
        cpu.append(_timed(launcher.tick))
        summary = _timed.result
        assert summary.n(Outcome.STARTED) == FREE, summary.as_dict()
    return _row(meter, cpu, TICKS, {"ledger_item_kb": round(store.ledger_bytes / 1024, 1)})


def baseline_tick(system_name: str, running: int, backlog: int) -> dict[str, Any]:
    sim = Sim()
    meter = Meter(sim.clock)  # no sim: no latency
    ctx = Context(sim, meter, running + FREE, lambda name, body: None, random.Random(0))
    system: Any
    if system_name == "poller":
        system = PollerSystem(ctx)
    else:
        system = CounterSemaphoreSystem(ctx)
        system.table.values[system.key] = running
    _fill(system.sfn, system.queue, running, backlog)
    cpu: list[float] = []
    for _ in range(TICKS):
        started_before = len(system.sfn.inner.running)
        handler = system._handler if system_name == "poller" else system._consume
        cpu.append(_timed(lambda h=handler: h(None, None)))
        # free what the tick started, as the status events would
        for name in list(system.sfn.inner.running)[started_before:]:
            system.sfn.finish(name)
            if system_name != "poller":
                system.table.values[system.key] -= 1
        sim.clock.t += 60
    return _row(meter, cpu, TICKS)


def scale(running_sizes: list[int], backlog_sizes: list[int], base_running: int = 100) -> dict[str, Any]:
    out: dict[str, Any] = {"free_slots_per_tick": FREE, "running": [], "backlog": []}
    for n in running_sizes:
        row = {"running": n, "max": n + FREE, "backlog": 1_000}
        row["sluice"] = sluice_tick(n, 1_000)
        for name in ("poller", "counter-semaphore"):
            row[name] = baseline_tick(name, n, 1_000)
        out["running"].append(row)
    for b in backlog_sizes:
        row = {"running": base_running, "max": base_running + FREE, "backlog": b}
        row["sluice"] = sluice_tick(base_running, b)
        for name in ("poller", "counter-semaphore"):
            row[name] = baseline_tick(name, base_running, b)
        out["backlog"].append(row)
    return out

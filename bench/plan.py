"""What ``make bench`` runs: every (system, workload, MAX), the trickle, the idle hour, the scale ticks."""

from __future__ import annotations

import os
import random
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from bench import semaphore_bench
from bench.harness import (
    LANE_BULK,
    LANE_FAST_BACKLOG,
    LANE_FAST_FOR,
    MAIN_SYSTEMS,
    ORACLES,
    TENANT_HEAVY,
    TENANT_LIGHT,
    backlog,
    dag,
    idle,
    lanes_jobs,
    run,
    tenants,
    trickle,
    without_awaits,
    without_keys,
    without_lanes,
)
from bench.model import EVENT_DELAY, SENSITIVITY_EVENT_DELAYS
from bench.oracle import OracleFair
from bench.sluice_system import SluiceFair, SluiceLanes, SluiceLanesNoWait
from sluice.features.fair import UNKEYED
from sluice.features.lanes import DEFAULT_LANE, parse_lanes

WORKLOADS = ("fixed30", "exp30", "lognormal", "fixed5")
MAXES = (5, 100, 1000)
# The completion before the hand-over, and the floor of that design, on every workload.
VARIANTS = ("sluice-release-then-refill", "sluice-lean")
REFILL_ONE = ("sluice-refill-one", ("fixed30", "fixed5"))  # prices a completion's ledger read
# The producer that wakes the launcher (sluice enqueue) changes only payloads enqueued while slots are free.
WOKEN = "sluice-wake"
TRICKLE_SYSTEMS = (*MAIN_SYSTEMS, WOKEN, ORACLES[0])  # O-event: what arrival-driven starts would give
IDLE_SYSTEMS = (*MAIN_SYSTEMS, WOKEN)
TIMELINE = ("fixed30", 100)  # the run whose concurrency over time is plotted
LARGE = ("fixed60", ("sluice-linger", "sluice-wide", *ORACLES))  # MAX 10,000 (issue 10, item 9)
# How the results move with the status event's delay (an assumption: bench.model.EVENT_DELAY): Sluice
# as deployed and O-event on these (workload, MAX), at each delay of SENSITIVITY_EVENT_DELAYS.
SENSITIVITY = (("fixed30", 100), ("fixed5", 1000))
SENSITIVITY_SYSTEMS = ("sluice-linger", "oracle-event")
# Sluice as deployed on queues without high-throughput mode (bench.quotas: 300 calls a second per
# action, as a stack whose queues lack it would get), on the runs where that refuses calls, and at
# MAX 10,000 (LARGE, ``Plan.large_max``). Every other run has the deployed queues' high throughput.
WITHOUT_HIGH_THROUGHPUT = (("fixed5", 1000), ("fixed30", 1000))
DAG_SYSTEM = "sluice-linger"  # the DAG workload (issue 13): as deployed, awaits through the real code
# The tenants workload (issue 11): each tenant a concurrency key under keyConcurrency; the same jobs
# without keys; each tenant a tenant of a fair lane (the jobs keyed, the one lane fair). Each in the
# two arrival patterns (bench.harness.tenants: "late", "together"); and heavy's burst alone in the
# fair lane (arriving as in "together", no light tenant); the fair lane's three runs again under
# O-fair, the oracle a fair lane is judged against (bench.oracle): (workload, system, arrivals, light tenants).
TENANT_RUNS = (
    ("tenants", "sluice-keyed", "late", TENANT_LIGHT),
    ("tenants-plain", "sluice-linger", "late", TENANT_LIGHT),
    ("tenants-fair", SluiceFair.name, "late", TENANT_LIGHT),
    ("tenants-together", "sluice-keyed", "together", TENANT_LIGHT),
    ("tenants-plain-together", "sluice-linger", "together", TENANT_LIGHT),
    ("tenants-fair-together", SluiceFair.name, "together", TENANT_LIGHT),
    ("tenants-fair-alone", SluiceFair.name, "together", 0),
    ("tenants-fair-oracle", OracleFair.name, "late", TENANT_LIGHT),
    ("tenants-fair-together-oracle", OracleFair.name, "together", TENANT_LIGHT),
    ("tenants-fair-alone-oracle", OracleFair.name, "together", 0),
)
# The lanes workload: with lanes, bulk's backlog and fast's trickle; both backlogged; the first run's
# jobs with receives that do not wait (SLUICE_RECEIVE_WAIT_SECONDS=0), and without lanes.
LANE_RUNS = (
    ("lanes", SluiceLanes.name),
    ("lanes-both", SluiceLanes.name),
    ("lanes-nowait", SluiceLanesNoWait.name),
    ("lanes-plain", "sluice-linger"),
)


@dataclass(frozen=True)
class Plan:
    quick: bool
    seed: int
    backlog: int
    trickle_jobs: int
    trickle_gap: float
    trickle_duration: float
    trickle_max: int
    idle_hours: float
    scale_running: tuple[int, ...]
    scale_backlog: tuple[int, ...]
    semaphore_executions: int = semaphore_bench.EXECUTIONS
    large_max: int = 10_000
    large_backlog: int = 30_000
    dag_max: int = 50
    dag_fan_ins: int = 10  # 10 × (50 + 1) nodes
    dag_chains: int = 49  # 49 × 10 nodes: 1,000 in all
    tenants_max: int = 50
    tenants_heavy: int = TENANT_HEAVY  # the heavy tenant's jobs
    lanes_max: int = 50
    lanes_bulk: int = LANE_BULK
    lanes_fast_for: float = LANE_FAST_FOR  # seconds of fast's trickle
    lanes_fast_backlog: int = LANE_FAST_BACKLOG  # fast's jobs at t0 in the run with both backlogged

    @classmethod
    def make(cls, *, quick: bool, seed: int) -> Plan:
        if quick:
            return cls(
                quick,
                seed,
                300,
                30,
                15.0,
                1_200.0,
                100,
                1 / 3,
                (10, 1_000),
                (1_000, 10_000),
                semaphore_bench.QUICK_EXECUTIONS,
                1_000,
                3_000,
            )
        return cls(quick, seed, 10_000, 240, 15.0, 7_200.0, 250, 1.0, (10, 1_000, 10_000), (1_000, 100_000))


def _backlog_task(args: tuple[str, str, int, int, int]) -> dict[str, Any]:
    system, workload, max_, n, seed = args
    jobs = backlog(workload, n, random.Random(f"{seed}/{workload}/{max_}"))
    return run(system, workload, max_, seed, jobs=jobs, timeline=(workload, max_) == TIMELINE)


def _variant_task(args: tuple[str, str, int, int, int, float, bool]) -> dict[str, Any]:
    """A backlog run under another model: a status event delay, or queues without FIFO high-throughput
    mode."""
    system, workload, max_, n, seed, delay, high_throughput = args
    jobs = backlog(workload, n, random.Random(f"{seed}/{workload}/{max_}"))
    return run(
        system, workload, max_, seed, jobs=jobs, event_delay=delay, high_throughput_fifo=high_throughput
    )


def variant_tasks(plan: Plan) -> list[tuple[str, Any]]:
    tasks: list[tuple[str, Any]] = []
    for workload, max_ in SENSITIVITY:
        for delay in SENSITIVITY_EVENT_DELAYS:
            for system in SENSITIVITY_SYSTEMS:
                tasks.append(("sensitivity", (system, workload, max_, plan.backlog, plan.seed, delay, True)))
    for workload, max_ in (*WITHOUT_HIGH_THROUGHPUT, (LARGE[0], plan.large_max)):
        n = plan.large_backlog if workload == LARGE[0] else plan.backlog
        args = ("sluice-linger", workload, max_, n, plan.seed, EVENT_DELAY, False)
        tasks.append(("without-high-throughput", args))
    return tasks


def _large_task(args: tuple[str, int, int, int]) -> dict[str, Any]:
    system, max_, n, seed = args
    jobs = backlog(LARGE[0], n, random.Random(f"{seed}/{LARGE[0]}/{max_}"))
    return run(system, LARGE[0], max_, seed, jobs=jobs)


def dag_jobs(plan: Plan) -> list[Any]:
    return dag(plan.dag_fan_ins, plan.dag_chains, random.Random(f"{plan.seed}/dag"))


def dag_tasks(plan: Plan) -> list[tuple[str, Any]]:
    """The DAG with its awaits, and the same jobs as a plain backlog (the calls per start compared)."""
    return [("dag", (DAG_SYSTEM, plan, awaits)) for awaits in (True, False)]


def _dag_task(args: tuple[str, Plan, bool]) -> dict[str, Any]:
    system, plan, awaits = args
    jobs = dag_jobs(plan)
    result = run(
        system,
        "dag" if awaits else "dag-plain",
        plan.dag_max,
        plan.seed,
        jobs=jobs if awaits else without_awaits(jobs),
    )
    return result


def tenant_tasks(plan: Plan) -> list[tuple[str, Any]]:
    """One heavy tenant and four light ones (``TENANT_RUNS``), late and together: each tenant a
    concurrency key; the same jobs without keys; each tenant a tenant of one fair lane; and the
    heavy tenant alone in the fair lane."""
    return [("tenants", (*run, plan)) for run in TENANT_RUNS]


def _tenants_task(args: tuple[str, str, str, int, Plan]) -> dict[str, Any]:
    """One run of the tenants workload, measured by tenant and as one lane of MAX ``tenants_max``
    (its utilisation while it has jobs waiting); a fair lane over its MAX fails the benchmark."""
    workload, system, arrivals, light, plan = args
    jobs = tenants(random.Random(f"{plan.seed}/tenants"), plan.tenants_heavy, arrivals, light)
    if system == SluiceFair.name:  # sent as `sluice enqueue` sends to a fair lane: a group per tenant
        jobs = [replace(j, group=j.ckey or UNKEYED + DEFAULT_LANE) for j in jobs]
    tenant_of = {j.id: j.ckey or "" for j in jobs}
    result = run(
        system,
        workload,
        plan.tenants_max,
        plan.seed,
        jobs=without_keys(jobs) if system == "sluice-linger" else jobs,
        tenant_of=tenant_of,
        lane_of=dict.fromkeys(tenant_of, DEFAULT_LANE),
        lanes=parse_lanes(f"{DEFAULT_LANE}:{plan.tenants_max}", plan.tenants_max),
    )
    result["arrivals"], result["light_tenants"] = arrivals, light
    if system == SluiceFair.name:
        assert result["peak_concurrency"] <= plan.tenants_max and not result["lanes"]["cap_exceeded"], (
            f"{workload}: over MAX: peak {result['peak_concurrency']}/{plan.tenants_max}"
        )
    return result


def lane_tasks(plan: Plan) -> list[tuple[str, Any]]:
    return [("lanes", (workload, system, plan)) for workload, system in LANE_RUNS]


def _lanes_task(args: tuple[str, str, Plan]) -> dict[str, Any]:
    """One run of the lanes workload (``LANE_RUNS``); a lane or the global pool past its MAX fails
    the benchmark."""
    workload, system, plan = args
    jobs = lanes_jobs(
        random.Random(f"{plan.seed}/lanes"),
        bulk=plan.lanes_bulk,
        fast_backlog=plan.lanes_fast_backlog if workload == "lanes-both" else 0,
        fast_for=plan.lanes_fast_for,
    )
    lanes = parse_lanes(SluiceLanes.lanes, plan.lanes_max)
    result = run(
        system,
        workload,
        plan.lanes_max,
        plan.seed,
        jobs=without_lanes(jobs) if workload == "lanes-plain" else jobs,
        lane_of={j.id: j.lane or "" for j in jobs},
        lanes=lanes,
    )
    if workload != "lanes-plain":
        m = result["lanes"]
        assert result["peak_concurrency"] <= plan.lanes_max and not m["cap_exceeded"], (
            f"{workload}: over MAX: global peak {result['peak_concurrency']}, "
            + ", ".join(f"{n} {v['peak_running']}/{v['max']}" for n, v in m["lanes"].items())
        )
    return result


def _trickle_task(args: tuple[str, Plan]) -> dict[str, Any]:
    system, plan = args
    jobs = trickle(
        plan.trickle_jobs, plan.trickle_gap, plan.trickle_duration, random.Random(f"{plan.seed}/trickle")
    )
    return run(system, "trickle", plan.trickle_max, plan.seed, jobs=jobs, keep_latencies=True)


def _idle_task(args: tuple[str, Plan]) -> dict[str, Any]:
    system, plan = args
    return idle(system, plan.idle_hours, plan.seed)


def _cost(task: tuple[str, Any]) -> float:
    """Rough CPU weight, to start the slow runs first."""
    kind, args = task
    if kind in ("scale", "moto"):
        return 5_000.0
    if kind == "semaphore":
        return 50.0
    if kind == "large":
        return args[2] * 1.0
    if kind in ("sensitivity", "without-high-throughput"):
        return args[3] * (0.01 if args[0] in ORACLES else 1.0)
    if kind == "dag":
        return 2_000.0
    if kind == "tenants":
        return 1_000.0
    if kind == "lanes":
        return 1_000.0
    if kind != "backlog":
        return 1.0
    system, _, max_, n, _ = args
    if system in ORACLES:
        return n * 0.01
    if system == "counter-semaphore":
        return n * (40.0 if max_ <= 5 else 1.0)
    if system == "poller":
        return n * 0.05
    return n * 1.0


def _dispatch(task: tuple[str, Any]) -> tuple[str, Any]:
    kind, args = task
    if kind == "backlog":
        return kind, _backlog_task(args)
    if kind == "trickle":
        return kind, _trickle_task(args)
    if kind == "large":
        return kind, _large_task(args)
    if kind in ("sensitivity", "without-high-throughput"):
        return kind, _variant_task(args)
    if kind == "dag":
        return kind, _dag_task(args)
    if kind == "tenants":
        return kind, _tenants_task(args)
    if kind == "lanes":
        return kind, _lanes_task(args)
    if kind == "idle":
        return kind, _idle_task(args)
    if kind == "semaphore":
        return kind, semaphore_bench.run_task(args)
    if kind == "scale":
        from bench.scale import scale

        return kind, scale(list(args.scale_running), list(args.scale_backlog))
    from bench.validate import agreement

    return kind, agreement()


def oracle_tasks(plan: Plan) -> list[tuple[str, Any]]:
    """What the summary against the oracle needs: Sluice as deployed and both oracles on every
    (workload, MAX), MAX 10,000, the status event's sensitivity and the runs on queues without
    high-throughput mode."""
    tasks: list[tuple[str, Any]] = [
        ("backlog", (system, workload, max_, plan.backlog, plan.seed))
        for workload in WORKLOADS
        for max_ in MAXES
        for system in ("sluice-linger", *ORACLES)
    ]
    tasks += [("large", (s, plan.large_max, plan.large_backlog, plan.seed)) for s in LARGE[1]]
    return tasks + variant_tasks(plan)


def idle_tasks(plan: Plan) -> list[tuple[str, Any]]:
    """Payloads enqueued while slots are free (the trickle) and the idle hour, for each system."""
    return [("trickle", (s, plan)) for s in TRICKLE_SYSTEMS] + [("idle", (s, plan)) for s in IDLE_SYSTEMS]


def run_tasks(tasks: list[tuple[str, Any]], workers: int | None = None) -> dict[str, list[Any]]:
    """Run ``tasks`` (the slow ones first) on up to ``workers`` processes; their results by kind."""
    order = sorted(range(len(tasks)), key=lambda i: -_cost(tasks[i]))
    workers = workers or min(2, os.cpu_count() or 1)
    results: list[tuple[str, Any] | None] = [None] * len(tasks)
    if workers <= 1:
        for i in order:
            results[i] = _dispatch(tasks[i])
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {i: pool.submit(_dispatch, tasks[i]) for i in order}
            for i, f in futures.items():
                results[i] = f.result()
    out: dict[str, list[Any]] = {}
    for item in results:
        assert item is not None
        out.setdefault(item[0], []).append(item[1])
    return out


def execute(plan: Plan, workers: int | None = None, *, moto: bool = True) -> dict[str, Any]:
    tasks: list[tuple[str, Any]] = []
    for workload in WORKLOADS:
        for max_ in MAXES:
            for system in (*MAIN_SYSTEMS, *VARIANTS, *ORACLES):
                tasks.append(("backlog", (system, workload, max_, plan.backlog, plan.seed)))
            if workload in REFILL_ONE[1]:
                tasks.append(("backlog", (REFILL_ONE[0], workload, max_, plan.backlog, plan.seed)))
    tasks += [("large", (s, plan.large_max, plan.large_backlog, plan.seed)) for s in LARGE[1]]
    tasks += dag_tasks(plan)
    tasks += variant_tasks(plan)
    tasks += tenant_tasks(plan)
    tasks += lane_tasks(plan)
    tasks += idle_tasks(plan)
    tasks += [("semaphore", a) for a in semaphore_bench.plan_runs(plan.semaphore_executions, plan.seed)]
    tasks.append(("scale", plan))
    if moto:
        tasks.append(("moto", None))
    grouped = run_tasks(tasks, workers)
    out: dict[str, Any] = {
        kind: grouped.get(kind, [])
        for kind in (
            "backlog",
            "trickle",
            "idle",
            "semaphore",
            "large",
            "dag",
            "tenants",
            "lanes",
            "sensitivity",
            "without-high-throughput",
        )
    }
    for kind in ("scale", "moto"):
        out[kind] = grouped[kind][0] if kind in grouped else None
    return out

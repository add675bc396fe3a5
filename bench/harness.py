"""One benchmark run: a workload, a system, a MAX and a seed, simulated to the end in virtual time.

    t0            payloads enqueued (a backlog at t0, or arrivals over time)
    t0 + 30 s     first scheduled tick, then one every 60 s
    StartExecution ──► the execution ends after its job's duration
    end + 0.5 s   the status event reaches the system (if it subscribes)

The run ends when every payload has ended or was dead-lettered. The same seed gives the same jobs to
every system, and the same numbers on every run.
"""

from __future__ import annotations

import bisect
import json
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.aws import Meter
from bench.counter_semaphore import CounterSemaphoreSystem
from bench.model import EVENT_DELAY, TICK_PHASE, TICK_SECONDS, Context, System
from bench.oracle import OracleEvent, OracleFair, OracleZero
from bench.poller import PollerSystem
from bench.pricing import cost_usd, per_million
from bench.quotas import Quotas
from bench.sim import T0, Sim
from bench.sluice_system import (
    SluiceFair,
    SluiceKeyed,
    SluiceLanes,
    SluiceLanesNoWait,
    SluiceLean,
    SluiceLinger,
    SluiceRefillOne,
    SluiceReleaseThenRefill,
    SluiceSystem,
    SluiceWide,
    SluiceWoken,
)
from sluice.core.records import Lane
from sluice.features.awaits import AWAITS_ATTRIBUTE
from sluice.features.keys import CONCURRENCY_KEY_ATTRIBUTE
from sluice.features.lanes import DEFAULT_LANE

SYSTEMS: dict[str, type[System]] = {
    cls.name: cls
    for cls in (
        SluiceSystem,
        SluiceLinger,
        SluiceWoken,
        PollerSystem,
        CounterSemaphoreSystem,
        SluiceReleaseThenRefill,
        SluiceRefillOne,
        SluiceLean,
        SluiceWide,
        SluiceKeyed,
        SluiceFair,
        SluiceLanes,
        SluiceLanesNoWait,
        OracleEvent,
        OracleZero,
        OracleFair,
    )
}
ORACLES = (OracleEvent.name, OracleZero.name)
MAIN_SYSTEMS = ("sluice", "sluice-linger", "poller", "counter-semaphore")


# -- workloads -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    id: str
    enqueue_at: float  # seconds after t0
    duration: float
    body: str
    awaits: tuple[str, ...] = ()  # keys this job awaits (the ``sluice-awaits`` attribute)
    ckey: str | None = None  # its concurrency key (the ``sluice-concurrency-key`` attribute)
    lane: str | None = None  # its lane (sluice.features.lanes): the producer sends it to that lane's queue
    group: str | None = None  # its FIFO message group (None: its own, the job's id)


DURATIONS = {
    "fixed30": "every job runs 30 s",
    "exp30": "exponential, mean 30 s",
    "lognormal": "lognormal, mean 30 s, sigma 1.2 (median 14.6 s, heavy tail)",
    "fixed5": "every job runs 5 s",
    "fixed60": "every job runs 60 s",
    "exp10": "exponential, mean 10 s",
}
LOGNORMAL_SIGMA = 1.2


def durations(kind: str, n: int, rng: random.Random) -> list[float]:
    if kind == "fixed30":
        return [30.0] * n
    if kind == "fixed5":
        return [5.0] * n
    if kind == "fixed60":
        return [60.0] * n
    if kind == "exp30":
        return [round(max(0.1, rng.expovariate(1 / 30)), 3) for _ in range(n)]
    if kind == "exp10":
        return [round(max(0.1, rng.expovariate(1 / 10)), 3) for _ in range(n)]
    if kind == "lognormal":
        mu = math.log(30) - LOGNORMAL_SIGMA**2 / 2
        return [round(max(0.1, rng.lognormvariate(mu, LOGNORMAL_SIGMA)), 3) for _ in range(n)]
    raise ValueError(kind)


def body(job_id: str, i: int) -> str:
    return f'{{"id":"{job_id}","task":"bench","seq":{i}}}'


def backlog(kind: str, n: int, rng: random.Random) -> list[Job]:
    return [
        Job(f"job-{i:06d}", 0.0, d, body(f"job-{i:06d}", i)) for i, d in enumerate(durations(kind, n, rng))
    ]


# The DAG workload: fan-ins of DAG_FAN_IN nodes into one, and chains of DAG_CHAIN nodes.
DAG_FAN_IN = 50
DAG_CHAIN = 10
DAG_DURATIONS = "exp30"


def dag(fan_ins: int, chains: int, rng: random.Random) -> list[Job]:
    """``fan_ins`` fan-ins (``fanFF-inII``, 50 of them, each awaited by ``fanFF-out``) and ``chains``
    chains (``chainCC-0`` … ``chainCC-9``, each link awaiting the one before), every node enqueued at
    t0 in an order shuffled by ``rng`` (a dependent may arrive before what it awaits), with
    ``DAG_DURATIONS`` durations drawn from ``rng``. 10 fan-ins and 49 chains: 1,000 nodes, 451 of them
    dependents (10 awaiting 50 keys each, 441 awaiting one)."""
    nodes: list[tuple[str, tuple[str, ...]]] = []
    for f in range(fan_ins):
        leaves = tuple(f"fan{f:02d}-in{i:02d}" for i in range(DAG_FAN_IN))
        nodes += [(k, ()) for k in leaves]
        nodes.append((f"fan{f:02d}-out", leaves))
    for c in range(chains):
        links = [f"chain{c:02d}-{i}" for i in range(DAG_CHAIN)]
        nodes += [(k, (links[i - 1],) if i else ()) for i, k in enumerate(links)]
    rng.shuffle(nodes)
    lengths = durations(DAG_DURATIONS, len(nodes), rng)
    return [
        Job(k, 0.0, d, body(k, i), awaits)
        for i, ((k, awaits), d) in enumerate(zip(nodes, lengths, strict=True))
    ]


def without_awaits(jobs: list[Job]) -> list[Job]:
    """The same jobs as a plain backlog: what the DAG's calls per start are compared with."""
    return [Job(j.id, j.enqueue_at, j.duration, j.body) for j in jobs]


# The tenants workload: one heavy tenant's backlog and four light tenants, in two arrival patterns.
# "late": heavy's backlog at t0, the light tenants at 120 s, while it waits (heavy holds every slot
# by then). "together": heavy's backlog, then the light tenants' jobs, behind all of it in the
# queue, at one instant (120 s: the scheduled launcher lingers then, as for the late light tenants;
# at t0 every job would wait for the first tick, 30 s, whatever the scheduling).
TENANT_HEAVY = 1_000
TENANT_LIGHT = 4
TENANT_LIGHT_JOBS = 10
TENANT_LIGHT_AT = 120.0  # seconds after t0: the heavy tenant is backlogged by then
TENANT_TOGETHER_AT = 120.0  # seconds after t0: every tenant's jobs, heavy's first
TENANT_ARRIVALS = ("late", "together")
TENANT_DURATIONS = "exp30"


def tenants(
    rng: random.Random, heavy: int = TENANT_HEAVY, arrivals: str = "late", light: int = TENANT_LIGHT
) -> list[Job]:
    """``heavy`` (``heavy`` jobs, 1,000 in the benchmark) and ``light0`` … (``light`` tenants of 10
    jobs each), every job under its tenant's concurrency key; ``exp30`` durations, heavy's drawn
    first (the same in every pattern). ``arrivals``: ``late``, heavy's at t0 and the light tenants'
    at 120 s; ``together``, heavy's and then the light tenants' at 120 s, in that order."""
    if arrivals not in TENANT_ARRIVALS:
        raise ValueError(arrivals)
    heavy_at, light_at = (0.0, TENANT_LIGHT_AT) if arrivals == "late" else (TENANT_TOGETHER_AT,) * 2
    plan = [("heavy", heavy, heavy_at)] + [(f"light{t}", TENANT_LIGHT_JOBS, light_at) for t in range(light)]
    specs = [(tenant, i, at) for tenant, n, at in plan for i in range(n)]
    lengths = durations(TENANT_DURATIONS, len(specs), rng)
    return [
        Job(f"{tenant}-{i:04d}", at, d, body(f"{tenant}-{i:04d}", i), ckey=tenant)
        for (tenant, i, at), d in zip(specs, lengths, strict=True)
    ]


def without_keys(jobs: list[Job]) -> list[Job]:
    """The same jobs without concurrency keys: arrival order alone."""
    return [Job(j.id, j.enqueue_at, j.duration, j.body) for j in jobs]


def tenant_metrics(
    jobs: list[Job], recorder: Recorder, tenant_of: dict[str, str], cap: int | None
) -> dict[str, Any]:
    """Per tenant: start latency (start − enqueue) p50/p99 and the most of its jobs running at once
    (from Step Functions' starts and ends); the light tenants' latencies together; and Jain's
    fairness index of running jobs among the tenants with jobs not yet started, sampled each second
    while two or more are backlogged (its mean and its lowest sample). ``cap``: a tenant's cap, if
    any (a run over it is reported)."""
    starts = recorder.first_start
    ends = {k: t for k, (t, _) in recorder.ends.items()}
    by_tenant: dict[str, list[Job]] = {}
    for j in jobs:
        by_tenant.setdefault(tenant_of[j.id], []).append(j)
    out: dict[str, Any] = {"cap": cap, "tenants": {}}
    light: list[float] = []
    for tenant, tj in sorted(by_tenant.items()):
        lat = [starts[j.id] - (T0 + j.enqueue_at) for j in tj if j.id in starts]
        events = sorted(
            [(starts[j.id], 1) for j in tj if j.id in starts] + [(ends[j.id], -1) for j in tj if j.id in ends]
        )
        running = peak = 0
        for _, d in events:
            running += d
            peak = max(peak, running)
        out["tenants"][tenant] = {
            "jobs": len(tj),
            "latency_p50_s": _r(percentile(lat, 50)),
            "latency_p99_s": _r(percentile(lat, 99)),
            "peak_running": peak,
        }
        if tenant != "heavy":
            light += lat
    out["light_latency_p50_s"] = _r(percentile(light, 50))
    out["light_latency_p99_s"] = _r(percentile(light, 99))
    out["cap_exceeded"] = cap is not None and any(t["peak_running"] > cap for t in out["tenants"].values())
    samples = []
    first = T0 + min(j.enqueue_at for j in jobs)
    last = max(starts.values(), default=first)
    t = first
    while t <= last:
        counts = []
        for tj in by_tenant.values():
            arrived = [j for j in tj if T0 + j.enqueue_at <= t]
            if any(starts.get(j.id, float("inf")) > t for j in arrived):
                counts.append(
                    sum(
                        1
                        for j in arrived
                        if starts.get(j.id, float("inf")) <= t < ends.get(j.id, float("inf"))
                    )
                )
        if len(counts) >= 2 and sum(counts):
            samples.append(sum(counts) ** 2 / (len(counts) * sum(c * c for c in counts)))
        t += 1.0
    out["jain_backlogged"] = _r(sum(samples) / len(samples)) if samples else None
    out["jain_min"] = _r(min(samples)) if samples else None
    out["jain_samples"] = len(samples)
    return out


# The lanes workload (system ``sluice-lanes``: ``fast:10:1,bulk:50:0`` under a global MAX of 50): a
# backlog in the big lane at t0, and the priority lane's jobs either trickling in while it waits or
# backlogged at t0 too.
LANE_BULK = 2_000
LANE_BULK_DURATIONS = "exp30"
LANE_FAST_DURATIONS = "exp10"
LANE_FAST_GAP = 3.0  # mean seconds between two fast jobs (Poisson)
LANE_FAST_FROM = 60.0  # the trickle starts once the first tick has filled the slots
LANE_FAST_FOR = 600.0
LANE_FAST_BACKLOG = 300
PASSED_OVER_AFTER = 1.0  # a job waiting longer than this (status event 0.5 s, the refill) is passed over


def lanes_jobs(
    rng: random.Random,
    *,
    bulk: int = LANE_BULK,
    fast_backlog: int = 0,
    fast_for: float = LANE_FAST_FOR,
) -> list[Job]:
    """``bulk`` jobs in lane ``bulk`` at t0 (``exp30``), and lane ``fast`` (``exp10``): with
    ``fast_backlog``, that many jobs at t0; else a Poisson trickle, one every ``LANE_FAST_GAP`` s on
    average from ``LANE_FAST_FROM`` s for ``fast_for`` s."""
    lengths = durations(LANE_BULK_DURATIONS, bulk, rng)
    jobs = [
        Job(f"bulk-{i:05d}", 0.0, d, body(f"bulk-{i:05d}", i), lane="bulk") for i, d in enumerate(lengths)
    ]
    if fast_backlog:
        arrivals = [0.0] * fast_backlog
    else:
        arrivals, t = [], LANE_FAST_FROM
        while True:
            t += rng.expovariate(1 / LANE_FAST_GAP)
            if t >= LANE_FAST_FROM + fast_for:
                break
            arrivals.append(round(t, 3))
    lengths = durations(LANE_FAST_DURATIONS, len(arrivals), rng)
    jobs += [
        Job(f"fast-{i:05d}", at, d, body(f"fast-{i:05d}", bulk + i), lane="fast")
        for i, (at, d) in enumerate(zip(arrivals, lengths, strict=True))
    ]
    return jobs


def without_lanes(jobs: list[Job]) -> list[Job]:
    """The same jobs in one queue, without lanes: arrival order alone."""
    return [Job(j.id, j.enqueue_at, j.duration, j.body) for j in jobs]


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _intersect(x: list[tuple[float, float]], y: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def lane_metrics(
    jobs: list[Job],
    recorder: Recorder,
    lanes: Sequence[Lane],
    max_: int,
    lane_of: dict[str, str],
    first_tick: float = T0 + TICK_PHASE,
) -> dict[str, Any]:
    """Per lane, from Step Functions' starts and ends: start latency (start − enqueue) p50/p99 of its
    jobs enqueued while another lane was backlogged; the wait from the first slot freed after the
    enqueue (the end of any execution; the enqueue itself when a slot was free) to the start; the most
    running at once; and, while the lane is backlogged (a job of it enqueued and not started, from the
    first tick on), its time-average running against its MAX and against its share (its MAX, or what
    the global MAX leaves beside the lanes of higher priority, whichever is smaller, at each instant),
    and the global utilisation. The same over the time every lane with jobs is backlogged. ``lane_of``
    gives each job's lane (the same jobs run without lanes are measured by the lanes they had)."""
    starts = recorder.first_start
    ends = {k: t for k, (t, _) in recorder.ends.items()}
    names = [lane.name for lane in lanes]
    limit = {lane.name: lane.max for lane in lanes}
    priority = {lane.name: lane.priority for lane in lanes}
    by_lane: dict[str, list[Job]] = {}
    for j in jobs:
        by_lane.setdefault(lane_of.get(j.id, DEFAULT_LANE), []).append(j)
    # running per lane, piecewise constant between starts and ends
    events = sorted(
        [(starts[j.id], 1, lane_of.get(j.id, DEFAULT_LANE)) for j in jobs if j.id in starts]
        + [(ends[j.id], -1, lane_of.get(j.id, DEFAULT_LANE)) for j in jobs if j.id in ends]
    )
    segments: list[tuple[float, float, dict[str, int]]] = []
    running = dict.fromkeys(names, 0)
    peak = dict.fromkeys(names, 0)
    peak_total = 0
    for k, (t, d, lane) in enumerate(events):
        running[lane] += d
        peak[lane] = max(peak[lane], running[lane])
        peak_total = max(peak_total, sum(running.values()))
        if k + 1 < len(events) and events[k + 1][0] > t:
            segments.append((t, events[k + 1][0], dict(running)))
    backlogged = {
        name: _merge(
            [
                (max(T0 + j.enqueue_at, first_tick), starts[j.id])
                for j in by_lane.get(name, [])
                if j.id in starts
            ]
        )
        for name in names
    }

    def share(name: str, c: dict[str, int]) -> int:
        above = sum(c[n] for n in names if priority[n] > priority[name])
        return min(limit[name], max(0, max_ - above))

    def over(window: list[tuple[float, float]]) -> dict[str, Any]:
        span = sum(b - a for a, b in window)
        run = dict.fromkeys(names, 0.0)
        shares = dict.fromkeys(names, 0.0)
        total = 0.0
        i = 0
        for a, b in window:
            while i < len(segments) and segments[i][1] <= a:
                i += 1
            k = i
            while k < len(segments) and segments[k][0] < b:
                s0, s1, c = segments[k]
                dt = min(b, s1) - max(a, s0)
                if dt > 0:
                    for n in names:
                        run[n] += c[n] * dt
                        shares[n] += share(n, c) * dt
                    total += sum(c.values()) * dt
                k += 1
            # before the first start and after the last end nothing runs: shares are whole
            covered = sum(max(0.0, min(b, s[1]) - max(a, s[0])) for s in segments[i:k])
            for n in names:
                shares[n] += share(n, dict.fromkeys(names, 0)) * (b - a - covered)
        if span <= 0:
            return {"seconds": 0.0}
        return {
            "seconds": _r(span, 1),
            "lanes": {
                n: {
                    "running_avg": _r(run[n] / span, 2),
                    "utilisation_max": _r(run[n] / (limit[n] * span)) if limit[n] else None,
                    "share_avg": _r(shares[n] / span, 2),
                    "utilisation_share": _r(run[n] / shares[n]) if shares[n] else None,
                }
                for n in names
                if by_lane.get(n)
            },
            "global_utilisation": _r(total / (max_ * span)),
        }

    # slots held per lane: from the start to the release, which follows the status event
    held_events = sorted(
        [(starts[j.id], 1, lane_of.get(j.id, DEFAULT_LANE)) for j in jobs if j.id in starts]
        + [(ends[j.id] + EVENT_DELAY, -1, lane_of.get(j.id, DEFAULT_LANE)) for j in jobs if j.id in ends]
    )

    def passed_over(name: str) -> int:
        """Starts in lanes of lower priority once ``name`` has had a free slot (its slots held: from
        the start to the release, which follows the status event) and a job waiting, both for more
        than ``PASSED_OVER_AFTER`` s: slots that went past the priority lane, not the race of a
        completion that read the lanes' rooms a moment before the priority lane's slot was released."""
        waiting = _merge(
            [
                (T0 + j.enqueue_at + PASSED_OVER_AFTER, starts[j.id])
                for j in by_lane.get(name, [])
                if j.id in starts
            ]
        )
        if not waiting:
            return 0
        heads = [a for a, _ in waiting]
        n = held = 0
        free_since = -math.inf
        for t, d, lane in held_events:
            if lane == name:
                if d < 0 and held == limit[name]:
                    free_since = t
                held += d
                continue
            if d < 0 or priority[lane] >= priority[name] or held >= limit[name]:
                continue
            k = bisect.bisect_right(heads, t) - 1
            if t - free_since > PASSED_OVER_AFTER and k >= 0 and waiting[k][0] <= t < waiting[k][1]:
                n += 1
        return n

    end_times = sorted(ends.values())
    out_lanes: dict[str, Any] = {}
    for name in names:
        lane_jobs = by_lane.get(name, [])
        if not lane_jobs:
            out_lanes[name] = {"max": limit[name], "priority": priority[name], "jobs": 0, "peak_running": 0}
            continue
        others = _merge([iv for n in names if n != name for iv in backlogged[n]])
        latencies, waits = [], []
        for j in lane_jobs:
            if j.id not in starts:
                continue
            enqueued, start = T0 + j.enqueue_at, starts[j.id]
            k = bisect.bisect_right([a for a, _ in others], enqueued) - 1
            if k >= 0 and others[k][0] <= enqueued < others[k][1]:
                latencies.append(start - enqueued)
            e = bisect.bisect_left(end_times, enqueued)
            freed = end_times[e] if e < len(end_times) else math.inf
            waits.append(start - freed if freed <= start else start - enqueued)
        mine = over(backlogged[name])
        out_lanes[name] = {
            "max": limit[name],
            "priority": priority[name],
            "jobs": len(lane_jobs),
            "started": sum(1 for j in lane_jobs if j.id in starts),
            "latency_jobs": len(latencies),
            "latency_p50_s": _r(percentile(latencies, 50)),
            "latency_p99_s": _r(percentile(latencies, 99)),
            "slot_wait_p50_s": _r(percentile(waits, 50)),
            "slot_wait_p99_s": _r(percentile(waits, 99)),
            "peak_running": peak[name],
            "passed_over": passed_over(name),
            "backlogged_s": mine["seconds"],
            "while_backlogged": {
                **mine.get("lanes", {}).get(name, {}),
                "global_utilisation": mine.get("global_utilisation"),
            },
        }
    busy = [backlogged[n] for n in names if by_lane.get(n)]
    together = busy[0] if busy else []
    for window in busy[1:]:
        together = _intersect(together, window)
    return {
        "max": max_,
        "lanes": out_lanes,
        "peak_running": peak_total,
        "all_backlogged": over(together),
        "cap_exceeded": peak_total > max_ or any(peak[n] > limit[n] for n in names),
    }


def trickle(n: int, mean_gap: float, duration: float, rng: random.Random) -> list[Job]:
    """Payloads arriving one by one (Poisson) while slots are free and nothing finishes."""
    t, jobs = 5.0, []
    for i in range(n):
        t += rng.expovariate(1 / mean_gap)
        jobs.append(Job(f"job-{i:06d}", round(t, 3), duration, body(f"job-{i:06d}", i)))
    return jobs


# -- what happened ---------------------------------------------------------------------------------------


class Recorder:
    """Starts and ends as Step Functions sees them, and the metrics derived from them.

    Start latency pairs each start with the oldest free slot (FIFO): a slot is free from t0 or from the
    end of the execution that held it; the latency is ``start - max(enqueued, slot free)``. The refill
    latency is the same, for slots freed by an execution's end only. A start with no free slot (over
    MAX) pairs with nothing and its slot is not freed again at its end.
    """

    def __init__(
        self,
        sim: Sim,
        max_: int,
        jobs: list[Job],
        *,
        timeline: bool = False,
        event_delay: float = EVENT_DELAY,
    ) -> None:
        self.sim = sim
        self.event_delay = event_delay
        self.max = max_
        self.jobs = jobs
        self.by_body = {j.body: j for j in jobs}
        self.system: System | None = None
        self.running = 0
        self.peak = 0
        self.started = 0
        self.ended = 0
        self.busy = 0.0
        self.last_end = T0
        self.first_start: dict[str, float] = {}
        self.ends: dict[str, tuple[float, str]] = {}  # job id -> (first end, status)
        self.duplicates = 0
        self.latencies: list[float] = []
        self.refill_latencies: list[float] = []
        self.free_since: deque[tuple[float, bool]] = deque([(T0, False)] * max_)
        self.overdraft = 0
        self.over_max_seconds = 0.0
        self._changed_at = T0
        self.timeline: list[tuple[float, int]] | None = [(0.0, 0)] if timeline else None

    def _change(self, delta: int) -> None:
        now = self.sim.now
        if self.running > self.max:
            self.over_max_seconds += now - self._changed_at
        self._changed_at = now
        self.running += delta
        self.peak = max(self.peak, self.running)
        if self.timeline is not None:
            self.timeline.append((round(now - T0, 3), self.running))

    def on_start(self, name: str, input_json: str) -> None:
        job = self.by_body[input_json]
        now = self.sim.now
        self.started += 1
        if job.id in self.first_start:
            self.duplicates += 1
        else:
            self.first_start[job.id] = now
        if self.free_since:
            free, refill = self.free_since.popleft()
            latency = now - max(T0 + job.enqueue_at, free)
            self.latencies.append(latency)
            if refill:
                self.refill_latencies.append(latency)
        else:
            self.overdraft += 1
        self._change(+1)
        self.sim.at(now + job.duration, self.on_end, name, job)

    def on_end(self, name: str, job: Job) -> None:
        assert self.system is not None
        info = self.system.sfn.finish(name)
        now = self.sim.now
        self.ends.setdefault(job.id, (now, info.status))
        self.ended += 1
        self.busy += job.duration
        self.last_end = now
        if self.overdraft:
            self.overdraft -= 1
        else:
            self.free_since.append((now, True))
        self._change(-1)
        if self.system.status_events:
            delay = self.system.event_delay if self.system.event_delay is not None else self.event_delay
            self.sim.at(now + delay, self.system.on_status_event, info)

    def done(self) -> bool:
        assert self.system is not None
        return len(self.first_start) + self.system.dead >= len(self.jobs) and self.running == 0


# -- a run -----------------------------------------------------------------------------------------------


def run_costs(meter: Meter, functions: Sequence[Any], *, fifo: bool) -> tuple[int, dict[str, float]]:
    """What a run cost: its log bytes, and its price by service (Lambda by architecture)."""
    gb_s: dict[str, float] = {}
    for f in functions:
        gb_s[f.architecture] = gb_s.get(f.architecture, 0.0) + f.gb_seconds
    log_bytes = meter.log_bytes + sum(f.log_bytes for f in functions)
    costs = cost_usd(
        calls=meter.calls,
        rru=meter.rru,
        wru=meter.wru,
        lambda_requests=sum(f.invocations for f in functions),
        gb_seconds=gb_s,
        log_bytes=log_bytes,
        fifo=fifo,
    )
    return log_bytes, costs


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def _enqueue(system: System, job: Job, attributes: dict[str, str] | None) -> None:
    """A producer sends ``job`` (to its lane's queue) and, for a system whose producer does, wakes it."""
    system.queue_for(job.lane).send(job.body, job.group or job.id, attributes)
    system.on_enqueue()


def run(
    system_name: str,
    workload: str,
    max_: int,
    seed: int,
    *,
    jobs: list[Job],
    horizon: float | None = None,
    timeline: bool = False,
    keep_latencies: bool = False,
    latency_scale: float = 1.0,
    tenant_of: dict[str, str] | None = None,
    lane_of: dict[str, str] | None = None,
    lanes: Sequence[Lane] = (),
    event_delay: float = EVENT_DELAY,
    high_throughput_fifo: bool = True,
    quotas: Quotas | None = None,
) -> dict[str, Any]:
    """Simulate ``system_name`` on ``jobs`` under ``max_`` and return its metrics. ``tenant_of`` and
    ``lane_of`` (each job's tenant, its lane among ``lanes``) add the tenants' and the lanes' metrics.
    ``event_delay``: the status event's delay; ``high_throughput_fifo``: SQS's quotas with the
    queues' high-throughput mode on, as deployed (False: 300 calls a second per action;
    bench.quotas); ``quotas``: other quotas than AWS's (tests)."""
    sim = Sim(T0 - TICK_SECONDS)  # room for a tick before the first payload (System.first_tick)
    quotas = quotas or Quotas(high_throughput_fifo=high_throughput_fifo)
    meter = Meter(sim.clock, sim, latency_scale, quotas, random.Random(f"{seed}/{system_name}/sdk"))
    recorder = Recorder(sim, max_, jobs, timeline=timeline, event_delay=event_delay)
    ctx = Context(sim, meter, max_, recorder.on_start, random.Random(f"{seed}/{system_name}/names"))
    system = SYSTEMS[system_name](ctx)
    recorder.system = system

    for job in jobs:
        attributes = {AWAITS_ATTRIBUTE: json.dumps(list(job.awaits))} if job.awaits else {}
        if job.ckey is not None:
            attributes[CONCURRENCY_KEY_ATTRIBUTE] = job.ckey
        sim.at(T0 + job.enqueue_at, _enqueue, system, job, attributes or None)
    ticking = [True]

    def tick() -> None:
        if ticking[0]:
            now = sim.now
            system.on_tick()
            sim.at(now + TICK_SECONDS, tick)

    first_tick = system.first_tick(T0) if jobs else T0 + TICK_PHASE
    sim.at(first_tick, tick)
    total_work = sum(j.duration for j in jobs)
    ideal = max(total_work / max_, max((j.duration for j in jobs), default=0.0))
    if horizon is None:
        horizon = 40 * ideal + 4 * 3600
    try:
        sim.run(until=T0 + horizon, stop=recorder.done if jobs else None)
        finished = recorder.done()
        end = sim.now
        ticking[0] = False
        sim.run(until=end + 300)  # let invocations in flight finish (they are billed)
    finally:
        sim.close()

    makespan = recorder.last_end - T0
    functions = system.functions
    log_bytes, costs = run_costs(meter, functions, fifo=system.fifo)
    started = recorder.started
    firsts = sorted(recorder.first_start.values())
    first_round = min(max_, len(jobs))  # the jobs that fit in the empty slots
    total_calls = sum(meter.calls.values())
    ddb_calls = sum(n for api, n in meter.calls.items() if api.startswith("dynamodb:"))
    result: dict[str, Any] = {
        "system": system_name,
        "workload": workload,
        "max": max_,
        "jobs": len(jobs),
        "finished": finished,
        "started": started,
        "completed": recorder.ended,
        "dead_lettered": system.dead,
        "duplicate_starts": recorder.duplicates,
        "api_calls_per_start": _r(total_calls / started if started else None, 2),
        "dynamodb_calls_per_start": _r(ddb_calls / started if started else None, 2),
        "calls_by_api": dict(sorted(meter.calls.items())),
        "calls_by_api_per_start": {
            api: round(n / started, 3) for api, n in sorted(meter.calls.items()) if started
        },
        "utilisation": _r(recorder.busy / (max_ * makespan) if makespan > 0 else None),
        "makespan_s": _r(makespan, 1),
        "ideal_s": _r(ideal, 1),
        "makespan_ratio": _r(makespan / ideal if ideal > 0 else None),
        "start_latency_p50_s": _r(percentile(recorder.latencies, 50)),
        "start_latency_p99_s": _r(percentile(recorder.latencies, 99)),
        "refill_latency_p50_s": _r(percentile(recorder.refill_latencies, 50)),
        "refill_latency_p99_s": _r(percentile(recorder.refill_latencies, 99)),
        "peak_concurrency": recorder.peak,
        # From the first tick to the start that fills the last empty slot.
        "fill_s": _r(firsts[first_round - 1] - max(first_tick, T0), 1)
        if first_round and len(firsts) >= first_round
        else None,
        "over_max_seconds": _r(recorder.over_max_seconds, 1),
        "first_tick_s": round(first_tick - T0, 1),
        "status_event_delay_s": event_delay if system.event_delay is None else system.event_delay,
        "high_throughput_fifo": high_throughput_fifo,
        "refused_by_api": dict(sorted(meter.refused.items())),
        "cost_per_million_usd": per_million(costs, started)["total"],
        "cost_per_million_by_service_usd": per_million(costs, started),
        "dynamodb_capacity": {"rru": round(meter.rru), "wru": round(meter.wru)},
        "dynamodb_wru_per_start": _r(meter.wru / started if started else None, 1),
        "hot_item_wru_per_start": {
            item: round(wru / started, 1) for item, wru in sorted(meter.hot_totals.items()) if started
        },
        "hot_item_writes_per_start": {
            item: round(n / started, 2) for item, n in sorted(meter.hot_writes.items()) if started
        },
        "lambda": {
            f.name: {
                "memory_mb": f.memory_mb,
                "architecture": f.architecture,
                "invocations": f.invocations,
                "gb_seconds": round(f.gb_seconds, 2),
                "cold_starts": f.cold_starts,
                "peak_concurrent": f.peak_running,
                "over_timeout": f.over_timeout,
                "errors": f.errors,
                "error_sites": dict(sorted(f.error_sites.items())),
            }
            for f in functions
        },
        "log_bytes": log_bytes,
        "peak_rate_per_s": {k: v for k, v in meter.peak_rates().items()},
        "peak_item_wcu_per_s": meter.peak_item_wcu(),
        "max_item_kb": {k: round(v / 1024, 1) for k, v in sorted(meter.max_item_bytes.items())},
        "quota_warnings": meter.quota_warnings(),
        "_costs_usd": costs,
    }
    if any(j.awaits for j in jobs):
        result["dag"] = dag_metrics(jobs, recorder, system.queue.requeued)
    if tenant_of is not None:
        keyed = any(j.ckey for j in jobs)
        result["tenants"] = tenant_metrics(
            jobs, recorder, tenant_of, getattr(system, "tenant_cap", None) if keyed else None
        )
    if lane_of is not None:
        result["lanes"] = lane_metrics(jobs, recorder, lanes, max_, lane_of, max(first_tick, T0))
    if timeline:
        result["_timeline"] = recorder.timeline
    if keep_latencies:
        result["_latencies"] = [round(x, 3) for x in recorder.latencies]
        result["_start_times"] = [round(t - T0, 3) for t in firsts]
    return result


def dag_metrics(jobs: list[Job], recorder: Recorder, requeued: dict[str, float]) -> dict[str, Any]:
    """For each dependent that started: the wait from its last awaited receipt (the end of the last
    awaited execution, plus the status event's delay) to its start; for those parked, the part of it
    until Sluice sent it back to the queue (the wake-up). A start before every awaited execution ended
    SUCCEEDED is a violation."""
    waits, wakes, violations, starts = [], [], [], {}
    for job in jobs:
        start = recorder.first_start.get(job.id)
        if start is not None:
            starts[job.id] = round(start - T0, 3)
        if not job.awaits or start is None:
            continue
        ends = [recorder.ends.get(k) for k in job.awaits]
        if any(e is None or e[0] > start or e[1] != "SUCCEEDED" for e in ends):
            violations.append(job.id)
            continue
        receipt = max(e[0] for e in ends if e is not None) + EVENT_DELAY
        waits.append(start - receipt)
        if job.id in requeued:
            wakes.append(requeued[job.id] - receipt)
    dependents = sum(1 for j in jobs if j.awaits)
    return {
        "nodes": len(jobs),
        "dependents": dependents,
        "dependents_started": len(waits) + len(violations),
        "parked": sum(1 for j in jobs if j.awaits and j.id in requeued),
        "violations": violations,
        "wait_p50_s": _r(percentile(waits, 50)),
        "wait_p99_s": _r(percentile(waits, 99)),
        "wait_max_s": _r(max(waits) if waits else None),
        "waits_within_1s": sum(1 for w in waits if w <= 1.0),
        "wake_p50_s": _r(percentile(wakes, 50)),
        "wake_p99_s": _r(percentile(wakes, 99)),
        "_starts": starts,
        "_ends": {k: [round(t - T0, 3), status] for k, (t, status) in recorder.ends.items()},
    }


def idle(system_name: str, hours: float = 1.0, seed: int = 0) -> dict[str, Any]:
    """A system with nothing to do, for ``hours``: what standing by costs."""
    return run(system_name, "idle", 10, seed, jobs=[], horizon=hours * 3600)

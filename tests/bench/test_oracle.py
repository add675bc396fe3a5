"""The oracles (bench/oracle.py), the quotas AWS enforces (bench/quotas.py) and the arrival a
lingering launcher sees, at tiny scale."""

from __future__ import annotations

import random

import pytest

from bench.aws import Meter, SimExecutions, SimQueue
from bench.harness import Job, Recorder, backlog, body, run
from bench.model import EVENT_DELAY, Context
from bench.oracle import OracleEvent, OracleFair, OracleZero
from bench.oracle_report import oracle_section, with_oracle
from bench.quotas import HIGH_THROUGHPUT_FIFO_PER_ACTION, SDK_ATTEMPTS, SQS_FIFO_PER_ACTION, Quotas
from bench.sim import T0, LambdaFunction, Sim
from sluice.core.errors import TransientError
from sluice.features.keys import CONCURRENCY_KEY_ATTRIBUTE

SYSTEMS = ("sluice-linger", "sluice", "poller", "counter-semaphore")


def _jobs(kind: str, n: int) -> list[Job]:
    return backlog(kind, n, random.Random(f"7/{kind}"))


@pytest.mark.parametrize("kind", ["fixed5", "exp30"])
def test_no_system_beats_o_event_and_o_event_does_not_beat_o_0(kind):
    jobs = _jobs(kind, 30)
    util = {s: run(s, kind, 4, 7, jobs=jobs)["utilisation"] for s in (*SYSTEMS, "oracle-event", "oracle-0")}

    assert util["oracle-0"] >= util["oracle-event"]
    assert all(util[s] <= util["oracle-event"] for s in SYSTEMS), util


def _oracle_run(cls: type, max_: int, jobs: list[Job]) -> Recorder:
    """An oracle on ``jobs`` as the harness runs it, returning what Step Functions saw."""
    sim = Sim(T0)
    meter = Meter(sim.clock, sim)
    recorder = Recorder(sim, max_, jobs)
    system = cls(Context(sim, meter, max_, recorder.on_start, random.Random(0)))
    recorder.system = system
    for job in jobs:
        attributes = {CONCURRENCY_KEY_ATTRIBUTE: job.ckey} if job.ckey else None
        sim.at(T0 + job.enqueue_at, system.queue.send, job.body, job.id, attributes)
    sim.run(stop=recorder.done)
    return recorder


def _arrivals() -> list[Job]:
    """One slot's worth of jobs arriving one after another while the first runs; the later ones
    shorter, so that anything but the oldest-first order would show."""
    spec = [("a", 0.0, 10.0), ("b", 1.0, 3.0), ("c", 2.0, 2.0), ("d", 2.5, 1.0)]
    return [Job(k, at, d, body(k, i)) for i, (k, at, d) in enumerate(spec)]


def test_o_0_starts_the_oldest_job_the_instant_a_slot_frees():
    recorder = _oracle_run(OracleZero, 1, _arrivals())
    starts = {k: round(t - T0, 6) for k, t in recorder.first_start.items()}

    assert starts == {"a": 0.0, "b": 10.0, "c": 13.0, "d": 15.0}
    assert recorder.peak == 1


def test_o_event_starts_the_oldest_job_when_the_status_event_arrives():
    recorder = _oracle_run(OracleEvent, 1, _arrivals())
    starts = {k: round(t - T0, 6) for k, t in recorder.first_start.items()}
    d = EVENT_DELAY

    assert starts == {"a": 0.0, "b": 10.0 + d, "c": 13.0 + 2 * d, "d": 15.0 + 3 * d}


def test_o_fair_gives_each_freed_slot_to_the_tenant_with_the_fewest_runs():
    """MAX 2: heavy's four jobs at t0 take both slots; light's two arrive at 1 s. The first slot freed
    goes to light (no run against heavy's one), ahead of heavy's jobs queued first; the next to heavy
    (no run left against light's one), and so on."""
    spec = [("h0", "heavy", 0.0, 5.0), ("h1", "heavy", 0.0, 6.0), ("h2", "heavy", 0.0, 1.0)]
    spec += [("h3", "heavy", 0.0, 1.0), ("l0", "light", 1.0, 9.0), ("l1", "light", 1.0, 9.0)]
    jobs = [Job(k, at, d, body(k, i), ckey=t) for i, (k, t, at, d) in enumerate(spec)]
    starts = {k: round(t - T0, 6) for k, t in _oracle_run(OracleFair, 2, jobs).first_start.items()}
    d = EVENT_DELAY

    assert starts["h0"] == starts["h1"] == 0.0
    assert starts["l0"] == 5.0 + d  # h0's end: light has none running
    assert starts["h2"] == 6.0 + d  # h1's end: heavy has none running, light one
    assert starts["h3"] == starts["h2"] + 1.0 + d  # h2's end: the same
    assert starts["l1"] == starts["h3"] + 1.0 + d  # h3's end: light's last


def test_the_oracles_start_under_start_executions_token_bucket():
    """2,000 jobs at MAX 2,000: 1,300 start at once, the rest at 300 a second."""
    jobs = [Job(f"j{i}", 0.0, 600.0, body(f"j{i}", i)) for i in range(2_000)]
    recorder = _oracle_run(OracleZero, 2_000, jobs)
    starts = sorted(t - T0 for t in recorder.first_start.values())

    assert starts[1_299] == 0.0 and starts[1_300] > 0.0
    assert starts[-1] == pytest.approx(700 / 300, abs=0.01)


def test_every_sluice_run_carries_o_events_utilisation_and_the_ratio():
    jobs = _jobs("fixed5", 30)
    runs = [run(s, "fixed5", 4, 7, jobs=jobs) for s in ("sluice-linger", "oracle-event", "oracle-0")]
    with_oracle(runs)
    sluice, oracle = runs[0], runs[1]

    assert sluice["oracle_utilisation"] == oracle["utilisation"]
    assert sluice["oracle_ratio"] == round(sluice["utilisation"] / oracle["utilisation"], 3)
    [row] = oracle_section(runs, None)["rows"]
    assert row["oracle_zero_utilisation"] == runs[2]["utilisation"]


def test_sqs_refuses_calls_past_300_a_second_per_action_and_queue():
    quotas = Quotas(high_throughput_fifo=False)
    queue, other = object(), object()
    taken = [quotas.admit("sqs:ReceiveMessage", 10.2, queue) for _ in range(SQS_FIFO_PER_ACTION + 5)]

    assert taken.count(True) == SQS_FIFO_PER_ACTION and taken[-5:] == [False] * 5
    assert quotas.admit("sqs:DeleteMessageBatch", 10.3, queue)  # another action
    assert quotas.admit("sqs:ReceiveMessage", 10.4, other)  # another queue
    assert quotas.admit("sqs:ReceiveMessage", 11.0, queue)  # the next second
    assert Quotas().sqs_per_action == HIGH_THROUGHPUT_FIFO_PER_ACTION  # as the stack deploys the queues


def test_start_execution_bucket_applies_to_every_start():
    quotas = Quotas(start_rate=2.0, start_burst=3)
    at_once = [quotas.admit("states:StartExecution", 0.0) for _ in range(4)]

    assert at_once == [True, True, True, False]
    assert quotas.admit("states:StartExecution", 0.5)  # one token back after 0.5 s at 2 a second
    assert not quotas.admit("states:StartExecution", 0.5)


def test_a_refused_call_is_retried_counted_and_then_fails_as_the_adapter_raises_it():
    sim = Sim()
    meter = Meter(sim.clock, None, quotas=Quotas(start_rate=1.0, start_burst=1))
    sfn = SimExecutions(meter, sim.clock, lag=0)
    sfn.start("first", "{}")

    with pytest.raises(TransientError) as refused:
        sfn.start("second", "{}")
    assert refused.value.throttled and refused.value.operation == "StartExecution"
    assert meter.refused == {"states:StartExecution": SDK_ATTEMPTS}
    assert meter.calls == {"states:StartExecution": 1}
    assert sfn.running == 1  # the refused start changed nothing


def test_a_burst_of_receives_past_the_quota_is_refused_in_the_simulation():
    """311 receives at one instant from one function's invocations on a queue without high-throughput
    mode: 300 go through; the SDK retries the others after its jittered wait, in the next second,
    where they go through."""
    sim = Sim()
    meter = Meter(sim.clock, sim, quotas=Quotas(high_throughput_fifo=False), rng=random.Random(1))
    queue = SimQueue(meter, sim.clock, visibility_timeout=30, max_receive_count=None)
    fn = LambdaFunction(sim, "burst", 128, 60, 0.0, lambda: None)
    sim.at(sim.t0 + 0.9, lambda: [fn.invoke(lambda _s, _ms: queue.receive(10, 0)) for _ in range(311)])
    sim.run()

    assert meter.refused["sqs:ReceiveMessage"] >= 11
    assert meter.calls["sqs:ReceiveMessage"] == 311 and fn.errors == 0
    assert any("refused" in w for w in meter.quota_warnings())


def test_a_backlog_arriving_while_the_deployed_launcher_lingers_starts_at_once():
    jobs = _jobs("fixed30", 10)
    linger = run("sluice-linger", "fixed30", 5, 7, jobs=jobs)
    plain = run("sluice", "fixed30", 5, 7, jobs=jobs)

    assert linger["first_tick_s"] == -30.0 and plain["first_tick_s"] == 30.0
    assert linger["fill_s"] < 2.0  # from the arrival, not from a tick 30 s later
    assert linger["makespan_s"] <= plain["makespan_s"] - 28.0


@pytest.mark.parametrize("system", ["sluice-linger", "sluice"])
def test_sluice_rides_out_a_start_execution_bucket_that_refuses_its_starts(system):
    """A bucket of 3 refilled at 2 a second for 10 slots: starts are refused (counted), and Sluice
    backs off and calls again as the real code does; every job runs once, none is dead-lettered, and
    MAX holds."""
    jobs = _jobs("fixed5", 60)
    r = run(system, "fixed5", 10, 7, jobs=jobs, quotas=Quotas(start_rate=2.0, start_burst=3))

    assert r["refused_by_api"].get("states:StartExecution", 0) > 0
    assert r["finished"] and r["completed"] == 60
    assert r["duplicate_starts"] == 0 and r["dead_lettered"] == 0
    assert r["peak_concurrency"] <= 10

"""The DAG workload at tiny scale: every await respected, the same numbers for a seed."""

from __future__ import annotations

import random

from bench.harness import EVENT_DELAY, dag, run, without_awaits
from bench.plan import Plan, _dag_task, dag_tasks
from bench.report import dag_markdown, dag_section, dag_table


def _jobs(seed: int = 7) -> list:
    return dag(1, 3, random.Random(f"{seed}/dag"))  # 51 + 30 nodes


def test_the_graph_is_fan_ins_of_50_and_chains_of_10_deterministic_from_the_seed():
    jobs = _jobs()
    awaits = {j.id: j.awaits for j in jobs}

    assert len(jobs) == 81 and len(awaits) == 81
    assert awaits["fan00-out"] == tuple(f"fan00-in{i:02d}" for i in range(50))
    assert [awaits[f"chain01-{i}"] for i in range(10)] == [(), *[(f"chain01-{i}",) for i in range(9)]]
    assert jobs == _jobs() and [j.id for j in jobs] != [j.id for j in _jobs(seed=8)]
    assert without_awaits(jobs) == [j.__class__(j.id, 0.0, j.duration, j.body) for j in jobs]


def test_no_node_starts_before_everything_it_awaits_ended_succeeded():
    jobs = _jobs()
    r = run("sluice-linger", "dag", 5, 7, jobs=jobs)
    d = r["dag"]
    starts, ends = d["_starts"], d["_ends"]

    assert r["finished"] and r["started"] == 81 and r["duplicate_starts"] == 0 and r["dead_lettered"] == 0
    assert r["peak_concurrency"] <= 5 and r["over_max_seconds"] == 0
    for job in jobs:
        for key in job.awaits:
            end, status = ends[key]
            assert status == "SUCCEEDED"
            # the receipt comes with the status event, after the end
            assert starts[job.id] >= end + EVENT_DELAY, (job.id, key)
    assert d["violations"] == [] and d["dependents"] == d["dependents_started"] == 1 + 27
    # dependents enqueued before what they await were parked through the real code and sent back
    assert d["parked"] >= 1 and r["calls_by_api"]["sqs:SendMessage"] >= d["parked"]
    assert d["wake_p50_s"] is not None and 0 < d["wake_p50_s"] < 1


def test_same_seed_same_numbers():
    jobs = _jobs()
    assert run("sluice-linger", "dag", 5, 7, jobs=jobs) == run("sluice-linger", "dag", 5, 7, jobs=_jobs())


def test_the_section_compares_with_the_same_jobs_without_awaits_and_states_the_targets():
    plan = Plan.make(quick=True, seed=7)
    plan = plan.__class__(**{**plan.__dict__, "dag_max": 5, "dag_fan_ins": 1, "dag_chains": 3})
    runs = [_dag_task(args) for _, args in dag_tasks(plan)]
    section = dag_section(plan, runs)

    assert section["rows"]["dag"]["started"] == section["rows"]["plain"]["started"] == 81
    plain = next(r for r in runs if r["workload"] == "dag-plain")
    assert "dag" not in plain and "sqs:SendMessage" not in plain["calls_by_api"]
    assert section["calls_ratio"] == round(
        section["rows"]["dag"]["api_calls_per_start"] / section["rows"]["plain"]["api_calls_per_start"], 2
    )
    assert [t["met"] for t in section["targets"]][2:] == [True, True]
    assert "receipt → start" in dag_table(section) and "| target |" in dag_markdown(section)

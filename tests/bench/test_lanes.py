"""The lanes workload at tiny scale: the same numbers for a seed, no lane and no run over its MAX,
and a freed slot going to the priority lane before the big lane's backlog."""

from __future__ import annotations

import random

import pytest

from bench.harness import LANE_FAST_FROM, lanes_jobs, without_lanes
from bench.plan import LANE_RUNS, Plan, _lanes_task, lane_tasks
from bench.report import lanes_markdown, lanes_section, lanes_table

MAX = 50  # the workload's global MAX; fast 10, bulk 50


def _plan(seed: int = 7) -> Plan:
    plan = Plan.make(quick=True, seed=seed)
    return plan.__class__(
        **{**plan.__dict__, "lanes_bulk": 240, "lanes_fast_for": 60.0, "lanes_fast_backlog": 30}
    )


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    return {args[0]: _lanes_task(args) for _, args in lane_tasks(_plan())}


def test_the_jobs_are_deterministic_from_the_seed():
    jobs = lanes_jobs(random.Random("7/lanes"), bulk=240, fast_for=60.0)
    fast = [j for j in jobs if j.lane == "fast"]

    assert jobs == lanes_jobs(random.Random("7/lanes"), bulk=240, fast_for=60.0)
    assert jobs != lanes_jobs(random.Random("8/lanes"), bulk=240, fast_for=60.0)
    assert sum(j.lane == "bulk" and j.enqueue_at == 0.0 for j in jobs) == 240
    assert fast and all(LANE_FAST_FROM < j.enqueue_at < LANE_FAST_FROM + 60 for j in fast)
    backlogged = lanes_jobs(random.Random("7/lanes"), bulk=240, fast_backlog=30)
    assert [j.enqueue_at for j in backlogged if j.lane == "fast"] == [0.0] * 30
    assert {j.lane for j in without_lanes(jobs)} == {None}


def test_same_seed_same_numbers(runs):
    assert _lanes_task(("lanes", LANE_RUNS[0][1], _plan())) == runs["lanes"]


@pytest.mark.parametrize("workload", ["lanes", "lanes-both", "lanes-nowait"])
def test_no_lane_and_no_run_over_its_max(runs, workload):
    r = runs[workload]
    lanes = r["lanes"]["lanes"]

    assert r["finished"] and r["started"] == r["jobs"]
    assert r["dead_lettered"] == 0 and r["duplicate_starts"] == 0
    assert r["peak_concurrency"] <= MAX and r["over_max_seconds"] == 0
    assert lanes["fast"]["peak_running"] <= 10 and lanes["bulk"]["peak_running"] <= MAX
    assert not r["lanes"]["cap_exceeded"]
    assert r["calls_by_api"]["states:StartExecution"] == r["jobs"]


def test_a_freed_slot_goes_to_the_priority_lane_before_the_big_lanes_backlog(runs):
    trickle, both, plain = runs["lanes"], runs["lanes-both"], runs["lanes-plain"]
    fast, bulk = trickle["lanes"]["lanes"]["fast"], trickle["lanes"]["lanes"]["bulk"]

    # every fast job arrived while bulk was backlogged, and started within seconds of a slot freeing
    assert fast["latency_jobs"] == fast["jobs"] > 0
    assert fast["latency_p50_s"] < 1.0 and fast["latency_p99_s"] < 5.0
    assert fast["passed_over"] == 0 and both["lanes"]["lanes"]["fast"]["passed_over"] == 0
    assert bulk["backlogged_s"] > 100  # bulk's jobs waited for minutes meanwhile
    # without lanes the same fast jobs wait behind bulk's backlog, passed over by its starts
    assert plain["lanes"]["lanes"]["fast"]["latency_p50_s"] > 30
    assert plain["lanes"]["lanes"]["fast"]["passed_over"] > 0
    # both backlogged: fast holds its 10 of the 50 and bulk the rest, until fast's backlog is done
    together = both["lanes"]["all_backlogged"]["lanes"]
    assert together["fast"]["running_avg"] > 8.5 and together["fast"]["share_avg"] == 10
    assert together["bulk"]["share_avg"] < 42
    assert both["lanes"]["lanes"]["fast"]["backlogged_s"] < both["lanes"]["lanes"]["bulk"]["backlogged_s"]


def test_the_section_states_the_targets(runs):
    section = lanes_section(_plan(), list(runs.values()))

    assert set(section["rows"]) == {"trickle", "both", "nowait", "plain"}
    assert [t["met"] for t in section["targets"]][4:] == [True, True]  # peaks, dead-lettered
    assert section["targets"][0]["met"]  # fast's start latency p50 ≤ 1 s
    assert "fast passed over" in lanes_markdown(section) and "| target |" in lanes_markdown(section)
    assert "Lanes fast:10:1,bulk:50:0" in lanes_table(section)

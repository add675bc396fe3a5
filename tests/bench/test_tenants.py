"""The tenants workload at tiny scale: a heavy tenant's backlog, then four light tenants; each tenant a
concurrency key, no keys, and each tenant a tenant of one fair lane."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.harness import Job, body, run
from bench.plan import Plan, _tenants_task, tenant_tasks
from bench.report import tenants_markdown, tenants_section, tenants_table

MAX = 50  # the workload's MAX, and the fair lane's


def _plan(seed: int = 7) -> Plan:
    return replace(Plan.make(quick=True, seed=seed), tenants_heavy=300)  # heavy backlogged past 120 s


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    return {args[0]: _tenants_task(args) for _, args in tenant_tasks(_plan())}


def test_same_seed_same_numbers(runs):
    assert _tenants_task(("tenants-fair", "sluice-fair", _plan())) == runs["tenants-fair"]


def test_a_fair_lane_starts_every_job_once_and_never_passes_its_max(runs):
    r = runs["tenants-fair"]

    assert r["finished"] and r["started"] == r["jobs"] == 340
    assert r["dead_lettered"] == 0 and r["duplicate_starts"] == 0
    assert r["peak_concurrency"] <= MAX and r["over_max_seconds"] == 0
    # (a waiter sent back by two wakers at once arrives twice; its second copy resumes the first's
    # claim, StartExecution answering with the same execution: no second run)
    assert r["jobs"] <= r["calls_by_api"]["states:StartExecution"] < 1.05 * r["jobs"]
    assert r["tenants"]["cap"] is None and not r["tenants"]["cap_exceeded"]  # no keyConcurrency here


def test_a_fair_lane_gives_the_slots_that_free_to_the_light_tenants_and_a_lone_tenant_all(runs):
    fair, plain = runs["tenants-fair"]["tenants"], runs["tenants-plain"]["tenants"]

    # alone, heavy holds the whole lane; the lights wait for slots to free, not for heavy's backlog
    assert fair["tenants"]["heavy"]["peak_running"] == MAX
    assert fair["light_latency_p99_s"] < 40 < plain["light_latency_p50_s"]
    assert fair["jain_backlogged"] > plain["jain_backlogged"]
    assert fair["jain_min"] <= fair["jain_backlogged"]
    assert runs["tenants-fair"]["lanes"]["lanes"]["default"]["while_backlogged"]["utilisation_max"] > 0.9


def test_the_section_compares_the_three_runs_and_states_the_fair_lanes_targets(runs):
    section = tenants_section(_plan(), list(runs.values()))
    fair_targets = [t for t in section["targets"] if t["target"].startswith("fair lane")]

    assert set(section["rows"]) == {"keyed", "plain", "fair"}
    assert len(fair_targets) == 4 and fair_targets[-1]["met"]  # never over MAX, nothing lost
    assert section["rows"]["fair"]["lane"]["utilisation_max"] is not None
    assert "| fair lane `default:50:0:1:fair` |" in tenants_markdown(section)
    assert "Jain mean / lowest" in tenants_markdown(section) and "  fair " in tenants_table(section)
    # a run without the fair lane (an older raw pickle) is still reported
    older = tenants_section(_plan(), [runs["tenants"], runs["tenants-plain"]])
    assert set(older["rows"]) == {"keyed", "plain"} and len(older["targets"]) == 3


def test_a_lingering_tick_polls_an_idle_fair_lane_about_once_a_second():
    """One job running for 200 s under MAX 2: a slot free and nothing to start for four ticks. A
    lingering tick with lanes polls each lane once a second (receiveWaitSeconds, 1 s), a fair lane
    too: about 56 receives a tick. Before its first receive waited, the fair lane made 5,644. (A
    stack without lanes long-polls the one queue for up to 20 s: 22 receives in all.)"""
    jobs = [Job("a-0", 0.0, 200.0, body("a-0", 0), ckey="a")]
    plain = run("sluice-linger", "idle-slot", 2, 1, jobs=jobs)["calls_by_api"]["sqs:ReceiveMessage"]
    fair = run("sluice-fair", "idle-slot", 2, 1, jobs=jobs)["calls_by_api"]["sqs:ReceiveMessage"]

    assert plain <= 30
    assert fair <= 4 * 60

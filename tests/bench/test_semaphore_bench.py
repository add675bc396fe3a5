"""The semaphore benchmark at tiny scale: the real Semaphores within the limit at no waiting cost, the
baselines as their patterns behave, the same numbers for the same seed."""

from __future__ import annotations

import pytest

from bench.semaphore_bench import LIMIT, SYSTEMS, executions, run

SEED = 7


@pytest.mark.parametrize("arrivals", ["burst", "steady"])
def test_sluice_semaphore_stays_within_the_limit_and_spends_no_waiting_transition(arrivals):
    r = run("sluice-semaphore", arrivals, "exp10", 30, SEED)

    assert r["finished"] and r["entered"] == 30
    assert r["peak_inside"] <= LIMIT and r["over_limit_seconds"] == 0
    assert r["waiting_transitions_per_execution"] == 0 and r["waiting_transitions_max"] == 0
    assert r["semaphore_transitions_per_execution"] == 2  # Acquire and Release
    # One grant per execution, answered on its token; one acquire, one release, one status event each.
    assert r["calls_by_api_per_execution"]["states:SendTaskSuccess"] == 1
    assert r["lambda"]["semaphore"]["invocations"] >= 3 * 30


def test_sluice_semaphore_hands_every_freed_permit_to_a_waiter_in_a_burst():
    r = run("sluice-semaphore", "burst", "fixed5", 30, SEED)

    assert r["peak_inside"] == LIMIT
    assert r["handoffs"] == 30 - LIMIT  # every execution but the first LIMIT waited for a release


def test_retry_loop_waiting_transitions_grow_with_contention():
    few = run("retry-loop", "burst", "fixed5", LIMIT, SEED)
    some = run("retry-loop", "burst", "fixed5", 15, SEED)
    many = run("retry-loop", "burst", "fixed5", 40, SEED)

    assert few["waiting_transitions_per_execution"] == 0  # a permit for everyone
    assert 0 < some["waiting_transitions_per_execution"] < many["waiting_transitions_per_execution"]
    for r in (few, some, many):
        assert r["finished"] and r["peak_inside"] <= LIMIT
    # Without the task's Retry the loop spins faster: more transitions for the same executions.
    wait3 = run("retry-loop-wait3", "burst", "fixed5", 40, SEED)
    assert wait3["waiting_transitions_per_execution"] > many["waiting_transitions_per_execution"]
    assert wait3["peak_inside"] <= LIMIT


def test_list_polling_over_admits_with_a_lag():
    lagged = run("list-polling", "burst", "fixed5", 30, SEED)

    assert lagged["finished"]
    assert lagged["peak_inside"] > LIMIT  # the fresh starts are not listed yet
    assert lagged["over_limit_seconds"] > 0


def test_list_polling_reads_its_own_starts_without_a_lag():
    r = run("list-polling", "steady", "exp10", 30, SEED, lag=0.0)

    assert r["finished"]
    # Checks that run at the same moment can still both admit, but far fewer than with the lag.
    assert r["peak_inside"] <= run("list-polling", "steady", "exp10", 30, SEED)["peak_inside"]


@pytest.mark.parametrize("system", SYSTEMS)
def test_same_seed_same_numbers(system):
    first = run(system, "burst", "exp10", 20, SEED)
    second = run(system, "burst", "exp10", 20, SEED)

    assert first == second


def test_another_seed_other_executions():
    assert executions("burst", "exp10", 20, 7) == executions("burst", "exp10", 20, 7)
    assert executions("burst", "exp10", 20, 7) != executions("burst", "exp10", 20, 8)
    assert all(e.arrive == 0 for e in executions("burst", "fixed5", 20, 7))
    steady = [e.arrive for e in executions("steady", "exp10", 20, 7)]
    assert steady == sorted(steady) and steady[0] > 0

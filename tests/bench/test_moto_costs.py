"""bench.moto_costs at MAX 20 and 60: the cost targets of issue #10 (point 3) that do not depend on
MAX, measured on moto with the real adapters and handlers.

Met and asserted: write units per start are the same at MAX 20 and 60 (every item stays under
1 KB, so each write is billed the minimum) and within 12 (6: a fill's claim; 10: a completion's
hand-over, one transaction of five items), the steady state
never writes LEDGER, and a shard item is written once per start of a holder it frees (the swap),
so the hottest item takes 8 / MAX writes per start (0.13 at MAX 60, 0.04 at MAX 200).

Missed, kept as non-strict ``xfail`` with the numbers measured when this was written: a completion
refill costs 5 calls per start, not 4 (the read of the ended run's record with the pool item,
receive, the hand-over, StartExecution, delete: the status event names the execution, and its key,
shard and waiting rooms are on its record). A fill tick at these small MAX values costs more than
2.3 calls per start (claim and start, a receive and a delete per batch of 10, the read before a
receive about once per tick, and 10 more per tick, a quarter of a call per start at MAX 40); it is
2.26 at MAX 200 and 2.22 at MAX 1,000 (``python -m bench.moto_costs``).
"""

from __future__ import annotations

import pytest

from bench.moto_costs import KB, PER_SHARD, TARGETS, measure

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def costs():
    # Every execution running after the fill ends once: the steady state's writes per shard are exact.
    return {m: measure(m, steady=m) for m in (20, 60)}


@pytest.mark.parametrize("max_", [20, 60])
def test_the_run_is_clean(costs, max_):
    r = costs[max_]
    assert r["fill_ticks"] == 1 and r["fill"]["starts"] == max_
    assert r["released"] == r["steady"]["starts"] == max_
    assert r["running_at_end"] == max_ and r["queued_at_end"] == [0, 0]
    assert r["fill"]["failed_writes"] == r["steady"]["failed_writes"] == 0


def test_write_units_per_start_do_not_grow_with_max(costs):
    for phase in ("fill", "steady"):
        small, large = costs[20][phase]["wcu_per_start"], costs[60][phase]["wcu_per_start"]
        assert abs(small - large) <= 1, (phase, small, large)


@pytest.mark.parametrize("max_", [20, 60])
def test_every_item_stays_under_one_write_unit(costs, max_):
    sizes = costs[max_]["sizes"]
    assert sizes["largest_item_bytes"] <= KB, sizes["largest_item"]
    assert sizes["ledger_bytes"] <= 100  # no holders in LEDGER any more: external, drift, time


@pytest.mark.parametrize("max_", [20, 60])
def test_a_fill_stays_within_twelve_write_units_per_start(costs, max_):
    assert costs[max_]["fill"]["wcu_per_start"] <= TARGETS["wcu_per_start"]


@pytest.mark.parametrize("max_", [20, 60])
def test_the_steady_state_never_writes_ledger_and_spreads_over_the_shards(costs, max_):
    steady = costs[max_]["steady"]
    assert steady["ledger_writes"] == 0
    assert steady["hottest_item"].startswith("SLOTS#launcher#")
    # Each start writes one shard once (the hand-over: one holder out, the next in), and a shard
    # holds at most PER_SHARD: at MAX 200 that is 8 / 200 = 0.04 writes per start.
    assert steady["hottest_item_writes"] <= PER_SHARD


@pytest.mark.xfail(
    strict=False,
    reason="issue #10: refill measured at 5.05 (MAX 20), 5.02 (MAX 60) calls per start: the record read",
)
@pytest.mark.parametrize("max_", [20, 60])
def test_target_refill_within_four_calls_per_start(costs, max_):
    assert costs[max_]["steady"]["calls_per_start"] <= TARGETS["refill_calls_per_start"]


@pytest.mark.parametrize("max_", [20, 60])
def test_the_steady_state_stays_within_twelve_write_units_per_start(costs, max_):
    assert costs[max_]["steady"]["wcu_per_start"] <= TARGETS["wcu_per_start"]


@pytest.mark.xfail(
    strict=False,
    reason="issue #10: below MAX 200 the tick's fixed calls weigh (2.48 at MAX 40; met at 200 and 1,000: 2.26, 2.22)",
)
@pytest.mark.parametrize("max_", [20, 60])
def test_target_fill_tick_within_2_3_calls_per_start(costs, max_):
    assert costs[max_]["fill"]["calls_per_start"] <= TARGETS["fill_calls_per_start"]


def test_no_item_written_more_than_a_quarter_per_start_at_max_60(costs):
    limit = TARGETS["writes_per_item_per_start_at_max_200"]
    assert costs[60]["steady"]["hottest_item_writes_per_start"] <= limit

"""docs/sizing.md's figures are the bench's committed output (bench/results.json), its prices
(bench/pricing.py) and the launcher's settings: a new bench run or a changed quota that the page
does not follow fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench.aws import QUOTAS
from bench.pricing import PRICES
from bench.report import LABEL
from sluice.adapters.aws.sqs import BATCH as RECEIVE_BATCH
from sluice.enqueue import BATCH as SEND_BATCH
from sluice.launch.settings import LARGE_BUCKET, LARGE_BUCKET_REGIONS, SMALL_BUCKET

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "sizing.md").read_text()
RESULTS = json.loads((ROOT / "bench" / "results.json").read_text())
SYSTEM = "sluice-linger"  # the stack as deployed
TABLE_MAXES = (5, 100, 1000)  # 30 s runs; MAX 10,000 is the large run (60 s)


def _text() -> str:
    """The page as one line per paragraph: figures may wrap."""
    return re.sub(r"\s+", " ", DOC)


def _table() -> dict[str, list[str]]:
    rows = [line for line in DOC.splitlines() if re.match(r"\| [\d,]+ \|", line)]
    return {row.split("|")[1].strip(): [c.strip() for c in row.split("|")[2:-1]] for row in rows}


def _run(maximum: int) -> dict:
    [run] = [
        r for r in RESULTS["runs"] if (r["system"], r["workload"], r["max"]) == (SYSTEM, "fixed30", maximum)
    ]
    return run


def _money(value: float) -> str:
    return f"${value:,.2f}"


@pytest.mark.parametrize("maximum", TABLE_MAXES)
def test_each_row_is_the_bench_run_at_that_max(maximum):
    run = _run(maximum)
    completion = run["lambda"]["completion"]
    mean_run = completion["gb_seconds"] / completion["invocations"] / (completion["memory_mb"] / 1024)
    assert _table()[f"{maximum:,}"] == [
        f"{run['api_calls_per_start']:.2f}",
        f"{run['calls_by_api_per_start']['sqs:ReceiveMessage']:.2f}",
        f"{run['dynamodb_wru_per_start']:.1f}",
        _money(run["cost_per_million_usd"]),
        f"{completion['peak_concurrent']:,}",
        f"{mean_run:.2f} s",
    ]


def test_the_max_10000_row_is_the_large_run_as_deployed():
    assert RESULTS["large"]["max"] == 10_000
    [run] = [r for r in RESULTS["large"]["rows"] if r["system"] == SYSTEM]
    assert _table()["10,000"] == [
        f"{run['api_calls_per_start']:.2f}",
        "",
        f"{run['dynamodb_wru_per_start']:.1f}",
        _money(run["cost_per_million_usd"]),
        "",
        "",
    ]


def test_the_fill_times_are_the_large_runs():
    rows = {r["system"]: r for r in RESULTS["large"]["rows"]}
    deployed, wide = rows[SYSTEM]["fill_s"], rows["sluice-wide"]["fill_s"]
    assert LABEL["sluice-wide"] == "Sluice, startConcurrency=100, launcherMemory=1024"
    assert (
        f"{deployed:.1f} s at MAX 10,000 as deployed, {wide:.1f} s with `startConcurrency=100` and "
        "`launcherMemory=1024`"
    ) in _text()


def test_the_quotas_are_the_launchers_and_the_benchs():
    text = _text()
    (large_rate, large_burst), (small_rate, small_burst) = LARGE_BUCKET, SMALL_BUCKET
    found = re.search(
        r"(\d+) a second with a burst of ([\d,]+) in ([a-z0-9, -]+?) and ([a-z0-9-]+); (\d+) a second with a burst of ([\d,]+) elsewhere",
        text,
    )
    assert found, "the StartExecution quota sentence"
    rate, burst, listed, last, small, small_bucket = found.groups()
    assert (int(rate), int(burst.replace(",", ""))) == (large_rate, large_burst)
    assert {*listed.split(", "), last} == LARGE_BUCKET_REGIONS
    assert (int(small), int(small_bucket.replace(",", ""))) == (small_rate, small_burst)
    assert QUOTAS["states:StartExecution"] == large_rate
    # Runs per second times their length: what the start rate keeps busy.
    assert (
        f"At {large_rate} a second, 30 s runs keep at most {large_rate * 30:,} busy; 5 s runs, {large_rate * 5:,}"
        in text
    )
    fifo = QUOTAS["sqs:ReceiveMessage"]
    assert fifo == QUOTAS["sqs:DeleteMessageBatch"]
    assert f"SQS FIFO**: {fifo:.0f} calls a second per API action on each queue" in text
    # The stack's queues are in high-throughput mode, as the page says and the bench models them.
    for source in ("serverless.yml", "stack/lanes.js"):
        assert re.search(r"FifoThroughputLimit: '?perMessageGroupId", (ROOT / source).read_text())
    assert "the stack's queues are in high-throughput mode" in text
    most = max(_run(m)["calls_by_api_per_start"]["sqs:ReceiveMessage"] for m in TABLE_MAXES)
    assert f"at most about {fifo / most:.0f} to {fifo:.0f} starts a second" in text
    assert f"receives up to {RECEIVE_BATCH} messages a call" in text
    assert f"`sluice enqueue` sends {SEND_BATCH} messages a call" in text


def test_the_completions_at_once_quoted_are_the_table_s():
    peak = _run(1000)["lambda"]["completion"]["peak_concurrent"]
    assert _run(100)["lambda"]["completion"]["peak_concurrent"] == 100
    assert f"as MAX at MAX 100, and {peak:,} at MAX 1,000" in _text()


def test_the_prices_and_what_they_make_per_start():
    text = _text()
    wru = PRICES["dynamodb_wru"] * 1e6
    assert f"${wru:.3f} per million write units" in text
    write_units = _run(100)["dynamodb_wru_per_start"]
    assert (
        f"a start's {write_units:.0f} write units cost {_money(write_units * wru)} per million starts" in text
    )
    # The hand-over's transaction of five items, each under 1 KB and billed twice, and nothing else.
    assert (
        round(write_units) == 2 * 5
        and "the next claim, five items, the claim carrying its start mark" in text
    )
    transition = PRICES["stepfunctions_transition"]
    assert (
        f"${transition * 1e3:.3f} per 1,000 state transitions: ${transition * 1e6:.0f} per million runs"
        in text
    )
    idle = RESULTS["idle_month_usd"][SYSTEM]
    assert f"about {_money(idle['total'])} a month" in text
    assert idle["lambda"] > idle["total"] / 2  # "mostly the launcher's linger"

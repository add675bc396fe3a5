"""``make demo`` end to end with a small batch: package, deploy into the embedded AWS, run, account.

The demo runs as its own process, as ``make demo`` runs it. What it leaves behind is checked here
independently of its own verdict: the running count recomputed from every execution's start and
stop times, the ListExecutions samples, each message's fate, the ledger, the queue and the chart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.local.chart import peak

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MAXIMUM = 4
COUNT = 20


def test_demo_small_batch_never_exceeds_max_and_accounts_for_every_message(tmp_path):
    out = tmp_path / "demo-out"
    env = {k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"}
    command = [
        sys.executable,
        "-m",
        "sluice.local.demo",
        "--count",
        str(COUNT),
        "--max",
        str(MAXIMUM),
        "--workers",
        "2",
    ]
    done = subprocess.run(
        [*command, "--plain", "--out", str(out), "--timeout", "120"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "RESULT: OK" in done.stdout
    assert f"chart       : {out / 'demo-chart.png'}" in done.stdout

    result = json.loads((out / "summary.json").read_text())
    timeline = result["timeline"]
    intervals = [tuple(i) for i in timeline["intervals"]]
    # Never above MAX: from Step Functions' own start and stop times, and from every sample.
    assert intervals and peak(intervals) <= MAXIMUM
    assert max(n for _, n in timeline["samples"]) <= MAXIMUM
    assert all(stop >= start for start, stop in intervals)

    # Every message accounted for: started, suppressed as a duplicate, or dead-lettered with a reason.
    fates = result["fates"]
    assert result["messages"] == COUNT
    assert fates.get("lost", 0) == 0
    assert sum(fates.values()) == COUNT
    assert fates["started"] == len(intervals) == sum(result["statuses"].values())
    assert fates.get("invalid", 0) == result["raw_messages"] == result["dlq"] >= 1
    assert all(result["dlq_reasons"].values())
    assert set(result["statuses"]) <= {"SUCCEEDED", "FAILED"}
    assert result["unexpected_executions"] == [] and result["record_mismatches"] == []
    assert result["ledger_holders"] == 0 and result["queue_left"] == 0
    assert result["handler_errors"] == [] and result["order_violations"] == []
    # The repeated status event released nothing.
    assert result["repeated_events"] == 1 and result["repeated_released"] == 0

    chart = out / "demo-chart.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert chart.stat().st_size > 10_000

    # The semaphore example workflow: every execution passed the section, never more inside at once
    # than the semaphore's limit, by Step Functions' own history and by the table's holders.
    section = result["semaphore"]
    assert section["limit"] == 2 and section["statuses"] == {"SUCCEEDED": section["executions"]}
    inside = [tuple(i) for i in section["intervals"]]
    assert len(inside) == section["executions"] and peak(inside) == section["peak_inside"]
    assert 1 <= peak(inside) <= section["limit"]
    assert section["peak_holders"] <= section["limit"] and section["holders_left"] == 0
    assert section["end_events"] == section["executions"]  # the stack's rule routes their ends to it
    assert "peak inside the section, Step Functions history" in done.stdout

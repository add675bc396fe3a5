"""``make demo`` end to end with a small batch: package, deploy into the embedded AWS, run, account.

The demo runs as its own process, as ``make demo`` runs it. What it leaves behind is checked here
independently of its own verdict: the running count recomputed from every execution's start and
stop times, the ListExecutions samples, each message's fate, the ledger, the queue and the chart.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.local.chart import peak
from sluice.local.demo import ACCOUNTING
from sluice.local.demo_dag import (
    DAG,
    SCENE,
    SCENE_BYTES,
    TENANT_CAP,
    TENANT_JOBS,
    URGENT_JOBS,
    URGENT_LANE,
    URGENT_MAX,
    scene_payload,
)
from sluice.local.demo_rate import RATE, RATE_JOBS, RATE_LANE, RATE_LANE_MAX

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MAXIMUM = 4
COUNT = 20


def test_demo_small_batch_never_exceeds_max_and_accounts_for_every_message(tmp_path):
    out = tmp_path / "demo-out"
    env = {k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"}
    # The demo's `sluice enqueue` processes import this checkout's package, as the demo does.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "lib"), env.get("PYTHONPATH")]))
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
    # Between the run and the summary it says what it does; the last progress line and the summary
    # count the same messages (the batch and `sluice enqueue`'s), every one of them settled.
    assert f"{ACCOUNTING}: done in " in done.stdout
    progress = [line for line in done.stdout.splitlines() if line.startswith("[") and "settled " in line]
    settled = re.search(r"settled (\d+)/(\d+) messages", progress[-1]).groups()
    accounted = re.search(r"accounted   : (\d+) / (\d+) messages settled", done.stdout).groups()
    assert settled == accounted and settled[0] == settled[1]

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
    # The DAG's nodes, the stored payload, the tenant's burst and the lanes', accounted for apart.
    extra = len(DAG) + 1 + len(TENANT_JOBS) + len(URGENT_JOBS) + len(RATE_JOBS)
    assert fates["started"] + extra == len(intervals) == sum(result["statuses"].values())
    assert fates.get("invalid", 0) == result["raw_messages"] == result["dlq"] >= 1
    assert all(result["dlq_reasons"].values())
    assert set(result["statuses"]) <= {"SUCCEEDED", "FAILED"}
    assert result["unexpected_executions"] == [] and result["record_mismatches"] == []
    assert result["ledger_holders"] == 0 and result["queue_left"] == 0
    assert result["handler_errors"] == [] and result["order_violations"] == []
    # The repeated status event released nothing.
    assert result["repeated_events"] == 1 and result["repeated_released"] == 0

    # The DAG, sent with `sluice enqueue --after`: each dependent started, by Step Functions' own
    # times, only after everything it awaits had ended SUCCEEDED; parked (its WAIT# record) or not,
    # as its awaits were met on arrival or not; a node that awaits nothing is never parked.
    dag = result["dag"]
    nodes = {n["key"]: n for n in dag["nodes"]}
    assert dag["problems"] == [] and dag["violations"] == []
    commands = dag["commands"]
    assert len(commands) == 7 and commands[3].startswith("sluice set-max 2 --key heavy")
    assert all(c.startswith("sluice enqueue ") for c in commands[:3] + commands[4:])
    assert sum("--after" in c for c in commands) == 2 and "--concurrency-key heavy" in commands[4]
    assert f"--lane {URGENT_LANE}" in commands[5] and f"--lane {RATE_LANE}" in commands[6]
    assert set(nodes) == {k for k, _ in DAG} and set(dag["order"]) == set(nodes)
    for key, awaits in DAG:
        node = nodes[key]
        assert node["status"] == "SUCCEEDED" and node["awaits"] == list(awaits)
        for a in awaits:
            assert nodes[a]["stop"] <= node["start"], (key, a)
        assert not node["parked"] or awaits
    order = dag["order"]
    assert order.index("dag-merge") > max(order.index(f"dag-extract-{i}") for i in (1, 2, 3))
    assert order.index("dag-publish") > order.index("dag-merge")
    assert "every dependent started after all it awaits SUCCEEDED  ok" in done.stdout

    # The 600 KiB payload: stored in the stack's bucket, its execution started with the pointer as
    # input, and the object holds exactly the payload (read back from S3 and hashed by the demo).
    pointer = dag["pointer"]
    payload = scene_payload().encode()
    digest = hashlib.sha256(payload).hexdigest()
    assert len(payload) == SCENE_BYTES == pointer["size"] == pointer["object_bytes"]
    assert pointer["sha256"] == pointer["object_sha256"] == digest
    assert pointer["uri"].startswith("s3://") and pointer["uri"].endswith(f"/payloads/{digest}")
    assert pointer["status"] == "SUCCEEDED" and pointer["input_bytes"] < 1_000
    assert pointer["key"] == SCENE and f"{SCENE_BYTES:,} bytes stored at {pointer['uri']}" in done.stdout

    # The tenant's burst under its concurrency key: all ran, never more than the key's cap at once
    # (by Step Functions' own start and stop times).
    tenant = dag["tenant"]
    assert tenant["problems"] == [] and tenant["started"] == len(TENANT_JOBS)
    assert 1 <= tenant["peak"] <= TENANT_CAP
    assert f"at most {tenant['peak']} at once  ok" in done.stdout

    # Two lanes: the urgent lane's payloads all ran, never more than its MAX at once (Step Functions'
    # own times), and each lane's peak, from the lane its claim took a slot of, under its MAX.
    urgent = dag["urgent"]
    assert urgent["problems"] == [] and urgent["started"] == len(URGENT_JOBS)
    assert 1 <= urgent["peak"] <= URGENT_MAX
    assert result["lane_peaks"][URGENT_LANE] == urgent["peak"]
    assert 1 <= result["lane_peaks"]["default"] <= MAXIMUM
    assert f"in lane {URGENT_LANE!r} (MAX {URGENT_MAX}" in done.stdout

    # The lane under a rate (laneRateLimits=api=1/second): every payload ran, and its grants, read
    # from the rate book, and recounted here, never more than N in any window of the period.
    rated = result["rate"]
    assert rated["problems"] == [] and rated["started"] == len(RATE_JOBS)
    grants = rated["grants"]
    assert len(grants) >= len(RATE_JOBS)
    assert max(sum(1 for u in grants if t <= u < t + RATE.period) for t in grants) == RATE.count
    assert grants[-1] - grants[0] >= (len(RATE_JOBS) - 1) * RATE.period / RATE.count - 0.01
    assert 1 <= result["lane_peaks"][RATE_LANE] <= RATE_LANE_MAX
    assert f"in lane {RATE_LANE!r} (laneRateLimits={RATE_LANE}={RATE})" in done.stdout

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

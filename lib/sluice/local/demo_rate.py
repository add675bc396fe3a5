"""The demo's rated lane: a lane whose starts a rate bounds, drawn in the chart.

    api-1 … 12 ──► lane "api" (MAX 3, priority 1; laneRateLimits=api=1/second):
                   sluice enqueue --lane api: one grant a second, however many slots free up

The demo deploys the stack with ``laneRateLimits`` naming this lane, and the producer sends its
jobs with ``sluice enqueue --lane api`` after the rest (``sluice.local.demo_dag.send``). ``check``
then reads, from AWS's side, the lane's grants in the rate book (the ``RATES`` item, scope
``lane:api``: the promise is on them, protocol.md "Rate limits") and each job's execution in Step
Functions: every job SUCCEEDED, no window of the rate's period held more than its N grants, and the
starts Step Functions saw per window, which the chart draws against the rate.
"""

from __future__ import annotations

from typing import Any

from sluice.adapters.dynamo.rate_limits import DynamoRates
from sluice.adapters.dynamo.table import TableRef
from sluice.core.names import execution_arn, execution_name
from sluice.features.rate_limits import Rate, lane_scope
from sluice.local.demo_batch import Sent

RATE_LANE = "api"
RATE_LANE_MAX = 3
RATE = Rate(1, 1)  # 1/second
RATE_JOBS = [f"api-{i}" for i in range(1, 13)]
RATE_JOB_SECONDS = 3  # three at once at one a second: the lane's MAX is not what holds them
# The producer's ``enqueue`` arguments: the jobs, `sluice enqueue`'s flags, no scene, their seconds.
ENQUEUE = (RATE_JOBS, ["--lane", RATE_LANE], False, RATE_JOB_SECONDS)


def lane_param() -> str:
    """The lane's part of the stack parameter ``lanes`` (priority 1: a freed slot goes to it first)."""
    return f"{RATE_LANE}:{RATE_LANE_MAX}:1"


def lane_rates_param() -> str:
    """The stack parameter ``laneRateLimits`` the demo deploys with."""
    return f"{RATE_LANE}={RATE}"


def most_in_window(times: list[float], period: float) -> int:
    """The most of ``times`` in one window [t, t + period)."""
    ordered = sorted(times)
    return max((sum(1 for u in ordered if t <= u < t + period) for t in ordered), default=0)


def check(aws: Any, outputs: dict[str, str], sent: list[Sent], started: float) -> dict[str, Any]:
    """The rated lane's jobs and grants, from Step Functions and the table."""
    sfn = aws.client("stepfunctions")
    out: dict[str, Any] = {
        "lane": RATE_LANE,
        "rate": str(RATE),
        "jobs": len(RATE_JOBS),
        "problems": [],
    }
    problems: list[str] = out["problems"]
    if len(sent) != len(RATE_JOBS):
        problems.append(f"{len(sent)} of the lane {RATE_LANE!r}'s {len(RATE_JOBS)} payloads were sent")
    starts: list[float] = []
    for s in sent:
        arn = execution_arn(outputs["StateMachineArn"], execution_name(s.key, s.message_id))
        try:
            described = sfn.describe_execution(executionArn=arn)
        except sfn.exceptions.ExecutionDoesNotExist:
            problems.append(f"{s.key}: never started")
            continue
        if described["status"] != "SUCCEEDED":
            problems.append(f"{s.key}: {described['status']}")
        starts.append(described["startDate"].timestamp() - started)
    book = DynamoRates(TableRef(aws.client("dynamodb"), outputs["TableName"])).load()
    grants = [at / 1000 - started for at, n in book.windows.get(lane_scope(RATE_LANE), ()) for _ in range(n)]
    out.update(
        started=len(starts),
        starts=sorted(round(t, 3) for t in starts),
        grants=sorted(round(t, 3) for t in grants),
        most_grants=most_in_window(grants, RATE.period),
        most_starts=most_in_window(starts, RATE.period),
        seconds=round(max(starts) - min(starts), 1) if starts else 0.0,
    )
    if out["most_grants"] > RATE.count:
        problems.append(
            f"the lane {RATE_LANE!r} took {out['most_grants']} grants within {RATE.period} s; its rate is {RATE}"
        )
    if len(grants) < len(starts):
        problems.append(f"the lane {RATE_LANE!r} started {len(starts)} payloads on {len(grants)} grants")
    return out


def summary_lines(r: dict[str, Any]) -> list[str]:
    mark = "ok" if not r.get("problems") else "VIOLATED"
    return [
        f"  rate        : {r.get('started', 0)} of {r['jobs']} payloads in lane {r['lane']!r} "
        f"(laneRateLimits={r['lane']}={r['rate']}) over {r.get('seconds', 0):.1f} s: at most "
        f"{r.get('most_grants', 0)} grant(s) in any window of the rate (starts Step Functions saw: "
        f"at most {r.get('most_starts', 0)})  {mark}"
    ]

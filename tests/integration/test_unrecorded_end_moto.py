"""An end between two redrives that Sluice never recorded, read stale after the second redrive's
adoption (explorer seed 1203230958, swarm).

    e1 of k FAILED at s1, its event releases it
    operator: RedriveExecution(e1) at r1;  e1 FAILED at s2: its event frees nothing (e1 held nothing)
    operator: RedriveExecution(e1) at r2
    tick: e1 listed and described RUNNING (redriveDate r2) → adopted: earlier_end_at s1
    n2 of k: the duplicate check asks DescribeExecution(e1) → FAILED at s2 (stale: before r2)
        before: s2 is neither s1 nor the record's end → e1 released while it runs → n2 starts: k twice
        now:    the adoption kept r2, and s2 < r2: an earlier end → n2 waits behind e1

moto has no RedriveExecution, and its DescribeExecution gives no ``redriveCount``/``redriveDate``:
both are added here as AWS gives them (tests/integration/test_breaker_findings.py ``redrive``).
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from moto.core import DEFAULT_ACCOUNT_ID
from moto.stepfunctions.models import stepfunctions_backends

from sluice.core.clock import FakeClock
from sluice.core.model import PayloadState
from tests.integration.test_breaker_findings import deliver, redrive, running_of_key
from tests.integration.test_free_key_mark_attacks import skewed
from tests.support.aws import REGION, build_stack


def redrive_dates(client: Any, name: str, dates: list[datetime]) -> None:
    """DescribeExecution of ``name`` reports its redrives, as AWS does (moto reports none)."""

    def describe(parsed: dict[str, Any], **_: Any) -> None:
        if parsed.get("name") == name:
            parsed["redriveCount"] = len(dates)
            if dates:
                parsed["redriveDate"] = dates[-1]

    client.meta.events.register("after-call.sfn.DescribeExecution", describe)


def stale_end(client: Any, name: str, stop: datetime) -> Counter:
    """The next DescribeExecution of ``name`` that says RUNNING answers from before its last
    redrive, once: FAILED at ``stop``, with the redrive before it."""
    seen: Counter = Counter()

    def describe(parsed: dict[str, Any], **_: Any) -> None:
        if seen["stale"] == 0 and parsed.get("name") == name and parsed.get("status") == "RUNNING":
            seen["stale"] += 1
            parsed.update(status="FAILED", stopDate=stop, error="Boom", cause="Boom cause")
            parsed["redriveCount"] -= 1

    client.meta.events.register("after-call.sfn.DescribeExecution", describe)
    return seen


def _execution(stack: Any, name: str) -> Any:
    arn = stack.runtime().store().execution(name).arn
    return stepfunctions_backends[DEFAULT_ACCOUNT_ID][REGION].describe_execution(arn)


@pytest.mark.parametrize("judge_ahead", [0.0, 70.0])
def test_an_unrecorded_end_between_two_redrives_is_not_the_adopted_runs(session, judge_ahead):
    """``judge_ahead``: how far the clock of the container that makes the duplicate check runs
    ahead of the adopter's. On time, the adoption is younger than the window there, and no end but
    a success is believed (``young_adoption``); 70 s ahead it reads as past the window, and only
    the redrive date rules the stale end out (``before_its_redrive``)."""
    clock = FakeClock(time.time())  # Step Functions' stop dates are moto's, taken from the wall clock
    stack = build_stack(session, max_concurrency=3, clock=clock)
    stack.send({"id": "k", "n": 1}, group="a")
    stack.launcher().tick()
    (e1,) = stack.running()
    assert deliver(stack, stack.finish(e1, "FAILED", error="Boom"))
    store = stack.runtime().store()
    s1 = store.execution(e1).ended_at

    dates: list[datetime] = []
    redrive(stack, e1)
    dates.append(datetime.now(UTC))
    assert not deliver(stack, stack.finish(e1, "FAILED", error="Boom"))  # e1 held nothing: freed nothing
    s2 = _execution(stack, e1).stop_date
    assert store.execution(e1).ended_at == s1  # the second end is not recorded
    redrive(stack, e1)
    dates.append(datetime.now(UTC))

    clock.advance(120)  # the listing is past the window of the end it holds
    rt = stack.runtime()
    sfn = rt.client("stepfunctions")
    redrive_dates(sfn, e1, dates)
    rt.launcher().tick()  # reconciliation adopts e1 on a fresh RUNNING answer
    adopted = store.execution(e1)
    assert adopted.state is PayloadState.RUNNING and adopted.adopted_at is not None
    assert adopted.redriven_at == dates[-1].timestamp()
    assert adopted.earlier_end_at == s1

    stack.send({"id": "k", "n": 2}, group="b")
    clock.advance(1)
    judge = skewed(stack, judge_ahead) if judge_ahead else rt
    if judge_ahead:
        redrive_dates(judge.client("stepfunctions"), e1, dates)
    stale = stale_end(judge.client("stepfunctions"), e1, s2)
    judge.launcher().tick(reconcile_first=False)

    assert stale == Counter(stale=1)  # the stale answer was given
    assert running_of_key(stack, "k") == [e1], f"k runs {running_of_key(stack, 'k')}"
    assert store.payload("k").holder == e1
    assert store.execution(e1).state is PayloadState.RUNNING

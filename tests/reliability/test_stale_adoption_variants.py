"""Broken variants of the fixes for adoptions taken on stale answers and for runs whose state
machine vanished: each patched in for one test, the scenario of
tests/integration/test_breaker_findings.py must then fail with a wrong AWS state."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

import sluice.adapters.aws.sfn
import sluice.core.model
import sluice.launch.reconcile
from sluice.core.clock import FakeClock
from sluice.launch.completion import earlier_end
from tests.integration import test_breaker_findings as findings
from tests.support.aws import build_stack


def test_a_reconciliation_that_keeps_an_adoption_taken_on_a_stale_answer_is_caught(monkeypatch, session):
    """The end a holder had before its adoption, read a window after the adoption, taken again
    for a stale answer: the holder keeps its slot and lease for good."""
    monkeypatch.setattr(
        sluice.launch.reconcile, "_its_end", lambda info, record: info.ended and not earlier_end(info, record)
    )
    with pytest.raises(AssertionError, match="only"):
        findings.test_an_adoption_on_a_stale_running_answer_leaks_its_slot_for_good(session)


def test_a_resume_that_takes_a_vanished_machine_for_never_started_is_caught(monkeypatch, session):
    """A claim on a machine switched from and deleted, read as "never started": its payload starts
    again on the machine in use."""
    monkeypatch.setattr(sluice.adapters.aws.sfn.StepFunctionsExecutions, "vanished", lambda self, arn: False)
    with pytest.raises(AssertionError, match="started again on M2"):
        findings.test_a_resumed_claim_on_a_deleted_machine_starts_its_payload_again(session)


def test_a_running_answer_that_reports_no_redrive_is_not_adopted(session):
    """DescribeExecution's own word that no redrive followed the end (``redriveCount`` 0, as Step
    Functions reports it; moto reports none, so the hook adds it): a RUNNING answer for a released
    run is stale within the window of its end, and nothing is adopted (the launcher's clock is
    Step Functions': moto's stop dates are the wall clock's)."""
    stack = build_stack(session, max_concurrency=2, clock=FakeClock(time.time()))
    stack.send({"id": "p"}, group="a")
    stack.launcher().tick()
    (p,) = stack.running()
    assert findings.deliver(stack, stack.finish(p, "FAILED", error="Boom"))
    rt = stack.runtime()
    client = rt.client("stepfunctions")
    stale = findings.stale_once(client, p)
    reported: Counter = Counter()

    def no_redrive(parsed: dict[str, Any], **_: Any) -> None:
        if parsed.get("name") == p:
            reported["redriveCount"] += 1
            parsed["redriveCount"] = 0

    client.meta.events.register("after-call.sfn.DescribeExecution", no_redrive)
    rt.launcher().tick()
    assert stale == Counter(listed=1, described=1) and reported["redriveCount"] >= 1
    assert rt.store().ledger().holders == frozenset(), "adopted on a stale answer: it holds a slot"


def test_an_adoption_that_ignores_the_reported_redrive_count_is_caught(monkeypatch, session):
    monkeypatch.setattr(sluice.core.model.ExecutionInfo, "not_redriven_since", lambda self, ended_at: False)
    with pytest.raises(AssertionError, match="adopted on a stale answer"):
        test_a_running_answer_that_reports_no_redrive_is_not_adopted(session)

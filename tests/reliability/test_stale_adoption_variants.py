"""Broken variants of the fixes for adoptions taken on stale answers and for runs whose state
machine vanished: each patched in for one test, the scenario of
tests/integration/test_breaker_findings.py must then fail with a wrong AWS state."""

from __future__ import annotations

import pytest

import sluice.adapters.sfn
import sluice.reconcile
from sluice.completion import earlier_end
from tests.integration import test_breaker_findings as findings


def test_a_reconciliation_that_keeps_an_adoption_taken_on_a_stale_answer_is_caught(monkeypatch, session):
    """The end a holder had before its adoption, read a window after the adoption, taken again
    for a stale answer: the holder keeps its slot and lease for good."""
    monkeypatch.setattr(
        sluice.reconcile, "_its_end", lambda info, record: info.ended and not earlier_end(info, record)
    )
    with pytest.raises(AssertionError, match="only"):
        findings.test_an_adoption_on_a_stale_running_answer_leaks_its_slot_for_good(session)


def test_a_resume_that_takes_a_vanished_machine_for_never_started_is_caught(monkeypatch, session):
    """A claim on a machine switched from and deleted, read as "never started": its payload starts
    again on the machine in use."""
    monkeypatch.setattr(sluice.adapters.sfn.StepFunctionsExecutions, "vanished", lambda self, arn: False)
    with pytest.raises(AssertionError, match="started again on M2"):
        findings.test_a_resumed_claim_on_a_deleted_machine_starts_its_payload_again(session)

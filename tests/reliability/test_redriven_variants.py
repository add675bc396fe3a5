"""Broken variants for the redriven mark and the start mark: each patched in for one test, and the
scenario that pins the fix down (it passes on Sluice as it is, in
tests/integration/test_breaker_findings.py) must then fail with a wrong AWS state (two runs of one
key at once). Any other error fails the test."""

from __future__ import annotations

import pytest

import sluice.launch.message_branches
from sluice.adapters.dynamo.store import DynamoStore
from tests.integration import test_breaker_findings as findings


def test_a_resume_that_ignores_the_redriven_mark_after_a_crash_is_caught(monkeypatch, session):
    """The resumed claim renews (lifting the start mark the crash left) and starts beside the
    redriven run whose block the mark refused."""
    monkeypatch.setattr(
        sluice.launch.message_branches.MessageBranches, "_yield_to_redriven", lambda *args: False
    )
    with pytest.raises(AssertionError, match="two runs of key j at once"):
        findings.test_a_crash_after_the_start_mark_then_a_redrive_runs_the_key_twice(session)


def test_a_resume_that_ignores_the_redriven_mark_after_an_unsure_start_is_caught(monkeypatch, session):
    """The retry of an unsure start renews (lifting its start mark) and starts beside the redriven
    run whose block the mark refused."""
    monkeypatch.setattr(
        sluice.launch.message_branches.MessageBranches, "_yield_to_redriven", lambda *args: False
    )
    with pytest.raises(AssertionError, match="two runs of key j at once"):
        findings.test_an_unsure_start_after_the_mark_then_a_redrive_runs_the_key_twice(session)


def one_redriven_mark(self: DynamoStore, *, key: str, name: str, now: float, by: str | None = None) -> bool:
    """A key that keeps one redriven mark: a second redriven run's mark overwrites the first's."""
    return self.db.update_if(
        f"PAYLOAD#{key}",
        "SET redriven = :name, updated_at = :now",
        "attribute_exists(holder) AND holder <> :name",
        {":name": {"S": name}, ":now": {"N": str(now)}},
        names={},
    )


def test_a_key_that_keeps_one_redriven_mark_is_caught(monkeypatch, session):
    """The first mark is lost: once the second run is adopted and ends, its completion's refill
    takes the free, unmarked lease and starts beside the first."""
    monkeypatch.setattr(DynamoStore, "mark_redriven", one_redriven_mark)
    with pytest.raises(AssertionError, match="runs of k at once"):
        findings.test_two_redriven_runs_of_a_held_key_leave_one_unmarked_and_a_refill_starts_beside_it(
            session
        )


def test_a_mark_stamped_at_its_first_sighting_only_is_caught(monkeypatch, session):
    """A reconciliation that sees the marked run again writes nothing: the stamping clock judges the
    mark old seconds after a later redrive, believes a stale end, and starts beside the run."""
    from sluice.core.model import PayloadRecord
    from tests.integration import test_mark_stamp_attacks as attacks

    monkeypatch.setattr(
        PayloadRecord,
        "sighting_moves_nothing",
        lambda self, name: self.redriven == name or name in self.redriven_more,
    )
    with pytest.raises(AssertionError, match="two runs of key k at once"):
        attacks.test_one_real_redrive_after_a_mark_from_a_stale_listing(session)


def test_a_mark_lifted_whatever_was_written_since_is_caught(monkeypatch, session):
    """The lift not conditioned on the stamp it judged: a sighting between the fresh answer and the
    lift is lost, and the claim starts beside the run redriven meanwhile."""
    from tests.integration import test_mark_stamp_attacks as attacks

    monkeypatch.setattr(
        DynamoStore,
        "clear_redriven",
        lambda self, *, key, name, as_read=None: self.marks.clear_redriven(key=key, name=name),
    )
    with pytest.raises(AssertionError, match="two runs of key k at once"):
        attacks.test_claim_clears_a_mark_a_reconciler_just_saw_running(session)

"""Broken variants of a run-once holder released as vanished (its state machine deleted, its end's
event lost: the outcome unknown): each patched in for one test, and the scenario that pins the fix
down (it passes on Sluice as it is, in tests/integration/test_breaker_findings.py and
test_vanished_once_moto.py) must then fail with a wrong AWS state: the key's once-message started,
or its record put under TTL. Any other error fails the test."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

import sluice.adapters.dynamo.claims
import sluice.adapters.dynamo.codec
import sluice.adapters.dynamo.release
import sluice.launch.launcher
import sluice.launch.reconcile
from sluice.adapters.dynamo.release import ReleasesTable
from tests.integration import test_breaker_findings as findings
from tests.integration import test_vanished_once_moto as vanished

ORIGINAL_ONLY_ONCE = sluice.adapters.dynamo.codec.only_once
ORIGINAL_RELEASE_ITEMS = ReleasesTable._release_items
ORIGINAL_COMPLETE = sluice.launch.reconcile.complete
ORIGINAL_RECONCILE = sluice.launch.reconcile.reconcile


def caught(scenario: Callable[[Any], None], session: Any, match: str) -> None:
    with pytest.raises(AssertionError, match=match):
        scenario(session)


def only_once_unmarked(items: list[dict[str, Any]]) -> None:
    """A run-once claim's condition that reads ``succeeded_by`` only (as before the fix)."""
    ORIGINAL_ONLY_ONCE(items)
    update = items[1]["Update"]
    update["ConditionExpression"] = update["ConditionExpression"].replace(
        " AND attribute_not_exists(once_unknown)", ""
    )


def complete_as_any_release(**kwargs: Any) -> Any:
    """Reconciliation's release of a vanished holder written as any other release: no mark."""
    kwargs["ending"] = replace(kwargs["ending"], outcome_unknown=False)
    return ORIGINAL_COMPLETE(**kwargs)


def release_items_under_ttl(
    self: ReleasesTable, record: Any, ending: Any, *known: Any
) -> list[dict[str, Any]]:
    """The mark written, but the record left under TTL: a year on, the mark is gone with it."""
    items = ORIGINAL_RELEASE_ITEMS(self, record, ending, *known)
    update = items[1]["Update"]
    if "once_unknown" in update["UpdateExpression"]:
        set_part, remove_part = update["UpdateExpression"].split(" REMOVE ")
        update["UpdateExpression"] = f"{set_part}, expires_at = :ttl REMOVE " + remove_part.replace(
            ", expires_at", ""
        )
        update["ExpressionAttributeValues"][":ttl"] = {
            "N": str(int(ending.end.now) + self.db.retention_seconds)
        }
    return items


class _NeverVanished:
    """Step Functions as reconciliation asked it before: a claim absent on a deleted machine is
    taken for one that never started (two sightings, released as abandoned, no mark)."""

    def __init__(self, executions: Any) -> None:
        self._executions = executions

    def vanished(self, arn: str | None) -> bool:
        return False

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._executions, attr)


def reconcile_never_vanished(**kwargs: Any) -> Any:
    kwargs["executions"] = _NeverVanished(kwargs["executions"])
    return ORIGINAL_RECONCILE(**kwargs)


def test_a_once_claim_that_ignores_the_mark_is_caught(monkeypatch, session):
    monkeypatch.setattr(sluice.adapters.dynamo.claims, "only_once", only_once_unmarked)
    monkeypatch.setattr(sluice.adapters.dynamo.release, "only_once", only_once_unmarked)
    caught(
        findings.test_a_vanished_run_once_success_lets_the_key_run_once_more,
        session,
        "a run-once key whose run SUCCEEDED started again",
    )


def test_a_vanished_release_that_writes_no_mark_is_caught(monkeypatch, session):
    monkeypatch.setattr(sluice.launch.reconcile, "complete", complete_as_any_release)
    caught(
        findings.test_a_vanished_run_once_success_lets_the_key_run_once_more,
        session,
        "a run-once key whose run SUCCEEDED started again",
    )


def test_a_mark_left_under_ttl_is_caught(monkeypatch, session):
    monkeypatch.setattr(ReleasesTable, "_release_items", release_items_under_ttl)
    caught(
        vanished.test_the_mark_outlives_retention,
        session,
        "the mark expired",
    )


def test_a_claim_on_a_deleted_machine_taken_for_an_unstarted_one_is_caught(monkeypatch, session):
    monkeypatch.setattr(sluice.launch.launcher, "reconcile", reconcile_never_vanished)
    caught(
        vanished.test_a_once_claim_on_a_deleted_machine_is_released_as_vanished_and_marks_its_key,
        session,
        "a claim on a deleted machine kept its slot",
    )


def test_a_claim_on_a_deleted_machine_released_as_abandoned_runs_its_once_key_again(monkeypatch, session):
    monkeypatch.setattr(sluice.launch.launcher, "reconcile", reconcile_never_vanished)
    caught(
        vanished.test_a_once_claim_on_a_deleted_machine_never_lets_its_key_run_again,
        session,
        "a run-once key whose run SUCCEEDED started again",
    )

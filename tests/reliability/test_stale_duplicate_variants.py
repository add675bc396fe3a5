"""Broken variants of the duplicate check's and the redriven mark's rules under a stale
DescribeExecution (docs/protocol.md, "Staleness"): each patched in for one test, the scenario of
tests/integration/test_stale_duplicate_moto.py or tests/integration/test_breaker_findings.py must
then fail with a broken promise or a wrong AWS state."""

from __future__ import annotations

from typing import Any

import pytest

import sluice.adapters.aws.sqs
import sluice.adapters.dynamo.store
import sluice.launch.admission
import sluice.launch.message_branches
from sluice.core.model import Outcome
from tests.integration import test_second_look_breaks as second_look
from tests.integration import test_stale_describe_moto as stale_describe
from tests.integration import test_stale_duplicate_moto as stale_duplicate
from tests.reliability.promises import PromiseBroken


def test_a_duplicate_check_that_drops_on_its_first_running_answer_is_caught(monkeypatch, make_world):
    """The sighting read as made already: the first RUNNING answer, stale, drops a re-submission sent
    after its key's run ended (promise 3)."""
    monkeypatch.setattr(sluice.adapters.dynamo.store.DynamoStore, "first_sighting", lambda self, **_: False)
    with pytest.raises(PromiseBroken, match="promise 3"):
        stale_duplicate.test_a_resubmission_sent_after_its_keys_run_ended_runs(make_world)


def test_a_recheck_that_returns_the_message_at_once_is_caught(monkeypatch, make_world):
    """The message sent back without the consistency window: seen again at once, its answer is as
    stale as the first, and the re-submission is dropped (promise 3)."""
    release = sluice.adapters.aws.sqs.SqsQueue.release

    def at_once(self: Any, messages: Any, delay_seconds: int = 0) -> None:
        release(self, messages, 0)

    monkeypatch.setattr(sluice.adapters.aws.sqs.SqsQueue, "release", at_once)
    with pytest.raises(PromiseBroken, match="promise 3"):
        stale_duplicate.test_a_resubmission_is_not_seen_again_before_the_window(make_world)


def test_a_recheck_that_lets_its_group_run_ahead_is_caught(monkeypatch, make_world):
    """The message sent back for the window, the pass going on with its group's later messages:
    q of the same group starts before p's re-submission, out of order."""

    class NoStop:
        """``Outcome`` as the launcher sees it, with a RECHECK that never matches."""

        RECHECK = object()

        def __getattr__(self, name: str) -> Any:
            return getattr(Outcome, name)

    monkeypatch.setattr(sluice.launch.admission, "Outcome", NoStop())
    with pytest.raises(AssertionError, match="q started before"):
        stale_duplicate.test_the_group_behind_a_rechecked_message_waits_in_order(make_world)


# (A redriven mark judged by a stale rule for good, the end its record holds taken for a stale
# answer however old the mark: it held the key's messages back for good, suppressed as the adopted
# run's duplicates. Since an ended answer never suppresses a message, only parks it behind the
# holder until reconciliation releases it, that rule only delays them: no longer a break to catch.)


def test_a_redriven_mark_lifted_on_any_end_its_record_holds_is_caught(monkeypatch, make_world):
    """The window of the mark ignored: a marked run answered with its earlier end (stale, just
    after a real redrive) is taken as ended, the mark lifted, and the key claimed beside it
    (promise 2). Every window the duplicate check reads is taken as past: the mark's, and the
    young adoption's of the run it then adopts (either alone holds the key)."""
    branches = sluice.launch.message_branches.MessageBranches
    monkeypatch.setattr(branches, "_window_past", lambda self, since, windows=1: True)
    monkeypatch.setattr(branches, "_adopted_within_the_window", lambda self, record: False)
    with pytest.raises((AssertionError, PromiseBroken)):
        stale_describe.test_a_marked_key_answered_with_its_redriven_runs_earlier_end_is_not_lifted(make_world)


def test_an_adopted_holders_earlier_end_taken_for_stale_for_good_is_caught(monkeypatch, session):
    """The end an adopted holder had before its adoption taken for a stale answer however old the
    adoption: the re-submission is held back behind a run that ended, and nothing starts."""
    monkeypatch.setattr(
        sluice.launch.message_branches.MessageBranches,
        "_adopted_within_the_window",
        lambda self, record: True,
    )
    with pytest.raises(AssertionError, match="assert 0 == 1"):
        stale_duplicate.test_a_resubmission_behind_an_adoption_taken_on_a_stale_answer_runs(session)


def test_a_duplicate_check_that_drops_behind_a_vanished_holder_is_caught(monkeypatch, session):
    """A holder whose state machine was deleted taken for a running one: seen twice, the
    re-submission is dropped behind a run that had ended before it was sent (promise 3)."""
    monkeypatch.setattr(
        sluice.launch.message_branches.MessageBranches, "_vanished", lambda self, record: False
    )
    with pytest.raises(AssertionError, match="dropped behind a run that ended"):
        stale_duplicate.test_a_resubmission_behind_a_holder_on_a_deleted_machine_runs(session)


def test_a_sighting_that_ignores_its_receive_is_caught(monkeypatch, make_world):
    """The sighting's condition without the receive that made it: the retry of a write whose first
    attempt landed reads as a second sighting, and the re-submission is dropped at first sight."""

    def any_receive(self: Any, *, key: str, message_id: str, receipt: str, now: float) -> bool:
        return self.db.update_if(
            f"SIGHT#{message_id}",
            "SET #key = :key, sighted_at = :now",
            "attribute_not_exists(pk)",
            {":key": {"S": key}, ":now": {"N": str(now)}},
            names={"#key": "key"},
        )

    monkeypatch.setattr(sluice.adapters.dynamo.store.DynamoStore, "first_sighting", any_receive)
    with pytest.raises(PromiseBroken, match="promise 3"):
        second_look.test_a_retried_sighting_write_drops_the_message_at_first_sight(make_world)


def test_a_failed_sighting_taken_for_a_failure_of_the_tick_is_caught(monkeypatch, make_world):
    """A sighting write that raised handled as any transient error: the message goes back with its
    batch at once, is received again within the window and dropped on as stale an answer."""

    def raises(self: Any, payload: Any) -> bool:
        return self.ctx.store.first_sighting(
            key=payload.key,
            message_id=payload.message.message_id,
            receipt=payload.message.receipt_handle[:32],
            now=self.ctx.clock.now(),
        )

    monkeypatch.setattr(sluice.launch.message_branches.MessageBranches, "_first_sighting", raises)
    with pytest.raises(AssertionError):
        second_look.test_a_lost_answer_to_the_sighting_returns_the_message_within_the_window(make_world)


def test_a_recheck_that_does_not_sight_its_group_behind_it_is_caught(monkeypatch, session):
    """The group's later messages handed back unsighted: each duplicate ahead is a first sighting in
    turn, each returning the fresh message behind them, one receive each."""
    monkeypatch.setattr(
        sluice.launch.message_branches.MessageBranches, "sight_behind", lambda self, m, behind: None
    )
    with pytest.raises(AssertionError):
        second_look.test_duplicates_ahead_in_a_group_cost_a_fresh_message_one_receive(session)


def test_a_recheck_that_sights_other_groups_is_caught(monkeypatch, session):
    """Every message handed back sighted, of any group: one of another group, not held behind the
    rechecked message, is received again at once and its next refusal taken for a second look."""
    sight = sluice.launch.message_branches.MessageBranches.sight_behind

    def any_group(self: Any, message: Any, behind: Any) -> None:
        sight(self, message, [m.__class__(**{**_fields(m), "group_id": message.group_id}) for m in behind])

    def _fields(m: Any) -> dict[str, Any]:
        return {f: getattr(m, f) for f in m.__dataclass_fields__}

    monkeypatch.setattr(sluice.launch.message_branches.MessageBranches, "sight_behind", any_group)
    with pytest.raises(AssertionError):
        second_look.test_only_the_rechecked_message_s_own_group_is_sighted_behind_it(session)

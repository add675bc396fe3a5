"""Broken variants for issue 25's breaks 3 and 4 and DescribeExecution's staleness (section 2):
each patched in for one test, and the scenario that pins the fix down (it passes on Sluice as it is,
in tests/integration/test_key_breaks_moto.py and test_stale_describe_moto.py) must then fail with a
broken promise or a wrong AWS state. Any other error fails the test."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

import sluice.adapters.aws.sfn
import sluice.launch.completion
import sluice.launch.message_branches
import sluice.launch.reconcile
from sluice.adapters.dynamo.claims import ClaimsTable
from sluice.adapters.dynamo.store import DynamoStore
from sluice.core.model import PayloadState
from tests.integration import test_key_breaks_moto as breaks
from tests.integration import test_stale_describe_moto as stale
from tests.reliability.promises import PromiseBroken
from tests.reliability.world import World

CAUGHT = (PromiseBroken, AssertionError)


def caught(scenario: Callable[[Any], None], make_world: Any, match: str) -> None:
    with pytest.raises(CAUGHT, match=match):
        scenario(make_world)


def unfenced_mark(self: DynamoStore, *, name: str, now: float, copy_id: str | None = None) -> bool:
    """A start mark that ignores a block: the start goes ahead whatever reconciliation wrote."""
    return self.db.update_if(
        f"EXEC#{name}",
        "SET starting_at = :now",
        "#state = :claimed",
        {":now": {"N": str(now)}, ":claimed": {"S": PayloadState.CLAIMED.value}},
    )


def unfenced_block(self: DynamoStore, *, name: str, by: str, now: float) -> bool:
    """A block that ignores the start mark (as before the fix): it lands after the commit point."""
    return self.db.update_if(
        f"EXEC#{name}",
        "SET blocked_by = :by",
        "#state = :claimed",
        {":by": {"S": by}, ":claimed": {"S": PayloadState.CLAIMED.value}},
    )


def unmarked_claims(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A claim written without its start mark (and no mark written after it): a block between the
    claim and its start lands, and the start goes ahead. Returns the names claimed unmarked."""
    original = ClaimsTable._record_item
    unmarked: list[str] = []

    def record_item(self: ClaimsTable, *args: Any, **kwargs: Any) -> dict[str, Any]:
        put = original(self, *args, **kwargs)
        if put["Put"]["Item"].pop("starting_at", None) is not None:
            unmarked.append(put["Put"]["Item"]["name"]["S"])
        return put

    monkeypatch.setattr(ClaimsTable, "_record_item", record_item)
    return unmarked


def test_a_start_that_ignores_its_block_is_caught(monkeypatch, make_world):
    monkeypatch.setattr(DynamoStore, "mark_starting", unfenced_mark)
    caught(breaks.test_a_resumed_claim_blocked_before_its_start_mark_never_starts, make_world, "promise 2")


def test_a_hand_over_claim_without_its_start_mark_is_caught(monkeypatch, make_world):
    unmarked = unmarked_claims(monkeypatch)
    caught(
        breaks.test_a_hand_over_claim_carries_its_start_mark_so_a_block_before_its_start_is_refused,
        make_world,
        "promise 2",
    )
    assert unmarked, "no claim was written without its mark"


def lifting_any_mark(self: DynamoStore, *, copy_id: str | None = None, **kwargs: Any) -> bool:
    """A renewal that lifts the start mark whichever copy of the message wrote it."""
    return ORIGINAL_RENEW(self, **kwargs)


ORIGINAL_RENEW = DynamoStore.renew


@pytest.mark.parametrize("point", ["after_claim", "before_start"])
def test_a_copy_that_lifts_another_copys_mark_is_caught(monkeypatch, make_world, point):
    monkeypatch.setattr(DynamoStore, "renew", lifting_any_mark)
    caught(
        lambda w: breaks.test_a_copy_of_the_message_never_lifts_the_mark_of_a_claim_about_to_start(w, point),
        make_world,
        "started without holding a slot|promise 2",
    )


def test_a_resume_that_reads_no_copy_is_caught(monkeypatch, make_world):
    read = DynamoStore.execution
    monkeypatch.setattr(
        DynamoStore,
        "execution",
        lambda self, name: None if (r := read(self, name)) is None else replace(r, copy_id=None),
    )
    caught(breaks.test_a_resume_never_gives_back_a_claim_another_copy_renewed_since, make_world, "given back")


def test_a_block_past_the_start_mark_is_caught(monkeypatch, make_world):
    monkeypatch.setattr(DynamoStore, "block", unfenced_block)
    # The world's check of the table sees the block on the marked claim before the scenario's own assertion.
    caught(
        breaks.test_a_block_after_the_start_mark_is_refused_and_the_key_marked,
        make_world,
        "block landed|blocked for a redriven run of its key after its start mark",
    )


def test_a_reconciliation_that_keeps_a_vanished_holder_is_caught(monkeypatch, session):
    monkeypatch.setattr(sluice.launch.reconcile, "_release_vanished", lambda *args: 0)
    with pytest.raises(AssertionError, match="released_by_reconcile"):
        breaks.test_a_holder_of_a_deleted_state_machine_is_released(session)


def test_a_deleted_machine_taken_for_a_configuration_error_is_caught(monkeypatch, session):
    monkeypatch.setattr(sluice.adapters.aws.sfn, "_machine_of", lambda arn: "every machine is current")
    with pytest.raises(AssertionError, match="released_by_reconcile"):
        breaks.test_a_holder_whose_state_machine_does_not_exist_is_released(session)


# -- section 2: DescribeExecution answering stale (tests/integration/test_stale_describe_moto.py) --------


def lifted_on_any_end(self: Any, redriven: str, marked: Any) -> Any:
    """``MessageBranches._still_runs`` that takes any end for proof that the marked run ended."""
    record = self.ctx.store.execution(redriven)
    info = self.ctx.executions.describe(redriven, record.arn if record is not None else None)
    return info if info is not None and not info.ended else None


def test_an_earlier_end_taken_for_a_new_one_is_caught(monkeypatch):
    """By the mark's check and by the duplicate check of a young adoption alike (either alone is
    held by the other: reconciliation adopts first here)."""
    monkeypatch.setattr(sluice.launch.message_branches.MessageBranches, "_still_runs", lifted_on_any_end)
    monkeypatch.setattr(
        sluice.launch.message_branches.MessageBranches,
        "_adopted_within_the_window",
        lambda self, record: False,
    )
    with pytest.raises(CAUGHT, match="promise 2"):
        run_stale(stale.test_a_marked_key_answered_with_its_redriven_runs_earlier_end_is_not_lifted)


def test_a_duplicate_check_that_trusts_an_earlier_end_is_caught(monkeypatch):
    monkeypatch.setattr(
        sluice.launch.message_branches.MessageBranches,
        "_adopted_within_the_window",
        lambda self, record: False,
    )
    with pytest.raises(CAUGHT, match="promise 2"):
        run_stale(stale.test_a_duplicate_of_a_just_adopted_run_answered_with_its_earlier_end)


def test_a_completion_that_asks_about_an_earlier_end_is_caught(monkeypatch):
    monkeypatch.setattr(
        sluice.launch.completion,
        "_not_its_earlier_end",
        lambda change, now, window, judge: lambda record: True,
    )
    with pytest.raises(CAUGHT, match="released by its earlier end"):
        run_stale(stale.test_an_event_of_the_earlier_run_after_an_adoption_releases_nothing)


def run_stale(scenario: Callable[[Any], None]) -> None:
    """Run a scenario of test_stale_describe_moto.py with worlds closed afterwards."""
    worlds: list[World] = []

    def make(**kwargs: Any) -> World:
        worlds.append(World(**kwargs))
        return worlds[-1]

    try:
        scenario(make)
    finally:
        for world in worlds:
            world.close()

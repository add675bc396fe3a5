"""Explorer seed 1503073754 (swarm, 120 steps, draining step 528): promise 1 broken because a
reconciliation released a redriven, adopted run on the end it had read before the redrive.

    reconciler B (tick)                        meanwhile
    H1 holds e1; ListExecutions: e1 absent
    DescribeExecution(e1): FAILED at s1
    release(e1): reads EXEC#e1, not adopted
                                               e1 released (its event, or another reconciliation);
                                               the operator redrives e1 (r1 > s1); reconciler C
                                               lists it RUNNING and adopts it (slot, lease back)
    TransactWriteItems IF not adopted     ✗
    reads EXEC#e1 again: adopted at r1 ...
    TransactWriteItems IF adopted as read ✓    (e1's end s1 is before its redrive r1, and the
                                                adoption is young: B never saw it)
    → e1 RUNNING with no slot, no lease, counted nowhere: a claim takes its slot (MAX 1, two run)

The duplicate check's settle judges the end again against the record its release reads
(``MessageBranches._holder_ended``, seed 1206301599); reconciliation's ``_release_ended`` gives
``complete`` no ``confirm``, and ``ReleasesTable._end`` then releases the adopted record it read
again without judging it. On moto with the real adapters; the interleaving by botocore hooks.
"""

from __future__ import annotations

from typing import Any

import pytest
from moto.core import DEFAULT_ACCOUNT_ID
from moto.stepfunctions.models import stepfunctions_backends

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from tests.integration.test_free_key_mark_attacks import skewed
from tests.integration.test_young_adoption_attacks import _release_of, at, finish_at
from tests.support.aws import REGION, build_stack


def _redrive(stack, name: str) -> float:
    """RedriveExecution (moto has none): RUNNING again, counted as redriven. Returns its date."""
    arn = stack.runtime().store().execution(name).arn
    execution = stepfunctions_backends[DEFAULT_ACCOUNT_ID][REGION].describe_execution(arn)
    assert execution.status == "FAILED"
    execution.status, execution.stop_date = "RUNNING", None
    execution.error = execution.cause = None
    execution.redrive_count = getattr(execution, "redrive_count", 0) + 1  # (tests.support.moto_patches)
    return stack.clock.now()


def test_a_reconciliation_that_read_an_end_before_a_redrive_and_its_adoption_releases_nothing(session):
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=1, clock=clock)  # one slot shard
    stack.send({"id": "k", "n": 1}, group="a")
    stack.launcher().tick()
    (e1,) = stack.running()
    clock.advance(100)  # its claim past the consistency window: reconciliation judges it
    event = finish_at(stack, e1, "FAILED")  # s1; its event is on the way
    s1 = clock.now()
    clock.advance(4)

    b = skewed(stack, 27)  # reconciler B, its own container and clock (27 s ahead, as in the run)
    fired: list[str] = []

    def redriven_and_adopted(params: dict[str, Any], **_: Any) -> None:
        if fired or not _release_of(params, e1):
            return
        fired.append("release write")
        # e1 released on its event (in the run: another launcher's reconciliation, same end)
        released, _, _ = stack.runtime().launcher().on_status_change(StatusChange.from_event(event))
        assert released
        clock.advance(4)
        r1 = _redrive(stack, e1)  # the operator redrives it
        assert r1 > s1
        clock.advance(1)
        c = stack.runtime()  # reconciler C adopts it: DescribeExecution says RUNNING, redriven at r1

        def redriven_answer(parsed: dict[str, Any], **_: Any) -> None:
            if parsed.get("name") == e1 and parsed.get("status") == "RUNNING":
                parsed["redriveCount"], parsed["redriveDate"] = 1, at(r1)

        c.client("stepfunctions").meta.events.register("after-call.sfn.DescribeExecution", redriven_answer)
        c.launcher().tick()
        adopted = stack.runtime().store().execution(e1)
        assert adopted is not None and adopted.adopted_at is not None
        assert adopted.redriven_at is not None and adopted.redriven_at > s1
        assert stack.runtime().store().payload("k").holder == e1
        fired.append("adopted")

    b.client("dynamodb").meta.events.register(
        "before-parameter-build.dynamodb.TransactWriteItems", redriven_and_adopted
    )
    b.launcher().tick()  # B's reconciliation judges e1 on the FAILED it read before the redrive
    assert fired == ["release write", "adopted"]

    store = stack.runtime().store()
    assert stack.running() == [e1]  # e1 runs again, redriven
    # An adopted run is released only on an end after its redrive, and not while its adoption is
    # young by the judging clock (docs/protocol.md, Staleness): e1 keeps its slot and its lease.
    assert store.payload("k").holder == e1, "the redriven, adopted e1 was released on its earlier end"
    assert store.ledger().holders == {e1}

    # What the run met next: another key's message claimed before any reconciliation lists e1.
    stack.send({"id": "x"}, group="b")
    stack.launcher().tick(reconcile_first=False, linger=False)
    assert len(stack.running()) <= 1, f"MAX 1, but {stack.running()} run"


def test_a_reconciliation_that_releases_without_judging_again_is_caught(session, monkeypatch):
    """The variant ``reconcile_release_unconfirmed`` (tests/explorer/broken.py, the code before the
    fix) fails the race above."""
    from tests.explorer.broken import VARIANTS

    for owner, attr, value in VARIANTS["reconcile_release_unconfirmed"][1]:
        monkeypatch.setattr(owner, attr, value)
    with pytest.raises(AssertionError, match="released on its earlier end"):
        test_a_reconciliation_that_read_an_end_before_a_redrive_and_its_adoption_releases_nothing(session)

"""Breaks of the protocol found by an independent review, on moto with the real adapters and the
real launcher and handlers. Each is strict-xfail: it fails on the code as it is, and flips when fixed."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from moto.core import DEFAULT_ACCOUNT_ID
from moto.stepfunctions.models import stepfunctions_backends

from sluice.clock import FakeClock
from sluice.completion import StatusChange, handle_status_change
from sluice.model import PayloadState
from tests.support.aws import REGION, build_stack
from tests.support.hooks import Crash, receipts_of


def deliver(stack, event) -> bool:
    rt = stack.runtime()
    return handle_status_change(
        StatusChange.from_event(event),
        store=rt.store(),
        queue=rt.queue(),
        state_machine_arn=stack.settings.state_machine_arn,
        now=stack.clock.now(),
    )


def redrive(stack, name: str) -> None:
    """An operator's RedriveExecution of an ended run: RUNNING again, same name and ARN (moto has
    no RedriveExecution: the reverse of ``Stack.finish`` on moto's record)."""
    arn = stack.runtime().store().execution(name).arn
    execution = stepfunctions_backends[DEFAULT_ACCOUNT_ID][REGION].describe_execution(arn)
    assert execution.status in ("FAILED", "TIMED_OUT", "ABORTED")
    execution.status, execution.stop_date = "RUNNING", None
    execution.error = execution.cause = None


def crash_before_start(client: Any) -> Counter:
    """The launcher dies between its start mark and StartExecution (the mark is written)."""
    seen: Counter = Counter()

    def hook(**_: Any) -> None:
        seen["crashed"] += 1
        raise Crash("stopped after the start mark, before StartExecution")

    client.meta.events.register("before-call.sfn.StartExecution", hook)
    return seen


def running_of_key(stack, key: str) -> list[str]:
    store = stack.runtime().store()
    return [n for n in stack.running() if (r := store.execution(n)) is not None and r.key == key]


@pytest.mark.xfail(
    strict=True,
    reason="a start mark left by a crash fences off the block; the resumed claim starts beside a redriven run of its key",
)
def test_a_crash_after_the_start_mark_then_a_redrive_runs_the_key_twice(session):
    """e1 of key j FAILED and was released. n2 of j is claimed and marked starting; the launcher
    dies before StartExecution. The operator redrives e1. Reconciliation lists e1 running: adopt
    refused (n2 holds j), block(n2) refused (n2's mark). n2's message returns: the resumed claim
    renews (lifting the mark), marks again and starts: e1 and n2 of j run at once."""
    stack = build_stack(session, max_concurrency=5, clock=FakeClock())
    stack.send({"id": "j", "n": 1}, group="a")
    stack.launcher().tick()
    (e1,) = stack.running()
    assert deliver(stack, stack.finish(e1, "FAILED", error="Boom"))

    stack.send({"id": "j", "n": 2}, group="b")
    rt = stack.runtime()
    crashed = crash_before_start(rt.client("stepfunctions"))
    receipts = receipts_of(rt.client("sqs"))
    with pytest.raises(Crash):
        rt.launcher().tick(reconcile_first=False)
    assert crashed["crashed"] == 1
    store = stack.runtime().store()
    (n2,) = [h for h in store.ledger().holders]
    assert store.execution(n2).starting_at is not None and store.execution(n2).state is PayloadState.CLAIMED

    redrive(stack, e1)
    stack.launcher().tick()  # reconciliation: adopt(e1) refused, block(n2) refused by the mark
    assert store.payload("j").redriven == e1 and store.execution(n2).blocked_by is None
    assert running_of_key(stack, "j") == [e1]

    stack.visible_again(receipts)  # n2's message back after its visibility timeout
    stack.launcher().tick()
    assert len(running_of_key(stack, "j")) <= 1, f"two runs of key j at once: {running_of_key(stack, 'j')}"

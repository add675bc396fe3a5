"""Attacks on 9e85127: a holder seen running that DescribeExecution reports missing, on a state
machine that exists, keeps its slot (the answer taken as stale) until its machine is deleted after a
switch or Step Functions' retention (``HISTORY_KEPT_SECONDS``) has passed. Can such a holder leak?
An execution truly gone from a machine that exists: the machine deleted and created again under the
same name (same ARN, no executions: a Terraform replace, an operator's re-deploy). The real launcher
and reconciliation on moto; strict-xfail where a promise breaks (two leaks, and a name started twice
by the same recreation of a claim's machine, which predates 9e85127)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from moto.core import DEFAULT_ACCOUNT_ID

from sluice.core.clock import FakeClock
from sluice.core.model import PayloadState
from sluice.launch.reconcile import HISTORY_KEPT_SECONDS
from sluice.ops.status import overview
from tests.support.aws import WORKFLOW, Stack, build_stack, new_machine
from tests.support.hooks import Crash, crash_after, error_answer, receipts_of

DAY = 86_400


def recreate(stack: Stack, arn: str) -> None:
    """DeleteStateMachine, then CreateStateMachine under the same name: the same ARN, and none of
    the executions it had (a Standard machine's deletion stops them; their events may be lost)."""
    sfn = stack.client("stepfunctions")
    sfn.delete_state_machine(stateMachineArn=arn)
    again = sfn.create_state_machine(
        name=arn.split(":")[6],
        definition=json.dumps(WORKFLOW),
        roleArn=f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:role/sluice-test-sfn",
    )["stateMachineArn"]
    assert again == arn


def _request(params: dict[str, Any]) -> dict[str, Any]:
    """The API parameters of a ``before-call`` hook's serialized request (a JSON body)."""
    body = params.get("body") or b"{}"
    return json.loads(body.decode() if isinstance(body, bytes) else body)


class _Ok:
    status_code = 200
    headers: dict[str, str] = {}
    content = b""


def unlisted(client: Any, *, times: int | None = None) -> dict[str, int]:
    """ListExecutions (RUNNING) answered with an empty page, as an eventually consistent listing
    that has not caught up; nothing sent."""
    seen = {"unlisted": 0}

    def hook(params: dict[str, Any], **_: Any) -> Any:
        if _request(params).get("statusFilter") != "RUNNING" or (
            times is not None and seen["unlisted"] >= times
        ):
            return None
        seen["unlisted"] += 1
        return _Ok(), {"executions": [], "ResponseMetadata": {"HTTPStatusCode": 200, "HTTPHeaders": {}}}

    client.meta.events.register("before-call.sfn.ListExecutions", hook)
    return seen


def start_and_mark_running(stack: Stack, key: str = "k") -> str:
    """A message of ``key`` starts e1; a tick a window later, its listing behind, asks
    DescribeExecution and marks e1 RUNNING. Returns e1."""
    stack.send({"id": key}, group=key)
    stack.launcher().tick()
    (e1,) = stack.running()
    stack.clock.advance(61)
    rt = stack.runtime()
    seen = unlisted(rt.client("stepfunctions"), times=1)
    rt.launcher().tick()
    assert seen["unlisted"] == 1
    assert stack.runtime().store().execution(e1).state is PayloadState.RUNNING
    return e1


def holders(stack: Stack) -> frozenset[str]:
    return stack.runtime().store().ledger().holders


def missing_for(client: Any, arn: str) -> dict[str, int]:
    """DescribeExecution of ``arn`` answered ExecutionDoesNotExist (a stale answer), nothing sent."""
    seen = {"missing": 0}

    def hook(params: dict[str, Any], **_: Any) -> Any:
        if _request(params).get("executionArn") != arn:
            return None
        seen["missing"] += 1
        return error_answer("ExecutionDoesNotExist", 400)

    client.meta.events.register("before-call.sfn.DescribeExecution", hook)
    return seen


# -- breaks --------------------------------------------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="documented limit (docs/operations.md, Switch the state machine: never remake a machine under "
    "the name of one Sluice held runs on): its RUNNING holder reads as a stale answer for 456 days",
)
def test_the_stacks_own_machine_recreated_under_its_name_leaks_the_running_holders_slot(session):
    """MAX 1. e1 of k starts on M and is marked RUNNING. M is deleted and created again under the
    same name (same ARN): e1 is stopped and gone, its event lost. Reconciliation, every tick for a
    month: DescribeExecution(e1) → does not exist, M exists, e1 was seen running → "stale, asked
    again". All executions have ended, yet the one slot stays held: j never starts."""
    stack = build_stack(session, max_concurrency=1, clock=FakeClock())
    e1 = start_and_mark_running(stack)
    recreate(stack, stack.settings.state_machine_arn)
    assert stack.executions() == []  # nothing runs, nothing is left
    stack.send({"id": "j"}, group="j")
    launcher = stack.launcher()
    for _ in range(30):
        stack.clock.advance(DAY)
        launcher.tick()
    assert e1 not in holders(stack), "a holder whose execution no longer exists kept its slot"
    assert len(stack.running()) == 1, "the one slot never became usable again"


@pytest.mark.xfail(
    strict=True,
    reason="documented limit (docs/operations.md, Switch the state machine): the old machine remade "
    "under its name after the switch exists, so its RUNNING holder reads as a stale answer",
)
def test_the_machine_switched_from_recreated_under_its_name_leaks_the_running_holders_slot(session):
    """MAX 1. e1 runs on M1 (marked RUNNING). The stack switches to M2; M1 is deleted (e1 with it,
    its event lost) and a machine named as M1 is created again (an old stack version re-deployed).
    vanished(e1's ARN): M1's ARN exists → False; e1 RUNNING → "stale", kept. Its slot never frees."""
    stack = build_stack(session, max_concurrency=1, clock=FakeClock())
    e1 = start_and_mark_running(stack)
    m1 = stack.settings.state_machine_arn
    stack.settings = replace(stack.settings, state_machine_arn=new_machine(stack))
    recreate(stack, m1)
    stack.send({"id": "j"}, group="j")
    launcher = stack.launcher()
    for _ in range(30):
        stack.clock.advance(DAY)
        launcher.tick()
    assert e1 not in holders(stack), "a holder whose execution no longer exists kept its slot"
    assert len(stack.running()) == 1, "the one slot never became usable again"


# -- holds ---------------------------------------------------------------------------------------


def test_a_stale_missing_answer_keeps_the_running_holder_and_its_key_then_its_end_frees_them(session):
    """e1 of k RUNNING. For three ticks DescribeExecution(e1) answers "does not exist" (stale; M
    exists) while e1 runs and another message of k arrives: e1 keeps its slot and k's lease, and no
    second run of k starts. e1 then ends (event lost): the next tick's answer frees the slot."""
    stack = build_stack(session, max_concurrency=2, clock=FakeClock())
    e1 = start_and_mark_running(stack)
    arn = stack.runtime().store().execution(e1).arn
    stack.send({"id": "k", "n": 2}, group="k2")
    for _ in range(3):
        rt = stack.runtime()
        seen = missing_for(rt.client("stepfunctions"), arn)
        behind = unlisted(rt.client("stepfunctions"))
        stack.clock.advance(61)
        rt.launcher().tick()
        assert seen["missing"] >= 1 and behind["unlisted"] >= 1
        assert holders(stack) == {e1}, "a stale missing answer released a running holder"
        assert stack.running() == [e1], "a second run of k started beside e1"
    stack.finish(e1, "SUCCEEDED", output="{}")  # its status event is lost
    stack.clock.advance(61)
    stack.launcher().tick()
    assert stack.runtime().store().execution(e1).state is PayloadState.SUCCEEDED
    assert e1 not in holders(stack)


def test_a_running_holder_on_a_machine_switched_from_and_deleted_is_released_at_the_next_tick(session):
    """The old behaviour where it should be: MAX 1, e1 RUNNING on M1; the stack switches to M2, e1
    ends (event lost), M1 is deleted. The next tick releases e1 as vanished (outcome unknown, its
    key marked) and the freed slot starts j on M2."""
    stack = build_stack(session, max_concurrency=1, clock=FakeClock())
    e1 = start_and_mark_running(stack)
    m1 = stack.settings.state_machine_arn
    m2 = new_machine(stack)
    stack.settings = replace(stack.settings, state_machine_arn=m2)
    stack.finish(e1, "SUCCEEDED", output="{}")
    stack.client("stepfunctions").delete_state_machine(stateMachineArn=m1)
    stack.send({"id": "j"}, group="j")
    stack.clock.advance(61)
    stack.launcher().tick()
    record = stack.runtime().store().execution(e1)
    assert record.state is PayloadState.RELEASED and record.outcome_unknown
    (j,) = stack.running()
    assert j != e1 and holders(stack) == {j}


def test_the_stuck_holder_shows_in_status_and_drift_and_goes_only_after_the_retention(session):
    """M recreated under its name (as in the first break): ``sluice status`` shows e1 as held but
    not running (``ledger_not_running`` 1) and the tick's drift counts it, every tick. Past
    ``HISTORY_KEPT_SECONDS`` (456 days) it is released as vanished: the leak is bounded, not
    forever."""
    stack = build_stack(session, max_concurrency=1, clock=FakeClock())
    e1 = start_and_mark_running(stack)
    recreate(stack, stack.settings.state_machine_arn)
    launcher = stack.launcher()
    stack.clock.advance(DAY)
    launcher.tick()
    shown = overview(stack.runtime())
    assert shown["ledger_not_running"] == 1 and shown["free"] == 0
    assert shown["drift"] >= 1
    stack.clock.advance(HISTORY_KEPT_SECONDS)
    launcher.tick()
    record = stack.runtime().store().execution(e1)
    assert record.state is PayloadState.RELEASED and record.outcome_unknown
    assert holders(stack) == frozenset()


@pytest.mark.xfail(
    strict=True,
    reason="documented limit (docs/operations.md, Switch the state machine): a claim whose run went with "
    "its machine's delete-and-remake is settled as never started, so its message starts the name again",
)
def test_a_started_claim_on_a_machine_recreated_under_its_name_starts_again_when_its_message_returns(
    session,
):
    """The launcher dies after StartExecution(e1), before deleting its message (e1's record stays
    CLAIMED). e1 SUCCEEDED (its event lost); M is deleted and created again under its name.
    Reconciliation: DescribeExecution(e1) → does not exist, M exists, CLAIMED → two sightings a
    claim timeout apart → released as "no execution was ever started". The message comes back: e1
    starts a second time, on the recreated M."""
    stack = build_stack(session, max_concurrency=2, clock=FakeClock())
    stack.send({"id": "k"}, group="a")
    rt = stack.runtime()
    receipts = receipts_of(rt.client("sqs"))
    crashed = crash_after(rt.client("stepfunctions"), "StartExecution")
    with pytest.raises(Crash):
        rt.launcher().tick()
    assert crashed["calls"] == 1
    (e1,) = stack.running()
    stack.finish(e1, "SUCCEEDED", output="{}")  # its status event is lost
    recreate(stack, stack.settings.state_machine_arn)
    launcher = stack.launcher()
    for _ in range(3):
        stack.clock.advance(stack.settings.claim_timeout_seconds + 61)
        launcher.tick()
    assert holders(stack) == frozenset()
    stack.visible_again(receipts)
    stack.launcher().tick()
    assert stack.running() == [], f"{e1} started a second time"

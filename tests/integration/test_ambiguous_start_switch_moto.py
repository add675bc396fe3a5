"""A start whose answer was lost, then a switch of the state machine (explorer seed 131310309).

x's StartExecution lands on the old machine and its answer is lost (a read timeout: an ambiguous
start, the claim kept). The stack is switched to a new machine. When x's message comes back, the
launcher asks DescribeExecution by the ARN x's claim recorded; an answer is stale for up to S after
a change (docs/protocol.md "Staleness"), so within S of x's start it may say "no such execution".
Taken at its word, x is started again on the new machine, where its name is free: two runs of x.
Staleness is emulated by a ``before-call`` hook that answers "no such execution" for a run younger
than S by the stack's clock; moto answers everything else."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from sluice.core.clock import FakeClock
from sluice.core.model import Outcome
from tests.support.aws import Stack, build_stack, new_machine
from tests.support.hooks import error_answer, receipts_of

S = 60  # the staleness bound, and the consistency window as deployed


def lose_start_answer(client: Any) -> dict[str, Any]:
    """StartExecution lands and its answer is lost once (a read timeout after the call took effect)."""
    seen: dict[str, Any] = {"lost": 0, "at": None}

    def hook(http_response: Any, parsed: dict[str, Any], **_: Any) -> None:
        if seen["lost"] or http_response.status_code >= 300:
            return
        seen["lost"] += 1
        raise ReadTimeoutError(endpoint_url="https://states.us-east-1.amazonaws.com")

    client.meta.events.register("after-call.sfn.StartExecution", hook)
    return seen


def stale_within_window(client: Any, stack: Stack, started_at: float) -> dict[str, int]:
    """DescribeExecution of a run younger than S answers "no such execution", as a stale view may."""
    seen = {"missing": 0}

    def hook(**_: Any) -> Any:
        if stack.clock.now() - started_at >= S:
            return None
        seen["missing"] += 1
        return error_answer("ExecutionDoesNotExist", 400)

    client.meta.events.register("before-call.sfn.DescribeExecution", hook)
    return seen


def runs(stack: Stack, *machines: str) -> list[tuple[str, str]]:
    sfn = stack.client("stepfunctions")
    return sorted(
        (machine.rsplit(":", 1)[1], e["name"])
        for machine in machines
        for e in sfn.list_executions(stateMachineArn=machine)["executions"]
    )


@pytest.fixture
def ambiguous_start(session: Any) -> tuple[Stack, str, list[str], float]:
    """x's start lands on the old machine, its answer lost; returns (stack, old ARN, receipts, start time)."""
    clock = FakeClock()
    stack = build_stack(session, clock=clock, max_concurrency=2)
    stack.send({"id": "x"}, group="gx")
    rt = stack.runtime()
    received = receipts_of(rt.client("sqs"))
    lost = lose_start_answer(rt.client("stepfunctions"))
    started_at = clock.now()
    summary = rt.launcher().tick()
    assert lost["lost"] == 1 and summary.stopped == "transient"
    return stack, stack.settings.state_machine_arn, received, started_at


def test_an_ambiguous_start_is_not_run_again_on_the_machine_switched_to(ambiguous_start) -> None:
    """The tick that lost x's answer gives the message back no sooner than the window: the tick on
    the new machine finds nothing to resume, and a tick a window later finds x running on the old
    machine (a fresh answer), so it starts nothing on the new one."""
    stack, old_arn, received, started_at = ambiguous_start
    new_arn = new_machine(stack)
    switched = stack.runtime(state_machine_arn=new_arn)
    stale = stale_within_window(switched.client("stepfunctions"), stack, started_at)
    stack.clock.advance(5)
    switched.launcher().tick()
    (x,) = [name for _, name in runs(stack, old_arn)]
    assert runs(stack, old_arn, new_arn) == [("sluice-test-workflow", x)]
    assert stack.queue_counts() == (0, 1)  # still in flight, for the window
    with pytest.raises(ClientError, match="ExecutionDoesNotExist"):  # the stale view was in force
        switched.client("stepfunctions").describe_execution(
            executionArn=f"{old_arn}:{x}".replace(":stateMachine:", ":execution:")
        )
    assert stale["missing"] == 1

    stack.clock.advance(S)
    stack.visible_again(received)  # moto's visibility runs in real time: the window, as SQS would
    summary = switched.launcher().tick()
    assert summary.n(Outcome.RESUMED) == 1 and stack.queue_counts() == (0, 0)
    assert runs(stack, old_arn, new_arn) == [("sluice-test-workflow", x)]
    assert stale["missing"] == 1  # the launchers asked only once the answer was fresh

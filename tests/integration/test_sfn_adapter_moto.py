"""The Step Functions adapter's translation of failures, on moto through botocore hooks: a lost
answer (the call took effect, the client timed out) or a throttle of any call is a TransientError
(the tick ends ``transient`` and the next one asks again), never a raw botocore exception."""

from __future__ import annotations

import json

import pytest
from botocore.exceptions import ReadTimeoutError

from sluice.adapters.aws.sfn import StepFunctionsExecutions
from sluice.core.errors import TransientError
from tests.support.hooks import throttle

DEFINITION = json.dumps({"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}})


def machine(client, name: str) -> str:
    role = f"arn:aws:iam::123456789012:role/{name}"
    return client.create_state_machine(name=name, definition=DEFINITION, roleArn=role)["stateMachineArn"]


def lose_answer(client, operation: str) -> dict[str, int]:
    seen = {"lost": 0}

    def hook(http_response, **_):
        if http_response.status_code < 300:
            seen["lost"] += 1
            raise ReadTimeoutError(endpoint_url="https://states.invalid/")

    client.meta.events.register(f"after-call.states.{operation}", hook)
    return seen


@pytest.fixture
def old_execution(session):
    """An execution of M1, asked about by the stack that now uses M2."""
    client = session.client("stepfunctions")
    m1, m2 = machine(client, "m1"), machine(client, "m2")
    arn = client.start_execution(stateMachineArn=m1, name="e1")["executionArn"]
    return client, StepFunctionsExecutions(client, m2), arn


def test_vanished_with_its_answer_lost_is_transient(old_execution):
    client, executions, arn = old_execution
    lost = lose_answer(client, "DescribeStateMachine")
    with pytest.raises(TransientError):
        executions.vanished(arn)
    assert lost == {"lost": 1}


def test_vanished_throttled_is_transient(old_execution):
    client, executions, arn = old_execution
    throttled = throttle(client, "DescribeStateMachine")
    with pytest.raises(TransientError):
        executions.vanished(arn)
    assert throttled["throttled"] >= 1


def test_vanished_says_so_for_a_deleted_machine_and_not_for_a_live_one(old_execution):
    client, executions, arn = old_execution
    assert not executions.vanished(arn)
    client.delete_state_machine(
        stateMachineArn=arn.replace(":execution:", ":stateMachine:").rsplit(":", 1)[0]
    )
    assert executions.vanished(arn)


def test_the_redriven_listing_with_its_answer_lost_is_transient(old_execution):
    client, _, _ = old_execution
    executions = StepFunctionsExecutions(client, machine(client, "m3"))
    lost = lose_answer(client, "ListExecutions")
    with pytest.raises(TransientError):
        executions.redriven_succeeded()
    assert lost == {"lost": 1}

"""A workflow wrapped by ``sluice.semaphore.asl.wrap_definition``, run end to end by moto's Step Functions.

moto does not run Lambda tasks, so, as in test_semaphore_moto.py, the wrapped definition's Acquire and
Release tasks are turned into ``sqs:sendMessage.waitForTaskToken`` tasks carrying the same payload;
the test plays the semaphore function (``Semaphores.acquire`` / ``release`` on the real adapters) and
the section's one Task. Everything else — the Catch, the error path, the re-raise with the original
error, ResultPath — is moto executing the definition as produced."""

from __future__ import annotations

import json
import time
from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID

from sluice.adapters.aws.sfn_tokens import SfnTokens
from sluice.adapters.dynamo.semaphore import DynamoSemaphoreStore
from sluice.adapters.dynamo.store import create_table
from sluice.core.clock import FakeClock
from sluice.semaphore.asl import ACQUIRE_RESOURCE, RELEASE_RESOURCE, StateNames, wrap_definition
from sluice.semaphore.model import Outcome, Released
from sluice.semaphore.step import Semaphores
from tests.support.aws import NO_RETRY, REGION

TABLE = "asl-table"
FUNCTION = f"arn:aws:lambda:{REGION}:{DEFAULT_ACCOUNT_ID}:function:sluice-semaphore"
NAMES = StateNames.of("db")


class Run:
    def __init__(self, session: Any) -> None:
        self.sfn = session.client("stepfunctions", config=NO_RETRY)
        self.sqs = session.client("sqs")
        ddb = session.client("dynamodb", config=NO_RETRY)
        create_table(ddb, TABLE)
        self.queues = {q: self.sqs.create_queue(QueueName=q)["QueueUrl"] for q in ("semaphore", "work")}
        user = {
            "StartAt": "Work",
            "States": {
                "Work": {
                    "Type": "Task",
                    "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
                    "Parameters": {
                        "QueueUrl": self.queues["work"],
                        "MessageBody": {"token.$": "$$.Task.Token", "input.$": "$"},
                    },
                    "ResultPath": "$.work",
                    "End": True,
                }
            },
        }
        wrapped = wrap_definition(user, semaphore="db", function_arn=FUNCTION, acquisition_id="work")
        self.definition = _through_sqs(wrapped, self.queues["semaphore"])
        self.machine = self.sfn.create_state_machine(
            name="wrapped",
            definition=json.dumps(self.definition),
            roleArn=f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:role/x",
        )["stateMachineArn"]
        store = DynamoSemaphoreStore(ddb, TABLE, sleep=lambda _: None)
        self.sems = Semaphores(store, SfnTokens(self.sfn), FakeClock())
        self.sems.set_limit("db", 1)

    def start(self, name: str) -> str:
        return self.sfn.start_execution(
            stateMachineArn=self.machine, name=name, input=json.dumps({"n": name})
        )["executionArn"]

    def take(self, queue: str, timeout: float = 120.0) -> dict[str, Any]:
        """The next message, long-polling while moto's execution gets there."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.sqs.receive_message(QueueUrl=self.queues[queue], WaitTimeSeconds=1).get("Messages", [])
            if got:
                self.sqs.delete_message(QueueUrl=self.queues[queue], ReceiptHandle=got[0]["ReceiptHandle"])
                return json.loads(got[0]["Body"])
        raise AssertionError(f"no message on {queue}")

    def serve(self) -> dict[str, Any]:
        """Play the semaphore function for the next request; a release is answered as Lambda would."""
        body = self.take("semaphore")
        if body["action"] == "acquire":
            body["outcome"] = self.sems.acquire(
                body["semaphore"], body["executionArn"], body["acquisitionId"], body["taskToken"]
            ).outcome
        else:
            body["released"] = self.sems.release(
                body["semaphore"], body["executionArn"], body["acquisitionId"]
            )
            self.sfn.send_task_success(taskToken=body["token"], output="{}")
        return body

    def ended(self, arn: str, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            described = self.sfn.describe_execution(executionArn=arn)
            if described["status"] != "RUNNING":
                return described
            self.sqs.receive_message(
                QueueUrl=self.queues["work"], WaitTimeSeconds=0
            )  # yield to moto's thread
        raise AssertionError(f"{arn} still RUNNING")


def _through_sqs(definition: dict[str, Any], queue_url: str) -> dict[str, Any]:
    """Acquire and both Releases as SQS token tasks with the same payload (moto runs no Lambda)."""
    states = {}
    for name, state in definition["States"].items():
        if state.get("Resource") in (ACQUIRE_RESOURCE, RELEASE_RESOURCE):
            body = dict(state["Parameters"]["Payload"])
            if state["Resource"] == RELEASE_RESOURCE:
                body["token.$"] = "$$.Task.Token"
            state = {
                **state,
                "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
                "Parameters": {"QueueUrl": queue_url, "MessageBody": body},
            }
        states[name] = state
    return {**definition, "States": states}


@pytest.fixture
def run():
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        yield Run(boto3.session.Session(region_name=REGION))


@pytest.mark.slow
def test_a_wrapped_workflow_holds_the_section_releases_on_success_and_on_error(run):
    first, second = run.start("first"), run.start("second")
    served = [run.serve(), run.serve()]
    outcomes = {b["executionArn"]: b["outcome"] for b in served}
    holder = next(a for a, o in outcomes.items() if o is Outcome.GRANTED)
    waiter = second if holder == first else first
    assert outcomes[waiter] is Outcome.WAITING

    work = run.take("work")  # the holder is in the section, with its input and the permit beside it
    assert work["input"]["sluicePermit"] == {"semaphore": "db", "acquisitionId": "work"}
    assert work["input"]["n"] == holder.rsplit(":", 1)[1]
    run.sfn.send_task_failure(taskToken=work["token"], error="Work.Broken", cause="disk full")

    release = run.serve()  # the error path releases: the permit goes to the waiter
    assert (release["action"], release["executionArn"], release["released"]) == (
        "release",
        holder,
        Released.PERMIT,
    )
    failed = run.ended(holder)
    assert (failed["status"], failed["error"]) == ("FAILED", "Work.Broken")  # the section's own error
    # (moto's SendTaskFailure drops the cause, so the re-raised cause cannot be checked here)

    work = run.take("work")
    assert work["input"]["n"] == waiter.rsplit(":", 1)[1]
    run.sfn.send_task_success(taskToken=work["token"], output=json.dumps({"rows": 3}))
    release = run.serve()
    assert (release["executionArn"], release["released"]) == (waiter, Released.PERMIT)
    done = run.ended(waiter)
    assert done["status"] == "SUCCEEDED"
    output = json.loads(done["output"])
    assert output["work"] == {"rows": 3} and output["sluicePermit"]["acquisitionId"] == "work"
    assert run.sems.status("db").holders == () and run.sems.status("db").waiters == ()

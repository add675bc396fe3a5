"""The semaphore Lambda (handlers/semaphore.py) on moto, with the deployed environment and real adapters.

moto runs the workflow for real (``execute_state_machine``). A ``lambda:invoke.waitForTaskToken``
task cannot reach a Lambda here, so the workflow hands the exact payload a Task state would send to
the function to an SQS queue instead (``sqs:sendMessage.waitForTaskToken`` keeps the token
semantics), and the test invokes the handler with it, as Lambda would:

    Acquire (token)  ─▶ queue "acquire"  ─▶ handler ─▶ SendTaskSuccess when granted
    Section (token)  ─▶ queue "section"  ─▶ the test ends the critical section (or fails it)
    Release          ─▶ queue "release"  ─▶ handler

A message in "section" is the observable grant: the execution got past Acquire with the permit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID

from handlers import _shared
from handlers import semaphore as semaphore_handler
from sluice.adapters.dynamo.store import create_table
from sluice.core.clock import FakeClock
from sluice.launch.settings import Settings
from sluice.runtime import Runtime
from sluice.semaphore.service import BadSemaphoreRequest
from tests.support.aws import NO_RETRY, REGION, LambdaContext, scheduled_event, status_change_event

TABLE = "sluice-semaphore-test"
ROLE = f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:role/workflow"
WHERE = {"executionArn.$": "$$.Execution.Id"}


def token_task(queue_url: str, body: dict[str, Any], **rest: Any) -> dict[str, Any]:
    return {
        "Type": "Task",
        "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
        "Parameters": {"QueueUrl": queue_url, "MessageBody": {"taskToken.$": "$$.Task.Token", **body}},
        **rest,
    }


@dataclass
class World:
    session: Any
    clock: FakeClock

    def __post_init__(self) -> None:
        self.sfn = self.session.client("stepfunctions", config=NO_RETRY)
        self.sqs = self.session.client("sqs")
        self.ddb = self.session.client("dynamodb", config=NO_RETRY)
        create_table(self.ddb, TABLE)
        self.queues = {
            q: self.sqs.create_queue(QueueName=q)["QueueUrl"] for q in ("acquire", "section", "release")
        }
        self.machines: dict[str, str] = {}

    def machine(self, semaphore: str) -> str:
        """Acquire, the section, Release: the example workflow's shape, with queues for Lambda."""
        if semaphore not in self.machines:
            request = {**WHERE, "semaphore": semaphore, "acquisitionId": "section"}
            definition = {
                "StartAt": "Acquire",
                "States": {
                    "Acquire": token_task(
                        self.queues["acquire"],
                        {"action": "acquire", **request},
                        ResultPath="$.permit",
                        Next="Section",
                    ),
                    "Section": token_task(
                        self.queues["section"],
                        {**WHERE, "permit.$": "$.permit"},
                        ResultPath=None,
                        Next="Release",
                    ),
                    "Release": {
                        "Type": "Task",
                        "Resource": "arn:aws:states:::sqs:sendMessage",
                        "Parameters": {
                            "QueueUrl": self.queues["release"],
                            "MessageBody": {"action": "release", **request},
                        },
                        "ResultPath": None,
                        "End": True,
                    },
                },
            }
            self.machines[semaphore] = self.sfn.create_state_machine(
                name=f"uses-{semaphore}", definition=json.dumps(definition), roleArn=ROLE
            )["stateMachineArn"]
        return self.machines[semaphore]

    def start(self, semaphore: str, *names: str) -> list[str]:
        machine = self.machine(semaphore)
        return [
            self.sfn.start_execution(stateMachineArn=machine, name=n, input="{}")["executionArn"]
            for n in names
        ]

    def messages(self, queue: str, count: int, timeout: float = 120.0) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            got = self.sqs.receive_message(
                QueueUrl=self.queues[queue], MaxNumberOfMessages=10, WaitTimeSeconds=1
            ).get("Messages", [])
            for m in got:
                self.sqs.delete_message(QueueUrl=self.queues[queue], ReceiptHandle=m["ReceiptHandle"])
                out.append(json.loads(m["Body"]))
        assert len(out) == count, f"{queue}: {len(out)} of {count} messages"
        return out

    def nothing_in(self, queue: str) -> bool:
        return not self.sqs.receive_message(QueueUrl=self.queues[queue], WaitTimeSeconds=1).get("Messages")

    def invoke(self, event: dict[str, Any]) -> dict[str, object]:
        return semaphore_handler.handler(event, LambdaContext(function_name="sluice-dev-semaphore"))

    def serve_acquires(self, count: int) -> list[dict[str, object]]:
        """Lambda, invoked by each Acquire task in turn; the execution ARN added to each answer."""
        return [
            {**self.invoke(body), "executionArn": body["executionArn"]}
            for body in self.messages("acquire", count)
        ]

    def status(self, semaphore: str) -> Any:
        return _shared.runtime().semaphores().status(semaphore)

    def held_by(self) -> set[str]:
        return {h.execution_arn for s in self.machines for h in self.status(s).holders}

    def wait_status(self, arn: str, status: str, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            described = self.sfn.describe_execution(executionArn=arn)
            if described["status"] == status:
                return described
            self.sqs.receive_message(QueueUrl=self.queues["release"], WaitTimeSeconds=0)  # yields to moto
        raise AssertionError(f"{arn} is not {status}")


def configure(world: World, monkeypatch: pytest.MonkeyPatch, semaphores: str) -> None:
    """The deployed environment (serverless.yml), then a cold start with the test's clock."""
    monkeypatch.setenv("SLUICE_TABLE_NAME", TABLE)
    monkeypatch.setenv("SLUICE_SEMAPHORES", semaphores)
    cold_start(world)


def cold_start(world: World) -> None:
    _shared.reset()
    _shared._runtime = Runtime(
        Settings.from_env(), session=world.session, clock=world.clock, client_config=NO_RETRY
    )


@pytest.fixture
def world(monkeypatch) -> Iterator[World]:
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        yield World(boto3.session.Session(region_name=REGION), FakeClock())
    _shared.reset()


def test_acquire_and_release_through_the_handler_let_one_execution_at_a_time_in(world, monkeypatch):
    configure(world, monkeypatch, "db=1")
    world.start("db", "e1", "e2")
    served = world.serve_acquires(2)
    assert [r["outcome"] for r in served] == ["granted", "waiting"]  # the configured limit created it
    first, second = (r["executionArn"] for r in served)
    assert world.status("db").limit == 1
    (inside,) = world.messages("section", 1)
    assert inside["executionArn"] == first
    assert inside["permit"] == {"semaphore": "db", "acquisitionId": "section"}  # SendTaskSuccess's output
    assert world.held_by() == {first} and world.nothing_in("section")

    world.sfn.send_task_success(taskToken=inside["taskToken"], output="{}")  # the section ends
    (release,) = world.messages("release", 1)
    assert world.invoke(release) == {"semaphore": "db", "acquisitionId": "section", "released": "permit"}
    (entered,) = world.messages("section", 1)
    assert entered["executionArn"] == second and world.held_by() == {second}
    world.sfn.send_task_success(taskToken=entered["taskToken"], output="{}")
    assert world.invoke(world.messages("release", 1)[0])["released"] == "permit"
    assert world.held_by() == set()
    world.wait_status(first, "SUCCEEDED")
    world.wait_status(second, "SUCCEEDED")


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ({"semaphore": "db"}, "unknown action None"),
        ({"action": "lock", "semaphore": "db"}, "unknown action 'lock'"),
        (
            {"action": "acquire", "semaphore": "db"},
            "missing or empty field(s) acquisitionId, executionArn, taskToken",
        ),
        (
            {"action": "release", "semaphore": "", "acquisitionId": "a", "executionArn": "x"},
            "field(s) semaphore",
        ),
        (
            {"action": "release", "semaphore": "db", "acquisitionId": "a", "executionArn": "e1"},
            "pass $$.Execution.Id",
        ),
        (
            {
                "action": "release",
                "semaphore": "a b",
                "acquisitionId": "a",
                "executionArn": "arn:aws:states:us-east-1:1:execution:m:e",
            },
            "bad semaphore name",
        ),
        (
            {
                "action": "release",
                "semaphore": "db",
                "acquisitionId": "x" * 41,
                "executionArn": "arn:aws:states:us-east-1:1:execution:m:e",
            },
            "bad acquisition id",
        ),
        (["not", "an", "object"], "must be a JSON object"),
    ],
)
def test_bad_input_is_a_named_error_and_touches_nothing(world, monkeypatch, event, message):
    configure(world, monkeypatch, "db=1")
    with pytest.raises(BadSemaphoreRequest) as raised:
        world.invoke(event)
    assert message in str(raised.value)
    assert type(raised.value).__name__ == "BadSemaphoreRequest"  # Lambda's errorType: a Catch matches it
    assert world.ddb.scan(TableName=TABLE)["Items"] == []


def test_an_unknown_semaphore_fails_the_acquire_task_with_a_named_error(world, monkeypatch):
    configure(world, monkeypatch, "db=1")
    (arn,) = world.start("other", "e1")
    assert world.serve_acquires(1)[0]["outcome"] == "refused"
    failed = world.wait_status(arn, "FAILED")
    assert failed.get("error") == "Sluice.UnknownSemaphore", failed


def test_the_status_change_of_an_ended_holder_hands_its_permit_to_the_next_waiter(world, monkeypatch):
    configure(world, monkeypatch, "db=1")
    world.start("db", "e1", "e2")
    first, second = (r["executionArn"] for r in world.serve_acquires(2))
    (inside,) = world.messages("section", 1)
    world.sfn.send_task_failure(taskToken=inside["taskToken"], error="Work.Failed")  # no Release runs
    world.wait_status(first, "FAILED")
    assert world.held_by() == {first}
    event = status_change_event(world.machine("db"), first.rsplit(":", 1)[1], "FAILED", error="Work.Failed")
    result = world.invoke(event)
    assert result == {
        "execution": first,
        "released": [{"semaphore": "db", "acquisitionId": "section", "released": "permit"}],
    }
    (entered,) = world.messages("section", 1)
    assert entered["executionArn"] == second and world.held_by() == {second}
    assert world.invoke(event)["released"] == []  # delivered again: nothing more


def test_a_lost_status_event_is_made_up_for_by_the_scheduled_sweep(world, monkeypatch):
    configure(world, monkeypatch, "db=1,idle=2")
    world.start("db", "e1", "e2")
    first, second = (r["executionArn"] for r in world.serve_acquires(2))
    (inside,) = world.messages("section", 1)
    world.sfn.send_task_failure(taskToken=inside["taskToken"], error="Work.Failed")
    world.wait_status(first, "FAILED")  # and its status event never arrives
    result = world.invoke(scheduled_event())
    assert result["swept"] == {
        "db": {"freed": [{"executionArn": first, "acquisitionId": "section"}]},
        "idle": {"freed": []},
    }
    (entered,) = world.messages("section", 1)
    assert entered["executionArn"] == second and world.held_by() == {second}
    assert world.status("idle").limit == 2  # the sweep created the configured semaphore that no one used yet


def test_a_configured_limit_creates_the_semaphore_and_never_undoes_a_run_time_change(world, monkeypatch):
    configure(world, monkeypatch, "db=1")
    world.start("db", "e1")
    assert world.serve_acquires(1)[0]["outcome"] == "granted"
    _shared.runtime().semaphores().set_limit("db", 3)  # an operator, at run time (the CLI)
    for _ in range(2):  # a cold start after a redeploy with the same configuration, then a warm one
        cold_start(world)
        world.start("db", f"e{len(world.held_by()) + 2}")
        assert world.serve_acquires(1)[0]["outcome"] == "granted"
        world.invoke(scheduled_event())
        assert world.status("db").limit == 3
    assert len(world.held_by()) == 3

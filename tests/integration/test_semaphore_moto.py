"""The semaphore on moto with the real adapters: DynamoSemaphoreStore on DynamoDB and SfnTokens on Step
Functions.

moto runs state machines for real when asked (``execute_state_machine``), task tokens included: a
``sqs:sendMessage.waitForTaskToken`` task hands its token to a queue, and SendTaskSuccess on it moves
the execution on. So the workflow below is Acquire (token to the acquire queue) → Release (token to
the release queue: the critical section lasts until the test ends it) → Done (a message). The test
plays the future Lambda handler: it reads the queues, calls ``acquire`` and ``release``. It waits for
moto's executions by long-polling those queues, never by sleeping. What moto cannot do — a token that
times out, TaskDoesNotExist, throttling — is answered from ``before-call`` hooks with the documented
error codes. Executions in the default (non-executing) moto stay RUNNING until a test ends them, as
``tests/support/aws.Stack.finish`` does; that is where reconciliation is exercised.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID
from moto.stepfunctions.models import stepfunctions_backends

from sluice.adapters.aws.sfn_tokens import SfnTokens
from sluice.adapters.dynamo.codec import plain
from sluice.adapters.dynamo.semaphore import DynamoSemaphoreStore
from sluice.adapters.dynamo.store import create_table
from sluice.core.clock import FakeClock
from sluice.core.errors import ConfigurationError, TransientError
from sluice.semaphore.model import Delivery, Outcome, Released
from sluice.semaphore.step import DELIVERY_GRACE, Semaphores
from tests.support.aws import NO_RETRY, REGION
from tests.support.hooks import Crash, error_answer

TABLE = "semaphore-table"
S = "db"
ROLE = f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:role/workflow"


def token_task(queue_url: str, body: dict[str, Any], **rest: Any) -> dict[str, Any]:
    return {
        "Type": "Task",
        "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
        "Parameters": {"QueueUrl": queue_url, "MessageBody": {"token.$": "$$.Task.Token", **body}},
        **rest,
    }


@dataclass
class Flow:
    session: Any
    clock: FakeClock = field(default_factory=FakeClock)

    def __post_init__(self) -> None:
        self.sfn = self.session.client("stepfunctions", config=NO_RETRY)
        self.sqs = self.session.client("sqs")
        self.ddb = self.session.client("dynamodb", config=NO_RETRY)
        create_table(self.ddb, TABLE)
        self.queues = {
            q: self.sqs.create_queue(QueueName=q)["QueueUrl"] for q in ("acquire", "release", "done")
        }
        where = {"executionArn.$": "$$.Execution.Id"}
        definition = {
            "StartAt": "Acquire",
            "States": {
                "Acquire": token_task(
                    self.queues["acquire"],
                    {**where, "semaphore": S, "acquisitionId": "section"},
                    ResultPath="$.permit",
                    Next="Release",
                ),
                "Release": token_task(
                    self.queues["release"],
                    {**where, "permit.$": "$.permit"},
                    ResultPath=None,
                    Next="Done",
                ),
                "Done": {
                    "Type": "Task",
                    "Resource": "arn:aws:states:::sqs:sendMessage",
                    "Parameters": {
                        "QueueUrl": self.queues["done"],
                        "MessageBody": {**where, "permit.$": "$.permit"},
                    },
                    "End": True,
                },
            },
        }
        self.machine = self.sfn.create_state_machine(
            name="workflow", definition=json.dumps(definition), roleArn=ROLE
        )["stateMachineArn"]
        self.store_rng = random.Random(0)

    def semaphores(self) -> Semaphores:
        store = DynamoSemaphoreStore(self.ddb, TABLE, per_shard=2, rng=self.store_rng, sleep=lambda _: None)
        return Semaphores(store, SfnTokens(self.sfn), self.clock, rng=self.store_rng)

    def start(self, *names: str) -> list[str]:
        return [
            self.sfn.start_execution(stateMachineArn=self.machine, name=n, input="{}")["executionArn"]
            for n in names
        ]

    def messages(self, queue: str, count: int, timeout: float = 120.0) -> list[dict[str, Any]]:
        """``count`` messages from the queue, long-polling while moto's executions get there."""
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

    def nothing_more(self, queue: str) -> bool:
        got = self.sqs.receive_message(QueueUrl=self.queues[queue], WaitTimeSeconds=1).get("Messages", [])
        return not got

    def items(self) -> set[str]:
        page = self.ddb.scan(TableName=TABLE, ConsistentRead=True)
        return {plain(raw)["pk"].split("#", 1)[0] for raw in page["Items"]}


@pytest.fixture
def flow() -> Iterator[Flow]:
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        yield Flow(boto3.session.Session(region_name=REGION))


def serve_acquires(flow: Flow, sems: Semaphores, count: int) -> dict[str, tuple[Outcome, str]]:
    """Play the Acquire function for ``count`` requests: execution ARN -> (outcome, token)."""
    out = {}
    for body in flow.messages("acquire", count):
        result = sems.acquire(body["semaphore"], body["executionArn"], body["acquisitionId"], body["token"])
        out[body["executionArn"]] = (result.outcome, body["token"])
    return out


def end_section(flow: Flow, sems: Semaphores, body: dict[str, Any]) -> Released:
    """Play the Release state: free the permit, then let the execution go on."""
    released = sems.release(
        body["permit"]["semaphore"], body["executionArn"], body["permit"]["acquisitionId"]
    )
    flow.sfn.send_task_success(taskToken=body["token"], output="{}")
    return released


def test_executions_pass_the_section_at_most_limit_at_a_time_in_fifo_order(flow):
    sems = flow.semaphores()
    sems.set_limit(S, 2)
    arns = flow.start(*(f"e{i}" for i in range(6)))
    served = serve_acquires(flow, sems, 6)
    order = list(served)  # the order the acquisitions joined the line
    assert [served[a][0] for a in order] == [Outcome.GRANTED] * 2 + [Outcome.WAITING] * 4
    inside = {b["executionArn"]: b for b in flow.messages("release", 2)}
    assert set(inside) == set(order[:2])
    for step in range(4):  # the oldest holder leaves; the oldest waiter comes in
        oldest = order[step]
        assert end_section(flow, sems, inside.pop(oldest)) is Released.PERMIT
        (entered,) = flow.messages("release", 1)
        assert entered["executionArn"] == order[step + 2]
        assert entered["permit"] == {"semaphore": S, "acquisitionId": "section"}
        inside[entered["executionArn"]] = entered
        status = sems.status(S)
        assert {h.execution_arn for h in status.holders} == set(order[step + 1 : step + 3])
        assert [w.execution_arn for w in status.waiters] == order[step + 3 :]
    for body in list(inside.values()):
        end_section(flow, sems, body)
    done = flow.messages("done", 6)
    assert sorted(d["executionArn"] for d in done) == sorted(arns)
    assert sems.status(S).holders == () and flow.nothing_more("release")
    assert flow.items() == {"SLOTS", "SEMQ", "SEMA"}  # no ticket, no index left; released records expire


def test_a_token_step_functions_refuses_is_skipped_and_its_permit_goes_to_the_next(flow):
    sems = flow.semaphores()
    sems.set_limit(S, 1)
    flow.start("e0", "e1", "e2")
    served = serve_acquires(flow, sems, 3)
    first, timed_out, last = list(served)
    refused = served[timed_out][1]

    def task_timed_out(params: dict[str, Any], **_: Any) -> Any:
        sent = json.loads(params["body"])["taskToken"]
        return error_answer("TaskTimedOut", 400) if sent == refused else None

    flow.sfn.meta.events.register("before-call.sfn.SendTaskSuccess", task_timed_out)
    (holder,) = flow.messages("release", 1)
    assert holder["executionArn"] == first
    end_section(flow, sems, holder)
    (entered,) = flow.messages("release", 1)
    assert entered["executionArn"] == last  # the refused waiter was skipped
    assert [h.execution_arn for h in sems.status(S).holders] == [last]
    flow.sfn.meta.events.unregister("before-call.sfn.SendTaskSuccess", task_timed_out)
    flow.sfn.send_task_failure(taskToken=refused, error="Test.Done")  # let moto's execution end
    end_section(flow, sems, entered)
    ghost = flow.machine.replace(":stateMachine:", ":execution:") + ":ghost"
    late = sems.acquire(S, ghost, "x", "not-a-token")
    assert late.outcome is Outcome.RELEASED  # moto answers InvalidToken: the permit is given back at once
    assert sems.status(S).holders == ()


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_crash_around_send_task_success_then_a_retry_after_the_grace_grants_once(flow, where):
    sems = flow.semaphores()
    sems.set_limit(S, 1)
    flow.start("e0", "e1")
    served = serve_acquires(flow, sems, 2)
    second = list(served)[1]
    crashes = [0]

    def crash(**_: Any) -> None:
        if not crashes[0]:
            crashes[0] += 1
            raise Crash(f"stopped {where} SendTaskSuccess")

    event = f"{'before' if where == 'before' else 'after'}-call.sfn.SendTaskSuccess"
    flow.sfn.meta.events.register(event, crash)
    (holder,) = flow.messages("release", 1)
    with pytest.raises(Crash):
        sems.release(S, holder["executionArn"], "section")
    flow.sfn.send_task_success(taskToken=holder["token"], output="{}")
    assert [h.execution_arn for h in sems.status(S).holders] == [second]  # granted, maybe not told
    flow.clock.advance(DELIVERY_GRACE + 1)
    sems.hand_off(S)
    (entered,) = flow.messages("release", 1)
    assert entered["executionArn"] == second and flow.nothing_more("release")  # in once
    assert [h.execution_arn for h in sems.status(S).holders] == [second]
    end_section(flow, sems, entered)
    assert len(flow.messages("done", 2)) == 2 and sems.status(S).holders == ()


# -- the default moto: executions stay RUNNING until a test ends them ------------------------------------


@pytest.fixture
def plain_moto(session):
    ddb = session.client("dynamodb", config=NO_RETRY)
    create_table(ddb, TABLE)
    sfn = session.client("stepfunctions", config=NO_RETRY)
    machine = sfn.create_state_machine(
        name="inert",
        definition=json.dumps({"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}}),
        roleArn=ROLE,
    )["stateMachineArn"]
    return ddb, sfn, machine


def end_execution(arn: str, status: str) -> None:
    execution = stepfunctions_backends[DEFAULT_ACCOUNT_ID][REGION].describe_execution(arn)
    execution.status = status
    execution.stop_date = datetime.now(UTC)


def test_reconcile_and_release_execution_free_what_ended_executions_held(plain_moto):
    ddb, sfn, machine = plain_moto
    clock = FakeClock()
    sems = Semaphores(DynamoSemaphoreStore(ddb, TABLE), SfnTokens(sfn), clock)
    for name in ("db", "api"):
        sems.set_limit(name, 1)
    x, y = (sfn.start_execution(stateMachineArn=machine, name=n)["executionArn"] for n in ("x", "y"))
    assert sems.acquire("db", x, "a", "token-x-db").outcome is Outcome.GRANTED  # moto takes any token
    assert sems.acquire("api", x, "a", "token-x-api").outcome is Outcome.GRANTED
    assert sems.acquire("db", y, "a", "token-y-db").outcome is Outcome.WAITING
    end_execution(x, "ABORTED")  # its status-change event is lost
    freed = sems.reconcile("db")
    assert [h.execution_arn for h in freed] == [x]
    assert [h.execution_arn for h in sems.status("db").holders] == [y]
    assert sems.release_execution(x) == [("api", "a", Released.PERMIT)]  # the index lists only api now
    assert sems.status("api").holders == () and sems.release_execution(x) == []
    assert sems.reconcile("db") == [] and sems.reconcile("api") == []  # y runs
    left = {plain(raw)["pk"].split("#", 1)[0] for raw in ddb.scan(TableName=TABLE)["Items"]}
    assert "SEMHELD" in left  # y's index, and nothing of x's
    assert sems.store.held_by(x) == [] and sems.store.held_by(y) == [("db", "a")]


def test_sfn_tokens_turn_error_codes_into_results_and_sluice_errors(plain_moto):
    _, sfn, machine = plain_moto
    tokens = SfnTokens(sfn)
    answers = {
        "TaskTimedOut": Delivery.GONE,
        "InvalidToken": Delivery.GONE,
        "TaskDoesNotExist": Delivery.GONE,
        "ThrottlingException": TransientError,
        "KmsThrottlingException": TransientError,
        "ServiceUnavailable": TransientError,
        "InvalidOutput": ConfigurationError,
        "AccessDeniedException": ConfigurationError,
    }
    for code, expected in answers.items():
        status = 503 if code == "ServiceUnavailable" else 400

        def answer(code: str = code, status: int = status, **_: Any) -> Any:
            return error_answer(code, status)

        for op in ("SendTaskSuccess", "SendTaskFailure"):
            sfn.meta.events.register(f"before-call.sfn.{op}", answer)
        if isinstance(expected, Delivery):
            assert tokens.succeed("t", {"semaphore": S}) is expected
            assert tokens.fail("t", "E", "cause") is expected
        else:
            with pytest.raises(expected):
                tokens.succeed("t", {"semaphore": S})
            with pytest.raises(expected):
                tokens.fail("t", "E", "cause")
        for op in ("SendTaskSuccess", "SendTaskFailure"):
            sfn.meta.events.unregister(f"before-call.sfn.{op}", answer)
    assert tokens.succeed("t", {"semaphore": S}) is Delivery.DELIVERED  # the default moto takes any token
    arn = sfn.start_execution(stateMachineArn=machine, name="r")["executionArn"]
    assert tokens.execution_status(arn) == "RUNNING"
    end_execution(arn, "FAILED")
    assert tokens.execution_status(arn) == "FAILED"
    assert tokens.execution_status(arn.replace(":r", ":nobody")) is None

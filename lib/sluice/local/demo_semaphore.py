"""The demo's semaphore part: the stack's example workflow (``stack/semaphore-example.asl.json``, the
semaphore ``example``, limit 2 by the stack's ``semaphores`` parameter) run through the deployed
semaphore function, a few executions started at once.

moto runs the states of a state machine created through the API in execution mode, but a Task never
invokes a Lambda function there (that needs Docker). So the demo reads the deployed example's
definition back (``SemaphoreExampleStateMachineArn``) and creates a copy whose ``lambda:invoke`` tasks
send their payload to a queue of the demo instead (``sqs:sendMessage.waitForTaskToken``), everything
else as deployed but the section's Wait (1 s instead of 5). The demo plays Lambda for them:

    Acquire  (lambda:invoke.waitForTaskToken)  its payload carries the task token, as deployed: the
             deployed function gets it and answers it with SendTaskSuccess when a permit is free
    Release  (lambda:invoke)                   the deployed function gets the payload; the demo then
             answers the task with the function's result (its error, if it raised), as Lambda would

The function runs in its own deployed container (``sluice.local.lambdas``). Who was inside when is
read back from Step Functions' own history (the Acquire task's success, the Release task's start),
and the table's holders are sampled while it runs.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from sluice.local.chart import peak
from sluice.local.events import status_change_event
from sluice.local.lambdas import Containers, InvocationError

SEMAPHORE = "example"
LAMBDA_TASKS = ("arn:aws:states:::lambda:invoke", "arn:aws:states:::lambda:invoke.waitForTaskToken")
SECTION_SECONDS = 1
TOKEN_FIELD = "demoTaskToken"  # the Release task's own token, for the demo to answer


@dataclass
class SectionResult:
    executions: int = 0
    limit: int = 0
    peak_inside: int = 0  # from Step Functions' history
    peak_holders: int = 0  # from the table, sampled
    samples: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    holders_left: int = 0
    end_events: int = 0  # status-change events the stack's rule sent to the semaphore function
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    intervals: list[tuple[float, float]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.executions > 0
            and self.peak_inside <= self.limit
            and self.peak_holders <= self.limit
            and self.statuses == {"SUCCEEDED": self.executions}
            and self.holders_left == 0
            and not self.errors
        )

    def problems(self) -> list[str]:
        if self.ok:
            return []
        return [
            f"semaphore section: peak inside {self.peak_inside}, holders {self.peak_holders} (limit {self.limit}), "
            f"statuses {self.statuses}, {self.holders_left} permit(s) left, errors {self.errors[:1]}"
        ]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def demo_definition(deployed: dict[str, Any], queue_url: str) -> dict[str, Any]:
    """The deployed example, each Lambda task sending its payload to ``queue_url`` instead."""
    definition = copy.deepcopy(deployed)
    for state in definition["States"].values():
        if state.get("Type") == "Parallel":
            for branch in state["Branches"]:
                for inner in branch["States"].values():
                    if inner.get("Type") == "Wait":
                        inner["Seconds"] = SECTION_SECONDS
        if state.get("Type") != "Task" or state.get("Resource") not in LAMBDA_TASKS:
            continue
        payload = dict(state["Parameters"]["Payload"])
        if state["Resource"].endswith(".waitForTaskToken"):
            body = payload  # the function answers the token itself
        else:
            body = {**payload, f"{TOKEN_FIELD}.$": "$$.Task.Token"}
        state["Resource"] = "arn:aws:states:::sqs:sendMessage.waitForTaskToken"
        state["Parameters"] = {"QueueUrl": queue_url, "MessageBody": body}
    return definition


def example_definition(template: dict[str, Any], function_arn: str) -> dict[str, Any]:
    """The example workflow's definition as the deployed template gives it (``Fn::Join`` of the ASL
    around the semaphore function's ARN)."""
    raw = template["Resources"]["SemaphoreExampleStateMachine"]["Properties"]["DefinitionString"]
    if isinstance(raw, dict):
        separator, pieces = raw["Fn::Join"]
        raw = separator.join(p if isinstance(p, str) else function_arn for p in pieces)
    return json.loads(raw)


class SemaphoreSection:
    def __init__(
        self, aws: Any, outputs: dict[str, str], template: dict[str, Any], function: Containers, route: Any
    ) -> None:
        self.aws = aws
        self.outputs = outputs
        self.template = template
        self.function = function
        self.route = route  # the functions EventBridge would invoke with an event (Deployment.route)
        self.sfn = aws.client("stepfunctions")
        self.sqs = aws.client("sqs")

    def run(self, count: int = 6, *, timeout: float = 60.0) -> SectionResult:
        from sluice.adapters.dynamo.semaphore import DynamoSemaphoreStore
        from sluice.semaphore.model import pool_of

        result = SectionResult(executions=count)
        began = time.monotonic()
        store = DynamoSemaphoreStore(self.aws.client("dynamodb"), self.outputs["TableName"])
        queue = self.sqs.create_queue(QueueName="sluice-demo-semaphore-tasks")["QueueUrl"]
        example = self.outputs["SemaphoreExampleStateMachineArn"]
        deployed = example_definition(self.template, self.outputs["SemaphoreFunctionArn"])
        # The copy takes the deployed example's name, and so its ARN, when moto's backend has no state
        # machine there (CloudFormation's are not kept by it): the stack's status-change rule matches it.
        existing = {m["stateMachineArn"] for m in self.sfn.list_state_machines()["stateMachines"]}
        name = example.rsplit(":", 1)[1] if example not in existing else "sluice-demo-semaphore-example"
        machine = self.sfn.create_state_machine(
            name=name,
            definition=json.dumps(demo_definition(deployed, queue)),
            roleArn=f"arn:aws:iam::{example.split(':')[4]}:role/{name}",
        )["stateMachineArn"]
        arns = [
            self.sfn.start_execution(stateMachineArn=machine, name=f"section-{i:02}", input="{}")[
                "executionArn"
            ]
            for i in range(count)
        ]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for message in self.sqs.receive_message(
                QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=0
            ).get("Messages", []):
                self.sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
                self._play_lambda(json.loads(message["Body"]), result)
            occupancy = store.slots.occupancy(pool_of(SEMAPHORE))
            result.limit = occupancy.limit
            result.peak_holders = max(result.peak_holders, occupancy.running)
            result.samples += 1
            statuses = [self.sfn.describe_execution(executionArn=a)["status"] for a in arns]
            if "RUNNING" not in statuses:
                break
            time.sleep(0.1)
        described = [self.sfn.describe_execution(executionArn=a) for a in arns]
        statuses = [d["status"] for d in described]
        result.statuses = {s: statuses.count(s) for s in sorted(set(statuses))}
        for execution in described:  # EventBridge: each end to the stack's rules that match it
            if execution["status"] == "RUNNING":
                continue
            event = status_change_event(execution)
            for key in self.route(event):
                if key == "semaphore":
                    result.end_events += 1
                    self._play_lambda(event, result)
        result.intervals = [self._inside(a) for a in arns]
        result.intervals = [i for i in result.intervals if i[1] >= i[0]]
        result.peak_inside = peak(result.intervals) if result.intervals else 0
        result.holders_left = store.slots.occupancy(pool_of(SEMAPHORE)).running
        result.seconds = time.monotonic() - began
        return result

    def _play_lambda(self, body: dict[str, Any], result: SectionResult) -> None:
        token = body.pop(TOKEN_FIELD, None) if "action" in body else None
        try:
            answer = self.function.invoke(body)
        except InvocationError as exc:
            result.errors.append(f"{body.get('action')}: {exc}")
            if token:
                self.sfn.send_task_failure(taskToken=token, error=exc.error_type, cause=str(exc)[:1000])
            return
        if token:  # a plain lambda:invoke task ends with the function's result
            self.sfn.send_task_success(taskToken=token, output=json.dumps({"Payload": answer}))

    def _inside(self, execution_arn: str) -> tuple[float, float]:
        """(entered, left) the section, from the execution's history: the Acquire task's success
        and the Release state's entry."""
        events = self.sfn.get_execution_history(executionArn=execution_arn, maxResults=1000)["events"]
        entered = left = None
        for event in events:
            kind, when = event["type"], event["timestamp"].timestamp()
            if (
                kind == "TaskStateExited"
                and event.get("stateExitedEventDetails", {}).get("name") == "Acquire"
            ):
                entered = when
            if (
                kind == "TaskStateEntered"
                and event.get("stateEnteredEventDetails", {}).get("name") == "Release"
            ):
                left = when
        if entered is None or left is None:
            return (0.0, -1.0)
        return (entered, left)


def summary_lines(r: SectionResult) -> list[str]:
    mark = "ok" if r.peak_inside <= r.limit and r.peak_holders <= r.limit else "EXCEEDED"
    return [
        f"  semaphore   : {r.executions} executions of the example workflow through the semaphore "
        f"'{SEMAPHORE}' (limit {r.limit}), {r.seconds:.1f} s: "
        + ", ".join(f"{n} {s.lower()}" for s, n in r.statuses.items()),
        f"    peak inside the section, Step Functions history : {r.peak_inside:>2} / limit {r.limit}  {mark}",
        f"    peak permits held, table samples               : {r.peak_holders:>2} / limit {r.limit}  "
        f"({r.samples} samples; {r.holders_left} held at the end)",
        f"    ends        : {r.end_events} status-change event(s) routed to the semaphore function by the stack's rule",
    ]

"""A Sluice stack in moto, plus the two EventBridge events AWS documents, for tests.

moto fires no EventBridge rule, so tests build the scheduled event and the status-change event
themselves and call the handlers; executions stay RUNNING until ``finish`` ends them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import boto3
from botocore.config import Config
from moto.core import DEFAULT_ACCOUNT_ID
from moto.stepfunctions.models import stepfunctions_backends

from sluice.adapters.dynamo.store import create_table
from sluice.core.clock import SystemClock
from sluice.core.ports import Clock
from sluice.features.lanes import DEFAULT_LANE, parse_lanes
from sluice.launch.launcher import Launcher
from sluice.launch.settings import Settings
from sluice.runtime import Runtime

REGION = "us-east-1"
# No botocore retries in tests: its backoff really sleeps, and a throttle should reach Sluice at once.
NO_RETRY = Config(retries={"mode": "standard", "total_max_attempts": 1})
WORKFLOW = {"StartAt": "Work", "States": {"Work": {"Type": "Pass", "End": True}}}


class Naps(list[float]):
    """An injected ``sleep`` that records each wait instead of waiting (and moves a fake clock)."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def __call__(self, seconds: float) -> None:
        self.append(seconds)
        advance = getattr(self.clock, "advance", None)
        if advance is not None:
            advance(seconds)


@dataclass
class Stack:
    session: Any
    settings: Settings
    clock: Clock = field(default_factory=SystemClock)
    naps: Naps = field(init=False)
    _reader: tuple[Settings, Runtime] | None = field(default=None, init=False, repr=False)
    _own_clients: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.naps = Naps(self.clock)

    def _reading(self) -> Runtime:
        """A runtime for the harness's own reads, kept while the settings stay (a new one per read cost
        a client per call): never handed to a test, so a test's hook is only on its clients when
        registered on the session before their first use, as with ``_own``."""
        if self._reader is None or self._reader[0] is not self.settings:
            self._reader = (self.settings, self.runtime())
        return self._reader[1]

    def client(self, service: str) -> Any:
        return self.session.client(service, region_name=REGION)

    def _own(self, service: str) -> Any:
        """A client for the harness's own sends and reads, made once per stack: never handed to a
        test, so a test's hook is only on it when registered on the session before its first use."""
        if service not in self._own_clients:
            self._own_clients[service] = self.client(service)
        return self._own_clients[service]

    def runtime(self, **overrides: Any) -> Runtime:
        return Runtime(
            replace(self.settings, **overrides),
            session=self.session,
            clock=self.clock,
            client_config=NO_RETRY,
            sleep=self.naps,
        )

    def launcher(self, **overrides: Any) -> Launcher:
        return self.runtime(**overrides).launcher()

    # -- producer side ------------------------------------------------------------------------------

    def send(
        self,
        body: Any,
        *,
        group: str | None = None,
        dedup: str | None = None,
        lane: str = DEFAULT_LANE,
        **attributes: str,
    ) -> str:
        text = body if isinstance(body, str) else json.dumps(body)
        request: dict[str, Any] = {
            "QueueUrl": self.settings.lane_queue_url(lane)
            if lane != DEFAULT_LANE
            else self.settings.queue_url,
            "MessageBody": text,
            "MessageGroupId": group or "g",
            "MessageDeduplicationId": dedup or uuid.uuid4().hex,
        }
        if attributes:
            request["MessageAttributes"] = {
                k.replace("_", "-"): {"DataType": "String", "StringValue": v} for k, v in attributes.items()
            }
        return self._own("sqs").send_message(**request)["MessageId"]

    # -- observations ----------------------------------------------------------------------------

    def executions(self, status: str | None = None) -> list[dict[str, Any]]:
        """The executions of every state machine the stack starts (a lane's own too)."""
        sfn = self._own("stepfunctions")
        out: list[dict[str, Any]] = []
        for arn in dict.fromkeys(
            [self.settings.state_machine_arn, *self.settings.lane_state_machines.values()]
        ):
            request: dict[str, Any] = {"stateMachineArn": arn}
            if status:
                request["statusFilter"] = status
            for page in sfn.get_paginator("list_executions").paginate(**request):
                out.extend(page["executions"])
        return out

    def running(self) -> list[str]:
        return [e["name"] for e in self.executions("RUNNING")]

    def inputs(self) -> list[Any]:
        sfn = self._own("stepfunctions")
        return [
            json.loads(sfn.describe_execution(executionArn=e["executionArn"])["input"])
            for e in self.executions()
        ]

    def visible_again(self, receipts: list[str]) -> None:
        """Messages in flight become visible again, as when their visibility timeout ends (moto's
        runs in real time; ``tests.support.hooks.receipts_of`` gives the receipts)."""
        sqs = self._own("sqs")
        for receipt in receipts:
            sqs.change_message_visibility(
                QueueUrl=self.settings.queue_url, ReceiptHandle=receipt, VisibilityTimeout=0
            )

    def queue_counts(self, url: str | None = None) -> tuple[int, int]:
        attrs = self._own("sqs").get_queue_attributes(
            QueueUrl=url or self.settings.queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attrs["ApproximateNumberOfMessages"]), int(attrs["ApproximateNumberOfMessagesNotVisible"])

    def drain(self, url: str) -> list[dict[str, Any]]:
        """Read and delete every message of a FIFO queue (an unread in-flight message would hide the
        rest of its group)."""
        sqs = self._own("sqs")
        out: list[dict[str, Any]] = []
        while True:
            got = sqs.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=10,
                MessageAttributeNames=["All"],
                MessageSystemAttributeNames=["All"],
            ).get("Messages", [])
            if not got:
                return out
            out.extend(got)
            sqs.delete_message_batch(
                QueueUrl=url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)],
            )

    def dlq_messages(self) -> list[dict[str, Any]]:
        return self.drain(self.settings.dlq_url)

    # -- playing Step Functions and EventBridge --------------------------------------------------

    def finish(
        self,
        name: str,
        status: str = "SUCCEEDED",
        *,
        error: str | None = None,
        output: str | None = None,
        output_in_event: bool = True,
    ) -> dict[str, Any]:
        """End a RUNNING execution in moto and return the status-change event AWS would send: with
        the same stop date, and ``output`` in it unless ``output_in_event`` is False (EventBridge
        leaves out an output too big for an event: ``outputDetails.included`` false)."""
        backend = stepfunctions_backends[DEFAULT_ACCOUNT_ID][REGION]
        reader = self._reading()
        record = reader.store().execution(name)
        arn = record.arn if record is not None and record.arn else reader.executions().arn_for(name)
        execution = backend.describe_execution(arn)
        execution.status = status
        execution.stop_date = datetime.now(UTC)
        execution.output = output
        if error:
            execution.error, execution.cause = error, f"{error} cause"
        return status_change_event(
            execution.state_machine_arn,
            name,
            status,
            error=error,
            stop=execution.stop_date,
            output=output if output_in_event else None,
            output_included=output_in_event,
        )


def scheduled_event() -> dict[str, Any]:
    """EventBridge "Scheduled Event", as documented."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": DEFAULT_ACCOUNT_ID,
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": REGION,
        "resources": [f"arn:aws:events:{REGION}:{DEFAULT_ACCOUNT_ID}:rule/sluice-dev-launcher"],
        "detail": {},
    }


def status_change_event(
    state_machine_arn: str,
    name: str,
    status: str,
    *,
    error: str | None = None,
    input_json: str = "{}",
    stop: datetime | None = None,
    output: str | None = None,
    output_included: bool = True,
) -> dict[str, Any]:
    """EventBridge "Step Functions Execution Status Change", as documented."""
    execution_arn = state_machine_arn.replace(":stateMachine:", ":execution:") + f":{name}"
    now_ms = int((stop or datetime.now(UTC)).timestamp() * 1000)
    ended = status != "RUNNING"
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Step Functions Execution Status Change",
        "source": "aws.states",
        "account": DEFAULT_ACCOUNT_ID,
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": REGION,
        "resources": [execution_arn],
        "detail": {
            "executionArn": execution_arn,
            "stateMachineArn": state_machine_arn,
            "name": name,
            "status": status,
            "startDate": now_ms - 1000,
            "stopDate": now_ms if status != "RUNNING" else None,
            "input": input_json,
            "output": output,
            "inputDetails": {"included": True},
            "outputDetails": {"included": output_included} if ended else None,
            "error": error,
            "cause": f"{error} cause" if error else None,
        },
    }


@dataclass
class LambdaContext:
    """The parts of the Lambda context object the handlers read."""

    remaining_ms: int = 120_000
    function_name: str = "sluice-dev-launcher"
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = f"arn:aws:lambda:{REGION}:{DEFAULT_ACCOUNT_ID}:function:sluice-dev-launcher"
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def new_machine(stack: Any, name: str = "sluice-test-workflow-v2") -> str:
    """Another state machine for the stack to switch to (the documented upgrade path); its ARN."""
    return stack.client("stepfunctions").create_state_machine(
        name=name,
        definition=json.dumps(WORKFLOW),
        roleArn=f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:role/sluice-test-sfn",
    )["stateMachineArn"]


def functions_environment(stack: Stack, **extra: str) -> dict[str, str]:
    """The SLUICE_* variables of the deployed functions, pointing at the moto ``stack`` (MAX 5, no
    waiting on an empty queue, MAX read every time), ``extra`` over them."""
    s = stack.settings
    return {
        "SLUICE_QUEUE_URL": s.queue_url,
        "SLUICE_DLQ_URL": s.dlq_url,
        "SLUICE_TABLE_NAME": s.table_name,
        "SLUICE_STATE_MACHINE_ARN": s.state_machine_arn,
        "SLUICE_MAX_CONCURRENCY": "5",
        "SLUICE_MAX_PARAMETER": s.max_parameter or "",
        "SLUICE_MAX_CACHE_SECONDS": "0",
        "SLUICE_RECEIVE_WAIT_SECONDS": "0",
        **extra,
    }


def build_stack(
    session: Any,
    *,
    name: str = "sluice-test",
    max_concurrency: int = 5,
    max_receive_count: int = 5,
    visibility_timeout: int = 180,
    clock: Clock | None = None,
    lanes: str = "",
    lane_machines: tuple[str, ...] = (),
    high_throughput: bool = True,
    **settings: Any,
) -> Stack:
    """A stack on moto as the deploy makes it; ``lanes`` as the stack parameter (a queue per lane);
    ``lane_machines``: lanes given a state machine of their own (``<name>-<lane>-workflow``);
    ``high_throughput``: the queues in high-throughput FIFO mode, as deployed (moto keeps the
    attributes but deduplicates by queue all the same: ``tests.support.sqs_dedup``)."""
    sqs = session.client("sqs", region_name=REGION)
    fifo = {"FifoQueue": "true", "ContentBasedDeduplication": "false"}
    if high_throughput:
        fifo |= {"FifoThroughputLimit": "perMessageGroupId", "DeduplicationScope": "messageGroup"}
    dlq_url = sqs.create_queue(QueueName=f"{name}-dlq.fifo", Attributes=fifo)["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]

    def payload_queue(queue_name: str) -> str:
        return sqs.create_queue(
            QueueName=queue_name,
            Attributes={
                **fifo,
                "VisibilityTimeout": str(visibility_timeout),
                "RedrivePolicy": json.dumps(
                    {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": max_receive_count}
                ),
            },
        )["QueueUrl"]

    queue_url = payload_queue(f"{name}.fifo")
    ddb = session.client("dynamodb", region_name=REGION)
    create_table(ddb, f"{name}-table")
    sfn = session.client("stepfunctions", region_name=REGION)
    sm_arn = sfn.create_state_machine(
        name=f"{name}-workflow",
        definition=json.dumps(WORKFLOW),
        roleArn=f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:role/{name}-sfn",
    )["stateMachineArn"]
    parameter = f"/{name}/max-concurrency"
    session.client("ssm", region_name=REGION).put_parameter(
        Name=parameter, Value=str(max_concurrency), Type="String"
    )
    parsed = parse_lanes(lanes, max_concurrency)
    lane_urls = {
        lane.name: payload_queue(f"{name}-lane-{lane.name}.fifo")
        for lane in parsed
        if lane.name != DEFAULT_LANE
    }
    own = {
        lane: sfn.create_state_machine(
            name=f"{name}-{lane}-workflow",
            definition=json.dumps(WORKFLOW),
            roleArn=f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:role/{name}-sfn",
        )["stateMachineArn"]
        for lane in lane_machines
    }
    base = Settings(
        lanes=parsed,
        lane_queue_urls=lane_urls,
        lane_state_machines=own,
        queue_url=queue_url,
        dlq_url=dlq_url,
        table_name=f"{name}-table",
        state_machine_arn=sm_arn,
        max_concurrency=max_concurrency,
        max_parameter=parameter,
        max_cache_seconds=0,
        receive_wait_seconds=0,
        consistency_window_seconds=60,
        slots_per_shard=2,  # several shards even at a small MAX: cross-shard choices and races happen
    )
    return Stack(session=session, settings=replace(base, **settings), clock=clock or SystemClock())


@contextmanager
def moto_session() -> Iterator[Any]:
    from moto import mock_aws

    with mock_aws():
        yield boto3.session.Session(region_name=REGION)

"""The kept demo stack (``make demo DEMO_ARGS="--keep"``) goes on playing EventBridge after the
summary (issue 27, item 1): a payload enqueued then is started by a schedule tick, and its slot is
freed by its status-change event, delivered to the deployed completion function, with no manual
``sluice tick``.

The deployed stack runs on the embedded AWS with its functions in their containers, as in the demo;
the kept loop runs in this process on a FakeClock for a bounded number of schedule periods, and stops
as soon as the completion has released the late payload's slot.
"""

from __future__ import annotations

import io
import json
import uuid

import pytest
from rich.console import Console

from sluice.adapters.dynamo.store import DynamoStore
from sluice.core.clock import FakeClock
from sluice.core.model import PayloadState
from sluice.core.names import execution_name
from sluice.local.demo import STAGE, WORKFLOW, WORKFLOW_ARN
from sluice.local.demo_batch import DEMO_WORKFLOW
from sluice.local.demo_options import Options
from sluice.local.demo_run import Run
from sluice.local.embedded import ACCOUNT, EmbeddedAws

pytestmark = [
    pytest.mark.deploy,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Tried to parse AWS::"),
]

MAXIMUM = 2
PERIODS = 2_000  # schedule periods at most; the loop stops once the slot is freed


@pytest.fixture
def kept(packaged, tmp_path):
    package = packaged(STAGE, maxConcurrency=str(MAXIMUM), stateMachineArn=WORKFLOW_ARN)
    with EmbeddedAws(own_process=True, log=tmp_path / "moto.log") as aws:
        aws.execute_state_machines()
        aws.client("stepfunctions").create_state_machine(
            name=WORKFLOW,
            definition=json.dumps(DEMO_WORKFLOW),
            roleArn=f"arn:aws:iam::{ACCOUNT}:role/{WORKFLOW}",
        )
        deployment = aws.deploy(package, f"sluice-{STAGE}")
        containers = {
            key: deployment.containers(key, size=1, log=tmp_path / "handlers.log")
            for key in deployment.functions
        }
        try:
            yield deployment, containers
        finally:
            for pool in containers.values():
                pool.close()


def test_item1_the_kept_stack_starts_a_late_payload_and_frees_its_slot_on_its_status_event(kept, tmp_path):
    deployment, containers = kept
    out = deployment.outputs
    options = Options(maximum=MAXIMUM, out=tmp_path, tick=2.0, poll=0.25)
    run = Run(options, Console(file=io.StringIO()), f"sluice-{STAGE}", clock=FakeClock(0.0))
    # Enqueued after the summary, as a user of the kept stack would.
    message_id = deployment.aws.client("sqs").send_message(
        QueueUrl=out["QueueUrl"],
        MessageBody=json.dumps({"id": "late-1", "seconds": 0}),
        MessageGroupId="late",
        MessageDeduplicationId=uuid.uuid4().hex,
    )["MessageId"]
    name = execution_name("late-1", message_id)
    lines: list[str] = []

    run.keep(
        deployment, containers, until=lambda: run.counts["succeeded"] >= 1, periods=PERIODS, echo=lines.append
    )

    listed = deployment.aws.client("stepfunctions").list_executions(stateMachineArn=out["StateMachineArn"])
    assert [(e["name"], e["status"]) for e in listed["executions"]] == [(name, "SUCCEEDED")]
    store = DynamoStore(deployment.aws.client("dynamodb"), out["TableName"])
    assert store.ledger().holders == frozenset()  # the slot is free again
    assert store.payload("late-1").state is PayloadState.SUCCEEDED
    # Freed by the delivered status event (the completion's release), not by reconciliation.
    assert run.counts["succeeded"] == 1 and name in run.delivered
    assert f"status event: {name} SUCCEEDED: slot released" in lines
    attrs = deployment.aws.client("sqs").get_queue_attributes(
        QueueUrl=out["QueueUrl"],
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    assert attrs == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}

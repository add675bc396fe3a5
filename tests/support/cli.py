"""Running the ``sluice`` command in-process against a moto stack."""

from __future__ import annotations

import io
import json
import os
import zipfile
from dataclasses import dataclass
from typing import Any

from sluice.cli import main
from tests.support.aws import Stack


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        return json.loads(self.out)


def sluice(capsys: Any, *argv: Any, session: Any = None, clock: Any = None) -> Run:
    """``sluice ARGV...`` with stdout and stderr captured (``clock``: a ``FakeClock`` for ``wait``)."""
    capsys.readouterr()
    code = main([str(a) for a in argv], session=session, clock=clock)
    out, err = capsys.readouterr()
    return Run(code, out, err)


def clear_sluice_env(monkeypatch: Any) -> None:
    for name in list(os.environ):
        if name.startswith("SLUICE_"):
            monkeypatch.delenv(name)


def use_env(monkeypatch: Any, stack: Stack, **extra: str) -> None:
    """Name every resource with SLUICE_* variables, as an operator without a stack would."""
    clear_sluice_env(monkeypatch)
    s = stack.settings
    env = {
        "SLUICE_QUEUE_URL": s.queue_url,
        "SLUICE_DLQ_URL": s.dlq_url,
        "SLUICE_TABLE_NAME": s.table_name,
        "SLUICE_STATE_MACHINE_ARN": s.state_machine_arn,
        "SLUICE_MAX_PARAMETER": s.max_parameter or "",
        "SLUICE_RECEIVE_WAIT_SECONDS": "0",  # moto would really wait on an empty queue
        "SLUICE_MAX_CACHE_SECONDS": "0",
        **extra,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def parameter(stack: Stack) -> str:
    ssm = stack.client("ssm")
    return ssm.get_parameter(Name=stack.settings.max_parameter)["Parameter"]["Value"]


def parameter_tags(stack: Stack) -> dict[str, str]:
    ssm = stack.client("ssm")
    tags = ssm.list_tags_for_resource(ResourceType="Parameter", ResourceId=stack.settings.max_parameter)
    return {t["Key"]: t["Value"] for t in tags["TagList"]}


def receive_all(stack: Stack, url: str | None = None) -> list[dict[str, Any]]:
    """Take every message off a queue (hidden for 10 minutes), with all attributes."""
    sqs = stack.client("sqs")
    out: list[dict[str, Any]] = []
    while True:
        got = sqs.receive_message(
            QueueUrl=url or stack.settings.queue_url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=600,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
        ).get("Messages", [])
        if not got:
            return out
        out.extend(got)


def lane_queues(stack: Stack) -> str:
    """The stack's lane queues as ``SLUICE_LANE_QUEUES`` and the ``LaneQueueUrls`` output say them."""
    return ",".join(f"{name}={url}" for name, url in stack.settings.lane_queue_urls.items())


def deploy(
    stack: Stack,
    name: str,
    *,
    lanes: str = "",
    variables: dict[str, str] | None = None,
    outputs: dict[str, str] | None = None,
) -> None:
    """CloudFormation stack ``name`` whose outputs name the moto resources, and a launcher function
    whose environment holds the deployed settings, as `sls deploy` leaves them: ``SLUICE_LANES``
    with ``lanes`` (and the lanes' queues, there and in the output ``LaneQueueUrls``), and
    ``variables`` over the defaults; ``outputs`` over the stack's outputs."""
    s = stack.settings
    role = stack.client("iam").create_role(RoleName=f"{name}-launcher", AssumeRolePolicyDocument="{}")
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as z:
        z.writestr("handlers/launcher.py", "def handler(event, context):\n    return {}\n")
    queues = lane_queues(stack)
    environment = {
        "SLUICE_QUEUE_URL": s.queue_url,
        "SLUICE_MAX_CONCURRENCY": str(s.max_concurrency),
        "SLUICE_RECEIVE_WAIT_SECONDS": "0",
        "SLUICE_MAX_CACHE_SECONDS": "0",
        **({"SLUICE_LANES": lanes, "SLUICE_LANE_QUEUES": queues} if lanes else {}),
        **(variables or {}),
    }
    function = stack.client("lambda").create_function(
        FunctionName=f"{name}-launcher",
        Runtime="python3.12",
        Role=role["Role"]["Arn"],
        Handler="handlers/launcher.handler",
        Code={"ZipFile": code.getvalue()},
        Publish=True,
        Timeout=90,
        Environment={"Variables": environment},
    )
    values = {
        "QueueUrl": s.queue_url,
        "DlqUrl": s.dlq_url,
        "TableName": s.table_name,
        "StateMachineArn": s.state_machine_arn,
        "MaxConcurrencyParameter": s.max_parameter,
        "LauncherLambdaFunctionQualifiedArn": f"{function['FunctionArn']}:{function['Version']}",
        **({"LaneQueueUrls": queues} if lanes else {}),
        **(outputs or {}),
    }
    marker = {"Name": f"/{name}/marker", "Type": "String", "Value": name.removeprefix("sluice-")}
    template = {
        "Resources": {"Marker": {"Type": "AWS::SSM::Parameter", "Properties": marker}},
        "Outputs": {k: {"Value": v} for k, v in values.items()},
    }
    stack.client("cloudformation").create_stack(StackName=name, TemplateBody=json.dumps(template))

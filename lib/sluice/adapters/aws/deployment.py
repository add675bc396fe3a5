"""The deployed stack as the ``sluice`` command finds it (``sluice.cli.context``): the CloudFormation
stack's outputs and resources, and the launcher function's configuration in Lambda."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from sluice.adapters.errors import error_code, translate_client_error, translated
from sluice.core.errors import NotFound


class StackNotFound(NotFound):
    """CloudFormation has no stack of that name in this region."""


@dataclass(frozen=True, slots=True)
class FunctionConfiguration:
    """A Lambda function as deployed: its name, environment variables and timeout (seconds)."""

    name: str
    environment: dict[str, str]
    timeout: float | None = None


class Stacks:
    """CloudFormation stacks."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def outputs(self, stack: str) -> dict[str, str]:
        """The stack's outputs; ``StackNotFound`` when there is no such stack. Only AWS's answers are
        translated: a failure to reach AWS or to sign the request reaches the caller as it is."""
        try:
            stacks = self.client.describe_stacks(StackName=stack)["Stacks"]
        except ClientError as exc:
            if error_code(exc) == "ValidationError" and "does not exist" in str(exc):
                raise StackNotFound(f"stack {stack!r} does not exist") from exc
            raise translate_client_error(exc, f"DescribeStacks({stack})") from exc
        return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}

    def physical_id(self, stack: str, logical_id: str) -> str | None:
        """The physical id of the stack's resource ``logical_id`` (None: no such resource, or none yet)."""
        with translated("DescribeStackResources"):
            resources = self.client.describe_stack_resources(StackName=stack)["StackResources"]
        for resource in resources:
            if resource.get("LogicalResourceId") == logical_id and resource.get("PhysicalResourceId"):
                return str(resource["PhysicalResourceId"])
        return None


def stacks_of(session: Any) -> Stacks:
    """The stacks as a boto3 session sees them (before any ``Runtime`` is built: the stack's outputs
    are what the runtime's settings come from)."""
    return Stacks(session.client("cloudformation"))


class Functions:
    """Lambda functions."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def configuration(self, function: str) -> FunctionConfiguration:
        """``function``'s configuration (by name or ARN, qualified or not)."""
        with translated("GetFunctionConfiguration"):
            config = self.client.get_function_configuration(FunctionName=function)
        variables = (config.get("Environment") or {}).get("Variables") or {}
        return FunctionConfiguration(
            config.get("FunctionName", function), dict(variables), config.get("Timeout")
        )

    def invoke_async(self, function: str, event: Mapping[str, Any]) -> None:
        """Invoke ``function`` asynchronously (``InvocationType=Event``): Lambda queues ``event`` and
        answers at once, without waiting for the function."""
        with translated("Invoke"):
            self.client.invoke(
                FunctionName=function, InvocationType="Event", Payload=json.dumps(event).encode("utf-8")
            )

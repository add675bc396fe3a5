"""Finding the stack and building the runtime a command runs with.

Resources are found from the CloudFormation stack's outputs (``--stage`` → stack ``sluice-<stage>``, or
``--stack``; ``--region``); any ``SLUICE_*`` environment variable set overrides its output, and when the
variables name every resource a command uses, no stack is read.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from sluice.adapters.errors import error_code, translate_client_error
from sluice.errors import ConfigurationError
from sluice.runtime import Runtime
from sluice.settings import Settings

# Stack output → Settings field, and the environment variable that overrides it.
OUTPUTS = {
    "QueueUrl": "queue_url",
    "DlqUrl": "dlq_url",
    "TableName": "table_name",
    "StateMachineArn": "state_machine_arn",
    "MaxConcurrencyParameter": "max_parameter",
    "PayloadBucketName": "payload_bucket",
}
ENV_NAMES = {
    "queue_url": "SLUICE_QUEUE_URL",
    "dlq_url": "SLUICE_DLQ_URL",
    "table_name": "SLUICE_TABLE_NAME",
    "state_machine_arn": "SLUICE_STATE_MACHINE_ARN",
    "max_parameter": "SLUICE_MAX_PARAMETER",
    "payload_bucket": "SLUICE_PAYLOAD_BUCKET",
}
# What a command uses unless ``_needs`` says otherwise (the payload bucket only ``enqueue`` uses, and
# only for a large payload: it is read from the stack when the stack is read anyway).
DEFAULT_NEEDS = ("queue_url", "dlq_url", "table_name", "state_machine_arn", "max_parameter")
LAUNCHER_OUTPUT = "LauncherLambdaFunctionQualifiedArn"
LAUNCHER_RESOURCE = "LauncherLambdaFunction"
DEFAULT_REGION = "us-east-1"  # the stack's region when nothing names one (stack/region.js)


@dataclass
class Context:
    args: argparse.Namespace
    runtime: Runtime
    stack: str | None = None  # None when the environment named every resource
    outputs: dict[str, str] = field(default_factory=dict)
    _launcher: DeployedLauncher | None = None

    @property
    def settings(self) -> Settings:
        return self.runtime.settings

    def out(self, human: str, data: Any) -> None:
        if self.args.json:
            print(json.dumps(data, indent=2, sort_keys=True, default=str))
        else:
            print(human)

    # -- what the deployed launcher runs with ---------------------------------------------------------

    def launcher(self) -> DeployedLauncher:
        """The deployed launcher function's settings, as far as they can be read (best effort)."""
        if self._launcher is None:
            self._launcher = _read_launcher(self)
        return self._launcher

    def deployed_default(self) -> int | None:
        """The deployed default MAX: ``SLUICE_MAX_CONCURRENCY`` here, else the launcher's."""
        raw = os.environ.get("SLUICE_MAX_CONCURRENCY", "").strip()
        if not raw:
            raw = self.launcher().environment.get("SLUICE_MAX_CONCURRENCY", "").strip()
        try:
            value = int(raw)
        except ValueError:
            return None
        return value if value >= 0 else None


def local_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("SLUICE_") and v.strip()}


@dataclass(frozen=True)
class DeployedLauncher:
    """What the CLI knows of the deployed launcher function."""

    environment: dict[str, str]  # its SLUICE_* variables
    source: str  # where they came from, for the output
    timeout: float | None = None  # seconds


def _read_launcher(ctx: Context) -> DeployedLauncher:
    """Ask Lambda for the launcher's configuration: by the stack output's qualified ARN, else by the
    stack's ``LauncherLambdaFunction`` resource. Nothing found: the defaults, and say so."""
    if not ctx.stack:
        return DeployedLauncher({}, "no stack: the defaults and this shell's SLUICE_* variables")
    failures: list[str] = []
    for function in _launcher_candidates(ctx, failures):
        try:
            config = ctx.runtime.client("lambda").get_function_configuration(FunctionName=function)
        except Exception as exc:  # best effort, as above
            failures.append(f"{function}: {_short(exc)}")
            continue
        variables = (config.get("Environment") or {}).get("Variables") or {}
        name = config.get("FunctionName", function)
        environment = {k: v for k, v in variables.items() if k.startswith("SLUICE_")}
        return DeployedLauncher(environment, f"launcher function {name}", config.get("Timeout"))
    unread = "; ".join(failures)
    return DeployedLauncher(
        {}, f"the defaults and this shell's SLUICE_* variables (launcher not readable: {unread})"
    )


def _launcher_candidates(ctx: Context, failures: list[str]) -> Iterator[str]:
    if ctx.outputs.get(LAUNCHER_OUTPUT):
        yield ctx.outputs[LAUNCHER_OUTPUT]
    try:
        resources = ctx.runtime.client("cloudformation").describe_stack_resources(StackName=ctx.stack)[
            "StackResources"
        ]
    except Exception as exc:  # best effort: any failure means "use the defaults, and say so"
        failures.append(f"{LAUNCHER_RESOURCE}: {_short(exc)}")
        return
    for resource in resources:
        if resource.get("LogicalResourceId") == LAUNCHER_RESOURCE and resource.get("PhysicalResourceId"):
            yield resource["PhysicalResourceId"]
            return
    failures.append(f"stack {ctx.stack} has no {LAUNCHER_RESOURCE}")


def _short(exc: Exception) -> str:
    text = error_code(exc) if isinstance(exc, ClientError) else str(exc).splitlines()[0]
    return text if len(text) <= 100 else text[:99] + "…"


def _stack_name(args: argparse.Namespace) -> str:
    return args.stack or f"sluice-{args.stage}"


def read_outputs(session: Any, stack: str) -> dict[str, str]:
    """The stack's outputs. Raises ``ConfigurationError`` with what to do when it cannot be read."""
    cfn = session.client("cloudformation")
    try:
        stacks = cfn.describe_stacks(StackName=stack)["Stacks"]
    except ClientError as exc:
        code = error_code(exc)
        if code == "ValidationError" and "does not exist" in str(exc):
            where = session.region_name or "the default region"
            endpoint = os.environ.get("AWS_ENDPOINT_URL")
            raise ConfigurationError(
                f"stack {stack!r} not found in {where}"
                + (f" at {endpoint} (AWS_ENDPOINT_URL)" if endpoint else "")
                + ". Deploy it first (`npx sls deploy --stage <stage>`, or `make demo` for the embedded AWS), "
                "point at another one with --stage, --stack or --region, or name every resource with "
                + ", ".join(ENV_NAMES.values())
                + "."
            ) from exc
        raise translate_client_error(exc, f"DescribeStacks({stack})") from exc
    return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}


def _needs(args: argparse.Namespace) -> tuple[str, ...]:
    """The resources a command uses. When the environment names them all, no stack is read (a
    producer holding only the producer policy can ``sluice enqueue`` with SLUICE_QUEUE_URL alone)."""
    command = getattr(args, "command", None)
    if command == "dlq":
        command = f"dlq {args.dlq_command}"
    if command == "semaphore":
        return ("table_name",)
    if command == "status" and getattr(args, "payload_id", None) is not None:
        return ("table_name",)
    return {
        "enqueue": ("queue_url",),
        "set-max": ("max_parameter", "table_name"),
        "pause": ("max_parameter", "table_name"),
        "resume": ("max_parameter", "table_name"),
        "dlq list": ("dlq_url",),
        "dlq delete": ("dlq_url",),
        "dlq redrive": ("queue_url", "dlq_url"),
    }.get(command, DEFAULT_NEEDS)


def _resolve(args: argparse.Namespace, session: Any) -> tuple[Settings, str | None, dict[str, str]]:
    local = local_env()
    if all(local.get(ENV_NAMES[field]) for field in _needs(args)):
        return Settings.from_env(local), None, {}
    stack = _stack_name(args)
    outputs = read_outputs(session, stack)
    from_stack = {ENV_NAMES[f]: outputs[name] for name, f in OUTPUTS.items() if outputs.get(name)}
    return Settings.from_env({**from_stack, **local}), stack, outputs


def _region(args: argparse.Namespace) -> str | None:
    """``--region``, else ``AWS_REGION`` (read first by the AWS SDKs, but not by boto3), else None: boto3
    then reads ``AWS_DEFAULT_REGION`` and the profile's region. The stack resolves its region in the
    same order (stack/region.js), so both look in the same place."""
    return args.region or os.environ.get("AWS_REGION", "").strip() or None


def make_context(args: argparse.Namespace, session: Any = None, clock: Any = None) -> Context:
    """Resolve settings and build the runtime; ``session`` is a boto3 Session (a new one when None)."""
    import boto3

    if session is None:
        session = boto3.session.Session(region_name=_region(args))
        if not session.region_name:  # nothing in the environment or the profile: the stack's default
            session = boto3.session.Session(region_name=DEFAULT_REGION)
    settings, stack, outputs = _resolve(args, session)
    runtime = (
        Runtime(settings, session=session)
        if clock is None
        else Runtime(settings, session=session, clock=clock)
    )
    return Context(args, runtime, stack, outputs)

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
from dataclasses import dataclass, field, replace
from typing import Any

from botocore.exceptions import ClientError

from sluice.adapters.aws.deployment import StackNotFound, stacks_of
from sluice.adapters.errors import error_code
from sluice.core.errors import ConfigurationError, SluiceError
from sluice.core.records import Lane
from sluice.features.lanes import DEFAULT_LANE, parse_lane_queues, parse_lane_state_machines, parse_lanes
from sluice.launch.settings import Settings
from sluice.runtime import Runtime

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
# Lanes (sluice.features.lanes): their queues are an output (absent on a stack without lanes), their
# configuration only the launcher's SLUICE_LANES, unless this shell sets it.
LANE_QUEUES_OUTPUT = "LaneQueueUrls"
LANE_QUEUES_ENV = "SLUICE_LANE_QUEUES"
LANES_ENV = "SLUICE_LANES"
LANE_MACHINES_ENV = "SLUICE_LANE_STATE_MACHINES"
DEFAULT_NEEDS = ("queue_url", "dlq_url", "table_name", "state_machine_arn", "max_parameter")
LAUNCHER_OUTPUT = "LauncherLambdaFunctionQualifiedArn"
LAUNCHER_RESOURCE = "LauncherLambdaFunction"
DEFAULT_REGION = "us-east-1"  # the stack's region when nothing names one (stack/region.js)
STACK_OUTPUTS = "stack outputs"  # a need no SLUICE_* variable meets: the stack is read


@dataclass
class Context:
    args: argparse.Namespace
    runtime: Runtime
    stack: str | None = None  # None when the environment named every resource
    outputs: dict[str, str] = field(default_factory=dict)
    _launcher: DeployedLauncher | None = None
    _lanes_read: bool = False

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

    # -- lanes (sluice.features.lanes) -------------------------------------------------------------------------

    def lanes(self) -> tuple[Lane, ...]:
        """The stack's lanes: ``SLUICE_LANES`` here, else the launcher's (``()``: no lanes). The
        settings then hold them, with each lane's queue: the stack output ``LaneQueueUrls`` or
        ``SLUICE_LANE_QUEUES`` here, else the launcher's; and the lanes' own state machines
        (``SLUICE_LANE_STATE_MACHINES``, here else the launcher's)."""
        if self._lanes_read or self.settings.lanes:
            return self.settings.lanes
        self._lanes_read = True
        if os.environ.get(LANES_ENV, "").strip():
            return self.settings.lanes  # set here and parsed with the settings: no lanes
        deployed = self.launcher().environment
        text = deployed.get(LANES_ENV, "").strip()
        if not text:
            return ()
        default = self.deployed_default()
        lanes = parse_lanes(text, self.settings.max_concurrency if default is None else default)
        queues = dict(self.settings.lane_queue_urls) or parse_lane_queues(deployed.get(LANE_QUEUES_ENV, ""))
        missing = [lane.name for lane in lanes if lane.name != DEFAULT_LANE and lane.name not in queues]
        if missing:
            raise ConfigurationError(
                f"lane(s) {', '.join(missing)} of {self.launcher().source} have no queue: the stack output "
                f"{LANE_QUEUES_OUTPUT} and {LANE_QUEUES_ENV} name none"
            )
        machines = dict(self.settings.lane_state_machines) or parse_lane_state_machines(
            deployed.get(LANE_MACHINES_ENV, ""), lanes
        )
        self.runtime.settings = replace(
            self.settings, lanes=lanes, lane_queue_urls=queues, lane_state_machines=machines
        )
        return lanes

    def lane(self, name: str) -> Lane:
        """The lane ``name`` of this stack; ``ConfigurationError`` naming the lanes there are."""
        lanes = self.lanes()
        if not lanes:
            source = self.launcher().source if self.stack else "this shell's SLUICE_* variables"
            raise ConfigurationError(
                f"no lane {name!r}: this stack has no lanes (no {LANES_ENV} in {source})"
            )
        return self.settings.lane(name)

    def lane_queue_url(self, name: str) -> str:
        """The queue of lane ``name``, known from the lanes' queues alone (a producer that may only
        send needs no more than the stack's outputs or ``SLUICE_LANE_QUEUES``)."""
        if name == DEFAULT_LANE:
            return self.settings.queue_url
        queues = self.settings.lane_queue_urls
        if name in queues:
            return queues[name]
        lanes = [lane.name for lane in self.lanes()] or sorted({DEFAULT_LANE, *queues})
        if name in lanes:  # named by SLUICE_LANES here, its queue nowhere
            raise ConfigurationError(
                f"lane {name!r} has no queue: the stack output {LANE_QUEUES_OUTPUT} and {LANE_QUEUES_ENV} name none"
            )
        if lanes == [DEFAULT_LANE]:
            if not self.stack:
                raise ConfigurationError(f"no lane {name!r}: {LANE_QUEUES_ENV} names no lane queue")
            raise ConfigurationError(f"no lane {name!r}: this stack has no lanes, only {DEFAULT_LANE!r}")
        raise ConfigurationError(f"no lane {name!r}: the lanes are {', '.join(lanes)}")


def stack_env(outputs: dict[str, str]) -> dict[str, str]:
    """The stack's outputs as the SLUICE_* variables they stand for."""
    env = {ENV_NAMES[f]: outputs[name] for name, f in OUTPUTS.items() if outputs.get(name)}
    if outputs.get(LANE_QUEUES_OUTPUT, "").strip():
        env[LANE_QUEUES_ENV] = outputs[LANE_QUEUES_OUTPUT]
    return env


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
    for function in _launcher_candidates(ctx, ctx.stack, failures):
        try:
            config = ctx.runtime.functions().configuration(function)
        except Exception as exc:  # best effort, as above
            failures.append(f"{function}: {_short(exc)}")
            continue
        environment = {k: v for k, v in config.environment.items() if k.startswith("SLUICE_")}
        return DeployedLauncher(environment, f"launcher function {config.name}", config.timeout)
    unread = "; ".join(failures)
    return DeployedLauncher(
        {}, f"the defaults and this shell's SLUICE_* variables (launcher not readable: {unread})"
    )


def _launcher_candidates(ctx: Context, stack: str, failures: list[str]) -> Iterator[str]:
    if ctx.outputs.get(LAUNCHER_OUTPUT):
        yield ctx.outputs[LAUNCHER_OUTPUT]
    try:
        physical = ctx.runtime.stacks().physical_id(stack, LAUNCHER_RESOURCE)
    except Exception as exc:  # best effort: any failure means "use the defaults, and say so"
        failures.append(f"{LAUNCHER_RESOURCE}: {_short(exc)}")
        return
    if physical:
        yield physical
        return
    failures.append(f"stack {stack} has no {LAUNCHER_RESOURCE}")


def _short(exc: Exception) -> str:
    """A failure in a few words: AWS's error code when AWS answered, else the first line of what
    went wrong (an adapter's error says it through the botocore error it was raised from)."""
    cause = exc.__cause__ if isinstance(exc, SluiceError) and exc.__cause__ is not None else exc
    text = error_code(cause) if isinstance(cause, ClientError) else str(cause).splitlines()[0]
    return text if len(text) <= 100 else text[:99] + "…"


def _stack_name(args: argparse.Namespace) -> str:
    return args.stack or f"sluice-{args.stage}"


def read_outputs(session: Any, stack: str) -> dict[str, str]:
    """The stack's outputs. Raises ``ConfigurationError`` with what to do when it cannot be read."""
    try:
        return stacks_of(session).outputs(stack)
    except StackNotFound as exc:
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


def _needs(args: argparse.Namespace) -> tuple[str, ...]:
    """The resources a command uses. When the environment names them all, no stack is read (a
    producer holding only the producer policy can ``sluice enqueue`` with SLUICE_QUEUE_URL alone)."""
    command = getattr(args, "command", None)
    if command == "dlq":
        command = f"dlq {args.dlq_command}"
    if command == "semaphore":
        # ``asl`` without --function: the stack's output SemaphoreFunctionArn, which no variable names
        return (STACK_OUTPUTS,) if args.semaphore_command == "asl" else ("table_name",)
    if command == "status" and getattr(args, "payload_id", None) is not None:
        return ("table_name",)
    lane = getattr(args, "lane", None)
    if command in ("enqueue", "dlq redrive") and lane not in (None, DEFAULT_LANE):
        return (
            ("queue_url", "dlq_url", "lane_queue_urls")
            if command == "dlq redrive"
            else ("queue_url", "lane_queue_urls")
        )
    if command in ("set-max", "pause", "resume") and lane is not None:
        return ("table_name", "lanes")
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
    names = {**ENV_NAMES, "lane_queue_urls": LANE_QUEUES_ENV, "lanes": LANES_ENV}
    if all(local.get(names.get(field, "")) for field in _needs(args)):
        return Settings.from_env(local), None, {}
    stack = _stack_name(args)
    outputs = read_outputs(session, stack)
    return Settings.from_env({**stack_env(outputs), **local}), stack, outputs


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

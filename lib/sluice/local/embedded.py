"""Package the stack with osls, deploy it into an embedded AWS (a moto server on 127.0.0.1) the way
``sls deploy`` does, and invoke the deployed functions' handlers in-process with their environment.

``sls deploy`` does three things with what ``sls package`` wrote to ``.serverless/``:

    create-stack template ──► CreateStack (the deployment bucket only)
    sluice.zip            ──► PutObject into that bucket, under the S3 key the update template names
    update-stack template ──► UpdateStack (every resource; --param values were baked in at package time)

``EmbeddedAws.deploy`` does the same against the moto server and returns a ``Deployment``: the stack
outputs, each function as deployed (handler, timeout, environment read back with
GetFunctionConfiguration) and the EventBridge rules with their targets.

moto gaps, and what is done about them:

* No EventBridge rule ever fires (no schedule, no Step Functions status events; PutEvents never reaches
  Lambda). ``Deployment.tick`` and ``Deployment.deliver`` play EventBridge: they build the documented
  event and invoke every target of every deployed rule whose schedule or pattern applies (patterns are
  matched with moto's own EventPattern).
* Lambda functions are created but never run without Docker. ``Deployment.invoke`` imports the
  deployed handler (``handlers/launcher.handler`` → ``handlers.launcher.handler``) and calls it in this
  process with the function's environment, plus ``AWS_ENDPOINT_URL`` pointing at the server, and a
  context whose remaining time counts down from the deployed timeout. ``PYTHONPATH`` is left out: it
  describes the Lambda file system, and this process already imports ``lib`` and ``handlers``.
* ``AWS::DynamoDB::Table`` ignores ``TimeToLiveSpecification`` and ``PointInTimeRecoverySpecification``:
  both are applied by API after the deploy, from the template.
* Not created at all: ``AWS::S3::BucketPolicy``, ``AWS::SQS::QueuePolicy``, ``AWS::CloudWatch::Alarm``
  (moto has no CloudFormation support for them). ``Deployment.unsupported`` lists what the template
  asked for and the stack lacks.
* State machines created by CloudFormation live in moto's default Step Functions backend, where
  executions stay RUNNING until stopped. ``EmbeddedAws.execute_state_machines`` switches the server to
  its execution mode, which has its own backend: state machines must be created through the API after
  the switch (the demo packages with ``--param=stateMachineArn=<its workflow>`` for that reason).
* Queue URLs in the outputs carry the real AWS host name; clients with ``endpoint_url`` still reach the
  server, which routes by the queue's name.
* moto is not atomic under concurrent requests: a cancelled DynamoDB transaction restores a copy of
  the whole table (undoing other requests' writes), and two concurrent receives can take messages of
  one FIFO group. A server in its own process (``EmbeddedAws(own_process=True)``, what the demo uses
  with concurrent invocations) runs with ``make_moto_atomic`` (and ``make_sqs_clock_cheap``, a speed
  fix); an in-process server is left as moto ships it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "embedded", "AWS_SECRET_ACCESS_KEY": "embedded"}
CAPABILITIES = ["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"]
CREATE_TEMPLATE = "cloudformation-template-create-stack.json"
UPDATE_TEMPLATE = "cloudformation-template-update-stack.json"
LAMBDA_ONLY = frozenset({"PYTHONPATH"})  # environment that describes the Lambda file system

# What the copy of the project handed to osls leaves out: build output, local environments, caches.
COPY_IGNORE = frozenset(
    {
        ".git",
        "node_modules",
        ".serverless",
        "demo-out",
        "bench",
        "tests",
        "docs",
        "__pycache__",
        ".pytest_cache",
        ".ruff_cache",
        ".hypothesis",
    }
)

log = logging.getLogger("sluice.local")


class PackagingError(RuntimeError):
    """npm or osls is missing or failed."""


class DeployError(RuntimeError):
    """The stack did not reach CREATE_COMPLETE / UPDATE_COMPLETE."""


# -- packaging ---------------------------------------------------------------------------------


def project_root() -> Path:
    """The directory holding serverless.yml: the working directory, else this checkout."""
    for candidate in (Path.cwd(), Path(__file__).resolve().parents[3]):
        if (candidate / "serverless.yml").is_file():
            return candidate
    raise PackagingError("serverless.yml not found: run from the project's root directory")


def offline_environment() -> dict[str, str]:
    """The environment osls packages in: no profile, placeholder keys, no endpoint (see mk/package.mk)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ACCESS_KEY_ID="packaging-needs-no-credentials",
        AWS_SECRET_ACCESS_KEY="packaging-needs-no-credentials",
        AWS_REGION=REGION,
        AWS_DEFAULT_REGION=REGION,
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
    )
    return env


def ensure_node_modules(root: Path) -> None:
    """``npm ci`` when osls is not installed yet. A missing npm is an error, never a skip."""
    if (root / "node_modules" / ".bin" / "osls").exists():
        return
    npm = shutil.which("npm")
    if npm is None:
        raise PackagingError(
            "npm is not installed: install Node.js 20.19+, 22.13+ or 24+ with npm, then retry"
        )
    log.info("installing the npm packages (npm ci)")
    done = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund"], cwd=root, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise PackagingError(f"npm ci failed ({done.returncode}):\n{_tail(done.stdout + done.stderr)}")


def package_stack(
    workdir: Path,
    *,
    stage: str,
    params: Mapping[str, str] | None = None,
    root: Path | None = None,
    timeout: float = 600,
) -> Path:
    """``osls package --stage <stage> --param=k=v`` on a copy of the project in ``workdir``.

    A copy, so a ``make package`` running at the same time in the project keeps its own
    ``.serverless``. Returns the ``.serverless`` directory of the copy.
    """
    root = root or project_root()
    if shutil.which("npx") is None or shutil.which("node") is None:
        raise PackagingError("node and npx are not installed: install Node.js 20.19+, 22.13+ or 24+ with npm")
    ensure_node_modules(root)
    source = workdir / "project"
    if source.exists():
        shutil.rmtree(source)
    shutil.copytree(root, source, ignore=_ignore, symlinks=True)
    (source / "node_modules").symlink_to(root / "node_modules", target_is_directory=True)
    command = ["npx", "--no-install", "osls", "package", "--stage", stage]
    command += [f"--param={name}={value}" for name, value in (params or {}).items()]
    done = subprocess.run(
        command,
        cwd=source,
        env=offline_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    out = source / ".serverless"
    if done.returncode != 0 or not (out / UPDATE_TEMPLATE).is_file():
        raise PackagingError(
            f"{' '.join(command)} failed ({done.returncode}):\n{_tail(done.stdout + done.stderr)}"
        )
    return out


def _ignore(directory: str, names: list[str]) -> set[str]:
    return {n for n in names if n in COPY_IGNORE or n.startswith((".venv", ".lockenv"))}


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# -- the embedded AWS --------------------------------------------------------------------------


class EmbeddedAws:
    """A moto server on 127.0.0.1 and a free port, with clients that talk to it."""

    def __init__(self, region: str = REGION, *, own_process: bool = False, log: Path | None = None) -> None:
        """``own_process``: run the server in a child process (``python -m sluice.local.embedded``),
        so that on a small machine it does not share one interpreter lock with the code calling it.
        Tests that reach into moto's backends keep it in this process (the default)."""
        self.region = region
        self.own_process = own_process
        self.log = log
        self.endpoint = ""
        self._server: Any = None
        self._child: subprocess.Popen[str] | None = None
        self._clients: dict[str, Any] = {}
        self._executing = False

    def __enter__(self) -> EmbeddedAws:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> EmbeddedAws:
        if self.own_process:
            self._start_child()
        else:
            self.endpoint = _start_server()
            self._server = True
        # moto keeps its state per process, not per server: start from nothing.
        self._moto_api("reset")
        return self

    def _start_child(self) -> None:
        err = open(self.log, "a", encoding="utf-8") if self.log else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-m", "sluice.local.embedded"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        finally:
            if err is not subprocess.DEVNULL:
                err.close()
        assert self._child.stdout is not None
        line = self._child.stdout.readline().strip()
        if not line.startswith("http://"):
            self._child.kill()
            raise RuntimeError(f"the embedded AWS did not start: {line!r}")
        self.endpoint = line

    def stop(self) -> None:
        if self._server is None and self._child is None:
            return
        try:
            if self._executing:
                # The mode is process-wide: leave it as found for whatever runs moto next here.
                self.configure({"stepfunctions": {"execute_state_machine": False}})
            self._moto_api("reset")
        finally:
            if self._child is not None:
                assert self._child.stdin is not None
                self._child.stdin.close()  # the child serves until its stdin closes
                try:
                    self._child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._child.kill()
                    self._child.wait()
                self._child = None
            if self._server is not None:
                _stop_server(self.endpoint)
                self._server = None
            self._clients.clear()
            # Handlers invoked here keep a warm runtime whose clients point at this server: forget it.
            shared = sys.modules.get("handlers._shared")
            if shared is not None:
                shared.reset()

    # -- clients ------------------------------------------------------------------------------

    def session(self) -> Any:
        import boto3

        return boto3.session.Session(
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=self.region,
        )

    def client(self, service: str) -> Any:
        if service not in self._clients:
            from botocore.config import Config

            self._clients[service] = self.session().client(
                service,
                endpoint_url=self.endpoint,
                config=Config(retries={"mode": "standard", "max_attempts": 3}),
            )
        return self._clients[service]

    def environ(self) -> dict[str, str]:
        """What a process needs to use this server with plain boto3: endpoint, keys, region."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            **CREDENTIALS,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
        }

    # -- moto's own switches ------------------------------------------------------------------

    def configure(self, config: Mapping[str, Any]) -> None:
        """``POST /moto-api/config`` (the server-mode equivalent of ``mock_aws(config=...)``)."""
        self._moto_api("config", config)

    def _moto_api(self, path: str, body: Mapping[str, Any] | None = None) -> None:
        request = urllib.request.Request(
            f"{self.endpoint}/moto-api/{path}",
            data=json.dumps(body or {}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()

    def execute_state_machines(self) -> None:
        """Really run Pass, Wait, Choice, Succeed and Fail states from now on. Create the state
        machines after this call: those created before (CloudFormation's included) stay inert."""
        self.configure({"stepfunctions": {"execute_state_machine": True}})
        self._executing = True

    # -- deploy -------------------------------------------------------------------------------

    def deploy(self, package_dir: Path, stack_name: str) -> Deployment:
        """Deploy what ``osls package`` wrote to ``package_dir``, as ``sls deploy`` does."""
        cfn = self.client("cloudformation")
        create = json.loads((package_dir / CREATE_TEMPLATE).read_text())
        update = json.loads((package_dir / UPDATE_TEMPLATE).read_text())

        cfn.create_stack(StackName=stack_name, TemplateBody=json.dumps(create), Capabilities=CAPABILITIES)
        stack = self._settled(stack_name, "CREATE_COMPLETE")
        bucket = _outputs(stack)["ServerlessDeploymentBucketName"]

        s3 = self.client("s3")
        keys = sorted(_artifact_keys(update))
        if not keys:
            raise DeployError("the update template names no artifact in the deployment bucket")
        for key in keys:
            artifact = package_dir / Path(key).name
            if not artifact.is_file():
                raise DeployError(f"{artifact} is missing: the template expects it at s3://{bucket}/{key}")
            s3.upload_file(str(artifact), bucket, key)
        # sls deploy uploads the compiled template next to the artifacts and updates from its URL.
        template_key = f"{Path(keys[0]).parent.as_posix()}/compiled-cloudformation-template.json"
        s3.put_object(Bucket=bucket, Key=template_key, Body=json.dumps(update).encode())

        cfn.update_stack(
            StackName=stack_name,
            TemplateURL=f"https://{bucket}.s3.amazonaws.com/{template_key}",
            Capabilities=CAPABILITIES,
        )
        stack = self._settled(stack_name, "UPDATE_COMPLETE")
        # moto lists a resource type it cannot create as an entry without ids: leave those out.
        resources = {
            r["LogicalResourceId"]: r
            for r in cfn.describe_stack_resources(StackName=stack_name)["StackResources"]
            if r.get("LogicalResourceId")
        }
        self._apply_table_settings(update, resources)
        return Deployment(
            aws=self,
            stack_name=stack_name,
            outputs=_outputs(stack),
            functions=self._functions(resources),
            rules=self._rules(resources),
            unsupported=sorted(
                f"{logical} ({spec['Type']})"
                for logical, spec in update["Resources"].items()
                if logical not in resources and _created(spec, update)
            ),
        )

    def _settled(self, stack_name: str, wanted: str) -> dict[str, Any]:
        cfn = self.client("cloudformation")
        for _ in range(300):  # moto completes synchronously; this only guards against a change there
            stack = cfn.describe_stacks(StackName=stack_name)["Stacks"][0]
            if not stack["StackStatus"].endswith("_IN_PROGRESS"):
                break
            time.sleep(0.1)
        if stack["StackStatus"] != wanted:
            events = cfn.describe_stack_events(StackName=stack_name)["StackEvents"]
            reasons = [
                f"{e['LogicalResourceId']}: {e['ResourceStatus']} {e.get('ResourceStatusReason', '')}"
                for e in events
                if "FAILED" in e["ResourceStatus"]
            ]
            raise DeployError(f"stack {stack_name} is {stack['StackStatus']}: " + "; ".join(reasons))
        return stack

    def _apply_table_settings(self, template: dict[str, Any], resources: dict[str, Any]) -> None:
        """TTL and point-in-time recovery as the template asks (moto ignores both properties)."""
        ddb = self.client("dynamodb")
        for logical, spec in template["Resources"].items():
            if spec["Type"] != "AWS::DynamoDB::Table" or logical not in resources:
                continue
            table = resources[logical]["PhysicalResourceId"]
            props = spec.get("Properties", {})
            ttl = props.get("TimeToLiveSpecification")
            if ttl and ttl.get("Enabled"):
                ddb.update_time_to_live(
                    TableName=table,
                    TimeToLiveSpecification={"Enabled": True, "AttributeName": ttl["AttributeName"]},
                )
            pitr = props.get("PointInTimeRecoverySpecification", {})
            if pitr.get("PointInTimeRecoveryEnabled"):
                ddb.update_continuous_backups(
                    TableName=table,
                    PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True},
                )

    def _functions(self, resources: dict[str, Any]) -> dict[str, Function]:
        lam = self.client("lambda")
        functions: dict[str, Function] = {}
        for logical, r in resources.items():
            if r["ResourceType"] != "AWS::Lambda::Function":
                continue
            config = lam.get_function_configuration(FunctionName=r["PhysicalResourceId"])
            key = logical.removesuffix("LambdaFunction")
            key = key[:1].lower() + key[1:]
            functions[key] = Function(
                key=key,
                name=config["FunctionName"],
                arn=config["FunctionArn"],
                handler=config["Handler"],
                timeout=int(config.get("Timeout", 3)),
                memory=int(config.get("MemorySize", 128)),
                environment=dict(config.get("Environment", {}).get("Variables", {})),
            )
        return functions

    def _rules(self, resources: dict[str, Any]) -> list[Rule]:
        events = self.client("events")
        rules: list[Rule] = []
        for page in events.get_paginator("list_rules").paginate():
            for raw in page["Rules"]:
                targets = events.list_targets_by_rule(Rule=raw["Name"])["Targets"]
                rules.append(
                    Rule(
                        name=raw["Name"],
                        arn=raw["Arn"],
                        enabled=raw.get("State") == "ENABLED",
                        schedule=raw.get("ScheduleExpression"),
                        pattern=raw.get("EventPattern"),
                        target_arns=[t["Arn"] for t in targets],
                    )
                )
        return rules


_servers: dict[str, Any] = {}


def _start_server() -> str:
    """A ThreadedMotoServer on 127.0.0.1 and a free port; returns its endpoint."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    _servers[endpoint] = server
    return endpoint


def _stop_server(endpoint: str) -> None:
    server = _servers.pop(endpoint, None)
    if server is not None:
        server.stop()


_DYNAMODB_OPERATIONS = (
    "put_item",
    "get_item",
    "update_item",
    "delete_item",
    "query",
    "scan",
    "batch_get_item",
    "batch_write_item",
    "transact_write_items",
    "transact_get_items",
)
_SQS_OPERATIONS = (
    "get_queue_attributes",
    "send_message",
    "send_message_batch",
    "receive_message",
    "delete_message",
    "delete_message_batch",
    "change_message_visibility",
    "change_message_visibility_batch",
    "purge_queue",
)


def make_moto_atomic() -> None:
    """Make moto's DynamoDB and SQS as atomic as the real services, for a server that takes
    concurrent requests (moto serves each request in a thread of its own, without locks).

    * DynamoDB: a cancelled TransactWriteItems rolls back by putting back a copy of the whole table
      taken when it began, which undoes the writes other requests committed in between (claims vanish,
      ledger slots outlive their records). Every item operation runs under one lock here, and a
      cancelled transaction puts back only the items it touched (copying the whole table for every
      transaction also makes each claim slower as the table grows).
    * SQS: two ReceiveMessage calls at once can both take messages of one FIFO group, since each
      reads the in-flight groups before either marks its own; SQS never hands out a group twice. Every
      queue operation runs under one lock here, released while a long poll waits (which polls every
      50 ms instead of spinning while the only visible messages belong to groups in flight).

    Sluice's code is unchanged; this only makes the emulator behave as AWS documents.
    """
    import copy
    import threading

    import moto.dynamodb.models as ddb_models
    import moto.sqs.models as sqs_models
    from moto.dynamodb.models.dynamo_type import DynamoType
    from moto.dynamodb.models.table import Table

    if getattr(ddb_models.DynamoDBBackend, "_sluice_atomic", False):
        return
    ddb_lock, sqs_lock = threading.RLock(), threading.RLock()
    original_transact = ddb_models.DynamoDBBackend.transact_write_items

    class TableCopyIsFree:
        """``copy`` as moto.dynamodb.models sees it: a table "copies" to itself, items really copy."""

        def deepcopy(self, value: Any, memo: Any = None) -> Any:
            return value if isinstance(value, Table) else copy.deepcopy(value, memo)

        def __getattr__(self, name: str) -> Any:
            return getattr(copy, name)

    def transact(self: Any, transact_items: list[dict[str, Any]]) -> None:
        saved: list[tuple[Any, Any, Any]] = []
        for entry in transact_items:
            _, op = next(iter(entry.items()))
            table = self.tables.get(op.get("TableName"))
            key = op.get("Key") or op.get("Item") or {}
            if table is None or table.range_key_attr or table.hash_key_attr not in key:
                continue  # rejected before anything is written, or not a table Sluice has
            hash_value = DynamoType(key[table.hash_key_attr])
            saved.append((table, hash_value, copy.deepcopy(table.get_item(hash_value))))
        try:
            original_transact(self, transact_items)
        except BaseException:
            for table, hash_value, before in reversed(saved):
                if before is None:
                    table.items.pop(hash_value, None)
                else:
                    table.items[hash_value] = before
            raise

    def wait_for_messages(self: Any, timeout: int) -> None:
        sqs_lock.release()
        try:
            time.sleep(0.05)
        finally:
            sqs_lock.acquire()

    def locked(lock: Any, function: Any) -> Any:
        @functools.wraps(function)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            with lock:
                return function(self, *args, **kwargs)

        return run

    ddb_models.copy = TableCopyIsFree()  # type: ignore[assignment]
    ddb_models.DynamoDBBackend.transact_write_items = transact  # type: ignore[method-assign]
    for name in _DYNAMODB_OPERATIONS:
        setattr(ddb_models.DynamoDBBackend, name, locked(ddb_lock, getattr(ddb_models.DynamoDBBackend, name)))
    sqs_models.Queue.wait_for_messages = wait_for_messages  # type: ignore[method-assign]
    for name in _SQS_OPERATIONS:
        setattr(sqs_models.SQSBackend, name, locked(sqs_lock, getattr(sqs_models.SQSBackend, name)))
    ddb_models.DynamoDBBackend._sluice_atomic = True  # type: ignore[attr-defined]


def make_sqs_clock_cheap() -> None:
    """moto's SQS asks the clock through datetime arithmetic for every message each time it scans a
    queue (visibility, delay), so a FIFO send or a queue-depth read costs O(backlog) slow calls:
    200 sends take seconds. Its two clock functions read ``time.time()`` here instead (same values)."""
    import moto.sqs.models as sqs_models

    original_seconds, original_millis = sqs_models.unix_time, sqs_models.unix_time_millis

    def unix_time(dt: datetime | None = None) -> float:
        return time.time() if dt is None else original_seconds(dt)

    def unix_time_millis(dt: datetime | None = None) -> float:
        return time.time() * 1000.0 if dt is None else original_millis(dt)

    sqs_models.unix_time = unix_time  # type: ignore[assignment]
    sqs_models.unix_time_millis = unix_time_millis  # type: ignore[assignment]


def _serve() -> None:
    """Child process mode: print the endpoint, serve until stdin closes (the parent stopped or died)."""
    make_moto_atomic()
    make_sqs_clock_cheap()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    logging.getLogger("moto").setLevel(logging.CRITICAL)
    import warnings

    warnings.filterwarnings("ignore", message="Tried to parse AWS::", category=UserWarning)
    endpoint = _start_server()
    print(endpoint, flush=True)
    try:
        sys.stdin.read()
    finally:
        _stop_server(endpoint)


def _outputs(stack: dict[str, Any]) -> dict[str, str]:
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def _artifact_keys(template: dict[str, Any]) -> set[str]:
    """S3 keys the template expects in the deployment bucket (function code, layers)."""
    keys: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            bucket = node.get("S3Bucket")
            if isinstance(bucket, dict) and bucket.get("Ref") == "ServerlessDeploymentBucket":
                keys.add(node["S3Key"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(template.get("Resources", {}))
    return keys


def _created(spec: dict[str, Any], template: dict[str, Any]) -> bool:
    """Whether CloudFormation would create this resource: its condition, when it is a plain Equals on
    a parameter's default, is evaluated; anything else counts as created."""
    condition = spec.get("Condition")
    if not condition:
        return True
    rule = template.get("Conditions", {}).get(condition, {})
    negate = False
    if "Fn::Not" in rule:
        rule, negate = rule["Fn::Not"][0], True
    equals = rule.get("Fn::Equals")
    if not equals or not isinstance(equals[0], dict) or "Ref" not in equals[0]:
        return True
    default = template.get("Parameters", {}).get(equals[0]["Ref"], {}).get("Default")
    return (default == equals[1]) != negate


# -- the deployed stack --------------------------------------------------------------------------


@dataclass(frozen=True)
class Function:
    key: str  # the function's name in serverless.yml: "launcher", "completion"
    name: str
    arn: str
    handler: str  # "handlers/launcher.handler"
    timeout: int
    memory: int
    environment: dict[str, str]


@dataclass(frozen=True)
class Rule:
    name: str
    arn: str
    enabled: bool
    schedule: str | None
    pattern: str | None
    target_arns: list[str]

    def matches(self, event: Mapping[str, Any]) -> bool:
        return self.enabled and self._pattern is not None and self._pattern.matches_event(dict(event))

    @functools.cached_property
    def _pattern(self) -> Any:
        if not self.pattern:
            return None
        from moto.events.models import EventPattern

        return EventPattern.load(self.pattern)


@dataclass
class LambdaContext:
    """The Lambda context object the handlers read; the remaining time counts down from the timeout."""

    function_name: str
    invoked_function_arn: str
    memory_limit_in_mb: int
    timeout: int
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    _deadline: float = 0.0

    def __post_init__(self) -> None:
        self._deadline = time.monotonic() + self.timeout

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


@dataclass
class Deployment:
    aws: EmbeddedAws
    stack_name: str
    outputs: dict[str, str]
    functions: dict[str, Function]
    rules: list[Rule]
    unsupported: list[str] = field(default_factory=list)
    _warm: dict[str, str] | None = None

    # -- invoking the deployed code in this process --------------------------------------------

    def environment(self, function: str) -> dict[str, str]:
        """The deployed function's environment, as this process needs it to reach the server."""
        fn = self.functions[function]
        env = {k: v for k, v in fn.environment.items() if k not in LAMBDA_ONLY}
        env.update(self.aws.environ())
        env.update(
            AWS_LAMBDA_FUNCTION_NAME=fn.name,
            AWS_LAMBDA_FUNCTION_MEMORY_SIZE=str(fn.memory),
            AWS_LAMBDA_FUNCTION_TIMEOUT=str(fn.timeout),
        )
        return env

    def invoke(self, function: str, event: Mapping[str, Any]) -> Any:
        """Run the deployed handler of ``function`` here, as Lambda would run it there."""
        fn = self.functions[function]
        env = self.environment(function)
        module_path, _, attribute = fn.handler.rpartition(".")
        with patched_environ(env, drop=("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN")):
            shared = importlib.import_module("handlers._shared")
            if self._warm != fn.environment:
                # The first call, or a function configured differently: a cold start. Functions with
                # the same configuration share the warm runtime, as one container would.
                shared.reset()
                self._warm = dict(fn.environment)
            handler = getattr(importlib.import_module(module_path.replace("/", ".")), attribute)
            context = LambdaContext(
                function_name=fn.name,
                invoked_function_arn=fn.arn,
                memory_limit_in_mb=fn.memory,
                timeout=fn.timeout,
            )
            return handler(dict(event), context)

    # -- playing EventBridge -----------------------------------------------------------------

    def function_for(self, arn: str) -> str | None:
        for key, fn in self.functions.items():
            if arn in (fn.arn, fn.name) or arn.split(":")[-1] == fn.name:
                return key
        return None

    def schedule_rules(self) -> list[Rule]:
        return [r for r in self.rules if r.enabled and r.schedule]

    def scheduled(self) -> list[tuple[str, dict[str, Any]]]:
        """(function, "Scheduled Event") for every target of every schedule rule, as if all fired now."""
        return [
            (key, scheduled_event(rule.arn, self.aws.region))
            for rule in self.schedule_rules()
            for key in self._targets(rule)
        ]

    def route(self, event: Mapping[str, Any]) -> list[str]:
        """The functions EventBridge would invoke with ``event``: targets of the rules it matches."""
        return [key for rule in self.rules if rule.matches(event) for key in self._targets(rule)]

    def tick(self) -> list[tuple[str, Any]]:
        """Fire every schedule rule once and run its targets here."""
        return [(key, self.invoke(key, event)) for key, event in self.scheduled()]

    def deliver(self, event: Mapping[str, Any]) -> list[tuple[str, Any]]:
        """Deliver ``event`` as EventBridge would, running the targets here."""
        return [(key, self.invoke(key, event)) for key in self.route(event)]

    def _targets(self, rule: Rule) -> list[str]:
        return [key for arn in rule.target_arns if (key := self.function_for(arn)) is not None]


@contextlib.contextmanager
def patched_environ(values: Mapping[str, str], drop: tuple[str, ...] = ()) -> Iterator[None]:
    """Set ``values`` and remove ``drop`` in ``os.environ``; put everything back afterwards."""
    saved = {k: os.environ.get(k) for k in (*values, *drop)}
    try:
        for k in drop:
            os.environ.pop(k, None)
        os.environ.update(values)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# -- the two EventBridge events, as AWS documents them --------------------------------------------


def scheduled_event(rule_arn: str, region: str = REGION) -> dict[str, Any]:
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": rule_arn.split(":")[4] if rule_arn.count(":") >= 5 else ACCOUNT,
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [rule_arn],
        "detail": {},
    }


def status_change_event(execution: Mapping[str, Any], region: str = REGION) -> dict[str, Any]:
    """ "Step Functions Execution Status Change" for one DescribeExecution result."""

    def millis(value: Any) -> int | None:
        return None if value is None else int(value.timestamp() * 1000)

    arn = execution["executionArn"]
    status = execution["status"]
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Step Functions Execution Status Change",
        "source": "aws.states",
        "account": arn.split(":")[4],
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [arn],
        "detail": {
            "executionArn": arn,
            "stateMachineArn": execution["stateMachineArn"],
            "name": execution["name"],
            "status": status,
            "startDate": millis(execution.get("startDate")),
            "stopDate": millis(execution.get("stopDate")),
            "input": execution.get("input"),
            "output": execution.get("output"),
            "inputDetails": {"included": True},
            "outputDetails": {"included": True} if status == "SUCCEEDED" else None,
            "error": execution.get("error"),
            "cause": execution.get("cause"),
        },
    }


if __name__ == "__main__":
    _serve()

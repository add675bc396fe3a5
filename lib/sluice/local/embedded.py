"""Deploy what ``osls package`` wrote into an embedded AWS (a moto server on 127.0.0.1) the way
``sls deploy`` does, and run the deployed functions from their deployment package.

``sls deploy`` does three things with what ``sls package`` wrote to ``.serverless/``:

    create-stack template ──► CreateStack (the deployment bucket only)
    sluice.zip            ──► PutObject into that bucket, under the S3 key the update template names
    update-stack template ──► UpdateStack (every resource; --param values were baked in at package time)

Deployed again over a stack that exists (a new version over a running stage), the first step is
skipped, as ``sls deploy`` skips it.

``EmbeddedAws.deploy`` does the same against the moto server and returns a ``Deployment``
(``sluice.local.deployment``): the stack outputs, each function as deployed (handler, timeout,
environment read back with GetFunctionConfiguration, and its code: the zip fetched back from the
deployment bucket and extracted) and the EventBridge rules with their targets. Its functions run from
that code in processes of their own (``sluice.local.lambdas``): nothing here imports the project's
``handlers``.

moto gaps, and what is done about them (the EventBridge and Lambda ones: ``sluice.local.deployment``):

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
* moto is not atomic under concurrent requests: a server in its own process
  (``EmbeddedAws(own_process=True)``, what the demo uses with concurrent invocations) is made so
  (``sluice.local.moto_server``); an in-process server is left as moto ships it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sluice.local.deployment import Deployment, Function, Rule
from sluice.local.events import scheduled_event, status_change_event
from sluice.local.moto_server import ACCOUNT, REGION, start_server, stop_server
from sluice.local.packaging import CREATE_TEMPLATE, UPDATE_TEMPLATE, PackagingError, package_stack

__all__ = [  # also what the demo and tests/deploy import from here
    "ACCOUNT",
    "CREATE_TEMPLATE",
    "REGION",
    "UPDATE_TEMPLATE",
    "DeployError",
    "Deployment",
    "EmbeddedAws",
    "PackagingError",
    "package_stack",
    "scheduled_event",
    "status_change_event",
]

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "embedded", "AWS_SECRET_ACCESS_KEY": "embedded"}
CAPABILITIES = ["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"]


class DeployError(RuntimeError):
    """The stack did not reach CREATE_COMPLETE / UPDATE_COMPLETE."""


class EmbeddedAws:
    """A moto server on 127.0.0.1 and a free port, with clients that talk to it."""

    def __init__(self, region: str = REGION, *, own_process: bool = False, log: Path | None = None) -> None:
        """``own_process``: run the server in a child process (``python -m sluice.local.moto_server``),
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
        self._deployments: list[Deployment] = []
        self._code: Path | None = None  # deployment packages fetched back and extracted

    def __enter__(self) -> EmbeddedAws:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> EmbeddedAws:
        if self.own_process:
            self._start_child()
        else:
            self.endpoint = start_server()
            self._server = True
        # moto keeps its state per process, not per server: start from nothing.
        self._moto_api("reset")
        return self

    def _start_child(self) -> None:
        err = open(self.log, "a", encoding="utf-8") if self.log else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-m", "sluice.local.moto_server"],
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
            for deployment in self._deployments:
                deployment.close()  # the functions' containers, before the server they talk to
            self._deployments.clear()
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
                stop_server(self.endpoint)
                self._server = None
            self._clients.clear()
            if self._code is not None:
                shutil.rmtree(self._code, ignore_errors=True)
                self._code = None

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
        """Deploy what ``osls package`` wrote to ``package_dir``, as ``sls deploy`` does: over the
        stack ``stack_name`` when it exists (an upgrade), else into a new one."""
        cfn = self.client("cloudformation")
        create = json.loads((package_dir / CREATE_TEMPLATE).read_text())
        update = json.loads((package_dir / UPDATE_TEMPLATE).read_text())

        if self._stack_exists(stack_name):
            stack = cfn.describe_stacks(StackName=stack_name)["Stacks"][0]
        else:
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
        code = {key: self._fetch_code(bucket, key) for key in keys}
        deployment = Deployment(
            aws=self,
            stack_name=stack_name,
            outputs=_outputs(stack),
            functions=self._functions(resources, update, code),
            rules=self._rules(resources),
            unsupported=sorted(
                f"{logical} ({spec['Type']})"
                for logical, spec in update["Resources"].items()
                if logical not in resources and _created(spec, update)
            ),
        )
        self._deployments.append(deployment)
        return deployment

    def _stack_exists(self, stack_name: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            stacks = self.client("cloudformation").describe_stacks(StackName=stack_name)["Stacks"]
        except ClientError as error:
            if "does not exist" in str(error):
                return False
            raise
        return any(s["StackStatus"] != "DELETE_COMPLETE" for s in stacks)

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

    def _fetch_code(self, bucket: str, key: str) -> Path:
        """A deployment package as the bucket holds it, extracted: what Lambda unpacks to /var/task."""
        if self._code is None:
            self._code = Path(tempfile.mkdtemp(prefix="sluice-lambda-code-"))
        where = self._code / hashlib.sha256(f"{bucket}/{key}".encode()).hexdigest()[:16]
        if where.is_dir():
            return where
        archive = where.with_suffix(".zip")
        self.client("s3").download_file(bucket, key, str(archive))
        with zipfile.ZipFile(archive) as package:
            package.extractall(where)
        archive.unlink()
        return where

    def _functions(
        self, resources: dict[str, Any], template: dict[str, Any], code: Mapping[str, Path]
    ) -> dict[str, Function]:
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
                code=code.get(_code_key(template, logical)),
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


def _code_key(template: dict[str, Any], logical: str) -> str:
    """The S3 key of a function's deployment package, as its template resource names it."""
    return str(template["Resources"].get(logical, {}).get("Properties", {}).get("Code", {}).get("S3Key", ""))


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

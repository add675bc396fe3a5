"""The packaged stack, deployed into an embedded moto server, takes one payload end to end.

Packages with osls exactly as ``make package`` does (cfn-lint and checkov are ``make package``'s job),
deploys the generated templates as ``sls deploy`` does (sluice.local.embedded), then plays the
producer, EventBridge and Step Functions around the deployed launcher and completion functions.

moto gaps worked around (details in sluice.local.embedded):
  * no EventBridge rule fires: the test builds the scheduled event and the status-change event and
    ``Deployment.tick``/``deliver`` invoke the targets of the deployed rules (patterns matched by moto);
  * Lambda code does not run without Docker: the deployed functions run from the zip in the deployment
    bucket, in processes of their own (sluice.local.lambdas), with the environment
    GetFunctionConfiguration returns, plus AWS_ENDPOINT_URL for the server;
  * the table's TimeToLiveSpecification and PointInTimeRecoverySpecification are ignored: applied by
    API after the deploy;
  * the state machine CloudFormation creates never runs its states: the test ends the execution in
    moto's Step Functions backend, as tests/support/aws.Stack.finish does;
  * queue policies, the bucket policies and the CloudWatch alarms are not created at all;
  * of the payload bucket's settings only the encryption is applied (not the public access block or
    the lifecycle rule): the test reads the others from the packaged template.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import time
import uuid
import zipfile
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sluice.adapters.aws.s3 import S3PayloadObjects
from sluice.adapters.dynamo.store import DynamoStore
from sluice.core.events import WAKE_EVENT
from sluice.core.model import PayloadState
from sluice.core.names import execution_name
from sluice.enqueue import Item, enqueue
from sluice.local.embedded import ACCOUNT, UPDATE_TEMPLATE, EmbeddedAws
from tests.support.aws import status_change_event

pytestmark = [
    pytest.mark.deploy,
    # moto announces each resource type it cannot create (listed above); the test checks which.
    pytest.mark.filterwarnings("ignore:Tried to parse AWS::"),
]

STAGE = "test"
STACK = f"sluice-{STAGE}"
ROOT = Path(__file__).resolve().parents[2]
# What the handlers import at run time (the zip must hold them) and what only local tools use (it must not).
RUNTIME_FILES = {
    "handlers/__init__.py",
    "handlers/_shared.py",
    "handlers/launcher.py",
    "handlers/completion.py",
    "handlers/semaphore.py",
    *(
        f"lib/sluice/{name}.py"
        for name in (
            "__init__",
            "runtime",
            "launch/settings",
            "launch/launcher",
            "launch/completion",
            "launch/reconcile",
            "features/parking",
            "core/validation",
            "core/names",
            "core/model",
            "core/errors",
            "core/ports",
            "core/clock",
            "adapters/__init__",
            "adapters/dynamo/store",
            "adapters/dynamo/launch_slots",
            "adapters/dynamo/slots",
            "primitives/slots",
            "adapters/aws/sqs",
            "adapters/aws/sfn",
            "adapters/aws/ssm",
            "adapters/errors",
            "semaphore/step",
            "semaphore/model",
            "semaphore/service",
            "adapters/dynamo/semaphore",
            "adapters/aws/sfn_tokens",
            "features/pointers",
            "adapters/aws/s3",
        )
    ),
}
TOOLS_ONLY = (
    "lib/sluice/cli",
    "lib/sluice/ops",
    "lib/sluice/enqueue.py",
    "lib/sluice/local/",
    "lib/sluice/adapters/memory",
    "lib/sluice/concurrency.py",
    "lib/sluice/primitives/lease.py",
    "lib/sluice/adapters/dynamo/lease.py",
)
# Imports both handlers with nothing on sys.path but the extracted zip (its lib/ first, as the function's
# PYTHONPATH says) and this interpreter's standard library and site-packages: not the repository's lib/,
# which an editable install puts on the path through a .pth file.
IMPORT_FROM_ZIP = """
import json, os, sys, sysconfig
code = sys.argv[1]
roots = {sysconfig.get_path(n) for n in ("stdlib", "platstdlib", "purelib", "platlib")}
kept = [p for p in sys.path if any(p == r or p.startswith(r + os.sep) for r in roots) or p.endswith(".zip")]
sys.path[:] = [os.path.join(code, "lib"), code, *kept]
import handlers.launcher, handlers.completion, handlers.semaphore
try:
    import sluice.cli
    cli = "importable"
except ModuleNotFoundError:
    cli = "missing"
ours = {n: m.__file__ for n, m in sys.modules.items() if n.partition(".")[0] in ("sluice", "handlers")}
print(json.dumps({"modules": ours, "path": sys.path, "cli": cli}))
"""


@pytest.fixture(scope="session")
def package(packaged):
    return packaged(STAGE)


@pytest.fixture
def deployed(package):
    with EmbeddedAws() as aws:
        yield aws.deploy(package, STACK)


def test_deploy_creates_what_the_code_needs(deployed):
    out = deployed.outputs
    assert {"QueueUrl", "DlqUrl", "TableName", "StateMachineArn", "MaxConcurrencyParameter"} <= set(out)
    aws = deployed.aws
    assert set(deployed.functions) == {"launcher", "completion", "semaphore"}
    launcher = deployed.functions["launcher"]
    assert launcher.handler == "handlers/launcher.handler"
    # The environment names the deployed resources, not placeholders.
    env = launcher.environment
    assert env["SLUICE_QUEUE_URL"] == out["QueueUrl"]
    assert env["SLUICE_DLQ_URL"] == out["DlqUrl"]
    assert env["SLUICE_TABLE_NAME"] == out["TableName"]
    assert env["SLUICE_STATE_MACHINE_ARN"] == out["StateMachineArn"]
    assert env["SLUICE_MAX_PARAMETER"] == out["MaxConcurrencyParameter"]
    assert deployed.functions["completion"].environment == env

    attrs = aws.client("sqs").get_queue_attributes(QueueUrl=out["QueueUrl"], AttributeNames=["All"])[
        "Attributes"
    ]
    assert attrs["FifoQueue"] == "true"
    assert int(attrs["VisibilityTimeout"]) > launcher.timeout
    # High-throughput FIFO, the dead-letter queue too: quota and deduplication per message group.
    for url in (out["QueueUrl"], out["DlqUrl"]):
        mode = aws.client("sqs").get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert (mode["FifoThroughputLimit"], mode["DeduplicationScope"]) == (
            "perMessageGroupId",
            "messageGroup",
        )
    redrive = json.loads(attrs["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"].endswith(out["DlqUrl"].rsplit("/", 1)[1])
    sfn = aws.client("stepfunctions").describe_state_machine(stateMachineArn=out["StateMachineArn"])
    assert sfn["type"] == "STANDARD"
    maximum = aws.client("ssm").get_parameter(Name=out["MaxConcurrencyParameter"])["Parameter"]["Value"]
    assert maximum == env["SLUICE_MAX_CONCURRENCY"]
    ttl = aws.client("dynamodb").describe_time_to_live(TableName=out["TableName"])
    assert ttl["TimeToLiveDescription"] == {"TimeToLiveStatus": "ENABLED", "AttributeName": "expires_at"}
    # moto skips only the resource types it cannot create; everything else in the template exists.
    skipped = {entry.split("(")[1].rstrip(")") for entry in deployed.unsupported}
    assert skipped <= {"AWS::S3::BucketPolicy", "AWS::SQS::QueuePolicy", "AWS::CloudWatch::Alarm"}
    # One schedule rule for the launcher and one for the semaphore sweep.
    assert sorted(deployed.function_for(r.target_arns[0]) for r in deployed.schedule_rules()) == [
        "launcher",
        "semaphore",
    ]
    # A parked duplicate is sent back to the payload queue when its key's execution ends.
    for function in ("launcher", "completion"):
        requeue = _statement(deployed, function, "RequeueParked")
        assert requeue["Action"] == ["sqs:SendMessage"]
        assert _resources(requeue) == [f"arn:aws:sqs:us-east-1:{ACCOUNT}:{out['QueueUrl'].rsplit('/', 1)[1]}"]
    # Reconciliation may describe the executions of the state machine it drives, and no other.
    assert _may_describe(deployed, "launcher") == [
        f"arn:aws:states:us-east-1:{ACCOUNT}:execution:sluice-{STAGE}-workflow:*"
    ]


def test_the_zip_holds_the_handlers_and_what_they_import_and_no_tools(package):
    with zipfile.ZipFile(package / "sluice.zip") as z:
        names = set(z.namelist())
    ours = {n for n in names if n.startswith(("handlers/", "lib/"))}
    assert ours >= RUNTIME_FILES, sorted(RUNTIME_FILES - ours)
    assert [n for n in ours if n.startswith(TOOLS_ONLY)] == []
    assert [n for n in ours if n.endswith(".pyc") or "__pycache__" in n] == []
    # The Lambda runtime dependencies (requirements.txt) are at the zip's root.
    assert "aws_lambda_powertools/__init__.py" in names


def test_the_handlers_import_from_the_zip_alone(package, tmp_path):
    """A module the handlers need and the zip lacks fails here, as it would in Lambda."""
    with zipfile.ZipFile(package / "sluice.zip") as z:
        z.extractall(tmp_path)
    done = subprocess.run(
        [sys.executable, "-I", "-c", IMPORT_FROM_ZIP, str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert str(ROOT / "lib") not in seen["path"] and str(ROOT) not in seen["path"]
    modules = seen["modules"]
    assert {
        "handlers.launcher",
        "handlers.completion",
        "handlers.semaphore",
        "sluice.runtime",
        "sluice.launch.launcher",
    } <= set(modules)
    outside = {n: f for n, f in modules.items() if f is None or not f.startswith(str(tmp_path))}
    assert outside == {}
    # A tool left out of the zip is not importable there at all: the repository's copy is out of reach.
    assert seen["cli"] == "missing"


def test_the_drift_alarm_waits_for_three_ticks_of_drift(package):
    """moto does not create alarms: read the packaged template. With the 1-minute schedule, one
    period is one tick, and drift must stay above 0 for 3 periods in a row."""
    template = json.loads((package / UPDATE_TEMPLATE).read_text())
    alarm = template["Resources"]["LedgerDriftAlarm"]["Properties"]
    assert (alarm["Namespace"], alarm["MetricName"]) == ("Sluice", "LedgerDrift")
    assert alarm["Statistic"] == "Minimum" and alarm["Period"] == 60
    assert alarm["EvaluationPeriods"] == alarm["DatapointsToAlarm"] == 3
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (0, "GreaterThanThreshold")
    assert alarm["TreatMissingData"] == "notBreaching"


def test_the_functions_may_make_every_dynamodb_request_the_adapters_make(package):
    """Every request kind the functions' DynamoDB adapters send, in a transaction or not, is allowed."""
    # Every DynamoDB adapter but the semaphore function's and @exclusive's (user code) ones.
    others = {"semaphore.py", "lease.py", "semaphore_catalogue.py"}
    used = sorted(p for p in (ROOT / "lib/sluice/adapters/dynamo").glob("*.py") if p.name not in others)
    assert {p.name for p in used} >= {"store.py", "keys.py", "release.py", "awaits.py"}
    sources = "\n".join(p.read_text() for p in used)
    needed = {"dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:PutItem", "dynamodb:BatchGetItem"}
    if '"ConditionCheck"' in sources:
        needed.add("dynamodb:ConditionCheckItem")
    if "delete_item" in sources or '"Delete"' in sources:
        needed.add("dynamodb:DeleteItem")
    template = json.loads((package / UPDATE_TEMPLATE).read_text())
    for function in ("launcher", "completion"):
        roles = [
            r
            for r in template["Resources"].values()
            if r["Type"] == "AWS::IAM::Role" and function in json.dumps(r["Properties"].get("RoleName", ""))
        ]
        assert len(roles) == 1, function
        statements = [s for p in roles[0]["Properties"]["Policies"] for s in p["PolicyDocument"]["Statement"]]
        [ledger] = [s for s in statements if s.get("Sid") == "Ledger"]
        assert needed <= set(ledger["Action"]), (function, needed - set(ledger["Action"]))


def test_the_functions_run_on_arm64_and_the_launcher_lingers_at_128_mb_by_default(package):
    """The defaults docs/deploy.md prices: both functions on arm64 (the zip holds no compiled code,
    so nothing in it is built for one architecture), the launcher at 128 MB lingering 55 s, the
    completion function at 256 MB."""
    template = json.loads((package / UPDATE_TEMPLATE).read_text())
    functions = {
        logical: r["Properties"]
        for logical, r in template["Resources"].items()
        if r["Type"] == "AWS::Lambda::Function"
    }
    launcher, completion = functions["LauncherLambdaFunction"], functions["CompletionLambdaFunction"]
    assert launcher["Architectures"] == completion["Architectures"] == ["arm64"]
    # The launcher's size is launcherMemory's, not the provider's (which the completion function has).
    assert (launcher["MemorySize"], completion["MemorySize"]) == (128, 256)
    env = launcher["Environment"]["Variables"]
    assert env["SLUICE_LINGER_SECONDS"] == "55"
    # A tick keeps as many claims and starts in flight as the MAX in force leaves room for (at most
    # 30: auto), paced to the region's StartExecution quota (0).
    assert (env["SLUICE_START_CONCURRENCY"], env["SLUICE_START_RATE"], env["SLUICE_START_BURST"]) == (
        "auto",
        "0",
        "0",
    )
    assert (
        env["SLUICE_KEY_CONCURRENCY"]
        == completion["Environment"]["Variables"]["SLUICE_KEY_CONCURRENCY"]
        == "1"
    )
    # The linger ends before the launcher's 15 s time reserve does.
    assert launcher["Timeout"] - 15 >= 55
    with zipfile.ZipFile(package / "sluice.zip") as z:
        assert [n for n in z.namelist() if n.endswith((".so", ".pyd")) or ".so." in n] == []


def test_after_a_switch_reconciliation_may_describe_the_previous_machines_executions(packaged):
    """Reconciliation describes each holder by the ARN recorded with it: after stateMachineArn changes,
    the old machine's executions. previousStateMachineArn adds them to both roles; by default nothing."""
    previous = f"arn:aws:states:us-east-1:{ACCOUNT}:stateMachine:old-flow"
    package = packaged(STAGE, previousStateMachineArn=previous)
    with EmbeddedAws() as aws:
        deployed = aws.deploy(package, STACK)
        for function in ("launcher", "completion"):
            assert _may_describe(deployed, function) == [
                f"arn:aws:states:us-east-1:{ACCOUNT}:execution:sluice-{STAGE}-workflow:*",
                f"arn:aws:states:us-east-1:{ACCOUNT}:execution:old-flow:*",
            ]


LANES = "gpu:2:1,backfill:8:0:3,default:10"
LANE_QUEUES = {"gpu": "LaneGpuQueue", "backfill": "LaneBackfillQueue"}


@pytest.fixture(scope="session")
def lanes_package(packaged):
    return packaged(STAGE, lanes=LANES)


def _policy_statements(resources: dict) -> dict[tuple[str, str], dict]:
    """Every statement of the functions' roles and of the managed policies, by (resource, Sid)."""
    found = {}
    for logical, resource in resources.items():
        if resource["Type"] == "AWS::IAM::Role":
            documents = [p["PolicyDocument"] for p in resource["Properties"].get("Policies", [])]
        elif resource["Type"] == "AWS::IAM::ManagedPolicy":
            documents = [resource["Properties"]["PolicyDocument"]]
        else:
            continue
        for document in documents:
            for statement in document["Statement"]:
                found[(logical, statement.get("Sid", ""))] = statement
    return found


def _listed(value) -> list:
    return value if isinstance(value, list) else [value]


RENDER = f"arn:aws:states:us-east-1:{ACCOUNT}:stateMachine:render"


def test_a_lanes_own_state_machine_is_started_listed_described_and_routed(packaged):
    """laneStateMachines=gpu=<render>: the functions learn it (SLUICE_LANE_STATE_MACHINES), both roles
    may start, list and describe it and its executions, and the completion rule takes its ends
    beside the stack's workflow's. Deployed on the embedded AWS."""
    package = packaged(STAGE, lanes="gpu:2:1", laneStateMachines=f"gpu={RENDER}")
    template = json.loads((package / UPDATE_TEMPLATE).read_text())
    resources = template["Resources"]
    functions = [r for r in resources.values() if r["Type"] == "AWS::Lambda::Function"]
    for function in functions:
        assert (
            function["Properties"]["Environment"]["Variables"]["SLUICE_LANE_STATE_MACHINES"]
            == f"gpu={RENDER}"
        )
    rules = [
        r
        for r in resources.values()
        if r["Type"] == "AWS::Events::Rule" and "EventPattern" in r["Properties"]
    ]
    routed = [
        r["Properties"]["EventPattern"]["detail"]["stateMachineArn"]
        for r in rules
        if "SUCCEEDED" in json.dumps(r["Properties"]["EventPattern"]) and RENDER in json.dumps(r)
    ]
    assert len(routed) == 1 and routed[0][1:] == [RENDER] and "Fn::If" in routed[0][0]
    with EmbeddedAws() as aws:
        deployed = aws.deploy(package, STACK)
        for function in ("launcher", "completion"):
            statement = _statement(deployed, function, "DriveLaneStateMachines")
            assert _resources(statement) == [RENDER, f"arn:aws:states:us-east-1:{ACCOUNT}:execution:render:*"]
            assert (
                "states:StartExecution" in statement["Action"]
                and "states:DescribeExecution" in statement["Action"]
            )


def test_each_lane_has_a_queue_like_the_payload_queue_with_its_grants_outputs_and_alarm(lanes_package):
    """lanes=gpu:2:1,backfill:8:0:3,default:10: a queue for gpu and one for backfill, made like the
    payload queue (the lane default), with everything the payload queue has: the TLS-only policy, the
    grants of every role and policy that has it, the alarm; the functions learn them from SLUICE_LANES
    and SLUICE_LANE_QUEUES."""
    template = json.loads((lanes_package / UPDATE_TEMPLATE).read_text())
    resources, outputs = template["Resources"], template["Outputs"]
    payload = resources["PayloadQueue"]["Properties"]
    assert payload["RedrivePolicy"]["deadLetterTargetArn"] == {"Fn::GetAtt": ["DeadLetterQueue", "Arn"]}
    for name, logical in LANE_QUEUES.items():
        assert resources[logical]["Type"] == "AWS::SQS::Queue"
        assert resources[logical]["Properties"] == {**payload, "QueueName": f"{STACK}-lane-{name}.fifo"}
    assert not [r for r in resources if r.startswith("LaneDefault")]

    tls = resources["QueueTlsOnlyPolicy"]["Properties"]
    queues = ["PayloadQueue", "DeadLetterQueue", *LANE_QUEUES.values()]
    assert tls["Queues"] == [{"Ref": q} for q in queues]
    [deny] = tls["PolicyDocument"]["Statement"]
    assert deny["Resource"] == [{"Fn::GetAtt": [q, "Arn"]} for q in queues]

    # Whatever any role or managed policy may do on the payload queue, it may do on every lane's.
    lane_arns = [{"Fn::GetAtt": [q, "Arn"]} for q in LANE_QUEUES.values()]
    on_payload = {
        where: statement
        for where, statement in _policy_statements(resources).items()
        if {"Fn::GetAtt": ["PayloadQueue", "Arn"]} in _listed(statement["Resource"])
    }
    assert set(on_payload) == {
        ("LauncherIamRoleLambdaExecution", "ReadPayloadQueue"),
        ("LauncherIamRoleLambdaExecution", "RequeueParked"),
        ("CompletionIamRoleLambdaExecution", "ReadPayloadQueue"),
        ("CompletionIamRoleLambdaExecution", "RequeueParked"),
        ("ProducerPolicy", "EnqueuePayloads"),
    }
    for where, statement in on_payload.items():
        assert _listed(statement["Resource"])[1:] == lane_arns, where
    # Every function's environment: the lanes as given, and each other lane's queue URL.
    lane_queues = {
        "Fn::Join": ["", ["gpu=", {"Ref": "LaneGpuQueue"}, ",backfill=", {"Ref": "LaneBackfillQueue"}]]
    }
    functions = [r for r in resources.values() if r["Type"] == "AWS::Lambda::Function"]
    assert len(functions) == 3
    for function in functions:
        env = function["Properties"]["Environment"]["Variables"]
        assert env["SLUICE_QUEUE_URL"] == {"Ref": "PayloadQueue"}
        assert (env["SLUICE_LANES"], env["SLUICE_LANE_QUEUES"]) == (LANES, lane_queues)

    assert outputs["QueueUrl"]["Value"] == {"Ref": "PayloadQueue"}
    for name, logical in LANE_QUEUES.items():
        assert outputs[f"{logical}Url"] == {
            "Description": f"Send payloads of lane {name} here",
            "Value": {"Ref": logical},
        }
    assert outputs["LaneQueueUrls"]["Value"] == lane_queues

    # The payload queue's oldest-message alarm, for each lane's queue: same threshold and actions.
    oldest = resources["OldestMessageAlarm"]["Properties"]
    for name, logical in LANE_QUEUES.items():
        alarm = resources[f"{logical.removesuffix('Queue')}OldestMessageAlarm"]["Properties"]
        assert alarm == {
            **oldest,
            "AlarmName": f"{STACK}-lane-{name}-oldest-message-age",
            "AlarmDescription": f"The oldest queued payload of lane {name} has waited longer than "
            "oldestMessageAlarmSeconds",
            "Dimensions": [{"Name": "QueueName", "Value": {"Fn::GetAtt": [logical, "QueueName"]}}],
        }

    # The dashboard: each lane's queue depth and oldest message, and Sluice's own metrics.
    dashboard = resources["Dashboard"]["Properties"]
    assert dashboard["DashboardName"] == STACK
    pieces = dashboard["DashboardBody"]["Fn::Join"][1]
    body = json.loads(
        "".join(
            p if isinstance(p, str) else p.get("Ref") or p["Fn::GetAtt"][0] + ".QueueName" for p in pieces
        )
    )
    lines = {
        w["properties"]["title"]: [tuple(m[:4]) for m in w["properties"]["metrics"]] for w in body["widgets"]
    }
    assert {w["properties"]["region"] for w in body["widgets"]} == {"AWS::Region"}
    for metric, title in (
        ("ApproximateNumberOfMessagesVisible", "Queued payloads per lane"),
        ("ApproximateAgeOfOldestMessage", "Oldest queued payload per lane (s)"),
    ):
        assert lines[title] == [
            ("AWS/SQS", metric, "QueueName", f"{q}.QueueName")
            for q in ("LaneGpuQueue", "LaneBackfillQueue", "PayloadQueue")
        ]
    sluice = {m[1] for title in lines for m in lines[title] if m[0] == "Sluice"}
    assert sluice == {
        "Running",
        "Max",
        "FreeSlots",
        "Started",
        "Released",
        "Duplicates",
        "Invalid",
        "LedgerDrift",
        "LaneRunning",
        "LaneMax",
        "LaneStarted",
    }
    assert {m[3] for title in lines for m in lines[title] if m[0] == "Sluice"} == {STACK}
    # Each lane's running against its MAX, and its starts: the metrics with the dimension lane.
    per_lane = {
        title: [tuple(m[:6]) for m in w["properties"]["metrics"]]
        for w in body["widgets"]
        for title in [w["properties"]["title"]]
        if title in ("Running vs MAX per lane", "Starts per lane")
    }
    lanes = ("gpu", "backfill", "default")
    assert per_lane["Running vs MAX per lane"] == [
        ("Sluice", metric, "service", STACK, "lane", lane)
        for lane in lanes
        for metric in ("LaneRunning", "LaneMax")
    ]
    assert per_lane["Starts per lane"] == [
        ("Sluice", "LaneStarted", "service", STACK, "lane", lane) for lane in lanes
    ]

    # Deployed: the lanes' queues exist, dead-letter to the DLQ, and the outputs are their URLs.
    with EmbeddedAws() as aws:
        deployed = aws.deploy(lanes_package, STACK)
        out, sqs = deployed.outputs, aws.client("sqs")
        urls = {name: out[f"{logical}Url"] for name, logical in LANE_QUEUES.items()}
        for name, url in urls.items():
            found = sqs.get_queue_url(QueueName=f"{STACK}-lane-{name}.fifo")["QueueUrl"]
            # moto answers with its own endpoint; CloudFormation with the canonical URL.
            assert url.endswith(f"/{ACCOUNT}/{STACK}-lane-{name}.fifo")
            assert found.rsplit("/", 2)[1:] == url.rsplit("/", 2)[1:]
        assert out["LaneQueueUrls"] == f"gpu={urls['gpu']},backfill={urls['backfill']}"
        for url in urls.values():
            attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
            assert attrs["FifoQueue"] == "true" and attrs["VisibilityTimeout"] == "180"
            redrive = json.loads(attrs["RedrivePolicy"])
            assert redrive == {
                "deadLetterTargetArn": f"arn:aws:sqs:us-east-1:{ACCOUNT}:{STACK}-payloads-dlq.fifo",
                "maxReceiveCount": 10,
            }
        for function in ("launcher", "completion", "semaphore"):
            env = deployed.functions[function].environment
            assert (env["SLUICE_LANES"], env["SLUICE_LANE_QUEUES"]) == (LANES, out["LaneQueueUrls"])
        arns = [
            f"arn:aws:sqs:us-east-1:{ACCOUNT}:{STACK}-{q}.fifo"
            for q in ("payloads", "lane-gpu", "lane-backfill")
        ]
        for function in ("launcher", "completion"):
            assert _resources(_statement(deployed, function, "ReadPayloadQueue")) == arns
            assert _resources(_statement(deployed, function, "RequeueParked")) == arns


def test_without_lanes_the_stack_has_only_the_payload_queue(package):
    """No lanes parameter: no lane queue, alarm, output or lane environment variable (the dashboard
    is there all the same: tests/deploy/test_alarms.py)."""
    template = json.loads((package / UPDATE_TEMPLATE).read_text())
    resources, outputs = template["Resources"], template["Outputs"]
    assert [r for r in resources if r.startswith("Lane")] == []
    assert [o for o in outputs if o.startswith("Lane")] == []
    assert [r["Type"] for r in resources.values()].count("AWS::SQS::Queue") == 2
    assert resources["QueueTlsOnlyPolicy"]["Properties"]["Queues"] == [
        {"Ref": "PayloadQueue"},
        {"Ref": "DeadLetterQueue"},
    ]
    for resource in resources.values():
        if resource["Type"] == "AWS::Lambda::Function":
            env = resource["Properties"]["Environment"]["Variables"]
            assert not [v for v in env if v.startswith("SLUICE_LANE")]
    for statement in _policy_statements(resources).values():
        if "PayloadQueue" in json.dumps(statement["Resource"]):
            assert statement["Resource"] == {"Fn::GetAtt": ["PayloadQueue", "Arn"]}


def _may_describe(deployed, function: str) -> list[str]:
    """The resources of the function role's ReconcileExecutions statement, as deployed."""
    return _resources(_statement(deployed, function, "ReconcileExecutions"))


def _statement(deployed, function: str, sid: str) -> dict:
    """One statement of the function role's policy, as deployed."""
    aws = deployed.aws
    config = aws.client("lambda").get_function_configuration(FunctionName=deployed.functions[function].name)
    role = config["Role"].rsplit("/", 1)[1]
    iam = aws.client("iam")
    [name] = iam.list_role_policies(RoleName=role)["PolicyNames"]
    document = iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"]
    if isinstance(document, str):  # moto hands back a CloudFormation-made inline policy as a repr
        document = ast.literal_eval(document)
    [statement] = [s for s in document["Statement"] if s.get("Sid") == sid]
    return statement


def _resources(statement: dict) -> list[str]:
    resources = statement["Resource"]
    resources = [resources] if isinstance(resources, str) else resources
    # moto leaves an AWS::NoValue list item as None; CloudFormation drops it.
    return [r for r in resources if r is not None]


def test_one_payload_through_the_deployed_stack(deployed):
    aws, out = deployed.aws, deployed.outputs
    sqs, sfn = aws.client("sqs"), aws.client("stepfunctions")
    store = DynamoStore(aws.client("dynamodb"), out["TableName"])

    # A producer with nothing but boto3 and the queue URL (no sluice-key attribute).
    body = json.dumps({"id": "order-1001", "amount": 42})
    message_id = sqs.send_message(
        QueueUrl=out["QueueUrl"],
        MessageBody=body,
        MessageGroupId="customer-7",
        MessageDeduplicationId=uuid.uuid4().hex,
    )["MessageId"]
    name = execution_name("order-1001", message_id)
    # MAX 1 at run time, as `sluice set-max 1` does: the one start fills the slots, so the tick ends
    # at once instead of lingering its 55 s (the next test lingers).
    _set_max(deployed, 1)

    # EventBridge's schedule fires: the deployed launcher runs with its deployed environment.
    [(function, summary)] = deployed.tick("launcher")
    assert function == "launcher"
    assert summary["started"] == 1 and summary["running"] == 1

    executions = sfn.list_executions(stateMachineArn=out["StateMachineArn"])["executions"]
    assert [(e["name"], e["status"]) for e in executions] == [(name, "RUNNING")]
    described = sfn.describe_execution(executionArn=executions[0]["executionArn"])
    assert json.loads(described["input"]) == {"id": "order-1001", "amount": 42}
    assert store.ledger().holders == {name}
    assert store.payload("order-1001").holder == name
    assert store.execution(name).state is PayloadState.CLAIMED  # its lease held; started
    assert _depth(sqs, out["QueueUrl"]) == 0

    # Step Functions finishes it (the CloudFormation-created machine never runs its states in moto).
    _finish(out["StateMachineArn"], name)
    event = status_change_event(out["StateMachineArn"], name, "SUCCEEDED")
    [(function, result)] = deployed.deliver(event)
    assert function == "completion"
    assert result["released"] is True

    assert store.ledger().holders == frozenset()
    record = store.payload("order-1001")
    assert record.holder is None and record.state is PayloadState.SUCCEEDED
    execution = store.execution(name)
    assert execution.state is PayloadState.SUCCEEDED and execution.ended_at is not None

    # EventBridge may deliver the same event again: nothing more is released.
    [(_, again)] = deployed.deliver(event)
    assert again["released"] is False
    assert store.ledger().holders == frozenset()
    # An event for another state machine matches no deployed rule.
    other = out["StateMachineArn"].rsplit(":", 1)[0] + ":someone-else"
    assert deployed.deliver(status_change_event(other, name, "SUCCEEDED")) == []


def test_the_deployed_launcher_lingers_and_starts_a_payload_sent_between_ticks_at_once(deployed):
    """As deployed (lingerSeconds 55), a tick that finds the queue empty keeps long-polling while slots
    are free: payloads sent seconds later start at once, in that same invocation. Without the linger
    the tick would have returned, and they would wait for the next one (up to a minute)."""
    aws, out = deployed.aws, deployed.outputs
    sqs, sfn = aws.client("sqs"), aws.client("stepfunctions")
    _set_max(deployed, 2)  # the second start fills the slots and ends the tick

    def send(key: str) -> tuple[str, float]:
        sent = time.time()
        message_id = sqs.send_message(
            QueueUrl=out["QueueUrl"],
            MessageBody=json.dumps({"id": key}),
            MessageGroupId=key,
            MessageDeduplicationId=uuid.uuid4().hex,
        )["MessageId"]
        return execution_name(key, message_id), sent

    def started_at(name: str, within: float) -> float:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            for e in sfn.list_executions(stateMachineArn=out["StateMachineArn"])["executions"]:
                if e["name"] == name:
                    return e["startDate"].timestamp()
            time.sleep(0.1)
        raise AssertionError(f"{name} did not start within {within} s")

    with ThreadPoolExecutor(max_workers=1) as pool:
        tick = pool.submit(deployed.tick, "launcher")
        # Longer than a tick that does not linger takes to find the queue empty and return.
        time.sleep(6)
        assert not tick.done(), tick.result()
        first, first_sent = send("between-ticks-1")
        assert started_at(first, 10) - first_sent < 5
        time.sleep(3)
        second, second_sent = send("between-ticks-2")
        assert started_at(second, 10) - second_sent < 5
        [(function, summary)] = tick.result(timeout=60)
    # One invocation started both: it was still polling after the first.
    assert function == "launcher"
    assert summary["started"] == 2 and summary["running"] == 2


def test_a_producer_may_wake_the_deployed_launcher_which_starts_at_once_without_lingering(deployed):
    """The output LauncherFunctionArn names the launcher, the producer policy may invoke it and nothing
    else, and the deployed launcher woken as `sluice enqueue` wakes it (lingerSeconds 55, slots free)
    starts the payload and returns instead of long-polling for 55 s, without reconciling."""
    aws, out = deployed.aws, deployed.outputs
    launcher = deployed.functions["launcher"]
    assert out["LauncherFunctionArn"] == launcher.arn
    iam = aws.client("iam")
    policy = iam.get_policy(PolicyArn=out["ProducerPolicyArn"])["Policy"]
    document = iam.get_policy_version(PolicyArn=policy["Arn"], VersionId=policy["DefaultVersionId"])
    statements = document["PolicyVersion"]["Document"]["Statement"]
    invoking = [s for s in statements if "lambda:InvokeFunction" in _listed(s["Action"])]
    assert [(s["Sid"], _resources(s)) for s in invoking] == [("WakeLauncher", [launcher.arn])]
    sqs = aws.client("sqs")
    message_id = sqs.send_message(
        QueueUrl=out["QueueUrl"],
        MessageBody=json.dumps({"id": "woken-1"}),
        MessageGroupId="woken-1",
        MessageDeduplicationId=uuid.uuid4().hex,
    )["MessageId"]

    began = time.monotonic()
    summary = deployed.invoke("launcher", WAKE_EVENT)

    assert time.monotonic() - began < 30  # a lingering tick would poll until 55 s
    assert summary["started"] == 1 and summary["reconciled"] is False
    executions = aws.client("stepfunctions").list_executions(stateMachineArn=out["StateMachineArn"])
    assert [e["name"] for e in executions["executions"]] == [execution_name("woken-1", message_id)]


def _set_max(deployed, value: int) -> None:
    ssm = deployed.aws.client("ssm")
    ssm.put_parameter(Name=deployed.outputs["MaxConcurrencyParameter"], Value=str(value), Overwrite=True)


def test_an_update_in_place_keeps_the_slots_the_previous_version_held(deployed):
    """The previous version kept every slot in LEDGER.holders. Its table, with two of its executions
    running, is taken over by this version (same table, new code): the old holders count against
    MAX, their ends release them, and MAX is never passed."""
    aws, out = deployed.aws, deployed.outputs
    sqs, sfn, ddb, ssm = (aws.client(s) for s in ("sqs", "stepfunctions", "dynamodb", "ssm"))
    ssm.put_parameter(Name=out["MaxConcurrencyParameter"], Value="3", Overwrite=True)
    old = []
    for key in ("old-1", "old-2"):  # what the previous version wrote for a running execution
        name = execution_name(key, f"message-{key}")
        sfn.start_execution(stateMachineArn=out["StateMachineArn"], name=name, input=json.dumps({"id": key}))
        ddb.update_item(
            TableName=out["TableName"],
            Key={"pk": {"S": "LEDGER"}},
            UpdateExpression="ADD holders :n",
            ExpressionAttributeValues={":n": {"SS": [name]}},
        )
        ddb.put_item(
            TableName=out["TableName"],
            Item={
                "pk": {"S": f"PAYLOAD#{key}"},
                "key": {"S": key},
                "state": {"S": "RUNNING"},
                "holder": {"S": name},
                "executions": {"L": [{"S": name}]},
            },
        )
        ddb.put_item(
            TableName=out["TableName"],
            Item={
                "pk": {"S": f"EXEC#{name}"},
                "name": {"S": name},
                "key": {"S": key},
                "message_id": {"S": f"message-{key}"},
                "state": {"S": "RUNNING"},
                "claimed_at": {"N": "1"},
                "claim_expires_at": {"N": "901"},
                "started_at": {"N": "2"},
            },
        )
        old.append(name)
    for i in range(3):
        sqs.send_message(
            QueueUrl=out["QueueUrl"],
            MessageBody=json.dumps({"id": f"new-{i}"}),
            MessageGroupId=f"g{i}",
            MessageDeduplicationId=uuid.uuid4().hex,
        )

    def running() -> list[str]:
        pages = sfn.list_executions(stateMachineArn=out["StateMachineArn"], statusFilter="RUNNING")
        return [e["name"] for e in pages["executions"]]

    [(_, summary)] = deployed.tick("launcher")
    assert summary["started"] == 1 and len(running()) == 3  # 2 old + 1 new = MAX 3
    store = DynamoStore(ddb, out["TableName"])
    assert set(old) <= store.ledger().holders and len(store.ledger().holders) == 3

    _finish(out["StateMachineArn"], old[0])
    [(function, result)] = deployed.deliver(status_change_event(out["StateMachineArn"], old[0], "SUCCEEDED"))
    assert function == "completion" and result["released"] is True
    legacy = ddb.get_item(TableName=out["TableName"], Key={"pk": {"S": "LEDGER"}})["Item"]
    assert legacy["holders"]["SS"] == [old[1]]  # released from where the previous version put it
    # A legacy slot comes back to the caps at the next tick (a completion moves no caps).
    assert len(running()) == 2 and store.ledger().in_force == 2
    [(_, summary)] = deployed.tick("launcher")
    assert summary["started"] == 1 and len(running()) == 3  # and no more
    ledger = store.ledger()
    assert old[0] not in ledger.holders and old[1] in ledger.holders and len(ledger.holders) == 3
    assert _depth(sqs, out["QueueUrl"]) == 1


def test_a_large_payload_is_stored_in_the_private_bucket_and_runs_from_its_pointer(package, deployed):
    """The payload bucket: SSE-S3, no public access, objects expire (payloadExpiryDays, 30); its
    policy denies plain HTTP and other encryption. moto's CloudFormation applies the encryption but
    not the public access block, the lifecycle rule or the bucket policy: those are read from the
    packaged template. The functions may read it, producers write it, and the sample workflow
    read it. A 600 KiB payload enqueued with `sluice enqueue`'s code runs from its pointer."""
    aws, out = deployed.aws, deployed.outputs
    s3, sfn = aws.client("s3"), aws.client("stepfunctions")
    bucket = out["PayloadBucketName"]
    assert deployed.functions["launcher"].environment["SLUICE_PAYLOAD_BUCKET"] == bucket
    [rule] = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"]
    assert rule["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    arn = f"arn:aws:s3:::{bucket}"
    for function in ("launcher", "completion"):
        assert _statement(deployed, function, "ReadStoredPayloads")["Action"] == ["s3:GetObject"]
        assert _resources(_statement(deployed, function, "ReadStoredPayloads")) == [f"{arn}/*"]
        assert _resources(_statement(deployed, function, "ListStoredPayloads")) == [arn]

    template = json.loads((package / UPDATE_TEMPLATE).read_text())["Resources"]
    properties = template["PayloadBucket"]["Properties"]
    assert properties["PublicAccessBlockConfiguration"] == dict.fromkeys(
        ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"), True
    )
    [expiry] = properties["LifecycleConfiguration"]["Rules"]
    assert (expiry["Status"], expiry["ExpirationInDays"]) == ("Enabled", 30)
    policy = template["PayloadBucketPolicy"]["Properties"]
    assert policy["Bucket"] == {"Ref": "PayloadBucket"}
    statements = {s["Sid"]: s for s in policy["PolicyDocument"]["Statement"]}
    tls = statements["DenyInsecureTransport"]
    assert (tls["Effect"], tls["Principal"], tls["Action"]) == ("Deny", "*", "s3:*")
    assert tls["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert tls["Resource"] == [
        {"Fn::GetAtt": ["PayloadBucket", "Arn"]},
        {"Fn::Sub": "${PayloadBucket.Arn}/*"},
    ]
    sse = statements["DenyOtherEncryption"]
    assert (sse["Effect"], sse["Action"]) == ("Deny", "s3:PutObject")
    assert sse["Condition"] == {"StringNotEqualsIfExists": {"s3:x-amz-server-side-encryption": "AES256"}}
    assert template["PayloadBucket"]["DeletionPolicy"] == "Retain"
    workflow = template["WorkflowStateMachineRole"]["Properties"]["Policies"][0]["PolicyDocument"]
    assert workflow["Statement"] == [
        {
            "Sid": "ReadStoredPayloads",
            "Effect": "Allow",
            "Action": ["s3:GetObject"],
            "Resource": {"Fn::Sub": "${PayloadBucket.Arn}/*"},
        }
    ]
    producer = template["ProducerPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    [store] = [s for s in producer if s["Sid"] == "StorePayloads"]
    assert (store["Action"], store["Resource"]) == (["s3:PutObject"], {"Fn::Sub": "${PayloadBucket.Arn}/*"})

    big = {"id": "scene-600k", "manifest": "m" * 600 * 1024}
    report = enqueue(
        aws.client("sqs"),
        out["QueueUrl"],
        [Item("line 1", json.dumps(big))],
        payloads=S3PayloadObjects(s3, bucket),
    )
    [(_, key, message_id)] = report.sent
    uri = report.stored["line 1"]
    stored = s3.head_object(Bucket=bucket, Key=uri.split("/", 3)[3], ChecksumMode="ENABLED")
    assert stored["ServerSideEncryption"] == "AES256" and stored["ContentLength"] == len(json.dumps(big))
    _set_max(deployed, 1)
    [(_, summary)] = deployed.tick("launcher")
    assert summary["started"] == 1 and summary["invalid"] == 0
    [execution] = sfn.list_executions(stateMachineArn=out["StateMachineArn"])["executions"]
    assert execution["name"] == execution_name("scene-600k", message_id)
    pointer = json.loads(sfn.describe_execution(executionArn=execution["executionArn"])["input"])
    assert pointer["sluicePayload"]["uri"] == uri and pointer["id"] == key == "scene-600k"


def _depth(sqs, url: str) -> int:
    attrs = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return sum(int(v) for v in attrs.values())


def _finish(state_machine_arn: str, name: str) -> None:
    from moto.stepfunctions.models import stepfunctions_backends

    account, region = state_machine_arn.split(":")[4], state_machine_arn.split(":")[3]
    arn = state_machine_arn.replace(":stateMachine:", ":execution:") + f":{name}"
    execution = stepfunctions_backends[account][region].describe_execution(arn)
    execution.status = "SUCCEEDED"
    execution.stop_date = datetime.now(UTC)

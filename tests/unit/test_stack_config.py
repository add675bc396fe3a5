"""The stack's parameter checks (stack/config.js) and region (stack/region.js), run with node as osls
runs them, without packaging: each case is a line of the parameters osls would resolve, answered by
one `node` process kept for the module (``NodeCases``), a fresh call of the exported function each."""

from __future__ import annotations

import atexit
import json
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed (osls needs it too)")

# Each line of standard input is a case: {"kind": "derive" | "region", "module": path, "input": ...}.
# "derive" calls the exported function as osls' file source does, with a resolveVariable that answers
# sls:stage, self:provider.region and param:NAME from the case's input; "region" calls resolveRegion.
CASES = """
const readline = require('readline');
const answer = (value) => process.stdout.write(JSON.stringify(value) + '\\n');
// A fresh copy of the module for each case: config.js keeps its answer for the process, as osls asks
// for it many times.
const fresh = (module) => {
  delete require.cache[require.resolve(module)];
  return require(module);
};
const derive = (module, input) => {
  const resolveVariable = async (name) => {
    if (name === 'sls:stage') return input.stage;
    if (name === 'self:provider.region') return input.region;
    if (name === 'self:service') return 'sluice';
    if (name.startsWith('param:')) return input.params[name.slice(6)];
    throw new Error(`unexpected variable ${name}`);
  };
  return fresh(module)({ resolveVariable }).then(
    (cfg) => ({ cfg }),
    (error) => ({ error: error.message }),
  );
};
const region = async (module, input) => fresh(module).resolveRegion(input.env, input.options, input.stage);
const lines = readline.createInterface({ input: process.stdin });
lines.on('line', (line) => {
  const { kind, module, input } = JSON.parse(line);
  (kind === 'derive' ? derive : region)(module, input).then(answer, (error) => answer({ crash: String(error) }));
});
"""


class NodeCases:
    """One node process answering the module's cases in turn (a process per case costs ~80 ms)."""

    def __init__(self) -> None:
        assert NODE is not None
        self.node = subprocess.Popen(
            [NODE, "-e", CASES], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        atexit.register(self.close)

    def close(self) -> None:
        assert self.node.stdin is not None and self.node.stdout is not None
        self.node.stdin.close()  # node's lines end: it exits
        self.node.wait(timeout=30)
        self.node.stdout.close()

    def ask(self, kind: str, module: str, payload: dict[str, Any]) -> Any:
        assert self.node.stdin is not None and self.node.stdout is not None
        case = {"kind": kind, "module": str(ROOT / "stack" / module), "input": payload}
        self.node.stdin.write(json.dumps(case) + "\n")
        line = self.node.stdout.readline()
        assert line, f"node exited ({self.node.poll()}) on {case}"
        answer = json.loads(line)
        assert not (isinstance(answer, dict) and "crash" in answer), answer
        return answer


@cache
def _cases() -> NodeCases:
    return NodeCases()


def _node(kind: str, module: str, payload: dict[str, Any]) -> Any:
    return _cases().ask(kind, module, payload)


class _IgnoreTags(yaml.SafeLoader):
    """serverless.yml's CloudFormation tags (!Ref, !Sub ...) are not needed to read its params."""


_IgnoreTags.add_multi_constructor("!", lambda loader, suffix, node: None)


@cache
def _defaults() -> dict[str, str]:
    doc = yaml.load((ROOT / "serverless.yml").read_text(encoding="utf-8"), Loader=_IgnoreTags)
    return {k: "" if v is None else str(v) for k, v in doc["params"]["default"].items()}


def derive(**params: Any) -> dict[str, Any]:
    """stack/config.js with serverless.yml's defaults, overridden as --param="name=value" would."""
    merged = {**_defaults(), **{k: str(v) for k, v in params.items()}}
    return _node("derive", "config.js", {"stage": "dev", "region": "us-east-1", "params": merged})


def config(**params: Any) -> dict[str, Any]:
    result = derive(**params)
    assert "error" not in result, result["error"]
    return result["cfg"]


def refusal(**params: Any) -> str:
    result = derive(**params)
    assert "cfg" not in result, f"accepted {params}"
    return result["error"]


def test_the_defaults_package():
    cfg = config()
    assert cfg["launcherTimeout"] == 120 and cfg["visibilityTimeout"] == 180
    # The scheduled launcher lingers by default, at the smallest memory size (docs/deploy.md).
    assert cfg["lingerSeconds"] == 55 and cfg["text"]["lingerSeconds"] == "55"
    assert cfg["launcherMemory"] == 128
    # The default linger fits the default launcher timeout less the launcher's 15 s time reserve.
    assert cfg["lingerSeconds"] <= cfg["launcherTimeout"] - 15


@pytest.mark.parametrize("value", [128, 1769, 10240])
def test_the_launcher_memory_takes_lambdas_sizes(value):
    assert config(launcherMemory=value)["launcherMemory"] == value


@pytest.mark.parametrize("value", [0, 127, 10241])
def test_a_launcher_memory_outside_lambdas_sizes_is_refused(value):
    message = refusal(launcherMemory=value)
    assert f"launcherMemory must be between 128 and 10240, got {value}: Lambda's limits, in MB" in message


def test_a_launcher_memory_must_be_a_whole_number():
    assert 'launcherMemory must be a whole number, got "256MB"' in refusal(launcherMemory="256MB")


# -- launcherTimeout and lingerSeconds ----------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 10, 12, 14, 15, 29])
def test_a_launcher_timeout_too_short_to_work_is_refused_with_the_real_rule(value):
    message = refusal(launcherTimeout=value)
    assert f"launcherTimeout must be between 30 and 900, got {value}" in message
    assert "stops receiving 15 s before its timeout (SLUICE_TIME_RESERVE_SECONDS)" in message
    assert "lingerSeconds" not in message


def test_the_shortest_launcher_timeout_packages():
    """The visibility timeout covers the completion's hand-over (60 s) too: 60 + 60, not 30 + 60."""
    cfg = config(launcherTimeout=30, lingerSeconds=15)
    assert cfg["launcherTimeout"] == 30 and cfg["visibilityTimeout"] == 120


def test_a_short_launcher_timeout_with_the_default_linger_says_which_to_change():
    message = refusal(launcherTimeout=69)
    assert "lingerSeconds must be between 0 and 54, got 55" in message
    assert "lower lingerSeconds (55 by default) or raise launcherTimeout" in message
    assert config(launcherTimeout=70)["lingerSeconds"] == 55


def test_a_launcher_timeout_over_lambdas_limit_is_refused():
    assert "launcherTimeout must be between 30 and 900, got 901" in refusal(launcherTimeout=901)


def test_linger_seconds_is_bounded_by_the_launcher_timeout_less_the_reserve():
    assert config(launcherTimeout=120, lingerSeconds=105)["lingerSeconds"] == 105
    message = refusal(launcherTimeout=120, lingerSeconds=106)
    assert "lingerSeconds must be between 0 and 105, got 106" in message
    assert "launcherTimeout 120 s less the launcher's 15 s time reserve" in message
    assert "lingerSeconds must be between 0 and 15, got 16" in refusal(launcherTimeout=30, lingerSeconds=16)


def test_the_timeout_order_is_still_checked():
    assert "claimTimeout (900 s) must exceed the queue visibility timeout (960 s" in refusal(
        launcherTimeout=900
    )


# -- previousStateMachineArn ---------------------------------------------------------------------------


def test_previous_state_machine_arn_is_empty_by_default_or_a_machine_in_the_stacks_region():
    assert config()["previousStateMachineArn"] == ""
    arn = "arn:aws:states:us-east-1:123456789012:stateMachine:old-flow"
    assert config(previousStateMachineArn=arn)["previousStateMachineArn"] == arn
    elsewhere = arn.replace("us-east-1", "eu-west-1")
    assert "previousStateMachineArn must be in the stack's region us-east-1" in refusal(
        previousStateMachineArn=elsewhere
    )
    assert "previousStateMachineArn must be empty or a Standard state machine ARN" in refusal(
        previousStateMachineArn="old-flow"
    )


# -- the LedgerDrift alarm follows the schedule ---------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "period"),
    [
        ("rate(1 minute)", 60),
        ("rate(5 minutes)", 300),
        ("rate(2 hours)", 7200),
        ("rate(1 day)", 28800),  # three periods must fit in CloudWatch's one-day evaluation range
        ("cron(0/10 * * * ? *)", 300),
    ],
)
def test_the_drift_alarm_period_is_one_tick(rate, period):
    cfg = config(scheduleRate=rate)
    assert cfg["driftAlarmPeriod"] == period
    assert cfg["driftAlarmTicks"] == 3


# -- region ------------------------------------------------------------------------------------------


@pytest.fixture
def aws_config(tmp_path):
    path = tmp_path / "config"
    path.write_text(
        "[default]\nregion = ap-south-1\n\n"
        "# a comment\n[profile ops]\noutput = json\nregion=eu-central-1\n\n"
        "[profile noregion]\noutput = json\n"
    )
    return str(path)


def region(env: dict[str, str], options: dict[str, str] | None = None, stage: str = "dev") -> str:
    return _node("region", "region.js", {"env": env, "options": options or {}, "stage": stage})


def test_region_prefers_aws_region_then_aws_default_region(aws_config):
    both = {"AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "us-west-2", "AWS_CONFIG_FILE": aws_config}
    assert region(both) == "eu-west-1"
    assert region({"AWS_DEFAULT_REGION": "us-west-2", "AWS_CONFIG_FILE": aws_config}) == "us-west-2"


def test_region_falls_back_to_the_profiles_region(aws_config):
    assert region({"AWS_CONFIG_FILE": aws_config}) == "ap-south-1"
    assert region({"AWS_CONFIG_FILE": aws_config, "AWS_PROFILE": "ops"}) == "eu-central-1"
    assert region({"AWS_CONFIG_FILE": aws_config, "AWS_DEFAULT_PROFILE": "ops"}) == "eu-central-1"
    assert region({"AWS_CONFIG_FILE": aws_config}, {"aws-profile": "ops"}) == "eu-central-1"
    assert region({"AWS_CONFIG_FILE": aws_config, "AWS_PROD_PROFILE": "ops"}, stage="prod") == "eu-central-1"


def test_region_defaults_to_us_east_1(aws_config, tmp_path):
    assert region({"AWS_CONFIG_FILE": aws_config, "AWS_PROFILE": "noregion"}) == "us-east-1"
    assert region({"AWS_CONFIG_FILE": str(tmp_path / "missing")}) == "us-east-1"
    assert region({"AWS_CONFIG_FILE": "/dev/null"}) == "us-east-1"


def test_serverless_yml_takes_the_region_from_region_js():
    text = (ROOT / "serverless.yml").read_text(encoding="utf-8")
    assert "  region: ${opt:region, file(stack/region.js)}\n" in text


# -- the semaphore step ---------------------------------------------------------------------------------


def _arn(part: Any) -> str:
    """An ARN config.js builds with Fn::Join over the stack's own partition, region and account."""
    if isinstance(part, str):
        return part
    sep, pieces = part["Fn::Join"]
    return sep.join(p if isinstance(p, str) else "${" + p["Ref"] + "}" for p in pieces)


def test_the_semaphore_defaults_serve_the_example_workflow():
    cfg = config()
    assert cfg["semaphores"] == "example=2" and cfg["semaphoreSweepRate"] == "rate(1 minute)"
    assert cfg["semaphoreExampleName"] == "sluice-dev-semaphore-example"
    assert [_arn(a) for a in cfg["semaphoreStateMachineArns"]] == [
        "arn:${AWS::Partition}:states:${AWS::Region}:${AWS::AccountId}:stateMachine:sluice-dev-semaphore-example"
    ]


def test_semaphore_users_add_their_machines_and_executions():
    orders = "arn:aws:states:us-east-1:111122223333:stateMachine:orders"
    cfg = config(semaphores=" db = 5 , api=0", semaphoreStateMachineArns=f"{orders}, {orders}")
    assert cfg["semaphores"] == "db=5,api=0"
    assert [_arn(a) for a in cfg["semaphoreStateMachineArns"]][1:] == [orders]
    assert [_arn(a) for a in cfg["semaphoreExecutionArns"]][1:] == [
        "arn:aws:states:us-east-1:111122223333:execution:orders:*"
    ]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"semaphores": "db"}, 'semaphores: "db" is not name=limit'),
        ({"semaphores": "db=ten"}, 'the limit of "db" must be 0 to 10000, got "ten"'),
        ({"semaphores": "db=10001"}, 'the limit of "db" must be 0 to 10000'),
        ({"semaphores": "db=1,db=2"}, '"db" is given twice'),
        ({"semaphores": "a#b=1"}, 'bad name "a#b"'),
        ({"semaphoreSweepRate": "every minute"}, "semaphoreSweepRate must be an EventBridge expression"),
        ({"semaphoreStateMachineArns": "orders"}, '"orders" is not a state machine ARN'),
        (
            {"semaphoreStateMachineArns": "arn:aws:states:eu-west-1:111122223333:stateMachine:orders"},
            "is not in the stack's region us-east-1",
        ),
    ],
)
def test_bad_semaphore_parameters_are_refused(params, message):
    assert message in refusal(**params)


def test_stored_payloads_expire_after_30_days_by_default_and_never_before_the_queue_lets_go():
    assert config()["payloadExpiryDays"] == 30
    assert config(payloadExpiryDays=15)["payloadExpiryDays"] == 15
    assert "must be between 15 and 3650, got 14: a stored payload must outlive the 14 days" in refusal(
        payloadExpiryDays=14
    )
    assert "payloadExpiryDays must be a whole number" in refusal(payloadExpiryDays="a week")


# -- lanes -------------------------------------------------------------------------------------------


def test_without_lanes_there_is_the_one_lane_default_and_nothing_added():
    cfg = config()
    assert cfg["lanes"] == [{"name": "default", "max": 10, "priority": 0, "weight": 1, "fair": False}]
    assert cfg["queueArns"] == {"Fn::GetAtt": ["PayloadQueue", "Arn"]}
    assert cfg["tlsQueues"] == [{"Ref": "PayloadQueue"}, {"Ref": "DeadLetterQueue"}]
    assert cfg["laneEnvironment"] == {}
    assert cfg["semaphoreEnvironment"] == {"SLUICE_SEMAPHORES": "example=2"}
    assert cfg["laneResources"] == {"Resources": {}, "Outputs": {}}


def test_a_fair_lane_is_passed_to_the_functions_as_given():
    cfg = config(lanes="shared:20:0:1:fair")
    assert cfg["lanes"][0] == {"name": "shared", "max": 20, "priority": 0, "weight": 1, "fair": True}
    assert cfg["laneEnvironment"]["SLUICE_LANES"] == "shared:20:0:1:fair"


def test_lanes_are_parsed_with_their_defaults_and_default_is_implied_with_max_concurrency():
    cfg = config(lanes="gpu:2:1,backfill:8:0:3, bulk-load : 0 : 5 : 2 ", maxConcurrency=25)
    assert cfg["lanes"] == [
        {"name": "gpu", "max": 2, "priority": 1, "weight": 1, "fair": False},
        {"name": "backfill", "max": 8, "priority": 0, "weight": 3, "fair": False},
        {"name": "bulk-load", "max": 0, "priority": 5, "weight": 2, "fair": False},
        {"name": "default", "max": 25, "priority": 0, "weight": 1, "fair": False},
    ]
    # The functions get the lanes as given (without spaces) and each other lane's queue URL.
    env = cfg["laneEnvironment"]
    assert env["SLUICE_LANES"] == "gpu:2:1,backfill:8:0:3,bulk-load:0:5:2"
    assert env["SLUICE_LANE_QUEUES"] == {
        "Fn::Join": [
            "",
            [
                "gpu=",
                {"Ref": "LaneGpuQueue"},
                ",backfill=",
                {"Ref": "LaneBackfillQueue"},
                ",bulk-load=",
                {"Ref": "LaneBulkLoadQueue"},
            ],
        ]
    }
    assert cfg["semaphoreEnvironment"] == {"SLUICE_SEMAPHORES": "example=2", **env}
    ids = ["PayloadQueue", "LaneGpuQueue", "LaneBackfillQueue", "LaneBulkLoadQueue"]
    assert cfg["queueArns"] == [{"Fn::GetAtt": [i, "Arn"]} for i in ids]
    assert cfg["tlsQueues"] == [{"Ref": i} for i in ["PayloadQueue", "DeadLetterQueue", *ids[1:]]]
    assert cfg["tlsQueueArns"] == [
        {"Fn::GetAtt": [i, "Arn"]} for i in ["PayloadQueue", "DeadLetterQueue", *ids[1:]]
    ]
    resources = cfg["laneResources"]["Resources"]
    assert set(resources) == {
        *ids[1:],
        "LaneGpuOldestMessageAlarm",
        "LaneBackfillOldestMessageAlarm",
        "LaneBulkLoadOldestMessageAlarm",
    }
    assert resources["LaneBulkLoadQueue"]["Properties"]["QueueName"] == "sluice-dev-lane-bulk-load.fifo"
    assert set(cfg["laneResources"]["Outputs"]) == {
        "LaneGpuQueueUrl",
        "LaneBackfillQueueUrl",
        "LaneBulkLoadQueueUrl",
        "LaneQueueUrls",
    }


def test_the_lane_default_may_be_named_to_set_its_own_max_priority_and_weight():
    cfg = config(lanes="default:4:7:2,gpu:1")
    assert cfg["lanes"] == [
        {"name": "default", "max": 4, "priority": 7, "weight": 2, "fair": False},
        {"name": "gpu", "max": 1, "priority": 0, "weight": 1, "fair": False},
    ]
    assert cfg["laneEnvironment"]["SLUICE_LANES"] == "default:4:7:2,gpu:1"
    assert list(cfg["laneResources"]["Resources"]) == [
        "LaneGpuQueue",
        "LaneGpuOldestMessageAlarm",
    ]


def test_only_the_lane_default_adds_no_queue_but_the_environment_and_the_dashboards_lane_graphs():
    cfg = config(lanes="default:3")
    assert cfg["laneEnvironment"] == {"SLUICE_LANES": "default:3", "SLUICE_LANE_QUEUES": ""}
    assert cfg["queueArns"] == {"Fn::GetAtt": ["PayloadQueue", "Arn"]}
    assert cfg["laneResources"] == {"Resources": {}, "Outputs": {}}
    assert "LaneRunning" in json.dumps(cfg["monitoringResources"]["Resources"]["Dashboard"])
    assert "LaneRunning" not in json.dumps(config()["monitoringResources"]["Resources"]["Dashboard"])


def test_twenty_lanes_at_most_the_lane_default_included():
    nineteen = ",".join(f"l{i}:1" for i in range(19))
    assert len(config(lanes=nineteen)["lanes"]) == 20
    assert len(config(lanes=nineteen + ",default:1")["lanes"]) == 20
    message = refusal(lanes=nineteen + ",l19:1")
    assert 'lanes: at most 20 lanes, the lane "default" included, got 21' in message


@pytest.mark.parametrize(
    ("lanes", "message"),
    [
        ("gpu:x", 'lanes: "gpu:x" : max must be a whole number between 0 and 10000'),
        ("gpu:10001", 'lanes: "gpu:10001" : max must be a whole number between 0 and 10000'),
        ("gpu:-1", 'lanes: "gpu:-1" : max must be a whole number between 0 and 10000'),
        ("gpu:1.5", 'lanes: "gpu:1.5" : max must be a whole number between 0 and 10000'),
        ("gpu:2:101", 'lanes: "gpu:2:101" : priority must be a whole number between 0 and 100'),
        ("gpu:2:high", 'lanes: "gpu:2:high" : priority must be a whole number between 0 and 100'),
        ("gpu:2:1:0", 'lanes: "gpu:2:1:0" : weight must be a whole number between 1 and 100'),
        ("gpu:2:1:101", 'lanes: "gpu:2:1:101" : weight must be a whole number between 1 and 100'),
        ("gpu:2:1:1:unfair", 'lanes: "gpu:2:1:1:unfair" : the 5th field may only be "fair", got "unfair"'),
        (
            "gpu:2:1:1:fair:x",
            'lanes: "gpu:2:1:1:fair:x" : too many fields, at most name:max:priority:weight:fair',
        ),
        ("gpu", 'lanes: "gpu" : give name:max[:priority[:weight[:fair]]]'),
        ("gpu::1", 'lanes: "gpu::1" : a field is empty'),
        ("gpu:2:", 'lanes: "gpu:2:" : a field is empty'),
        (":2", 'lanes: ":2" : a field is empty'),
        ("gpu:2,,cpu:1", 'lanes: an empty lane in "gpu:2,,cpu:1"'),
        ("gpu:2,", 'lanes: an empty lane in "gpu:2,"'),
        ("gpu:2,gpu:3", 'lanes: "gpu" is given twice'),
        ("default:2,default:3", 'lanes: "default" is given twice'),
        ("GPU:2", 'lanes: "GPU:2" : bad name "GPU"'),
        ("1gpu:2", 'lanes: "1gpu:2" : bad name "1gpu"'),
        ("gpu-:2", 'lanes: "gpu-:2" : bad name "gpu-"'),
        ("gpu--batch:2", 'lanes: "gpu--batch:2" : bad name "gpu--batch"'),
        ("gpu_batch:2", 'lanes: "gpu_batch:2" : bad name "gpu_batch"'),
        ("a" * 21 + ":2", f'lanes: "{"a" * 21}:2" : bad name "{"a" * 21}": 1 to 20 characters'),
        ("a-1b:1,a1b:2", 'lanes: "a-1b" and "a1b" would share the resource name LaneA1bQueue'),
    ],
)
def test_bad_lanes_are_refused_with_the_reason(lanes, message):
    assert message in refusal(lanes=lanes)


def test_a_lane_name_of_twenty_characters_is_taken():
    assert config(lanes="a" * 20 + ":2")["lanes"][0]["name"] == "a" * 20


# -- a lane's own state machine (laneStateMachines) ------------------------------------------------------

GPU_MACHINE = "arn:aws:states:us-east-1:123456789012:stateMachine:render"


def test_without_lane_state_machines_the_stack_drives_its_own_alone():
    cfg = config(lanes="gpu:2:1")
    assert "SLUICE_LANE_STATE_MACHINES" not in cfg["laneEnvironment"]
    assert cfg["laneMachineResources"]["Fn::If"][0] == "CreateWorkflow"
    assert len(cfg["machineArns"]) == 1


def test_a_lanes_state_machine_reaches_the_functions_the_role_and_the_completion_rule():
    cfg = config(lanes="gpu:2:1,backfill:8", laneStateMachines=f" gpu = {GPU_MACHINE} ")
    assert cfg["laneEnvironment"]["SLUICE_LANE_STATE_MACHINES"] == f"gpu={GPU_MACHINE}"
    assert cfg["semaphoreEnvironment"]["SLUICE_LANE_STATE_MACHINES"] == f"gpu={GPU_MACHINE}"
    assert cfg["machineArns"][1:] == [GPU_MACHINE]
    assert cfg["laneMachineResources"] == [
        GPU_MACHINE,
        "arn:aws:states:us-east-1:123456789012:execution:render:*",
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (f"cpu={GPU_MACHINE}", 'laneStateMachines: "cpu" is not a lane; the lanes are gpu, default'),
        ("gpu=arn:aws:sqs:us-east-1:123456789012:q", "is not a state machine ARN"),
        ("gpu", 'laneStateMachines: "gpu" : give lane=state-machine-arn'),
        (f"gpu={GPU_MACHINE.replace('us-east-1', 'eu-west-1')}", "must be in the stack's region us-east-1"),
        (f"gpu={GPU_MACHINE},gpu={GPU_MACHINE}", 'lane "gpu" is given twice'),
    ],
)
def test_a_bad_lane_state_machine_is_refused_before_packaging(value, message):
    assert message in refusal(lanes="gpu:2:1", laneStateMachines=value)


def test_start_concurrency_is_auto_by_default_or_a_whole_number():
    assert config()["text"]["startConcurrency"] == "auto"
    assert config(startConcurrency="AUTO")["text"]["startConcurrency"] == "auto"
    assert config(startConcurrency=30)["text"]["startConcurrency"] == "30"


@pytest.mark.parametrize("value", ["0", "-1", "abc", "²", "101", "1.5"])
def test_bad_start_concurrency_is_refused_naming_it(value):
    assert "startConcurrency must be" in refusal(startConcurrency=value)


def test_rate_limits_reach_the_functions_only_when_set():
    assert "SLUICE_RATE_LIMIT" not in config()["laneEnvironment"]
    env = config(rateLimit=" 600/minute ", lanes="gpu:2:1", laneRateLimits="gpu = 10/second")[
        "laneEnvironment"
    ]
    assert env["SLUICE_RATE_LIMIT"] == "600/minute" and env["SLUICE_LANE_RATE_LIMITS"] == "gpu=10/second"
    assert "SLUICE_KEY_RATE_LIMIT" not in env
    assert config(keyRateLimit="10/minute")["laneEnvironment"]["SLUICE_KEY_RATE_LIMIT"] == "10/minute"


@pytest.mark.parametrize(
    "value", ["5/day", "0/second", "5 per second", "1.5/minute", "10001/hour", "/second"]
)
def test_a_bad_rate_is_refused_before_packaging_naming_its_parameter(value):
    assert "rateLimit must be N/second, N/minute or N/hour" in refusal(rateLimit=value)
    assert "laneRateLimits (gpu) must be" in refusal(lanes="gpu:2:1", laneRateLimits=f"gpu={value}")
    assert "keyRateLimit must be N/second, N/minute or N/hour" in refusal(keyRateLimit=value)


@pytest.mark.parametrize("value", ["api=5/second", "gpu=1/second,gpu=2/second", "10/second"])
def test_a_lane_rate_of_no_lane_is_refused(value):
    assert "laneRateLimits:" in refusal(lanes="gpu:2:1", laneRateLimits=value)

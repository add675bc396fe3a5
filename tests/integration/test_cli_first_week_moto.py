"""Issue 27, items 3 to 5: the ``sluice`` an operator uses in the first week, against moto.

Item 3: ``status KEY`` for a payload with no record answers with what is known. Item 4: ``set-max``
and ``tick`` on a stack with lanes say what is in force per lane and why a tick stopped. Item 5:
loose arguments refused, the stack's semaphore function found, a closed pipe and logs kept quiet,
plurals right. In-process runs use ``sluice.cli.main`` with the test's session; the pipe and the
log lines run the real entry point (``python -m sluice.cli``) in a child process against a moto
server.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import boto3
import pytest

import sluice
from handlers import _shared
from sluice.asl import StateNames
from sluice.local.moto_server import start_server, stop_server
from tests.support.aws import REGION, build_stack
from tests.support.cli import clear_sluice_env, parameter, use_env
from tests.support.cli import sluice as run_sluice

STACK = "sluice-week"
FUNCTION = "arn:aws:lambda:us-east-1:123456789012:function:sluice-week-semaphore"
LIB = Path(sluice.__file__).resolve().parents[1]


def deploy(stack: Any, *, lanes: str = "", outputs: dict[str, str] | None = None) -> None:
    """A CloudFormation stack whose outputs name the moto resources, and a launcher function whose
    environment holds the deployed settings (``SLUICE_LANES`` with ``lanes``), as the deploy does."""
    s = stack.settings
    role = stack.client("iam").create_role(RoleName=f"{STACK}-launcher", AssumeRolePolicyDocument="{}")
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as z:
        z.writestr("handlers/launcher.py", "def handler(event, context):\n    return {}\n")
    queues = ",".join(f"{name}={url}" for name, url in s.lane_queue_urls.items())
    variables = {
        "SLUICE_QUEUE_URL": s.queue_url,
        "SLUICE_MAX_CONCURRENCY": str(s.max_concurrency),
        "SLUICE_RECEIVE_WAIT_SECONDS": "0",
        "SLUICE_MAX_CACHE_SECONDS": "0",
        **({"SLUICE_LANES": lanes, "SLUICE_LANE_QUEUES": queues} if lanes else {}),
    }
    function = stack.client("lambda").create_function(
        FunctionName=f"{STACK}-launcher",
        Runtime="python3.12",
        Role=role["Role"]["Arn"],
        Handler="handlers/launcher.handler",
        Code={"ZipFile": code.getvalue()},
        Publish=True,
        Timeout=90,
        Environment={"Variables": variables},
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
    template = {
        "Resources": {
            "Marker": {
                "Type": "AWS::SSM::Parameter",
                "Properties": {"Name": f"/{STACK}/marker", "Type": "String", "Value": "week"},
            }
        },
        "Outputs": {k: {"Value": v} for k, v in values.items()},
    }
    stack.client("cloudformation").create_stack(StackName=STACK, TemplateBody=json.dumps(template))


@pytest.fixture
def env(stack, monkeypatch):
    """The plain stack (MAX 5, no lanes), named by SLUICE_* variables."""
    use_env(monkeypatch, stack, SLUICE_MAX_CONCURRENCY="5")
    _shared.reset()
    yield stack
    _shared.reset()


@pytest.fixture
def cli(env, capsys):
    return lambda *argv: run_sluice(capsys, *argv, session=env.session)


# -- item 5: loose arguments -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (("dlq", "list", "--limit", "-1"), "--limit: '-1': a whole number from 1"),
        (("dlq", "list", "--limit=0"), "--limit: '0': a whole number from 1"),
        (("dlq", "list", "--width", "-3"), "--width: '-3': a whole number from 1"),
        (("status", "--tree"), "status --tree needs a payload key"),
        (("enqueue", "-", "--on-await-failure", "run"), "--on-await-failure needs --after"),
        (("pause", "--lane", ""), "the lane name is empty"),
        (("resume", "--lane", " "), "the lane name is empty"),
        (("dlq", "redrive", "--all", "--lane", ""), "the lane name is empty"),
        (("semaphore", "asl", "db", "--function", ""), "the function ARN is empty"),
    ],
)
def test_item5_loose_arguments_are_refused_by_the_parser(env, cli, argv, words):
    env.send("{broken")
    env.send("[1]")
    cli("tick")  # both dead-lettered
    assert env.queue_counts(env.settings.dlq_url) == (2, 0)

    run = cli(*argv)

    assert run.code == 2, run.out
    assert words in run.err and run.out == ""
    assert env.queue_counts(env.settings.dlq_url) == (2, 0), "nothing received, nothing moved"
    assert parameter(env) == "5"


def test_item5_asl_takes_the_semaphore_function_from_the_stack_output(stack, monkeypatch, capsys):
    clear_sluice_env(monkeypatch)
    deploy(stack, outputs={"SemaphoreFunctionArn": FUNCTION})

    run = run_sluice(capsys, "--stack", STACK, "semaphore", "asl", "db", session=stack.session)

    assert run.code == 0, run.err
    states = run.json
    assert states[StateNames.of("db").acquire]["Parameters"]["FunctionName"] == FUNCTION
    assert f"stack output SemaphoreFunctionArn: {FUNCTION}" in run.err

    # SLUICE_* variables name no semaphore function: the stack is read all the same.
    use_env(monkeypatch, stack)
    again = run_sluice(capsys, "--stack", STACK, "semaphore", "asl", "db", "--json", session=stack.session)
    assert again.code == 0 and json.loads(again.out) == states


def test_item5_asl_on_a_stack_without_the_output_says_to_pass_function(stack, monkeypatch, capsys):
    clear_sluice_env(monkeypatch)
    deploy(stack)

    run = run_sluice(capsys, "--stack", STACK, "semaphore", "asl", "db", session=stack.session)

    assert run.code == 2 and run.out == ""
    assert "has no output SemaphoreFunctionArn" in run.err and "--function ARN" in run.err

    missing = run_sluice(capsys, "--stack", "sluice-nowhere", "semaphore", "asl", "db", session=stack.session)
    assert missing.code == 2 and "not found" in missing.err and "--function ARN" in missing.err


def test_item5_plurals(env, cli, tmp_path):
    one = cli("set-max", "1")
    assert "In force now: the next start obeys it (1 slot for Sluice)." in one.out

    env.send({"id": "a"}, group="a")
    env.send({"id": "b"}, group="b")
    env.send("{broken", group="c")
    assert cli("set-max", "3").code == 0
    cli("tick")
    assert len(env.running()) == 2
    lowered = cli("set-max", "1")
    assert "2 are running, more than 1: no new start until none runs." in lowered.out
    assert "fewer than 1" not in cli("status").out

    (dead,) = [m["message_id"] for m in cli("dlq", "list", "--json").json["messages"]]
    assert cli("dlq", "delete", "--id", dead).out.startswith("deleted 1 message from the DLQ\n")
    assert env.queue_counts(env.settings.dlq_url) == (0, 0)


# -- item 5: the real entry point in a child process ---------------------------------------------------


@pytest.fixture
def server(monkeypatch):
    """A moto server, a stack on it, and the environment a child ``sluice`` needs to reach it."""
    endpoint = start_server()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        on_server = build_stack(boto3.session.Session(region_name=REGION), name="week-child")
        yield on_server
    finally:
        stop_server(endpoint)


def child_env(stack: Any | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(LIB), str(LIB.parent)])
    if stack is not None:
        s = stack.settings
        env.update(
            SLUICE_QUEUE_URL=s.queue_url,
            SLUICE_DLQ_URL=s.dlq_url,
            SLUICE_TABLE_NAME=s.table_name,
            SLUICE_STATE_MACHINE_ARN=s.state_machine_arn,
            SLUICE_MAX_PARAMETER=s.max_parameter or "",
            SLUICE_RECEIVE_WAIT_SECONDS="0",
        )
    return env


def sluice_child(
    *argv: str, env: dict[str, str], stdout: Any = subprocess.PIPE
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", *argv],
        env=env,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        check=False,
    )


def test_item5_a_closed_pipe_ends_quietly_with_141():
    """``sluice ... | head``: the reader is gone before the first write (its end closed before
    the child starts), so every write meets a closed pipe."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = sluice_child("semaphore", "asl", "db", "--function", FUNCTION, env=child_env(), stdout=write)
    finally:
        os.close(write)
    assert "Broken pipe" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "Exception ignored" not in done.stderr
    assert done.returncode == 141


def test_item5_tick_prints_no_log_lines_without_v(server):
    server.send("{broken")  # dead-lettered: the launcher logs a warning
    server.send({"id": "a"}, group="a")

    quiet = sluice_child("tick", env=child_env(server))

    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""
    outcomes = quiet.stdout.splitlines()[0].split(None, 1)
    assert outcomes[0] == "outcomes" and set(outcomes[1].split(", ")) == {"started 1", "invalid 1"}
    assert not [line for line in quiet.stdout.splitlines() if line.startswith("{")], "no JSON log line"
    assert len(server.running()) == 1 and server.queue_counts(server.settings.dlq_url) == (1, 0)

    server.send("[1]", group="b")
    verbose = sluice_child("tick", "-v", env=child_env(server))
    assert verbose.returncode == 0
    assert "WARNING sluice.launcher: invalid payload dead-lettered" in verbose.stderr


# -- item 3: status of a payload with no record ----------------------------------------------------------

LANES = "gpu:2:1,default:3"


@pytest.fixture
def laned(session, monkeypatch):
    """A stack with lanes (gpu: MAX 2, priority 1; default: MAX 3) under MAX 5, found from its outputs
    and its launcher's SLUICE_LANES."""
    clear_sluice_env(monkeypatch)
    _shared.reset()
    stack = build_stack(session, max_concurrency=5, lanes=LANES)
    deploy(stack, lanes=LANES)
    yield stack
    _shared.reset()


@pytest.fixture
def lcli(laned, capsys):
    return lambda *argv: run_sluice(capsys, "--stack", STACK, *argv, session=laned.session)


def fill(stack: Any, lane: str, n: int, prefix: str | None = None) -> None:
    for i in range(n):
        stack.send({"id": f"{prefix or lane}-{i}"}, group=f"{prefix or lane}-{i}", lane=lane)


def test_item3_status_of_a_payload_still_in_the_queue_says_what_holds_it(env, cli):
    cli("set-max", "2")
    fill(env, "default", 3, prefix="job")
    cli("tick")  # job-0 and job-1 start; job-2 waits in the queue
    assert len(env.running()) == 2 and env.queue_counts() == (1, 0)

    run = cli("status", "job-2")

    assert run.code == 1
    assert run.err == "sluice status: no record for payload 'job-2'\n"
    assert run.out.splitlines() == [
        "payload     job-2",
        "record      none yet: not received by the launcher yet (still in a queue, or in flight), never "
        "enqueued, or expired (records are kept retentionDays)",
        "MAX         2",
        "slots       2 running of 2 (0 free)",
        "queue       1 waiting, 0 in flight, 0 delayed",
        "holds       every slot is taken (2 running of 2)",
    ]

    data = cli("status", "job-2", "--json")
    assert data.code == 1
    doc = data.json  # a JSON document on stdout, as for every "not found"
    assert (doc["payload"], doc["payload_id"], doc["found"]) == (None, "job-2", False)
    room = doc["room"]
    assert (room["max"], room["limit"], room["running"], room["free"]) == (2, 2, 2, 0)
    assert [(q["lane"], q["waiting"], q["in_flight"]) for q in room["queues"]] == [("default", 1, 0)]
    assert room["holds"] == [{"hold": "full", "lane": None, "concurrency_key": None}]

    cli("pause")
    paused = cli("status", "job-2")
    assert paused.code == 1
    assert "MAX         0, PAUSED (sluice resume restores 2)" in paused.out
    assert (
        paused.out.splitlines()[-1] == "holds       MAX is 0 (paused): nothing starts until `sluice resume`"
    )

    cli("resume")
    cli("set-max", "3")
    free = cli("status", "never-sent")
    assert free.code == 1
    assert "slots       2 running of 3 (1 free)" in free.out
    assert free.out.splitlines()[-1].startswith("holds       nothing: slots are free")
    assert len(env.running()) == 2 and env.queue_counts() == (1, 0), "status changes nothing"


def test_item3_status_narrowed_to_a_lane_on_a_stack_with_lanes(laned, lcli):
    fill(laned, "gpu", 4)
    fill(laned, "default", 1)
    lcli("tick")
    assert sorted(e["name"].split("-")[0] for e in laned.executions("RUNNING")) == ["default", "gpu", "gpu"]

    run = lcli("status", "gpu-3", "--lane", "gpu")

    assert run.code == 1
    lines = run.out.splitlines()
    assert [line for line in lines if line.startswith("lane ")] == [
        "lane        gpu  MAX 2 (configured): 2 running of 2 (0 free); queue 2 waiting, 0 in flight, 0 delayed"
    ]
    assert lines[-1] == "holds       lane gpu is full (2 running of 2, 2 waiting)"

    every = lcli("status", "gpu-3", "--json").json
    assert [q["lane"] for q in every["room"]["queues"]] == ["gpu", "default"]
    assert every["room"]["holds"] == [{"hold": "lane full", "lane": "gpu", "concurrency_key": None}]

    unknown = lcli("status", "gpu-3", "--lane", "cpu")
    assert unknown.code == 2 and "no lane 'cpu'" in unknown.err and unknown.out == ""

    overview = lcli("status", "--lane", "default", "--json").json
    assert [lane["lane"] for lane in overview["lanes"]] == ["default"]


def test_item3_status_narrowed_to_a_concurrency_key(env, cli, tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"k-{i}"}) for i in range(3)))
    assert cli("enqueue", path, "--concurrency-key", "tenant-a").code == 0
    assert cli("set-max", "1", "--key", "tenant-a").code == 0
    cli("tick")  # k-0 starts, k-1 and k-2 wait in the key's line
    assert len(env.running()) == 1

    run = cli("status", "k-9", "--concurrency-key", "tenant-a")

    assert run.code == 1
    assert "key         tenant-a: 1 of 1 running, 2 waiting in its line" in run.out
    assert run.out.splitlines()[-1] == "holds       concurrency key tenant-a is at its cap (1 of 1 running)"
    assert "queue       0 waiting, 0 in flight, 0 delayed, 2 in concurrency keys' lines" in run.out

    parked = cli("status", "k-2", "--concurrency-key", "tenant-a", "--json")
    assert parked.code == 0 and parked.json["line"]["waiting"] is True
    assert parked.json["room"]["key"]["waiting"] == 2

    overview = cli("status", "--concurrency-key", "tenant-b", "--json").json
    assert [(k["key"], k["running"], k["waiting"]) for k in overview["keys"]] == [("tenant-b", 0, 0)]


def test_item3_every_not_found_prints_json_with_json(env, cli):
    status = cli("status", "nobody", "--json")
    assert status.code == 1 and status.json["found"] is False

    semaphore = cli("semaphore", "status", "nothing-here", "--json")
    assert semaphore.code == 1
    assert semaphore.json == {"semaphore": "nothing-here", "found": False}
    assert "no semaphore named 'nothing-here'" in semaphore.err

    deleted = cli("dlq", "delete", "--id", "no-such-id", "--json")
    assert deleted.code == 1 and deleted.json["not_found"] == ["no-such-id"]

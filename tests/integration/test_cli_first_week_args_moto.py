"""Issue 27, item 5: loose arguments refused, the stack's semaphore function found, a closed pipe
and the tick's logs kept quiet, plurals right. In-process runs use ``sluice.cli.main`` with the
test's session; the pipe and the log lines run the real entry point (``python -m sluice.cli``) in a
child process, against a moto server for the tick.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest

import sluice
from sluice.local.moto_server import start_server, stop_server
from sluice.semaphore.asl import StateNames
from tests.integration.test_cli_first_week_moto import STACK
from tests.support.aws import REGION, build_stack
from tests.support.cli import clear_sluice_env, deploy, parameter, use_env
from tests.support.cli import sluice as run_sluice
from tests.support.hooks import error_answer

FUNCTION = "arn:aws:lambda:us-east-1:123456789012:function:sluice-week-semaphore"
LIB = Path(sluice.__file__).resolve().parents[1]


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
        (("semaphore", "asl", "db", "--function", FUNCTION, "--wrap", "-", "--next", "X"), "--next are for"),
        (
            ("semaphore", "asl", "db", "--function", FUNCTION, "--wrap", "-", "--section", "W"),
            "--section are",
        ),
        (("enqueue", "-", "--after", ""), "the awaited key is empty"),
        (
            ("semaphore", "asl", "db", "--function", FUNCTION, "--timeout", "0"),
            "--timeout: '0': a whole number",
        ),
        (
            ("semaphore", "asl", "db", "--function", FUNCTION, "--heartbeat", "-5"),
            "--heartbeat: '-5': a whole",
        ),
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
    deploy(stack, STACK, outputs={"SemaphoreFunctionArn": FUNCTION})

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
    deploy(stack, STACK)

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
        # moto's backends outlive a server in this process: a name of its own for each stack
        name = f"week-{uuid.uuid4().hex[:8]}"
        on_server = build_stack(boto3.session.Session(region_name=REGION), name=name)
        yield on_server
    finally:
        stop_server(endpoint)


def child_env(stack: Any | None = None) -> dict[str, str]:
    # As from a user's shell: standard output buffered (a test runner may set PYTHONUNBUFFERED).
    variables = {
        k: v for k, v in os.environ.items() if not k.startswith("SLUICE_") and k != "PYTHONUNBUFFERED"
    }
    variables["PYTHONPATH"] = os.pathsep.join([str(LIB), str(LIB.parent)])
    if stack is not None:
        s = stack.settings
        variables.update(
            SLUICE_QUEUE_URL=s.queue_url,
            SLUICE_DLQ_URL=s.dlq_url,
            SLUICE_TABLE_NAME=s.table_name,
            SLUICE_STATE_MACHINE_ARN=s.state_machine_arn,
            SLUICE_MAX_PARAMETER=s.max_parameter or "",
            SLUICE_RECEIVE_WAIT_SECONDS="0",
        )
    return variables


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


def test_item5_tick_that_cannot_read_the_room_after_says_the_launchers_word(env, cli):
    """The tick is done when the room is read: a refused read (here the MAX parameter's tags) never
    turns a tick that started payloads into a failure."""
    refused = []

    def deny(**_: Any) -> Any:
        refused.append(1)
        return error_answer("AccessDeniedException", 400)

    env.session.events.register("before-call.ssm.ListTagsForResource", deny)
    env.send({"id": "a"}, group="a")

    run = cli("tick")

    assert refused, "the fault fired"
    assert run.code == 0, run.err
    assert len(env.running()) == 1 and env.queue_counts() == (0, 0)
    rows = dict(line.split(None, 1) for line in run.out.splitlines())
    assert rows["slots"] == "MAX 5 (limit 5): running 0 → 1, 4 free"
    assert rows["stopped"].startswith(
        "the queue is empty, as the launcher's last admission loop saw it (what holds starts could not be read:"
    )
    assert "AccessDenied" in rows["stopped"]
    data = cli("tick", "--json").json
    assert (data["stopped"], data["room"]) == ("empty", None) and "AccessDenied" in data["room_error"]


def closed_pipe_run(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    read, write = os.pipe()
    os.close(read)
    try:
        return sluice_child(*argv, env=env, stdout=write)
    finally:
        os.close(write)


def test_item5_a_closed_pipe_after_a_short_answer_ends_quietly_too(server):
    """A short answer sits in standard output's buffer until the flush: the closed pipe shows there."""
    done = closed_pipe_run("dlq", "list", env=child_env(server))
    assert done.stderr == ""
    assert done.returncode == 141


@pytest.mark.parametrize("argv", [("--help",), ("dlq", "list", "--help")])
def test_item5_help_into_a_closed_pipe_ends_quietly(argv):
    done = closed_pipe_run(*argv, env=child_env())
    assert done.stderr == ""
    assert done.returncode == 141

"""How ``sluice`` finds its resources: stack outputs, SLUICE_* overrides, the launcher's deployed
settings; and what it says when the stack, the credentials or AWS itself are missing."""

from __future__ import annotations

import socket

import pytest

from sluice.adapters.dynamo.store import execution_pk
from tests.support.aws import REGION, build_stack
from tests.support.cli import clear_sluice_env, deploy, parameter, sluice
from tests.support.hooks import error_answer

STACK = "sluice-qa"


@pytest.fixture
def deployed(stack, monkeypatch):
    """A CloudFormation stack whose outputs name the moto resources, and a launcher function whose
    environment holds the deployed settings, as `sls deploy` leaves them."""
    clear_sluice_env(monkeypatch)
    variables = {
        "SLUICE_MAX_CONCURRENCY": "7",
        "SLUICE_CLAIM_TIMEOUT_SECONDS": "777",
        "POWERTOOLS_SERVICE_NAME": "sluice-qa",
    }
    deploy(stack, STACK, variables=variables)
    return stack


@pytest.fixture
def cli(deployed, capsys):
    return lambda *argv: sluice(capsys, *argv, session=deployed.session)


def test_status_finds_every_resource_from_the_stack_outputs(deployed, cli):
    deployed.send({"id": "a"})

    run = cli("--stage", "qa", "status", "--json")

    assert run.code == 0
    data = run.json
    assert data["stack"] == STACK and data["max"] == 5 and data["queue_visible"] == 1
    assert cli("status", "--stack", STACK).out.startswith(f"stack     {STACK}\n")


def test_tick_runs_with_the_launchers_deployed_settings(deployed, cli):
    deployed.send({"id": "a"})

    run = cli("--stage", "qa", "tick", "--json")

    assert run.code == 0
    summary = run.json
    assert summary["started"] == 1
    assert summary["settings_source"] == "launcher function sluice-qa-launcher"
    assert summary["time_limit"] == 90  # the launcher's own timeout
    (name,) = deployed.running()
    item = deployed.client("dynamodb").get_item(
        TableName=deployed.settings.table_name, Key={"pk": {"S": execution_pk(name)}}
    )["Item"]
    # The claim lasts the launcher's SLUICE_CLAIM_TIMEOUT_SECONDS, not this shell's default (900).
    assert float(item["claim_expires_at"]["N"]) - float(item["claimed_at"]["N"]) == 777


def test_resume_falls_back_to_the_launchers_deployed_default(deployed, cli):
    cli("--stage", "qa", "set-max", 0)

    run = cli("--stage", "qa", "resume", "--json")

    assert run.code == 0 and run.json["source"] == "deployed default" and run.json["max"] == 7
    assert parameter(deployed) == "7"


def test_a_sluice_variable_overrides_its_output(deployed, cli, monkeypatch):
    ssm = deployed.client("ssm")
    ssm.put_parameter(Name="/elsewhere/max", Value="2", Type="String")
    monkeypatch.setenv("SLUICE_MAX_PARAMETER", "/elsewhere/max")

    run = cli("--stage", "qa", "set-max", 9)

    assert run.code == 0
    assert ssm.get_parameter(Name="/elsewhere/max")["Parameter"]["Value"] == "9"
    assert parameter(deployed) == "5"  # the stack's own parameter is untouched


def test_a_missing_stack_is_a_configuration_error_that_says_what_to_do(session, capsys, monkeypatch):
    clear_sluice_env(monkeypatch)

    run = sluice(capsys, "--stage", "nope", "status")

    assert run.code == 2
    assert "stack 'sluice-nope' not found in us-east-1" in run.err
    assert "Deploy it first" in run.err and "--stack" in run.err and "SLUICE_QUEUE_URL" in run.err
    assert "Traceback" not in run.err and run.out == ""


def test_a_producer_needs_only_the_queue_url(session, capsys, monkeypatch, tmp_path):
    """No stack to read (the producer policy does not allow it anyway): SLUICE_QUEUE_URL is enough."""
    stack = build_stack(session)
    clear_sluice_env(monkeypatch)
    monkeypatch.setenv("SLUICE_QUEUE_URL", stack.settings.queue_url)
    path = tmp_path / "in.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b"}\n')

    run = sluice(capsys, "enqueue", path, session=session)

    assert run.code == 0 and run.out.strip() == "sent 2 of 2 payloads"
    assert stack.queue_counts() == (2, 0)
    assert sluice(capsys, "status", session=session).code == 2  # status needs the stack: there is none


@pytest.fixture
def no_aws(monkeypatch, tmp_path):
    """No moto, no credentials, and an endpoint where nothing listens: nothing can reach AWS."""
    clear_sluice_env(monkeypatch)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections are refused at once
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    return port


def test_missing_credentials_are_a_configuration_error_not_a_traceback(no_aws, capsys):
    run = sluice(capsys, "status")

    assert run.code == 2
    assert run.err.startswith("sluice: no usable AWS credentials. Set AWS_PROFILE")
    assert "Traceback" not in run.err


def test_an_unreachable_aws_exits_3(no_aws, capsys, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")

    run = sluice(capsys, "--region", REGION, "status")

    assert run.code == 3
    assert f"127.0.0.1:{no_aws}" in run.err and "is it running?" in run.err


def test_throttling_exits_3(deployed, cli):
    deployed.session.events.register(
        "before-call.ssm.GetParameter", lambda **_: error_answer("ThrottlingException", 400)
    )

    run = cli("--stage", "qa", "status")

    assert run.code == 3
    assert run.err.startswith(
        "sluice: AWS is unavailable or throttling, try again: GetParameter: ThrottlingException"
    )

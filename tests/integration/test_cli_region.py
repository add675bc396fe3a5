"""Which region ``sluice`` looks in: --region, else AWS_REGION, else AWS_DEFAULT_REGION, else the AWS
profile's, else us-east-1 — the order the stack's region follows (stack/region.js,
tests/unit/test_stack_config.py), so a deploy and the CLI find the same stack without being told."""

from __future__ import annotations

import pytest

from tests.support.cli import clear_sluice_env, sluice


@pytest.fixture
def no_region(session, monkeypatch, tmp_path):
    """moto is on (the ``session`` fixture), but ``sluice`` builds its own boto3 session from the
    environment and an AWS config file of the test's own."""
    clear_sluice_env(monkeypatch)
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "config"
    config.write_text("[default]\noutput = json\n\n[profile ops]\nregion = ap-south-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    return monkeypatch


def looked_in(capsys) -> str:
    """Run a command that needs the stack ``sluice-nope`` (there is none) and return the region that
    the refusal names: the region the command looked in."""
    run = sluice(capsys, "--stage", "nope", "status")
    assert run.code == 2, run.err
    assert "no AWS region" not in run.err
    prefix = "sluice: stack 'sluice-nope' not found in "
    assert run.err.startswith(prefix), run.err
    return run.err[len(prefix) :].split(".", 1)[0]


def test_aws_region_alone_is_enough(no_region, capsys):
    no_region.setenv("AWS_REGION", "eu-west-1")
    assert looked_in(capsys) == "eu-west-1"


def test_aws_region_comes_before_aws_default_region(no_region, capsys):
    no_region.setenv("AWS_REGION", "eu-west-1")
    no_region.setenv("AWS_DEFAULT_REGION", "us-west-2")
    assert looked_in(capsys) == "eu-west-1"


def test_aws_default_region_alone_is_enough(no_region, capsys):
    no_region.setenv("AWS_DEFAULT_REGION", "us-west-2")
    assert looked_in(capsys) == "us-west-2"


def test_the_profiles_region_comes_next(no_region, capsys):
    no_region.setenv("AWS_PROFILE", "ops")
    assert looked_in(capsys) == "ap-south-1"


def test_without_any_region_it_is_the_stacks_default(no_region, capsys):
    assert looked_in(capsys) == "us-east-1"


def test_the_region_option_comes_first(no_region, capsys):
    no_region.setenv("AWS_REGION", "eu-west-1")
    no_region.setenv("AWS_DEFAULT_REGION", "us-west-2")
    run = sluice(capsys, "--stage", "nope", "--region", "ca-central-1", "status")
    assert "not found in ca-central-1" in run.err

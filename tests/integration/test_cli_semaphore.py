"""``sluice semaphore set``, ``status`` and ``asl`` on moto, with the real adapters.

Workflows are played as the semaphore function would: ``Semaphores.acquire`` with a task token per
execution. The default moto takes any token, so SendTaskSuccess calls are recorded from a
``before-call`` hook: a token answered is a waiter granted."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sluice.adapters.aws.sfn_tokens import SfnTokens
from sluice.adapters.dynamo.codec import plain
from sluice.adapters.dynamo.semaphore import DynamoSemaphoreStore
from sluice.cli.render import when
from sluice.core.clock import FakeClock
from sluice.semaphore.asl import StateNames, check_definition
from sluice.semaphore.model import Outcome
from sluice.semaphore.step import Semaphores
from tests.support.aws import NO_RETRY
from tests.support.cli import clear_sluice_env, sluice

FUNCTION = "arn:aws:lambda:us-east-1:123456789012:function:sluice-test-semaphore"


@pytest.fixture
def answered(env):
    """Task tokens the CLI (or anyone on this session) answered with SendTaskSuccess, in order."""
    tokens: list[str] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        tokens.append(json.loads(params["body"])["taskToken"])

    env.session.events.register("before-call.sfn.SendTaskSuccess", record)
    yield tokens
    env.session.events.unregister("before-call.sfn.SendTaskSuccess", record)


@pytest.fixture
def sems(env, answered):  # after the hook: clients copy the session's handlers when made
    ddb = env.session.client("dynamodb", config=NO_RETRY)
    store = DynamoSemaphoreStore(ddb, env.settings.table_name, sleep=lambda _: None)
    return Semaphores(store, SfnTokens(env.session.client("stepfunctions", config=NO_RETRY)), FakeClock())


def executions(env, *names: str) -> list[str]:
    sfn = env.client("stepfunctions")
    return [
        sfn.start_execution(stateMachineArn=env.settings.state_machine_arn, name=n)["executionArn"]
        for n in names
    ]


def table_items(env, prefix: str) -> dict[str, dict[str, Any]]:
    items = env.client("dynamodb").scan(TableName=env.settings.table_name, ConsistentRead=True)["Items"]
    return {p["pk"]: p for p in map(plain, items) if p["pk"].startswith(prefix)}


# -- set -------------------------------------------------------------------------------------------------


def test_set_creates_the_semaphore_and_puts_the_limit_in_the_table(env, cli):
    run = cli("semaphore", "set", "db", "2")
    assert run.code == 0, run.err
    assert "semaphore db created with limit 2." in run.out
    assert table_items(env, "SLOTS#sem:db")["SLOTS#sem:db"]["limit"] == 2

    run = cli("semaphore", "set", "db", "5", "--json")
    assert run.code == 0
    assert run.json == {
        "semaphore": "db",
        "created": False,
        "before": 2,
        "limit": 5,
        "requested": 5,
        "overtaken": False,
        "frozen": False,
        "holding": 0,
        "granted": [],
        "waiting": 0,
        "line": 0,
    }
    assert table_items(env, "SLOTS#sem:db")["SLOTS#sem:db"]["limit"] == 5


def test_a_raise_hands_permits_to_the_oldest_waiters_at_once(env, cli, sems, answered):
    cli("semaphore", "set", "db", "1")
    arns = executions(env, "e0", "e1", "e2", "e3")
    outcomes = [sems.acquire("db", arn, "section", f"token-{i}").outcome for i, arn in enumerate(arns)]
    assert outcomes == [Outcome.GRANTED] + [Outcome.WAITING] * 3
    assert answered == ["token-0"]

    run = cli("semaphore", "set", "db", "3")

    assert run.code == 0, run.err
    assert answered == ["token-0", "token-1", "token-2"]  # in line order; e3 still waits
    assert "semaphore db: limit 1 → 3." in run.out
    assert "2 waiters granted at once:" in run.out
    granted = run.out.split("granted at once:\n", 1)[1].splitlines()[:2]
    assert granted == [f"  section  {arns[1]}", f"  section  {arns[2]}"]  # in line order
    assert "3 holding, 1 waiter in line." in run.out
    status = sems.status("db")
    assert {h.execution_arn for h in status.holders} == set(arns[:3])
    assert [w.execution_arn for w in status.waiters] == arns[3:]


def test_a_lowering_evicts_nobody_and_admits_nobody_until_fewer_hold(env, cli, sems, answered):
    cli("semaphore", "set", "db", "3")
    arns = executions(env, "e0", "e1", "e2", "e3")
    for i, arn in enumerate(arns):
        sems.acquire("db", arn, "section", f"token-{i}")

    run = cli("semaphore", "set", "db", "1", "--json")

    assert run.code == 0
    assert (run.json["limit"], run.json["frozen"], run.json["holding"], run.json["granted"]) == (
        1,
        True,
        3,
        [],
    )
    human = cli("semaphore", "set", "db", "1").out
    assert "3 hold permits, more than 1: nobody is admitted until none holds" in human
    assert "Nobody holding a permit is stopped." in human
    sems.release("db", arns[0], "section")
    sems.release("db", arns[1], "section")
    assert answered == ["token-0", "token-1", "token-2"]  # one still holds: the limit is reached
    sems.release("db", arns[2], "section")
    assert answered[-1] == "token-3"


def test_limit_zero_pauses_the_section(env, cli, sems, answered):
    cli("semaphore", "set", "db", "1")
    (arn,) = executions(env, "e0")
    run = cli("semaphore", "set", "db", "0")
    assert "Limit 0 pauses the section" in run.out
    assert sems.acquire("db", arn, "section", "token-0").outcome is Outcome.WAITING
    assert answered == []
    assert cli("semaphore", "set", "db", "1").code == 0
    assert answered == ["token-0"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("db", "-1"), "N must be 0 to"),
        (("db", "two"), "N must be a whole number"),
        (("db", "2.5"), "N must be a whole number"),
        (("db", "10001"), "N must be 0 to 10000"),
        (("a#b", "2"), "bad semaphore name"),
        (("has space", "2"), "bad semaphore name"),
        (("x" * 61, "2"), "bad semaphore name"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(env, cli, argv, message):
    run = cli("semaphore", "set", *argv)
    assert run.code == 2
    assert message in run.err
    assert table_items(env, "SLOTS#") == {} and table_items(env, "SEM") == {}


# -- status ----------------------------------------------------------------------------------------------


def test_status_shows_holders_oldest_first_and_waiters_in_line_order(env, cli, sems):
    cli("semaphore", "set", "db", "2")
    arns = executions(env, "e0", "e1", "e2", "e3", "e4")
    for i, arn in enumerate(arns):
        sems.clock.advance(1)
        sems.acquire("db", arn, "section" if i != 4 else "other", f"token-{i}")
    sems.release("db", arns[3], "section")  # left the line: not shown

    run = cli("semaphore", "status", "db", "--json")

    assert run.code == 0, run.err
    data = run.json
    assert (data["semaphore"], data["limit"], data["frozen"], data["holding"], data["free"]) == (
        "db",
        2,
        False,
        2,
        0,
    )
    assert [(h["execution_arn"], h["acquisition_id"]) for h in data["holders"]] == [
        (arns[0], "section"),
        (arns[1], "section"),
    ]
    assert set(data["holders"][0]) == {"execution_arn", "acquisition_id", "since"}
    assert [(w["execution_arn"], w["acquisition_id"]) for w in data["waiters"]] == [
        (arns[2], "section"),
        (arns[4], "other"),
    ]
    assert [w["ticket"] for w in data["waiters"]] == [3, 5]
    assert data["waiters"][0]["enqueued_at"] == FakeClock().t + 3
    assert data["max_waiters"] == 100

    human = cli("semaphore", "status", "db").out.splitlines()
    assert human[0].split() == ["semaphore", "db"]
    assert "2  (0 free)" in human[1]
    holder_lines = [line for line in human if line.startswith("  since")]
    assert [line.rsplit(" ", 1)[1] for line in holder_lines] == arns[:2]
    waiter_lines = [line for line in human if line.startswith("  #")]
    assert waiter_lines[0] == f"  #3  since {when(FakeClock().t + 3)}  section  {arns[2]}"
    assert waiter_lines[1].endswith(f"other  {arns[4]}")


def test_status_says_frozen(env, cli, sems):
    cli("semaphore", "set", "db", "2")
    for i, arn in enumerate(executions(env, "e0", "e1")):
        sems.acquire("db", arn, "section", f"token-{i}")
    cli("semaphore", "set", "db", "1")
    run = cli("semaphore", "status", "db")
    assert "FROZEN: 2 hold permits; nobody is admitted until none holds" in run.out
    assert cli("semaphore", "status", "db", "--json").json["frozen"] is True


def test_status_of_an_unknown_semaphore_exits_1(env, cli):
    run = cli("semaphore", "status", "nope")
    assert run.code == 1
    assert "no semaphore named 'nope'" in run.err and "sluice semaphore set nope N" in run.err


def test_status_without_a_name_lists_every_semaphore_and_what_the_scan_costs(env, cli, sems):
    assert cli("set-max", "3").code == 0  # the launcher's own pool is in the same table: not listed
    for name, limit in (("db", 1), ("api", 4), ("zero", 0)):
        cli("semaphore", "set", name, str(limit))
    arns = executions(env, "e0", "e1", "e2")
    for i, arn in enumerate(arns):
        sems.acquire("db", arn, "section", f"db-{i}")
    sems.acquire("api", arns[0], "section", "api-0")

    run = cli("semaphore", "status", "--json")

    assert run.code == 0, run.err
    data = run.json
    assert data["semaphores"] == [
        {"semaphore": "api", "limit": 4, "frozen": False, "holding": 1, "free": 3, "line": 0},
        {"semaphore": "db", "limit": 1, "frozen": False, "holding": 1, "free": 0, "line": 2},
        {"semaphore": "zero", "limit": 0, "frozen": False, "holding": 0, "free": 0, "line": 0},
    ]
    assert data["truncated"] is False and data["scan_pages"] == 1
    assert data["scanned_items"] == len(
        env.client("dynamodb").scan(TableName=env.settings.table_name)["Items"]
    )
    assert "Scan of the whole table" in data["cost"]

    lines = cli("semaphore", "status").out.splitlines()
    assert lines[0].split() == ["SEMAPHORE", "LIMIT", "HOLDING", "FREE", "LINE"]
    assert [line.split() for line in lines[1:4]] == [
        ["api", "4", "1", "3", "0"],
        ["db", "1", "1", "0", "2"],
        ["zero", "0", "0", "0", "0", "PAUSED"],
    ]
    assert lines[4].startswith("(listed by a Scan of the whole table: ")


def test_the_listing_stops_at_its_bound_and_says_so(env, sems):
    from sluice.ops.semaphore import semaphore_list

    rt = env.runtime()
    for i in range(5):
        sems.set_limit(f"s{i}", 1)
    full = semaphore_list(rt)
    assert [s["semaphore"] for s in full["semaphores"]] == [f"s{i}" for i in range(5)]
    cut = semaphore_list(rt, limit=2)
    assert len(cut["semaphores"]) == 2 and cut["truncated"] is True


def test_no_semaphore_yet(env, cli):
    run = cli("semaphore", "status")
    assert run.code == 0
    assert run.out.startswith("no semaphore: create one with `sluice semaphore set NAME N`")
    assert cli("semaphore", "status", "--json").json["semaphores"] == []


# -- asl -------------------------------------------------------------------------------------------------


def test_asl_prints_the_states_to_copy_without_any_aws(capsys, monkeypatch):
    clear_sluice_env(monkeypatch)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens: no call may be made
    run = sluice(
        capsys, "semaphore", "asl", "db", "--function", FUNCTION, "--timeout", "3600", "--next", "After"
    )
    assert run.code == 0, run.err
    states = run.json
    names = StateNames.of("db")
    assert list(states) == list(names)
    assert states[names.acquire]["TimeoutSeconds"] == 3600
    assert states[names.acquire]["Next"] == "CriticalSection"
    assert states[names.release]["Next"] == "After"
    assert states[names.acquire]["Parameters"]["FunctionName"] == FUNCTION
    assert "point your section's last state at 'Release db'" in run.err

    quiet = sluice(capsys, "semaphore", "asl", "db", "--function", FUNCTION, "--json")
    assert quiet.err == "" and json.loads(quiet.out)[names.release]["End"] is True


def test_asl_wraps_a_whole_definition(capsys, tmp_path, monkeypatch):
    clear_sluice_env(monkeypatch)
    path = tmp_path / "workflow.asl.json"
    path.write_text(json.dumps({"StartAt": "Work", "States": {"Work": {"Type": "Pass", "End": True}}}))
    run = sluice(capsys, "semaphore", "asl", "db", "--function", FUNCTION, "--wrap", path)
    assert run.code == 0, run.err
    wrapped = run.json
    assert wrapped["StartAt"] == "Acquire db" and check_definition(wrapped) == []
    assert wrapped["States"]["Work"]["Next"] == "Release db"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("db", "--function", FUNCTION, "--heartbeat", "60", "--timeout", "30"), "less than"),
        (("db", "--function", FUNCTION, "--section", "Acquire db"), "one the semaphore step adds"),
        (("db", "--function", FUNCTION, "--wrap", "/nonexistent.json"), "No such file"),
        (("bad name", "--function", FUNCTION), "bad semaphore name"),
    ],
)
def test_asl_bad_input_exits_2(capsys, monkeypatch, argv, message):
    clear_sluice_env(monkeypatch)
    run = sluice(capsys, "semaphore", "asl", *argv)
    assert run.code == 2 and message in run.err and run.out == ""

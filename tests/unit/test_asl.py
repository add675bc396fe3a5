"""``sluice.semaphore.asl``: the semaphore step's states, and a section wrapped between Acquire and Release.

Checked three ways: the structure itself, our own graph checks (every target exists, every way out of
the section passes a release, the section's ends lead to Release alone), and moto's Step Functions
parser, which refuses definitions it cannot parse when it is set to execute them."""

from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID

from sluice.semaphore.asl import (
    ACQUIRE_RESOURCE,
    LAMBDA_SERVICE_ERRORS,
    RELEASE_RESOURCE,
    StateNames,
    check_definition,
    default_acquisition_id,
    semaphore_states,
    targets,
    with_semaphore,
    wrap_definition,
)
from sluice.semaphore.model import BadSemaphoreName

FUNCTION = f"arn:aws:lambda:us-east-1:{DEFAULT_ACCOUNT_ID}:function:sluice-dev-semaphore"
ROLE = f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:role/workflow"
NAMES = StateNames.of("db")


def task(name: str = "work", **rest):
    return {
        "Type": "Task",
        "Resource": "arn:aws:states:::lambda:invoke",
        "Parameters": {"FunctionName": name},
        **rest,
    }


SECTION = {
    "Load": task("load", Next="Which"),
    "Which": {
        "Type": "Choice",
        "Choices": [{"Variable": "$.kind", "StringEquals": "bulk", "Next": "Fan out"}],
        "Default": "Both",
    },
    "Fan out": {
        "Type": "Map",
        "ItemsPath": "$.items",
        "ItemProcessor": {"StartAt": "One", "States": {"One": task("one", End=True)}},
        "ResultPath": "$.done",
        "Next": "Pause",
    },
    "Both": {
        "Type": "Parallel",
        "Branches": [
            {"StartAt": "A", "States": {"A": {"Type": "Pass", "End": True}}},
            {"StartAt": "B", "States": {"B": {"Type": "Succeed"}}},
        ],
        "Catch": [{"ErrorEquals": ["Custom.Error"], "Next": "Broken"}],
        "End": True,
    },
    "Pause": {"Type": "Wait", "Seconds": 1, "Next": "Store"},
    "Store": task("store", Retry=[{"ErrorEquals": ["States.ALL"], "MaxAttempts": 2}], Next="Fine"),
    "Fine": {"Type": "Succeed"},
    "Broken": {"Type": "Fail", "Error": "Custom.Broken", "Cause": "the parallel part failed"},
}


def workflow(section=SECTION, start="Load"):
    states = with_semaphore(section, start, semaphore="db", function_arn=FUNCTION, next="After")
    return {
        "StartAt": "Before",
        "States": {
            "Before": {"Type": "Pass", "Next": next(iter(states))},
            **states,
            "After": {"Type": "Pass", "End": True},
        },
    }


def section_paths(definition, section):
    """From Acquire, every state reached without passing a release: (reached, releases met)."""
    states = definition["States"]
    reached, met, todo = set(), set(), [NAMES.acquire]
    while todo:
        name = todo.pop()
        if name in (NAMES.release, NAMES.release_on_error):
            met.add(name)
            continue
        if name in reached:
            continue
        reached.add(name)
        todo += targets(states[name])
    return reached, met


def accepted_by_moto(definition) -> str:
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        sfn = boto3.client("stepfunctions", region_name="us-east-1")
        return sfn.create_state_machine(name="wrapped", definition=json.dumps(definition), roleArn=ROLE)[
            "stateMachineArn"
        ]


# -- the four states ----------------------------------------------------------------------------------


def test_acquire_waits_for_the_token_keeps_the_input_and_retries_lambda_service_errors():
    states = semaphore_states(
        semaphore="db", function_arn=FUNCTION, section="Load", timeout_seconds=3600, heartbeat_seconds=600
    )
    assert list(states) == [NAMES.acquire, NAMES.release, NAMES.release_on_error, NAMES.reraise]
    acquire = states[NAMES.acquire]
    assert acquire["Resource"] == ACQUIRE_RESOURCE
    assert acquire["Parameters"] == {
        "FunctionName": FUNCTION,
        "Payload": {
            "action": "acquire",
            "semaphore": "db",
            "acquisitionId": "Load",
            "executionArn.$": "$$.Execution.Id",
            "taskToken.$": "$$.Task.Token",
        },
    }
    assert acquire["ResultPath"] == "$.sluicePermit"  # the permit beside the input, not instead of it
    assert (acquire["TimeoutSeconds"], acquire["HeartbeatSeconds"]) == (3600, 600)
    assert acquire["Next"] == "Load"
    retry = {e: r for r in acquire["Retry"] for e in r["ErrorEquals"]}
    assert set(LAMBDA_SERVICE_ERRORS) <= set(retry)
    assert retry["Sluice.UnknownSemaphore"]["MaxAttempts"] == 0  # a missing semaphore is not retried
    first = [r["ErrorEquals"] for r in acquire["Retry"]]
    assert first.index(["Sluice.UnknownSemaphore"]) < first.index(["States.TaskFailed"])
    assert acquire["Catch"] == [
        {"ErrorEquals": ["States.ALL"], "ResultPath": "$.sluiceError", "Next": NAMES.release_on_error}
    ]


def test_both_releases_send_the_same_acquisition_and_the_error_path_reraises_the_original_error():
    states = semaphore_states(semaphore="db", function_arn=FUNCTION, section="Load", next="After")
    release, on_error, reraise = states[NAMES.release], states[NAMES.release_on_error], states[NAMES.reraise]
    payload = {
        "action": "release",
        "semaphore": "db",
        "acquisitionId": "Load",
        "executionArn.$": "$$.Execution.Id",
    }
    for state in (release, on_error):
        assert state["Resource"] == RELEASE_RESOURCE
        assert state["Parameters"] == {"FunctionName": FUNCTION, "Payload": payload}
        assert state["ResultPath"] is None  # the section's output (or its error) passes through
        assert set(LAMBDA_SERVICE_ERRORS) <= {e for r in state["Retry"] for e in r["ErrorEquals"]}
    assert release["Next"] == "After" and "End" not in release
    assert on_error["Next"] == NAMES.reraise
    assert on_error["Catch"][0]["Next"] == NAMES.reraise  # a failed release still re-raises the original
    assert on_error["Catch"][0]["ResultPath"] != "$.sluiceError"
    assert reraise == {
        "Type": "Fail",
        "Comment": reraise["Comment"],
        "ErrorPath": "$.sluiceError.Error",
        "CausePath": "$.sluiceError.Cause",
    }
    ended = semaphore_states(semaphore="db", function_arn=FUNCTION, section="Load")[NAMES.release]
    assert ended["End"] is True and "Next" not in ended


def test_an_acquisition_id_path_for_map_iterations_goes_to_both_tasks():
    expression = "States.Format('item-{}', $$.Map.Item.Index)"
    states = semaphore_states(
        semaphore="db", function_arn=FUNCTION, section="Load", acquisition_id_path=expression
    )
    for name in (NAMES.acquire, NAMES.release, NAMES.release_on_error):
        payload = states[name]["Parameters"]["Payload"]
        assert payload["acquisitionId.$"] == expression and "acquisitionId" not in payload


def test_default_acquisition_ids_are_valid_and_distinct():
    assert default_acquisition_id("Load") == "Load"
    assert default_acquisition_id("Write the report") == "Write-the-report"
    long_a, long_b = "x" * 50 + "a", "x" * 50 + "b"
    assert default_acquisition_id(long_a) != default_acquisition_id(long_b)
    assert all(len(default_acquisition_id(s)) <= 40 for s in (long_a, long_b))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"semaphore": "a b"}, "bad semaphore name"),
        ({"acquisition_id": "has space"}, "bad acquisition id"),
        ({"acquisition_id": "x", "acquisition_id_path": "$.id"}, "not both"),
        ({"acquisition_id_path": "id"}, "a path"),
        ({"timeout_seconds": 0}, "timeout_seconds"),
        ({"heartbeat_seconds": 60, "timeout_seconds": 60}, "less than"),
        ({"function_arn": ""}, "function_arn"),
        ({"label": "x" * 70}, "longer than 80"),
        ({"section": "Acquire db"}, "one the semaphore step adds"),
    ],
)
def test_bad_options_are_refused_with_a_clear_message(options, message):
    kwargs = {"semaphore": "db", "function_arn": FUNCTION, "section": "Load", **options}
    with pytest.raises(ValueError, match=message):
        semaphore_states(**kwargs)
    assert issubclass(BadSemaphoreName, ValueError)


# -- a section wrapped ---------------------------------------------------------------------------------


def test_every_end_of_the_section_goes_to_release_and_every_error_to_the_error_path():
    definition = workflow()
    states = definition["States"]
    assert check_definition(definition) == []
    reached, met = section_paths(definition, SECTION)
    assert reached == {NAMES.acquire, *SECTION}  # nothing outside the section before a release
    assert met == {NAMES.release, NAMES.release_on_error}
    for name in reached:  # no way to end the execution or leave but through a release
        assert states[name]["Type"] not in ("Succeed", "Fail") and not states[name].get("End")
    into_release = sorted(n for n, s in states.items() if NAMES.release in targets(s))
    assert into_release == ["Both", "Fine"]  # the section's two ends, and nothing else
    assert states["Fine"] == {"Type": "Pass", "Next": NAMES.release}
    assert states[NAMES.release]["Next"] == "After"
    for name in ("Load", "Fan out", "Both", "Store"):
        assert states[name]["Catch"][-1] == {
            "ErrorEquals": ["States.ALL"],
            "ResultPath": "$.sluiceError",
            "Next": NAMES.release_on_error,
        }
    assert states["Both"]["Catch"][0] == {"ErrorEquals": ["Custom.Error"], "Next": "Broken"}  # kept first
    assert states["Store"]["Retry"] == SECTION["Store"]["Retry"]
    assert states["Broken"] == {
        "Type": "Pass",
        "Result": {"Error": "Custom.Broken", "Cause": "the parallel part failed"},
        "ResultPath": "$.sluiceError",
        "Next": NAMES.release_on_error,
    }
    # Inner states of Map and Parallel end their own branch, not the section.
    assert states["Fan out"]["ItemProcessor"] == SECTION["Fan out"]["ItemProcessor"]
    assert states["Both"]["Branches"] == SECTION["Both"]["Branches"]
    assert list(states).index(NAMES.acquire) == 1  # the entry comes first in what with_semaphore returns


def test_the_users_states_are_not_changed_in_place():
    before = json.dumps(SECTION, sort_keys=True)
    workflow()
    assert json.dumps(SECTION, sort_keys=True) == before


def test_a_catch_all_of_the_user_is_kept_and_its_handler_stays_in_the_section():
    section = {
        "Work": task(Catch=[{"ErrorEquals": ["States.ALL"], "Next": "Handle"}], End=True),
        "Handle": {"Type": "Pass", "End": True},
    }
    states = with_semaphore(section, "Work", semaphore="db", function_arn=FUNCTION)
    assert states["Work"]["Catch"] == [{"ErrorEquals": ["States.ALL"], "Next": "Handle"}]
    assert states["Handle"]["Next"] == NAMES.release
    assert states[NAMES.release]["End"] is True


def test_a_fail_state_with_paths_records_them_for_the_reraise():
    section = {"Work": task(Next="No"), "No": {"Type": "Fail", "ErrorPath": "$.code", "Cause": "because"}}
    states = with_semaphore(section, "Work", semaphore="db", function_arn=FUNCTION)
    assert states["No"]["Parameters"] == {"Error.$": "$.code", "Cause": "because"}
    assert states["No"]["Next"] == NAMES.release_on_error


@pytest.mark.parametrize(
    ("section", "start", "options", "message"),
    [
        ({"Work": task(Next="Release db"), "Release db": task(End=True)}, "Work", {}, "taken in the section"),
        ({"Work": task(Next="Elsewhere")}, "Work", {}, "outside the section"),
        (
            {"Work": {"Type": "Choice", "Choices": [{"Variable": "$.x", "IsNull": True, "Next": "Out"}]}},
            "Work",
            {},
            "outside the section",
        ),
        ({"Work": task(Catch=[{"ErrorEquals": ["X"], "Next": "Out"}], End=True)}, "Work", {}, "outside"),
        ({"Work": task(End=True)}, "Nope", {}, "start_at"),
        ({"Work": task(End=True)}, "Work", {"next": "Work"}, "must come after"),
    ],
)
def test_sections_that_would_skip_the_release_or_collide_are_refused(section, start, options, message):
    with pytest.raises(ValueError, match=message):
        with_semaphore(section, start, semaphore="db", function_arn=FUNCTION, **options)


def test_a_label_lets_one_workflow_hold_the_same_semaphore_in_two_sections():
    first = with_semaphore(
        {"A": task(End=True)}, "A", semaphore="db", function_arn=FUNCTION, next="Acquire db 2"
    )
    second = with_semaphore({"B": task(End=True)}, "B", semaphore="db", function_arn=FUNCTION, label="db 2")
    assert not set(first) & set(second)
    definition = {"StartAt": "Acquire db", "States": {**first, **second}}
    assert check_definition(definition) == []
    assert first["Acquire db"]["Parameters"]["Payload"]["acquisitionId"] == "A"
    assert second["Acquire db 2"]["Parameters"]["Payload"]["acquisitionId"] == "B"
    assert accepted_by_moto(definition)


def test_wrap_definition_holds_a_whole_workflow_and_keeps_its_other_fields():
    original = {"Comment": "mine", "TimeoutSeconds": 600, "StartAt": "Load", "States": SECTION}
    wrapped = wrap_definition(original, semaphore="db", function_arn=FUNCTION, timeout_seconds=300)
    assert wrapped["StartAt"] == NAMES.acquire
    assert (wrapped["Comment"], wrapped["TimeoutSeconds"]) == ("mine", 600)
    assert wrapped["States"][NAMES.release]["End"] is True
    assert wrapped["States"][NAMES.acquire]["TimeoutSeconds"] == 300
    assert check_definition(wrapped) == []
    with pytest.raises(ValueError, match="ends after Release"):
        wrap_definition(original, semaphore="db", function_arn=FUNCTION, next="X")


# -- our checker, and moto's parser --------------------------------------------------------------------


def test_check_definition_finds_what_a_bad_splice_breaks():
    broken = {
        "StartAt": "A",
        "States": {
            "A": {"Type": "Pass", "Next": "Gone"},
            "B": {"Type": "Pass", "Next": "A", "End": True},
            "C": {"Type": "Succeed", "Next": "A"},
        },
    }
    problems = check_definition(broken)
    assert "'A' goes to 'Gone', which is not a state" in problems
    assert "'B' (Pass) needs exactly one of Next and End" in problems
    assert "'C' (Succeed) has Next or End" in problems
    assert "'B' is never reached" in problems and "'C' is never reached" in problems


def test_moto_accepts_the_wrapped_workflows():
    assert accepted_by_moto(workflow())
    assert accepted_by_moto(
        wrap_definition({"StartAt": "Load", "States": SECTION}, semaphore="db", function_arn=FUNCTION)
    )
    copied = semaphore_states(semaphore="db", function_arn=FUNCTION, section="Work", timeout_seconds=60)
    by_hand = {
        "StartAt": NAMES.acquire,
        "States": {
            **copied,
            "Work": task(
                Catch=[
                    {
                        "ErrorEquals": ["States.ALL"],
                        "ResultPath": "$.sluiceError",
                        "Next": NAMES.release_on_error,
                    }
                ],
                Next=NAMES.release,
            ),
        },
    }
    assert check_definition(by_hand) == []
    assert accepted_by_moto(by_hand)


def test_moto_parser_is_really_checking():
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError):
        accepted_by_moto({"StartAt": "A", "States": {"A": {"Type": "NoSuchType", "End": True}}})

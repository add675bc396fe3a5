"""The semaphore step as packaged and deployed: its function, rules, IAM and example workflow, and one
acquire → grant → release through the deployed handler (moto's default Step Functions, where a
CloudFormation-made state machine never runs its states and SendTaskSuccess takes any token: the test
plays the Acquire and Release tasks with the payloads the example workflow's ASL sends).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from sluice.local.embedded import ACCOUNT, UPDATE_TEMPLATE, EmbeddedAws
from sluice.local.lambdas import InvocationError
from tests.deploy.test_deploy import STACK, STAGE, _resources, _statement
from tests.support.aws import status_change_event

pytestmark = [pytest.mark.deploy, pytest.mark.filterwarnings("ignore:Tried to parse AWS::")]

EXAMPLE = f"arn:aws:states:us-east-1:{ACCOUNT}:stateMachine:sluice-{STAGE}-semaphore-example"
OTHER = f"arn:aws:states:us-east-1:{ACCOUNT}:stateMachine:orders"


@pytest.fixture(scope="session")
def package(packaged):
    return packaged(STAGE, semaphores="example=1,db=3", semaphoreStateMachineArns=OTHER)


@pytest.fixture
def deployed(package):
    with EmbeddedAws() as aws:
        deployment = aws.deploy(package, STACK)
        try:
            yield deployment
        finally:
            deployment.close()


def test_the_semaphore_function_its_rules_and_its_role(deployed):
    out = deployed.outputs
    fn = deployed.functions["semaphore"]
    assert fn.handler == "handlers/semaphore.handler"
    assert fn.environment["SLUICE_SEMAPHORES"] == "example=1,db=3"
    assert fn.environment["SLUICE_TABLE_NAME"] == out["TableName"]
    assert fn.timeout < 60  # below the delivery grace of lib/sluice/semaphore/step.py
    assert "SLUICE_SEMAPHORES" not in deployed.functions["completion"].environment
    assert out["SemaphoreExampleStateMachineArn"] == EXAMPLE and out["SemaphoreFunctionArn"] == fn.arn

    # The ends of the workflows that use semaphores go to the semaphore function, the launcher's to
    # the completion function; a state machine listed nowhere reaches neither.
    workflow = out["StateMachineArn"]
    for machine, functions in ((EXAMPLE, ["semaphore"]), (OTHER, ["semaphore"]), (workflow, ["completion"])):
        assert deployed.route(status_change_event(machine, "x", "ABORTED")) == functions
        assert deployed.route(status_change_event(machine, "x", "RUNNING")) == []
    assert deployed.route(status_change_event(OTHER.replace("orders", "else"), "x", "FAILED")) == []
    assert sorted(k for k, _ in deployed.scheduled()) == ["launcher", "semaphore"]

    tokens = _statement(deployed, "semaphore", "AnswerTaskTokens")
    assert sorted(tokens["Action"]) == ["states:SendTaskFailure", "states:SendTaskSuccess"]
    assert _resources(tokens) == [EXAMPLE, OTHER]
    describe = _statement(deployed, "semaphore", "DescribeSemaphoreHolders")
    assert describe["Action"] == ["states:DescribeExecution"]
    assert _resources(describe) == [
        f"arn:aws:states:us-east-1:{ACCOUNT}:execution:sluice-{STAGE}-semaphore-example:*",
        f"arn:aws:states:us-east-1:{ACCOUNT}:execution:orders:*",
    ]
    records = _statement(deployed, "semaphore", "SemaphoreRecords")
    assert _resources(records) == [f"arn:aws:dynamodb:us-east-1:{ACCOUNT}:table/{out['TableName']}"]
    # The launcher's and completion's roles are as they were: no task tokens, no semaphore statements.
    for function in ("launcher", "completion"):
        with pytest.raises(ValueError):
            _statement(deployed, function, "AnswerTaskTokens")


def test_the_role_may_make_every_dynamodb_request_the_semaphore_adapters_make(package):
    from tests.deploy.test_deploy import ROOT

    sources = "\n".join(
        (ROOT / f"lib/sluice/adapters/dynamo/{m}.py").read_text()
        for m in ("semaphore", "slots", "table", "codec")
    )
    needed = {"dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:PutItem", "dynamodb:BatchGetItem"}
    if '"ConditionCheck"' in sources:
        needed.add("dynamodb:ConditionCheckItem")
    if "delete_item" in sources or '"Delete"' in sources:
        needed.add("dynamodb:DeleteItem")
    assert "query(" not in sources and "scan(" not in sources
    template = json.loads((package / UPDATE_TEMPLATE).read_text())
    role = template["Resources"]["SemaphoreIamRoleLambdaExecution"]["Properties"]
    statements = [s for p in role["Policies"] for s in p["PolicyDocument"]["Statement"]]
    [records] = [s for s in statements if s.get("Sid") == "SemaphoreRecords"]
    assert set(records["Action"]) == needed


def test_the_example_workflow_acquires_runs_its_section_and_releases_on_every_path(package):
    """The example workflow (docs/concurrency.md): the Acquire and Release tasks call the deployed function with
    the payload shape the handler reads, and every failure path goes through a release."""
    template = json.loads((package / UPDATE_TEMPLATE).read_text())
    machine = template["Resources"]["SemaphoreExampleStateMachine"]["Properties"]
    pieces = machine["DefinitionString"]["Fn::Join"][1]
    asl = json.loads("".join(p if isinstance(p, str) else "FUNCTION" for p in pieces))
    states = asl["States"]
    acquire, release, on_error = states["Acquire"], states["Release"], states["ReleaseOnError"]
    assert acquire["Resource"] == "arn:aws:states:::lambda:invoke.waitForTaskToken"
    assert acquire["Parameters"]["FunctionName"] == "FUNCTION"
    assert acquire["Parameters"]["Payload"] == {
        "action": "acquire",
        "semaphore": "example",
        "acquisitionId": "section",
        "executionArn.$": "$$.Execution.Id",
        "taskToken.$": "$$.Task.Token",
    }
    for state in (release, on_error):
        assert state["Resource"] == "arn:aws:states:::lambda:invoke"
        assert state["Parameters"]["Payload"] == {
            "action": "release",
            "semaphore": "example",
            "acquisitionId": "section",
            "executionArn.$": "$$.Execution.Id",
        }
    assert acquire["Next"] == "CriticalSection" and states["CriticalSection"]["Next"] == "Release"
    for state in (acquire, states["CriticalSection"]):
        assert state["Catch"] == [
            {"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "ReleaseOnError"}
        ]
    assert on_error["Next"] == "Failed" and states["Failed"]["Type"] == "Fail"
    role = template["Resources"]["SemaphoreExampleRole"]["Properties"]["Policies"][0]["PolicyDocument"]
    assert role["Statement"][0]["Action"] == ["lambda:InvokeFunction"]
    assert role["Statement"][0]["Resource"] == {"Fn::GetAtt": ["SemaphoreLambdaFunction", "Arn"]}


def test_acquire_grant_release_and_end_through_the_deployed_function(deployed):
    sfn = deployed.aws.client("stepfunctions")
    arns = [sfn.start_execution(stateMachineArn=EXAMPLE, name=n)["executionArn"] for n in ("a", "b", "c")]

    def acquire(arn: str, token: str) -> dict:
        payload = {"action": "acquire", "semaphore": "example", "acquisitionId": "section"}
        return deployed.invoke("semaphore", {**payload, "executionArn": arn, "taskToken": token})

    def release(arn: str) -> dict:
        payload = {"action": "release", "semaphore": "example", "acquisitionId": "section"}
        return deployed.invoke("semaphore", {**payload, "executionArn": arn})

    # The configured limit (example=1) creates the semaphore on its first use.
    assert [acquire(arn, f"token-{i}")["outcome"] for i, arn in enumerate(arns)] == [
        "granted",
        "waiting",
        "waiting",
    ]
    assert release(arns[0])["released"] == "permit"  # b is granted by this release's hand-off
    assert release(arns[0])["released"] == "nothing"  # a Release task retried

    # b ends without releasing (aborted): its status-change event frees the permit, c is granted.
    _end(arns[1], "ABORTED")
    [(function, result)] = deployed.deliver(status_change_event(EXAMPLE, "b", "ABORTED"))
    assert function == "semaphore"
    assert result["released"] == [{"semaphore": "example", "acquisitionId": "section", "released": "permit"}]

    # c fails and its event is lost: the sweep frees it; it also creates "db", configured but unused.
    _end(arns[2], "FAILED")
    [(function, swept)] = deployed.tick("semaphore")
    assert swept["swept"] == {
        "db": {"freed": []},
        "example": {"freed": [{"executionArn": arns[2], "acquisitionId": "section"}]},
    }
    assert release(arns[2])["released"] == "nothing"

    with pytest.raises(InvocationError) as failed:
        deployed.invoke("semaphore", {"action": "acquire", "semaphore": "example"})
    assert failed.value.error_type == "BadSemaphoreRequest"  # what a Catch's ErrorEquals names


def _end(arn: str, status: str) -> None:
    from moto.stepfunctions.models import stepfunctions_backends

    execution = stepfunctions_backends[ACCOUNT]["us-east-1"].describe_execution(arn)
    execution.status = status
    execution.stop_date = datetime.now(UTC)

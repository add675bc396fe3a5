"""Issue 27, item 8 (the stack's parts): docs/deploy.md's lists are checked against the packaged stack.

The template osls packages is the one source: every resource, output, parameter and alarm it has is in
deploy.md's tables and every one they list is in it; the deployer's table covers every resource type,
with the actions AWS CloudFormation's own resource schemas (as cfn-lint ships them) say its create and
delete handlers call; and every IAM action the docs name is one IAM knows (cfn-lint's catalogue), so
`dynamodb:TransactWriteItems`, which is no IAM action, is named nowhere as one.
"""

from __future__ import annotations

import fnmatch
import json
import re
from functools import cache
from pathlib import Path

import cfnlint
import pytest

from sluice.local.embedded import UPDATE_TEMPLATE
from sluice.local.packaging import PackagingError
from tests.support.docs import DOCS, stack_parameters
from tests.support.docs import names as _names
from tests.support.docs import table as _table

pytestmark = pytest.mark.deploy

STAGE = "test"
STACK = f"sluice-{STAGE}"
LANE = "gpu-batch"
SCHEMAS = Path(cfnlint.__file__).parent / "data" / "schemas"
IAM_ACTIONS = Path(cfnlint.__file__).parent / "data" / "AdditionalSpecs" / "Policies.json"
# The IAM prefix of a resource type's service, where it is not the type's service name in lowercase.
PREFIXES = {"StepFunctions": "states"}


@pytest.fixture(scope="module")
def templates(packaged) -> list[dict]:
    """The default stack, and one with every optional resource: a lane and the alarm email."""
    return [
        json.loads((package / UPDATE_TEMPLATE).read_text())
        for package in (
            packaged(STAGE),
            packaged(STAGE, alarmEmail="oncall@example.com", lanes=f"{LANE}:2:1"),
        )
    ]


def _generic(name: str) -> str:
    """A logical id or name as the docs write it: the stage, the lane and a version's hash left out."""
    name = name.replace(STACK, "sluice-<stage>").replace(f"Sluice{STAGE}", "Sluice<stage>")
    name = name.replace("GpuBatch", "<Name>").replace(LANE, "<name>")
    return re.sub(r"LambdaVersion\w+$", "LambdaVersion…", name)


def test_item8_every_resource_is_in_the_resources_table_and_every_one_listed_exists(templates):
    documented = set().union(
        *(_names(row[1]) for row in _table("deploy.md", "# Deploying Sluice", "| What |"))
    )
    packaged = {_generic(logical) for template in templates for logical in template["Resources"]}
    assert sorted(packaged - documented) == [], "missing from deploy.md's resources table"
    assert sorted(documented - packaged) == [], "listed in deploy.md's resources table, not in the stack"


def test_item8_every_output_is_in_the_outputs_table_and_every_one_listed_exists(templates):
    documented = set().union(*(_names(row[0]) for row in _table("deploy.md", "### Outputs", "| Output |")))
    packaged = {_generic(output) for template in templates for output in template["Outputs"]}
    assert sorted(packaged ^ documented) == []


def test_item8_every_parameter_is_in_the_parameters_table_and_every_one_listed_exists():
    params = stack_parameters()
    documented = set().union(
        *(_names(row[0]) for row in _table("deploy.md", "## Parameters", "| Parameter |"))
    )
    assert sorted(params ^ documented) == []


def test_item8_every_alarm_is_in_the_alarms_table_and_every_one_listed_exists(templates):
    documented = set().union(*(_names(row[0]) for row in _table("deploy.md", "## Alarms", "| Alarm |")))
    packaged = {
        _generic(resource["Properties"]["AlarmName"])
        for template in templates
        for resource in template["Resources"].values()
        if resource["Type"] == "AWS::CloudWatch::Alarm"
    }
    assert sorted(packaged ^ documented) == []


@cache
def _handlers(resource_type: str) -> dict[str, list[str]]:
    """The permissions of each handler of a resource type, from its CloudFormation resource schema."""
    index = json.loads((SCHEMAS / "providers" / "us-east-1.json").read_text())
    schema = json.loads((SCHEMAS / "resources" / f"{index[resource_type]}.json").read_text())
    return {name: handler.get("permissions", []) for name, handler in schema["handlers"].items()}


def _prefix(resource_type: str) -> str:
    service = resource_type.split("::")[1]
    return PREFIXES.get(service, service.lower())


def test_item8_the_deployers_table_covers_every_resource_type_with_what_its_handlers_call(templates):
    """Each resource type is listed in the row of its service; that row names every action the type's
    delete handler calls in that service (or `sls remove` stops half-way) and the action that creates
    it; and every action the table names is an IAM action (a `*` in it matching at least one)."""
    rows = {
        row[0].strip("`"): (_names(row[1]), _names(row[2]))
        for row in _table("deploy.md", "### What the deployer needs", "| service |")
    }
    types = {resource["Type"] for template in templates for resource in template["Resources"].values()}
    for resource_type in sorted(types):
        prefix = _prefix(resource_type)
        assert prefix in rows, f"{resource_type}: no row for {prefix}"
        listed, actions = rows[prefix]
        assert resource_type in listed, f"{resource_type} is not listed in the row {prefix}"
        missing = [a for a in _own(resource_type, "delete") if not _granted(a, actions)]
        assert missing == [], f"{resource_type}: its delete handler calls {missing}"
        # The action that creates it: the first that writes, of those its create handler calls.
        [creates, *_] = [
            a for a in _own(resource_type, "create") if re.match(r"\w+:(Create|Put|Add|Publish|Set|Sub)", a)
        ]
        assert _granted(creates, actions), f"{resource_type} is created by {creates}"
    known = _iam_actions()
    for prefix, (_, actions) in rows.items():
        for action in actions:
            assert action.partition(":")[0] == prefix, f"{action} in the row {prefix}"
            assert fnmatch.filter(known, action.lower()), f"{action} is not an IAM action"


def _own(resource_type: str, handler: str) -> list[str]:
    """The actions of a resource type's handler in the type's own service."""
    prefix = _prefix(resource_type)
    return [a for a in _handlers(resource_type).get(handler, []) if a.startswith(f"{prefix}:")]


def _granted(action: str, actions: set[str]) -> bool:
    return any(fnmatch.fnmatchcase(action.lower(), granted.lower()) for granted in actions)


@cache
def _iam_actions() -> list[str]:
    catalogue = json.loads(IAM_ACTIONS.read_text())
    return sorted(
        f"{prefix}:{action}" for prefix, service in catalogue.items() for action in service["Actions"]
    )


def test_item8_every_iam_action_the_docs_name_is_one_iam_knows():
    """deploy.md once said there is no `TransactWriteItems` IAM action while operations.md granted it:
    AWS authorises a transaction per item (PutItem, UpdateItem, DeleteItem, ConditionCheckItem)."""
    known = set(_iam_actions())
    prefixes = {action.partition(":")[0] for action in known}
    unknown = []
    for doc in sorted(DOCS.glob("*.md")):
        # IAM actions are capitalised; `lambda:invoke` is a Step Functions integration, not one.
        for prefix, action in re.findall(r"`([a-z0-9-]+):([A-Z][A-Za-z*]*)`", doc.read_text()):
            if prefix in prefixes and not fnmatch.filter(known, f"{prefix}:{action}".lower()):
                unknown.append(f"{doc.name}: {prefix}:{action}")
    assert unknown == []


def _statements_documented(after: str) -> dict[str, set[str]]:
    """An IAM table of deploy.md: statement → its actions (`PutItem` after `dynamodb:GetItem` is
    `dynamodb:PutItem`)."""
    found = {}
    for row in _table("deploy.md", after, "| Statement |"):
        prefix, actions = "", set()
        for name in re.findall(r"`([^`]+)`", row[1]):
            prefix = name.partition(":")[0] if ":" in name else prefix
            actions.add(name if ":" in name else f"{prefix}:{name}")
        found[row[0].strip("`")] = actions
    return found


def _statements_packaged(template: dict, role: str) -> dict[str, set[str]]:
    """A function role's statements: Sid (osls' own log statement: "logs") → its actions."""
    found = {}
    for policy in template["Resources"][role]["Properties"]["Policies"]:
        for statement in policy["PolicyDocument"]["Statement"]:
            actions = statement["Action"]
            found[statement.get("Sid", "logs")] = {actions} if isinstance(actions, str) else set(actions)
    return found


@pytest.mark.parametrize(
    ("after", "roles"),
    [
        ("## IAM", ("LauncherIamRoleLambdaExecution", "CompletionIamRoleLambdaExecution")),
        ("### Semaphore function IAM", ("SemaphoreIamRoleLambdaExecution",)),
    ],
)
def test_item8_the_functions_iam_tables_are_their_roles_statements(templates, after, roles):
    documented = _statements_documented(after)
    for role in roles:
        assert _statements_packaged(templates[0], role) == documented, role


def test_item8_an_await_horizon_past_the_records_retention_is_refused_at_packaging(packaged):
    """deploy.md: keep awaitHorizon under retentionDays, an awaited key's record must outlive the wait."""
    with pytest.raises(
        PackagingError, match=re.escape("awaitHorizon (172800 s) must be under retentionDays")
    ):
        packaged(STAGE, retentionDays="1", awaitHorizon="172800")

"""Issue 27, item 7: alarms that reach someone.

The stack creates an SNS topic unless ``alarmTopicArn`` names one, ``alarmEmail`` subscribes an
address to it, every alarm notifies it, every function has alarms on its errors, throttles and
duration near its timeout, the dashboard is always deployed, and every alarm has its runbook entry
in docs/operations.md. Read from the packaged template (moto creates no alarm) and, where moto can,
from the stack deployed into it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sluice.local.embedded import ACCOUNT, UPDATE_TEMPLATE, EmbeddedAws
from sluice.local.packaging import PackagingError

pytestmark = [pytest.mark.deploy, pytest.mark.filterwarnings("ignore:Tried to parse AWS::")]

STAGE = "test"
STACK = f"sluice-{STAGE}"
ROOT = Path(__file__).resolve().parents[2]
EMAIL = "oncall@example.com"
TOPIC = f"arn:aws:sns:us-east-1:{ACCOUNT}:paging"
# Every alarm notifies the stack's topic, or the one alarmTopicArn names.
ACTIONS = [{"Fn::If": ["CreateAlarmTopic", {"Ref": "AlarmTopic"}, {"Ref": "AlarmTopicArn"}]}]
# Each function's timeout (serverless.yml) and its duration alarm's threshold, in ms: the launcher
# works until 15 s before its timeout and then hands back, so it alarms within 5 s of it; the others
# at 90% of theirs.
DURATION_ALARMS = {"launcher": (120, 115_000), "completion": (60, 54_000), "semaphore": (30, 27_000)}


def _template(package: Path) -> dict:
    return json.loads((package / UPDATE_TEMPLATE).read_text())


def _alarms(template: dict) -> dict[str, dict]:
    return {
        logical: resource["Properties"]
        for logical, resource in template["Resources"].items()
        if resource["Type"] == "AWS::CloudWatch::Alarm"
    }


@pytest.fixture(scope="module")
def package(packaged):
    return packaged(STAGE)


@pytest.fixture(scope="module")
def email_package(packaged):
    return packaged(STAGE, alarmEmail=EMAIL, lanes="gpu-batch:2:1")


def test_item7_the_stack_creates_a_topic_that_every_alarm_notifies(package):
    template = _template(package)
    topic = template["Resources"]["AlarmTopic"]
    assert topic["Type"] == "AWS::SNS::Topic" and topic["Condition"] == "CreateAlarmTopic"
    assert topic["Properties"]["TopicName"] == f"{STACK}-alarms"
    assert template["Conditions"]["CreateAlarmTopic"] == {"Fn::Equals": [{"Ref": "AlarmTopicArn"}, ""]}
    alarms = _alarms(template)
    assert len(alarms) >= 12
    for logical, alarm in alarms.items():
        assert alarm["AlarmActions"] == ACTIONS, logical
        assert alarm["OKActions"] == ACTIONS, logical
    assert template["Outputs"]["AlarmTopicArn"]["Value"] == ACTIONS[0]
    assert "AlarmEmailSubscription" not in template["Resources"]

    with EmbeddedAws() as aws:
        deployed = aws.deploy(package, STACK)
        topics = [t["TopicArn"] for t in aws.client("sns").list_topics()["Topics"]]
        assert topics == [f"arn:aws:sns:us-east-1:{ACCOUNT}:{STACK}-alarms"]
        assert deployed.outputs["AlarmTopicArn"] == topics[0]


def test_item7_alarm_email_subscribes_the_address_to_the_stacks_topic(email_package):
    template = _template(email_package)
    subscription = template["Resources"]["AlarmEmailSubscription"]
    assert subscription == {
        "Type": "AWS::SNS::Subscription",
        "Condition": "CreateAlarmTopic",
        "Properties": {"Protocol": "email", "Endpoint": EMAIL, "TopicArn": {"Ref": "AlarmTopic"}},
    }
    # moto creates the topic but no AWS::SNS::Subscription: it lists it among what it skipped.
    with EmbeddedAws() as aws:
        deployed = aws.deploy(email_package, STACK)
        assert deployed.outputs["AlarmTopicArn"].endswith(f":{STACK}-alarms")
        assert [u for u in deployed.unsupported if "SNS" in u] == [
            "AlarmEmailSubscription (AWS::SNS::Subscription)"
        ]


def test_item7_an_existing_topic_is_notified_instead_and_none_is_created(packaged):
    package = packaged(STAGE, alarmTopicArn=TOPIC)
    with EmbeddedAws() as aws:
        deployed = aws.deploy(package, STACK)
        assert aws.client("sns").list_topics()["Topics"] == []
        assert deployed.outputs["AlarmTopicArn"] == TOPIC


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"alarmEmail": "not-an-address"},
            'alarmEmail must be empty or one email address, got "not-an-address"',
        ),
        (
            {"alarmEmail": EMAIL, "alarmTopicArn": TOPIC},
            "alarmEmail subscribes to the topic the stack creates: with alarmTopicArn",
        ),
    ],
)
def test_item7_a_bad_alarm_email_is_refused_before_packaging(packaged, params, message):
    with pytest.raises(PackagingError, match=re.escape(message)):
        packaged(STAGE, **params)


def test_item7_every_function_alarms_on_its_errors_throttles_and_duration_near_its_timeout(package):
    template = _template(package)
    resources = template["Resources"]
    functions = {
        logical.removesuffix("LambdaFunction").lower(): logical
        for logical, resource in resources.items()
        if resource["Type"] == "AWS::Lambda::Function"
    }
    assert set(functions) == set(DURATION_ALARMS)
    alarms = _alarms(template)
    for name, logical in functions.items():
        timeout, threshold = DURATION_ALARMS[name]
        assert resources[logical]["Properties"]["Timeout"] == timeout
        on_function = {
            alarm["MetricName"]: alarm
            for alarm in alarms.values()
            if alarm["Namespace"] == "AWS/Lambda"
            and alarm["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": logical}}]
        }
        assert set(on_function) == {"Errors", "Throttles", "Duration"}, name
        for metric, alarm in on_function.items():
            assert alarm["AlarmName"] == f"{STACK}-{name}-{metric.lower()}"
            assert alarm["ComparisonOperator"] == "GreaterThanThreshold"
            assert alarm["TreatMissingData"] == "notBreaching"
        assert on_function["Errors"]["Statistic"] == on_function["Throttles"]["Statistic"] == "Sum"
        assert on_function["Errors"]["Threshold"] == on_function["Throttles"]["Threshold"] == 0
        duration = on_function["Duration"]
        assert (duration["Statistic"], duration["Threshold"]) == ("Maximum", threshold)
        assert duration["Threshold"] < timeout * 1000


def test_item7_the_dashboard_is_deployed_without_lanes_and_draws_the_functions(package):
    template = _template(package)
    [dashboard] = [r for r in template["Resources"].values() if r["Type"] == "AWS::CloudWatch::Dashboard"]
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    drawn = re.findall(rf'\\"AWS/Lambda\\",\\"(\w+)\\",\\"FunctionName\\",\\"{STACK}-([a-z]+)\\"', body)
    assert sorted(drawn) == sorted(
        (metric, function)
        for metric in ("Errors", "Throttles", "Duration")
        for function in ("launcher", "completion", "semaphore")
    )
    # The lanes' own metrics are drawn only with lanes: without them nothing emits them.
    assert "LaneRunning" not in body
    with EmbeddedAws() as aws:
        deployed = aws.deploy(package, STACK)
        assert not [u for u in deployed.unsupported if "Dashboard" in u]
        assert [
            d["DashboardName"] for d in aws.client("cloudwatch").list_dashboards()["DashboardEntries"]
        ] == [STACK]


def _runbook() -> dict[str, str]:
    """The entries of docs/operations.md's "Alarms" section: alarm name → its text."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("\n## Alarms\n", 1)[1].split("\n## ", 1)[0]
    entries = re.split(r"^### `([^`]+)`\n", section, flags=re.M)
    return dict(zip(entries[1::2], entries[2::2], strict=True))


def test_item7_every_alarm_has_a_runbook_entry_that_says_what_to_look_at_with_sluice(package, email_package):
    """One entry per alarm of the stack (a lane's under its lane name <name>): what fired, what to
    look at with `sluice`, what to do; and no entry for an alarm the stack does not have."""
    runbook = _runbook()
    names = set()
    for template in (_template(package), _template(email_package)):
        for alarm in _alarms(template).values():
            names.add(alarm["AlarmName"].replace(STACK, "sluice-<stage>").replace("gpu-batch", "<name>"))
    assert sorted(names) == sorted(runbook)
    for name, entry in runbook.items():
        assert re.search(r"^\*[^*]+\*$", entry, flags=re.M), f"{name}: what fired, in italics, first"
        assert re.search(r"`sluice [a-z]", entry), f"{name}: what to look at with sluice"

"""A new version deployed over a running stage, and the previous one deployed back over it.

Each case packages a previous commit of this project (``packaged(..., commit=...)``: ``git archive``
into the run's cache, packaged with osls as the current tree is, with the current ``node_modules``,
which holds the npm packages of the commit's ``package-lock.json`` while that file is unchanged) and
the current tree, both with the same parameters. One version is deployed into the embedded moto server
and left with executions running, a payload queued and payloads parked in each of the table's
waiting places: a deferred duplicate (``PARK#``), a payload awaiting a running key (``WAIT#``) and
one waiting in its concurrency key's line (``KWAIT#``). The other version is then deployed over the
same stack (``sls deploy``'s update: same table, queues and names, new code), and its functions run
from then on (``side by side``: both versions' launchers and completions in turn, as during the
deploy). Every execution is ended in turn and its status event delivered, with a tick after each.

Asserted from AWS's side: MAX is never passed and no key runs twice at once (ListExecutions after
every invocation), every message starts exactly one execution, named from its own message id by
either version (the deferred duplicate's too), nothing is dead-lettered or left in the queue or the
table's waiting places, and every slot is free again (a tick then starts MAX new payloads at once).

Each version also does the same work alone, and the records it leaves are compared by kind and
attribute name: they may differ only as the case says (``Upgrade.layout``). So a change of layout on
these paths fails here until it is named.

Adding a case: a change that alters what the table, the queues or the stack's names hold (a record's
key or attribute, a message attribute, a resource's name) appends an ``Upgrade`` to ``UPGRADES`` naming
the commit just before it and what changed, names the change in the earlier cases' ``layout``, and
docs/upgrade.md says whether a stage must drain.

moto deploys the update in place (UpdateStack with the new template; the table and the queues are
kept); the functions run from the code the template names, as in the other deploy tests.
"""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sluice.adapters.dynamo.store import DynamoStore
from sluice.core.names import execution_name, named_entry
from sluice.local.embedded import EmbeddedAws
from tests.support.aws import status_change_event

pytestmark = [pytest.mark.deploy, pytest.mark.slow, pytest.mark.filterwarnings("ignore:Tried to parse AWS::")]

ROOT = Path(__file__).resolve().parents[2]
STAGE = "upgrade"
STACK = f"sluice-{STAGE}"
MAX = 4
# defer: a duplicate parks in the table; lingerSeconds 0: a tick returns when it finds nothing to do.
PARAMS = {"maxConcurrency": str(MAX), "lingerSeconds": "0", "duplicatePolicy": "defer"}
# What docs/upgrade.md's drain counts: payloads in a key's line, deferred duplicates and waiters not
# yet sent back.
PARKED = (
    "begins_with(pk, :k) OR (begins_with(pk, :p) AND attribute_not_exists(woken_at)) "
    "OR (begins_with(pk, :w) AND attribute_not_exists(released_at))"
)
PARKED_VALUES = '{":k":{"S":"KWAIT#"},":p":{"S":"PARK#"},":w":{"S":"WAIT#"}}'


@dataclass(frozen=True)
class Upgrade:
    previous: str  # a commit of main's history: the version a stage runs before the deploy
    changes: str  # what the table, the queues and the names hold differently since then
    # The record attributes ("KIND.attribute") the same work leaves on one version's table and not on
    # the other's (test_the_records_differ_only_as_the_case_says).
    layout: frozenset[str] = frozenset()


UPGRADES = (
    Upgrade(
        # Tag baseline-green. Advance it to the commit before the next change of layout or names.
        previous="9d81abe6729e20b964742deaa4be92942843ff53",
        changes=(
            "PAYLOAD#<key> gains redriven_more and once_unknown (written only in rare cases, read as "
            "absent by the previous version); SIGHT#<message id> is new (under the suppress policy "
            "only, cleanup by TTL, never read by the previous version); the stack gains an alarm "
            "topic, function alarms and a dashboard; PARK#<message id> gains copy_id (the SQS message "
            "id of the copy parked, ignored by the previous version; an item without it is parked "
            "over by any copy) and is written as PARK#name <execution name>, the entry the holder's parked "
            "set holds, through which both versions read and wake it; EXEC#<name> gains copy_id (the "
            "SQS message id of the copy that claimed or renewed last, ignored by the previous version; "
            "a claim without it has its start mark lifted by any copy) and a claim is written with its "
            "start mark starting_at, which refuses a block of either version as the previous "
            "version's own mark does; no other record key, attribute meaning, message attribute or "
            "resource name changed"
        ),
        layout=frozenset({"PARK#.copy_id", "EXEC#.copy_id"}),
    ),
)


@pytest.fixture(scope="module", params=UPGRADES, ids=lambda u: u.previous[:8])
def versions(request, packaged) -> tuple[Upgrade, Path, Path]:
    """(the case, the previous commit's package, this tree's package)."""
    upgrade: Upgrade = request.param
    return upgrade, packaged(STAGE, commit=upgrade.previous, **PARAMS), packaged(STAGE, **PARAMS)


# upgrade: the previous version leaves the work, this one finishes it; rollback: the other way round;
# side by side: during the deploy, invocations already running finish on the code they started with
# and CloudFormation replaces one function after the other, so either version's launcher may tick
# while either version's completion takes the status events: both pairings, in turn.
DIRECTIONS = ("upgrade", "rollback", "side by side")


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_a_version_deployed_over_a_running_stage_finishes_its_work(versions, direction):
    upgrade, previous, current = versions
    first, second = (current, previous) if direction == "rollback" else (previous, current)
    with EmbeddedAws() as aws:
        before = aws.deploy(first, STACK)
        stage = Stage(aws, before.outputs)
        sent = stage.leave_work(before)
        if direction != "side by side":
            before.close()  # from now on only the version deployed last runs
        after = aws.deploy(second, STACK)
        assert after.functions["launcher"].code != before.functions["launcher"].code
        # The queue, the table and the state machine are the stack's: the update keeps them.
        kept = ("QueueUrl", "DlqUrl", "TableName", "StateMachineArn", "MaxConcurrencyParameter")
        assert [after.outputs[k] for k in kept] == [before.outputs[k] for k in kept], upgrade.changes
        assert stage.table_items().keys() >= stage.left_in_table
        if direction == "side by side":
            stage.finish(events=(after, before), ticks=(before, after))
        else:
            stage.finish(events=(after,), ticks=(after,))

        started = stage.started()
        # Each version names a message's execution as the other does: every message ran once, under
        # the name of its own message id (the deferred duplicate too: it came back from the table).
        assert set(started) == {execution_name(key, message_id) for key, message_id in sent}
        assert Counter(stage.key_of(n) for n in started) == Counter(key for key, _ in sent)
        # What waited for another run started after that run ended.
        assert started[stage.named("after-run-2")][0] >= started[stage.named("run-2")][1]
        assert started[stage.named("acme-2")][0] >= started[stage.named("acme-1")][1]
        assert stage.depth(after.outputs["QueueUrl"]) == 0
        assert stage.depth(after.outputs["DlqUrl"]) == 0
        stage.assert_nothing_parked()
        assert stage.store.ledger().holders == frozenset()
        # Every slot is usable again: one tick of the version deployed last starts MAX new payloads.
        for i in range(MAX):
            stage.send(f"fresh-{i}")
        stage.invoke(after, "tick")
        assert len(stage.running()) == MAX


def test_the_docs_name_each_case_and_count_what_this_test_parks():
    doc = re.sub(r"\s*\\\n\s*", " ", (ROOT / "docs" / "upgrade.md").read_text())
    for upgrade in UPGRADES:
        assert f"({upgrade.previous[:7]})" in doc, "docs/upgrade.md has no row for this case"
    assert f'--filter-expression "{PARKED}"' in doc
    assert f"--expression-attribute-values '{PARKED_VALUES}'" in doc


def test_the_records_differ_only_as_the_case_says(versions):
    """Each version alone through the same work, left and then finished: the records it wrote, by kind
    and attribute name. A change of layout on these paths fails here until the case names it, and a
    case from the commit before it is added."""
    upgrade, previous, current = versions
    layouts = []
    for package in (previous, current):
        with EmbeddedAws() as aws:
            deployment = aws.deploy(package, STACK)
            stage = Stage(aws, deployment.outputs)
            stage.leave_work(deployment)
            left = stage.layout()
            stage.finish(events=(deployment,), ticks=(deployment,))
            layouts.append(left | stage.layout())
    assert layouts[0] ^ layouts[1] == upgrade.layout, upgrade.changes


class Stage:
    """The deployed stage as producers, EventBridge and Step Functions see it."""

    def __init__(self, aws: EmbeddedAws, outputs: dict[str, str]) -> None:
        self.aws, self.out = aws, outputs
        self.sqs, self.sfn = aws.client("sqs"), aws.client("stepfunctions")
        self.ddb = aws.client("dynamodb")
        self.store = DynamoStore(self.ddb, outputs["TableName"])
        self.machine = outputs["StateMachineArn"]
        self.left_in_table: set[str] = set()

    def leave_work(self, deployment) -> list[tuple[str, str]]:
        """Executions running (MAX), one payload queued and one in each waiting place of the table."""
        sent = [self.send("run-1"), self.send("run-2"), self.send("acme-1", ckey="acme")]
        self.invoke(deployment, "tick")
        assert len(self.running()) == 3
        duplicate = self.send("run-1")  # its key runs: parked behind run-1 (defer)
        sent += [duplicate, self.send("after-run-2", awaits=["run-2"]), self.send("acme-2", ckey="acme")]
        self.invoke(deployment, "tick")
        assert len(self.running()) == 3  # all three parked, none started
        sent += [self.send("queued-1"), self.send("queued-2")]
        self.invoke(deployment, "tick")
        assert len(self.running()) == MAX and self.depth(self.out["QueueUrl"]) == 1
        items = self.table_items()
        # A deferred duplicate's item: by its message id (the previous version), or by its name.
        (park,) = {f"PARK#{duplicate[1]}", f"PARK#{named_entry(*duplicate)}"} & items.keys()
        self.left_in_table = {
            park,
            f"WAIT#{sent[4][1]}",
            *(pk for pk in items if pk.startswith("KWAIT#acme#")),
        }
        assert len(self.left_in_table) == 3, sorted(items)
        assert self.parked() == 3
        return sent

    def finish(self, *, events: tuple, ticks: tuple) -> None:
        """End the oldest running execution, deliver its event, tick; until nothing runs or waits.
        Round i delivers to ``events[i % len(events)]``'s completion and ticks ``ticks[i % ...]``."""
        for i in range(40):
            completion, launcher = events[i % len(events)], ticks[i % len(ticks)]
            running = self.running()
            if not running:
                self.invoke(launcher, "tick")
                if not self.running():
                    return
                continue
            oldest = min(running, key=lambda e: e["startDate"])
            self.end(oldest["name"])
            self.invoke(completion, status_change_event(self.machine, oldest["name"], "SUCCEEDED"))
            self.invoke(launcher, "tick")
        raise AssertionError("the stage did not drain in 40 rounds")

    # -- producers and EventBridge ---------------------------------------------------------------

    def send(self, key: str, *, ckey: str = "", awaits: list[str] | None = None) -> tuple[str, str]:
        attributes = {}
        if ckey:
            attributes["sluice-concurrency-key"] = {"DataType": "String", "StringValue": ckey}
        if awaits:
            attributes["sluice-awaits"] = {"DataType": "String", "StringValue": json.dumps(awaits)}
        message_id = self.sqs.send_message(
            QueueUrl=self.out["QueueUrl"],
            MessageBody=json.dumps({"id": key}),
            MessageGroupId=key,
            MessageDeduplicationId=uuid.uuid4().hex,
            MessageAttributes=attributes,
        )["MessageId"]
        return key, message_id

    def invoke(self, deployment, event) -> None:
        """A schedule tick (``"tick"``) or a status event, then the promises checked from outside."""
        if event == "tick":
            assert [f for f, _ in deployment.tick("launcher")] == ["launcher"]
        else:
            assert [f for f, _ in deployment.deliver(event)] == ["completion"]
        running = self.running()
        assert len(running) <= MAX, [e["name"] for e in running]
        keys = [self.key_of(e["name"]) for e in running]
        assert len(keys) == len(set(keys)), keys  # one run per payload key
        assert sum(k.startswith("acme-") for k in keys) <= 1  # acme's cap (keyConcurrency 1)

    # -- Step Functions --------------------------------------------------------------------------

    def running(self) -> list[dict]:
        pages = self.sfn.get_paginator("list_executions").paginate(
            stateMachineArn=self.machine, statusFilter="RUNNING"
        )
        return [e for page in pages for e in page["executions"]]

    def started(self) -> dict[str, tuple[datetime, datetime]]:
        """Every execution's name: (started, stopped)."""
        pages = self.sfn.get_paginator("list_executions").paginate(stateMachineArn=self.machine)
        return {
            e["name"]: (e["startDate"], e.get("stopDate") or datetime.max.replace(tzinfo=UTC))
            for page in pages
            for e in page["executions"]
        }

    def named(self, key: str) -> str:
        [name] = [n for n in self.started() if self.key_of(n) == key]
        return name

    def key_of(self, name: str) -> str:
        arn = self.machine.replace(":stateMachine:", ":execution:") + f":{name}"
        return json.loads(self.sfn.describe_execution(executionArn=arn)["input"])["id"]

    def end(self, name: str) -> None:
        """Step Functions ends it (the CloudFormation-created machine never runs its states in moto)."""
        from moto.stepfunctions.models import stepfunctions_backends

        account, region = self.machine.split(":")[4], self.machine.split(":")[3]
        arn = self.machine.replace(":stateMachine:", ":execution:") + f":{name}"
        execution = stepfunctions_backends[account][region].describe_execution(arn)
        execution.status = "SUCCEEDED"
        execution.stop_date = datetime.now(UTC)

    # -- what is left ----------------------------------------------------------------------------

    def depth(self, url: str) -> int:
        attrs = self.sqs.get_queue_attributes(
            QueueUrl=url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return sum(int(v) for v in attrs.values())

    def table_items(self) -> dict[str, dict]:
        pages = self.ddb.get_paginator("scan").paginate(TableName=self.out["TableName"])
        return {i["pk"]["S"]: i for page in pages for i in page["Items"]}

    def layout(self) -> frozenset[str]:
        """Every attribute of every item as "KIND.attribute", KIND its key without the last part
        (``PAYLOAD#run-1`` is ``PAYLOAD#``, ``SLOTS#launcher#0`` is ``SLOTS#launcher#``)."""
        return frozenset(
            f"{re.sub(r'#[^#]*$', '#', pk)}.{name}"
            for pk, item in self.table_items().items()
            for name in item
        )

    def parked(self) -> int:
        """docs/upgrade.md's count of what is parked, as the AWS CLI pages it."""
        pages = self.ddb.get_paginator("scan").paginate(
            TableName=self.out["TableName"],
            Select="COUNT",
            FilterExpression=PARKED,
            ExpressionAttributeValues=json.loads(PARKED_VALUES),
        )
        return sum(page["Count"] for page in pages)

    def assert_nothing_parked(self) -> None:
        assert self.parked() == 0
        items = self.table_items()
        waiting = {pk for pk in items if pk.startswith("KWAIT#")}
        waiting |= {pk for pk in items if pk.startswith("PARK#") and "woken_at" not in items[pk]}
        waiting |= {pk for pk in items if pk.startswith("WAIT#") and "released_at" not in items[pk]}
        for pk, field in (("PARKED", "holders"), ("AWAITING", "waiters"), ("KEYS_WAITING", "keys")):
            if items.get(pk, {}).get(field, {}).get("SS"):
                waiting.add(f"{pk}.{field}")
        assert waiting == set(), sorted(waiting)
        assert "holders" not in items.get("CKEY#acme", {}) or not items["CKEY#acme"]["holders"].get("SS")

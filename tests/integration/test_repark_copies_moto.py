"""A woken message parked again behind its holder's name claimed again (an independent attack on
``duplicatePolicy: defer``): each copy a wake-up re-sends is told apart by its own SQS message id.

H, the holder, is claimed by message A, rolled back (its StartExecution refused for sure) and claimed
again by A's redelivery, carrying the messages parked behind the first claim (``_carry_parked``).
Told apart by their origin id alone (the broken variant ``copies_by_origin``), copies of m were lost
two ways::

    waker W (H rolled back)                 launcher L3
    re-send m (copy c2)
                                            A claims H again; c2 refused by H: park m behind H
                                            PARK#m unwoken behind H: "parked already", c2 deleted
    PARK#m woken, parked −= m               → m on no queue, marked woken: never started

    wake-up of the first claim: re-send m, dedup id (m, H)
                                            c2 parked behind the second claim of H; H ends
    wake-up of the second: re-send m, dedup id (m, H) again, within 5 minutes
                                            → SQS accepts the send and never delivers it
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import Claim, ClaimFence, Ending, PayloadState
from sluice.core.names import ORIGIN_ATTRIBUTE, execution_name, named_entry
from sluice.launch.completion import complete
from sluice.launch.settings import DuplicatePolicy
from tests.explorer.variants import applied
from tests.support.aws import build_stack
from tests.support.sqs_dedup import SqsDedup, sqs_dedup

VARIANTS = [None, "copies_by_origin"]


def _applied(variant: str | None) -> AbstractContextManager[None]:
    return applied(variant) if variant else nullcontext()


class Scene:
    """A claimed by W's launcher as H (what ``MessageProtocol._claim`` writes), m parked behind H;
    SQS deduplicates as it does (``sqs_dedup``: an id remembered 5 minutes, its message deleted or not)."""

    def __init__(self, session: Any, dedup: SqsDedup) -> None:
        self.dedup = dedup
        self.clock = FakeClock()
        self.stack = stack = build_stack(session, clock=self.clock, duplicate_policy=DuplicatePolicy.DEFER)
        stack.launcher().tick()  # the slot pool
        waker = stack.runtime()
        self.store, self.queue, self.ddb = waker.store(), waker.queue(), waker.client("dynamodb")
        a_id = stack.send({"id": "k1", "n": 1}, group="gA")
        got = stack.client("sqs").receive_message(QueueUrl=stack.settings.queue_url, MaxNumberOfMessages=1)
        assert got["Messages"][0]["MessageId"] == a_id
        self.receipt_a = got["Messages"][0]["ReceiptHandle"]
        self.holder = execution_name("k1", a_id)
        now = self.clock.now()
        arn = waker.executions().arn_for(self.holder)
        self.store.claim(
            Claim(key="k1", name=self.holder, message_id=a_id, now=now, claim_expires_at=now + 600, arn=arn)
        )
        self.m_id = stack.send({"id": "k1", "n": 2}, group="gM")
        assert stack.launcher().tick().outcomes == {"deferred": 1}
        self.sends: list[str] = []
        waker.client("sqs").meta.events.register(
            "provide-client-params.sqs.SendMessage",
            lambda params, **_: self.sends.append(params["MessageDeduplicationId"]),
        )

    def park_item(self) -> dict[str, Any]:
        return self.ddb.get_item(
            TableName=self.stack.settings.table_name,
            Key={"pk": {"S": f"PARK#{self.m_entry}"}},
            ConsistentRead=True,
        )["Item"]

    def release(self, state: PayloadState, error: str | None = None, **more: Any) -> None:
        """H released by W's launcher (its completion's code), which wakes what waits for it."""
        ending = Ending(state, self.clock.now(), error=error)
        complete(store=self.store, queue=self.queue, name=self.holder, ending=ending, **more)

    def roll_back(self) -> None:
        """W's rollback of H (``MessageBranches._rollback``): H released, m woken."""
        self.release(PayloadState.RELEASED, error="StartExecution refused", fence=ClaimFence(0))

    def claim_again(self) -> dict[str, int]:
        """A back on the queue: L3 claims H again and starts it; the copy of m parks behind it."""
        self.stack.visible_again([self.receipt_a])
        return self.stack.launcher().tick().outcomes

    def end_and_settle(self) -> dict[str, str]:
        """H ends; its completion (W's launcher's, so its sends are counted) wakes what waits for it."""
        self.stack.finish(self.holder)
        self.clock.advance(60)
        self.release(PayloadState.SUCCEEDED)
        for _ in range(3):
            self.clock.advance(60)
            self.stack.launcher().tick()
        return {e["name"]: e["status"] for e in self.stack.executions()}

    @property
    def m_name(self) -> str:
        return execution_name("k1", self.m_id)

    @property
    def m_entry(self) -> str:
        return named_entry("k1", self.m_id)


@pytest.fixture
def scene(session: Any) -> Iterator[Scene]:
    with sqs_dedup(session) as dedup:
        yield Scene(session, dedup)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_copy_parked_again_while_its_wake_up_is_on_its_way_runs(scene: Scene, variant: str | None) -> None:
    fired: list[dict[str, Any]] = []

    def before_the_woken_mark(params: dict[str, Any], **_: Any) -> None:
        writes = [i.get("Update", {}) for i in params.get("TransactItems", [])]
        marks = [u for u in writes if u.get("Key", {}).get("pk", {}).get("S") == f"PARK#{scene.m_entry}"]
        if not fired and marks and "woken_at" in marks[0].get("UpdateExpression", ""):
            fired.append({"queue": scene.stack.queue_counts(), "outcomes": scene.claim_again()})

    scene.ddb.meta.events.register(
        "before-parameter-build.dynamodb.TransactWriteItems", before_the_woken_mark
    )
    with _applied(variant):
        scene.roll_back()
        names = scene.end_and_settle()
    assert len(fired) == 1 and fired[0]["queue"][0] == 1  # the fault fired: the copy was on the queue
    assert fired[0]["outcomes"] == {"started": 1, "deferred": 1}  # H claimed again, the copy parked
    assert names[scene.holder] == "SUCCEEDED"
    if variant is None:
        assert scene.m_name in names, "the deferred duplicate never started"
    else:
        assert scene.m_name not in names and scene.stack.queue_counts() == (0, 0)
        assert "woken_at" in scene.park_item()  # marked woken, its copy deleted as "parked already"


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_second_wake_up_behind_a_name_claimed_again_is_not_deduplicated(
    scene: Scene, variant: str | None
) -> None:
    with _applied(variant):
        scene.roll_back()
        assert scene.stack.queue_counts()[0] == 1 and "woken_at" in scene.park_item()
        assert scene.claim_again() == {"started": 1, "deferred": 1}
        assert "woken_at" not in scene.park_item()  # the copy parked behind the second claim
        names = scene.end_and_settle()  # its release wakes the copy within 5 minutes of the first send
    assert len(scene.sends) == 2
    if variant is None:
        assert scene.sends[0] != scene.sends[1] and not scene.dedup.dropped  # another copy: another id
        assert scene.m_name in names, "the deferred duplicate never started"
    else:
        assert scene.sends[0] == scene.sends[1]  # the same id within 5 minutes:
        assert [d for _, _, d in scene.dedup.dropped] == [scene.sends[1]]  # the fault: SQS drops it
        assert scene.m_name not in names and scene.stack.queue_counts() == (0, 0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_wake_up_that_dies_before_its_mark_then_a_claim_again_loses_nothing(
    scene: Scene, variant: str | None
) -> None:
    crashed: list[int] = []

    def die_before_the_mark(params: dict[str, Any], **_: Any) -> None:
        keys = [
            i.get("Update", {}).get("Key", {}).get("pk", {}).get("S") for i in params.get("TransactItems", [])
        ]
        if not crashed and f"PARK#{scene.m_entry}" in keys:
            crashed.append(1)
            raise ConnectionError("the waker dies after its re-send, before its mark")

    scene.ddb.meta.events.register("before-parameter-build.dynamodb.TransactWriteItems", die_before_the_mark)
    with _applied(variant):
        with pytest.raises(ConnectionError):
            scene.roll_back()
        assert crashed == [1] and scene.stack.queue_counts()[0] == 1
        assert scene.claim_again() == {"started": 1, "deferred": 1}
        names = scene.end_and_settle()
    if variant is None:
        assert scene.m_name in names, "the deferred duplicate never started"
    else:
        assert scene.m_name not in names and scene.stack.queue_counts() == (0, 0)


def test_an_item_the_previous_version_parked_is_woken_past_that_versions_re_send(session: Any) -> None:
    """Deployed in place over the previous version, which parks without a copy id: its wake-up
    re-sent m (deduplication id of the holder alone), the copy parked again behind the holder's
    name claimed again (an item without ``copy_id``), then this version's wake-up, within 5 minutes,
    re-sends it under an id of its own (from when the item was parked), not the previous one."""
    with sqs_dedup(session) as dedup:
        stack = build_stack(session, clock=FakeClock(), duplicate_policy=DuplicatePolicy.DEFER)
        launcher = stack.launcher()
        holder = execution_name("k1", stack.send({"id": "k1", "n": 1}, group="gA"))
        launcher.tick()
        m_id = stack.send({"id": "k1", "n": 2}, group="gM")
        assert launcher.tick().outcomes == {"deferred": 1}
        sqs, ddb, table = stack.client("sqs"), stack.client("dynamodb"), stack.settings.table_name
        m_name = execution_name("k1", m_id)
        m_entry = named_entry("k1", m_id)
        item = ddb.get_item(TableName=table, Key={"pk": {"S": f"PARK#{m_entry}"}}, ConsistentRead=True)[
            "Item"
        ]
        # The previous version: its wake-up's send; the copy parked over the item, without copy_id.
        previous = f"{m_id}-{hashlib.sha256(holder.encode()).hexdigest()[:32]}"
        origin = {ORIGIN_ATTRIBUTE: {"DataType": "String", "StringValue": m_id}}
        sqs.send_message(
            QueueUrl=stack.settings.queue_url,
            MessageBody=item["body"]["S"],
            MessageGroupId="gM",
            MessageDeduplicationId=previous,
            MessageAttributes=origin,
        )
        (copy,) = sqs.receive_message(QueueUrl=stack.settings.queue_url, MaxNumberOfMessages=10)["Messages"]
        sqs.delete_message(QueueUrl=stack.settings.queue_url, ReceiptHandle=copy["ReceiptHandle"])
        # ...laid out as that version lays it: PARK#<message id>, without copy_id, its id in H.parked.
        ddb.delete_item(TableName=table, Key={"pk": {"S": f"PARK#{m_entry}"}})
        legacy = {k: v for k, v in item.items() if k != "copy_id"} | {"pk": {"S": f"PARK#{m_id}"}}
        ddb.put_item(TableName=table, Item=legacy)
        ddb.update_item(
            TableName=table,
            Key={"pk": {"S": f"EXEC#{holder}"}},
            UpdateExpression="SET parked = :id",
            ExpressionAttributeValues={":id": {"SS": [m_id]}},
        )

        stack.clock.advance(60)  # this version ends the holder: its release wakes m
        launcher.on_status_change(StatusChange.from_event(stack.finish(holder)))
        for _ in range(2):
            launcher.tick()
        assert not [d for d in dedup.dropped if d[2] == previous]  # not taken for the previous send
        assert m_name in {e["name"] for e in stack.executions()}
        legacy_now = ddb.get_item(TableName=table, Key={"pk": {"S": f"PARK#{m_id}"}}, ConsistentRead=True)
        assert "woken_at" in legacy_now["Item"]  # read, woken and marked under the previous layout


@pytest.mark.parametrize("variant", [None, "parked_by_origin"])
def test_a_forged_origin_of_another_key_does_not_park_over_a_waiting_message(
    session: Any, variant: str | None
) -> None:
    """A producer's message of key B carrying ``sluice-origin-message-id`` = the id of a message of
    key A parked behind A's run. Names derive from the key and the origin, so the two are different
    messages. Keyed by the origin alone (``parked_by_origin``), B's parks over A's item (another
    holder: allowed) and A's is never woken; keyed by the name each runs under, both run."""
    stack = build_stack(session, clock=FakeClock(), duplicate_policy=DuplicatePolicy.DEFER)
    launcher = stack.launcher()
    a_name = execution_name("A", stack.send({"id": "A", "n": 1}, group="gA1"))
    b_name = execution_name("B", stack.send({"id": "B", "n": 1}, group="gB1"))
    launcher.tick()
    m_id = stack.send({"id": "A", "n": 2}, group="gA2")
    a_m, b_m = execution_name("A", m_id), execution_name("B", m_id)
    with _applied(variant):
        assert launcher.tick().outcomes == {"deferred": 1}
        stack.send({"id": "B", "n": "x"}, group="gX", sluice_origin_message_id=m_id)  # the forgery
        assert launcher.tick().outcomes == {"deferred": 1}  # it fired: B's copy parked behind B's run
        for name in (a_name, b_name):
            launcher.on_status_change(StatusChange.from_event(stack.finish(name)))
        for _ in range(2):
            launcher.tick()
    names = {e["name"] for e in stack.executions()}
    assert b_m in names
    if variant is None:
        assert a_m in names, "A's deferred duplicate never started"
    else:
        assert a_m not in names and stack.queue_counts() == (0, 0)  # the fault: A's message lost


def test_an_item_the_previous_version_parked_under_a_name_shaped_id_is_not_parked_over(session: Any) -> None:
    """An attack on the keying by name: the previous version parked a message of K2 whose (forged)
    origin is the name a message of K runs under, as ``PARK#<that id>``. This version's park of the
    K message would write the same item, over it. A name entry holds a space, which no origin holds
    (``named_entry``): the items never meet, and both messages run."""
    stack = build_stack(session, clock=FakeClock(), duplicate_policy=DuplicatePolicy.DEFER)
    launcher = stack.launcher()
    h1 = execution_name("K2", stack.send({"id": "K2"}, group="g1"))
    h2 = execution_name("K", stack.send({"id": "K"}, group="g2"))
    launcher.tick()
    origin = "producer-chosen-origin"
    n = execution_name("K", origin)
    ddb, table = stack.client("dynamodb"), stack.settings.table_name
    ddb.put_item(  # as the previous version parks: PARK#<message id>, no copy_id, its id in the set
        TableName=table,
        Item={
            "pk": {"S": f"PARK#{n}"},
            "message_id": {"S": n},
            "key": {"S": "K2"},
            "holder": {"S": h1},
            "body": {"S": json.dumps({"id": "K2", "legacy": True})},
            "group_id": {"S": "g1"},
            "attributes": {"S": "{}"},
            "parked_at": {"N": "1.0"},
        },
    )
    ddb.update_item(
        TableName=table,
        Key={"pk": {"S": f"EXEC#{h1}"}},
        UpdateExpression="ADD parked :p",
        ExpressionAttributeValues={":p": {"SS": [n]}},
    )
    ddb.update_item(
        TableName=table,
        Key={"pk": {"S": "PARKED"}},
        UpdateExpression="ADD holders :p",
        ExpressionAttributeValues={":p": {"SS": [h1]}},
    )
    stack.send({"id": "K", "new": True}, group="g3", sluice_origin_message_id=origin)
    assert launcher.tick().outcomes == {"deferred": 1}
    parks = {
        i["pk"]["S"]: i["key"]["S"]
        for i in ddb.scan(TableName=table)["Items"]
        if i["pk"]["S"].startswith("PARK#")
    }
    assert parks == {f"PARK#{n}": "K2", f"PARK#{named_entry('K', origin)}": "K"}  # the name-shaped id fired
    for name in (h1, h2):
        launcher.on_status_change(StatusChange.from_event(stack.finish(name)))
    for _ in range(2):
        launcher.tick()
    assert {execution_name("K2", n), n} <= {e["name"] for e in stack.executions()}

"""The harness itself: faults do what they say, and the moto adjustments change no outcome."""

from __future__ import annotations

import json

import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from sluice.adapters.aws.ssm import SsmMax
from sluice.core.clock import FakeClock
from sluice.core.errors import TransientError
from sluice.launch.per_message import THROTTLED_STARTS
from tests.reliability.world import World, pool
from tests.support.faults import Crash, CrashAt, Injector, StaleList, Throttle
from tests.support.moto_patches import atomic_fast_moto


@pytest.fixture
def world():
    w = World(max_concurrency=2)
    try:
        yield w
    finally:
        w.close()


def test_a_cancelled_transaction_leaves_every_item_as_it_was():
    with mock_aws(), atomic_fast_moto():
        ddb = pool().client("dynamodb")
        ddb.create_table(
            TableName="t",
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
        )
        ddb.put_item(TableName="t", Item={"pk": {"S": "a"}, "n": {"N": "1"}})
        with pytest.raises(ClientError, match="TransactionCanceled"):
            ddb.transact_write_items(
                TransactItems=[
                    {
                        "Update": {
                            "TableName": "t",
                            "Key": {"pk": {"S": "a"}},
                            "UpdateExpression": "SET n = :two",
                            "ExpressionAttributeValues": {":two": {"N": "2"}},
                        }
                    },
                    {"Put": {"TableName": "t", "Item": {"pk": {"S": "new"}}}},
                    {
                        "Update": {
                            "TableName": "t",
                            "Key": {"pk": {"S": "b"}},
                            "UpdateExpression": "SET n = :one",
                            "ConditionExpression": "attribute_exists(pk)",
                            "ExpressionAttributeValues": {":one": {"N": "1"}},
                        }
                    },
                ]
            )
        items = {i["pk"]["S"]: i for i in ddb.scan(TableName="t")["Items"]}
        assert items == {"a": {"pk": {"S": "a"}, "n": {"N": "1"}}}


def test_a_throttle_reaches_sluice_and_nothing_reaches_aws(world):
    world.send(json.dumps({"id": "p0"}))
    # Throttled at every call the launcher makes while backing off: the batch ends, the tick returns.
    throttled = Throttle("StartExecution", times=THROTTLED_STARTS)
    assert world.tick("A", [throttled]) == "ok"
    assert throttled.fired == THROTTLED_STARTS
    assert world.running_in_step_functions() == set()
    assert world.queue_depth() == 1  # returned to the queue, not lost
    world.tick("A")
    assert len(world.running_in_step_functions()) == 1


def test_a_throttle_that_passes_while_the_launcher_backs_off_starts_it_in_the_same_tick(world):
    world.send(json.dumps({"id": "p0"}))
    throttled = Throttle("StartExecution", times=2)
    assert world.tick("A", [throttled]) == "ok"
    assert throttled.fired == 2
    assert len(world.running_in_step_functions()) == 1 and world.queue_depth() == 0


def test_a_throttle_surfaces_as_a_transient_error():
    with mock_aws():
        ssm = pool().session.client("ssm", region_name="us-east-1")
        injector = Injector("x")
        injector.attach(ssm)
        injector.faults.append(Throttle("GetParameter", times=1))
        with pytest.raises(TransientError, match="Throttl"):
            SsmMax(ssm, "/nothing", default=1, clock=FakeClock(), cache_seconds=0).reading()


def test_a_crash_after_a_call_keeps_its_effect_and_kills_the_container(world):
    world.send(json.dumps({"id": "p0"}))
    assert world.tick("A", [CrashAt("after_start")]) == "crashed"
    assert len(world.running_in_step_functions()) == 1  # the side effect happened
    assert world.queue_depth() == 1  # nothing after the crash ran: the message is still there


def test_a_dead_container_reaches_nothing():
    injector = Injector("x", dead=True)
    with mock_aws():
        sqs = injector.attach(pool().session.client("sqs", region_name="us-east-1"))
        with pytest.raises(Crash):
            sqs.list_queues()


def test_a_stale_listing_hides_running_executions(world):
    world.send(json.dumps({"id": "p0"}))
    world.tick("A")
    executions = world.containers["B"].launcher.executions
    world.containers["B"].injector.faults.append(StaleList("empty"))
    assert executions.list_running() == set()
    world.containers["B"].injector.faults.clear()
    assert len(executions.list_running()) == 1


def test_a_woken_key_waiters_send_is_named_key_wake():
    """The step a waiter woken from its key's line is sent back with: the suite's crash points
    ``before_key_wake``/``after_key_wake`` and its check of the wake-up hang on this name. The
    deduplication id is SqsQueue.requeue's, from the holder keys.as_parked gives it (its in-flight
    entry ``<ticket>@<ms>``, whole)."""
    import hashlib

    from sluice.core.names import ORIGIN_ATTRIBUTE
    from sluice.features.keys import KeyWaiter, as_parked
    from tests.support.steps import protocol_step

    waiter = KeyWaiter(
        ckey="tenant",
        ticket=3,
        message_id="m-1",
        key="k",
        body="{}",
        group_id="g",
        attributes={},
        parked_at=1.0,
    )
    parked = as_parked(waiter, "3@1700000000123")
    holder = hashlib.sha256(parked.holder.encode()).hexdigest()[:32]
    params = {
        "MessageDeduplicationId": f"{parked.message_id[:90]}-{holder}",
        "MessageAttributes": {
            **{k: {"DataType": "String", "StringValue": v} for k, v in parked.attributes.items()},
            "sluice-concurrency-key": {"DataType": "String", "StringValue": "tenant"},
            ORIGIN_ATTRIBUTE: {"DataType": "String", "StringValue": parked.message_id},
        },
    }
    assert protocol_step("sqs", "SendMessage", params) == "key_wake"

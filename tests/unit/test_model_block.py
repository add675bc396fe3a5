"""The reference model (tests/support/model.py) holds a start to promise 2 against a redriven run a
reconciliation blocked its claim for: no StartExecution follows a block (docs/protocol.md), so that
run is known to the start even before the reconciliation that blocked it completes. Without the
block, or with one after the start mark, a redrive racing the start is outside the promise until a
completed reconciliation lists it."""

from __future__ import annotations

from sluice.core.clock import FakeClock
from tests.support.model import Model, Sent
from tests.support.steps import Call

DLQ = "https://sqs.us-east-1.amazonaws.com/123456789012/dlq.fifo"
MACHINE = "arn:aws:states:us-east-1:123456789012:stateMachine:m"


def claimed_beside_a_redrive(*, marked: bool = False) -> Model:
    """e1 (key j) was released and the operator redrove it; n2, a new message of j, is claimed."""
    m = Model(dlq_url=DLQ, clock=FakeClock(), max_concurrency=5, visibility_timeout=30)
    m.sent_message(Sent("m1", '{"id": "j"}', "g", "m1", "j"))
    m.sent_message(Sent("m2", '{"id": "j"}', "g", "m2", "j"))
    m.claims["e1"] = "m1"
    m.running_again("e1")  # outside Sluice: not adopted
    exec_item = {"pk": {"S": "EXEC#n2"}, "name": {"S": "n2"}, "message_id": {"S": "m2"}}
    if marked:  # a fresh claim carries its start mark (sluice.launch.per_message)
        exec_item["starting_at"] = {"N": "100"}
    slot = {"Key": {"pk": {"S": "SLOTS#launcher#0"}}, "UpdateExpression": "SET holders.#n = :now"}
    slot["ExpressionAttributeNames"] = {"#n": "n2"}
    items = [{"Update": slot}, {"Put": {"Item": exec_item}}]
    m.saw(Call("A", "dynamodb", "TransactWriteItems", "claim", {"TransactItems": items}), 200, {})
    return m


def block(m: Model) -> None:
    params = {"Key": {"pk": {"S": "EXEC#n2"}}, "ExpressionAttributeValues": {":by": {"S": "e1"}}}
    m.saw(Call("B", "dynamodb", "UpdateItem", "block", params), 200, {})


def start(m: Model) -> list[str]:
    m.saw(Call("A", "dynamodb", "UpdateItem", "start_mark", {"Key": {"pk": {"S": "EXEC#n2"}}}), 200, {})
    m.saw(
        Call("A", "stepfunctions", "StartExecution", "start", {"name": "n2", "stateMachineArn": MACHINE}),
        200,
        {},
    )
    return [v for v in m.violations if v.startswith("promise 2")]


def test_a_start_after_a_block_breaks_promise_2():
    m = claimed_beside_a_redrive()
    block(m)
    (violation,) = start(m)
    assert "while e1 still runs (a reconciliation had blocked its claim for it)" in violation


def test_a_block_after_the_start_mark_is_a_redrive_racing_the_start():
    m = claimed_beside_a_redrive()
    m.saw(Call("A", "dynamodb", "UpdateItem", "start_mark", {"Key": {"pk": {"S": "EXEC#n2"}}}), 200, {})
    block(m)
    assert start(m) == []


def test_a_block_after_a_claim_that_carries_its_start_mark_is_a_redrive_racing_the_start():
    m = claimed_beside_a_redrive(marked=True)
    block(m)
    m.saw(
        Call("A", "stepfunctions", "StartExecution", "start", {"name": "n2", "stateMachineArn": MACHINE}),
        200,
        {},
    )
    assert [v for v in m.violations if v.startswith("promise 2")] == []


def test_a_redrive_racing_the_start_unlisted_is_outside_the_promise():
    assert start(claimed_beside_a_redrive()) == []


def test_the_stores_block_is_the_models_block_step():
    """The write ``DynamoStore.block`` makes on moto is the call the suite's recorder names ``block``."""
    import boto3
    from moto import mock_aws

    from sluice.adapters.dynamo.store import DynamoStore, create_table
    from tests.support.steps import protocol_step

    seen: list[str] = []
    with mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        create_table(client, "blocks")
        client.meta.events.register(
            "provide-client-params.dynamodb.UpdateItem",
            lambda params, **_: seen.append(protocol_step("dynamodb", "UpdateItem", params)),
        )
        DynamoStore(client, "blocks").block(name="n2", by="e1", now=1.0)
    assert seen == ["block"]

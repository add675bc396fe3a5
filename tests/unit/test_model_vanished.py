"""The reference model (tests/support/model.py) accepts a valid payload's dead letter after a state
machine switch and deletion only in exactly the documented situations (tests/support/model_machines.py):
its own claim on a machine switched from and deleted, with that reason; a run-once message of a key
whose run-once run vanished so, with that reason. Anything else is still a broken promise."""

from __future__ import annotations

import pytest

from sluice.core.clock import FakeClock
from tests.support.model import Model, Sent
from tests.support.steps import ONCE_ATTRIBUTE, REASON_ATTRIBUTE, Call

DLQ = "https://sqs.us-east-1.amazonaws.com/123456789012/dlq.fifo"
M1, M2 = "sluice-rel-workflow", "sluice-rel-workflow-2"


def machine(name: str) -> str:
    return f"arn:aws:states:us-east-1:123456789012:stateMachine:{name}"


def vanished_reason(name: str, on: str = M1) -> str:
    return (
        f"its claim {name} is on state machine {on}, no longer used and deleted: whether it ran there "
        "cannot be known, so it is not started again"
    )


def once_reason(key: str, name: str) -> str:
    return (
        f"run-once key {key!r}: the outcome of its run {name} is unknown (its execution no longer exists …)"
    )


def model() -> Model:
    return Model(dlq_url=DLQ, clock=FakeClock(), max_concurrency=5, visibility_timeout=30)


def send(m: Model, message_id: str, key: str, *, once: bool = False) -> None:
    attributes = {ONCE_ATTRIBUTE: "true"} if once else {}
    m.sent_message(Sent(message_id, f'{{"id": "{key}"}}', "g", message_id, key, attributes))


def claim(m: Model, name: str, message_id: str, on: str = M1) -> None:
    arn = f"arn:aws:states:us-east-1:123456789012:execution:{on}:{name}"
    item = {
        "pk": {"S": f"EXEC#{name}"},
        "name": {"S": name},
        "message_id": {"S": message_id},
        "arn": {"S": arn},
    }
    m.saw(
        Call("A", "dynamodb", "TransactWriteItems", "claim", {"TransactItems": [{"Put": {"Item": item}}]}),
        200,
        {},
    )


def dead_letter(m: Model, message_id: str, reason: str) -> None:
    attributes = {
        "sluice-source-message-id": {"DataType": "String", "StringValue": message_id},
        REASON_ATTRIBUTE: {"DataType": "String", "StringValue": reason},
    }
    m.saw(
        Call("A", "sqs", "SendMessage", "dead_letter", {"QueueUrl": DLQ, "MessageAttributes": attributes}),
        200,
        {},
    )


def switched_and_deleted(m: Model) -> None:
    m.machine_switched(machine(M2))
    m.machine_deleted(machine(M1))


def test_its_own_claim_on_a_machine_switched_from_and_deleted_is_accepted():
    m = model()
    send(m, "m1", "p0")
    claim(m, "n1", "m1")
    switched_and_deleted(m)
    dead_letter(m, "m1", vanished_reason("n1"))
    assert m.violations == []
    assert m.vanished_messages == {"m1"} and m.vanished_keys == {"p0"}


@pytest.mark.parametrize(
    "reason",
    [
        "not JSON",
        "its claim n1 is on a state machine Sluice may not describe (AccessDenied); set previousStateMachineArn",
        vanished_reason("n1", on=M2),  # the machine named is not the claim's
        vanished_reason("n9"),  # another claim's name
    ],
)
def test_any_other_reason_is_still_a_broken_promise(reason):
    m = model()
    send(m, "m1", "p0")
    claim(m, "n1", "m1")
    switched_and_deleted(m)
    dead_letter(m, "m1", reason)
    assert len(m.violations) == 1 and "valid payload 'p0'" in m.violations[0]
    assert m.vanished_messages == set()


def test_a_machine_switched_from_but_not_deleted_excuses_nothing():
    m = model()
    send(m, "m1", "p0")
    claim(m, "n1", "m1")
    m.machine_switched(machine(M2))
    dead_letter(m, "m1", vanished_reason("n1"))
    assert len(m.violations) == 1


def test_the_stacks_own_machine_deleted_excuses_nothing():
    m = model()
    send(m, "m1", "p0")
    claim(m, "n1", "m1")
    m.machine_deleted(machine(M1))  # no switch: M1 is the stack's machine
    dead_letter(m, "m1", vanished_reason("n1"))
    assert len(m.violations) == 1


def test_a_claim_moved_to_the_new_machine_by_its_renewal_excuses_nothing():
    m = model()
    send(m, "m1", "p0")
    claim(m, "n1", "m1")
    arn = f"arn:aws:states:us-east-1:123456789012:execution:{M2}:n1"
    renewal = {"Key": {"pk": {"S": "EXEC#n1"}}, "ExpressionAttributeValues": {":arn": {"S": arn}}}
    m.saw(Call("A", "dynamodb", "UpdateItem", "renew", renewal), 200, {})
    switched_and_deleted(m)
    dead_letter(m, "m1", vanished_reason("n1"))
    assert len(m.violations) == 1


def test_another_messages_claim_excuses_nothing():
    m = model()
    send(m, "m1", "p0")
    send(m, "m2", "p0")
    claim(m, "n1", "m1")
    switched_and_deleted(m)
    dead_letter(m, "m2", vanished_reason("n1"))
    assert len(m.violations) == 1


@pytest.mark.parametrize("first_once", [True, False])  # a plain run that vanished may have SUCCEEDED too
def test_a_once_message_of_a_key_whose_run_vanished_is_accepted(first_once):
    m = model()
    send(m, "m1", "k", once=first_once)
    send(m, "m2", "k", once=True)
    claim(m, "n1", "m1")
    switched_and_deleted(m)
    dead_letter(m, "m2", once_reason("k", "n1"))
    assert m.violations == [] and m.vanished_messages == {"m2"}


@pytest.mark.parametrize(
    ("first_once", "second_once", "key2"),
    [
        (True, False, "k"),  # a plain message runs whatever the mark says
        (True, True, "other"),  # another key's message
    ],
)
def test_a_once_unknown_reason_outside_its_situation_is_still_a_broken_promise(first_once, second_once, key2):
    m = model()
    send(m, "m1", "k", once=first_once)
    send(m, "m2", key2, once=second_once)
    claim(m, "n1", "m1")
    switched_and_deleted(m)
    dead_letter(m, "m2", once_reason("k", "n1"))
    assert len(m.violations) == 1

"""The reference model (tests/support/model.py) lets a payload rest as ``RELEASED`` only in the
documented situation (docs/operations.md, "Switch the state machine"; tests/support/model_machines.py):
its last release is reconciliation's of a holder whose claim is on a state machine switched from and
deleted, with the reason that its execution does not exist in Step Functions. Its end's event is not
heard after the switch, and a deletion before reconciliation asked leaves its outcome unknown.
Anything else resting as ``RELEASED`` is still a payload without a final record (promise 4)."""

from __future__ import annotations

import pytest

from sluice.core.clock import FakeClock
from tests.support.model import Model
from tests.support.steps import Call

DLQ = "https://sqs.us-east-1.amazonaws.com/123456789012/dlq.fifo"
M1, M2 = "sluice-rel-workflow", "sluice-rel-workflow-2"


def machine(name: str) -> str:
    return f"arn:aws:states:us-east-1:123456789012:stateMachine:{name}"


def vanished(name: str, on: str = M1) -> str:
    """The reason reconciliation's release of a vanished holder records (sluice.launch.reconcile)."""
    arn = f"arn:aws:states:us-east-1:123456789012:execution:{on}:{name}"
    return f"execution {arn} does not exist in Step Functions (its state machine was deleted?)"


def model() -> Model:
    return Model(dlq_url=DLQ, clock=FakeClock(), max_concurrency=5, visibility_timeout=30)


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


def release(m: Model, key: str, name: str, state: str, reason: str | None = None) -> None:
    """A committed release as sluice.adapters.dynamo.release writes it: the slot, the lease."""
    values = {":state": {"S": state}, ":now": {"N": "1"}, ":name": {"S": name}}
    expression = "SET #state = :state, updated_at = :now"
    if reason is not None:
        expression += ", reason = :reason"
        values[":reason"] = {"S": reason}
    params = {
        "TransactItems": [
            {
                "Update": {
                    "Key": {"pk": {"S": "SLOTS#launcher#0"}},
                    "UpdateExpression": "REMOVE holders.#n",
                    "ExpressionAttributeNames": {"#n": name},
                }
            },
            {
                "Update": {
                    "Key": {"pk": {"S": f"PAYLOAD#{key}"}},
                    "UpdateExpression": expression + " REMOVE holder",
                    "ConditionExpression": "holder = :name",
                    "ExpressionAttributeValues": values,
                }
            },
        ]
    }
    m.saw(Call("A", "dynamodb", "TransactWriteItems", "release", params), 200, {})


def switched_and_deleted(m: Model) -> None:
    m.machine_switched(machine(M2))
    m.machine_deleted(machine(M1))


def test_a_holder_on_a_machine_switched_from_and_deleted_may_rest_released():
    m = model()
    claim(m, "n1", "m1")
    switched_and_deleted(m)
    release(m, "p4", "n1", "RELEASED", vanished("n1"))
    assert m.machines.unknown_outcome("p4") == "n1"
    assert "n1" not in m.holders and m.violations == []


@pytest.mark.parametrize(
    "reason",
    [
        None,  # a refused start rolled back
        "claim abandoned: never started",
        "StartExecution refused: StateMachineDoesNotExist",
    ],
)
def test_another_release_as_released_excuses_nothing(reason):
    m = model()
    claim(m, "n1", "m1")
    switched_and_deleted(m)
    release(m, "p4", "n1", "RELEASED", reason)
    assert m.machines.unknown_outcome("p4") is None


def test_an_end_excuses_nothing():
    m = model()
    claim(m, "n1", "m1")
    switched_and_deleted(m)
    release(m, "p4", "n1", "SUCCEEDED", vanished("n1"))
    assert m.machines.unknown_outcome("p4") is None


def test_a_machine_switched_from_but_not_deleted_excuses_nothing():
    m = model()
    claim(m, "n1", "m1")
    m.machine_switched(machine(M2))
    release(m, "p4", "n1", "RELEASED", vanished("n1"))
    assert m.machines.unknown_outcome("p4") is None


def test_the_stacks_own_machine_deleted_excuses_nothing():
    m = model()
    claim(m, "n1", "m1")
    m.machine_deleted(machine(M1))  # no switch: M1 is the stack's machine
    release(m, "p4", "n1", "RELEASED", vanished("n1"))
    assert m.machines.unknown_outcome("p4") is None


def test_a_claim_on_the_machine_in_use_excuses_nothing():
    m = model()
    switched_and_deleted(m)
    claim(m, "n2", "m2", on=M2)
    release(m, "p4", "n2", "RELEASED", vanished("n2", on=M2))
    assert m.machines.unknown_outcome("p4") is None


@pytest.mark.parametrize(("state", "reason"), [("SUCCEEDED", None), ("RELEASED", "claim abandoned")])
def test_a_later_release_of_the_key_takes_the_excuse_back(state, reason):
    m = model()
    claim(m, "n1", "m1")
    switched_and_deleted(m)
    release(m, "p4", "n1", "RELEASED", vanished("n1"))
    claim(m, "n2", "m2", on=M2)
    release(m, "p4", "n2", state, reason)
    assert m.machines.unknown_outcome("p4") is None


def test_the_excuse_is_the_keys_own():
    m = model()
    claim(m, "n1", "m1")
    claim(m, "n3", "m3")
    switched_and_deleted(m)
    release(m, "p4", "n1", "RELEASED", vanished("n1"))
    release(m, "p5", "n3", "FAILED")
    assert m.machines.unknown_outcome("p4") == "n1"
    assert m.machines.unknown_outcome("p5") is None

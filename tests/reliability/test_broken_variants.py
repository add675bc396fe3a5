"""The suite catches what it exists to catch: two launchers that others have shipped, run against
the same state machine, break a promise within a fixed, derandomised budget.

Each variant is a test double of a *broken* Sluice, patched in for the length of one test:

* random execution names: a redelivered message gets a new name, so the name no longer ties a
  message to its one execution;
* a slot count decremented per status event: a second delivery of one event frees a second slot,
  here by dropping another holder from the ledger.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

import sluice.launcher
import sluice.runtime
from sluice.adapters.dynamodb import LEDGER_PK, DynamoStore
from tests.reliability.machine import SluiceMachine
from tests.reliability.world import PromiseBroken, World

BUDGET = settings(
    max_examples=40,
    stateful_step_count=25,
    derandomize=True,
    database=None,
    deadline=None,
    phases=(Phase.generate,),
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
)


def random_name(key: str, message_id: str) -> str:
    return f"run-{uuid.uuid4().hex}"


class CountingStore(DynamoStore):
    """Frees a slot for every status event, whether or not this execution still held one."""

    def release(self, *, name, state, now, error=None, cause=None, ended_at=None):
        released = super().release(
            name=name, state=state, now=now, error=error, cause=cause, ended_at=ended_at
        )
        if released is None:
            holders = sorted(self.ledger().holders)
            if holders:
                self.client.update_item(
                    TableName=self.table,
                    Key={"pk": {"S": LEDGER_PK}},
                    UpdateExpression="DELETE holders :victim",
                    ExpressionAttributeValues={":victim": {"SS": [holders[0]]}},
                )
        return released


def test_random_execution_names_are_caught(monkeypatch):
    monkeypatch.setattr(sluice.launcher, "execution_name", random_name)
    with pytest.raises(PromiseBroken) as caught:
        run_state_machine_as_test(SluiceMachine, settings=BUDGET)
    print(caught.value)


def test_a_counter_decremented_per_event_is_caught(monkeypatch):
    monkeypatch.setattr(sluice.runtime, "DynamoStore", CountingStore)
    with pytest.raises(PromiseBroken) as caught:
        run_state_machine_as_test(SluiceMachine, settings=BUDGET)
    print(caught.value)


def test_the_promises_alone_catch_the_counter(monkeypatch):
    """Without the ledger-against-leases check, promise 1 (MAX) or 4 (no leak) still fails."""
    monkeypatch.setattr(sluice.runtime, "DynamoStore", CountingStore)
    monkeypatch.setattr(World, "check_ledger", False)
    with pytest.raises(PromiseBroken, match=r"promise [14]") as caught:
        run_state_machine_as_test(SluiceMachine, settings=BUDGET)
    print(caught.value)

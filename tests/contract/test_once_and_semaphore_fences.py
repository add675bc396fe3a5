"""Two fences, on both stores: a run-once key's success is never put back under TTL by a later write
(sluice.features.receipts), and a configured semaphore limit only ever creates its pool (sluice.semaphore.service).
MemoryStore and DynamoStore (moto); MemorySemaphoreStore and DynamoSemaphoreStore (moto)."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.core.clock import FakeClock
from sluice.core.limits import LimitSource
from sluice.core.model import Claim, Ending, PayloadState
from sluice.features.awaits import Waiter
from sluice.semaphore.model import Outcome
from sluice.semaphore.service import SemaphoreService
from tests.contract.semaphore_fixtures import CountingTokens, World, open_harness
from tests.contract.stores import NOW, RETENTION, claim
from tests.contract.test_handover_contract import Offer, successor
from tests.contract.test_semaphore_contract import ask
from tests.support.aws import scheduled_event
from tests.support.cli import Run, sluice, use_env

# -- a run-once key's success is kept (sluice.features.receipts) -------------------------------------------


def once_success(store, key: str = "k", name: str = "n1") -> None:
    store.set_limit(LimitSource(5, None))
    store.claim(
        Claim(key=key, name=name, message_id=f"m-{name}", now=NOW, claim_expires_at=NOW + 900, once=True)
    )
    store.release(name, Ending(PayloadState.SUCCEEDED, NOW + 1))
    assert store.payload(key).expires_at == 0 and store.payload(key).once_by == name


def test_a_dead_letter_of_a_once_key_that_succeeded_records_its_reason_without_expiry(store):
    once_success(store)
    store.record_invalid(key="k", reason="not JSON", now=NOW + 5)
    record = store.payload("k")
    assert (record.state, record.reason) == (PayloadState.INVALID, "not JSON")
    assert record.expires_at == 0 and record.succeeded_by == "n1" and record.once_by == "n1"


@pytest.mark.parametrize("state", [PayloadState.SUCCEEDED, PayloadState.FAILED, PayloadState.RELEASED])
def test_a_plain_run_of_a_once_key_that_succeeded_leaves_it_without_expiry(store, state):
    once_success(store)
    claim(store, "k", "n2", now=NOW + 10)
    released = store.release("n2", Ending(state, NOW + 11))
    assert released is not None and released.name == "n2"
    record = store.payload("k")
    assert record.holder is None and record.state is state and record.expires_at == 0
    assert (record.succeeded_by, record.once_by) == ("n1", "n1")
    assert store.ledger().holders == frozenset()
    assert store.release("n2", Ending(state, NOW + 12)) is None  # released once


def test_a_hand_over_from_a_plain_run_of_a_once_key_keeps_it_and_claims_the_successor(store):
    once_success(store)
    claim(store, "k", "n2", limit=1, now=NOW + 10)
    handed = store.hand_over("n2", Ending(PayloadState.SUCCEEDED, NOW + 11), Offer(successor("b", "nb")))
    assert handed.claimed and handed.released is not None
    assert store.payload("k").expires_at == 0 and store.payload("k").holder is None
    assert store.payload("b").holder == "nb" and store.ledger().holders == frozenset({"nb"})


def test_an_awaited_plain_run_of_a_once_key_is_released_flagged_and_kept(store):
    once_success(store)
    claim(store, "k", "n2", now=NOW + 10)
    waiter = Waiter(
        message_id="w1",
        key="w",
        body='{"id": "w"}',
        group_id="g",
        attributes={"sluice-awaits": '["k"]'},
        awaits=("k",),
        run_anyway=False,
        parked_at=NOW + 10,
    )
    store.park_waiter(waiter, ["k"])
    released = store.release("n2", Ending(PayloadState.FAILED, NOW + 11))
    assert released is not None and released.awaited
    assert store.payload("k").expires_at == 0 and store.payload("k").holder is None


def test_records_of_keys_no_once_run_succeeded_still_expire(store):
    store.record_invalid(key="bad", reason="not JSON", now=NOW)
    assert store.payload("bad").expires_at == int(NOW) + RETENTION
    claim(store, "plain", "p1")
    store.release("p1", Ending(PayloadState.SUCCEEDED, NOW + 1))
    assert store.payload("plain").expires_at == int(NOW + 1) + RETENTION
    store.record_invalid(key="plain", reason="too big", now=NOW + 2)
    assert store.payload("plain").expires_at == int(NOW + 2) + RETENTION
    store.set_limit(LimitSource(5, None))
    store.claim(Claim(key="f", name="f1", message_id="m-f1", now=NOW, claim_expires_at=NOW + 900, once=True))
    store.release("f1", Ending(PayloadState.FAILED, NOW + 3))
    assert store.payload("f").expires_at == int(NOW + 3) + RETENTION and store.payload("f").once_by is None


def test_a_dead_letter_of_a_live_key_leaves_its_record_as_it_is(store):
    once_success(store)
    claim(store, "k", "n2", now=NOW + 10)
    store.record_invalid(key="k", reason="not JSON", now=NOW + 11)
    record = store.payload("k")
    assert (record.holder, record.state, record.reason, record.expires_at) == (
        "n2",
        PayloadState.CLAIMED,
        None,
        0,
    )


# -- a configured semaphore limit only creates its pool (sluice.semaphore.service) ----------------


@pytest.fixture(params=["memory", "dynamodb"])
def sems_world(request):
    harness = open_harness(request)
    return World(harness, harness.store(), CountingTokens(), FakeClock())


def test_a_configured_limit_creates_a_semaphore_and_never_replaces_one_that_exists(sems_world):
    cold = sems_world.semaphores()
    assert cold.create("db", 5) is True
    assert cold.status("db").limit == 5
    operator = sems_world.semaphores(seed=1)
    operator.set_limit("db", 1)
    assert cold.create("db", 5) is False and sems_world.semaphores(seed=2).create("db", 7) is False
    assert cold.status("db").limit == 1
    assert sems_world.semaphores().create("api", 0) is True and cold.status("api").limit == 0


def test_a_cold_start_keeps_the_limit_an_operator_set_since_its_read(sems_world):
    """The service reads "no pool"; the operator's ``set`` creates it with 1; the service's write of
    its configured 5 is refused (on moto, a hook runs the operator between the two), and 1 stays."""
    operator_sets: list[int] = []

    def operator() -> None:
        if not operator_sets:  # once, and not for the operator's own write
            operator_sets.append(1)
            sems_world.semaphores(seed=1).set_limit("db", 1)

    if sems_world.harness.kind == "dynamodb":
        sems_world.harness.client.meta.events.register(
            "before-call.dynamodb.TransactWriteItems", lambda **_: operator()
        )
    else:
        operator()  # one lock: an operator's set comes before the create, or after it
    service = SemaphoreService(sems_world.semaphores(), {"db": 5})
    service.ensure("db")
    assert operator_sets == [1], "the operator's set never ran"
    assert sems_world.semaphores(seed=2).status("db").limit == 1, "a cold start undid the operator's limit"
    granted = [ask(sems_world, f"e{i}")[0].outcome for i in range(2)]
    assert granted == [Outcome.GRANTED, Outcome.WAITING]


def test_a_cold_start_of_the_semaphore_function_keeps_the_limit_set_by_the_cli(stack, monkeypatch, capsys):
    """The real handler's sweep and ``sluice semaphore set`` on moto: the CLI runs after the sweep's
    read of the pool and before its write (a botocore hook on the function's client)."""
    use_env(monkeypatch, stack)
    service = stack.runtime(semaphore_limits=(("db", 5),)).semaphore_service()
    set_by_cli: list[Run] = []

    def operator(**_: Any) -> None:
        if not set_by_cli:
            set_by_cli.append(sluice(capsys, "semaphore", "set", "db", "1", session=stack.session))

    service.semaphores.store.client.meta.events.register("before-call.dynamodb.TransactWriteItems", operator)
    swept = service.handle(scheduled_event())
    assert [run.code for run in set_by_cli] == [0], "the operator's set never ran"
    assert swept == {"swept": {"db": {"freed": []}}}
    assert stack.runtime().semaphores().status("db").limit == 1, "a cold start undid the operator's limit"
    pool = stack.client("dynamodb").get_item(
        TableName=stack.settings.table_name, Key={"pk": {"S": "SLOTS#sem:db"}}, ConsistentRead=True
    )["Item"]
    assert (pool["limit"]["N"], pool["version"]["N"]) == ("1", "1")

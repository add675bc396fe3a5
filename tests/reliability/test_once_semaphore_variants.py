"""Broken variants of two fences, each patched in for one test: the scenario that pins the fence down
passes on Sluice as it is and must fail with the variant, on a broken promise or a wrong AWS state.

- A run-once key's success put back under TTL (sluice.features.receipts): by a plain run's release, or by
  a dead letter of the key (tests/integration/test_once_ttl_moto.py).
- A cold start's configured semaphore limit written over the operator's (sluice.semaphore.service):
  a read of "no pool" then a plain write, or a create that does not refuse an existing pool
  (tests/contract/test_once_and_semaphore_fences.py, on moto with the operator run by a hook).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from sluice.adapters.dynamo.release import ReleasesTable
from sluice.adapters.dynamo.store import DynamoStore, create_table
from sluice.core.clock import FakeClock
from sluice.core.model import PayloadState
from sluice.semaphore.model import pool_of
from sluice.semaphore.step import Semaphores
from tests.contract import test_once_and_semaphore_fences as fences
from tests.contract.semaphore_fixtures import TABLE, CountingTokens, Harness
from tests.contract.semaphore_fixtures import World as SemaphoreWorld
from tests.integration import test_once_ttl_moto as once_ttl
from tests.reliability.world import PromiseBroken, World
from tests.support.aws import moto_session

# -- a run-once key's success re-armed for TTL ----------------------------------------------------


def body(key: str) -> str:
    return json.dumps({"id": key})


_release_items = ReleasesTable._release_items


def expiring_release(
    self: ReleasesTable, record: Any, ending: Any, known: frozenset[str] = frozenset()
) -> Any:
    """A release that puts a run-once key's success back under TTL (break 5)."""
    items = _release_items(self, record, ending, known - {"once_by"})
    lease = items[1]["Update"]
    lease["ConditionExpression"] = lease["ConditionExpression"].replace(
        " AND attribute_not_exists(once_by)", ""
    )
    return items


def expiring_invalid(self: DynamoStore, *, key: str, reason: str, now: float) -> None:
    """A dead letter that puts a run-once key's success back under TTL (break 5)."""
    self.db.update_if(
        f"PAYLOAD#{key}",
        "SET #key = :key, #state = :invalid, reason = :reason, updated_at = :now, expires_at = :exp",
        "attribute_not_exists(holder)",
        {
            ":key": {"S": key},
            ":invalid": {"S": PayloadState.INVALID.value},
            ":reason": {"S": reason},
            ":now": {"N": repr(now)},
            ":exp": {"N": str(int(now) + self.db.retention_seconds)},
        },
        names={"#key": "key", "#state": "state"},
    )


def test_a_release_that_sets_an_expiry_on_a_once_keys_success_is_caught(monkeypatch):
    monkeypatch.setattr(ReleasesTable, "_release_items", expiring_release)
    with pytest.raises(AssertionError, match="ran again after retentionDays"), moto_session() as session:
        once_ttl.test_a_once_success_outlives_retention_whatever_touches_its_key_after_it(
            session, (once_ttl.PLAIN_RUN,)
        )


def test_a_dead_letter_that_sets_an_expiry_on_a_once_keys_success_is_caught(monkeypatch):
    monkeypatch.setattr(DynamoStore, "record_invalid", expiring_invalid)
    with pytest.raises(AssertionError, match="ran again after retentionDays"), moto_session() as session:
        once_ttl.test_a_once_success_outlives_retention_whatever_touches_its_key_after_it(
            session, (once_ttl.DEAD_LETTER,)
        )


# -- a cold start undoes the operator's semaphore limit -------------------------------------------


def semaphores_on_moto(scenario: Callable[[SemaphoreWorld], None]) -> None:
    with moto_session() as session:
        client = session.client("dynamodb")
        create_table(client, TABLE)
        harness = Harness("dynamodb", client)
        scenario(SemaphoreWorld(harness, harness.store(), CountingTokens(), FakeClock()))


def test_a_cold_start_that_reads_then_writes_its_configured_limit_is_caught(monkeypatch):
    def read_then_write(self: Semaphores, semaphore: str, limit: int) -> bool:
        if self.slots.occupancy(pool_of(semaphore)).version:
            return False
        self.set_limit(semaphore, limit)
        return True

    monkeypatch.setattr(Semaphores, "create", read_then_write)
    with pytest.raises(AssertionError, match="a cold start undid the operator's limit"):
        semaphores_on_moto(fences.test_a_cold_start_keeps_the_limit_an_operator_set_since_its_read)


def test_a_create_that_does_not_refuse_an_existing_pool_is_caught(monkeypatch):
    monkeypatch.setattr(
        Semaphores, "create", lambda self, semaphore, limit: self.set_limit(semaphore, limit) is not None
    )
    with pytest.raises(AssertionError, match="a cold start undid the operator's limit"):
        semaphores_on_moto(fences.test_a_cold_start_keeps_the_limit_an_operator_set_since_its_read)


def once_key_through_ttl(make: Callable[..., World]) -> None:
    """The reliability world's model holds a run-once key to its promise through TTL: a once-message
    of k SUCCEEDED, a dead letter of k, a plain run of k, the retention period and DynamoDB's TTL,
    then a once-message of k again, which must not run (the model's run-once check at its claim)."""
    world = make(max_concurrency=2, retention_days=1)
    once = {"sluice-once": "true"}
    world.send(body("k"), group="g0", attributes=once)
    world.tick("A")
    (first,) = world.model.running
    world.end(first)
    assert world.deliver(0) == "ok"
    world.send("\x7fnot json", group="g1", valid=False, attributes={"sluice-key": "k"})
    world.tick("A")
    world.send(body("k"), group="g2")
    world.tick("A")
    (plain,) = world.model.running
    world.end(plain)
    assert world.deliver(0) == "ok"
    world.advance(16 * 86_400)  # past the retention and the 15 days a name that ran is kept
    deleted = world.expire_ttl()
    assert deleted["EXEC"] >= 2, "the TTL process ran and deleted the runs' records"
    world.send(body("k"), group="g3", attributes=once)
    world.tick("A")
    world.check()
    assert [s.name for s in world.model.starts if s.key == "k"] == [first, plain]
    world.settle()


def test_the_reliability_world_holds_a_once_key_through_ttl(make_world):
    once_key_through_ttl(make_world)


def test_the_reliability_world_catches_a_once_key_re_armed_for_ttl(monkeypatch, make_world):
    monkeypatch.setattr(ReleasesTable, "_release_items", expiring_release)
    with pytest.raises(PromiseBroken, match="run once"):
        once_key_through_ttl(make_world)

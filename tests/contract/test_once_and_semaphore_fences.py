"""Two fences, on both stores: a run-once key's success is never put back under TTL by a later write
(sluice.receipts), and a configured semaphore limit only ever creates its pool (sluice.semaphore_service).
MemoryStore and DynamoStore (moto); MemorySemaphoreStore and DynamoSemaphoreStore (moto)."""

from __future__ import annotations

import pytest

from sluice.awaits import Waiter
from sluice.model import LimitSource, PayloadState
from tests.contract.stores import NOW, RETENTION, claim
from tests.contract.test_handover_contract import Offer, successor

# -- a run-once key's success is kept (sluice.receipts) -------------------------------------------


def once_success(store, key: str = "k", name: str = "n1") -> None:
    store.set_limit(LimitSource(5, None))
    store.claim(key=key, name=name, message_id=f"m-{name}", now=NOW, claim_expires_at=NOW + 900, once=True)
    store.release(name=name, state=PayloadState.SUCCEEDED, now=NOW + 1)
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
    released = store.release(name="n2", state=state, now=NOW + 11)
    assert released is not None and released.name == "n2"
    record = store.payload("k")
    assert record.holder is None and record.state is state and record.expires_at == 0
    assert (record.succeeded_by, record.once_by) == ("n1", "n1")
    assert store.ledger().holders == frozenset()
    assert store.release(name="n2", state=state, now=NOW + 12) is None  # released once


def test_a_hand_over_from_a_plain_run_of_a_once_key_keeps_it_and_claims_the_successor(store):
    once_success(store)
    claim(store, "k", "n2", limit=1, now=NOW + 10)
    handed = store.hand_over(
        name="n2", state=PayloadState.SUCCEEDED, now=NOW + 11, offer=Offer(successor("b", "nb"))
    )
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
    released = store.release(name="n2", state=PayloadState.FAILED, now=NOW + 11)
    assert released is not None and released.awaited
    assert store.payload("k").expires_at == 0 and store.payload("k").holder is None


def test_records_of_keys_no_once_run_succeeded_still_expire(store):
    store.record_invalid(key="bad", reason="not JSON", now=NOW)
    assert store.payload("bad").expires_at == int(NOW) + RETENTION
    claim(store, "plain", "p1")
    store.release(name="p1", state=PayloadState.SUCCEEDED, now=NOW + 1)
    assert store.payload("plain").expires_at == int(NOW + 1) + RETENTION
    store.record_invalid(key="plain", reason="too big", now=NOW + 2)
    assert store.payload("plain").expires_at == int(NOW + 2) + RETENTION
    store.set_limit(LimitSource(5, None))
    store.claim(key="f", name="f1", message_id="m-f1", now=NOW, claim_expires_at=NOW + 900, once=True)
    store.release(name="f1", state=PayloadState.FAILED, now=NOW + 3)
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

"""``Store.record_later_success``: a redriven run's success written after its release on an earlier
end (it ran without a slot or the lease). The record SUCCEEDED at the later stop date, the key's
``succeeded_by`` (``once_by`` and no expiry for a run-once claim), the receipt while it is still this
run's, the effects' mark; never a slot. Conditioned on the end it was read with. MemoryStore and
DynamoStore (moto)."""

from __future__ import annotations

import pytest

from sluice.adapters.memory.store import MemoryStore
from sluice.core.errors import AlreadyDone
from sluice.core.model import EffectsLog, Ending, PayloadState
from sluice.core.records import ReceiptOutput
from tests.contract.stores import NOW, claim


def failed_run(store, key: str = "k", name: str = "n1", *, once: bool = False):
    """``name`` of ``key`` started, FAILED at NOW + 10 and released. Returns its record."""
    claim(store, key, name, once=once)
    store.mark_running(key=key, name=name, arn=f"arn:x:{name}", started_at=NOW, now=NOW)
    assert store.release(name, Ending(PayloadState.FAILED, NOW + 11, error="Boom", ended_at=NOW + 10))
    record = store.execution(name)
    assert record.state is PayloadState.FAILED and record.ended_at == NOW + 10
    return record


@pytest.mark.parametrize("once", [False, True])
def test_a_later_success_is_the_keys_success_and_takes_no_slot(store, once):
    record = failed_run(store, once=once)
    assert store.record_later_success(record=record, ended_at=NOW + 50, now=NOW + 51, receipt=None)
    ended = store.execution("n1")
    assert (ended.state, ended.ended_at, ended.error) == (PayloadState.SUCCEEDED, NOW + 50, None)
    payload = store.payload("k")
    assert (payload.succeeded_by, payload.receipt, payload.receipt_state) == (
        "n1",
        "n1",
        PayloadState.SUCCEEDED,
    )
    assert payload.holder is None and store.ledger().holders == frozenset()
    assert (payload.once_by, payload.expires_at == 0) == (("n1", True) if once else (None, False))
    with pytest.raises(AlreadyDone):
        claim(store, "k", "n2", message_id="m2", now=NOW + 60, once=True)


def test_it_is_written_once_and_only_over_the_end_it_was_read_with(store):
    record = failed_run(store)
    assert store.record_later_success(record=record, ended_at=NOW + 50, now=NOW + 51, receipt=None)
    assert not store.record_later_success(record=record, ended_at=NOW + 50, now=NOW + 52, receipt=None)
    assert store.execution("n1").ended_at == NOW + 50


def test_a_later_run_keeps_the_receipt_but_the_key_has_succeeded(store):
    record = failed_run(store)
    claim(store, "k", "n2", message_id="m2", now=NOW + 20)
    assert store.release("n2", Ending(PayloadState.FAILED, NOW + 31, ended_at=NOW + 30))
    assert store.record_later_success(record=record, ended_at=NOW + 50, now=NOW + 51, receipt=None)
    payload = store.payload("k")
    assert (payload.receipt, payload.receipt_state, payload.succeeded_by) == ("n2", PayloadState.FAILED, "n1")


def test_its_effects_are_marked(store):
    record = failed_run(store)
    log = EffectsLog(name="n1", key="k", count=1, sent=("fx-1",), rejected=(), sent_at=NOW + 51)
    receipt = ReceiptOutput(
        text='{"sluiceEffects": []}', inline='{"sluiceEffects": []}', size=21, effects=log
    )
    assert store.record_later_success(record=record, ended_at=NOW + 50, now=NOW + 51, receipt=receipt)
    assert store.effects("n1") == log


def expire_payload(store, key: str) -> None:
    """DynamoDB's TTL took ``PAYLOAD#<key>`` (it lives ``retentionDays``; the execution's record 15 days)."""
    if isinstance(store, MemoryStore):
        del store.table.payloads[key]
    else:
        store.db.client.delete_item(TableName=store.db.table, Key={"pk": {"S": f"PAYLOAD#{key}"}})
    assert store.payload(key) is None


@pytest.mark.parametrize("once", [False, True])
def test_a_key_record_taken_by_ttl_is_written_afresh(store, once):
    record = failed_run(store, once=once)
    expire_payload(store, "k")
    assert store.record_later_success(record=record, ended_at=NOW + 50, now=NOW + 51, receipt=None)
    payload = store.payload("k")
    assert (payload.succeeded_by, payload.receipt, payload.receipt_state) == (
        "n1",
        "n1",
        PayloadState.SUCCEEDED,
    )
    assert payload.holder is None and (payload.expires_at == 0) is once
    with pytest.raises(AlreadyDone):
        claim(store, "k", "n2", message_id="m2", now=NOW + 60, once=True)

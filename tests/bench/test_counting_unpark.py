"""The bench's ``CountingStore.unpark`` counts the calls and write units ``DynamoStore.unpark`` makes
on moto, for a wake-up of deferred duplicates (the copies re-sent, marked woken) and for one that
re-sent none (the copies still wait: the holder stays on the index)."""

from __future__ import annotations

import pytest

from bench.aws import SMALL_ITEM_KB, CountingStore, Meter
from sluice.adapters.dynamo.store import DynamoStore, create_table
from sluice.adapters.memory.store import MemoryStore
from sluice.core.clock import FakeClock
from sluice.core.model import Ending, ParkedMessage, PayloadState
from tests.contract.stores import NOW, RETENTION, claim
from tests.support.hooks import count_calls


def _parked(message_id: str) -> ParkedMessage:
    return ParkedMessage(
        message_id, "k", "n1", '{"id": "k"}', "g1", {"sluice-key": "k"}, NOW + 1, message_id + ".1"
    )


def _wake(store) -> set[str]:
    """n1 claimed with two duplicates parked behind it, then released: the entries it read."""
    claim(store, "k", "n1")
    assert store.park(_parked("m2")) and store.park(_parked("m3"))
    released = store.release("n1", Ending(PayloadState.SUCCEEDED, NOW + 5))
    assert len(released.parked) == 2
    return set(released.parked)


@pytest.mark.parametrize("resent", [True, False])
def test_the_counting_store_unparks_with_the_calls_dynamodb_makes(session, resent):
    client = session.client("dynamodb")
    create_table(client, "counting")
    dynamo = DynamoStore(client, "counting", retention_seconds=RETENTION, slots_per_shard=2)
    entries = _wake(dynamo)
    woken = dynamo.parked_messages("n1", entries) if resent else []
    calls = count_calls(client)
    dynamo.unpark("n1", entries, woken=woken, now=NOW + 6)
    calls_made = {f"dynamodb:{op}": n for op, n in calls.items()}
    left = dynamo.parked_holders()
    assert left == (frozenset() if resent else {"n1"})

    meter = Meter(FakeClock())
    counting = CountingStore(MemoryStore(retention_seconds=RETENTION), meter)
    inner_entries = _wake(counting.inner)
    inner_woken = counting.inner.parked_messages("n1", inner_entries) if resent else []
    counting.unpark("n1", inner_entries, woken=inner_woken, now=NOW + 6)

    assert counting.inner.parked_holders() == left
    assert calls_made == meter.calls == {"dynamodb:TransactWriteItems": 3}
    assert meter.wru == 3 * 2 * 2 * SMALL_ITEM_KB  # three transactions of two items, billed twice

"""An execution, run-once or not, released with an unknown outcome (``Store.release(outcome_unknown=True)``:
it vanished with its state machine) marks its key ``once_unknown``: no run-once claim of the key passes,
in the claim's own condition (a hand-over's too); a plain claim does; the record is kept without
expiry whatever is written after it. MemoryStore and DynamoStore (moto)."""

from __future__ import annotations

import pytest

from sluice.core.errors import AlreadyRan, OnceUnknown
from sluice.core.model import Ending, PayloadState
from tests.contract.stores import NOW, claim
from tests.contract.test_handover_contract import Offer, successor


def vanished(store, key: str = "k", name: str = "n1", *, once: bool = True) -> None:
    claim(store, key, name, once=once)
    store.mark_running(key=key, name=name, arn=f"arn:x:{name}", started_at=NOW, now=NOW)
    released = store.release(
        name, Ending(PayloadState.RELEASED, NOW + 1, error="vanished", outcome_unknown=True)
    )
    assert released is not None and released.name == name


def test_a_vanished_once_run_marks_its_key_and_keeps_it(store):
    vanished(store)
    record = store.payload("k")
    assert (record.once_unknown, record.once_by, record.succeeded_by) == ("n1", "n1", None)
    assert record.holder is None and record.expires_at == 0 and record.state is PayloadState.RELEASED
    assert store.ledger().holders == frozenset()


def test_a_once_claim_of_the_marked_key_is_refused_and_a_plain_claim_passes(store):
    vanished(store)
    with pytest.raises(OnceUnknown) as refused:
        claim(store, "k", "n2", message_id="m2", now=NOW + 5, once=True)
    assert refused.value.existing.once_unknown == "n1"
    assert store.execution("n2") is None and store.ledger().holders == frozenset()
    claim(store, "k", "n3", message_id="m3", now=NOW + 6)
    assert store.payload("k").holder == "n3"


@pytest.mark.parametrize("state", [PayloadState.SUCCEEDED, PayloadState.FAILED, PayloadState.RELEASED])
def test_later_writes_keep_the_mark_and_no_expiry(store, state):
    vanished(store)
    claim(store, "k", "n2", message_id="m2", now=NOW + 5)
    assert store.release("n2", Ending(state, NOW + 6)) is not None
    store.record_invalid(key="k", reason="not JSON", now=NOW + 7)
    record = store.payload("k")
    assert record.once_unknown == "n1" and record.expires_at == 0


def test_a_hand_over_does_not_claim_a_once_successor_of_the_marked_key(store):
    vanished(store)
    claim(store, "a", "na", limit=1, message_id="ma", now=NOW + 5)
    handed = store.hand_over(
        "na", Ending(PayloadState.SUCCEEDED, NOW + 6), Offer(successor("k", "n2", once=True))
    )
    assert handed.released is not None and not handed.claimed
    assert store.execution("n2") is None and store.payload("k").holder is None


def test_a_plain_run_released_with_an_unknown_outcome_marks_its_key_too(store):
    """It may have SUCCEEDED as well: a run-once message of its key must not run after it."""
    vanished(store, once=False)
    record = store.payload("k")
    assert (record.once_unknown, record.once_by, record.expires_at) == ("n1", "n1", 0)
    with pytest.raises(OnceUnknown):
        claim(store, "k", "n2", message_id="m2", now=NOW + 5, once=True)
    claim(store, "k", "n3", message_id="m3", now=NOW + 6)
    assert store.payload("k").holder == "n3"


def test_the_name_of_a_run_released_with_an_unknown_outcome_is_not_claimed_again(store):
    """Its message back (a delete lost before the release): the name may have run on the deleted
    machine, so its claim is refused as a name that ran, the record saying why, nothing taken."""
    vanished(store, once=False)
    with pytest.raises(AlreadyRan) as refused:
        claim(store, "k", "n1", now=NOW + 5)
    assert refused.value.existing.name == "n1" and refused.value.existing.outcome_unknown
    assert store.payload("k").holder is None and store.ledger().holders == frozenset()
    assert store.execution("n1").state is PayloadState.RELEASED

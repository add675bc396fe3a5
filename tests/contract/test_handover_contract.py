"""The store contract, continued: a release that hands its slot to a successor's claim in the same
write (``Store.hand_over``, a completion's refill). Run against MemoryStore and DynamoStore (moto)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from sluice.core.errors import LeaseHeld
from sluice.core.limits import LimitSource
from sluice.core.model import Claim, Ending, ExecutionRecord, PayloadState
from tests.contract.stores import NOW, claim


@dataclass
class Offer:
    """Offers ``successor`` (when given) and records what the hand-over asked."""

    successor: Claim | None = None
    asked: list[tuple[str, bool]] = field(default_factory=list)

    def __call__(self, record: ExecutionRecord, room: bool) -> Claim | None:
        self.asked.append((record.name, room))
        return self.successor


def successor(key: str, name: str, *, once: bool = False) -> Claim:
    """A claim offered the freed slot, claimed as the hand-over's default end is (``now``)."""
    return Claim(key, name, f"m-{name}", NOW + 5, NOW + 900, arn=f"arn:x:{name}", once=once)


def hand_over(
    store, name: str, offer: Offer, state: PayloadState = PayloadState.SUCCEEDED, now: float = NOW + 5
):
    return store.hand_over(name, Ending(state, now), offer)


def test_the_successor_takes_the_freed_slot_and_its_lease_in_the_release(store):
    claim(store, "a", "na", limit=1)
    offer = Offer(successor("b", "nb"))
    handed = hand_over(store, "na", offer)
    assert handed.claimed and handed.released.name == "na"
    assert offer.asked == [("na", True)]
    assert store.ledger().holders == {"nb"}
    assert store.payload("a").holder is None and store.payload("a").receipt == "na"
    assert store.payload("a").state is PayloadState.SUCCEEDED
    assert store.payload("b").holder == "nb" and store.payload("b").state is PayloadState.CLAIMED
    record = store.execution("nb")
    assert (record.state, record.key, record.message_id, record.arn) == (
        PayloadState.CLAIMED,
        "b",
        "m-nb",
        "arn:x:nb",
    )
    assert store.execution("na").state is PayloadState.SUCCEEDED


def test_a_full_pool_stays_full_and_never_goes_past_its_limit(store):
    claim(store, "a", "na", limit=2)
    claim(store, "c", "nc", limit=2)
    assert hand_over(store, "na", Offer(successor("b", "nb"))).claimed
    assert store.ledger().holders == {"nb", "nc"}
    # With the pool full, a claim of its own finds no room: the swap kept the count.
    assert hand_over(store, "nc", Offer(successor("d", "nd"))).claimed
    assert store.ledger().holders == {"nb", "nd"}


def test_a_successor_of_the_same_key_is_not_handed_the_slot(store):
    claim(store, "a", "na", limit=1)
    handed = hand_over(store, "na", Offer(successor("a", "na2")))
    assert handed.released is not None and not handed.claimed
    assert store.ledger().holders == frozenset() and store.payload("a").holder is None
    assert store.execution("na2") is None


@pytest.mark.parametrize(
    "options",
    [
        {"ckey": "c"},
        {"ckey": "c", "ticket": "1@1"},
        {"lane": "gpu"},
        {"fair_newcomer": True},
        {"uncapped": True},
    ],
    ids=["keyed", "ticketed", "laned", "fair-newcomer", "uncapped"],
)
def test_a_successor_that_is_not_a_plain_claim_leaves_the_release_alone(store, options):
    """A keyed, laned or fair claim has items the release's one write does not hold (its key's line,
    its lane's slots): both stores release alone, and the caller claims it its own way."""
    claim(store, "a", "na", limit=1)
    offered = replace(successor("b", "nb"), **options)
    assert not offered.plain
    handed = hand_over(store, "na", Offer(offered))
    assert handed.released is not None and handed.released.name == "na" and not handed.claimed
    assert store.ledger().holders == frozenset() and store.payload("a").holder is None
    assert store.payload("b") is None and store.execution("nb") is None


def test_a_successor_whose_key_is_held_leaves_the_release_alone(store):
    claim(store, "a", "na", limit=2)
    claim(store, "b", "nb", limit=2)
    handed = hand_over(store, "na", Offer(successor("b", "nb2")))
    assert handed.released is not None and not handed.claimed
    assert store.ledger().holders == {"nb"} and store.payload("b").holder == "nb"
    assert store.payload("a").holder is None and store.execution("nb2") is None


def test_a_run_once_successor_of_a_key_that_succeeded_is_not_claimed(store):
    claim(store, "b", "nb1", limit=2)
    store.release("nb1", Ending(PayloadState.SUCCEEDED, NOW + 1))
    claim(store, "a", "na", limit=2)
    handed = hand_over(store, "na", Offer(successor("b", "nb2", once=True)))
    assert handed.released is not None and not handed.claimed
    assert store.ledger().holders == frozenset() and store.execution("nb2") is None


def test_nothing_is_offered_for_a_run_that_holds_no_lease(store):
    claim(store, "a", "na", limit=1)
    store.release("na", Ending(PayloadState.SUCCEEDED, NOW + 1))  # its event, delivered twice
    offer = Offer(successor("b", "nb"))
    handed = hand_over(store, "na", offer)
    assert handed.released is None and not handed.claimed and offer.asked == []
    assert store.ledger().holders == frozenset()


def test_a_paused_pool_offers_no_room(store):
    claim(store, "a", "na", limit=1)
    store.set_limit(LimitSource(0, NOW + 1))  # paused: no slot to pass on
    offer = Offer()
    handed = hand_over(store, "na", offer)
    assert offer.asked == [("na", False)] and handed.released is not None and not handed.claimed


def test_a_pool_lowered_below_its_holders_offers_no_room(store):
    claim(store, "a", "na", limit=2)
    claim(store, "c", "nc", limit=2)
    store.set_limit(LimitSource(1, NOW + 1))  # 2 held under a limit of 1
    offer = Offer(successor("b", "nb"))
    handed = hand_over(store, "na", offer)
    assert offer.asked == [("na", False)]
    assert not handed.claimed and store.ledger().holders == {"nc"}


def test_the_successor_holds_its_key_against_another_claim(store):
    claim(store, "a", "na", limit=2)
    assert hand_over(store, "na", Offer(successor("b", "nb"))).claimed
    try:
        claim(store, "b", "nb-other", limit=2)
    except LeaseHeld as held:
        assert held.existing.holder == "nb"
    else:
        raise AssertionError("a second claim of the successor's key was admitted")

"""The concurrency keys' domain (``sluice.features.keys``) on the in-memory store and queue: tickets, room,
the slots kept for woken waiters, and the waiting line's order."""

from __future__ import annotations

import pytest

from sluice.adapters.memory.aws import MemoryQueue
from sluice.adapters.memory.store import MemoryStore
from sluice.core.clock import FakeClock
from sluice.core.errors import InvalidPayload
from sluice.core.limits import LimitSource
from sluice.core.model import Claim, Ending, Message, Payload, PayloadState
from sluice.core.records import INFLIGHT_SECONDS, KeyState, sent_at
from sluice.features import keys
from sluice.features.keys import (
    CONCURRENCY_KEY_ATTRIBUTE,
    TICKET_ATTRIBUTE,
    concurrency_key,
    entry,
    ticket_of,
)

NOW = 1_800_000_000.0


def message(n: int, ckey: str = "acme", **attributes: str) -> Message:
    return Message(
        message_id=f"m{n}",
        receipt_handle=f"r{n}",
        body=f'{{"id": "p{n}"}}',
        group_id="g",
        attributes={CONCURRENCY_KEY_ATTRIBUTE: ckey, **attributes},
    )


def claim(store: MemoryStore, n: int, ticket: str | None = None) -> None:
    store.set_limit(LimitSource(100, None))
    store.claim(
        Claim(
            key=f"p{n}",
            name=f"n{n}",
            message_id=f"m{n}",
            now=NOW,
            claim_expires_at=NOW + 900,
            ckey="acme",
            ticket=ticket,
        )
    )


def test_the_attributes_are_read_and_bad_ones_refused():
    assert concurrency_key(message(1)) == "acme"
    assert concurrency_key(Message("m", "r", "{}", "g", {})) is None
    with pytest.raises(InvalidPayload, match="control character"):
        concurrency_key(message(1, ckey="a\nb"))
    assert ticket_of(message(1)) is None
    assert ticket_of(message(1, **{TICKET_ATTRIBUTE: entry(3, NOW)})) == "3@1800000000000"
    for bad in ("3", "x@1", "3@", "@5", "3@1.5"):
        with pytest.raises(InvalidPayload, match="sluice-key-ticket"):
            ticket_of(message(1, **{TICKET_ATTRIBUTE: bad}))
    assert sent_at(entry(7, NOW + 0.25)) == NOW + 0.25


def test_room_counts_the_runs_and_the_slots_kept_for_woken_waiters_until_they_go_stale():
    state = KeyState(
        "acme", holders=frozenset({"a"}), inflight=frozenset({entry(0, NOW), entry(1, NOW - 400)})
    )
    assert state.limit(3) == 3 and state.room(3, NOW) == 1  # one run, one kept, one stale
    assert state.stale(NOW) == (entry(1, NOW - 400),)
    assert state.room(3, NOW + INFLIGHT_SECONDS) == 2
    assert KeyState("acme", cap=0).room(5, NOW) == 0


def test_an_entry_dated_further_ahead_than_any_clock_is_dropped():
    """A ticket a producer forged (``sluice-key-ticket: 0@999999999999999999``) is noted landed by
    its message's claim or forgo; dated past every clock, it would never go stale."""
    forged, ahead = "0@999999999999999999", entry(1, NOW + 30)  # a launcher's clock 30 s ahead
    state = KeyState("acme", inflight=frozenset({ahead}), landed=frozenset({forged}))
    assert state.stale(NOW) == (forged,)
    assert state.kept(NOW) == 1


def test_a_landed_note_is_dropped_by_its_place_in_the_line_not_by_its_date():
    """A ``landed`` note no wake noted yet is kept while its ticket is in the line (its wake may
    still note it), however old or young a reader's clock finds it; behind ``woken`` or past the
    line's end no wake can note it, and it goes at once."""
    waiting, behind, beyond = entry(2, NOW + 7200), entry(1, NOW), entry(5, NOW)
    state = KeyState("acme", tickets=4, woken=2, landed=frozenset({waiting, behind, beyond}))
    for reader in (NOW - 3600, NOW, NOW + 3600):
        assert state.stale(reader) == (behind, beyond)
    assert state.kept(NOW) == 0


def test_landed_notes_in_the_line_are_kept_to_a_bound_nearest_the_head_first():
    from sluice.core.records import LANDED_KEPT
    from tests.support.docs import DOCS

    notes = [entry(t, NOW + i) for t in (3, 2) for i in range(LANDED_KEPT)]
    state = KeyState("acme", tickets=4, woken=2, landed=frozenset(notes))
    assert state.stale(NOW) == tuple(sorted(notes[:LANDED_KEPT]))  # ticket 3's go; ticket 2's stay
    assert f"at most {LANDED_KEPT} of them" in (DOCS / "protocol.md").read_text()  # the CKEY# row


def test_waiters_are_woken_oldest_first_as_far_as_the_room_goes():
    store, queue = MemoryStore(key_concurrency=1), MemoryQueue(clock=FakeClock(NOW))
    claim(store, 0)
    tickets = [
        keys.wait(store=store, queue=queue, payload=Payload(f"p{n}", "{}", message(n)), ckey="acme", now=NOW)
        for n in (1, 2, 3)
    ]
    assert tickets == [0, 1, 2] and len(queue) == 0  # no room: nothing sent back
    store.release("n0", Ending(PayloadState.SUCCEEDED, NOW))
    assert keys.wake(store=store, queue=queue, ckey="acme", now=NOW) == 1
    assert keys.wake(store=store, queue=queue, ckey="acme", now=NOW) == 0  # its slot is kept for it
    (sent,) = queue.receive(10, 0)
    assert (
        sent.attributes[TICKET_ATTRIBUTE] == entry(0, NOW)
        and sent.attributes["sluice-origin-message-id"] == "m1"
    )
    assert CONCURRENCY_KEY_ATTRIBUTE in sent.attributes
    claim(store, 1, ticket=sent.attributes[TICKET_ATTRIBUTE])
    assert store.key_state("acme").inflight == frozenset()


def test_a_woken_waiter_whose_claim_never_lands_stops_holding_the_slot():
    store, queue = MemoryStore(key_concurrency=1), MemoryQueue(clock=FakeClock(NOW))
    for n in (1, 2):
        keys.wait(store=store, queue=queue, payload=Payload(f"p{n}", "{}", message(n)), ckey="acme", now=NOW)
    # Nothing ran, so the first park's own wake sent p1 back at once; p2 waits behind its kept slot.
    assert len(queue) == 1 and store.key_state("acme").waiting == 1
    queue.receive(10, 0)  # ... and p1's message is lost (dead-lettered, say)
    assert keys.sweep(store=store, queue=queue, now=NOW + 60) == 0
    assert keys.sweep(store=store, queue=queue, now=NOW + INFLIGHT_SECONDS + 1) == 1
    state = store.key_state("acme")
    assert state.waiting == 0 and len(state.inflight) == 1  # p2 on the way; p1's stale entry dropped

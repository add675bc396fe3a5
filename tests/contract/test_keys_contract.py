"""The store's side of concurrency keys (``sluice.features.keys.KeyStore``), on MemoryStore and DynamoStore
(moto): a keyed claim is refused at the key's cap or behind its waiters, the release and the
adoption move the key's holders, the line hands out tickets in order."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sluice.core.errors import KeyFull, LeaseHeld
from sluice.core.model import Ending, PayloadState
from sluice.core.records import KeyState
from sluice.features.keys import KeyWaiter, entry
from tests.contract.stores import NOW, claim


def keyed(
    store, key: str, name: str, ckey: str = "tenant", *, ticket: int | None = None, limit: int = 50
) -> None:
    claim(store, key, name, limit=limit, message_id=f"m-{name}", ckey=ckey, ticket=ticket)


def waiter(n: int, ckey: str = "tenant") -> KeyWaiter:
    return KeyWaiter(
        ckey=ckey,
        ticket=-1,
        message_id=f"msg-{n}",
        key=f"p{n}",
        body=f'{{"id": "p{n}"}}',
        group_id="g",
        attributes={"sluice-concurrency-key": ckey},
        parked_at=NOW + n,
    )


def test_a_key_admits_up_to_the_default_cap_and_says_why_it_refuses(store):
    store.key_concurrency = 2
    keyed(store, "a", "na")
    keyed(store, "b", "nb")
    with pytest.raises(KeyFull) as refused:
        keyed(store, "c", "nc")
    assert refused.value.state.holders == {"na", "nb"}
    assert store.key_state("tenant").holders == {"na", "nb"}
    assert store.execution("nc") is None and store.payload("c") is None  # nothing of the claim written
    assert "nc" not in store.ledger().holders
    keyed(store, "c", "nc", ckey="other")  # another key is not held up
    assert store.execution("nc").ckey == "other"


def test_the_release_frees_the_key_and_a_late_release_frees_nothing(store):
    store.key_concurrency = 1
    keyed(store, "a", "na")
    assert store.release("na", Ending(PayloadState.SUCCEEDED, NOW)) is not None
    assert store.key_state("tenant").holders == frozenset()
    keyed(store, "b", "nb")
    assert store.release("na", Ending(PayloadState.SUCCEEDED, NOW)) is None  # repeated event
    assert store.key_state("tenant").holders == {"nb"}
    with pytest.raises(KeyFull):
        keyed(store, "c", "nc")


def test_a_lease_refusal_comes_before_the_key(store):
    store.key_concurrency = 1
    keyed(store, "a", "na")
    with pytest.raises(LeaseHeld):
        keyed(store, "a", "na2")


def test_a_keys_own_cap_overrides_the_default_and_zero_pauses_it(store):
    store.key_concurrency = 1
    store.set_key_cap("tenant", 3)
    for n in range(3):
        keyed(store, f"p{n}", f"n{n}")
    with pytest.raises(KeyFull):
        keyed(store, "p3", "n3")
    store.set_key_cap("paused", 0)
    with pytest.raises(KeyFull):
        keyed(store, "q", "nq", ckey="paused")
    store.set_key_cap("paused", None)
    keyed(store, "q", "nq", ckey="paused")
    assert store.key_state("tenant").cap == 3 and store.key_state("paused").cap is None


def test_a_newcomer_waits_behind_the_line_and_a_woken_ticket_passes_it(store):
    store.key_concurrency = 1
    assert store.park_for_key(waiter(0), tickets=0)
    assert store.key_state("tenant").waiting == 1
    with pytest.raises(KeyFull):
        keyed(store, "new", "n-new")  # room, but somebody waits
    keyed(store, "p0", "n0", ticket=entry(0, NOW))  # a forged or stale entry passes too: no error
    assert store.key_state("tenant").holders == {"n0"}


def test_the_line_hands_out_tickets_in_order_and_a_stale_parker_is_refused(store):
    assert store.park_for_key(waiter(0), tickets=0)
    assert not store.park_for_key(waiter(1), tickets=0)  # ticket 0 is taken: read again
    assert store.park_for_key(waiter(1), tickets=1)
    assert store.park_for_key(waiter(2), tickets=2)
    assert store.keys_waiting() == {"tenant"}
    found = store.key_waiters("tenant", [2, 0, 1, 7])
    assert [(w.ticket, w.message_id) for w in found] == [(0, "msg-0"), (1, "msg-1"), (2, "msg-2")]
    assert found[0].attributes == {"sluice-concurrency-key": "tenant"} and found[0].parked_at == NOW

    assert store.advance_key("tenant", woken=0, to=2, now=NOW + 10)
    assert not store.advance_key("tenant", woken=0, to=1, now=NOW + 10)  # moved already
    assert [w.ticket for w in store.key_waiters("tenant", range(3))] == [2]
    sent = frozenset({entry(0, NOW + 10), entry(1, NOW + 10)})
    assert store.key_state("tenant") == KeyState("tenant", tickets=3, woken=2, inflight=sent)
    assert store.advance_key("tenant", woken=2, to=3, now=NOW + 20, drop=[entry(0, NOW + 10)])
    assert store.key_state("tenant").inflight == {entry(1, NOW + 10), entry(2, NOW + 20)}
    store.forget_key("tenant")
    assert store.keys_waiting() == {"tenant"}  # two are on the way


def test_a_woken_claim_takes_its_kept_slot_and_a_newcomer_waits_until_it_lands(store):
    store.key_concurrency = 2
    assert store.park_for_key(waiter(0), tickets=0)
    assert store.park_for_key(waiter(1), tickets=1)
    assert store.advance_key("tenant", woken=0, to=2, now=NOW)
    state = store.key_state("tenant")
    assert (state.waiting, state.room(2, NOW), state.room(2, NOW + 301)) == (0, 0, 2)
    with pytest.raises(KeyFull):
        keyed(store, "new", "n-new")  # nobody waits, but two are on the way
    keyed(store, "p0", "n0", ticket=entry(0, NOW))
    keyed(store, "p1", "n1", ticket=entry(1, NOW))
    state = store.key_state("tenant")
    assert (state.holders, state.inflight) == ({"n0", "n1"}, frozenset())
    store.release("n0", Ending(PayloadState.SUCCEEDED, NOW))
    keyed(store, "new", "n-new")
    store.forget_key("tenant")
    assert store.keys_waiting() == frozenset()


def test_a_woken_waiter_parking_again_gives_up_its_kept_slot(store):
    assert store.park_for_key(waiter(0), tickets=0)
    assert store.advance_key("tenant", woken=0, to=1, now=NOW)
    assert store.park_for_key(waiter(0), tickets=1, replaces=entry(0, NOW))
    state = store.key_state("tenant")
    assert (state.inflight, state.waiting, state.tickets) == (frozenset(), 1, 2)


def test_an_adopted_run_takes_a_slot_of_its_key_past_the_cap(store):
    store.key_concurrency = 1
    keyed(store, "a", "na")
    store.release("na", Ending(PayloadState.FAILED, NOW))
    keyed(store, "b", "nb")
    assert store.adopt(name="na", now=NOW + 5)  # redriven: it runs, so it counts
    assert store.key_state("tenant").holders == {"na", "nb"}
    store.release("nb", Ending(PayloadState.SUCCEEDED, NOW + 6))
    with pytest.raises(KeyFull):
        keyed(store, "c", "nc")  # still one running: na


def test_a_woken_waiter_that_will_not_claim_gives_its_kept_slot_back(store):
    store.key_concurrency = 1
    assert store.park_for_key(waiter(0), tickets=0)
    assert store.advance_key("tenant", woken=0, to=1, now=NOW)
    with pytest.raises(KeyFull):
        keyed(store, "new", "n-new")
    store.drop_inflight("tenant", [entry(0, NOW), entry(9, NOW)])  # one not there: ignored
    assert store.key_state("tenant").inflight == frozenset()
    keyed(store, "new", "n-new")


def test_a_rolled_back_woken_claim_keeps_its_slot_again(store):
    store.key_concurrency = 1
    assert store.park_for_key(waiter(0), tickets=0)
    assert store.advance_key("tenant", woken=0, to=1, now=NOW)
    keyed(store, "p0", "n0", ticket=entry(0, NOW))
    store.keep_inflight("tenant", [entry(0, NOW)])  # its start was refused: the message returns
    store.release("n0", Ending(PayloadState.RELEASED, NOW))
    state = store.key_state("tenant")
    assert (state.holders, state.inflight, state.room(1, NOW)) == (frozenset(), {entry(0, NOW)}, 0)


def test_a_claim_that_lands_before_its_wake_notes_it_keeps_no_second_slot(store):
    """The wake sends the waiter, then notes its entry; another launcher claims it in between. The
    entry noted after the claim must not keep a slot: the key's one slot is the run's, and once it
    ends the next waiter has room at once (not after INFLIGHT_SECONDS)."""
    store.key_concurrency = 1
    assert store.park_for_key(waiter(0), tickets=0)
    assert store.park_for_key(waiter(1), tickets=1)
    keyed(store, "p0", "n0", ticket=entry(0, NOW))  # claimed before the wake noted it
    assert store.advance_key("tenant", woken=0, to=1, now=NOW)  # the wake notes it now
    state = store.key_state("tenant")
    assert (state.holders, state.kept(NOW)) == ({"n0"}, 0)
    store.release("n0", Ending(PayloadState.SUCCEEDED, NOW + 1))
    state = store.key_state("tenant")
    assert state.room(1, NOW + 1) == 1 and state.stale(NOW + 1) == (entry(0, NOW),)
    assert store.advance_key("tenant", woken=1, to=2, now=NOW + 1, drop=state.stale(NOW + 1))
    state = store.key_state("tenant")
    assert (state.inflight, state.landed) == ({entry(1, NOW + 1)}, frozenset())  # dropped from both


def test_a_landed_note_waits_for_its_wake_whatever_the_readers_clock(store):
    """As above, and a launcher an hour behind the waker wakes the key between the claim and the
    wake's note (explorer seed 1206004492). Its clock dates the note an hour ahead; the note is still
    in the line (its ticket not yet woken), so it stays, and the entry noted after it keeps no slot."""
    store.key_concurrency = 1
    assert store.park_for_key(waiter(0), tickets=0)
    keyed(store, "p0", "n0", ticket=entry(0, NOW))  # claimed before the wake noted it
    behind = NOW - 3600
    state = store.key_state("tenant")
    assert state.stale(behind) == ()  # the note waits for its wake
    assert store.advance_key("tenant", woken=0, to=0, now=behind, drop=state.stale(behind))
    assert store.advance_key("tenant", woken=0, to=1, now=NOW)  # the wake notes it now
    store.release("n0", Ending(PayloadState.SUCCEEDED, NOW + 1))
    state = store.key_state("tenant")
    assert (state.kept(NOW + 1), state.room(1, NOW + 1)) == (0, 1)
    assert state.stale(behind) == (entry(0, NOW),)  # noted and landed: any clock drops it


@pytest.mark.parametrize("variant", ["landed_dropped_by_clock", "landed_dropped_at_once"])
def test_a_landed_note_dropped_before_its_wake_is_caught(store, monkeypatch, variant):
    """The variants (tests/explorer/broken.py): the note judged by the reader's clock (the code
    before explorer seed 1206004492's fix), or dropped at the next wake whatever it waits for."""
    from tests.explorer.broken import VARIANTS

    for owner, attr, value in VARIANTS[variant][1]:
        monkeypatch.setattr(owner, attr, value)
    with pytest.raises(AssertionError):
        test_a_landed_note_waits_for_its_wake_whatever_the_readers_clock(store)


def test_a_woken_waiter_parked_again_before_its_wake_notes_it_keeps_no_slot(store):
    """The wake sends the waiter, then notes its entry; another launcher receives it in between and
    parks it again (its key's rate had no grant for it). The entry noted after that park must keep no
    slot: nothing of it is on the way, and the line behind it must not wait INFLIGHT_SECONDS.

        wake (launcher A)                 launcher B
        send W0 (entry e)
                                          receive W0, no grant: park again as ticket 1, replacing e
        woken 0 → 1, inflight += e        (e must keep nothing)
    """
    store.key_concurrency = 1
    assert store.park_for_key(waiter(0), tickets=0)
    assert store.park_for_key(waiter(0), tickets=1, replaces=entry(0, NOW))  # before the wake noted it
    assert store.advance_key("tenant", woken=0, to=1, now=NOW)  # the wake notes it now
    state = store.key_state("tenant")
    assert (state.kept(NOW), state.room(1, NOW), state.waiting) == (0, 1, 1)
    assert state.stale(NOW) == (entry(0, NOW),)  # the next wake drops it from both sets
    assert store.advance_key("tenant", woken=1, to=2, now=NOW, drop=state.stale(NOW))
    state = store.key_state("tenant")
    assert (state.inflight, state.landed) == ({entry(1, NOW)}, frozenset())


def test_a_woken_waiter_that_forgoes_its_slot_before_its_wake_notes_it_keeps_none(store):
    """As above, but the waiter does not claim at all (a duplicate, already run): it gives its slot
    back (``keys.forgo``) before the wake notes its entry."""
    store.key_concurrency = 1
    assert store.park_for_key(waiter(0), tickets=0)
    assert store.park_for_key(waiter(1), tickets=1)
    store.drop_inflight("tenant", [entry(0, NOW)])  # forgone before the wake noted it
    assert store.advance_key("tenant", woken=0, to=1, now=NOW)
    state = store.key_state("tenant")
    assert (state.kept(NOW), state.room(1, NOW)) == (0, 1)
    assert store.advance_key("tenant", woken=1, to=2, now=NOW, drop=state.stale(NOW))
    state = store.key_state("tenant")
    assert (state.inflight, state.landed) == ({entry(1, NOW)}, frozenset())


def test_a_forgone_entry_behind_the_line_is_not_noted_landed(store):
    """An entry its wake noted already (its ticket behind ``woken``), or a forged one, is only taken
    out of ``inflight``: noted ``landed`` on a key nobody waits for, no wake would ever drop it."""
    assert store.park_for_key(waiter(0), tickets=0)
    assert store.advance_key("tenant", woken=0, to=1, now=NOW)  # nobody waits now
    store.drop_inflight("tenant", [entry(0, NOW), entry(7, NOW), "0@999999999999999999"])
    state = store.key_state("tenant")
    assert (state.inflight, state.landed) == (frozenset(), frozenset())


def test_a_key_taken_off_the_sweeps_list_keeps_no_landed_entries(store):
    """A forged ticket parked again is noted ``landed``; no wake drops it once nobody waits, so the
    key's ``forget_key`` (nobody in the line, nothing on the way) clears ``landed``."""
    store.key_concurrency = 1
    forged = f"3@{int(NOW * 1000)}"
    assert store.park_for_key(waiter(0), tickets=0, replaces=forged)
    assert store.key_state("tenant").landed == {forged}
    assert store.advance_key("tenant", woken=0, to=1, now=NOW)
    keyed(store, "p0", "n0", ticket=entry(0, NOW))  # its claim takes its entry: nobody waits
    store.forget_key("tenant")
    state = store.key_state("tenant")
    assert (state.landed, state.inflight, "tenant" in store.keys_waiting()) == (
        frozenset(),
        frozenset(),
        False,
    )


def test_a_landed_claim_rolled_back_keeps_its_slot_again(store):
    store.key_concurrency = 1
    assert store.park_for_key(waiter(0), tickets=0)
    keyed(store, "p0", "n0", ticket=entry(0, NOW))  # before the wake noted it
    store.keep_inflight("tenant", [entry(0, NOW)])  # its start was refused: the message returns
    store.release("n0", Ending(PayloadState.RELEASED, NOW))
    state = store.key_state("tenant")
    assert (state.inflight, state.landed, state.room(1, NOW)) == ({entry(0, NOW)}, frozenset(), 0)


# -- a fair lane's tenants (sluice.features.fair) --------------------------------------------------------------


def test_a_claim_from_a_fair_lane_has_no_default_cap_but_keeps_the_keys_own(store):
    store.key_concurrency = 1
    assert store.park_for_key(waiter(0), tickets=0, fair="shared")
    store.advance_key("tenant", woken=0, to=1, now=NOW)  # its one waiter woken: nobody waits now
    assert store.key_state("tenant").fair == "shared"
    for i in range(3):  # past the default of 1
        claim(
            store,
            f"k{i}",
            f"n{i}",
            limit=50,
            message_id=f"m-n{i}",
            ckey="tenant",
            ticket=entry(0, NOW) if i == 0 else None,
            uncapped=True,
        )
    assert store.key_state("tenant").holders == {"n0", "n1", "n2"}
    with pytest.raises(KeyFull):  # a claim from an ordinary lane: the default cap, whatever the mark
        keyed(store, "k3", "n3")
    store.set_key_cap("tenant", 3)
    with pytest.raises(KeyFull):
        claim(store, "k4", "n4", limit=50, message_id="m-n4", ckey="tenant", uncapped=True)


def test_key_states_reads_many_keys_at_once(store):
    assert store.park_for_key(waiter(0, ckey="t0"), tickets=0, fair="shared")
    keyed(store, "a", "na", ckey="t1")
    states = store.key_states(["t0", "t1", "nobody"])
    assert states["t0"].waiting == 1 and states["t0"].fair == "shared"
    assert states["t1"].holders == {"na"} and states["t1"].fair is None
    assert states["nobody"] == KeyState("nobody")


def test_a_tenant_whose_line_empties_is_no_longer_its_lanes_tenant(store):
    assert store.park_for_key(waiter(0), tickets=0, fair="shared")
    store.forget_key("tenant")  # one waits: it stays
    assert store.key_state("tenant").fair == "shared" and "tenant" in store.keys_waiting()
    store.advance_key("tenant", woken=0, to=1, now=NOW)
    store.drop_inflight("tenant", [entry(0, NOW)])
    store.forget_key("tenant")
    assert store.key_state("tenant").fair is None and "tenant" not in store.keys_waiting()


def test_a_fair_newcomer_claims_only_while_nobody_waits_and_has_no_default_cap(store):
    store.key_concurrency = 1
    for i in range(2):
        claim(
            store,
            f"k{i}",
            f"n{i}",
            limit=50,
            message_id=f"m-{i}",
            ckey="tenant",
            fair_newcomer=True,
            uncapped=True,
        )
    assert store.key_state("tenant").holders == {"n0", "n1"}
    assert store.park_for_key(waiter(0, ckey="other"), tickets=0, fair="shared")
    with pytest.raises(KeyFull):
        claim(store, "k2", "n2", limit=50, message_id="m-2", ckey="tenant", fair_newcomer=True, uncapped=True)
    assert store.execution("n2") is None and "n2" not in store.ledger().holders


def _full_key_on_moto(session):
    """A DynamoStore on moto whose key ``tenant`` (cap 1) is full: a wake sends nobody."""
    from sluice.adapters.dynamo.store import DynamoStore, create_table
    from tests.contract.stores import RETENTION

    client = session.client("dynamodb")
    create_table(client, "contract")
    store = DynamoStore(client, "contract", retention_seconds=RETENTION, slots_per_shard=2)
    store.key_concurrency = 1
    keyed(store, "p0", "n0")
    return client, store


def _parks_noted(client) -> list[bool]:
    """For each TransactWriteItems the client sends, whether it is a park on key ``tenant``."""
    parking: list[bool] = []

    def note_the_park(params, **_):
        first = params["TransactItems"][0].get("Update", {})
        names = first.get("ExpressionAttributeNames", {})
        parking.append(first.get("Key") == {"pk": {"S": "CKEY#tenant"}} and "#tickets" in names)

    client.meta.events.register("before-parameter-build.dynamodb.TransactWriteItems", note_the_park)
    return parking


def test_a_park_whose_answer_is_lost_is_known_parked_though_its_payload_parked_again_since(session):
    """Explorer seed 1206101088: a tick parks message m1 of payload p (ticket 0) and the answer is
    lost; before it reads where p waits, another launcher parks m2, another message of p (ticket 1).
    The index by payload (``KWAITOF#p``) now names m2's place, so the tick took its park for not
    landed and handed m1 back to the queue, where it spent receives while it waited. The line's
    own item for the ticket says whose it is."""
    from botocore.exceptions import ReadTimeoutError

    from sluice.adapters.memory.aws import MemoryQueue
    from sluice.core.clock import FakeClock
    from sluice.core.model import Message, Payload
    from sluice.features import keys

    client, store = _full_key_on_moto(session)
    fired: list[str] = []
    parking = _parks_noted(client)

    def lose_the_first_park(**_):
        if fired or not parking.pop():
            return
        fired.append("lost")
        assert store.park_for_key(replace(waiter(2), key="p", message_id="m2"), tickets=1)
        raise ReadTimeoutError(endpoint_url="https://dynamodb")

    client.meta.events.register("after-call.dynamodb.TransactWriteItems", lose_the_first_park)
    message = Message(message_id="m1", receipt_handle="r", body='{"id": "p"}', group_id="g")
    ticket = keys.wait(
        store=store,
        queue=MemoryQueue(clock=FakeClock(NOW)),
        payload=Payload("p", message.body, message),
        ckey="tenant",
        now=NOW,
    )
    assert fired == ["lost"]
    assert ticket == 0
    assert [(w.ticket, w.message_id) for w in store.key_waiters("tenant", range(2))] == [(0, "m1"), (1, "m2")]


def test_a_lost_park_refused_for_another_payloads_message_of_the_same_origin_returns_it(session):
    """Two payloads' messages carry one origin (a producer's ``sluice-origin-message-id``, well
    formed). Launcher L1 parks A (payload pA) as ticket 0 just before L2's park of B (payload pB)
    reaches DynamoDB: B's is refused, and its answer is lost. The line's item for ticket 0 has B's
    message id; judged by it alone, B was taken for parked and deleted, and pB never ran. Its
    payload key says it is A's: B goes back to the queue."""
    from botocore.exceptions import ReadTimeoutError

    from sluice.adapters.memory.aws import MemoryQueue
    from sluice.core.clock import FakeClock
    from sluice.core.errors import TransientError
    from sluice.core.model import Message, Payload
    from sluice.core.names import ORIGIN_ATTRIBUTE
    from sluice.features import keys

    client, store = _full_key_on_moto(session)
    fired: list[str] = []
    parking = _parks_noted(client)

    def another_launcher_parks_a_first(**_):
        if fired or not parking[-1]:
            return
        fired.append("A parked")
        assert store.park_for_key(replace(waiter(1), key="pA", message_id="X"), tickets=0)

    def lose_the_answer(**_):
        if fired == ["A parked"]:
            fired.append("lost")
            raise ReadTimeoutError(endpoint_url="https://dynamodb")

    client.meta.events.register("before-call.dynamodb.TransactWriteItems", another_launcher_parks_a_first)
    client.meta.events.register("after-call.dynamodb.TransactWriteItems", lose_the_answer)
    b = Message(
        message_id="sqs-b",
        receipt_handle="r",
        body='{"id": "pB"}',
        group_id="gB",
        attributes={ORIGIN_ATTRIBUTE: "X", "sluice-concurrency-key": "tenant"},
    )
    with pytest.raises(TransientError):
        keys.wait(
            store=store,
            queue=MemoryQueue(clock=FakeClock(NOW)),
            payload=Payload("pB", b.body, b),
            ckey="tenant",
            now=NOW,
        )
    assert fired == ["A parked", "lost"]
    assert [(w.ticket, w.key) for w in store.key_waiters("tenant", range(3))] == [(0, "pA")]


def test_a_lost_park_judged_by_the_payloads_index_is_caught(session, monkeypatch):
    """The variant ``park_checked_by_the_payloads_index`` (tests/explorer/broken.py) fails the test above."""
    from sluice.core.errors import TransientError
    from tests.explorer.broken import VARIANTS

    for owner, attr, value in VARIANTS["park_checked_by_the_payloads_index"][1]:
        monkeypatch.setattr(owner, attr, value)
    with pytest.raises(TransientError):
        test_a_park_whose_answer_is_lost_is_known_parked_though_its_payload_parked_again_since(session)


def test_a_lost_park_judged_by_its_message_id_alone_is_caught(session, monkeypatch):
    """The variant ``park_checked_by_message_id_alone`` (tests/explorer/broken.py) fails the test above."""
    from tests.explorer.broken import VARIANTS

    for owner, attr, value in VARIANTS["park_checked_by_message_id_alone"][1]:
        monkeypatch.setattr(owner, attr, value)
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        test_a_lost_park_refused_for_another_payloads_message_of_the_same_origin_returns_it(session)

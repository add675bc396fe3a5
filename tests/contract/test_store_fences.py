"""The store contract, continued: renewals and fences, adoption, expiry, history, the waiting room.
Run against MemoryStore and DynamoStore (moto) like the rest of the contract."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sluice.core.errors import LeaseHeld
from sluice.core.model import REDRIVE_WINDOW_SECONDS, ClaimFence, Ending, ParkedMessage, PayloadState
from sluice.core.names import named_entry
from tests.contract.stores import NOW, RETENTION, claim


def test_live_records_never_expire_and_expire_the_retention_after_the_end(store):
    claim(store, "k", "n1")
    store.mark_running(key="k", name="n1", arn="arn:x", started_at=NOW, now=NOW)
    assert store.payload("k").expires_at == 0 and store.execution("n1").expires_at == 0
    ended = NOW + 400 * 86_400
    store.release("n1", Ending(PayloadState.SUCCEEDED, ended))
    assert store.payload("k").expires_at == int(ended) + RETENTION
    # a name that ran outlives the queue's 14 days, whatever the retention (sluice.core.model.record_expiry)
    assert store.execution("n1").expires_at == int(ended) + max(RETENTION, REDRIVE_WINDOW_SECONDS + 86_400)
    claim(store, "k", "n2", now=ended + 1)
    assert store.payload("k").expires_at == 0  # claimed again: live again


def test_a_record_that_ran_outlives_the_redrive_window_and_the_queue_whatever_the_retention(store):
    """RetentionDays may be shorter than RedriveExecution's 14 days; a redriven execution's record is
    the only place its key is written, so a FAILED, TIMED_OUT or ABORTED one is kept 15 days; and
    any that ran, so that a message of its name (14 days at most in the queue) is refused."""
    assert RETENTION < REDRIVE_WINDOW_SECONDS
    for i, state in enumerate(PayloadState):
        if not state.ended:
            continue
        key, name = f"k{i}", f"n{i}"
        claim(store, key, name)
        store.release(name, Ending(state, NOW))
        kept = store.execution(name).expires_at - int(NOW)
        assert kept == REDRIVE_WINDOW_SECONDS + 86_400, state  # a name that ran: past the queue's 14 days too
        assert store.payload(key).expires_at == int(NOW) + RETENTION  # the lease record: retention


def test_the_claim_records_the_arn_it_runs_under(store):
    claim(store, "k", "n1")
    assert store.execution("n1").arn == "arn:aws:states:us-east-1:123456789012:execution:sm:n1"


def test_renew_only_while_claimed_and_it_bumps_the_version(store):
    claim(store, "k", "n1")
    assert store.renew(name="n1", now=NOW + 10, claim_expires_at=NOW + 910)
    record = store.execution("n1")
    assert (record.claim_version, record.claim_expires_at) == (1, NOW + 910)
    store.mark_running(key="k", name="n1", arn="arn:x", started_at=NOW, now=NOW)
    assert not store.renew(name="n1", now=NOW + 20, claim_expires_at=NOW + 920)  # started: nothing to renew
    assert not store.renew(name="missing", now=NOW, claim_expires_at=NOW)


def test_a_fenced_release_fails_once_the_claim_was_renewed(store):
    claim(store, "k", "n1")
    assert store.suspect(name="n1", claim_version=0, reconciler="r1", now=NOW + 60)
    judged = store.execution("n1")
    assert (judged.suspect_since, judged.suspect_by, judged.fence) == (
        NOW + 60,
        "r1",
        ClaimFence(0, NOW + 60),
    )
    assert store.renew(name="n1", now=NOW + 61, claim_expires_at=NOW + 961)
    assert store.execution("n1").fence is None  # renewed: the suspicion is gone
    assert store.release("n1", Ending(PayloadState.RELEASED, NOW + 2000), fence=judged.fence) is None
    assert store.ledger().holders == {"n1"} and store.payload("k").holder == "n1"


def test_a_fenced_release_frees_an_unchanged_claim(store):
    claim(store, "k", "n1")
    store.suspect(name="n1", claim_version=0, reconciler="r1", now=NOW + 60)
    judged = store.execution("n1")
    assert store.release("n1", Ending(PayloadState.RELEASED, NOW + 960), fence=judged.fence) is not None
    assert store.ledger().holders == frozenset() and store.payload("k").state is PayloadState.RELEASED


def test_suspicion_is_marked_once_and_replaced_only_knowingly(store):
    claim(store, "k", "n1")
    assert store.suspect(name="n1", claim_version=0, reconciler="r1", now=NOW + 60)
    assert not store.suspect(name="n1", claim_version=0, reconciler="r2", now=NOW + 70)
    assert not store.suspect(name="n1", claim_version=0, reconciler="r2", now=NOW + 70, replacing=NOW + 1)
    assert store.suspect(name="n1", claim_version=0, reconciler="r2", now=NOW + 80, replacing=NOW + 60)
    assert store.execution("n1").suspect_by == "r2"
    assert not store.suspect(name="n1", claim_version=1, reconciler="r3", now=NOW + 90, replacing=NOW + 80)


def test_a_started_claim_cannot_be_released_by_a_fence(store):
    claim(store, "k", "n1")
    store.suspect(name="n1", claim_version=0, reconciler="r1", now=NOW + 60)
    judged = store.execution("n1")
    store.mark_running(key="k", name="n1", arn="arn:x", started_at=NOW, now=NOW + 61)
    assert store.release("n1", Ending(PayloadState.RELEASED, NOW + 960), fence=judged.fence) is None
    assert store.ledger().holders == {"n1"}


def test_adopt_takes_back_a_slot_and_the_lease_past_the_limit(store):
    for i in range(2):
        claim(store, f"k{i}", f"n{i}", limit=2)
    store.release("n0", Ending(PayloadState.FAILED, NOW))
    claim(store, "k2", "n2", limit=2)  # the ledger is full again
    assert store.adopt(name="n0", now=NOW + 5)  # n0 was redriven: it runs, so it holds a slot
    assert store.ledger().holders == {"n0", "n1", "n2"}
    assert (store.payload("k0").holder, store.payload("k0").state) == ("n0", PayloadState.RUNNING)
    assert store.execution("n0").state is PayloadState.RUNNING and store.execution("n0").expires_at == 0
    assert not store.adopt(name="n0", now=NOW + 6)  # holds it already


def test_an_adoption_keeps_each_clocks_first_sighting_of_it_and_no_earlier_adoptions(store):
    """Each clock judges an adoption's age from its own first sighting (``Clock.identity``): the
    adopter's is its adoption; another's is added only while the adoption it read is the one held
    (its stamp and its count), and never replaced; a new adoption drops the earlier one's, also one
    stamped with the same time."""
    claim(store, "k", "n1")
    store.release("n1", Ending(PayloadState.FAILED, NOW))
    assert store.adopt(name="n1", now=NOW + 5, by="a")
    first = store.execution("n1")
    assert first.adoption_seen == (("a", NOW + 5, NOW + 5),) and first.seen_by("a") == NOW + 5
    assert store.sight_adoption(record=first, by="b", now=NOW + 200)
    assert not store.sight_adoption(record=first, by="b", now=NOW + 250)  # b's first stays
    assert not store.sight_adoption(record=first, by="a", now=NOW + 250)
    assert store.execution("n1").seen_by("b") == NOW + 200 and store.execution("n1").seen_by("c") is None
    store.release("n1", Ending(PayloadState.FAILED, NOW + 300))
    assert not store.sight_adoption(record=first, by="c", now=NOW + 301)  # released
    assert store.adopt(name="n1", now=NOW + 5)  # again, no clock named, the same stamp as the first
    assert store.execution("n1").adoption_seen == ()
    assert not store.sight_adoption(record=first, by="c", now=NOW + 401)  # read of the first adoption
    again = store.execution("n1")
    assert store.sight_adoption(record=again, by="c", now=NOW + 402)
    assert store.execution("n1").seen_by("c") == NOW + 402


def test_adopt_is_refused_while_another_run_holds_the_key(store):
    claim(store, "k", "n1")
    store.release("n1", Ending(PayloadState.FAILED, NOW))
    claim(store, "k", "n2")
    assert not store.adopt(name="n1", now=NOW + 5)
    assert store.ledger().holders == {"n2"} and store.payload("k").holder == "n2"


def test_a_key_marked_for_its_redriven_run_refuses_claims_until_adopted(store):
    claim(store, "k", "n1")
    store.release("n1", Ending(PayloadState.FAILED, NOW))
    claim(store, "k", "n2")
    assert not store.mark_redriven(key="k", name="n2", now=NOW + 4)  # the holder itself: no mark
    assert store.mark_redriven(key="k", name="n1", now=NOW + 5)
    store.release("n2", Ending(PayloadState.SUCCEEDED, NOW + 6))
    with pytest.raises(LeaseHeld) as held:
        claim(store, "k", "n3")
    assert (held.value.existing.holder, held.value.existing.redriven) == (None, "n1")
    assert store.adopt(name="n1", now=NOW + 7)
    assert store.payload("k").redriven is None and store.payload("k").holder == "n1"


def test_a_mark_is_lifted_only_for_the_run_it_names(store):
    claim(store, "k", "n1")
    store.release("n1", Ending(PayloadState.FAILED, NOW))
    claim(store, "k", "n2")
    assert store.mark_redriven(key="k", name="n1", now=NOW + 5)
    store.release("n2", Ending(PayloadState.SUCCEEDED, NOW + 6))
    assert not store.clear_redriven(key="k", name="n9")
    assert store.clear_redriven(key="k", name="n1")
    claim(store, "k", "n3")
    assert store.payload("k").holder == "n3"


def test_a_free_key_is_marked_for_a_run_that_may_run_again(store):
    """Reconciliation unsure whether a released run was redriven marks its free key: no claim takes
    the lease until the mark is lifted or the run adopted. No mark on a key without a record, nor
    by the run that holds it."""
    claim(store, "k", "n1")
    store.release("n1", Ending(PayloadState.FAILED, NOW))
    assert store.mark_redriven(key="k", name="n1", now=NOW + 5)
    assert store.payload("k").redriven == "n1" and store.payload("k").updated_at == NOW + 5
    with pytest.raises(LeaseHeld) as held:
        claim(store, "k", "n2")
    assert (held.value.existing.holder, held.value.existing.redriven) == (None, "n1")
    assert store.clear_redriven(key="k", name="n1")
    claim(store, "k", "n2")
    assert not store.mark_redriven(key="k", name="n2", now=NOW + 6)  # it holds the key
    assert not store.mark_redriven(key="none", name="n1", now=NOW + 6)
    assert store.payload("none") is None


def test_the_payload_history_is_bounded(store):
    for i in range(45):
        claim(store, "k", f"n{i}", now=NOW + i)
        store.release(f"n{i}", Ending(PayloadState.SUCCEEDED, NOW + i))
    payload = store.payload("k")
    assert payload.attempts == 45 and payload.executions[-1] == "n44"
    assert 10 < len(payload.executions) <= 20
    assert list(payload.executions) == [f"n{i}" for i in range(45 - len(payload.executions), 45)]


def parked(message_id: str, holder: str, at: float = NOW, copy: int = 1) -> ParkedMessage:
    """A copy of ``message_id`` (its ``copy``: the SQS message id of the n-th send of it)."""
    return ParkedMessage(
        message_id, "k", holder, '{"id": "k"}', "g1", {"sluice-key": "k"}, at, f"{message_id}.{copy}"
    )


def entry(message_id: str) -> str:
    """Its entry in a holder's ``parked`` set (``ParkedMessage.entry``): by the name it runs under."""
    return named_entry("k", message_id)


def wake(store, holder: str, ids) -> None:
    """A wake-up as ``sluice.features.parking.wake`` makes it: the copies it reads, re-sent, marked woken."""
    store.unpark(holder, ids, woken=store.parked_messages(holder, ids), now=NOW + 50)


def test_parking_behind_a_live_holder_and_waking(store):
    claim(store, "k", "n1")
    assert store.park(parked("m2", "n1", NOW + 1))
    assert store.park(parked("m3", "n1", NOW + 2))
    assert store.park(parked("m2", "n1", NOW + 1))  # a redelivered message: parked already
    assert store.parked_holders() == {"n1"}
    released = store.release("n1", Ending(PayloadState.SUCCEEDED, NOW + 5))
    assert released.parked == {entry("m2"), entry("m3")}
    waiting = store.parked_messages("n1", released.parked)
    assert [p.message_id for p in waiting] == ["m2", "m3"]
    assert waiting[0] == parked("m2", "n1", NOW + 1)
    store.unpark("n1", [entry("m2"), entry("m3")], woken=waiting, now=NOW + 6)
    assert store.parked_messages("n1", released.parked) == [] and store.parked_holders() == frozenset()


def test_parking_behind_an_ended_holder_is_refused(store):
    claim(store, "k", "n1")
    store.release("n1", Ending(PayloadState.SUCCEEDED, NOW))
    assert not store.park(parked("m2", "n1"))
    assert not store.park(parked("m2", "nobody"))
    assert store.parked_holders() == frozenset()


def test_a_woken_message_can_be_parked_again_behind_a_new_holder(store):
    claim(store, "k", "n1")
    store.park(parked("m2", "n1"))
    store.release("n1", Ending(PayloadState.SUCCEEDED, NOW))
    claim(store, "k", "n3")  # another message took the key before the woken copy came back
    assert store.park(parked("m2", "n3", NOW + 9))
    assert store.parked_messages("n1", [entry("m2")]) == []  # no longer waiting for n1
    assert [p.holder for p in store.parked_messages("n3", [entry("m2")])] == ["n3"]
    store.unpark("n1", [entry("m2")], now=NOW + 10)  # a late wake-up of n1 leaves n3's entry alone
    assert [p.holder for p in store.parked_messages("n3", [entry("m2")])] == ["n3"]
    assert store.parked_holders() == {"n3"}


def test_a_name_claimed_again_keeps_what_waits_behind_its_earlier_claim(store):
    """A release whose wake-up was lost (a crash between the two) and whose name is then claimed
    again by its own message, back after a rollback: the messages parked behind the first claim
    are listed by the second, so its end wakes them. A fresh record would erase them for good."""
    claim(store, "k", "n1")
    assert store.park(parked("m2", "n1"))
    store.release("n1", Ending(PayloadState.RELEASED, NOW + 1))  # rolled back; no wake
    claim(store, "k", "n1", now=NOW + 2)  # the same message, the same name
    assert store.execution("n1").parked == {entry("m2")}
    released = store.release("n1", Ending(PayloadState.SUCCEEDED, NOW + 3))
    assert released.parked == {entry("m2")}
    assert [p.message_id for p in store.parked_messages("n1", released.parked)] == ["m2"]


def test_a_name_claimed_again_after_its_wake_up_starts_with_nothing_parked(store):
    claim(store, "k", "n1")
    assert store.park(parked("m2", "n1"))
    released = store.release("n1", Ending(PayloadState.RELEASED, NOW + 1))
    wake(store, "n1", released.parked)
    claim(store, "k", "n1", now=NOW + 2)
    assert store.execution("n1").parked == frozenset()


def test_a_late_wake_up_takes_out_only_what_it_woke(store):
    """The wake-up of a released claim, late: meanwhile its name was claimed again (the same
    message, back after a rollback), carrying what it was waking, and another message parked
    behind the new claim. That message must stay listed, and its holder on the index, for the new
    claim's end (or the sweep) to wake it."""
    claim(store, "k", "n1")
    assert store.park(parked("m1", "n1"))
    released = store.release("n1", Ending(PayloadState.RELEASED, NOW + 1))
    assert released.parked == {entry("m1")}
    woken = store.parked_messages("n1", released.parked)  # re-sent
    claim(store, "k", "n1", now=NOW + 2)  # before the wake-up's unpark
    assert store.park(parked("m2", "n1", NOW + 3))
    store.unpark("n1", released.parked, woken=woken, now=NOW + 4)  # the first release's wake-up ends
    assert store.execution("n1").parked == {entry("m2")}
    assert store.parked_holders() == {"n1"}
    again = store.release("n1", Ending(PayloadState.SUCCEEDED, NOW + 5))
    assert [p.message_id for p in store.parked_messages("n1", again.parked)] == ["m2"]
    wake(store, "n1", again.parked)
    assert store.parked_holders() == frozenset() and store.execution("n1").parked == frozenset()


def test_a_copy_parked_again_while_its_wake_up_is_on_its_way_stays_parked(store):
    """A release's wake-up re-sends m (copy 2) and, before its mark, the name is claimed again and
    copy 2 parks behind the new claim: the mark is for copy 1 and leaves copy 2 parked, listed and
    indexed. Told apart by the message id alone, copy 2 was taken for copy 1 (a redelivery) and
    deleted, and the mark then lost m (tests/integration/test_repark_copies_moto.py)."""
    claim(store, "k", "n1")
    assert store.park(parked("m2", "n1"))
    assert store.park(parked("m2", "n1"))  # a redelivery of copy 1: parked already
    released = store.release("n1", Ending(PayloadState.RELEASED, NOW + 1))
    woken = store.parked_messages("n1", released.parked)
    claim(store, "k", "n1", now=NOW + 2)  # carrying m2
    assert store.park(parked("m2", "n1", NOW + 3, copy=2))
    store.unpark("n1", released.parked, woken=woken, now=NOW + 4)
    assert [p.copy_id for p in store.parked_messages("n1", [entry("m2")])] == ["m2.2"]
    assert store.execution("n1").parked == {entry("m2")} and store.parked_holders() == {"n1"}


def test_messages_of_two_keys_with_one_origin_park_apart(store):
    """A producer's message of another key carrying the same ``sluice-origin-message-id`` is another
    message (another name): it parks beside the one waiting, never over it."""
    claim(store, "k", "n1")
    claim(store, "j", "n2")
    a, b = parked("m2", "n1"), replace(parked("m2", "n2", copy=2), key="j")
    assert a.entry != b.entry
    assert store.park(a) and store.park(b)
    assert store.parked_messages("n1", [a.entry]) == [a]
    assert store.parked_messages("n2", [b.entry]) == [b]


def test_an_unpark_of_ids_no_longer_waiting_still_empties_the_index(store):
    """A parked id that was re-parked behind another holder is not re-sent by this holder's
    wake-up, but is taken off its set all the same: else the holder stays on the index for good."""
    claim(store, "k", "n1")
    store.park(parked("m2", "n1"))
    released = store.release("n1", Ending(PayloadState.SUCCEEDED, NOW))
    claim(store, "k", "n3")
    assert store.park(parked("m2", "n3", NOW + 9))  # the woken copy came back and parked again
    assert store.parked_messages("n1", released.parked) == []
    store.unpark("n1", released.parked, now=NOW + 10)
    assert store.parked_holders() == {"n3"} and store.execution("n1").parked == frozenset()


def test_a_claim_carries_its_start_mark_until_a_renewal_lifts_it(store):
    """A fresh claim is written with its start mark: a block is refused until a renewal (a resumed
    claim) lifts the mark, and refused again once the resume marks it anew."""
    claim(store, "k", "n1")
    assert store.execution("n1").starting_at == NOW
    assert not store.block(name="n1", by="redriven", now=NOW + 1)
    assert store.renew(name="n1", now=NOW + 2, claim_expires_at=NOW + 902)
    assert store.execution("n1").starting_at is None
    assert store.mark_starting(name="n1", now=NOW + 3)
    assert not store.block(name="n1", by="redriven", now=NOW + 4)
    assert store.execution("n1").blocked_by is None and store.execution("n1").starting_at == NOW + 3


def test_a_start_mark_is_lifted_only_by_the_copy_that_wrote_it(store):
    """Two copies of one message (one origin id: one name). A renewal by another copy leaves the
    mark of the copy that claimed (its invocation may be about to start it); the claiming copy's
    redelivery lifts it, and from then on only the copy that renewed last may mark it."""
    claim(store, "k", "n1", message_id="m1", copy_id="c1")
    assert store.execution("n1").copy_id == "c1"
    assert not store.renew(name="n1", now=NOW + 1, claim_expires_at=NOW + 901, copy_id="c2")
    assert store.execution("n1").starting_at == NOW and store.execution("n1").claim_version == 0
    assert store.renew(name="n1", now=NOW + 2, claim_expires_at=NOW + 902, copy_id="c1")
    assert store.renew(name="n1", now=NOW + 3, claim_expires_at=NOW + 903, copy_id="c2")  # unmarked
    assert not store.mark_starting(name="n1", now=NOW + 4, copy_id="c1")  # c2 renewed since
    assert store.mark_starting(name="n1", now=NOW + 5, copy_id="c2")
    assert not store.renew(name="n1", now=NOW + 6, claim_expires_at=NOW + 906, copy_id="c1")
    assert store.execution("n1").copy_id == "c2" and store.execution("n1").claim_version == 2


def test_a_blocked_claim_is_never_renewed(store):
    claim(store, "k", "n1")
    assert store.renew(name="n1", now=NOW + 2, claim_expires_at=NOW + 902)  # a resume: the mark lifted
    assert store.block(name="n1", by="redriven", now=NOW + 5)
    assert store.execution("n1").blocked_by == "redriven"
    assert not store.renew(name="n1", now=NOW + 10, claim_expires_at=NOW + 910)
    assert not store.mark_starting(name="n1", now=NOW + 10)
    assert store.execution("n1").claim_version == 1
    claim(store, "j", "n2")
    store.mark_running(key="j", name="n2", arn="arn:x", started_at=NOW, now=NOW)
    assert not store.block(name="n2", by="redriven", now=NOW)  # started: nothing to block
    assert not store.block(name="missing", by="redriven", now=NOW)

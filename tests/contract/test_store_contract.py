"""One contract for the Store port, run against MemoryStore and DynamoStore (moto)."""

from __future__ import annotations

import threading

import pytest

from sluice.core.errors import AlreadyRan, LeaseHeld, SlotsFull
from sluice.core.limits import LimitSource
from sluice.core.model import Claim, Ending, PayloadState
from tests.contract.stores import NOW, claim


def test_claim_takes_a_slot_and_the_lease(store):
    claim(store, "k", "n1", message_id="m1")
    assert store.ledger().holders == {"n1"}
    payload = store.payload("k")
    assert (payload.state, payload.holder, payload.executions, payload.attempts) == (
        PayloadState.CLAIMED,
        "n1",
        ("n1",),
        1,
    )
    record = store.execution("n1")
    assert (record.key, record.message_id, record.state, record.claim_expires_at) == (
        "k",
        "m1",
        PayloadState.CLAIMED,
        NOW + 900,
    )


def test_a_live_lease_refuses_a_second_claim_and_shows_the_holder(store):
    claim(store, "k", "n1")
    with pytest.raises(LeaseHeld) as held:
        claim(store, "k", "n2")
    assert held.value.existing.holder == "n1" and held.value.existing.key == "k"
    with pytest.raises(LeaseHeld) as again:
        claim(store, "k", "n1")  # the same name: the caller resumes
    assert again.value.existing.holder == "n1"
    assert store.ledger().holders == {"n1"}


def test_the_limit_is_exact(store):
    for i in range(3):
        claim(store, f"k{i}", f"n{i}", limit=3)
    with pytest.raises(SlotsFull):
        claim(store, "k3", "n3", limit=3)
    with pytest.raises(SlotsFull):
        claim(store, "k3", "n3", limit=0)
    assert store.payload("k3") is None and len(store.ledger().holders) == 3


def test_limit_zero_on_an_empty_ledger_admits_nothing(store):
    with pytest.raises(SlotsFull):
        claim(store, "k", "n", limit=0)
    assert store.ledger().holders == frozenset()


def test_no_claim_is_admitted_before_a_limit_was_put_in_force(store):
    assert store.ledger().in_force is None
    with pytest.raises(SlotsFull):
        store.claim(Claim(key="k", name="n", message_id="m", now=NOW, claim_expires_at=NOW + 900))
    assert store.payload("k") is None and store.ledger().holders == frozenset()


def test_external_counts_are_numbered_and_an_older_one_never_overwrites_a_newer(store):
    first, second = store.next_count(), store.next_count()
    assert second == first + 1
    assert store.save_reconciliation(external=2, drift=0, now=NOW, count=second)
    assert not store.save_reconciliation(external=0, drift=0, now=NOW + 1, count=first)  # finished later
    ledger = store.ledger()
    assert (ledger.external, ledger.count, ledger.reconciled_at) == (2, second, NOW)


def test_the_limit_in_force_takes_the_newest_max_and_the_newest_external_count(store):
    """Writers hold readings of different ages: neither MAX nor the external count ever goes back."""

    def put(max_value, changed_at, external, count):
        return store.set_limit(LimitSource(max_value, changed_at, external, int(count)))

    def start(i):
        store.claim(Claim(key=f"k{i}", name=f"n{i}", message_id="m", now=NOW, claim_expires_at=NOW + 900))

    assert put(5, 100.0, 0, 1.0) == 5
    assert put(2, 200.0, 0, 1.0) == 2  # an operator lowered MAX
    assert put(5, 100.0, 0, 9.0) == 2  # a launcher's cached MAX: only its newer count (0) is taken
    # A reconciliation counted one execution outside Sluice; an operator then wrote MAX 3 with the
    # count it had read before that: 3 − 1, not 3 − 0.
    assert put(2, 200.0, 1, 20.0) == 1
    assert put(3, 300.0, 0, 9.0) == 2
    assert store.ledger().in_force == 2
    start(0)
    start(1)
    with pytest.raises(SlotsFull):
        start(2)
    assert put(3, 150.0, 0, 30.0) == 3  # the newer count (0) with the newest MAX (3)
    start(2)
    assert store.ledger().holders == {"n0", "n1", "n2"} and store.ledger().free == 0
    assert put(7, None, 0, 0.0) == 7  # the deployed default (parameter missing): unfenced


def test_mark_running_only_while_claimed_by_that_name(store):
    claim(store, "k", "n1")
    assert store.mark_running(key="k", name="n1", arn="arn:x", started_at=NOW + 1, now=NOW + 1)
    assert not store.mark_running(key="k", name="n1", arn="arn:x", started_at=NOW + 2, now=NOW + 2)
    assert store.payload("k").state is PayloadState.RUNNING
    assert store.execution("n1").arn == "arn:x"


def test_release_frees_once_and_records_the_outcome(store):
    claim(store, "k", "n1")
    store.mark_running(key="k", name="n1", arn="arn:x", started_at=NOW, now=NOW)
    before = store.release(
        "n1", Ending(PayloadState.FAILED, NOW + 5, error="States.TaskFailed", cause="boom", ended_at=NOW + 4)
    )
    assert before is not None and before.state is PayloadState.RUNNING
    assert store.release("n1", Ending(PayloadState.SUCCEEDED, NOW + 6)) is None
    assert store.ledger().holders == frozenset()
    payload, record = store.payload("k"), store.execution("n1")
    assert (payload.state, payload.holder, payload.reason) == (PayloadState.FAILED, None, "States.TaskFailed")
    assert (record.state, record.ended_at, record.error, record.cause) == (
        PayloadState.FAILED,
        NOW + 4,
        "States.TaskFailed",
        "boom",
    )


def test_release_of_an_unknown_name_is_a_no_op(store):
    claim(store, "k", "n1")
    assert store.release("by-hand", Ending(PayloadState.SUCCEEDED, NOW)) is None
    assert store.ledger().holders == {"n1"}


def test_mark_after_release_does_not_resurrect(store):
    claim(store, "k", "n1")
    store.release("n1", Ending(PayloadState.SUCCEEDED, NOW))
    assert not store.mark_running(key="k", name="n1", arn="arn:x", started_at=NOW, now=NOW)
    assert store.payload("k").state is PayloadState.SUCCEEDED


def test_a_released_payload_can_be_claimed_again(store):
    claim(store, "k", "n1")
    store.release("n1", Ending(PayloadState.SUCCEEDED, NOW))
    claim(store, "k", "n2")
    payload = store.payload("k")
    assert (payload.holder, payload.executions, payload.attempts) == ("n2", ("n1", "n2"), 2)


@pytest.mark.parametrize("ended", ["SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"])
def test_a_name_that_ran_and_ended_cannot_be_claimed_again(store, ended):
    """Its message back after the release: the claim refuses the name, with its record, and takes
    nothing (a start on another state machine would accept the name and run it twice)."""
    claim(store, "k", "n1")
    store.release("n1", Ending(PayloadState(ended), NOW + 5, error="E" if ended != "SUCCEEDED" else None))
    with pytest.raises(AlreadyRan) as ran:
        claim(store, "k", "n1", now=NOW + 9)
    assert (ran.value.existing.name, ran.value.existing.state) == ("n1", PayloadState(ended))
    assert store.ledger().holders == frozenset() and store.payload("k").holder is None
    assert store.execution("n1").state is PayloadState(ended)
    claim(store, "k", "n2", now=NOW + 10)  # a re-submission (another name) claims as ever
    assert store.payload("k").holder == "n2"


def test_a_name_released_unstarted_can_be_claimed_again(store):
    """RELEASED (reconciliation found no such execution, or the start was refused for sure): it
    never ran, so its message back claims it again under the same name."""
    claim(store, "k", "n1")
    store.release("n1", Ending(PayloadState.RELEASED, NOW + 5))
    claim(store, "k", "n1", now=NOW + 9)
    assert store.payload("k").holder == "n1" and store.execution("n1").state is PayloadState.CLAIMED


def test_duplicates_and_invalid_are_recorded(store):
    claim(store, "k", "n1")
    store.record_duplicate(key="k", message_id="m2", now=NOW)
    store.record_invalid(key="k", reason="too big", now=NOW)
    payload = store.payload("k")
    assert (payload.duplicates, payload.state) == (1, PayloadState.CLAIMED)  # a live lease keeps its state
    store.record_invalid(key="bad", reason="too big", now=NOW)
    assert (store.payload("bad").state, store.payload("bad").reason) == (PayloadState.INVALID, "too big")


def test_reconciliation_figures_are_kept(store):
    store.save_reconciliation(external=2, drift=3, now=NOW)
    ledger = store.ledger()
    assert (ledger.external, ledger.drift, ledger.reconciled_at) == (2, 3, NOW)
    assert ledger.limit(5) == 3 and ledger.limit(1) == 0


def test_executions_batch_read(store):
    for i in range(3):
        claim(store, f"k{i}", f"n{i}")
    assert set(store.executions(["n0", "n2", "missing"])) == {"n0", "n2"}


def test_concurrent_claims_never_exceed_the_limit(store):
    errors: list[BaseException] = []
    won: list[str] = []

    def worker(i: int) -> None:
        try:
            claim(store, f"k{i}", f"n{i}", limit=4)
            won.append(f"n{i}")
        except SlotsFull:
            pass
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(won) == 4 and store.ledger().holders == set(won)


# -- receipts and run-once keys (sluice.features.receipts) ------------------------------------------------


def once_claim(store, key: str, name: str, *, now: float = NOW) -> None:
    store.set_limit(LimitSource(5, None))
    store.claim(
        Claim(key=key, name=name, message_id=f"m-{name}", now=now, claim_expires_at=now + 900, once=True)
    )


def test_an_ended_release_writes_the_receipt_with_its_output(store):
    from sluice.core.records import ReceiptOutput
    from sluice.features.receipts import read_receipt

    claim(store, "k", "n1")
    store.mark_running(key="k", name="n1", arn="arn:n1", started_at=NOW + 1, now=NOW + 1)
    asked = []

    def output(record):
        asked.append(record.name)
        return ReceiptOutput(inline='{"ok":1}', size=8)

    store.release("n1", Ending(PayloadState.SUCCEEDED, NOW + 9, ended_at=NOW + 8), output=output)
    receipt = read_receipt(store, "k")
    assert (receipt.name, receipt.outcome, receipt.arn) == ("n1", PayloadState.SUCCEEDED, "arn:n1")
    assert (receipt.started_at, receipt.stopped_at, receipt.output, receipt.output_size) == (
        NOW + 1,
        NOW + 8,
        '{"ok":1}',
        8,
    )
    assert receipt.succeeded_by == "n1" and asked == ["n1"]
    # A repeated release writes nothing and asks for no output.
    assert store.release("n1", Ending(PayloadState.FAILED, NOW + 20), output=output) is None
    assert read_receipt(store, "k").outcome is PayloadState.SUCCEEDED and asked == ["n1"]


def test_a_later_run_replaces_the_receipt_but_not_the_first_success(store):
    from sluice.core.records import ReceiptOutput
    from sluice.features.receipts import read_receipt

    claim(store, "k", "n1")
    store.release("n1", Ending(PayloadState.SUCCEEDED, NOW + 1))
    claim(store, "k", "n2", now=NOW + 2)
    store.release(
        "n2",
        Ending(PayloadState.FAILED, NOW + 3, error="E", cause="C"),
        output=lambda r: ReceiptOutput(pointer='{"uri":"s3://b/outputs/x"}', size=9),
    )
    receipt = read_receipt(store, "k")
    assert (receipt.name, receipt.outcome, receipt.error, receipt.cause) == (
        "n2",
        PayloadState.FAILED,
        "E",
        "C",
    )
    assert receipt.output is None and receipt.output_pointer == {"uri": "s3://b/outputs/x"}
    assert receipt.succeeded_by == "n1"


def test_a_release_without_a_run_writes_no_receipt(store):
    from sluice.features.receipts import read_receipt

    claim(store, "k", "n1")
    store.release("n1", Ending(PayloadState.RELEASED, NOW + 1, error="refused"))
    assert read_receipt(store, "k") is None and store.payload("k").succeeded_by is None


def test_a_once_claim_of_a_key_that_succeeded_is_already_done(store):
    from sluice.core.errors import AlreadyDone

    once_claim(store, "k", "n1")
    assert store.execution("n1").once
    store.release("n1", Ending(PayloadState.SUCCEEDED, NOW + 1))
    assert store.payload("k").expires_at == 0  # a once-key's success is kept
    with pytest.raises(AlreadyDone) as done:
        once_claim(store, "k", "n2")
    assert done.value.existing.succeeded_by == "n1"
    assert store.ledger().holders == frozenset() and store.execution("n2") is None
    claim(store, "k", "n3")  # a message without the attribute runs as before
    assert store.payload("k").holder == "n3"


def test_a_once_claim_after_a_failure_runs(store):
    once_claim(store, "k", "n1")
    store.release("n1", Ending(PayloadState.FAILED, NOW + 1))
    once_claim(store, "k", "n2")
    assert store.payload("k").holder == "n2"


def test_already_done_is_counted(store):
    store.record_already_done(key="k", message_id="m1", now=NOW)
    store.record_already_done(key="k", message_id="m2", now=NOW)
    assert store.payload("k").already_done == 2


def _failed_then_once_claimed(store):
    """Run n1 of k FAILED and was released; a run-once claim n2 of k holds the key."""
    claim(store, "k", "n1")
    store.release("n1", Ending(PayloadState.FAILED, NOW + 1))
    once_claim(store, "k", "n2", now=NOW + 2)
    return store.execution("n1")


def test_a_claim_dropped_over_a_success_recorded_under_it_leaves_the_key_at_that_end(store):
    failed = _failed_then_once_claimed(store)
    assert store.record_later_success(record=failed, ended_at=NOW + 3, now=NOW + 3, receipt=None)  # redriven
    store.release("n2", Ending(PayloadState.RELEASED, NOW + 4, error="claim abandoned"))
    payload = store.payload("k")
    assert (payload.state, payload.holder, payload.receipt, payload.succeeded_by) == (
        PayloadState.SUCCEEDED,
        None,
        "n1",
        "n1",
    )
    assert store.ledger().holders == frozenset()


def test_a_claim_dropped_with_no_success_recorded_leaves_the_key_released(store):
    _failed_then_once_claimed(store)
    store.release("n2", Ending(PayloadState.RELEASED, NOW + 4, error="start refused"))
    assert store.payload("k").state is PayloadState.RELEASED  # an earlier failure is not kept


def test_a_run_that_vanished_over_a_success_leaves_the_key_released(store):
    claim(store, "k", "n1")
    store.release("n1", Ending(PayloadState.SUCCEEDED, NOW + 1))
    claim(store, "k", "n2", now=NOW + 2)
    store.release("n2", Ending(PayloadState.RELEASED, NOW + 3, outcome_unknown=True))
    payload = store.payload("k")
    assert (payload.state, payload.once_unknown) == (PayloadState.RELEASED, "n2")


def _success_recorded_after_the_drop(store):
    failed = _failed_then_once_claimed(store)
    store.release("n2", Ending(PayloadState.RELEASED, NOW + 3, error="claim abandoned"))
    assert store.record_later_success(record=failed, ended_at=NOW + 4, now=NOW + 4, receipt=None)
    assert store.payload("k").state is PayloadState.RELEASED


def test_a_once_message_already_done_settles_a_key_left_released_at_its_last_end(store):
    from sluice.core.errors import AlreadyDone

    _success_recorded_after_the_drop(store)
    with pytest.raises(AlreadyDone) as done:
        once_claim(store, "k", "n3", now=NOW + 5)
    store.record_already_done(key="k", message_id="m-n3", now=NOW + 5, seen=done.value.existing)
    payload = store.payload("k")
    assert (payload.state, payload.holder, payload.already_done) == (PayloadState.SUCCEEDED, None, 1)
    assert payload.succeeded_by == "n1" and payload.receipt == "n1"


def test_an_already_done_count_leaves_a_lease_taken_since_alone(store):
    from sluice.core.errors import AlreadyDone

    _success_recorded_after_the_drop(store)
    with pytest.raises(AlreadyDone) as done:
        once_claim(store, "k", "n3", now=NOW + 5)
    claim(store, "k", "n4", now=NOW + 6)  # a plain message of k, between the refusal and the count
    store.record_already_done(key="k", message_id="m-n3", now=NOW + 6, seen=done.value.existing)
    payload = store.payload("k")
    assert (payload.state, payload.holder, payload.already_done) == (PayloadState.CLAIMED, "n4", 1)


# -- effects (sluice.features.effects) ---------------------------------------------------------------------


def test_a_release_writes_the_effects_it_sent_and_the_name_is_never_claimed_again(store):
    from sluice.core.model import EffectsLog
    from sluice.core.records import ReceiptOutput

    sent = EffectsLog("n1", "k", 3, ("a", "b"), ((2, "effect 2: no key"),), NOW + 9)
    claim(store, "k", "n1")
    assert store.effects("n1") is None
    released = store.release(
        "n1",
        Ending(PayloadState.SUCCEEDED, NOW + 9),
        output=lambda record: ReceiptOutput(inline="{}", size=2, effects=sent),
    )
    assert released is not None and store.effects("n1") == sent
    # A redelivered message of the name: it ran, so no claim, no second release, no second send.
    with pytest.raises(AlreadyRan):
        claim(store, "k", "n1", now=NOW + 20)
    assert store.effects("n1") == sent


def test_a_release_that_does_not_happen_writes_no_effects(store):
    from sluice.core.model import EffectsLog
    from sluice.core.records import ReceiptOutput

    claim(store, "k", "n1")
    store.release("n1", Ending(PayloadState.FAILED, NOW + 1))
    late = EffectsLog("n1", "k", 1, ("a",), (), NOW + 2)
    out = lambda record: ReceiptOutput(effects=late)  # noqa: E731
    assert store.release("n1", Ending(PayloadState.SUCCEEDED, NOW + 2), output=out) is None
    assert store.effects("n1") is None

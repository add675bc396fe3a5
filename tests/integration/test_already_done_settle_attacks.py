"""Attacks on a key left RELEASED over a recorded success by a claim dropped unstarted, and on its
two settles: the dropped claim's release keeps the key at its receipt's end when the success was
recorded first (``ReleasesTable``: ``NO_SUCCESS``, ``MemoryReleases``); the count of a run-once
message found already done settles it when the success came after the drop
(``record_already_done(..., seen=...)``, ``left_released``, ``RecordsTable.LEFT_RELEASED``,
``MemoryRecords.record_already_done``, ``per_message._done_already``). W2 broke promise 4 with the
count alone; it led to the release's settle.

Two kinds of scenario:

* the reliability world (the real launcher and completion on moto, a fake clock, faults through
  botocore hooks, the independent model checking promises 1-3 after every step and promise 4 at
  rest in ``settle``);
* the store alone: the real ``DynamoStore`` on moto and ``MemoryStore`` driven through the same
  sequence of store calls (interleavings chosen by the test; on moto, another store operation run
  from a botocore ``before-call`` hook just before the settle's UpdateItem lands), and their
  ``payload(key)`` compared.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest
from moto import mock_aws

from sluice.adapters.dynamo.store import DynamoStore, create_table
from sluice.adapters.memory.store import MemoryStore
from sluice.core.errors import AlreadyDone, LeaseHeld
from sluice.core.limits import LimitSource
from sluice.core.model import Claim, ClaimFence, Ending, PayloadRecord, PayloadState
from tests.integration.test_redriven_success_attacks import ONCE, body, ended_and_released, runs_of, s
from tests.reliability.world import CLAIM_TIMEOUT, VISIBILITY, WINDOW
from tests.support.faults import CrashAt, Fault

FINAL = {"SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"}


def later_success(world, e1: str) -> None:
    """The operator redrives e1; it SUCCEEDED and its event is heard before any reconciliation."""
    world.redrive(e1)
    event = world.end(e1, "SUCCEEDED")
    assert world.deliver(world.pending.index(event)) == "ok"
    payload = world.table()["PAYLOAD#j"]
    assert s(payload, "succeeded_by") == e1, payload


class Before(Fault):
    """Run ``action`` once, just before the first call of protocol step ``step`` is sent."""

    def __init__(self, step: str, action) -> None:
        self.step, self.action, self.fired = step, action, 0

    def before(self, injector, call):
        if call.step == self.step and not self.fired:
            self.fired += 1
            self.action()
        return None


# -- W1. the documented timeline (held) ----------------------------------------------------------------


def test_w1_documented_timeline_settles_the_key_and_keeps_it_out_of_ttl(make_world):
    """e1 (run-once) FAILED; m2 (run-once) claimed n2, its launcher died after the claim; e1
    redriven SUCCEEDED (later success); n2 abandoned by reconciliation *before* m2 came back: its
    release keeps the key SUCCEEDED; m2 again: AlreadyDone, no expiry, nothing ran."""
    world = make_world(max_concurrency=2)
    e1 = ended_and_released(world, once=True)
    m2 = world.send(body("j"), group="g-j-1", attributes=dict(ONCE))
    crash = CrashAt("after_claim")
    assert world.tick("A", [crash]) == "crashed" and crash.seen == 1
    items = world.table()
    n2 = s(items["PAYLOAD#j"], "holder")
    assert n2 is not None and n2 != e1
    later_success(world, e1)
    # Reconciliation abandons n2 before m2 is seen again: the clock stays below the visibility
    # timeout between the two sightings (suspect, then release a claim timeout later).
    world.clock.advance(WINDOW + 1)
    world.tick("A")  # nothing visible to admit: reconciliation only
    world.clock.advance(CLAIM_TIMEOUT + 1)
    world.tick("A")  # nothing visible to admit: reconciliation only
    payload = world.table()["PAYLOAD#j"]
    assert s(payload, "state") == "SUCCEEDED" and "holder" not in payload, payload
    assert s(payload, "reason") == "claim abandoned: no execution was ever started", payload
    world.advance(VISIBILITY)
    world.tick("A")
    world.check()
    assert m2 in world.model.already_done
    payload = world.table()["PAYLOAD#j"]
    assert s(payload, "state") == "SUCCEEDED", payload
    assert "expires_at" not in payload and s(payload, "once_by") == e1
    assert runs_of(world, "j") == [e1]
    world.settle()


# -- W2. the refused claim read the key while the dropped claim still held it (broke; fixed) --------


def test_w2_message_back_while_its_own_claim_still_holds_leaves_the_key_released(make_world):
    """As W1, but m2 comes back (its visibility timeout ran out) while its own unstarted claim n2
    still holds the lease: its claim of n2 is refused on the lease, and ``_lease_refused`` answers
    AlreadyDone (succeeded_by is read before the holder), with ``seen`` holding n2 (CLAIMED). The
    settle is skipped (``left_released(seen)`` is false), m2 is deleted. Reconciliation then abandons
    n2, and no message of it is left to settle the key: it read RELEASED at rest (promise 4) until
    the dropped claim's release kept the key at its receipt's end."""
    world = make_world(max_concurrency=2)
    e1 = ended_and_released(world, once=True)
    m2 = world.send(body("j"), group="g-j-1", attributes=dict(ONCE))
    crash = CrashAt("after_claim")
    assert world.tick("A", [crash]) == "crashed" and crash.seen == 1
    n2 = s(world.table()["PAYLOAD#j"], "holder")
    later_success(world, e1)
    world.advance(VISIBILITY + 1)  # m2 visible again; n2 still held (its claim timeout is longer)
    world.tick("A")
    world.check()
    assert m2 in world.model.already_done, "m2 was not counted as already done"
    payload = world.table()["PAYLOAD#j"]
    assert s(payload, "holder") == n2 and s(payload, "state") == "CLAIMED", payload
    # Reconciliation abandons n2 (two sightings a claim timeout apart).
    for _ in range(3):
        world.advance(CLAIM_TIMEOUT + WINDOW + 1)
        world.tick("A")
        world.check()
    payload = world.table()["PAYLOAD#j"]
    assert "holder" not in payload, payload
    assert runs_of(world, "j") == [e1]
    assert world.queue_depth() == 0, "no message of j is left to settle it"
    assert s(payload, "state") in FINAL, f"j left {s(payload, 'state')} at rest: {payload}"
    world.settle()


# -- W3. the start refused for sure and rolled back, the success recorded meanwhile (held) -----------


def test_w3_start_refused_and_rolled_back_over_a_later_success_is_settled(make_world):
    """m2's claim n2 lands; right after it (Interleave-like hook at the claim) e1's redrive
    SUCCEEDED is recorded; every StartExecution is throttled, so n2 is rolled back, which keeps the
    key SUCCEEDED, and m2 returned. m2 again: AlreadyDone; nothing of j ran again."""
    from tests.support.faults import ALWAYS, Throttle

    world = make_world(max_concurrency=2)
    e1 = ended_and_released(world, once=True)
    m2 = world.send(body("j"), group="g-j-1", attributes=dict(ONCE))

    class AfterClaim(Fault):
        fired = 0

        def after(self, injector, call, status, parsed):
            if call.step == "claim" and status < 300 and not self.fired:
                self.fired += 1
                later_success(world, e1)

    hook, throttle = AfterClaim(), Throttle("StartExecution", times=ALWAYS)
    world.tick("A", [hook, throttle])
    assert hook.fired == 1 and throttle.fired >= 1
    payload = world.table()["PAYLOAD#j"]
    assert s(payload, "state") == "SUCCEEDED" and "holder" not in payload, payload
    assert s(payload, "succeeded_by") == e1
    world.advance(VISIBILITY + 1)
    world.tick("A")
    world.check()
    assert m2 in world.model.already_done
    payload = world.table()["PAYLOAD#j"]
    assert s(payload, "state") == "SUCCEEDED" and "expires_at" not in payload, payload
    assert runs_of(world, "j") == [e1]
    world.settle()


# -- store alone: DynamoStore on moto and MemoryStore, the same calls ----------------------------------

T = 1_000_000.0
KINDS = ["dynamodb", "memory"]


@pytest.fixture
def stores():
    """Both stores, fresh, with MAX 5: ``{"dynamodb": DynamoStore, "memory": MemoryStore}``."""
    with mock_aws():
        import boto3

        client = boto3.client("dynamodb", region_name="us-east-1")
        create_table(client, "t")
        dynamo = DynamoStore(client, "t", retention_seconds=86_400)
        memory = MemoryStore(retention_seconds=86_400)
        for store in (dynamo, memory):
            store.set_limit(LimitSource(5, None))
        yield {"dynamodb": dynamo, "memory": memory}


def claim(store, name: str, *, once: bool, now: float, key: str = "k") -> None:
    store.claim(
        Claim(
            key=key,
            name=name,
            message_id=f"m-{name}",
            now=now,
            claim_expires_at=now + 900,
            once=once,
            arn=f"arn:{name}",
        )
    )


def ran_and_ended(store, name: str, state: PayloadState, *, once: bool, now: float, key: str = "k") -> None:
    claim(store, name, once=once, now=now, key=key)
    assert store.mark_running(key=key, name=name, arn=f"arn:{name}", started_at=now + 1, now=now + 1)
    assert store.release(name, Ending(state, now + 5, ended_at=now + 5)) is not None


def dropped(store, name: str, *, now: float, once: bool = True, key: str = "k") -> None:
    """``name`` claims ``key`` (not started) and is rolled back: RELEASED."""
    claim(store, name, once=once, now=now, key=key)
    assert (
        store.release(
            name, Ending(PayloadState.RELEASED, now + 1, error="claim abandoned"), fence=ClaimFence(0)
        )
        is not None
    )


def left_released_over_success(store, *, once_e1: bool = True, key: str = "k") -> str:
    """The timeline the count settles, on the store: e1 FAILED; once-claim n2; n2 dropped; e1's
    later success. Returns e1's name."""
    e1, n2 = ("e1", "n2") if key == "k" else (f"{key}-e1", f"{key}-n2")
    ran_and_ended(store, e1, PayloadState.FAILED, once=once_e1, now=T, key=key)
    claim(store, n2, once=True, now=T + 20, key=key)
    assert (
        store.release(n2, Ending(PayloadState.RELEASED, T + 30, error="claim abandoned"), fence=ClaimFence(0))
        is not None
    )
    assert store.record_later_success(record=store.execution(e1), ended_at=T + 40, now=T + 40, receipt=None)
    return e1


@pytest.mark.parametrize("kind", KINDS)
def test_s0_a_claim_dropped_after_the_success_keeps_the_key_at_it(stores, kind):
    """e1 FAILED; once-claim n2; e1's later success; n2 dropped: the release itself keeps the key
    SUCCEEDED (no expiry: e1 was run-once), and a run-once message is already done."""
    store = stores[kind]
    ran_and_ended(store, "e1", PayloadState.FAILED, once=True, now=T)
    claim(store, "n2", once=True, now=T + 20)
    assert store.record_later_success(record=store.execution("e1"), ended_at=T + 30, now=T + 30, receipt=None)
    assert store.release(
        "n2", Ending(PayloadState.RELEASED, T + 40, error="claim abandoned"), fence=ClaimFence(0)
    )
    p = store.payload("k")
    assert (p.state, p.holder, p.once_by, p.expires_at) == (PayloadState.SUCCEEDED, None, "e1", 0), p
    assert refused_once(store).state is PayloadState.SUCCEEDED
    assert store.ledger().holders == set()


def refused_once(store, name: str = "n4", *, now: float = T + 100, key: str = "k") -> PayloadRecord:
    """A run-once claim of ``key``: it must fail AlreadyDone; the record it read."""
    with pytest.raises(AlreadyDone) as done:
        claim(store, name, once=True, now=now, key=key)
    return done.value.existing


def comparable(record: PayloadRecord | None) -> dict[str, Any] | None:
    if record is None:
        return None
    skip = {"updated_at", "expires_at"}
    out = {f.name: getattr(record, f.name) for f in fields(record) if f.name not in skip}
    out["ttl"] = bool(record.expires_at)
    return out


def raw(store: DynamoStore, key: str = "k") -> dict[str, Any]:
    return store.client.get_item(TableName=store.table, Key={"pk": {"S": f"PAYLOAD#{key}"}}).get("Item", {})


def before_update(store: DynamoStore, marker: str, action):
    """A botocore hook (before-parameter-build: ahead of before-call and the send) on the DynamoStore's client: ``action()`` runs once, just before
    the first UpdateItem whose UpdateExpression contains ``marker`` is sent. Returns a counter."""
    fired = {"n": 0, "busy": False}

    def hook(params, model, **_):
        expression = params.get("UpdateExpression", "")
        if model.name == "UpdateItem" and marker in expression and not fired["n"] and not fired["busy"]:
            fired["busy"] = True
            try:
                action()
            finally:
                fired["n"] += 1
                fired["busy"] = False
        return None

    store.client.meta.events.register("before-parameter-build.dynamodb.UpdateItem", hook)
    return fired


def count_after(store, kind: str, race, seen: PayloadRecord) -> None:
    """``race()`` lands just before the already-done count of ``seen`` (on moto: from a botocore
    hook ahead of the count's UpdateItem, which must fire), then the count."""
    if kind == "dynamodb":
        fired = before_update(store, "already_done", race)
        store.record_already_done(key="k", message_id="m4", now=T + 101, seen=seen)
        assert fired["n"] == 1, "the interleaved operation never ran"
    else:
        race()
        store.record_already_done(key="k", message_id="m4", now=T + 101, seen=seen)


@pytest.mark.parametrize("kind", KINDS)
def test_s1_documented_timeline_on_each_store(stores, kind):
    store = stores[kind]
    e1 = left_released_over_success(store)
    seen = refused_once(store)
    assert seen.state is PayloadState.RELEASED and seen.holder is None
    store.record_already_done(key="k", message_id="m4", now=T + 101, seen=seen)
    p = store.payload("k")
    assert p.state is PayloadState.SUCCEEDED and p.holder is None and p.already_done == 1
    assert p.once_by == e1 and p.expires_at == 0, "a run-once success put under TTL"
    assert store.ledger().holders == set()


def test_s1b_both_stores_agree_on_the_documented_timeline(stores):
    out = {}
    for kind, store in stores.items():
        left_released_over_success(store)
        store.record_already_done(key="k", message_id="m4", now=T + 101, seen=refused_once(store))
        out[kind] = comparable(store.payload("k"))
    assert out["dynamodb"] == out["memory"]


@pytest.mark.parametrize("kind", KINDS)
def test_s2_a_plain_claim_landing_just_before_the_settle_keeps_its_state(stores, kind):
    """seen says RELEASED; a plain (not run-once) claim n3 of k lands just before the settle's
    UpdateItem: the settle is refused, the count made alone; n3 keeps the lease, CLAIMED."""
    store = stores[kind]
    left_released_over_success(store)
    seen = refused_once(store)
    race = lambda: claim(store, "n3", once=False, now=T + 100.5)  # noqa: E731
    count_after(store, kind, race, seen)
    p = store.payload("k")
    assert p.holder == "n3" and p.state is PayloadState.CLAIMED, p
    assert p.already_done == 1
    assert store.ledger().holders == {"n3"}
    # n3 starts, runs, ends: a final state, the lease and slot free.
    assert store.mark_running(key="k", name="n3", arn="arn:n3", started_at=T + 102, now=T + 102)
    assert store.release("n3", Ending(PayloadState.FAILED, T + 110, ended_at=T + 110))
    p = store.payload("k")
    assert p.state is PayloadState.FAILED and p.holder is None and store.ledger().holders == set()
    assert p.expires_at == 0, "a run-once success put under TTL by the later plain run's release"


@pytest.mark.parametrize("kind", KINDS)
def test_s3_a_claim_taken_and_dropped_before_the_settle_is_settled_still(stores, kind):
    """Between the refused claim's read and the settle, a plain claim n3 lands and is rolled back
    (RELEASED again): the settle lands; n3's own message is retried and runs (it is no run-once)."""
    store = stores[kind]
    left_released_over_success(store)
    seen = refused_once(store)

    def race():
        dropped(store, "n3", now=T + 100.2, once=False)

    count_after(store, kind, race, seen)
    p = store.payload("k")
    assert p.state is PayloadState.SUCCEEDED and p.holder is None and store.ledger().holders == set()
    assert p.expires_at == 0
    # n3's message back (same name): it claims again, plain, and runs.
    claim(store, "n3b", once=False, now=T + 200)
    assert store.payload("k").holder == "n3b"


@pytest.mark.parametrize("kind", KINDS)
def test_s4_a_dead_letter_landing_before_the_settle_stays_invalid(stores, kind):
    """A message of k dead-lettered (record_invalid) just before the settle: INVALID with its
    reason is kept, not overwritten by the receipt's end."""
    store = stores[kind]
    left_released_over_success(store)
    seen = refused_once(store)
    race = lambda: store.record_invalid(key="k", reason="bad body", now=T + 100.5)  # noqa: E731
    count_after(store, kind, race, seen)
    p = store.payload("k")
    assert p.state is PayloadState.INVALID and p.reason == "bad body", p
    assert p.expires_at == 0, "a run-once success put under TTL by the dead letter"


@pytest.mark.parametrize("kind", KINDS)
def test_s5_stale_seen_from_an_earlier_read_over_a_live_run(stores, kind):
    """seen (left RELEASED) is stale: since, a plain claim n3 started and runs (RUNNING). The count
    must not settle a running key to an end."""
    store = stores[kind]
    left_released_over_success(store)
    seen = refused_once(store)
    claim(store, "n3", once=False, now=T + 101)
    assert store.mark_running(key="k", name="n3", arn="arn:n3", started_at=T + 102, now=T + 102)
    store.record_already_done(key="k", message_id="m4", now=T + 103, seen=seen)
    p = store.payload("k")
    assert p.state is PayloadState.RUNNING and p.holder == "n3", p


@pytest.mark.parametrize("kind", KINDS)
def test_s6_forged_seen_on_a_key_without_a_receipt_is_a_count_only(stores, kind):
    """seen forged (left RELEASED, receipt_state SUCCEEDED) for a key whose only claim was dropped
    unstarted (no run ever ended: no receipt_state): no state invented, the count alone; and for a
    key with no record at all, nothing but the count."""
    store = stores[kind]
    dropped(store, "n1", now=T, once=False)
    forged = FORGED
    store.record_already_done(key="k", message_id="m4", now=T + 10, seen=forged)
    p = store.payload("k")
    assert p.state is PayloadState.RELEASED and p.receipt_state is None and p.succeeded_by is None, p
    store.record_already_done(key="nokey", message_id="m5", now=T + 10, seen=replace_key(forged, "nokey"))
    q = store.payload("nokey")
    assert q is None or (q.receipt_state is None and q.state is not PayloadState.SUCCEEDED), q


FORGED = PayloadRecord(  # a record no read gave: left RELEASED over a success
    key="k", state=PayloadState.RELEASED, receipt="x", receipt_state=PayloadState.SUCCEEDED, succeeded_by="x"
)


def replace_key(record: PayloadRecord, key: str) -> PayloadRecord:
    from dataclasses import replace

    return replace(record, key=key)


def test_s6b_both_stores_agree_on_a_forged_seen(stores):
    out = {}
    for kind, store in stores.items():
        dropped(store, "n1", now=T, once=False)
        forged = FORGED
        store.record_already_done(key="k", message_id="m4", now=T + 10, seen=forged)
        out[kind] = comparable(store.payload("k"))
    assert out["dynamodb"] == out["memory"]


@pytest.mark.parametrize("kind", KINDS)
def test_s7_receipt_not_succeeded_settles_to_a_final_failure(stores, kind):
    """e1 (run-once) FAILED; a plain run e3 FAILED after it (the receipt is e3's); once-claim n2;
    e1's redrive SUCCEEDED (the receipt stays e3's: succeeded_by only); n2 dropped. m2 again: the
    key settles to FAILED (its receipt's end), a final state; the success stays recorded, no TTL."""
    store = stores[kind]
    ran_and_ended(store, "e1", PayloadState.FAILED, once=True, now=T)
    ran_and_ended(store, "e3", PayloadState.FAILED, once=False, now=T + 10)
    claim(store, "n2", once=True, now=T + 20)
    assert store.record_later_success(record=store.execution("e1"), ended_at=T + 30, now=T + 30, receipt=None)
    store.release("n2", Ending(PayloadState.RELEASED, T + 40, error="abandoned"), fence=ClaimFence(0))
    seen = refused_once(store)
    store.record_already_done(key="k", message_id="m4", now=T + 101, seen=seen)
    p = store.payload("k")
    assert p.state.value in FINAL and p.state is p.receipt_state, p
    assert p.succeeded_by == "e1" and p.once_by == "e1" and p.expires_at == 0, p
    with pytest.raises(AlreadyDone):
        claim(store, "n5", once=True, now=T + 200)


def test_s7b_both_stores_agree_when_the_receipt_is_a_failure(stores):
    out = {}
    for kind, store in stores.items():
        ran_and_ended(store, "e1", PayloadState.FAILED, once=True, now=T)
        ran_and_ended(store, "e3", PayloadState.FAILED, once=False, now=T + 10)
        claim(store, "n2", once=True, now=T + 20)
        store.record_later_success(record=store.execution("e1"), ended_at=T + 30, now=T + 30, receipt=None)
        store.release("n2", Ending(PayloadState.RELEASED, T + 40, error="abandoned"), fence=ClaimFence(0))
        store.record_already_done(key="k", message_id="m4", now=T + 101, seen=refused_once(store))
        out[kind] = comparable(store.payload("k"))
    assert out["dynamodb"] == out["memory"]


@pytest.mark.parametrize("kind", KINDS)
def test_s8_plain_success_keeps_its_ttl_and_a_once_success_never_gets_one(stores, kind):
    """e1 plain (not run-once): its later success leaves the key under TTL (as any plain success);
    the settle neither adds nor removes an expiry. The run-once variant: never an expiry."""
    store = stores[kind]
    left_released_over_success(store, once_e1=False, key="plain")
    before = store.payload("plain").expires_at
    store.record_already_done(
        key="plain", message_id="m4", now=T + 101, seen=refused_once(store, "plain-n4", key="plain")
    )
    p = store.payload("plain")
    assert p.state is PayloadState.SUCCEEDED and p.expires_at == before
    left_released_over_success(store, once_e1=True, key="once")
    store.record_already_done(
        key="once", message_id="m5", now=T + 101, seen=refused_once(store, "once-n4", key="once")
    )
    assert store.payload("once").expires_at == 0
    if kind == "dynamodb":
        assert "expires_at" not in raw(store, "once")


@pytest.mark.parametrize("kind", KINDS)
def test_s9_a_vanished_runs_release_over_a_success_stays_released(stores, kind):
    """e1 SUCCEEDED (run-once); a plain run e3 of k vanished with its state machine: released
    RELEASED, outcome unknown (once_unknown = e3). A run-once message: AlreadyDone (succeeded_by is
    read first); the count leaves k RELEASED (its latest run's outcome is unknown, not an earlier
    end) and the marks of the unknown outcome stay."""
    store = stores[kind]
    ran_and_ended(store, "e1", PayloadState.SUCCEEDED, once=True, now=T)
    claim(store, "e3", once=False, now=T + 10)
    assert store.mark_running(key="k", name="e3", arn="arn:e3", started_at=T + 11, now=T + 11)
    assert store.release(
        "e3", Ending(PayloadState.RELEASED, T + 20, error="does not exist", outcome_unknown=True)
    )
    seen = refused_once(store)
    assert seen.once_unknown == "e3" and seen.state is PayloadState.RELEASED
    store.record_already_done(key="k", message_id="m4", now=T + 101, seen=seen)
    p = store.payload("k")
    assert p.once_unknown == "e3" and p.reason == "does not exist" and p.expires_at == 0, p
    assert (p.state, p.already_done) == (PayloadState.RELEASED, 1), p


@pytest.mark.parametrize("kind", KINDS)
def test_s10_never_a_second_run_once_run_and_nothing_held(stores, kind):
    """After the settle, many run-once claims of k: each AlreadyDone, each settle a no-op on a
    final state; a plain claim still runs (messages without the attribute run as before)."""
    store = stores[kind]
    left_released_over_success(store)
    for i in range(3):
        seen = refused_once(store, f"n{10 + i}", now=T + 100 + i)
        store.record_already_done(key="k", message_id=f"m{i}", now=T + 100 + i, seen=seen)
    p = store.payload("k")
    assert p.state is PayloadState.SUCCEEDED and p.already_done == 3 and store.ledger().holders == set()
    claim(store, "plain", once=False, now=T + 200)
    with pytest.raises(LeaseHeld):
        claim(store, "other", once=False, now=T + 201)
    assert store.ledger().holders == {"plain"}


@pytest.mark.parametrize("kind", KINDS)
def test_s11_a_hand_over_to_a_plain_claim_of_k_lands_just_before_the_settle(stores, kind):
    """Run h of another key ends; its release hands its slot to a plain claim n3 of k (one
    transaction) just before the settle's UpdateItem: the settle is refused, n3 keeps k CLAIMED."""
    store = stores[kind]
    left_released_over_success(store)
    claim(store, "h", once=False, now=T + 50, key="other")
    assert store.mark_running(key="other", name="h", arn="arn:h", started_at=T + 51, now=T + 51)
    seen = refused_once(store)
    result = {}

    def race():
        successor = Claim(
            key="k", name="n3", message_id="m-n3", now=T + 100.5, claim_expires_at=T + 1000, arn="arn:n3"
        )
        result["h"] = store.hand_over(
            "h", Ending(PayloadState.SUCCEEDED, T + 100.5, ended_at=T + 100.5), lambda record, room: successor
        )

    count_after(store, kind, race, seen)
    assert result["h"].claimed, "the hand-over did not give k's claim the slot"
    p = store.payload("k")
    assert p.holder == "n3" and p.state is PayloadState.CLAIMED, p
    assert store.ledger().holders == {"n3"}
    assert store.payload("other").state is PayloadState.SUCCEEDED


@pytest.mark.parametrize("kind", KINDS)
def test_s12_two_counts_at_once_settle_once_and_count_twice(stores, kind):
    """Two launchers count two run-once messages of k at once, both having read it RELEASED."""
    import threading

    store = stores[kind]
    left_released_over_success(store)
    seen_a = refused_once(store, "na")
    seen_b = refused_once(store, "nb")
    barrier, errors = threading.Barrier(2), []

    def go(mid: str, seen: PayloadRecord) -> None:
        try:
            barrier.wait(timeout=30)
            store.record_already_done(key="k", message_id=mid, now=T + 101, seen=seen)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=a) for a in (("ma", seen_a), ("mb", seen_b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    p = store.payload("k")
    assert p.state is PayloadState.SUCCEEDED and p.already_done == 2 and p.holder is None, p
    assert p.expires_at == 0

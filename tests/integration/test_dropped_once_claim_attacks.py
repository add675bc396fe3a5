"""Attacks on the release of a run-once claim dropped unstarted over a success recorded while it held
(``_Ending.drops_once_claim``, ``NO_SUCCESS``, ``_lease_terms``, ``marks`` and ``known`` in
``ReleasesTable._end``; ``MemoryReleases._released_payload``; the already-done count's settle,
``RecordsTable.record_already_done``). The two TTL attacks broke promise 4 until a later success
wrote the receipt of a key that had none (``LATER_SUCCESS_WRITES``: ``unreceipted``).

Store-level attacks run the same sequence of store calls on ``MemoryStore`` and on ``DynamoStore``
(moto), races injected only through botocore hooks on the DynamoStore's client (each asserts it
fired). End-to-end attacks run the real launcher and completion in the reliability world, whose
``settle`` checks promise 4 at rest.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from sluice.adapters.dynamo.store import DynamoStore, create_table
from sluice.adapters.memory.store import MemoryStore
from sluice.core.errors import AlreadyDone
from sluice.core.limits import LimitSource
from sluice.core.model import TERMINAL_STATUSES, Claim, ClaimFence, Ending, PayloadState
from sluice.features.awaits import Waiter
from tests.reliability.world import VISIBILITY, WINDOW
from tests.support.faults import Interleave, Throttle
from tests.support.moto_patches import atomic_fast_moto

NOW = 1_800_000_000.0
DAY = 86_400
ONCE = {"sluice-once": "true"}
FINAL = {s.value if hasattr(s, "value") else s for s in TERMINAL_STATUSES}


# -- store-level helpers ----------------------------------------------------------------------------


@pytest.fixture
def dynamo() -> Iterator[DynamoStore]:
    with mock_aws(), atomic_fast_moto():
        client = boto3.client("dynamodb", region_name="us-east-1")
        create_table(client, "t")
        store = DynamoStore(client, "t", sleep=lambda _s: None)
        store.set_limit(LimitSource(5, None))
        yield store


def memory() -> MemoryStore:
    store = MemoryStore()
    store.set_limit(LimitSource(5, None))
    return store


def raw_items(store: DynamoStore) -> dict[str, dict[str, Any]]:
    items: dict[str, dict[str, Any]] = {}
    kwargs: dict[str, Any] = {"TableName": store.table, "ConsistentRead": True}
    while True:
        page = store.client.scan(**kwargs)
        items.update({i["pk"]["S"]: i for i in page["Items"]})
        if "LastEvaluatedKey" not in page:
            return items
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def slot_holders(store: DynamoStore) -> set[str]:
    return {
        name
        for pk, item in raw_items(store).items()
        if pk.startswith("SLOTS#")
        for name in item.get("holders", {}).get("M", {})
    }


def ended(store: Any, name: str, key: str = "k", *, once: bool, state: PayloadState, at: float) -> None:
    """``name`` claimed ``key``, ran, and ended ``state`` (released by its event)."""
    store.claim(
        Claim(key=key, name=name, message_id=f"m-{name}", now=at, claim_expires_at=at + 900, once=once)
    )
    store.release(name, Ending(state, at + 1, ended_at=at + 1, started_at=at))


def later_success(store: Any, name: str, at: float) -> bool:
    return store.record_later_success(record=store.execution(name), ended_at=at, now=at, receipt=None)


def once_claim(store: Any, name: str = "n2", key: str = "k", at: float = NOW + 100, **kw: Any) -> None:
    store.claim(
        Claim(key=key, name=name, message_id=f"m-{name}", now=at, claim_expires_at=at + 900, once=True, **kw)
    )


def drop(store: Any, name: str = "n2", at: float = NOW + 300, version: int = 0) -> Any:
    """The launcher's rollback of a claim whose StartExecution was refused for sure (fenced)."""
    return store.release(
        name, Ending(PayloadState.RELEASED, at, error="StartExecution refused"), fence=ClaimFence(version)
    )


def on_release(store: DynamoStore, nth: int, action: Callable[[], None]) -> Counter:
    """Run ``action`` once, just before the ``nth`` release transaction of PAYLOAD#k is sent; count
    every release transaction (``seen["releases"]``) and the firing (``seen["fired"]``)."""
    seen: Counter = Counter()

    def hook(params: dict[str, Any], **_: Any) -> None:
        releasing = any(
            "REMOVE holder" in i.get("Update", {}).get("UpdateExpression", "")
            and i["Update"]["Key"]["pk"]["S"] == "PAYLOAD#k"
            for i in params.get("TransactItems", [])
        )
        if not releasing:
            return
        seen["releases"] += 1
        if seen["releases"] == nth and not seen["fired"]:
            seen["fired"] += 1
            action()

    store.client.meta.events.register("before-parameter-build.dynamodb.TransactWriteItems", hook)
    return seen


def at_rest(payload: Any) -> dict[str, Any]:
    """What promise 4 and run-once read of a key's record."""
    return {
        "state": payload.state.value,
        "holder": payload.holder,
        "succeeded_by": payload.succeeded_by,
        "once_by": payload.once_by,
        "receipt_state": payload.receipt_state.value if payload.receipt_state else None,
        "expires": bool(payload.expires_at),
    }


# -- 1. the success lands inside the drop's own retry loop ---------------------------------------------


def test_success_landing_just_before_the_drops_first_write_keeps_the_key_succeeded(dynamo):
    """e1 (run-once) FAILED; n2 (run-once) claims k; the redriven e1's success is recorded in the
    instant between n2's rollback reading its record and writing the release. The first write is
    refused on ``succeeded_by``; the retry keeps SUCCEEDED, sets no expiry, frees the slot."""
    ended(dynamo, "e1", once=True, state=PayloadState.FAILED, at=NOW)
    once_claim(dynamo)
    seen = on_release(dynamo, 1, lambda: later_success(dynamo, "e1", NOW + 200))
    assert drop(dynamo) is not None
    assert seen["fired"] == 1 and seen["releases"] == 2, seen
    items = raw_items(dynamo)
    assert at_rest(dynamo.payload("k")) == {
        "state": "SUCCEEDED",
        "holder": None,
        "succeeded_by": "e1",
        "once_by": "e1",
        "receipt_state": "SUCCEEDED",
        "expires": False,
    }
    assert "expires_at" not in items["PAYLOAD#k"]
    assert items["EXEC#n2"]["state"]["S"] == "RELEASED"
    assert slot_holders(dynamo) == set()
    with pytest.raises(AlreadyDone):
        once_claim(dynamo, "n3", at=NOW + 400)


def test_awaited_then_success_then_once_mark_each_between_two_attempts(dynamo):
    """Three marks reach k one by one while n2's drop is on its way: a waiter parked on k before it
    (``awaited``: first refusal), then a plain redriven e1's success (``succeeded_by``: second
    refusal), then a run-once redriven e0's success (``once_by``: third refusal). The fourth
    attempt keeps SUCCEEDED with no expiry, and tells the caller the key is awaited."""
    ended(dynamo, "e0", once=True, state=PayloadState.FAILED, at=NOW - 50)
    ended(dynamo, "e1", once=False, state=PayloadState.FAILED, at=NOW)
    once_claim(dynamo)
    waiter = Waiter("w1", "other", "{}", "gw", {}, ("k",), False, NOW + 150)
    dynamo.park_waiter(waiter, ["k"])
    first = on_release(dynamo, 2, lambda: later_success(dynamo, "e1", NOW + 200))
    second = on_release(dynamo, 3, lambda: later_success(dynamo, "e0", NOW + 210))
    released = drop(dynamo)
    assert first["fired"] == 1 and second["fired"] == 1 and first["releases"] == 4, first
    assert released is not None and released.awaited
    payload = dynamo.payload("k")
    assert at_rest(payload) == {
        "state": "SUCCEEDED",
        "holder": None,
        "succeeded_by": "e1",
        "once_by": "e0",
        "receipt_state": "SUCCEEDED",
        "expires": False,
    }
    assert "expires_at" not in raw_items(dynamo)["PAYLOAD#k"], "a run-once success put under TTL"
    assert slot_holders(dynamo) == set()
    assert "w1" in dynamo.waiters_on("k")  # the waiter is the later success's to wake (completion)


def test_fenced_drop_whose_retry_runs_after_a_renewal_gives_nothing_back(dynamo):
    """n2's drop is refused on the success recorded meanwhile; before its retry, another copy of
    n2's message renews the claim (version 1: it will start it). The retry is fenced off: n2 keeps
    its slot and lease, its record stays CLAIMED, the key is not written. A drop at version 1
    later keeps the key SUCCEEDED."""
    ended(dynamo, "e1", once=True, state=PayloadState.FAILED, at=NOW)
    once_claim(dynamo)
    assert later_success(dynamo, "e1", NOW + 200)
    renewed: list[bool] = []
    seen = on_release(
        dynamo, 2, lambda: renewed.append(dynamo.renew(name="n2", now=NOW + 250, claim_expires_at=NOW + 2000))
    )
    assert drop(dynamo) is None
    assert seen["fired"] == 1 and renewed == [True] and seen["releases"] == 2, seen
    items = raw_items(dynamo)
    assert items["PAYLOAD#k"]["holder"]["S"] == "n2" and items["PAYLOAD#k"]["state"]["S"] == "CLAIMED"
    assert items["EXEC#n2"]["state"]["S"] == "CLAIMED" and items["EXEC#n2"]["claim_version"]["N"] == "1"
    assert slot_holders(dynamo) == {"n2"}
    assert drop(dynamo, at=NOW + 500, version=1) is not None
    assert at_rest(dynamo.payload("k"))["state"] == "SUCCEEDED" and slot_holders(dynamo) == set()


def test_a_keyed_dropped_claim_frees_its_key_slot_on_the_retry(dynamo):
    """n2 holds a concurrency key's slot (``ckey``); its drop goes twice (the success under it):
    the retry's transaction still frees the key's slot with the global one."""
    ended(dynamo, "e1", once=True, state=PayloadState.FAILED, at=NOW)
    once_claim(dynamo, ckey="acme")
    assert raw_items(dynamo)["CKEY#acme"]["holders"]["SS"] == ["n2"]
    seen = on_release(dynamo, 1, lambda: later_success(dynamo, "e1", NOW + 200))
    assert drop(dynamo) is not None
    assert seen["fired"] == 1 and seen["releases"] == 2
    assert not raw_items(dynamo)["CKEY#acme"].get("holders", {}).get("SS")
    assert slot_holders(dynamo) == set() and dynamo.payload("k").state is PayloadState.SUCCEEDED


# -- 2. memory and Dynamo, the same sequence ---------------------------------------------------------


def sequence_plain_success(store: Any) -> Any:
    ended(store, "e1", once=False, state=PayloadState.FAILED, at=NOW)
    once_claim(store)
    assert later_success(store, "e1", NOW + 200)
    assert drop(store) is not None
    return store.payload("k")


def sequence_failed_receipt_over_success(store: Any) -> Any:
    """e1 FAILED, e2 (plain) FAILED after it (the receipt is e2's), n3 (run-once) claims, the
    redriven e1 SUCCEEDS (``succeeded_by`` without the receipt), n3 dropped."""
    ended(store, "e1", once=False, state=PayloadState.FAILED, at=NOW)
    ended(store, "e2", once=False, state=PayloadState.FAILED, at=NOW + 10)
    once_claim(store, "n3")
    assert later_success(store, "e1", NOW + 200)
    assert drop(store, "n3") is not None
    return store.payload("k")


def sequence_plain_drop_then_count(store: Any) -> Any:
    """A *plain* claim n2 dropped over e1's success recorded while it held: RELEASED (its message is
    retried); then a run-once message m3 of k is counted as already done: it settles the key."""
    ended(store, "e1", once=True, state=PayloadState.FAILED, at=NOW)
    store.claim(Claim(key="k", name="n2", message_id="m-n2", now=NOW + 100, claim_expires_at=NOW + 1000))
    assert later_success(store, "e1", NOW + 200)
    assert drop(store) is not None
    assert store.payload("k").state is PayloadState.RELEASED
    with pytest.raises(AlreadyDone) as refused:
        once_claim(store, "n3", at=NOW + 400)
    store.record_already_done(key="k", message_id="m-n3", now=NOW + 401, seen=refused.value.existing)
    return store.payload("k")


@pytest.mark.parametrize(
    "sequence, expected",
    [
        (sequence_plain_success, {"state": "SUCCEEDED", "once_by": None, "expires": True}),
        (sequence_failed_receipt_over_success, {"state": "FAILED", "once_by": None, "expires": True}),
        (sequence_plain_drop_then_count, {"state": "SUCCEEDED", "once_by": "e1", "expires": False}),
    ],
    ids=["plain-success", "failed-receipt", "plain-drop-then-count"],
)
def test_memory_and_dynamo_agree(dynamo, sequence, expected):
    mine, theirs = at_rest(sequence(memory())), at_rest(sequence(dynamo))
    assert mine == theirs
    assert {k: theirs[k] for k in expected} == expected
    assert theirs["holder"] is None and theirs["succeeded_by"] == "e1" and theirs["state"] in FINAL
    if theirs["once_by"] is not None:
        assert "expires_at" not in raw_items(dynamo)["PAYLOAD#k"]
    assert slot_holders(dynamo) == set()


# -- 3. DynamoDB's TTL took the key's record before the run-once claim ------------------------------


def sequence_ttl_taken(store: Any, expire: Callable[[], None]) -> Any:
    """e1 (run-once) FAILED; its key's record expires (retention shorter than the redrive window)
    and TTL deletes it; n2 (run-once) claims k (a fresh record: no receipt); the redriven e1's
    success is recorded while n2 holds (``succeeded_by``, no receipt: it is not e1's); n2 is
    dropped unstarted; m2 comes back, is refused as already done and counted."""
    ended(store, "e1", once=True, state=PayloadState.FAILED, at=NOW)
    expire()
    once_claim(store, at=NOW + 2 * DAY)
    assert later_success(store, "e1", NOW + 2 * DAY + 100)
    assert drop(store, at=NOW + 2 * DAY + 200) is not None
    with pytest.raises(AlreadyDone) as refused:
        once_claim(store, "n2", at=NOW + 2 * DAY + 300)
    store.record_already_done(
        key="k", message_id="m-n2", now=NOW + 2 * DAY + 301, seen=refused.value.existing
    )
    return store.payload("k")


@pytest.mark.parametrize("kind", ["memory", "dynamo"])
def test_a_success_under_a_claim_of_a_key_ttl_took_reads_succeeded(dynamo, kind):
    """Broke promise 4 (both stores): k SUCCEEDED (e1's redriven run) and never runs again, yet its
    record read RELEASED at rest, held by no one, with no unknown outcome: the claim made the
    record afresh with no receipt, the later success wrote none (not its own), and the drop's
    retry and the already-done count's settle both read ``receipt_state``."""
    if kind == "memory":
        store: Any = MemoryStore(retention_seconds=DAY)
        store.set_limit(LimitSource(5, None))

        def expire() -> None:
            assert 0 < store.table.payloads["k"].expires_at < NOW + 2 * DAY  # TTL may take it by then
            store.table.payloads.pop("k")
    else:
        store = DynamoStore(dynamo.client, dynamo.table, retention_seconds=DAY, sleep=lambda _s: None)

        def expire() -> None:
            item = raw_items(dynamo)["PAYLOAD#k"]
            assert float(item["expires_at"]["N"]) < NOW + 2 * DAY  # TTL may take it by then
            dynamo.client.delete_item(TableName=dynamo.table, Key={"pk": {"S": "PAYLOAD#k"}})

    payload = sequence_ttl_taken(store, expire)
    assert payload.succeeded_by == "e1" and payload.holder is None and payload.once_unknown is None
    assert payload.state.value in FINAL, f"promise 4: k SUCCEEDED but reads {payload.state.value} at rest"


# -- 4. end to end, the real launcher and completion ---------------------------------------------------


def body(key: str) -> str:
    return json.dumps({"id": key})


def runs_of(world: Any, key: str) -> list[str]:
    return [s.name for s in world.model.starts if s.key == key]


def failed_once_run(world: Any, key: str = "j") -> str:
    world.send(body(key), group=f"g-{key}-0", attributes=dict(ONCE))
    world.tick("A")
    (e1,) = [n for n in runs_of(world, key) if n in world.model.running]
    event = world.end(e1, "FAILED")
    assert world.deliver(world.pending.index(event)) == "ok"
    assert world.table()[f"EXEC#{e1}"]["state"]["S"] == "FAILED"
    world.advance(WINDOW + 1)
    return e1


def redriven_success(world: Any, e1: str) -> Callable[[], None]:
    def action() -> None:
        world.redrive(e1)
        event = world.end(e1, "SUCCEEDED")
        assert world.deliver(world.pending.index(event)) == "ok"

    return action


def test_end_to_end_waiter_and_refused_start_around_a_redriven_success(make_world):
    """A waiter awaiting j is parked (j flagged ``awaited``); run-once m2 of j is claimed; between
    its claim and its StartExecution the operator redrives e1 and it SUCCEEDS (completion records
    it and wakes the waiter); StartExecution is then refused (throttled): n2 is rolled back over
    the success. j reads SUCCEEDED, the waiter ran, m2 is already done, nothing leaks."""
    world = make_world(max_concurrency=2)
    e1 = failed_once_run(world)
    m2 = world.send(body("j"), group="g-j-1", attributes=dict(ONCE))
    parked: list[str] = []

    def park_then_succeed() -> None:
        w = world.send(body("after-j"), group="g-w", attributes={"sluice-awaits": json.dumps(["j"])})
        assert world.tick("B") == "ok"  # j is held by n2: the waiter parks, j flagged awaited
        assert w in world.waiters_in_table() and "awaited" in world.table()["PAYLOAD#j"]
        parked.append(w)
        redriven_success(world, e1)()

    interleave = Interleave("before_start", park_then_succeed)
    throttle = Throttle("StartExecution", times=100)  # every attempt: refused for sure
    world.tick("A", [interleave, throttle])
    assert interleave.seen >= 1 and throttle.fired >= 1 and throttle.fired == interleave.seen
    world.check()
    assert parked, "the waiter never parked"
    item = world.table()["PAYLOAD#j"]
    assert item["state"]["S"] == "SUCCEEDED" and "holder" not in item and "expires_at" not in item, item
    world.advance(VISIBILITY + 1)
    world.tick("A")
    world.check()
    assert runs_of(world, "j") == [e1], "a run-once key ran again after its success"
    assert m2 in world.model.already_done
    assert runs_of(world, "after-j"), "the waiter on j was never woken"
    world.settle()


def test_end_to_end_ttl_took_the_record_then_a_refused_start_over_the_success(make_world):
    """Broke promise 4 end to end: retention 1 day; e1 (run-once) FAILED and its key's record
    expires; TTL deletes it 2 days later (e1 is still redrivable, 14 days). Run-once m2 of j is
    claimed; before its StartExecution, e1 is redriven and SUCCEEDS; StartExecution is refused,
    n2 rolled back; m2 comes back and is counted as already done. j reads RELEASED for good."""
    world = make_world(max_concurrency=2, retention_days=1)
    e1 = failed_once_run(world)
    world.advance(2 * DAY)
    assert world.expire_ttl()["PAYLOAD"] == 1
    m2 = world.send(body("j"), group="g-j-1", attributes=dict(ONCE))
    interleave = Interleave("before_start", redriven_success(world, e1))
    throttle = Throttle("StartExecution", times=100)  # every attempt: refused for sure
    world.tick("A", [interleave, throttle])
    assert interleave.seen >= 1 and throttle.fired >= 1 and throttle.fired == interleave.seen
    world.check()
    world.advance(VISIBILITY + 1)
    world.tick("A")
    world.check()
    assert runs_of(world, "j") == [e1] and m2 in world.model.already_done
    item = world.table()["PAYLOAD#j"]
    assert item.get("succeeded_by", {}).get("S") == e1 and "holder" not in item
    assert item["state"]["S"] in FINAL, f"promise 4: j SUCCEEDED, reads {item['state']['S']} at rest: {item}"
    world.settle()


def test_a_dropped_claim_that_hides_a_success_is_caught(make_world, monkeypatch):
    """The variant ``dropped_claim_hides_a_success`` (tests/explorer/broken.py, the code before
    explorer seed 1204141390's fix) leaves ``j`` RELEASED over its success at rest."""
    from tests.explorer.broken import VARIANTS

    for owner, attr, value in VARIANTS["dropped_claim_hides_a_success"][1]:
        monkeypatch.setattr(owner, attr, value)
    with pytest.raises(AssertionError, match="RELEASED"):
        test_end_to_end_ttl_took_the_record_then_a_refused_start_over_the_success(make_world)

"""Releases that act on a possibly stale reading (reconciliation's ``_release_ended`` with its
``confirm``, the completion's event, the duplicate check's settle), on moto with the real adapters.

Moto has no RedriveExecution: ``redrive`` puts moto's execution back to RUNNING, and ``Redrives``
adds ``redriveCount``/``redriveDate`` to every DescribeExecution answer of a redriven execution
(registered on the session, so every runtime's client made after it carries it).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from sluice.core.clock import FakeClock
from sluice.runtime import Runtime
from tests.integration.test_breaker_findings import redrive, running_of_key
from tests.integration.test_free_key_mark_attacks import skewed
from tests.integration.test_young_adoption_attacks import at, finish_at, first_run_released, settle
from tests.support.aws import build_stack


class Redrives:
    """Step Functions' redrive fields, added to DescribeExecution answers."""

    def __init__(self, session: Any) -> None:
        self.by: dict[str, tuple[int, float]] = {}
        session.events.register("after-call.sfn.DescribeExecution", self._answer)

    def _answer(self, parsed: dict[str, Any], **_: Any) -> None:
        known = self.by.get(parsed.get("name", ""))
        if known is not None and "redriveCount" not in parsed:
            parsed["redriveCount"], parsed["redriveDate"] = known[0], at(known[1])

    def redrive(self, stack, name: str) -> float:
        redrive(stack, name)
        count = self.by.get(name, (0, 0.0))[0] + 1
        self.by[name] = (count, stack.clock.now())
        return stack.clock.now()


def runtime_at(stack, t: float) -> Runtime:
    """A container whose clock reads exactly ``t`` (another machine)."""
    clock = FakeClock(t)
    base = skewed(stack, 0)
    return Runtime(
        base.settings, session=stack.session, clock=clock, client_config=base.client_config, sleep=clock.sleep
    )


def on_release_of(rt: Runtime, name: str, meanwhile) -> Counter:
    """Run ``meanwhile`` once, just before ``rt``'s first TransactWriteItems that writes EXEC#name
    (its release: the record already read, the write's conditions already built)."""
    seen: Counter = Counter()

    def hook(params: dict[str, Any], **_: Any) -> None:
        if seen["fired"]:
            return
        for item in params.get("TransactItems", []):
            update = item.get("Update") or {}
            if update.get("Key", {}).get("pk", {}).get("S") == f"EXEC#{name}" and "ended_at" in update.get(
                "UpdateExpression", ""
            ):
                seen["fired"] += 1
                meanwhile()
                return

    rt.client("dynamodb").meta.events.register("before-parameter-build.dynamodb.TransactWriteItems", hook)
    return seen


def shard_holders(stack) -> dict[str, Any]:
    client = stack.runtime().client("dynamodb")
    items = client.scan(TableName=stack.settings.table_name)["Items"]
    return {
        i["pk"]["S"]: sorted(i.get("holders", {}).get("M", {}))
        for i in items
        if i["pk"]["S"].startswith("SLOTS#launcher#")
    }


def check_promises(stack) -> list[str]:
    """Every execution Step Functions says runs holds its slot and its key's lease; one run per key."""
    store = stack.runtime().store()
    broken = []
    holders = store.ledger().holders
    keys: Counter = Counter()
    for name in stack.running():
        record = store.execution(name)
        if record is None:
            continue  # external
        keys[record.key] += 1
        payload = store.payload(record.key)
        if name not in holders:
            broken.append(f"{name} runs without a slot (holders {sorted(holders)})")
        if payload is None or payload.holder != name:
            broken.append(f"{name} runs without its key's lease (holder {payload and payload.holder})")
    broken += [f"key {k} runs {n} times" for k, n in keys.items() if n > 1]
    return broken


def adopted_then_ended(stack, clock, redrives: Redrives) -> tuple[str, float, float, float]:
    """e1 of k FAILED (released), redriven at r1, adopted by the stack's clock at a1, FAILED again
    at s2 = a1 + 5 (its event lost). Returns e1, r1, a1, s2."""
    e1 = first_run_released(stack)
    clock.advance(1_000)
    r1 = redrives.redrive(stack, e1)
    clock.advance(1)
    stack.launcher().tick()
    store = stack.runtime().store()
    record = store.execution(e1)
    assert record.adopted_at == clock.now() and store.payload("k").holder == e1
    a1 = record.adopted_at
    clock.advance(5)
    finish_at(stack, e1, "FAILED")  # its event lost
    return e1, r1, a1, clock.now()


def readopted_meanwhile(stack, store, b, redrives, e1: str, adopted_at: float):
    """B (two windows since its sighting) releases e1 on s2, the operator redrives it, and D, its
    clock reading ``adopted_at``, adopts it again."""

    def meanwhile() -> None:
        b.launcher().tick()
        assert store.payload("k").holder is None, "B did not release e1"
        redrives.redrive(stack, e1)
        runtime_at(stack, adopted_at).launcher().tick()
        assert store.execution(e1).adoptions == 2 and store.payload("k").holder == e1

    return meanwhile


def e1_alone(stack, store, e1: str) -> None:
    """e1 the only run of k, every run holding its slot and lease."""
    state = {
        "EXEC#e1": store.execution(e1),
        "PAYLOAD#k": store.payload("k"),
        "shards": shard_holders(stack),
        "running": stack.running(),
    }
    assert running_of_key(stack, "k") == [e1], state
    assert check_promises(stack) == [], state


def next_message_waits_behind(stack, clock, store, e1: str) -> None:
    """The key's next message, then a tick: e1 alone runs of k, holding its slot and lease."""
    clock.advance(1)
    stack.send({"id": "k", "n": 2}, group="b")
    stack.launcher().tick(reconcile_first=False)
    e1_alone(stack, store, e1)


@pytest.mark.parametrize("collide", [True, False], ids=["readopted-same-stamp", "readopted-1ms-later"])
def test_reconciler_release_of_an_adoption_readopted_with_the_same_stamp(session, collide):
    """Reconciler B saw e1's adoption (a1) two windows ago; DescribeExecution: FAILED at s2, its
    own end. Before B's release is written: the adopter A releases e1 on s2; the operator redrives
    it (r3); reconciler D, whose clock runs behind and reads a1, adopts it again: adopted_at a1
    again (adoptions 2). B's write: IF adopted_at = a1 ✓ (the count is not checked) → e1 released
    while it runs; the key's next message starts beside it."""
    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=1, clock=clock)
    redrives = Redrives(session)
    e1, _r1, a1, _s2 = adopted_then_ended(stack, clock, redrives)
    store = stack.runtime().store()

    clock.advance(5)
    b = skewed(stack, 0)  # another machine, same time
    b.launcher().tick()  # e1 missing from the listing, young: B's sighting
    assert store.execution(e1).seen_by(b.clock.identity) == b.clock.now()
    assert store.ledger().holders == {e1}

    def meanwhile() -> None:
        stack.launcher().tick()  # A (the adopter's clock, two windows on): releases e1 on s2
        assert store.payload("k").holder is None, "A did not release e1"
        redrives.redrive(stack, e1)  # r3 > s2
        d = runtime_at(stack, a1 if collide else a1 + 0.001)
        d.launcher().tick()  # listed RUNNING, redriveDate r3 after s2: adopted at D's now
        again = store.execution(e1)
        assert again.adoptions == 2 and store.payload("k").holder == e1, again

    clock.advance(125)
    b.clock.advance(125)
    fired = on_release_of(b, e1, meanwhile)
    b.launcher().tick()
    assert fired["fired"] == 1

    next_message_waits_behind(stack, clock, store, e1)


@pytest.mark.parametrize(
    ("skew", "answer"),
    [(-3600, "fresh"), (-50, "ended-and-redriven-again"), (0, "stale-no-redrive-date"), (3600, "fresh")],
)
def test_reconciler_release_of_a_run_released_redriven_and_adopted_meanwhile(session, skew, answer):
    """The fix's own race, varied: B reads e1 (never adopted) and DescribeExecution FAILED at s1.
    Before its write: e1's late event releases it; redriven (r1); reconciler C (clock ``skew``)
    adopts it (on a fresh answer; on one without redriveDate; or then it ends again at s2 and is
    redriven again, r2). B's write ✗ (adopted), read again: young to B → nothing released."""
    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=1, clock=clock)
    redrives = Redrives(session)
    stack.send({"id": "k", "n": 1}, group="a")
    stack.launcher().tick()
    (e1,) = stack.running()
    clock.advance(100)
    late = finish_at(stack, e1, "FAILED")  # s1, its event late
    store = stack.runtime().store()
    clock.advance(61)
    b = skewed(stack, 0)

    def meanwhile() -> None:
        assert settle(stack.runtime(), late)  # the late event releases e1 on s1
        clock.advance(2)
        redrives.redrive(stack, e1)
        if answer == "stale-no-redrive-date":
            del redrives.by[e1]
        clock.advance(1)
        c = skewed(stack, skew)
        c.launcher().tick()
        assert store.payload("k").holder == e1 and store.execution(e1).adopted_at is not None
        if answer == "ended-and-redriven-again":
            clock.advance(3)
            finish_at(stack, e1, "FAILED")  # s2, its event lost
            clock.advance(3)
            redrives.redrive(stack, e1)

    fired = on_release_of(b, e1, meanwhile)
    b.launcher().tick()
    assert fired["fired"] == 1
    stack.send({"id": "k", "n": 2}, group="b")
    stack.launcher().tick(reconcile_first=False)
    state = {"EXEC#e1": store.execution(e1), "PAYLOAD#k": store.payload("k"), "shards": shard_holders(stack)}
    assert running_of_key(stack, "k") == [e1], state
    assert check_promises(stack) == [], state


@pytest.mark.parametrize("collide", [True, False], ids=["readopted-same-stamp", "readopted-1ms-later"])
def test_duplicate_check_settle_of_an_adoption_readopted_with_the_same_stamp(session, collide):
    """The duplicate check's settle, same race: the adopter's own launcher (its sighting is the
    adoption, two windows old) refuses m2 of k on e1, reads DescribeExecution FAILED at s2 and
    settles e1. Before its write: reconciler B releases e1 on s2, the operator redrives it, D
    (clock reading a1) adopts it again at a1. The settle's IF adopted_at = a1 ✓ → e1 released
    while it runs, and m2 claims k beside it."""
    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=2, clock=clock)
    redrives = Redrives(session)
    e1, _r1, a1, _s2 = adopted_then_ended(stack, clock, redrives)
    store = stack.runtime().store()
    clock.advance(5)
    b = skewed(stack, 0)
    b.launcher().tick()  # B's sighting at a1 + 10
    clock.advance(125)
    b.clock.advance(125)

    meanwhile = readopted_meanwhile(stack, store, b, redrives, e1, a1 if collide else a1 + 0.001)

    launcher_rt = stack.runtime()
    fired = on_release_of(launcher_rt, e1, meanwhile)
    stack.send({"id": "k", "n": 2}, group="b")
    launcher_rt.launcher().tick(reconcile_first=False)
    assert fired["fired"] == 1
    e1_alone(stack, store, e1)


@pytest.mark.parametrize("collide", [True, False], ids=["readopted-same-stamp", "readopted-1ms-later"])
def test_completion_event_of_an_adoption_readopted_with_the_same_stamp(session, collide):
    """The completion's release on a late event, same race: e1's FAILED event (s2) reaches the
    adopter's container two windows after the adoption; DescribeExecution agrees (FAILED at s2).
    Before its write: reconciler B releases e1 on s2, the operator redrives it, D (clock reading
    a1) adopts it again at a1. The event's IF adopted_at = a1 ✓ → e1 released while it runs."""
    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=1, clock=clock)
    redrives = Redrives(session)
    e1 = first_run_released(stack)
    clock.advance(1_000)
    redrives.redrive(stack, e1)
    clock.advance(1)
    stack.launcher().tick()
    store = stack.runtime().store()
    a1 = store.execution(e1).adopted_at
    clock.advance(5)
    late = finish_at(stack, e1, "FAILED")  # s2, its event late
    clock.advance(5)
    b = skewed(stack, 0)
    b.launcher().tick()  # B's sighting
    clock.advance(125)
    b.clock.advance(125)

    meanwhile = readopted_meanwhile(stack, store, b, redrives, e1, a1 if collide else a1 + 0.001)

    handler = stack.runtime()
    fired = on_release_of(handler, e1, meanwhile)
    settle(handler, late)
    assert fired["fired"] == 1
    next_message_waits_behind(stack, clock, store, e1)


def test_a_release_that_holds_the_adoption_by_its_stamp_alone_is_caught(session, monkeypatch):
    """The variant ``release_adoption_uncounted`` (tests/explorer/broken.py: the adoption held as
    read by ``adopted_at`` alone) fails the readoption with the same stamp."""
    from tests.explorer.broken import VARIANTS

    for owner, attr, value in VARIANTS["release_adoption_uncounted"][1]:
        monkeypatch.setattr(owner, attr, value)
    with pytest.raises(AssertionError):
        test_reconciler_release_of_an_adoption_readopted_with_the_same_stamp(session, True)

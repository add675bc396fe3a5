"""Awaits on moto with the real adapters: a waiter leaves the queue, waits in the table, starts on
the last awaited receipt, is dead-lettered with its reason, and runs once however often it is woken."""

from __future__ import annotations

import json

import pytest
from botocore.exceptions import ClientError

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import Claim, Ending, Outcome, PayloadState
from sluice.core.names import execution_name, named_entry
from sluice.features.awaits import sweep
from tests.support.aws import build_stack
from tests.support.hooks import Crash, count_calls, crash_after, crash_before

HORIZON = 7 * 86_400


@pytest.fixture
def stack(session):
    return build_stack(session, clock=FakeClock())


def awaiting(*keys: str) -> str:
    return json.dumps(list(keys))


def runs_of(stack, key: str) -> list[str]:
    store = stack.runtime().store()
    return [e["name"] for e in stack.executions() if store.execution(e["name"]).key == key]


def running_key(stack, key: str) -> str:
    store = stack.runtime().store()
    (name,) = [n for n in stack.running() if store.execution(n).key == key]
    return name


def end(stack, key: str, status: str = "SUCCEEDED"):
    launcher = stack.launcher()
    return launcher.on_status_change(StatusChange.from_event(stack.finish(running_key(stack, key), status)))


def test_a_waiter_is_parked_and_its_message_deleted_then_starts_on_the_last_receipt(stack):
    stack.send({"id": "a"}, group="a")
    stack.send({"id": "b"}, group="b")
    waiter_id = stack.send({"id": "c"}, group="c", sluice_awaits=awaiting("a", "b"))
    summary = stack.launcher().tick()
    assert (summary.n(Outcome.STARTED), summary.n(Outcome.WAITING)) == (2, 1)
    assert stack.queue_counts() == (0, 0)  # nothing held on the queue while it waits
    assert runs_of(stack, "c") == []
    store = stack.runtime().store()
    assert store.waiters_on("a") == store.waiters_on("b") == {waiter_id}

    end(stack, "a")
    assert runs_of(stack, "c") == [] and stack.queue_counts() == (0, 0)
    released, refill, _ = end(stack, "b")  # the last receipt: sent back, and the refill starts it
    assert released and refill.n(Outcome.STARTED) == 1
    assert stack.running() == [execution_name("c", waiter_id)]  # its original id names it
    assert store.waiting() == frozenset()


def test_a_payload_satisfied_at_arrival_starts_at_once(stack):
    stack.send({"id": "a"}, group="a")
    stack.launcher().tick()
    end(stack, "a")
    stack.send({"id": "c"}, group="c", sluice_awaits=awaiting("a"))
    summary = stack.launcher().tick()
    assert summary.n(Outcome.STARTED) == 1 and summary.n(Outcome.WAITING) == 0
    assert stack.runtime().store().waiting() == frozenset()


def test_a_failed_awaited_key_dead_letters_the_waiter_with_the_reason(stack):
    stack.send({"id": "a"}, group="a")
    stack.send({"id": "c"}, group="c", sluice_awaits=awaiting("a"))
    stack.launcher().tick()
    end(stack, "a", "FAILED")
    assert runs_of(stack, "c") == [], "c started though the key it awaits FAILED"
    dead_letters = stack.dlq_messages()
    assert len(dead_letters) == 1
    dead = dead_letters[0]
    assert dead["MessageAttributes"]["sluice-error"]["StringValue"] == "awaited a ended FAILED"
    assert json.loads(dead["Body"]) == {"id": "c"}
    assert runs_of(stack, "c") == [] and stack.queue_counts() == (0, 0)
    assert stack.runtime().store().payload("c").reason == "awaited a ended FAILED"


def test_run_anyway_starts_the_waiter_after_a_failure(stack):
    stack.send({"id": "a"}, group="a")
    stack.send({"id": "c"}, group="c", sluice_awaits=awaiting("a"), sluice_on_await_failure="run")
    stack.launcher().tick()
    end(stack, "a", "TIMED_OUT")
    assert stack.dlq_messages() == []
    assert len(runs_of(stack, "c")) == 1


def test_the_horizon_dead_letters_a_waiter_on_a_key_never_seen(stack):
    stack.send({"id": "c"}, group="c", sluice_awaits=awaiting("ghost"))
    stack.launcher().tick()
    stack.clock.advance(HORIZON - 1)
    stack.launcher().tick()
    assert stack.dlq_messages() == []
    stack.clock.advance(1)
    stack.launcher().tick()
    (dead,) = stack.dlq_messages()
    reason = dead["MessageAttributes"]["sluice-error"]["StringValue"]
    assert reason == f"awaited ghost not seen within the await horizon ({HORIZON} s)"
    assert stack.runtime().store().waiting() == frozenset()


def test_a_wake_up_lost_before_the_send_is_found_by_reconciliation(stack):
    stack.send({"id": "a"}, group="a")
    stack.send({"id": "c"}, group="c", sluice_awaits=awaiting("a"))
    stack.launcher().tick()
    completion = stack.runtime()
    crash_before(completion.client("sqs"), "SendMessage")  # the receipt is written, then it dies
    with pytest.raises(Crash):
        completion.launcher().on_status_change(StatusChange.from_event(stack.finish(running_key(stack, "a"))))
    store = stack.runtime().store()
    assert store.payload("a").succeeded_by and store.waiting() != frozenset()
    assert stack.queue_counts() == (0, 0)
    stack.launcher().tick()  # reconciliation's sweep sends it; admission starts it
    assert len(runs_of(stack, "c")) == 1 and store.waiting() == frozenset()


def test_a_waiter_woken_twice_runs_once(stack):
    stack.send({"id": "a"}, group="a")
    waiter_id = stack.send({"id": "c"}, group="c", sluice_awaits=awaiting("a"))
    stack.launcher().tick()
    completion = stack.runtime()
    fired = crash_after(completion.client("sqs"), "SendMessage")  # sent, then dies before the mark
    with pytest.raises(Crash):
        completion.launcher().on_status_change(StatusChange.from_event(stack.finish(running_key(stack, "a"))))
    assert fired["calls"] == 1
    store = stack.runtime().store()
    assert store.waiting() == {waiter_id}  # still parked: the sweep will send it again

    stack.launcher().admit()
    name = execution_name("c", waiter_id)
    assert stack.running() == [name]
    # moto, unlike SQS, forgets a deduplication id once its message is deleted: the second copy arrives.
    assert sweep(store=store, queue=stack.runtime().queue(), now=stack.clock.now(), horizon=HORIZON) == {
        "sent": 1
    }
    summary = stack.launcher().admit()
    assert summary.received == 1 and summary.n(Outcome.STARTED) == 0
    assert runs_of(stack, "c") == [name]

    stack.launcher().on_status_change(StatusChange.from_event(stack.finish(name)))
    # A third copy after the run ended: its name already ran.
    (waiter,) = store.waiters([waiter_id])
    from sluice.features.awaits import _parked

    stack.runtime().queue().requeue(_parked(waiter))
    summary = stack.launcher().admit()
    assert summary.n(Outcome.ALREADY_RAN) == 1 and runs_of(stack, "c") == [name]
    assert stack.queue_counts() == (0, 0)


def test_a_crash_after_the_mark_and_before_the_sets_are_cleared_is_mended(stack):
    stack.send({"id": "a"}, group="a")
    waiter_id = stack.send({"id": "c"}, group="c", sluice_awaits=awaiting("a"))
    stack.launcher().tick()
    completion = stack.runtime()
    # The release is one TransactWriteItems and the mark an UpdateItem; the sets' removal the next
    # TransactWriteItems: die right after the mark.
    crash_after(completion.client("dynamodb"), "UpdateItem")
    with pytest.raises(Crash):
        completion.launcher().on_status_change(StatusChange.from_event(stack.finish(running_key(stack, "a"))))
    store = stack.runtime().store()
    assert store.waiting() == {waiter_id} and not store.waiters([waiter_id])[0].parked
    stack.launcher().tick()  # the sweep takes the released waiter off the sets; it sends nothing more
    assert store.waiting() == frozenset() and store.waiters_on("a") == frozenset()
    assert len(runs_of(stack, "c")) == 1


def test_a_malformed_awaits_attribute_is_dead_lettered_not_a_crash(stack):
    stack.send({"id": "c"}, group="c", sluice_awaits="[1, 2]")
    summary = stack.launcher().tick()
    assert summary.n(Outcome.INVALID) == 1
    (dead,) = stack.dlq_messages()
    assert "non-empty string" in dead["MessageAttributes"]["sluice-error"]["StringValue"]


@pytest.mark.parametrize("after", ["an invalid message of the key", "a claim of the key released unstarted"])
def test_a_key_whose_last_run_failed_dead_letters_its_waiter_whatever_came_after(stack, after):
    """The key's record moves on after its last run ended FAILED (an invalid message of the key is
    recorded, or a later claim of it is released without a start, as reconciliation does with an
    abandoned one): the waiter still learns that the key's latest run ended badly, and is
    dead-lettered now, not at the await horizon."""
    stack.send({"id": "a"}, group="a")
    stack.launcher().tick()
    end(stack, "a", "FAILED")
    store = stack.runtime().store()
    now = stack.clock.now()
    if after == "an invalid message of the key":
        store.record_invalid(key="a", reason="bad input", now=now)
    else:
        store.claim(Claim(key="a", name="a-again", message_id="m-again", now=now, claim_expires_at=now + 900))
        store.release("a-again", Ending(PayloadState.RELEASED, now, error="abandoned"))
    assert store.payload("a").state.value in ("INVALID", "RELEASED") and store.payload("a").holder is None
    waiter_id = stack.send({"id": "c"}, group="c", sluice_awaits=awaiting("a"))
    stack.launcher().tick()
    assert runs_of(stack, "c") == [] and store.waiting() == frozenset()
    dead = [m for m in stack.dlq_messages() if json.loads(m["Body"]) == {"id": "c"}]
    assert [m["MessageAttributes"]["sluice-error"]["StringValue"] for m in dead] == ["awaited a ended FAILED"]
    assert waiter_id and store.payload("c").reason == "awaited a ended FAILED"


def payload_reads(client) -> list[list[str]]:
    """The keys of every BatchGetItem that reads payload records (the gate's reads)."""
    reads: list[list[str]] = []

    def hook(params, **_):
        keys = [k["pk"]["S"] for table in params["RequestItems"].values() for k in table["Keys"]]
        if any(k.startswith("PAYLOAD#") for k in keys):
            reads.append(sorted(keys))

    client.meta.events.register("provide-client-params.dynamodb.BatchGetItem", hook)
    return reads


def test_a_receive_of_several_waiters_reads_their_awaited_keys_once(session):
    """Five waiters in one receive: one read of every key they await, then each park's own re-read
    (the race the module docstring draws), instead of five reads and four re-reads."""
    stack = build_stack(session, clock=FakeClock(), max_concurrency=10)
    stack.send({"id": "ok"}, group="ok")
    stack.send({"id": "live"}, group="live")
    rt = stack.runtime()
    launcher = rt.launcher()
    launcher.tick()
    launcher.on_status_change(StatusChange.from_event(stack.finish(running_key(stack, "ok"), "SUCCEEDED")))
    for i in range(4):
        stack.send({"id": f"w{i}"}, group=f"w{i}", sluice_awaits=awaiting("live", "ok"))
    stack.send({"id": "w4"}, group="w4", sluice_awaits=awaiting("ok"))
    reads = payload_reads(rt.client("dynamodb"))
    summary = launcher.admit()
    assert (summary.n(Outcome.WAITING), summary.n(Outcome.STARTED)) == (4, 1)
    assert reads[0] == ["PAYLOAD#live", "PAYLOAD#ok"], "the read ahead covers the whole receive"
    assert len(reads) == 1 + 4, "one read ahead, then one re-read per park"
    assert runs_of(stack, "w4") and not any(runs_of(stack, f"w{i}") for i in range(4))


def test_a_refill_whose_message_parks_receives_again_without_reading_the_slots_again(session):
    """A completion's refill received a waiter, which parked and took no slot: its next receive
    uses the room it read, and the payload behind the waiter starts."""
    stack = build_stack(session, clock=FakeClock(), max_concurrency=1)
    stack.send({"id": "a"}, group="a")
    rt = stack.runtime()
    launcher = rt.launcher()
    launcher.tick()
    stack.send({"id": "w"}, group="g", sluice_awaits=awaiting("never-seen"))
    stack.send({"id": "b"}, group="g")
    calls = count_calls(rt.client("dynamodb"), rt.client("sqs"))
    _, refill, _ = launcher.on_status_change(
        StatusChange.from_event(stack.finish(running_key(stack, "a"), "SUCCEEDED"))
    )
    assert (refill.n(Outcome.WAITING), refill.n(Outcome.STARTED)) == (1, 1)
    assert runs_of(stack, "b") and stack.queue_counts() == (0, 0)
    assert calls["ReceiveMessage"] == 2
    # The slots were read once, before the first receive (one BatchGetItem); the other two are the
    # waiter's reads of its awaited key, before and after its park.
    assert calls["BatchGetItem"] == 3


def awaited_reads(client) -> list[str]:
    """The ``AWAITED#`` items a client reads (GetItem), in order."""
    seen: list[str] = []

    def note(params, **_):
        pk = params.get("Key", {}).get("pk", {}).get("S", "")
        if pk.startswith("AWAITED#"):
            seen.append(pk)

    client.meta.events.register("before-parameter-build.dynamodb.GetItem", note)
    return seen


def test_an_end_of_a_key_nobody_awaits_reads_no_waiters(stack):
    stack.send({"id": "a"}, group="a")
    stack.launcher().tick()
    completion = stack.runtime()
    reads = awaited_reads(completion.client("dynamodb"))
    released, _, _ = completion.launcher().on_status_change(
        StatusChange.from_event(stack.finish(running_key(stack, "a"), "SUCCEEDED"))
    )
    assert released and reads == []


def test_an_end_of_a_key_awaited_once_reads_its_waiters(stack):
    """The park flags the awaited key's payload record, also before the key was ever seen; its
    release then reads the waiters, and the flag record alone is no payload record."""
    waiter_id = stack.send({"id": "c"}, group="c", sluice_awaits=awaiting("a"))
    assert stack.launcher().tick().n(Outcome.WAITING) == 1
    store = stack.runtime().store()
    assert store.payload("a") is None  # only the flag: no record of a key never seen
    stack.send({"id": "a"}, group="a")
    stack.launcher().tick()
    completion = stack.runtime()
    reads = awaited_reads(completion.client("dynamodb"))
    released, refill, _ = completion.launcher().on_status_change(
        StatusChange.from_event(stack.finish(running_key(stack, "a"), "SUCCEEDED"))
    )
    assert released and reads == ["AWAITED#a"]
    assert refill.n(Outcome.STARTED) == 1 and stack.running() == [execution_name("c", waiter_id)]


def test_a_waiter_parked_while_the_release_is_on_its_way_is_woken_by_it(stack):
    """The release reads the execution record, then writes. A waiter parks on its key in between
    (another launcher): the flag it wrote refuses the release, which goes again and reads the
    waiters. Without the flag the release would read none and the waiter would wait for the sweep."""
    stack.send({"id": "a"}, group="a")
    stack.launcher().tick()
    holder = running_key(stack, "a")
    completion = stack.runtime()
    fired = {"parked": 0}
    sent: list[str] = []

    def park_in_between(params, **_):
        ends = [
            i
            for i in params["TransactItems"]
            if "ended_at" in i.get("Update", {}).get("UpdateExpression", "")
        ]
        if ends and not fired["parked"]:
            # Sent now, after the completion's own receive: another launcher receives and parks it.
            sent.append(stack.send({"id": "c"}, group="c", sluice_awaits=awaiting("a")))
            fired["parked"] += stack.launcher().tick().n(Outcome.WAITING)

    completion.client("dynamodb").meta.events.register(
        "before-parameter-build.dynamodb.TransactWriteItems", park_in_between
    )
    released, refill, _ = completion.launcher().on_status_change(
        StatusChange.from_event(stack.finish(holder, "SUCCEEDED"))
    )
    assert released and fired["parked"] == 1  # the fault fired: parked as the holder ended
    assert stack.runtime().store().waiting() == frozenset(), "the waiter parked during the release waits on"
    assert refill.n(Outcome.STARTED) == 1 and stack.running() == [execution_name("c", sent[0])]


@pytest.mark.parametrize("variant", [None, "waiters_by_origin"])
def test_a_forged_origin_of_another_key_does_not_park_over_a_waiter(stack, variant):
    """A producer's message of key d awaiting a carrying ``sluice-origin-message-id`` = the id of c's
    waiter. Names derive from the key and the origin, so the two are different messages; keyed by
    the origin alone (``waiters_by_origin``), d's is taken for a redelivery of c's waiter and deleted,
    and never runs."""
    stack.send({"id": "a"}, group="a")
    c_id = stack.send({"id": "c"}, group="c", sluice_awaits=awaiting("a"))
    stack.send({"id": "d"}, group="d", sluice_awaits=awaiting("a"), sluice_origin_message_id=c_id)
    from contextlib import nullcontext

    from tests.explorer.variants import applied  # here: tests.explorer.broken imports this module

    with applied(variant) if variant else nullcontext():
        summary = stack.launcher().tick()
        assert (summary.n(Outcome.STARTED), summary.n(Outcome.WAITING)) == (1, 2)  # the forgery fired
        assert stack.queue_counts() == (0, 0)
        end(stack, "a")
        for _ in range(2):
            stack.launcher().tick()
    names = {e["name"] for e in stack.executions()}
    assert execution_name("c", c_id) in names
    assert (execution_name("d", c_id) in names) is (variant is None), "d's message was lost"


def _settle(stack, rounds: int = 4) -> list[str]:
    """Tick, end every run SUCCEEDED, again: the names of every execution started."""
    for _ in range(rounds):
        stack.clock.advance(70)
        stack.launcher().tick()
        for name in stack.running():
            stack.launcher().on_status_change(StatusChange.from_event(stack.finish(name)))
    return [e["name"] for e in stack.executions()]


def test_a_forged_origin_shaped_like_a_waiters_name_never_meets_its_item(stack, session):
    """An attack on the waiting room keyed by name: C forges the name B's waiter would park under
    as its origin. A name entry holds a space, which no origin id holds (``named_entry``): C's item
    and B's never meet, and A, B and C each run once."""
    stack.send({"id": "k"}, group="k")
    stack.launcher().tick()
    x = stack.send({"id": "a"}, group="a", sluice_awaits=awaiting("k"))
    forged = execution_name("b", x)
    stack.send({"id": "c"}, group="c", sluice_awaits=awaiting("k"), sluice_origin_message_id=forged)
    stack.launcher().tick()
    stack.send({"id": "b"}, group="b", sluice_awaits=awaiting("k"), sluice_origin_message_id=x)
    stack.launcher().tick()
    items = stack.client("dynamodb").scan(TableName=stack.settings.table_name)["Items"]
    waits = sorted(i["pk"]["S"] for i in items if i["pk"]["S"].startswith("WAIT#"))
    assert waits == sorted([f"WAIT#{x}", f"WAIT#{forged}", f"WAIT#{named_entry('b', x)}"])  # it fired
    end(stack, "k")
    names = _settle(stack)
    assert {execution_name("a", x), execution_name("b", x), execution_name("c", forged)} <= set(names)


def test_another_keys_waiter_parking_while_a_release_takes_its_id_off_the_sets_stays_indexed(stack, session):
    """A's waiter (origin x) released by k's end: its item marked, then x taken off the sets. In
    between, B's forged waiter (origin x, awaiting k2) parks. Over the released item it would be
    taken off AWAITING by A's removal, and with k2's end unable to settle its waiters (a throttled
    read) nothing would wake it. It parks by name, and runs."""
    stack.send({"id": "k"}, group="k")
    stack.send({"id": "k2"}, group="k2")
    stack.launcher().tick()
    x = stack.send({"id": "a"}, group="a", sluice_awaits=awaiting("k"))
    stack.launcher().tick()
    fired = {"parked": 0, "throttled": 0, "throttle": False}

    def park_in_between(params, **_):
        removal = [i["Update"] for i in params.get("TransactItems", []) if "Update" in i]
        ids = [u.get("ExpressionAttributeValues", {}).get(":ids", {}).get("SS") for u in removal]
        if (
            not fired["parked"]
            and removal
            and removal[0].get("UpdateExpression") == "DELETE waiters :ids"
            and ids[0] == [x]
        ):
            fired["parked"] += 1
            stack.send({"id": "b"}, group="b", sluice_awaits=awaiting("k2"), sluice_origin_message_id=x)
            assert stack.launcher().tick(reconcile_first=False).n(Outcome.WAITING) == 1

    def throttled(params, **_):
        if fired["throttle"] and params.get("Key", {}).get("pk", {}).get("S") == "AWAITED#k2":
            fired["throttle"], fired["throttled"] = False, fired["throttled"] + 1
            raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "slow down"}}, "GetItem")

    session._session.register("before-parameter-build.dynamodb.TransactWriteItems", park_in_between)
    session._session.register("before-parameter-build.dynamodb.GetItem", throttled)
    end(stack, "k")
    fired["throttle"] = True
    end(stack, "k2")
    assert fired["parked"] == 1 and fired["throttled"] == 1  # both faults fired
    names = _settle(stack)
    assert {execution_name("a", x), execution_name("b", x)} <= set(names)


def test_two_waiters_whose_origins_share_their_first_90_characters_are_two_sends(session):
    """Their re-sends' deduplication ids were the origin cut at 90 characters and the key: one id
    for two messages, which SQS takes for one within 5 minutes. A long origin is now digested whole.
    (Deferred: the second of the key waits in the table for the first's end, not on moto's clock.)"""
    from sluice.launch.settings import DuplicatePolicy
    from tests.support.sqs_dedup import sqs_dedup

    with sqs_dedup(session) as dedup:
        stack = build_stack(session, clock=FakeClock(), duplicate_policy=DuplicatePolicy.DEFER)
        stack.send({"id": "k"}, group="k")
        stack.launcher().tick()
        o1, o2 = "o" * 90 + "-first", "o" * 90 + "-second"
        stack.send({"id": "b", "n": 1}, group="g", sluice_awaits=awaiting("k"), sluice_origin_message_id=o1)
        stack.send({"id": "b", "n": 2}, group="g", sluice_awaits=awaiting("k"), sluice_origin_message_id=o2)
        assert stack.launcher().tick().n(Outcome.WAITING) == 2
        end(stack, "k")
        names = _settle(stack, rounds=12)
    assert not dedup.dropped
    assert {execution_name("b", o1), execution_name("b", o2)} <= set(names)


@pytest.mark.parametrize("dedup_by_id", [False, True], ids=["as-is", "by-origin-alone"])
def test_two_waiters_of_two_keys_under_one_origin_each_reach_the_dlq(session, monkeypatch, dedup_by_id):
    """Found by the explorer (seed 951393212, a forged origin): c's waiter and d's (another key, the
    same origin id, the same group) await a, which ends ABORTED; both are dead-lettered at once. Deduplicated by the
    origin alone, SQS keeps the first copy in the DLQ and drops the second within 5 minutes: d's
    message is lost with no trace. Each waiter's copy names its key too."""
    from sluice.adapters.aws.sqs import SqsQueue
    from tests.support.sqs_dedup import sqs_dedup

    if dedup_by_id:  # the code before the fix: the DLQ copy deduplicated by its message id alone
        send = SqsQueue.send_to_dlq
        monkeypatch.setattr(
            SqsQueue, "send_to_dlq", lambda self, m, reason, *, dedup=None: send(self, m, reason)
        )
    with sqs_dedup(session) as dedup:
        stack = build_stack(session, clock=FakeClock())
        stack.send({"id": "a"}, group="a")
        c_id = stack.send({"id": "c"}, group="c", sluice_awaits=awaiting("a"))
        # In c's group: the stack's queues deduplicate within a message group.
        stack.send({"id": "d"}, group="c", sluice_awaits=awaiting("a"), sluice_origin_message_id=c_id)
        assert stack.launcher().tick().n(Outcome.WAITING) == 2
        end(stack, "a", "ABORTED")
        stack.launcher().tick()
        dead = stack.drain(stack.settings.dlq_url)
    keys = sorted(json.loads(m["Body"])["id"] for m in dead)
    assert keys == (["c"] if dedup_by_id else ["c", "d"]), keys
    assert bool(dedup.dropped) is dedup_by_id

"""Issue 9: the sequences that broke a promise, each reproduced in the reliability world exactly as
the issue tells it (moto in-process, a fake clock, faults through botocore hooks).

Every test asserts on what can be observed: the model's checks at every call (``World.check``), the
executions Step Functions runs, the table, and at the end ``World.settle``. Each one failed on the
code the issue was filed against (6b0e5c8); the docstring under each test's name says how.
"""

from __future__ import annotations

import json

import pytest

from sluice.launch.per_message import THROTTLED_STARTS
from sluice.runtime import CLIENT_CONFIG
from tests.reliability.actors import ITEM_LIMIT, item_size
from tests.reliability.world import CLAIM_TIMEOUT, VISIBILITY, WINDOW, World
from tests.support.faults import (
    FAULTS,
    SITUATIONAL_POINTS,
    AttemptFaults,
    CrashAt,
    Fault,
    Interleave,
    StaleList,
    Throttle,
)
from tests.support.hooks import retry_sleeps


def body(key: str) -> str:
    return json.dumps({"id": key})


def runs_of(world: World, key: str) -> list[str]:
    return [s.name for s in world.model.starts if s.key == key]


def name_for(world: World, message_id: str) -> str:
    (name,) = [n for n, m in world.model.claims.items() if m == message_id]
    return name


def test_a_resumed_claim_never_starts_after_reconciliation_released_it(make_world):
    """Issue 9 item 1. Failed before the fix: "<N> started without holding a slot", promise 1 (2
    running under MAX 2) and promise 2 (p0 twice): the resume neither renews nor checks the
    claim."""
    world = make_world(max_concurrency=2)
    world.send(body("e"), group="ge")
    world.tick("A")
    (e,) = world.model.running
    m = world.send(body("p0"), group="g0")
    assert world.tick("A", [CrashAt("after_claim")]) == "crashed"  # N claimed for M, never started
    n = name_for(world, m)
    world.advance(CLAIM_TIMEOUT + 1)  # both slots stay full past N's claim expiry; M returns
    world.send(body("p0"), group="g1")  # a re-submission of the same key
    world.send(body("q"), group="g2")  # and another payload

    world.end(e)
    # The completion's refill receives M, finds the lease its own and resumes; as it is about to
    # start N, the scheduled tick reconciles (N expired, never started) and admits.
    reconciling = Interleave("before_start", lambda: world.tick("B"))
    assert world.deliver(0, [reconciling]) == "ok"
    assert reconciling.seen >= 1, "the refill never resumed N"
    world.check()
    assert runs_of(world, "p0").count(n) == 1
    assert len(runs_of(world, "p0")) == 1, "p0 ran twice"
    world.settle()


def test_a_start_whose_first_attempt_arrived_is_never_rolled_back(make_world):
    """Issue 9 item 2. Failed before the fix: promise 2 (p0 started while N still runs): the final
    ThrottlingException was taken for a refusal and the claim rolled back while N ran."""
    world = make_world(max_concurrency=2)
    world.add_container("A-retrying", CLIENT_CONFIG)  # the deployed client: standard mode, 3 attempts
    m = world.send(body("p0"), group="g0")
    attempts = AttemptFaults("StartExecution", ("lost", "throttled", "throttled"))
    # The launcher backs off and calls again (THROTTLED_STARTS calls in all): throttled each time.
    again = Throttle("StartExecution", times=THROTTLED_STARTS - 1, skip=1)

    def meanwhile() -> None:
        world.send(body("p0"), group="g1")  # a re-submission arrives; the other launcher ticks
        world.tick("B")

    other = Interleave("before_return", meanwhile)
    with retry_sleeps() as slept:
        world.tick("A-retrying", [attempts, again, other])
    assert attempts.fired == {"lost": 1, "throttled": 2} and again.fired == THROTTLED_STARTS - 1
    assert len(slept) == 2, "botocore made three attempts"
    n = name_for(world, m)
    assert n in world.running_in_step_functions(), "the first attempt reached Step Functions"
    assert other.seen == 1
    world.check()
    assert n in world.holders(world.table()), "the claim of a start that may have happened is kept"
    assert runs_of(world, "p0") == [n]
    world.tick("A")  # M returns: the resume finds N running
    world.check()
    assert runs_of(world, "p0") == [n]
    world.settle()


def test_max_lowered_between_batches_of_one_tick_is_obeyed(make_world):
    """Issue 9 item 3. Failed before the fix: promise 1 ("late" started while 1 ran under MAX 1):
    MAX is read once per tick. The launcher caches MAX for 5 s as deployed; the clock passes that
    before the second batch. MAX is written to the parameter alone (the console, a deploy): the
    tick itself must read it again and move the caps before its next receive."""
    world = make_world(max_concurrency=2, max_cache_seconds=5)
    world.send(body("early"), group="g9")
    world.tick("A")
    assert len(world.model.running) == 1
    world.send("not JSON", group="g0", valid=False)  # the first batch starts nothing
    world.send(body("late"), group="g1")
    lowered = Interleave("after_delete", lambda: world.lower_max_mid_tick(1, by="parameter"))
    world.tick("A", [lowered])
    assert lowered.seen >= 1 and world.model.max == 1
    world.check()
    assert not runs_of(world, "late")
    world.settle()


def test_max_lowered_between_the_receive_and_the_claim_is_obeyed(make_world):
    """Found by the soak after issue 9's fix of item 3 (MAX read per batch): the operator lowers MAX
    after a batch was received and before its claims; each claim must use the MAX in force then.
    Failed with MAX read per batch: promise 1 (p1 started while 1 ran under MAX 1). Now
    `sluice set-max` writes the caps, which the very next claim obeys."""
    world = make_world(max_concurrency=2, max_cache_seconds=5)
    world.send(body("p0"), group="g0")
    world.tick("A")
    world.send(body("p1"), group="g1")
    lowered = Interleave("after_receive", lambda: world.lower_max_mid_tick(1))
    world.tick("A", [lowered])
    assert lowered.seen == 1 and world.model.max == 1
    world.check()
    assert not runs_of(world, "p1")
    world.settle()


def test_a_redriven_execution_counts_against_max_and_its_key(make_world):
    """Issue 9 item 4. Failed before the fix: promise 1 and promise 2: reconciliation takes the
    redriven p0 (its record says FAILED) for a stale listing, counts no external execution, and
    admits p0 again."""
    world = make_world(max_concurrency=1)
    world.send(body("p0"), group="g0")
    world.tick("A")
    (p0,) = world.model.running
    world.end(p0, "FAILED")
    world.deliver(0)
    assert not world.holders(world.table())
    world.redrive(p0)  # the operator's RedriveExecution: RUNNING again
    assert p0 in world.running_in_step_functions()
    world.send(body("p0"), group="g1")  # a re-submission
    world.send(body("p1"), group="g2")
    world.advance(WINDOW + 1)
    world.tick("A")
    world.check()
    assert runs_of(world, "p0") == [p0]
    assert not runs_of(world, "p1")
    world.settle()


def test_a_repeated_event_of_a_redriven_executions_earlier_run_releases_nothing(make_world):
    """Found by the soak (seed 20261130): p0 failed and was released, an operator redrove it, and
    reconciliation took it back; then EventBridge delivered p0's FAILED event a second time, which
    released the running p0, and the refill admitted another payload: two ran under MAX 1. An event
    for an adopted execution now releases it only if DescribeExecution says it has ended."""
    world = make_world(max_concurrency=1)
    world.send(body("p0"), group="g0")
    world.tick("A")
    (p0,) = world.model.running
    world.end(p0, "FAILED")
    assert world.deliver(0) == "ok"
    world.redrive(p0)
    world.advance(WINDOW + 1)
    world.tick("A")  # reconciliation adopts p0: its slot and lease are back
    assert world.holders(world.table()) == {p0}
    world.send(body("p1"), group="g1")
    world.redeliver(0)  # the FAILED event of p0's earlier run, once more
    world.check()
    assert world.holders(world.table()) == {p0}
    assert not runs_of(world, "p1")
    world.settle()


def test_an_execution_redriven_after_the_retention_period_still_holds_its_key(make_world):
    """Found by the soak (seed 20261130): p1 failed and was released; the retention period passed
    and TTL deleted its execution record; an operator redrove it (within RedriveExecution's 14
    days). Reconciliation found no record, so it could not tell p1's key and counted it external,
    and a re-submission of p1 started beside it. A record that may still be redriven now outlives
    the redrive window, whatever the retention."""
    world = make_world(max_concurrency=3, retention_days=1)
    world.send(body("p1"), group="g0")
    world.tick("A")
    (p1,) = world.model.running
    world.end(p1, "FAILED")
    assert world.deliver(0) == "ok"
    world.advance(2 * 86_400)  # past the retention period, well within the redrive window
    deleted = world.expire_ttl()
    assert deleted["PAYLOAD"] >= 1, "the TTL process ran and deleted the expired lease record"
    assert f"EXEC#{p1}" in world.table(), "the record of a redrivable execution outlives retention"
    world.redrive(p1)
    world.advance(WINDOW + 1)
    world.tick("A")  # reconciliation adopts p1
    assert world.holders(world.table()) == {p1}
    world.send(body("p1"), group="g1")  # a re-submission while the redriven p1 runs
    world.tick("A")
    world.check()
    assert runs_of(world, "p1") == [p1]
    world.settle()


def test_a_claim_of_a_key_whose_earlier_run_was_redriven_never_starts(make_world):
    """Found by the soak (seed 20261130): p2's first run failed and was released; a re-submission
    claimed p2 and its launcher died before the start; an operator redrove the first run.
    Reconciliation could not adopt it (the claim held p2's lease) and counted it external; then the
    claim's message came back, the resume started it, and p2 ran twice. Reconciliation now marks
    the key (the claim carries its start mark, so no block lands on it) and the resume, whose
    renewal lifts that mark, reads the key's and yields: the claim is released, the redriven run
    adopted, and the message is a duplicate of it."""
    world = make_world(max_concurrency=3)
    world.send(body("p2"), group="g0")
    world.tick("A")
    (first,) = world.model.running
    world.end(first, "FAILED")
    assert world.deliver(0) == "ok"
    m = world.send(body("p2"), group="g1")  # a re-submission
    assert world.tick("A", [CrashAt("after_claim")]) == "crashed"
    claim = name_for(world, m)
    world.redrive(first)
    world.advance(WINDOW + 1)
    world.tick("B")  # reconciliation: the redriven run is listed; the claim holds its key
    assert "blocked_by" not in world.table()[f"EXEC#{claim}"], "a block landed on the marked claim"
    assert world.table()["PAYLOAD#p2"].get("redriven", {}).get("S") == first, "the key is marked"
    world.advance(VISIBILITY + 1)  # the claim's message comes back
    world.tick("A")
    world.check()
    assert runs_of(world, "p2") == [first], "p2 ran twice"
    assert world.holders(world.table()) == {first}, "the redriven run holds p2's slot"
    world.advance(WINDOW + 1)  # refused by the adopted run (RUNNING): looked at again a window later
    world.tick("A")
    world.check()
    assert world.queue_depth() == 0, "the re-submission was settled as a duplicate"
    world.settle()


def redriven_beside_a_second_run(make_world):
    """p0's first run failed; a re-submission started a second run; an operator redrove the first;
    reconciliation could not adopt it (the second holds p0's lease) and marked p0's lease."""
    world = make_world(max_concurrency=3)
    world.send(body("p0"), group="g0")
    world.tick("A")
    (first,) = world.model.running
    world.end(first, "FAILED")
    assert world.deliver(0) == "ok"
    world.send(body("p0"), group="g1")  # a re-submission: the second run
    world.tick("A")
    (second,) = world.model.running
    world.redrive(first)
    world.advance(WINDOW + 1)
    world.tick("B")  # reconciliation: the redriven run is listed; the second holds p0's lease
    assert world.table()["PAYLOAD#p0"].get("redriven", {}).get("S") == first, "p0's lease is marked"
    return world, first, second


def test_a_redriven_run_refused_adoption_keeps_its_key_when_the_holder_ends(make_world):
    """Found by the soak (seed 20261201): p0's first run failed; a re-submission started a second
    run; an operator redrove the first. Reconciliation could not adopt it (the second held p0's
    lease) and counted it external; the second ended and released the lease, and the next message of
    p0 claimed it and started a third run beside the redriven one. The refused adoption now marks
    p0's lease: the next claim adopts the redriven run instead, and the message is its duplicate."""
    world, first, second = redriven_beside_a_second_run(make_world)
    world.end(second, "SUCCEEDED")
    assert world.deliver(0) == "ok"
    world.send(body("p0"), group="g2")  # another re-submission, while the redriven run runs
    world.tick("A")
    world.check()
    assert runs_of(world, "p0") == [first, second], "p0 ran beside its redriven run"
    assert world.holders(world.table()) == {first}, "the redriven run took p0's slot and lease"
    world.advance(WINDOW + 1)  # refused by the adopted run (RUNNING): looked at again a window later
    world.tick("A")
    world.check()
    assert world.queue_depth() == 0, "the re-submission was settled as a duplicate"
    world.settle()


def test_a_marked_lease_is_lifted_once_the_redriven_run_has_ended(make_world):
    """The mark of a refused adoption never outlives the redriven run: once it has ended, the next
    message of its key claims and starts."""
    world, first, second = redriven_beside_a_second_run(make_world)
    world.end(second, "SUCCEEDED")
    assert world.deliver(0) == "ok"
    world.end(first, "SUCCEEDED")  # the redriven run ends before anyone adopted it
    world.send(body("p0"), group="g2")
    world.tick("A")
    world.check()
    assert len(runs_of(world, "p0")) == 3, "the mark outlived the redriven run: p0 is stuck"
    assert "redriven" not in world.table()["PAYLOAD#p0"]
    world.settle()


def test_records_of_a_running_execution_never_expire(make_world):
    """Issue 9 item 5. Failed before the fix: promise 2 (p0 started again while it runs): after the
    retention period TTL deletes the lease and the claim of the running p0; and its end then
    releases nothing."""
    world = make_world(max_concurrency=2, retention_days=1)
    world.send(body("old"), group="g9")
    world.tick("A")
    (old,) = world.model.running
    world.end(old)
    world.deliver(0)  # settled: its records may expire
    world.send(body("p0"), group="g0")
    world.tick("A")
    (p0,) = world.model.running
    for _ in range(4):  # 16 days: past the retention and the 15 days a name that ran is kept
        world.advance(4 * 86_400)
        world.tick("A")
    deleted = world.expire_ttl()
    assert deleted["EXEC"] >= 1, "the TTL process deleted the settled records"
    world.send(body("p0"), group="g1")  # a re-submission while p0 runs
    world.tick("A")
    world.check()
    assert runs_of(world, "p0") == [p0]
    world.end(p0)
    world.deliver(0)
    world.check()
    assert not world.holders(world.table()), "p0's end released its slot"
    world.settle()


@pytest.mark.parametrize("skew", [900.0, 3600.0, -3600.0])
def test_a_fresh_claim_survives_a_reconciler_with_a_skewed_clock(make_world, skew):
    """Issue 9 item 6. Failed before the fix: "<p0's name> started without holding a slot" and
    promise 1: the reconciler compares the claimer's expiry with its own clock and releases a
    claim made a moment ago. (With B's clock behind, B claims and A reconciles: B's expiry is
    already past by A's clock.)"""
    world = make_world(max_concurrency=1, skew=skew)
    claimer = "A" if skew > 0 else "B"
    world.send(body("p0"), group="g0")
    world.send(body("p1"), group="g1")
    # The other launcher's tick cuts in once the claim, marked starting, is written (nothing can stop its start).
    before = FAULTS["interleave:after_claim"]
    world.tick_interleaved(claimer, "after_claim", "tick")
    assert FAULTS["interleave:after_claim"] == before + 1
    world.check()
    assert len(world.model.starts) == 1
    world.settle()


def test_a_resubmission_after_the_end_and_before_the_release_runs(make_world):
    """Issue 9 item 7. Failed before the fix: "promise 3: a re-submission was suppressed as a
    duplicate of an execution that had already ended": the re-submission is dropped behind p0,
    whose event is still on its way."""
    world = make_world(max_concurrency=2)
    world.send(body("p0"), group="g0")
    world.tick("A")
    (p0,) = world.model.running
    world.end(p0)  # its status event is still pending
    again = world.send(body("p0"), group="g1")
    world.tick("A")
    world.check()
    world.deliver(0)  # the event arrives late
    world.check()
    assert again in world.model.started_by_message
    assert len(runs_of(world, "p0")) == 2
    world.settle()


def test_a_key_with_a_long_history_keeps_running(make_world):
    """Issue 9 item 11. Failed before the fix: the claim is refused (ValidationException: the item
    would pass DynamoDB's 400 KB) and every tick fails with a ConfigurationError: the history
    list grows without bound."""
    world = make_world(max_concurrency=2)
    key = "scene-04217"  # names of 44 characters: about 9,000 runs fill an item
    runs = world.seed_history(key, up_to=ITEM_LIMIT - 64)
    assert runs > 8_000
    m = world.send(body(key), group="g0")
    world.tick("A")
    world.check()
    assert m in world.model.started_by_message, "the next claim of the key works"
    assert item_size(world.table()[f"PAYLOAD#{key}"]) < ITEM_LIMIT // 4, "the record stays well under 400 KB"
    world.settle()


# -- executions changed behind Sluice's back: the primitives, on the paths that hold today ----------


def test_an_execution_stopped_by_hand_frees_its_slot(make_world):
    world = make_world(max_concurrency=1)
    world.send(body("p0"), group="g0")
    world.send(body("p1"), group="g1")
    world.tick("A")
    (p0,) = world.model.running
    world.stop_by_hand(p0)
    assert p0 not in world.running_in_step_functions()
    world.deliver(0)  # the ABORTED event: the completion releases and refills
    world.check()
    assert runs_of(world, "p1")
    assert world.table()["PAYLOAD#p0"]["state"]["S"] == "ABORTED"
    world.settle()


def test_an_execution_started_by_hand_with_a_sluice_like_name_counts_against_max(make_world):
    world = make_world(max_concurrency=2)
    outsider = world.start_by_hand("p0")
    assert outsider in world.running_in_step_functions()
    world.send(body("p0"), group="g0")
    world.send(body("p1"), group="g1")
    world.tick("A")  # reconciliation counts the outsider: one slot left
    world.check()
    assert len(world.model.starts) == 1
    world.settle()


# -- a process dying at each step the fixes added (and the other steps few ticks reach) -------------


def resumed(world: World, faults: list[Fault]) -> str:
    """A claim whose launcher died comes back with its message: the resume renews it and starts."""
    world.send(body("p0"), group="g0")
    assert world.tick("A", [CrashAt("after_claim")]) == "crashed"
    world.advance(VISIBILITY + 1)
    return world.tick("B", faults)


def sighted(world: World, faults: list[Fault]) -> str:
    """Reconciliation's first sighting of a claim that was never started."""
    world.send(body("p0"), group="g0")
    assert world.tick("A", [CrashAt("after_claim")]) == "crashed"
    world.advance(WINDOW + 1)
    return world.tick("B", faults)


def redriven(world: World, faults: list[Fault]) -> str:
    """An execution Sluice released is redriven: reconciliation adopts it."""
    world.send(body("p0"), group="g0")
    world.tick("A")
    (p0,) = world.model.running
    world.end(p0, "FAILED")
    world.deliver(0)
    world.redrive(p0)
    world.advance(WINDOW + 1)
    return world.tick("A", faults)


def parked(world: World, faults: list[Fault]) -> str:
    """A duplicate under the defer policy is parked in the table."""
    world.send(body("p0"), group="g0")
    world.tick("A")
    world.send(body("p0"), group="g1")
    return world.tick("A", faults)


def woken(world: World, faults: list[Fault]) -> str:
    """The parked duplicate's holder ends: the completion sends it back to the queue."""
    world.send(body("p0"), group="g0")
    world.tick("A")
    (p0,) = world.model.running
    world.send(body("p0"), group="g1")
    world.tick("A")
    world.end(p0)
    return world.deliver(0, faults)


def given_back(world: World, faults: list[Fault]) -> str:
    """A throttled claim ends the batch: the rest of it goes back to the queue."""
    world.send(body("p0"), group="g0")
    world.send(body("p1"), group="g1")
    return world.tick("A", [Throttle("claim"), *faults])


def handed_over(world: World, faults: list[Fault]) -> str:
    """A run ends with a payload waiting: the completion hands the freed slot to it in its release."""
    world.send(body("p0"), group="g0")
    world.tick("A")
    (p0,) = world.model.running
    world.send(body("p1"), group="g1")
    world.end(p0)
    return world.deliver(0, faults)


def confirmed(world: World, faults: list[Fault]) -> str:
    """A started claim missing from a stale listing: reconciliation asks DescribeExecution, which
    says it runs, and marks it RUNNING."""
    world.send(body("p0"), group="g0")
    world.tick("A")
    world.advance(WINDOW + 1)
    return world.tick("B", [StaleList("empty"), *faults])


REACHED_BY = {
    "after_mark": confirmed,
    "before_hand_over": handed_over,
    "after_hand_over": handed_over,
    "before_start_mark": resumed,
    "after_start_mark": resumed,
    "after_renew": resumed,
    "after_suspect": sighted,
    "after_adopt": redriven,
    "after_park": parked,
    "before_unpark": woken,
    "after_unpark": woken,
    "before_return": given_back,
    "after_return": given_back,
}


@pytest.mark.parametrize("point", sorted(SITUATIONAL_POINTS))
def test_dying_at_a_step_few_ticks_reach_loses_and_repeats_nothing(make_world, point):
    world = make_world(max_concurrency=2, duplicate_policy="defer")
    assert REACHED_BY[point](world, [CrashAt(point)]) == "crashed", f"never reached {point}"
    world.check()
    world.advance(VISIBILITY + 1)
    world.tick("B")
    world.check()
    world.settle()


def test_two_releases_of_one_end_at_once_enqueue_its_effects_once(make_world):
    """The same SUCCEEDED event reaches two functions at once (EventBridge delivers at least once).
    Both read the execution holding its lease; one sends the effect and commits its release while
    the other is about to send: the late send carries the same deduplication id within SQS's five
    minutes, so SQS drops it, and its release finds nothing to release."""
    world = make_world(max_concurrency=2)
    world.send(body("p0"), group="g0")
    world.tick("A")
    (n,) = world.model.running
    event = world.end(n, "SUCCEEDED", effects=[{"payload": {"id": "fx1"}}])

    def twin() -> None:
        assert world.run("A", world._complete(event)) == "ok"

    meanwhile = Interleave("before_effect", twin)
    assert world.deliver(0, [meanwhile]) == "ok"
    assert meanwhile.seen == 1, "the effect was never about to be sent"
    world.check()
    world.settle()
    assert len(runs_of(world, "fx1")) == 1


def test_an_effect_awaiting_a_key_that_ended_badly_is_dead_lettered_with_its_reason(make_world):
    """Found by the soak (an effect awaiting ``p1``, whose only run had been stopped by hand): the
    launcher dead-letters the effect's message, ``awaited p1 ended ABORTED``, and deletes it. The copy
    in the DLQ keeps the message's attributes, its ``sluice-origin-message-id`` too, and the suite
    took that send for an effect's message sent back to the queue: "re-sent to the queue, but it was
    never parked", then "deleted, but ... not dead-lettered", and at rest it looked the DLQ copy up
    under its SQS id rather than the effect's origin id."""
    world = make_world(max_concurrency=2)
    world.send(body("p1"), group="g1")
    world.tick("A")
    (p1,) = world.model.running
    world.end(p1, "ABORTED")
    assert world.deliver(0) == "ok"
    world.send(body("p0"), group="g0")
    world.tick("A")
    (p0,) = world.model.running
    world.end(p0, "SUCCEEDED", effects=[{"payload": {"id": "fx0"}, "awaits": ["p1"]}])
    assert world.deliver(0) == "ok"
    world.tick("A")
    world.check()
    (fx,) = [m for m, sent in world.model.sent.items() if sent.key == "fx0"]
    assert world.model.dead_lettered == {fx: "awaited p1 ended ABORTED"}
    assert fx in world.model.deleted
    assert runs_of(world, "fx0") == []
    world.settle()


# -- lanes (sluice.features.lanes, promise 7 of docs/protocol.md) ------------------------------------------------


def lane_runs(world: World, lane: str) -> list[str]:
    """The executions RUNNING in ``lane`` (by the lane of their claim)."""
    return sorted(n for n in world.model.running if world.model.lane_of.get(n) == lane)


def test_a_lane_never_passes_its_max_whatever_the_global_room(make_world):
    """gpu's MAX is 1 under a global MAX of 3: one gpu payload runs, the next waits in gpu's queue
    while the default lane fills the room left. A claim that takes no slot of its lane lets the
    second gpu payload in: promise 7."""
    world = make_world(max_concurrency=3, lanes="gpu:1:1,default:2")
    for i in range(3):
        world.send(body(f"g{i}"), group=f"g{i}", lane="gpu")
    world.send(body("d0"), group="d0")
    world.tick("A")
    world.check()
    world.tick("B")
    world.check()
    assert len(lane_runs(world, "gpu")) == 1 and len(lane_runs(world, "default")) == 1
    assert world.queue_depth("gpu") == 2
    world.settle()


def test_a_lane_slot_comes_back_when_its_run_ends(make_world):
    """A gpu run ends: its completion gives its lane's slot back with the global one, and fills it
    with the next gpu payload. A release that keeps the lane's slot leaks it (promise 7): gpu stays
    full with nothing running."""
    world = make_world(max_concurrency=3, lanes="gpu:1:1,default:2")
    for i in range(2):
        world.send(body(f"g{i}"), group=f"g{i}", lane="gpu")
    world.tick("A")
    (first,) = lane_runs(world, "gpu")
    world.end(first)
    assert world.deliver(0) == "ok"
    world.check()
    runs = lane_runs(world, "gpu")
    assert len(runs) == 1 and runs[0] != first, "the completion did not refill gpu with its next payload"
    world.settle()


def test_a_slot_freed_in_a_low_lane_goes_to_the_priority_lane(make_world):
    """Both global slots run default payloads when gpu (priority 1) gets work. A default run ends:
    its completion offers the slot it freed to gpu first, which has room and a message; default's
    own next message waits."""
    world = make_world(max_concurrency=2, lanes="gpu:2:1,default:3")
    for i in range(2):
        world.send(body(f"d{i}"), group=f"d{i}")
    world.tick("A")
    assert len(lane_runs(world, "default")) == 2
    world.send(body("d2"), group="d2")
    world.send(body("g0"), group="g0", lane="gpu")
    world.end(lane_runs(world, "default")[0])
    assert world.deliver(0) == "ok"
    world.check()
    newest = world.model.starts[-1].name
    assert world.model.lane_of[newest] == "gpu", f"the freed slot went to {world.model.lane_of[newest]!r}"
    world.settle()


def test_a_lane_max_lowered_between_the_receive_and_the_claim_is_obeyed(make_world):
    """The operator lowers gpu's MAX from 2 to 1 after the tick received a gpu payload and before
    its claim: the command moved gpu's caps, so the claim is refused and the message waits."""
    world = make_world(max_concurrency=3, lanes="gpu:2:1,default:2")
    world.send(body("g0"), group="g0", lane="gpu")
    world.tick("A")
    world.send(body("g1"), group="g1", lane="gpu")
    lowered = Interleave("after_receive", world.lower_lane_max_mid_tick)
    world.tick("A", [lowered])
    assert lowered.seen >= 1 and world.model.lane_limit("gpu") == 1
    world.check()
    assert len(lane_runs(world, "gpu")) == 1
    world.settle()


def test_a_lane_max_whose_command_died_is_put_in_force_by_the_next_tick(make_world):
    """The operator's `sluice set-max 1 --lane gpu` dies after writing the setting, before it moves
    gpu's caps (2). The next tick puts the setting in force before it admits: with both gpu runs
    ended, one gpu payload starts, not two. Once that tick has run the lowering binds: when one of
    gpu's runs ends, the next tick starts one more, never beside another. A tick that never moves a
    lane's limit once its pool exists starts two, then a third beside one: promise 7."""
    world = make_world(max_concurrency=4, lanes="gpu:2:1,default:2")
    for i in range(5):
        world.send(body(f"g{i}"), group=f"g{i}", lane="gpu")
    world.tick("A")
    assert len(lane_runs(world, "gpu")) == 2
    world.set_lane_max("gpu", 1, by="setting")
    for name in lane_runs(world, "gpu"):
        world.end(name)
        world.lose(0)  # no refill: reconciliation frees both slots
    world.advance(WINDOW + 1)
    world.tick("A")
    world.check()
    world.end(lane_runs(world, "gpu")[0])
    world.lose(0)
    world.advance(WINDOW + 1)
    world.tick("A")
    world.check()
    assert len(lane_runs(world, "gpu")) == 1, f"gpu runs {lane_runs(world, 'gpu')} under its MAX 1"
    world.settle()


def test_a_waiter_woken_from_the_table_goes_back_to_its_lanes_queue(make_world):
    """A gpu payload awaits a default one: parked in the table, then sent back when its awaited key
    SUCCEEDED, to gpu's queue (the queue says the lane), where it starts in gpu."""
    world = make_world(max_concurrency=3, lanes="gpu:1:1,default:2")
    world.send(body("a"), group="ga")
    waiter = world.send(body("w"), group="gw", lane="gpu", attributes={"sluice-awaits": json.dumps(["a"])})
    world.tick("A")
    world.check()
    (a,) = lane_runs(world, "default")
    world.end(a)
    assert world.deliver(0) == "ok"
    world.check()
    assert waiter in world.model.started_by_message, "the woken waiter did not start"
    assert lane_runs(world, "gpu") == sorted(world.model.started_by_message[waiter])
    world.settle()


def test_a_lane_whose_share_rounds_to_nothing_still_gets_the_free_slot(make_world):
    """Found by the property suite (lanes ``a:1:0:2,b:2:0:1``, the default lane implied, MAX 2: the
    default lane's queue never drained by ticks). One free slot, lanes ``a`` and ``default`` of one
    priority: the split gives it to ``a`` (declared first, largest remainder), whose queue is empty;
    the round started nothing and the tick stopped, so the default lane's payload never started on a
    tick, however long it waited: only a completion's refill would start it. Now a round that starts
    nothing offers the room to the lanes the split gave none."""
    world = make_world(max_concurrency=1, lanes="a:1")
    world.send(body("d0"), group="d0")
    world.tick("A")
    world.check()
    assert lane_runs(world, "default"), (
        "the default lane's payload waits while the tick's free slot goes unused"
    )
    world.settle()


def test_a_lane_lowered_below_its_runs_admits_again_once_they_end(make_world):
    """Found by the property suite (``fast:1:1,default:2``: at rest the fresh ``fast`` payload never
    started, its pool ``frozen`` with every cap 0 and no holder). gpu's MAX is lowered from 2 to 1 while
    2 gpu payloads run: its pool freezes (no holder evicted, nothing admitted). Both end and are
    released: one of gpu's two waiting payloads must start, by the completion's refill or, at the
    latest, by the next tick. Failed before the fix: nothing re-planned a frozen lane's caps unless its
    limit moved; now the tick and the refill thaw a frozen lane whose runs fit under its limit."""
    world = make_world(max_concurrency=4, lanes="gpu:2:1,default:2")
    for i in range(4):
        world.send(body(f"g{i}"), group=f"g{i}", lane="gpu")
    world.tick("A")
    assert len(lane_runs(world, "gpu")) == 2
    world.set_lane_max("gpu", 1)
    for name in lane_runs(world, "gpu"):
        world.end(name)
        assert world.deliver(0) == "ok"
    world.tick("A")
    world.check()
    assert len(lane_runs(world, "gpu")) == 1, "gpu admits nothing with no run left under its MAX 1"
    world.settle()


# -- fair lanes (sluice.features.fair) --------------------------------------------------------------------------


def tenants_running(world: World, lane: str) -> dict[str, int]:
    """The tenants of ``lane``'s RUNNING executions, with how many each."""
    out: dict[str, int] = {}
    for name in lane_runs(world, lane):
        tenant = world.model.ckey_of(name) or "?"
        out[tenant] = out.get(tenant, 0) + 1
    return out


def keyed(tenant: str) -> dict[str, str]:
    return {"sluice-concurrency-key": tenant}


def test_a_fair_lane_shares_its_slots_among_its_tenants(make_world):
    """shared is fair with MAX 4: heavy's 6 payloads are queued before light's 3. The tick gives
    each tenant 2, not 4 to the tenant whose messages came first; light's next payload waits in its
    line, not in the queue. When a light run ends, its slot goes to the tenant with the fewest runs
    (light, 1 against heavy's 2); once light's line is empty, the lane fills with heavy's. Every
    limit is checked by the model at every claim (a tenant has no default cap: only its lane's MAX)."""
    world = make_world(max_concurrency=4, lanes="shared:4:0:1:fair")
    for i in range(6):
        world.send(body(f"h{i}"), group=f"h{i}", lane="shared", attributes=keyed("heavy"))
    for i in range(3):
        world.send(body(f"l{i}"), group=f"l{i}", lane="shared", attributes=keyed("light"))
    world.tick("A")
    world.check()
    assert tenants_running(world, "shared") == {"heavy": 2, "light": 2}, "served in arrival order"
    assert world.queue_depth("shared") == 0, "a fair lane's messages wait in their tenants' lines"
    light = next(n for n in lane_runs(world, "shared") if world.model.ckey_of(n) == "light")
    world.end(light)
    assert world.deliver(0) == "ok"
    world.check()
    assert tenants_running(world, "shared") == {"heavy": 2, "light": 2}, "the freed slot left light"
    for name in [n for n in lane_runs(world, "shared") if world.model.ckey_of(n) == "light"]:
        world.end(name)
        assert world.deliver(0) == "ok"
    world.check()
    assert tenants_running(world, "shared") == {"heavy": 4}, "light's slots stayed empty"
    world.settle()


def test_an_implied_default_lane_follows_the_global_max_in_force(make_world):
    """Found by the soak with lanes (``a:1:0:2,b:2:0:1``, the default lane implied, MAX 1 raised to 2
    at rest: "promise 7 (lane MAX): … claimed a slot of lane 'default' while 1 of its runs held one
    or ran, under its limit 1"), a false alarm of the model: it held an implied lane ``default`` to
    the MAX deployed, where Sluice puts the global MAX in force in its caps at each tick
    (docs/protocol.md, Lanes). MAX raised from 1 to 2: two default payloads start in one tick. The
    operator's override of the lane, then ``set-max default --lane default``: the command writes the
    deployed MAX in the caps, and the next tick the global MAX again."""
    world = make_world(max_concurrency=1, lanes="a:1")
    world.set_max(2)
    for i in range(2):
        world.send(body(f"d{i}"), group=f"d{i}")
    world.tick("A")
    world.check()
    assert len(lane_runs(world, "default")) == 2
    for name in lane_runs(world, "default"):
        world.end(name)
        assert world.deliver(0) == "ok"
    world.set_lane_max("default", 1)
    world.set_lane_max("default", None)
    for i in range(2, 4):
        world.send(body(f"d{i}"), group=f"d{i}")
    world.tick("A")
    world.check()
    assert len(lane_runs(world, "default")) == 2, "the default lane follows the global MAX 2 again"
    world.settle()

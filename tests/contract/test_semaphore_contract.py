"""The semaphore contract, run against MemorySemaphoreStore and DynamoSemaphoreStore (moto), with
MemoryTokens playing Step Functions and a FakeClock. Shards of 2 permits, so that permits spread over
several slot items. What is asserted is what Step Functions and the table would show: tokens
answered (which, in which order), permits held, records and items left."""

from __future__ import annotations

import json

import pytest

from sluice.core.clock import FakeClock
from sluice.core.errors import TransientError
from sluice.semaphore.model import (
    UNKNOWN_ERROR,
    Delivery,
    Outcome,
    Released,
    State,
    execution_hash,
    holder_name,
)
from tests.contract.semaphore_fixtures import GRACE, CountingTokens, World, arn, open_harness
from tests.contract.slots_fixtures import in_threads
from tests.support.hooks import Crash, throttle
from tests.support.moto_patches import atomic_fast_moto

S = "db"
SECTION = "section"


@pytest.fixture(params=["memory", "dynamodb"])
def world(request):
    harness = open_harness(request)
    return World(harness, harness.store(), CountingTokens(), FakeClock())


def ask(world: World, name: str, *, sem: str = S, acquisition: str = SECTION, seed: int = 0):
    token = world.tokens.issue(arn(name))
    return world.semaphores(seed).acquire(sem, arn(name), acquisition, token), token


def release(world: World, name: str, *, sem: str = S, acquisition: str = SECTION, seed: int = 0):
    return world.semaphores(seed).release(sem, arn(name), acquisition)


def semaphore_keys(world: World) -> set[str]:
    return {k.split("#", 1)[0] for k in world.harness.keys(world.store)}


def test_a_free_permit_is_granted_at_once_through_the_line(world):
    world.semaphores().set_limit(S, 2)
    result, token = ask(world, "a")
    assert (result.outcome, result.ticket) == (Outcome.GRANTED, 1)
    (sent,) = world.tokens.sent
    assert (sent.token, sent.answer, sent.output) == (
        token,
        Delivery.DELIVERED,
        {"semaphore": S, "acquisitionId": SECTION},
    )
    assert world.holders(S) == {"a"} and world.running(S) == 1
    assert world.store.line(S) == (1, 1)
    assert semaphore_keys(world) == {"SEMA", "SEMQ", "SEMHELD"}  # the served ticket is gone


def test_an_unknown_semaphore_refuses_with_a_task_failure(world):
    result, token = ask(world, "a", sem="nope")
    assert result.outcome is Outcome.REFUSED
    (sent,) = world.tokens.sent
    assert (sent.token, sent.kind, sent.output["error"]) == (token, "failure", UNKNOWN_ERROR)
    assert world.harness.keys(world.store) == set()


def test_sixteen_concurrent_acquirers_never_exceed_the_limit(world):
    world.semaphores().set_limit(S, 3)
    sems = [world.semaphores(seed=i + 1) for i in range(16)]

    def run(i: int) -> Outcome:
        token = world.tokens.issue(arn(f"e{i}"))
        result = sems[i].acquire(S, arn(f"e{i}"), SECTION, token)
        assert world.tokens.wait(token, 60), f"e{i} was never woken"
        world.tokens.leave()
        assert sems[i].release(S, arn(f"e{i}"), SECTION) is Released.PERMIT
        return result.outcome

    outcomes = in_threads(16, run)
    assert 1 <= world.tokens.peak <= 3
    assert sorted(world.delivered()) == sorted(f"e{i}" for i in range(16))  # each once
    assert Outcome.WAITING in outcomes or outcomes.count(Outcome.GRANTED) == 16
    assert world.running(S) == 0 and world.store.line(S)[0] == world.store.line(S)[1]
    assert semaphore_keys(world) <= {"SEMA", "SEMQ", "SEMW"}  # released records; no index left


def test_waiters_are_granted_in_fifo_order(world):
    world.semaphores().set_limit(S, 1)
    names = ["a", "b", "c", "d", "e"]
    outcomes = [ask(world, n)[0].outcome for n in names]
    assert outcomes == [Outcome.GRANTED] + [Outcome.WAITING] * 4
    status = world.semaphores().status(S)
    assert [w.execution_arn for w in status.waiters] == [arn(n) for n in names[1:]]
    for n in names:
        assert world.holders(S) == {n}
        release(world, n)
    assert world.delivered() == names and world.running(S) == 0


def test_waiters_whose_token_timed_out_or_whose_execution_ended_are_skipped(world):
    world.semaphores().set_limit(S, 1)
    ask(world, "a")
    ask(world, "b")
    _, timed_out = ask(world, "c")
    ask(world, "d")
    ask(world, "e")
    world.tokens.time_out(timed_out)
    world.tokens.end(arn("d"), "FAILED")
    release(world, "a")
    assert world.holders(S) == {"b"}
    release(world, "b")
    assert world.delivered() == ["a", "b", "e"] and world.holders(S) == {"e"} and world.running(S) == 1
    for n in ("c", "d"):
        record = world.store.acquisition(S, holder_name(arn(n), SECTION))
        assert (record.state, record.reason) == (State.RELEASED, "token-gone")
        assert world.store.held_by(arn(n)) == []
    assert world.semaphores().status(S).waiters == ()


def test_a_waiter_released_before_its_turn_leaves_the_line(world):
    world.semaphores().set_limit(S, 1)
    ask(world, "a")
    ask(world, "b")
    assert release(world, "b") is Released.LINE
    release(world, "a")
    assert world.running(S) == 0 and world.delivered() == ["a"]
    assert ask(world, "c")[0].outcome is Outcome.GRANTED


def test_a_waiter_whose_release_stopped_after_its_mark_leaves_no_index_entry(world):
    """b waits; its execution ends and the release dies between its two steps: b's record is
    RELEASED, its index entry still there, and b holds no permit for a sweep to find. The hand-off
    that passes b's ticket takes the entry out (found by the soak)."""
    world.semaphores().set_limit(S, 1)
    ask(world, "a")
    ask(world, "b")
    record = world.store.acquisition(S, holder_name(arn("b"), SECTION))
    assert world.store.end(S, record.holder, record.gen, world.clock.now(), "released")  # then it died
    assert world.store.held_by(arn("b")) == [(S, SECTION)]
    release(world, "a")
    assert world.store.held_by(arn("b")) == [] and world.running(S) == 0
    assert ask(world, "c")[0].outcome is Outcome.GRANTED


def test_a_granted_holder_whose_release_stopped_after_its_mark_frees_its_permit_when_passed(world):
    """a is granted and its hand-off dies after SendTaskSuccess (its ticket still the head); a's
    execution ends and its release dies after the mark. The hand-off that passes a's ticket frees
    its permit and its index entry together, so b is granted at once. Dropping the entry alone would
    leave the permit to the sweep, and a's retried event would find nothing to free (found by a
    helper breaking the fix above)."""
    sems = world.semaphores()
    sems.set_limit(S, 1)

    def crash(token: str, answer: Delivery | None = None) -> None:
        raise Crash("after SendTaskSuccess")

    world.tokens.after_send = crash
    with pytest.raises(Crash):
        sems.acquire(S, arn("a"), SECTION, world.tokens.issue(arn("a")))
    world.tokens.after_send = None
    world.tokens.end(arn("a"), "FAILED")
    record = world.store.acquisition(S, holder_name(arn("a"), SECTION))
    assert world.store.end(S, record.holder, record.gen, world.clock.now(), "released")  # then it died
    assert world.running(S) == 1 and world.store.held_by(arn("a")) == [(S, SECTION)]
    sems.acquire(S, arn("b"), SECTION, world.tokens.issue(arn("b")))
    assert world.delivered()[-1:] == ["b"] and world.holders(S) == {"b"} and world.running(S) == 1
    assert world.store.held_by(arn("a")) == []
    sems.release_execution(arn("a"))  # EventBridge's retry of a's event: nothing of b's is freed
    assert world.holders(S) == {"b"} and world.running(S) == 1


def test_a_repeated_release_or_a_late_event_frees_nothing_of_another_holder(world):
    world.semaphores().set_limit(S, 1)
    _, token_a = ask(world, "a")
    ask(world, "b")
    assert release(world, "a") is Released.PERMIT
    assert world.holders(S) == {"b"}
    assert release(world, "a") is Released.NOTHING  # repeated
    assert world.semaphores().release_execution(arn("a")) == []  # its end, seen late
    assert release(world, "b", acquisition="other") is Released.NOTHING  # not b's acquisition
    assert release(world, "zz") is Released.NOTHING
    late = world.semaphores().acquire(S, arn("a"), SECTION, token_a)  # a retried invocation, late
    assert late.outcome is Outcome.RELEASED
    assert world.holders(S) == {"b"} and world.running(S) == 1


def test_one_execution_holds_two_semaphores_and_release_execution_frees_both(world):
    sems = world.semaphores()
    for name in ("db", "api", "files"):
        sems.set_limit(name, 1)
    assert ask(world, "x", sem="db")[0].outcome is Outcome.GRANTED
    assert ask(world, "x", sem="api")[0].outcome is Outcome.GRANTED
    assert ask(world, "y", sem="files")[0].outcome is Outcome.GRANTED
    assert ask(world, "x", sem="files")[0].outcome is Outcome.WAITING
    assert ask(world, "y", sem="db")[0].outcome is Outcome.WAITING
    world.tokens.end(arn("x"))
    freed = sems.release_execution(arn("x"))
    assert sorted(freed) == [
        ("api", SECTION, Released.PERMIT),
        ("db", SECTION, Released.PERMIT),
        ("files", SECTION, Released.LINE),
    ]
    assert world.holders("db") == {"y"} and world.running("api") == 0
    assert world.store.held_by(arn("x")) == []
    release(world, "y", sem="files")
    assert world.running("files") == 0  # x's place in line was skipped
    assert world.delivered() == ["x", "x", "y", "y"]
    assert f"SEMHELD#{execution_hash(arn('x'))}" not in world.harness.keys(world.store)


def test_acquire_is_idempotent_per_execution_and_acquisition_id(world):
    sems = world.semaphores()
    sems.set_limit(S, 1)
    _, token_a = ask(world, "a")
    again = sems.acquire(S, arn("a"), SECTION, token_a)  # a retried invocation
    assert again.outcome is Outcome.GRANTED and world.running(S) == 1
    _, old = ask(world, "b")
    assert sems.acquire(S, arn("b"), SECTION, old).outcome is Outcome.WAITING
    world.tokens.time_out(old)  # the Acquire task is retried: a new token for the same acquisition
    new = world.tokens.issue(arn("b"))
    assert sems.acquire(S, arn("b"), SECTION, new).outcome is Outcome.WAITING
    status = sems.status(S)
    assert [w.execution_arn for w in status.waiters] == [arn("b")] and status.line == 1
    assert ask(world, "a", acquisition="second")[0].outcome is Outcome.WAITING  # another acquisition
    release(world, "a")
    assert [s.token for s in world.tokens.sent if s.answer is Delivery.DELIVERED] == [token_a, new]
    assert world.holders(S) == {"b"} and world.running(S) == 1


def test_concurrent_hand_offs_never_grant_one_waiter_twice_or_skip_one(world):
    world.semaphores().set_limit(S, 4)
    holders = [f"h{i}" for i in range(4)]
    waiters = [f"w{i:02}" for i in range(12)]
    for n in holders + waiters:
        ask(world, n)
    assert world.delivered() == holders
    sems = [world.semaphores(seed=i + 1) for i in range(8)]
    rounds = [holders, waiters[:4], waiters[4:8], waiters[8:]]
    for done in rounds:

        def work(i: int, done: list[str] = done) -> None:
            if i < 4:
                sems[i].release(S, arn(done[i]), SECTION)
            else:
                for _ in range(3):
                    sems[i].hand_off(S)

        # moto is not thread-safe (a transaction copying a table while another thread writes it
        # raised "dictionary changed size during iteration" once): its requests one at a time,
        # the threads still interleaving between them.
        with atomic_fast_moto():
            in_threads(8, work)
        assert world.running(S) == (4 if done is not rounds[-1] else 0)
    assert world.delivered() == holders + waiters  # once each, in ticket order
    successes = [s.token for s in world.tokens.sent if s.kind == "success"]
    assert len(successes) == len(set(successes)) == 16


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_crash_around_send_task_success_then_a_retried_hand_off_grants_exactly_once(world, where):
    sems = world.semaphores()
    sems.set_limit(S, 1)
    ask(world, "a")
    _, token_b = ask(world, "b")
    crashed = []

    def crash(token: str, answer: Delivery | None = None) -> None:
        if token == token_b and not crashed:
            crashed.append(token)
            raise Crash(f"stopped {where} SendTaskSuccess")

    if where == "before":
        world.tokens.before_send = crash
    else:
        world.tokens.after_send = crash
    with pytest.raises(Crash):
        release(world, "a")
    record = world.store.acquisition(S, holder_name(arn("b"), SECTION))
    assert record.state is State.GRANTED and world.running(S) == 1  # the grant is recorded
    sems.hand_off(S)  # within the grace: the crashed hand-off might still be sending
    assert world.delivered() == (["a"] if where == "before" else ["a", "b"])
    world.clock.advance(GRACE + 1)
    sems.hand_off(S)
    assert world.delivered() == ["a", "b"]  # exactly once
    assert world.holders(S) == {"b"} and world.running(S) == 1  # kept, even when the resend was refused
    assert world.store.line(S) == (2, 2)
    release(world, "b")
    assert world.running(S) == 0 and world.store.held_by(arn("b")) == []


def test_a_new_token_brought_while_the_grant_is_being_sent_gets_the_permit(world):
    sems = world.semaphores()
    sems.set_limit(S, 1)
    ask(world, "a")
    _, old = ask(world, "b")
    new: list[str] = []

    def retried_acquire(token: str) -> None:
        if token == old and not new:  # the Acquire task timed out and was retried meanwhile
            world.tokens.time_out(old)
            new.append(world.tokens.issue(arn("b")))
            outcome = world.semaphores(seed=2).acquire(S, arn("b"), SECTION, new[0]).outcome
            assert outcome is Outcome.GRANTED  # the permit is b's, its delivery under way

    world.tokens.before_send = retried_acquire
    release(world, "a")
    assert [s.token for s in world.tokens.sent if s.answer is Delivery.DELIVERED][-1] == new[0]
    assert world.holders(S) == {"b"} and world.running(S) == 1


def test_an_execution_ending_while_its_grant_is_sent_frees_the_permit_for_the_next(world):
    sems = world.semaphores()
    sems.set_limit(S, 1)
    ask(world, "a")
    _, token_b = ask(world, "b")
    ask(world, "c")
    ended: list[str] = []

    def end_b(token: str) -> None:
        if token == token_b and not ended:
            ended.append(token)
            world.tokens.end(arn("b"), "ABORTED")
            world.semaphores(seed=3).release_execution(arn("b"))  # the completion handler

    world.tokens.before_send = end_b
    release(world, "a")
    assert world.delivered() == ["a", "c"] and world.holders(S) == {"c"} and world.running(S) == 1


def test_reconcile_frees_the_permits_of_ended_executions(world):
    sems = world.semaphores()
    sems.set_limit(S, 3)
    for n in ("a", "b", "c", "d"):
        ask(world, n)
    world.tokens.end(arn("a"), "ABORTED")  # its status-change event was lost
    b = world.store.acquisition(S, holder_name(arn("b"), SECTION))
    world.store.end(S, b.holder, b.gen, world.clock.now(), "released")  # a release that stopped halfway
    freed = sems.reconcile(S)
    assert sorted(h.execution_arn for h in freed) == [arn("a"), arn("b")]
    assert world.holders(S) == {"c", "d"} and world.delivered() == ["a", "b", "c", "d"]
    assert sems.reconcile(S) == []
    assert world.store.held_by(arn("a")) == [] and world.store.held_by(arn("b")) == []


def test_lowering_the_limit_never_evicts_a_holder(world):
    sems = world.semaphores()
    sems.set_limit(S, 3)
    for n in ("a", "b", "c"):
        ask(world, n)
    assert sems.set_limit(S, 1).frozen
    assert world.holders(S) == {"a", "b", "c"}
    assert ask(world, "d")[0].outcome is Outcome.WAITING
    release(world, "a")
    release(world, "b")
    assert world.holders(S) == {"c"}  # one runs: the limit, nobody admitted
    release(world, "c")
    assert world.holders(S) == {"d"}
    sems.set_limit(S, 2)
    assert ask(world, "e")[0].outcome is Outcome.GRANTED
    assert world.delivered() == ["a", "b", "c", "d", "e"]


def test_a_ticket_taken_by_an_acquirer_that_crashed_is_passed_over(world):
    sems = world.semaphores()
    sems.set_limit(S, 1)
    ask(world, "a")
    lost = world.store.take_ticket(S)  # an acquirer died between ADD tail and its ticket item
    result, _ = ask(world, "b")
    assert (result.outcome, result.ticket) == (Outcome.WAITING, lost + 1)
    release(world, "a")
    assert world.delivered() == ["a", "b"]
    assert world.store.ticket(S, lost).holder is None  # the tombstone stays
    assert world.store.line(S) == (lost + 1, lost + 1)


def test_status_lists_the_limit_holders_and_waiters_in_order(world):
    sems = world.semaphores()
    sems.set_limit(S, 2)
    for i, n in enumerate(("a", "b", "c", "d")):
        world.clock.t = 1_800_000_000.0 + i
        ask(world, n)
    status = sems.status(S)
    assert (status.name, status.limit, status.frozen, status.line) == (S, 2, False, 2)
    assert [(h.execution_arn, h.acquisition_id, h.since) for h in status.holders] == [
        (arn("a"), SECTION, 1_800_000_000.0),
        (arn("b"), SECTION, 1_800_000_001.0),
    ]
    assert [(w.ticket, w.execution_arn, w.enqueued_at) for w in status.waiters] == [
        (3, arn("c"), 1_800_000_002.0),
        (4, arn("d"), 1_800_000_003.0),
    ]


def test_a_throttled_table_is_a_transient_error(world):
    if world.harness.kind == "memory":
        pytest.skip("DynamoDB only")
    world.semaphores().set_limit(S, 1)
    throttle(world.harness.client, "UpdateItem", times=1)
    with pytest.raises(TransientError):
        ask(world, "a")
    assert ask(world, "a")[0].outcome is Outcome.GRANTED  # asked again: one permit
    assert world.running(S) == 1


def test_a_crash_between_the_grant_record_and_the_claim_then_a_retry_grants_once(world):
    if world.harness.kind == "memory":
        pytest.skip("DynamoDB only: the crash is raised from the claim's UpdateItem")
    sems = world.semaphores()
    sems.set_limit(S, 1)
    ask(world, "a")
    ask(world, "b")
    crashed: list[bool] = []

    def crash_before_claim(params: dict, **_: object) -> None:
        claim = json.loads(params["body"]).get("UpdateExpression", "").startswith("SET holders.")
        if claim and not crashed:
            crashed.append(True)
            raise Crash("stopped before the permit's claim")

    world.harness.client.meta.events.register("before-call.dynamodb.UpdateItem", crash_before_claim)
    with pytest.raises(Crash):
        release(world, "a")
    record = world.store.acquisition(S, holder_name(arn("b"), SECTION))
    assert record.state is State.GRANTED and world.running(S) == 0  # granted on record, nothing claimed
    sems.hand_off(S)
    assert world.delivered() == ["a"]  # within the grace
    world.clock.advance(GRACE + 1)
    sems.hand_off(S)
    assert world.delivered() == ["a", "b"] and world.holders(S) == {"b"} and world.running(S) == 1


def test_an_acquirer_between_its_ticket_and_its_record_keeps_its_place_while_no_permit_is_free(world):
    """A hand-off that finds the next ticket taken but not yet written passes over it only when it
    has a permit to give: with none free it stops, and the acquirer keeps its place in line."""
    world.semaphores().set_limit(S, 1)
    ask(world, "a")  # holds the permit
    number = world.store.take_ticket(S)  # "b" is between taking its ticket and writing it
    result, _ = ask(world, "c")  # c's acquire runs a hand-off: the head is b's missing ticket
    assert result.outcome is Outcome.WAITING and result.ticket == number + 1
    assert world.store.line(S) == (1, number + 1)  # nothing passed over
    assert world.store.ticket(S, number) is None  # no tombstone: b's place is still b's
    # If b died there, the hand-off of the next free permit passes over it, and c comes in.
    release(world, "a")
    assert world.holders(S) == {"c"}

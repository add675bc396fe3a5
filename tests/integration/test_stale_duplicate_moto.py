"""The duplicate check under a stale DescribeExecution (issue 25, section 2; docs/protocol.md,
"Staleness"). A message whose claim a live lease refuses asks Step Functions about the holder; an
answer may be up to the bound (60 s) stale, so a holder that ended just before the message was sent
may still read RUNNING. Under the suppressing policy a message is dropped only on an answer that is
known to be no older than the message: the first RUNNING answer sends it back to the queue for the
consistency window, and the message is dropped only if the holder still reads RUNNING when it is
seen again. The stale answer is a botocore hook on the deciding container's client; each test
asserts it fired."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from moto.core import DEFAULT_ACCOUNT_ID

from sluice.adapters.dynamo.store import DynamoStore, create_table
from sluice.adapters.memory.store import MemoryStore
from sluice.core.clock import FakeClock
from sluice.core.model import Outcome, PayloadState
from tests.integration import test_breaker_findings as findings
from tests.integration.test_stale_describe_moto import RUNNING, body, runs_of, sfn_of, stale_describe
from tests.reliability.world import WINDOW, World
from tests.support.aws import WORKFLOW, build_stack
from tests.support.hooks import receipts_of


def admit(world: World, name: str = "A") -> dict[str, int]:
    """One admission pass of container ``name`` without reconciliation (a completion's refill, or a
    tick whose reconciliation has not judged the holder yet): only the duplicate check settles."""
    seen: dict[str, int] = {}

    def work(c: Any) -> None:
        seen.update(c.launcher.admit().outcomes)

    assert world.run(name, work) == "ok"
    return seen


def ended_holder(world: World) -> str:
    """p's run, ended a moment ago; its status event is on the way (pending, not delivered)."""
    world.send(body("p"), group="g0")
    world.tick("A")
    (p,) = world.model.running
    world.end(p)
    return p


def test_a_resubmission_sent_after_its_keys_run_ended_runs(make_world):
    """p's run ended; a re-submission of p is sent after that end, and its claim is refused by p's
    lease (the event not yet delivered). DescribeExecution still says RUNNING (stale, within the
    bound). Failed before the fix: promise 3: the re-submission was suppressed as a duplicate of a
    run that had ended before it was sent, and never ran. Now it goes back to the queue for the
    consistency window; seen again, the answer is fresh: p ended, its lease is settled, and the
    re-submission runs."""
    world = make_world(max_concurrency=2)
    p = ended_holder(world)
    world.send(body("p"), group="g1")
    with stale_describe(sfn_of(world, "A"), p, RUNNING) as fired:
        outcomes = admit(world)
    assert fired[RUNNING] == 1
    world.check()
    assert outcomes.get(Outcome.DUPLICATE.value, 0) == 0
    assert outcomes.get(Outcome.RECHECK.value) == 1
    assert world.queue_depth() == 1, "the re-submission is kept in the queue"
    world.advance(WINDOW + 1)
    outcomes = admit(world)
    world.check()
    assert outcomes.get(Outcome.STARTED.value) == 1, outcomes
    assert len(runs_of(world, "p")) == 2 and world.queue_depth() == 0
    assert world.table()["PAYLOAD#p"].get("duplicates") is None
    world.settle()


def test_a_resubmission_is_not_seen_again_before_the_window(make_world):
    """The re-submission sent back after a stale RUNNING answer stays out of the queue for the
    consistency window: a pass within it does not receive it, so it is not judged on an answer
    as stale as the first."""
    world = make_world(max_concurrency=2)
    p = ended_holder(world)
    world.send(body("p"), group="g1")
    with stale_describe(sfn_of(world, "A"), p, RUNNING) as fired:
        admit(world)
        world.advance(WINDOW - 1)
        outcomes = admit(world, "B")
    world.check()
    assert fired[RUNNING] == 1
    assert not outcomes.get(Outcome.DUPLICATE.value) and not outcomes.get(Outcome.STARTED.value)
    world.advance(2)
    admit(world, "B")
    world.check()
    assert len(runs_of(world, "p")) == 2
    world.settle()


def test_a_message_sent_while_its_key_runs_is_still_suppressed(make_world):
    """A true duplicate: sent while p runs. The first RUNNING answer sends it back for the window;
    seen again, p still runs: it is suppressed and counted, and nothing new starts."""
    world = make_world(max_concurrency=2)
    world.send(body("p"), group="g0")
    world.tick("A")
    (p,) = world.model.running
    world.send(body("p"), group="g1")
    first = admit(world)
    assert first.get(Outcome.RECHECK.value) == 1
    world.advance(WINDOW + 1)
    second = admit(world, "B")
    world.check()
    assert second.get(Outcome.DUPLICATE.value) == 1, second
    assert runs_of(world, "p") == [p] and world.queue_depth() == 0
    assert world.table()["PAYLOAD#p"]["duplicates"]["N"] == "1"
    world.settle()


def test_the_group_behind_a_rechecked_message_waits_in_order(make_world):
    """Messages of one group start in order: the message sent back for the window holds its
    group's later messages back with it, and they start after it."""
    world = make_world(max_concurrency=3)
    p = ended_holder(world)
    world.send(body("p"), group="g1")
    world.send(body("q"), group="g1")
    with stale_describe(sfn_of(world, "A"), p, RUNNING) as fired:
        outcomes = admit(world)
    assert fired[RUNNING] == 1
    assert runs_of(world, "q") == [], "q started before the message ahead of it in its group"
    assert outcomes.get(Outcome.RECHECK.value) == 1 and not outcomes.get(Outcome.STARTED.value)
    world.check()
    world.advance(WINDOW + 1)
    admit(world)
    world.check()
    starts = [s.key for s in world.model.starts]
    assert starts[-2:] == ["p", "q"], starts
    world.settle()


def test_a_deferred_duplicate_of_a_just_ended_run_is_parked_and_runs(make_world):
    """Under the deferring policy a stale RUNNING answer parks the message behind the holder at
    once (no second look): the holder's release, from its event, wakes it, and it runs."""
    world = make_world(max_concurrency=2, duplicate_policy="defer")
    p = ended_holder(world)
    world.send(body("p"), group="g1")
    with stale_describe(sfn_of(world, "A"), p, RUNNING) as fired:
        outcomes = admit(world)
    assert fired[RUNNING] == 1
    assert outcomes.get(Outcome.DEFERRED.value) == 1, outcomes
    world.check()
    assert world.deliver(0) == "ok"
    world.check()
    admit(world)
    world.check()
    assert len(runs_of(world, "p")) == 2
    world.settle()


@pytest.mark.parametrize("kind", ["memory", "dynamodb"])
def test_a_sighting_is_first_once_per_message(kind, session):
    """The store's side (both adapters): the first sighting of a message is first once, and again
    for a retried write of the same receive; another receive of it is not; another message of the
    same key has its own."""
    if kind == "memory":
        store: Any = MemoryStore()
    else:
        client = session.client("dynamodb")
        create_table(client, "sightings")
        store = DynamoStore(client, "sightings")
    assert store.first_sighting(key="k", message_id="m1", receipt="r1", now=1.0)
    assert store.first_sighting(key="k", message_id="m1", receipt="r1", now=1.5), "a retry of that write"
    assert not store.first_sighting(key="k", message_id="m1", receipt="r2", now=70.0)
    assert store.first_sighting(key="k", message_id="m2", receipt="r3", now=70.0)
    if kind == "dynamodb":
        item = client.get_item(TableName="sightings", Key={"pk": {"S": "SIGHT#m1"}})["Item"]
        assert item["key"]["S"] == "k" and float(item["sighted_at"]["N"]) == 1.0 and "expires_at" in item


def test_a_resubmission_behind_an_adoption_taken_on_a_stale_answer_runs(session):
    """p FAILED and was released; a reconciliation got stale answers (listed and described RUNNING)
    and adopted it. A window later a re-submission of p is refused by p's lease, and
    DescribeExecution answers with the end p's record had before the adoption: past the young
    adoption (two windows, as another clock stamped it) that answer is fresh (the adoption took a
    stale one), so p is released on it and the re-submission runs, with no reconciliation in
    between."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=2, clock=clock)
    stack.send({"id": "p"}, group="a")
    stack.launcher().tick()
    (p,) = stack.running()
    assert findings.deliver(stack, stack.finish(p, "FAILED", error="Boom"))
    rt = stack.runtime()
    stale = findings.stale_once(rt.client("stepfunctions"), p)
    rt.launcher().tick()
    assert stale == Counter(listed=1, described=1)
    store = stack.runtime().store()
    assert store.ledger().holders == {p}  # adopted on the stale answer
    clock.advance(2 * WINDOW + 1)
    stack.send({"id": "p", "n": 2}, group="b")
    summary = stack.runtime().launcher().admit()  # the duplicate check alone settles p
    assert summary.n(Outcome.STARTED) == 1, summary.outcomes
    (again,) = stack.running()
    assert again != p and store.ledger().holders == {again}


def test_a_resubmission_behind_a_holder_on_a_deleted_machine_runs(session):
    """p runs on M1 and is marked RUNNING after the stack switched to M2; p SUCCEEDED, its event
    lost, and the operator deleted M1. A re-submission of p is refused by p's lease, and
    DescribeExecution says p does not exist (its machine is gone): no answer says it runs, so the
    second look does not drop the message either. Failed before the fix: promise 3: seen again, it
    was suppressed as a duplicate of a run that had ended before it was sent. Now it waits in the
    queue until reconciliation releases p (a vanished holder), then runs."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=2, clock=clock)
    stack.send({"id": "p"}, group="a")
    stack.launcher().tick()
    (p,) = stack.running()
    m1 = stack.settings.state_machine_arn
    m2 = stack.client("stepfunctions").create_state_machine(
        name="sluice-test-workflow-v2",
        definition=json.dumps(WORKFLOW),
        roleArn=f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:role/sluice-test-sfn",
    )["stateMachineArn"]
    stack.settings = replace(stack.settings, state_machine_arn=m2)
    clock.advance(WINDOW + 1)
    stack.launcher().tick()  # p asked by its ARN on M1: RUNNING, marked so
    store = stack.runtime().store()
    assert store.execution(p).state is PayloadState.RUNNING
    stack.finish(p, "SUCCEEDED")  # its event is lost
    stack.client("stepfunctions").delete_state_machine(stateMachineArn=m1)
    stack.send({"id": "p", "n": 2}, group="b")
    rt = stack.runtime()
    receipts = receipts_of(rt.client("sqs"))
    for _ in range(2):  # the first look and the second: the duplicate check alone, no reconciliation
        summary = rt.launcher().admit()
        assert summary.n(Outcome.DUPLICATE) == 0, "the re-submission was dropped behind a run that ended"
        assert summary.n(Outcome.RECHECK) == 1
        stack.visible_again(receipts[-1:])
    stack.launcher().tick()  # reconciliation releases p; the re-submission then claims
    started = [e["name"] for e in stack.executions()]
    assert len(started) == 1 and started[0] != p, started
    assert store.payload("p").holder == started[0]

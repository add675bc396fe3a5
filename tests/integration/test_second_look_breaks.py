"""Attacks on the duplicate check's second look (``MessageBranches._duplicate``,
``_first_sighting``; the launcher's ``Outcome.RECHECK``): a message refused by a holder that reads
RUNNING goes back to the queue for the consistency window, with its FIFO group's later messages
(sighted on that receive), and is dropped only when refused again. Each test runs the real launcher on moto."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from sluice.core.clock import FakeClock
from sluice.core.model import Outcome
from sluice.runtime import CLIENT_CONFIG
from tests.integration.test_stale_describe_moto import RUNNING, body, runs_of, sfn_of, stale_describe
from tests.reliability.world import WINDOW, World
from tests.support.aws import build_stack
from tests.support.faults import AttemptFaults
from tests.support.hooks import receipts_of, retry_sleeps


def _visible_again(stack: Any, receipts: list[str]) -> None:
    """What the visibility timeout does by the fake clock: messages in flight visible again."""
    sqs = stack.client("sqs")
    for receipt in receipts:
        with contextlib.suppress(sqs.exceptions.ClientError):  # deleted already
            sqs.change_message_visibility(
                QueueUrl=stack.settings.queue_url, ReceiptHandle=receipt, VisibilityTimeout=0
            )
    receipts.clear()


def _started_keys(stack: Any) -> list[str]:
    return [json.loads(i)["id"] if isinstance(i, str) else i["id"] for i in stack.inputs()]


def test_duplicates_ahead_in_a_group_cost_a_fresh_message_one_receive(session):
    """k runs (for real, fresh answers: no staleness needed). Its producer re-submits k five times
    in group g, then sends j (a key nobody runs) in g. The first re-submission is a first sighting:
    back for the window, and g's later messages go back with it, sighted on that receive. On their
    next receive, at least the window later, the other four are second looks: suppressed at once,
    and j starts. Failed before the fix: each re-submission was a first sighting in turn, each
    returning j, which SQS's redrive moved to the DLQ before its turn, without a reason (promise 3,
    as deployed with maxReceiveCount 10 and ten duplicates ahead)."""
    clock = FakeClock()
    # As deployed the queue's maxReceiveCount is 10 (docs/reliability.md); 5 here, as build_stack's.
    stack = build_stack(session, max_concurrency=20, max_receive_count=5, clock=clock)
    launcher = stack.launcher()
    receipts = receipts_of(launcher.queue.client)
    bodies: list[str] = []
    launcher.queue.client.meta.events.register(
        "after-call.sqs.ReceiveMessage",
        lambda parsed, **_: bodies.extend(m["Body"] for m in parsed.get("Messages", [])),
    )
    stack.send({"id": "k"}, group="g0")
    assert launcher.tick().n(Outcome.STARTED) == 1  # k runs, and keeps running
    for _ in range(5):
        stack.send({"id": "k"}, group="g")  # re-submissions of k while it runs: duplicates
    stack.send({"id": "j"}, group="g")  # j: no run of its key anywhere; it must start
    seen: dict[str, int] = {}
    for _ in range(10):
        summary = launcher.tick()
        for outcome, n in summary.outcomes.items():
            seen[outcome] = seen.get(outcome, 0) + n
        clock.advance(stack.settings.consistency_window_seconds)
        _visible_again(stack, receipts)
    dlq = stack.drain(stack.settings.dlq_url)
    by_sqs = [m["Body"] for m in dlq if "sluice-error" not in m.get("MessageAttributes", {})]
    assert seen.get(Outcome.RECHECK.value, 0) >= 1  # the second look happened
    assert "j" in _started_keys(stack), (
        f"promise 3: j never started; moved to the DLQ by SQS, no reason: {by_sqs}; outcomes {seen}"
    )
    assert seen.get(Outcome.DUPLICATE.value, 0) == 5 and seen.get(Outcome.RECHECK.value) == 1, seen
    assert sum(json.loads(b)["id"] == "j" for b in bodies) == 2  # the recheck ahead's, and its own


# -- a lost answer to the sighting's write ---------------------------------------------------------


class LostSighting(AttemptFaults):
    """The first ``SIGHT#`` write of the invocation reaches DynamoDB, which carries it out, and its
    answer is lost (``plan`` per attempt, as ``AttemptFaults``)."""

    def before(self, injector: Any, call: Any) -> None:
        pk = call.params.get("Key", {}).get("pk", {}).get("S", "")
        if self.call is None and call.operation == "UpdateItem" and pk.startswith("SIGHT#"):
            self.call = call


def _admit(world: World, name: str, faults: list[Any] | None = None) -> dict[str, int]:
    """One admission pass of container ``name``, without reconciliation (a completion's refill)."""
    seen: dict[str, int] = {}

    def work(c: Any) -> None:
        seen.update(c.launcher.admit().outcomes)

    world.run(name, work, faults or [])
    return seen


def _ended_holder(world: World) -> str:
    """p's run, ended a moment ago; its status event is on the way (pending, not delivered)."""
    world.send(body("p"), group="g0")
    world.tick("A")
    (p,) = world.model.running
    world.end(p)
    return p


def test_a_lost_answer_to_the_sighting_returns_the_message_within_the_window(make_world):
    """p ended; its event is on the way. A re-submission m of p is sent after that end. Its claim is
    refused by p's lease and DescribeExecution says RUNNING (stale, within the bound). SIGHT#m is
    written, and the answer is lost (a read timeout: TransientError): ``_run_group`` returns the rest
    of the group with no delay. Failed before the fix: m came back with them, was received again a
    second later, refused on as stale an answer with SIGHT#m there, and dropped as a duplicate of a
    run that had ended before it was sent (promise 3). Now a failed sighting counts as a first
    one: m goes back for the window and is not received within it; after it, it runs."""
    world = make_world(max_concurrency=2)
    p = _ended_holder(world)
    world.send(body("p"), group="g1")
    lost = LostSighting("UpdateItem", ("lost",))
    with stale_describe(sfn_of(world, "A"), p, RUNNING) as fired:
        first = _admit(world, "A", [lost])
        world.advance(1)
        second = _admit(world, "A")
    assert lost.fired == {"lost": 1} and fired[RUNNING] == 1, (lost.fired, fired)
    assert "SIGHT#" in " ".join(world.table())  # the write landed
    world.check()
    assert first.get(Outcome.RECHECK.value) == 1, first
    assert not second.get(Outcome.DUPLICATE.value) and not second.get(Outcome.STARTED.value), second
    world.advance(WINDOW)
    _admit(world, "A")
    world.check()
    assert len(runs_of(world, "p")) == 2, "the re-submission ran after the window"
    world.settle()


def test_a_retried_sighting_write_drops_the_message_at_first_sight(make_world):
    """As deployed, clients retry (``sluice.runtime.CLIENT_CONFIG``). The first attempt of SIGHT#m's
    conditional write lands and its answer is lost; botocore retries, and the retry's condition
    (``attribute_not_exists(pk)``) fails on the item the first attempt wrote: ``first_sighting``
    says False, so m, a re-submission sent after p ended, refused on a stale RUNNING answer at its
    very first receive, is dropped as a duplicate with no second look. Promise 3."""
    world = make_world(max_concurrency=2)
    world.add_container("A-retrying", CLIENT_CONFIG)
    p = _ended_holder(world)
    world.send(body("p"), group="g1")
    lost = LostSighting("UpdateItem", ("lost",))
    with retry_sleeps(), stale_describe(sfn_of(world, "A-retrying"), p, RUNNING) as fired:
        outcomes = _admit(world, "A-retrying", [lost])
    assert lost.fired == {"lost": 1} and fired[RUNNING] == 1, (lost.fired, fired)
    print(outcomes)
    world.check()
    assert not outcomes.get(Outcome.DUPLICATE.value), outcomes
    world.settle()


def test_only_the_rechecked_message_s_own_group_is_sighted_behind_it(session):
    """A fair lane runs one tenant's messages of a batch one after another, across FIFO groups. A
    message of another group is not held behind the one sent back for the window: received again
    at once, a sighting made now would let its next refusal, on an answer as stale as the first,
    drop it. Only the messages of the rechecked message's own group are sighted."""
    stack = build_stack(session, clock=FakeClock())
    for group, key in (("g", "a"), ("g", "b"), ("h", "c"), ("g", "not json")):
        stack.send({"id": key} if key != "not json" else key, group=group)
    launcher = stack.launcher()
    messages = launcher.queue.receive(10, 0)
    assert len(messages) == 4
    first = next(m for m in messages if m.group_id == "g")
    launcher.admission.steps.branches.sight_behind(first, [m for m in messages if m is not first])
    table = stack.client("dynamodb")
    sighted = {
        m.group_id + ":" + m.body
        for m in messages
        if "Item"
        in table.get_item(TableName=stack.settings.table_name, Key={"pk": {"S": f"SIGHT#{m.message_id}"}})
    }
    assert sighted == {'g:{"id": "b"}'}, sighted  # not h's; not the unusable body, dead-lettered on its turn

"""Attacks on ``earlier_end``'s rule that a SUCCEEDED answer is never an end from before a redrive
(``sluice.launch.completion.earlier_end``, as ``MessageBranches._holder_ended`` reads it).

The adoption under attack is made by launcher B, whose clock runs an hour ahead, on a stale view:
its ListExecutions answers with the page it got last time (``StaleList("previous")``) and its
DescribeExecution answers with the RUNNING answer from before the run ended (a botocore
``before-call`` hook on B's Step Functions client). moto reports no ``redriveCount``, so that answer
does not say "not redriven" and B adopts the ended run. Every scenario runs the real handlers in the
reliability world, and the model checks the promises as they could break."""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.reliability.world import WINDOW, World
from tests.support.faults import StaleList
from tests.support.hooks import _Http

HOUR = 3600.0
ONCE = {"sluice-once": "true"}
EFFECT = [{"payload": {"id": "fx"}, "group": "gfx"}]


def body(key: str) -> str:
    return json.dumps({"id": key})


def runs_of(world: World, key: str) -> list[str]:
    return [s.name for s in world.model.starts if s.key == key]


def s(item: dict[str, Any], attribute: str) -> str | None:
    return item.get(attribute, {}).get("S")


def arn_of(world: World, name: str) -> str:
    machine = world.settings.state_machine_arn
    return machine.replace(":stateMachine:", ":execution:") + ":" + name


@contextmanager
def stale_describe(client: Any, name: str, answer: dict[str, Any]) -> Iterator[Counter]:
    """DescribeExecution(``name``) on ``client`` answers ``answer`` (an older view), nothing asked
    of moto. Yields how often it fired."""
    fired: Counter = Counter()

    def hook(model: Any, params: dict[str, Any], **_: Any) -> Any:
        if model.name != "DescribeExecution":
            return None
        raw = params.get("body") or b"{}"
        asked = json.loads(raw.decode() if isinstance(raw, bytes) else raw).get("executionArn", "")
        if not asked.endswith(":" + name):
            return None
        fired[name] += 1
        parsed = copy.deepcopy(answer)
        parsed["ResponseMetadata"] = {"HTTPStatusCode": 200, "HTTPHeaders": {}}
        return _Http(200), parsed

    client.meta.events.register_first("before-call", hook, unique_id="stale-describe-success-attacks")
    try:
        yield fired
    finally:
        client.meta.events.unregister("before-call", unique_id="stale-describe-success-attacks")


class StaleRunningList(StaleList):
    """``StaleList`` on the listing of RUNNING executions only: the tick's second ListExecutions
    (redriven runs, ``redriveFilter``) neither is rewritten nor replaces the page kept."""

    def after(self, injector: Any, call: Any, status: int, parsed: dict[str, Any]) -> None:
        if call.params.get("statusFilter") != "RUNNING":
            return
        self.listed = [e["name"] for e in injector.last_listing or []]
        super().after(injector, call, status, parsed)


def sfn_of(world: World, container: str) -> Any:
    return world.containers[container].runtime.client("stepfunctions")


def adopted_on_a_stale_view(
    world: World, status: str, *, attributes: dict[str, str] | None = None, effects: Any = None
) -> str:
    """k's run e ends ``status`` and is released by its event; then B (an hour ahead) adopts it on
    a stale listing and a stale RUNNING answer. Returns e."""
    world.send(body("k"), group="g-k-0", attributes=attributes)
    assert world.tick("A") == "ok"
    (e,) = runs_of(world, "k")
    running = {
        k: v
        for k, v in world.sfn.describe_execution(executionArn=arn_of(world, e)).items()
        if k != "ResponseMetadata"
    }
    assert running["status"] == "RUNNING"
    assert world.tick("B", [StaleRunningList("previous")]) == "ok"  # B keeps the page: e RUNNING
    event = world.end(e, status, effects=effects)
    assert world.deliver(world.pending.index(event)) == "ok"
    assert s(world.table()[f"EXEC#{e}"], "state") == status
    world.advance(WINDOW + 1)
    stale = StaleRunningList("previous")
    with stale_describe(sfn_of(world, "B"), e, running) as fired:
        assert world.tick("B", [stale]) == "ok"
    assert e in stale.listed, "the stale listing never fired"
    assert fired[e] >= 1, "the stale answer never fired"
    items = world.table()
    assert s(items[f"EXEC#{e}"], "state") == "RUNNING", "B did not adopt the ended run"
    assert float(items[f"EXEC#{e}"]["adopted_at"]["N"]) > world.clock.now() + HOUR / 2, "adopted by B's clock"
    assert s(items["PAYLOAD#k"], "holder") == e
    assert e in world.holders(items)
    world.check()
    return e


# -- 1. the residual case: a FAILED run adopted by a clock ahead ------------------------------------


def test_a_failed_run_adopted_by_a_clock_ahead_parks_a_resubmission(make_world):
    """e FAILED at s1, released; B (+1 h) adopts it on a stale listing and answer (earlier_end_at
    s1, adopted_at an hour in A's future). m of k, sent after s1: A's claim is refused by e;
    DescribeExecution(e): FAILED at s1, the earlier end, adoption "young". Found breaking: first
    look, back for the window; second look, suppressed: m lost. Now an ended answer is never proof
    that the holder runs: m is parked behind e (out of the queue), and woken when A's reconciliation
    finds the adoption old by its own clock and releases e; m then runs."""
    world = make_world(max_concurrency=2, skew=HOUR)
    e = adopted_on_a_stale_view(world, "FAILED")
    m = world.send(body("k"), group="g-k-1")
    assert world.tick("A") == "ok"
    world.check()
    assert runs_of(world, "k") == [e], "m ran at its first look"
    assert m in world.model.parked, "m waits parked behind e"
    world.advance(HOUR + 2 * WINDOW + 1)  # past the young adoption (two windows) by A's clock
    for _ in range(3):
        assert world.tick("A") == "ok"
        world.check()
    assert m not in world.model.duplicates
    assert len(runs_of(world, "k")) == 2


# -- 2. the fixed case: a SUCCEEDED run (RedriveExecution refuses it) adopted by a clock ahead -------


@pytest.mark.parametrize("policy", ["suppress", "defer"])
def test_a_success_adopted_by_a_clock_ahead_frees_its_key_at_the_next_message(make_world, policy):
    """e SUCCEEDED, released; RedriveExecution refuses it; B (+1 h) adopts it on a stale view. m of
    k: A's claim is refused by e; DescribeExecution(e): SUCCEEDED at the earlier end's stop date,
    never an earlier end: e settled, m claims and runs at once (under both duplicate policies). One
    run of k at a time; e's success kept."""
    world = make_world(max_concurrency=2, skew=HOUR, duplicate_policy=policy)
    e = adopted_on_a_stale_view(world, "SUCCEEDED")
    assert e not in world.redrivable()
    with pytest.raises(AssertionError, match="RedriveExecution refuses"):
        world.redrive(e)
    m = world.send(body("k"), group="g-k-1")
    assert world.tick("A") == "ok"
    world.check()
    runs = runs_of(world, "k")
    assert len(runs) == 2 and runs[0] == e, runs
    assert m not in world.model.duplicates and m not in world.model.parked
    items = world.table()
    assert s(items[f"EXEC#{e}"], "state") == "SUCCEEDED"
    assert s(items["PAYLOAD#k"], "holder") == runs[1]
    assert world.holders(items) == {runs[1]}
    assert set(world.model.running) == {runs[1]}
    world.end(runs[1])
    world.deliver(len(world.pending) - 1)
    world.settle()


# -- 3. exactly-once: a run-once success with effects, adopted again and settled again -------------


def test_a_once_success_adopted_again_and_settled_again_neither_reruns_nor_resends(make_world):
    """e (run-once) SUCCEEDED with one effect, released (the effect sent and run). B (+1 h) adopts e
    on a stale view. Past SQS's deduplication window, a run-once re-submission m2 of k is acknowledged
    as already done (``once_by`` e); e, released again at rest, sends its effect to no one a second
    time (EFFECTS#e): k ran once, fx once."""
    world = make_world(max_concurrency=3, skew=HOUR)
    e = adopted_on_a_stale_view(world, "SUCCEEDED", attributes=dict(ONCE), effects=EFFECT)
    world.advance(6 * 60)  # past SQS FIFO's 5-minute deduplication window
    m2 = world.send(body("k"), group="g-k-1", attributes=dict(ONCE))
    assert world.tick("A") == "ok"
    world.check()
    assert runs_of(world, "k") == [e], "a run-once key ran again after its success"
    assert m2 in world.model.already_done
    items = world.table()
    assert s(items["PAYLOAD#k"], "once_by") == e
    # The run-once check comes before the claim: e stays adopted until a reconciliation judges it.
    (fx,) = runs_of(world, "fx")
    world.end(fx)
    world.deliver(len(world.pending) - 1)
    world.advance(6 * 60)
    assert world.tick("A") == "ok"
    world.check()
    assert len(runs_of(world, "fx")) == 1, "the effect ran twice"
    world.settle()
    assert len(runs_of(world, "fx")) == 1


# -- 4. the residual case under DEFER: parked, not lost, delayed by the skew -----------------------


def test_a_failed_run_adopted_by_a_clock_ahead_delays_a_deferred_message_by_the_skew(make_world):
    """As 1 under DEFER: m is parked behind e (its FAILED answer an earlier end, the adoption young
    to A). Nothing is lost: once A's clock passes B's adoption stamp by the window, A's
    reconciliation judges e by DescribeExecution (FAILED), releases it and wakes m, which runs. The
    skew's cost is a delay of an hour."""
    world = make_world(max_concurrency=2, skew=HOUR, duplicate_policy="defer")
    e = adopted_on_a_stale_view(world, "FAILED")
    m = world.send(body("k"), group="g-k-1")
    assert world.tick("A") == "ok"
    world.check()
    assert m in world.model.parked and runs_of(world, "k") == [e]
    world.advance(WINDOW + 1)
    assert world.tick("A") == "ok"
    assert runs_of(world, "k") == [e], "released while the adoption was young to A"
    world.advance(HOUR + WINDOW)
    assert world.tick("A") == "ok"  # releases e, wakes m
    assert world.tick("A") == "ok"
    world.check()
    runs = runs_of(world, "k")
    assert len(runs) == 2, runs
    assert s(world.table()[f"EXEC#{e}"], "state") == "FAILED"
    world.end(runs[1])
    world.deliver(len(world.pending) - 1)
    world.settle()


# -- 5. the success's event repeated after the stale adoption ---------------------------------------


def test_a_repeated_success_event_after_a_stale_adoption_releases_it(make_world):
    """e SUCCEEDED, released; B (+1 h) adopts it on a stale view; EventBridge repeats e's SUCCEEDED
    event. Its stop date is the adoption's earlier end, but a success is never an earlier end: the
    completion releases e at once. (Found as an hour's stall: the event was ignored and, at MAX 1,
    m of k and x waited for A's reconciliation to judge e an hour later by A's clock.)"""
    world = make_world(max_concurrency=1, skew=HOUR)
    e = adopted_on_a_stale_view(world, "SUCCEEDED")
    assert world.redeliver(len(world.delivered) - 1) == "ok"
    world.check()
    assert s(world.table()["PAYLOAD#k"], "holder") is None, "the repeated success event released nothing"
    assert s(world.table()[f"EXEC#{e}"], "state") == "SUCCEEDED"
    world.send(body("x"), group="g-x")
    world.send(body("k"), group="g-k-1")
    for _ in range(4):
        assert world.tick("A") == "ok"
        world.check()
        for name in list(world.model.running):
            world.end(name)
            world.deliver(len(world.pending) - 1)
        world.advance(VISIBILITY_PAST)
    assert len(runs_of(world, "k")) == 2 and len(runs_of(world, "x")) == 1
    world.settle()


VISIBILITY_PAST = 181.0


# -- 6. promise 2: a FAILED run really redriven, adopted, then a stale answer of its FAILED end -----


def test_a_redriven_failed_run_answered_with_its_earlier_end_keeps_its_key(make_world):
    """e FAILED at s1, released; the operator redrives it and A adopts it (earlier_end_at s1). m of
    k: DescribeExecution(e) answers FAILED at s1 (stale, within the window of the adoption): still
    an earlier end (only SUCCEEDED answers are excepted), so e is not settled and m does not start
    beside it. e SUCCEEDS at s2; its event releases it; m, looked at again, runs."""
    world = make_world(max_concurrency=2)
    world.send(body("k"), group="g-k-0")
    assert world.tick("A") == "ok"
    (e,) = runs_of(world, "k")
    event = world.end(e, "FAILED")
    assert world.deliver(world.pending.index(event)) == "ok"
    failed = {
        k: v
        for k, v in world.sfn.describe_execution(executionArn=arn_of(world, e)).items()
        if k != "ResponseMetadata"
    }
    assert failed["status"] == "FAILED"
    world.advance(WINDOW + 1)
    world.redrive(e)
    assert world.tick("A") == "ok"
    assert s(world.table()[f"EXEC#{e}"], "state") == "RUNNING", "A did not adopt the redriven run"
    m = world.send(body("k"), group="g-k-1")
    with stale_describe(sfn_of(world, "A"), e, failed) as fired:
        assert world.tick("A") == "ok"
    assert fired[e] >= 1, "the stale answer never fired"
    world.check()
    assert runs_of(world, "k") == [e], "m started beside the redriven e"
    assert s(world.table()["PAYLOAD#k"], "holder") == e
    event = world.end(e, "SUCCEEDED")
    assert world.deliver(world.pending.index(event)) == "ok"
    assert s(world.table()[f"EXEC#{e}"], "state") == "SUCCEEDED"
    world.advance(WINDOW + 1)
    assert world.tick("A") == "ok"
    world.check()
    runs = runs_of(world, "k")
    assert len(runs) == 2 and m not in world.model.duplicates, runs
    world.end(runs[1])
    world.deliver(len(world.pending) - 1)
    world.settle()

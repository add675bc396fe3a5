"""Issue 25, section 2: DescribeExecution is eventually consistent ("The results are best effort and
may not reflect very recent updates and changes"). Each decision that rests on its answer is run
here with the answer stale: a just-started execution reported as missing, a just-ended one as
RUNNING, a just-redriven one with its earlier end. The stale answer is a botocore hook on the
deciding container's client; each test asserts it fired. docs/protocol.md, "Staleness", states the
bound and why each decision is safe within it."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest

from sluice.core.model import Outcome, PayloadState
from tests.reliability.world import CLAIM_TIMEOUT, VISIBILITY, WINDOW, World
from tests.support.aws import build_stack, status_change_event
from tests.support.faults import CrashAt, Interleave, StaleList
from tests.support.hooks import _Http, error_answer


def body(key: str) -> str:
    return json.dumps({"id": key})


def runs_of(world: World, key: str) -> list[str]:
    return [s.name for s in world.model.starts if s.key == key]


MISSING = "missing"
RUNNING = "running"


@contextmanager
def stale_describe(client: Any, name: str, answer: str | float) -> Iterator[Counter]:
    """DescribeExecution of ``name`` answered from an older view: ``MISSING`` (as before its
    start), ``RUNNING`` (as before its end), or a stop date (epoch seconds: as before its redrive,
    FAILED then). Nothing is sent to Step Functions."""
    fired: Counter = Counter()

    def hook(params: dict[str, Any], **_: Any) -> Any:
        raw = params.get("body", b"")
        request = json.loads(raw.decode() if isinstance(raw, bytes) else raw or "{}")
        arn = request.get("executionArn", "")
        if not arn.endswith(f":{name}"):
            return None
        fired[str(answer) if isinstance(answer, str) else "earlier_end"] += 1
        if answer == MISSING:
            return error_answer("ExecutionDoesNotExist", 400)
        machine = arn.replace(":execution:", ":stateMachine:").rsplit(":", 1)[0]
        parsed: dict[str, Any] = {
            "executionArn": arn,
            "stateMachineArn": machine,
            "name": name,
            "startDate": datetime(2026, 1, 1, tzinfo=UTC),
            "ResponseMetadata": {"HTTPStatusCode": 200, "HTTPHeaders": {}},
        }
        if answer == RUNNING:
            parsed["status"] = "RUNNING"
        else:
            parsed.update(status="FAILED", stopDate=datetime.fromtimestamp(float(answer), UTC))
        return _Http(200), parsed

    event = "before-call.sfn.DescribeExecution"
    client.meta.events.register(event, hook)
    try:
        yield fired
    finally:
        client.meta.events.unregister(event, hook)


def sfn_of(world: World, container: str) -> Any:
    return world.containers[container].runtime.client("stepfunctions")


# -- reconciliation: an unstarted claim ------------------------------------------------------------


def test_a_claim_started_just_before_the_first_sighting_is_not_released(make_world):
    """Tick A claims p0 and is slow to start it (past the consistency window); just after its
    start, tick B's listing misses it and DescribeExecution still says no such execution. That is
    sighting 1 only: sighting 2, a claim timeout later, is past the bound and sees it run."""
    world = make_world(max_concurrency=2)
    world.send(body("p0"), group="g0")
    slow = Interleave("before_start", lambda: world.advance(WINDOW + 1))
    assert world.tick("A", [slow]) == "ok" and slow.seen == 1
    (p0,) = world.model.running
    with stale_describe(sfn_of(world, "B"), p0, MISSING) as fired:
        world.tick("B", [StaleList("empty")])
    assert fired[MISSING] >= 1
    assert world.table()[f"EXEC#{p0}"].get("suspect_since"), "sighting 1 marked the claim"
    world.advance(CLAIM_TIMEOUT + 1)
    world.tick("B", [StaleList("empty")])  # sighting 2: past the bound, Step Functions says it runs
    world.check()
    assert world.table()[f"EXEC#{p0}"]["state"]["S"] == PayloadState.RUNNING.value
    assert world.holders(world.table()) == {p0}
    world.settle()


# -- a redriven run: its earlier end, answered again ------------------------------------------------


def adopted_redriven(world: World) -> tuple[str, float]:
    """j's run e1 FAILED, released, redriven and adopted back; returns e1 and its earlier stop."""
    world.send(body("j"), group="g0")
    world.tick("A")
    (e1,) = world.model.running
    world.end(e1, "FAILED")
    assert world.deliver(0) == "ok"
    stop = float(world.table()[f"EXEC#{e1}"]["ended_at"]["N"])
    world.redrive(e1)
    world.tick("B")  # listed running again: adopted
    assert world.holders(world.table()) == {e1}
    return e1, stop


def test_a_duplicate_of_a_just_adopted_run_answered_with_its_earlier_end(make_world):
    """A re-submission of j just after e1 was adopted: the claim finds e1 holding j's lease and asks
    DescribeExecution, which still answers with e1's earlier end (FAILED, before the redrive).
    Failed before the fix: promise 2: the holder was settled as ended and j claimed and started
    beside e1."""
    world = make_world(max_concurrency=3)
    e1, stop = adopted_redriven(world)
    world.send(body("j"), group="g1")
    with stale_describe(sfn_of(world, "A"), e1, stop) as fired:
        world.tick("A")
    assert fired["earlier_end"] >= 1
    world.check()
    assert runs_of(world, "j") == [e1], "j ran twice"
    assert world.holders(world.table()) == {e1}
    world.settle()


def test_an_adopted_run_is_not_released_on_its_earlier_end_within_the_bound(make_world):
    """Just after the adoption a stale listing misses e1, and DescribeExecution still answers with
    its earlier end. Failed before the fix: reconciliation judged e1 by its first start (long past
    the window), took the earlier end for a new one and released it while it ran (promise 1 then
    admits past it). Now an adoption restarts the window; asked past it, the answer is fresh."""
    world = make_world(max_concurrency=3)
    e1, stop = adopted_redriven(world)
    world.advance(WINDOW - 1)
    with stale_describe(sfn_of(world, "B"), e1, stop) as fired:
        world.tick("B", [StaleList("empty")])
        # A re-submission, in the same stale view: the duplicate check hears the earlier end too.
        world.send(body("j"), group="g1")
        world.tick("B", [StaleList("empty")])
    assert fired["earlier_end"] >= 1
    world.check()
    assert world.holders(world.table()) == {e1}, "the adopted run was released while it runs"
    assert runs_of(world, "j") == [e1]
    world.settle()


def test_a_marked_key_answered_with_its_redriven_runs_earlier_end_is_not_lifted(make_world):
    """j's lease is marked (e1 redriven while a second run held it); the second ends; a new claim of
    j asks DescribeExecution about e1, which still answers with e1's earlier end. Failed before the
    fix: promise 2: the mark was lifted and j claimed and started beside e1."""
    world = make_world(max_concurrency=3)
    world.send(body("j"), group="g0")
    world.tick("A")
    (e1,) = world.model.running
    world.end(e1, "FAILED")
    assert world.deliver(0) == "ok"
    stop = float(world.table()[f"EXEC#{e1}"]["ended_at"]["N"])
    world.send(body("j"), group="g1")
    world.tick("A")
    (second,) = [n for n in world.model.running if n != e1]
    world.redrive(e1)
    world.advance(WINDOW + 1)
    world.tick("B")  # e1 listed: adoption refused (second holds j), the lease marked
    assert world.table()["PAYLOAD#j"].get("redriven", {}).get("S") == e1
    world.end(second)
    assert world.deliver(len(world.pending) - 1) == "ok"
    world.send(body("j"), group="g2")
    with stale_describe(sfn_of(world, "A"), e1, stop) as fired:
        world.tick("A")
    assert fired["earlier_end"] >= 1
    world.check()
    assert [n for n in runs_of(world, "j") if n not in (e1, second)] == [], "j ran beside e1"
    assert world.holders(world.table()) == {e1}, "e1 was adopted"
    world.settle()


def test_an_event_of_the_earlier_run_after_an_adoption_releases_nothing(make_world):
    """e1's FAILED event is delivered again after its adoption, and DescribeExecution still answers
    with that earlier end. Failed before the fix: the confirmation (its own word, the same stop
    date) passed and the running e1 was released."""
    world = make_world(max_concurrency=3)
    e1, stop = adopted_redriven(world)
    with stale_describe(sfn_of(world, "completion"), e1, stop) as asked:
        assert world.redeliver(0) == "ok"
    assert world.holders(world.table()) == {e1}, "the adopted run was released by its earlier end"
    assert asked["earlier_end"] == 0, "the event carries the earlier end's stop date: nothing to ask"
    # In the same stale view, a re-submission's duplicate check does ask, and hears that end too.
    world.send(body("j"), group="g1")
    with stale_describe(sfn_of(world, "A"), e1, stop) as fired:
        world.tick("A")
    assert fired["earlier_end"] >= 1
    world.check()
    assert world.holders(world.table()) == {e1}, "the adopted run was released by its earlier end"
    world.settle()


# -- a resumed claim, and StartExecution's "already exists" -------------------------------------------


def test_a_resumed_claim_whose_start_is_reported_missing_runs_once(make_world):
    """The launcher died after StartExecution; the message returns and DescribeExecution (by the
    claim's ARN) still says no such execution. The resume renews and starts the same name on the
    same machine: Step Functions answers with the same run. One run."""
    world = make_world(max_concurrency=2)
    m = world.send(body("p0"), group="g0")
    assert world.tick("A", [CrashAt("after_start")]) == "crashed"
    (p0,) = world.model.running
    world.advance(VISIBILITY + 1)
    with stale_describe(sfn_of(world, "B"), p0, MISSING) as fired:
        world.tick("B")
    assert fired[MISSING] >= 1
    world.check()
    assert runs_of(world, "p0") == [p0] and world.model.claims[p0] == m
    assert world.holders(world.table()) == {p0}
    world.settle()


def test_a_start_refused_as_existing_and_reported_missing_keeps_its_claim(make_world):
    """The run of p0 ended while its launcher was dead after its start (its event lost); the message
    returns; DescribeExecution says no such execution (stale), StartExecution says it exists (it
    ended). The claim is kept and the message returns: asked again, past the bound, it already ran."""
    world = make_world(max_concurrency=2)
    world.send(body("p0"), group="g0")
    assert world.tick("A", [CrashAt("after_start")]) == "crashed"
    (p0,) = world.model.running
    world.end(p0)
    world.lose(0)
    world.advance(VISIBILITY + 1)
    with stale_describe(sfn_of(world, "B"), p0, MISSING) as fired:
        world.tick("B")
    assert fired[MISSING] >= 2  # the resume's question, then the one after "already exists"
    world.check()
    assert runs_of(world, "p0") == [p0]
    assert world.holders(world.table()) == {p0}, "the claim of a start that may have happened is kept"
    world.advance(VISIBILITY + 1)
    world.tick("B")
    world.check()
    assert world.holders(world.table()) == set() and world.queue_depth() == 0
    world.settle()


# -- the duplicate check: a just-ended holder reported RUNNING ---------------------------------------


def test_a_resubmission_just_after_its_keys_run_ended_is_looked_at_again(session):
    """p's run ended a moment ago; its status event is on the way. A re-submission of p finds the
    lease held and DescribeExecution still says RUNNING: the answer may be stale, so it is not
    dropped but sent back to the queue for the consistency window (docs/protocol.md, "Staleness";
    tests/integration/test_stale_duplicate_moto.py follows it to its start). The run's release
    then comes from its event, and the slot is free."""
    stack = build_stack(session, max_concurrency=2)
    stack.send({"id": "p"}, group="g0")
    stack.launcher().tick()
    (p,) = stack.running()
    stack.finish(p, "SUCCEEDED")
    stack.send({"id": "p"}, group="g1")
    rt = stack.runtime()
    with stale_describe(rt.client("stepfunctions"), p, RUNNING) as fired:
        summary = rt.launcher().admit()
    assert fired[RUNNING] == 1
    assert summary.n(Outcome.RECHECK) == 1 and stack.queue_counts() == (0, 1)
    assert stack.runtime().store().payload("p").duplicates == 0
    event = status_change_event(stack.settings.state_machine_arn, p, "SUCCEEDED")
    from sluice.core.events import StatusChange
    from sluice.launch.completion import settle_status_change

    released = settle_status_change(
        StatusChange.from_event(event),
        store=rt.store(),
        queue=rt.queue(),
        state_machine_arn=stack.settings.state_machine_arn,
        now=rt.clock.now(),
    )
    assert released is not None and rt.store().payload("p").holder is None


# -- reconciliation: a run seen running --------------------------------------------------------------


def test_a_run_seen_running_then_reported_missing_on_its_own_machine_keeps_its_slot(make_world):
    """Found by the explorer (seed 227350591). p0 starts; B's clock is 15 minutes ahead, so p0
    looks old to it at once. B's first look marks p0 RUNNING; its next look is answered from a
    view before the start: no such execution. p0's machine is the stack's own and exists, so the
    answer is stale, not a vanished run: p0 keeps its slot and its lease, its key no mark."""
    world = make_world(max_concurrency=2, skew=900.0)
    world.send(body("p0"), group="g0")
    world.tick("A")
    (p0,) = world.model.running
    world.tick("B", [StaleList("empty")])
    assert world.table()[f"EXEC#{p0}"]["state"]["S"] == PayloadState.RUNNING.value
    with stale_describe(sfn_of(world, "B"), p0, MISSING) as fired:
        world.tick("B", [StaleList("empty")])
    assert fired[MISSING] >= 1
    assert world.holders(world.table()) == {p0}, "a running execution's slot was freed"
    assert "once_unknown" not in world.table()["PAYLOAD#p0"]
    world.check()
    world.settle()


# -- reconciliation: a count the caps could not carry ------------------------------------------------


def test_a_count_of_outside_runs_is_saved_only_with_the_caps_that_carry_it(session):
    """Found by the explorer (seed 247330871). MAX 2; an execution is started by hand. A tick's
    reconciliation lists it but cannot read MAX (throttled): the caps stay at 2, so the count is not
    saved either (a saved count says the caps carry it: the model, the drift metric and `sluice
    status` read it so). The next tick reads MAX: the count is saved with the caps."""
    from sluice.core.clock import FakeClock
    from sluice.core.errors import TransientError
    from tests.support.hooks import throttle

    stack = build_stack(session, max_concurrency=2, clock=FakeClock())
    sfn = stack.client("stepfunctions")
    sfn.start_execution(stateMachineArn=stack.settings.state_machine_arn, name="by-hand", input="{}")
    stack.clock.advance(61)
    rt = stack.runtime()
    refused = throttle(rt.client("ssm"), "GetParameter")
    with pytest.raises(TransientError):  # admission too cannot read MAX: the tick ends
        rt.launcher().tick()
    assert refused["throttled"] >= 1
    store = stack.runtime().store()
    assert store.ledger().external == 0, "a count saved that the caps do not carry"
    stack.clock.advance(61)
    stack.launcher().tick()
    assert store.ledger().external == 1


def test_a_success_adopted_on_a_stale_listing_by_a_clock_ahead_does_not_hold_its_key(make_world):
    """j's run e1 SUCCEEDED and was released. Launcher B, whose clock runs an hour ahead, lists e1
    RUNNING from an older view and adopts it (stamped by its clock). A re-submission of j, refused
    by e1's lease, asks DescribeExecution: SUCCEEDED, with the stop its record held before the
    adoption. A SUCCEEDED execution is never redriven, so that end is its last, whatever the clocks
    say: e1 is settled and j runs. Failed before the fix (explorer seed 111160034): the adoption
    read as younger than the consistency window for an hour, the end as stale, and j was
    suppressed as a duplicate of a run that had ended before it was sent (promise 3)."""
    world = make_world(max_concurrency=3, skew=3600.0)
    world.send(body("j"), group="g0")
    world.tick("A")
    (e1,) = world.model.running
    world.end(e1, "SUCCEEDED")
    assert world.deliver(0) == "ok"
    world.advance(WINDOW + 1)
    # B's reconciliation on a listing and a DescribeExecution that still say RUNNING, as the
    # explorer drew them: the adoption it writes, by its clock.
    b = world.containers["B"]
    assert b.runtime.store().adopt(name=e1, now=b.clock.now())
    assert world.holders(world.table()) == {e1}, "the premise: B adopted e1"
    world.send(body("j"), group="g1")
    world.tick("A")
    world.advance(WINDOW + 1)
    world.tick("A")
    world.check()
    assert len(runs_of(world, "j")) == 2, "j's re-submission did not run"
    world.settle()

"""Attacks on the second look's sighted group (``MessageBranches.sight_behind``).

The change: when a message goes back for its second look (``recheck``), its FIFO group's later
messages of the batch are sighted on that receive, so a refusal on their next receive suppresses
them at once. Sound only if that next receive comes at least S (the consistency window) after the
sighting: each scenario below tries to bring a sighted-behind message back sooner, or to make a
sighting suppress a message that is not a duplicate, on moto with the real adapters (the
reliability ``World``, whose model checks the promises after every step).

The adversary is Step Functions as stale as the documented bound allows (docs/protocol.md,
"Staleness"): DescribeExecution of an execution that ended less than S ago, by the world's clock,
answers RUNNING. Staler answers are outside the assumptions and are not played here.

Common setup (``_setup``): key ``r`` runs (R, truly RUNNING), key ``k``'s run H has just ended (its
status event still owed, so H holds ``k``'s lease). Then, in FIFO group ``g``: ``d``, a true
duplicate of R, and ``j``, a re-submission of ``k`` sent after H ended: ``j`` must run (promise 3).
The first tick sends ``d`` back for its second look and sights ``j`` behind it. Were ``j`` received
again within S of H's end, the stale RUNNING answer would refuse it and the sighting would suppress
it: the model reports that as "promise 3: a re-submission was suppressed ...".
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from sluice.core.model import Outcome
from sluice.launch.message_branches import MessageBranches
from tests.reliability.world import VISIBILITY, WINDOW, PromiseBroken, World
from tests.support.faults import CrashAt, Fault, Injector, throttled
from tests.support.hooks import _Http
from tests.support.steps import Call

CHANGE = [pytest.param(True, id="with_change"), pytest.param(False, id="change_disabled")]
# Where the outcome differs without the change, both runs are kept; elsewhere the change alone.
WITH_CHANGE = [pytest.param(True, id="with_change")]


def body(key: str) -> str:
    return json.dumps({"id": key})


def runs_of(world: World, key: str) -> list[str]:
    return [s.name for s in world.model.starts if s.key == key]


# -- the adversary, and what the queue handed out -------------------------------------------------


@dataclass
class Adversary:
    """DescribeExecution as stale as S allows, on every container; every receive, logged by the
    world's clock."""

    world: World
    fired: Counter[str] = field(default_factory=Counter)
    receives: list[tuple[float, str, str]] = field(default_factory=list)  # (now, container, message id)

    def describe(self, params: dict[str, Any], **_: Any) -> Any:
        raw = params.get("body", b"")
        request = json.loads(raw.decode() if isinstance(raw, bytes) else raw or "{}")
        arn = request.get("executionArn", "")
        name = arn.rsplit(":", 1)[-1]
        ended = self.world.ended_when.get(name)
        if ended is None or self.world.clock.now() >= ended + WINDOW:
            return None  # running, or ended S ago or more: the answer is fresh
        self.fired[name] += 1
        machine = arn.replace(":execution:", ":stateMachine:").rsplit(":", 1)[0]
        return _Http(200), {
            "executionArn": arn,
            "stateMachineArn": machine,
            "name": name,
            "status": "RUNNING",
            "startDate": datetime(2026, 1, 1, tzinfo=UTC),
            "ResponseMetadata": {"HTTPStatusCode": 200, "HTTPHeaders": {}},
        }

    def received(self, container: str) -> Any:
        def hook(parsed: dict[str, Any], **_: Any) -> None:
            for message in (parsed or {}).get("Messages", []):
                self.receives.append((self.world.clock.now(), container, message["MessageId"]))

        return hook

    def times(self, message_id: str) -> list[float]:
        return [t for t, _, m in self.receives if m == message_id]


@contextmanager
def adversary(world: World) -> Iterator[Adversary]:
    adv = Adversary(world)
    registered = []
    for name, container in world.containers.items():
        sfn = container.runtime.client("stepfunctions")
        sqs = container.runtime.client("sqs")
        hook = adv.received(name)
        sfn.meta.events.register("before-call.sfn.DescribeExecution", adv.describe)
        sqs.meta.events.register("after-call.sqs.ReceiveMessage", hook)
        registered.append((sfn, sqs, hook))
    try:
        yield adv
    finally:
        for sfn, sqs, hook in registered:
            sfn.meta.events.unregister("before-call.sfn.DescribeExecution", adv.describe)
            sqs.meta.events.unregister("after-call.sqs.ReceiveMessage", hook)


def change(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    """The change under review, or the scratch run without it (the group handed back unsighted)."""
    if not on:
        monkeypatch.setattr(MessageBranches, "sight_behind", lambda self, message, behind: None)


@dataclass
class Scene:
    R: str
    H: str
    d: str
    j: str
    sighted_at: float


def _setup(
    world: World, adv: Adversary, *, lane: str = "default", faults: list[Fault] | None = None
) -> Scene:
    world.send(body("r"), group="g0")
    world.send(body("k"), group="g1")
    assert world.tick("A") == "ok"
    (R,) = runs_of(world, "r")
    (H,) = runs_of(world, "k")
    world.end(H)  # its status event is owed: H still holds k's lease
    world.advance(1)
    d = world.send(body("r"), group="g", lane=lane)  # a true duplicate of R
    j = world.send(body("k"), group="g", lane=lane)  # sent after H ended: must run
    assert d and j
    sighted_at = world.clock.now()
    world.tick("A", faults or [])
    world.check()
    return Scene(R, H, d, j, sighted_at)


def _not_back_within_s(adv: Adversary, scene: Scene) -> None:
    times = adv.times(scene.j)
    assert times and times[0] == scene.sighted_at, f"j not received by the first tick: {adv.receives}"
    early = [t - scene.sighted_at for t in times[1:] if t < scene.sighted_at + WINDOW]
    assert not early, (
        f"the sighting's premise: j (sighted behind d) was received again {early} s after its sighting, "
        f"less than S = {WINDOW}"
    )


def _finish(world: World, scene: Scene) -> None:
    """Past the window: d is R's duplicate, j runs. Then everything settles (promises 3 and 4)."""
    world.advance(VISIBILITY + 1)
    world.tick("A")
    world.check()
    world.settle()
    assert len(runs_of(world, "k")) == 2, (
        f"promise 3: j (a re-submission after H ended) never ran: {world.model.starts}"
    )
    assert scene.d in world.model.duplicates


# -- the baseline --------------------------------------------------------------------------------


@pytest.mark.parametrize("on", WITH_CHANGE)
def test_baseline_sighted_behind_then_refused_within_the_bound(make_world, monkeypatch, on):
    """The change's own case: j sighted behind d; d and j come back after S; H's end is fresh by
    then, so j claims. Also: a tick in the window receives nothing of g."""
    change(monkeypatch, on)
    world = make_world(max_concurrency=5)
    with adversary(world) as adv:
        scene = _setup(world, adv)
        world.advance(WINDOW / 2)
        world.tick("A")
        world.check()
        world.advance(WINDOW / 2 - 1)
        world.tick("B")
        world.check()
        _not_back_within_s(adv, scene)
        _finish(world, scene)


# -- the rechecked message's visibility change lost, or the hand-back never made -------------------


class ThrottleDelayedReturn(Fault):
    """Throttle the ChangeMessageVisibilityBatch that sends a message back for the window (delay >
    0): Sluice's release swallows it, so the rechecked message keeps the visibility timeout of its
    receive."""

    def __init__(self) -> None:
        self.fired = 0

    def before(self, injector: Injector, call: Call) -> Any:
        if call.operation != "ChangeMessageVisibilityBatch" or self.fired:
            return None
        if not any(int(e.get("VisibilityTimeout", 0)) > 0 for e in call.params.get("Entries", [])):
            return None
        self.fired += 1
        return throttled("sqs")


@pytest.mark.parametrize("on", WITH_CHANGE)
def test_rechecked_messages_visibility_change_throttled(make_world, monkeypatch, on):
    """d's change of visibility to S is throttled (swallowed: "best effort"), j is handed back at
    once. d stays in flight for the visibility timeout of its receive (VISIBILITY > S), which holds
    g: j is not received in the window by A, B or a completion's hand-over."""
    change(monkeypatch, on)
    world = make_world(max_concurrency=5)
    with adversary(world) as adv:
        throttle = ThrottleDelayedReturn()
        scene = _setup(world, adv, faults=[throttle])
        assert throttle.fired == 1
        for step in (5, 20, 30):
            world.advance(step)
            world.tick("B" if step == 20 else "A")
            world.check()
        _not_back_within_s(adv, scene)
        _finish(world, scene)


@pytest.mark.parametrize("on", WITH_CHANGE)
def test_crash_between_the_sightings_and_the_hand_back(make_world, monkeypatch, on):
    """The launcher dies after d went back for S and j was sighted, before j's hand-back (the
    second ChangeMessageVisibilityBatch). j stays in flight for its visibility timeout; d, visible
    after S, is held behind it (FIFO): nothing of g comes back in the window."""
    change(monkeypatch, on)
    world = make_world(max_concurrency=5)
    with adversary(world) as adv:
        scene = _setup(world, adv, faults=[CrashAt("before_return", nth=2)])
        for step in (10, 30, 15):
            world.advance(step)
            world.tick("A")
            world.check()
        _not_back_within_s(adv, scene)
        _finish(world, scene)


# -- other receivers in the window: a second launcher, a completion's hand-over --------------------


@pytest.mark.parametrize("on", WITH_CHANGE)
def test_second_launcher_and_a_hand_over_in_the_window(make_world, monkeypatch, on):
    """Right after A's recheck, launcher B ticks, a third run s ends and its completion hands its
    slot over (a receive of its own), B ticks again: none of them may receive j before S."""
    change(monkeypatch, on)
    world = make_world(max_concurrency=5)
    world.send(body("s"), group="g2")
    with adversary(world) as adv:
        scene = _setup(world, adv)
        (s,) = runs_of(world, "s")
        world.tick("B")
        world.check()
        world.advance(20)
        event = world.end(s)
        assert world.deliver(world.pending.index(event)) == "ok"
        world.check()
        world.advance(20)
        world.ticks_at_once(("A", "B"))
        world.check()
        _not_back_within_s(adv, scene)
        _finish(world, scene)


# -- runs that span groups or queues -------------------------------------------------------------


@pytest.mark.parametrize("on", WITH_CHANGE)
def test_fair_lane_run_spanning_groups(make_world, monkeypatch, on):
    """In a fair lane a batch's run is a tenant's, across FIFO groups: [d (g), x (g2), j (g)], one
    tenant. d goes back for S; x, in another group, is handed back unsighted and received again at
    once by the same pass: its refusal there (H reads RUNNING, stale) must be a first look, never
    a suppression. j, behind d, is sighted."""
    change(monkeypatch, on)
    world = make_world(max_concurrency=6, lanes="shared:3:1:1:fair")
    with adversary(world) as adv:
        world.send(body("r"), group="g0")
        world.send(body("k"), group="g1")
        assert world.tick("A") == "ok"
        (H,) = runs_of(world, "k")
        world.end(H)
        world.advance(1)
        d = world.send(body("r"), group="g", lane="shared")
        x = world.send(body("k"), group="g2", lane="shared")
        j = world.send(body("k2"), group="g", lane="shared")
        assert d and x and j
        world.tick("A")
        world.check()
        assert adv.fired[H] >= 1, "H was never asked within the window"
        assert x not in world.model.duplicates
        table = world.table("receipt")
        assert f"SIGHT#{d}" in table
        assert (f"SIGHT#{j}" in table) == on
        world.advance(VISIBILITY + 1)
        world.tick("A")
        world.check()
        world.settle()
        assert len(runs_of(world, "k")) == 2, "promise 3: x never ran"
        assert runs_of(world, "k2"), "promise 3: j never ran"


@pytest.mark.parametrize("on", WITH_CHANGE)
def test_same_group_id_in_another_lanes_queue(make_world, monkeypatch, on):
    """Group ids are per queue: d in the default lane's queue (group g) goes back for S; j, group g
    too but in lane fast's queue, is not held behind it. It must not have been sighted with d, so
    its refusal by a stale H is a first look."""
    change(monkeypatch, on)
    world = make_world(max_concurrency=6, lanes="default:4:2,fast:2:1")
    with adversary(world) as adv:
        world.send(body("r"), group="g0")
        world.send(body("k"), group="g1")
        assert world.tick("A") == "ok"
        (H,) = runs_of(world, "k")
        world.end(H)
        world.advance(1)
        d = world.send(body("r"), group="g")
        j = world.send(body("k"), group="g", lane="fast")
        assert d and j
        world.tick("A")
        world.check()
        assert adv.fired[H] >= 1
        assert j not in world.model.duplicates
        world.advance(VISIBILITY + 1)
        world.tick("A")
        world.check()
        world.settle()
        assert len(runs_of(world, "k")) == 2, "promise 3: j never ran"


# -- a sighting lost, or written and its answer lost -----------------------------------------------


class ThrottleSightings(Fault):
    """Throttle the ``SIGHT#`` writes of this invocation after the first (d's own)."""

    def __init__(self) -> None:
        self.seen = 0
        self.fired = 0

    def before(self, injector: Injector, call: Call) -> Any:
        if call.operation != "UpdateItem":
            return None
        if not call.params.get("Key", {}).get("pk", {}).get("S", "").startswith("SIGHT#"):
            return None
        self.seen += 1
        if self.seen == 1:
            return None
        self.fired += 1
        return throttled("dynamodb")


def test_sighting_behind_throttled_or_expired_only_costs_a_look(make_world):
    """j's sighting behind d is throttled (best effort: skipped), and d's own SIGHT# is deleted by
    TTL before d's second look: each only costs a window more, never a suppression of j."""
    world = make_world(max_concurrency=5)
    with adversary(world) as adv:
        fault = ThrottleSightings()
        scene = _setup(world, adv, faults=[fault])
        assert fault.fired >= 1
        assert f"SIGHT#{scene.j}" not in world.table("receipt")
        world.ddb.delete_item(TableName=world.settings.table_name, Key={"pk": {"S": f"SIGHT#{scene.d}"}})
        _not_back_within_s(adv, scene)
        _finish(world, scene)


# -- the liveness claim: duplicates ahead cost a fresh message one receive ------------------------


@pytest.mark.parametrize("on", CHANGE)
def test_many_duplicates_ahead_receive_count(make_world, monkeypatch, on):
    """Group g: eight true duplicates of R, then j (a fresh key). With the change, j is received
    twice (handed back once, then claims). Without it (the scratch run), every duplicate ahead is a
    first look in turn and hands j back again: 9 receives here, so SQS's maxReceiveCount (10 as
    deployed) moves j to the DLQ without a reason with a duplicate or two more. The change fixes
    this; the scratch run pins the behaviour it replaces."""
    change(monkeypatch, on)
    world = make_world(max_concurrency=12)
    with adversary(world) as adv:
        world.send(body("r"), group="g0")
        assert world.tick("A") == "ok"
        ahead = [world.send(body("r"), group="g") for _ in range(8)]
        j = world.send(body("fresh"), group="g")
        assert all(ahead) and j
        for _ in range(12):
            world.tick("A")
            world.check()
            if runs_of(world, "fresh"):
                break
            world.advance(WINDOW + 1)
        assert runs_of(world, "fresh"), "j never ran"
        receives = len(adv.times(j))
        world.settle()
        if on:
            assert receives <= 2, f"j received {receives} times behind duplicates ahead (maxReceiveCount 10)"
        else:
            assert receives == 9, f"without the change j is handed back once per duplicate ahead: {receives}"


# -- the detector: the premise broken by hand ------------------------------------------------------


@pytest.mark.parametrize("on", CHANGE)
def test_detector_j_forced_back_within_s(make_world, monkeypatch, on):
    """Outside SQS's semantics, to show what the premise carries and that the model sees its loss:
    right after the first tick, d and j are made visible by hand (a ChangeMessageVisibility SQS
    FIFO would never let happen to j while d is held), and a tick within S receives them. d is a
    second look (R runs: a true duplicate); j's first refusal, by H read RUNNING (stale, within S
    of its end), is then taken for a second look and j is suppressed behind a run that ended
    before it was sent: promise 3. Without the change it is a first look and goes back for S."""
    change(monkeypatch, on)
    world = make_world(max_concurrency=5)
    with adversary(world) as adv:
        scene = _setup(world, adv)
        receipts = [
            [r for r, mid in world.model.receipts.items() if mid == m][-1] for m in (scene.d, scene.j)
        ]
        world.sqs.change_message_visibility_batch(
            QueueUrl=world.settings.queue_url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": r, "VisibilityTimeout": 0} for i, r in enumerate(receipts)
            ],
        )
        for m in (scene.d, scene.j):
            world.model.made_visible(m)
        world.advance(5)
        world.tick("A")
        assert adv.fired[scene.H] >= 1, "H was not asked within the window"
        if on:
            with pytest.raises(PromiseBroken, match="promise 3: a re-submission was suppressed"):
                world.check()
            return
        world.check()
        assert scene.j not in world.model.duplicates
        _finish(world, scene)


def test_outcomes_are_counted(make_world):
    """The recheck and the hand-back are reported as the summary says (sanity of the setup)."""
    world = make_world(max_concurrency=5)
    with adversary(world) as adv:
        world.send(body("r"), group="g0")
        world.tick("A")
        world.send(body("r"), group="g")
        world.send(body("other"), group="g")
        seen = []
        assert world.run("A", lambda c: seen.append(c.launcher.tick())) == "ok"
        (summary,) = seen
        assert summary.n(Outcome.RECHECK) == 1
        assert summary.n(Outcome.RETURNED) == 1
        assert adv.receives
        world.settle()


# -- a sighting is not bound to a holder ------------------------------------------------------------


@pytest.mark.parametrize("on", CHANGE)
def test_sighting_then_a_holder_claimed_after_the_send(make_world, monkeypatch, on):
    """j (key k2, free) is sighted behind d without any refusal. Then n, a later message of k2 in
    another group, overtakes it: claimed and started, it ends just before j's next receive, its
    event owed. j, refused by N (read RUNNING, within S of N's end), is suppressed at once with the
    change: N ran after j was sent, so promise 3 as written allows it (the model agrees). Without the
    change j goes back for S, then claims and runs after N: the two differ in outcome only."""
    change(monkeypatch, on)
    world = make_world(max_concurrency=5)
    with adversary(world) as adv:
        world.send(body("r"), group="g0")
        assert world.tick("A") == "ok"
        d = world.send(body("r"), group="g")
        j = world.send(body("k2"), group="g")
        assert d and j
        world.tick("A")
        world.check()
        world.advance(10)
        assert world.send(body("k2"), group="g9")
        world.tick("B")
        world.check()
        (N,) = runs_of(world, "k2")
        world.advance(40)
        world.end(N)
        world.advance(WINDOW - 50 + 1)  # d and j due; N ended 11 s ago
        world.tick("A")
        world.check()
        assert adv.fired[N] >= 1
        assert (j in world.model.duplicates) == on
        world.settle()
        assert len(runs_of(world, "k2")) == (1 if on else 2)

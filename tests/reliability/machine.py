"""The stateful property suite: Hypothesis drives Sluice through faults and checks every promise.

Each example builds a fresh world (tests/reliability/world.py) and runs a random program of
actions: enqueue, tick (one launcher, the other with its skewed clock, both at once, or one whose
clients retry as deployed), with a fault armed or another actor cutting in at a protocol step
(another tick, an event, the operator lowering MAX), change MAX, end executions, play EventBridge,
and change AWS behind Sluice's back (redrive, StopExecution or StartExecution by hand, DynamoDB's
TTL). After every action the invariants run (the model's record of broken promises, and the ledger
against the leases); ``teardown`` then brings the world to rest and checks what only holds at rest.
A failing program shrinks to a short one and prints as Python that replays it.

Each sequence of issue 9 is a class of program it draws on its own: a resume racing reconciliation
(a crash after the claim, time passing, a tick or a refill that the scheduled tick cuts into before
StartExecution), an ambiguous start then throttles (``attempts``), MAX lowered between batches
(``set_max``), ``Outside`` (redrive, stop or start by hand), ``ExpireTTL``, clocks an hour apart
(``SKEWS``), ``ResubmitBeforeRelease``, and a key with thousands of runs behind it (``history``).

Concurrency keys (issue 11): ``EnqueueKeyed`` sends payloads with ``sluice-concurrency-key`` (a few
keys, so their lines fill), ``SetKeyCap`` gives a key its own cap (0 pauses it) or puts it back on
the default (``key_concurrency``, 1 or 2, drawn per program), and the operator may lower a key's
cap in the middle of a tick (``key_cap``); the crashes, throttles and interleavings reach the park,
the wake-up's sends and the line's advance as they reach every other step.

Lanes (promise 7 of docs/protocol.md): a program in two of eight runs on a stack with ordinary lanes
(``LANE_CONFIGS``: a priority lane beside ``default``, or three lanes of one priority with weights),
and two of eight on one with a fair lane (the ``default`` lane itself, or a fair lane beside a
priority lane and the implied ``default``: keyed and unkeyed payloads, and the operator's caps of
their tenants, ``SetKeyCap`` of ``UNKEYED_TENANT`` among them, go through it under the same faults),
its global MAX drawn as in any program, so that it is sometimes below the sum of the lanes' MAXes and
sometimes above. Its backlog is spread over the lanes; ``Enqueue``, ``EnqueueAwaiting`` and
``EnqueueKeyed`` send to a drawn lane (a payload of the pool sent to two lanes shares one lease);
``SetLaneMax`` sets a lane's MAX, pauses it or puts it back as the operator's command does, or dies
after writing the setting (the next tick puts it in force); the operator may lower a lane's MAX in
the middle of a tick (``lane_max``), and crashes, throttles and interleavings reach the sync of the
lanes' limits (``lane_limit``) as they reach every other step.

There is one rule, ``act``, whose argument is the action. Hypothesis switches separate rules on
and off per example ("swarm testing"), which here mostly produced programs that only enqueue or
only tick; with one rule, the mix below holds in every example, and each action prints readably.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from moto.moto_api._internal import mock_random

from sluice.features.lanes import DEFAULT_LANE
from sluice.runtime import CLIENT_CONFIG
from tests.reliability.world import World
from tests.support.faults import (
    ALL_POINTS,
    ALWAYS,
    STALE_MODES,
    STATS,
    THROTTLE_TARGETS,
    AttemptFaults,
    CrashAt,
    CrashOnCall,
    Fault,
    Interleave,
    StaleList,
    Throttle,
    ThrottleAfter,
    ThrottleCall,
    count,
)
from tests.support.hooks import retry_sleeps
from tests.support.model import canonical_key

# A small pool, so that payloads collide: duplicates, re-submissions and live leases are common.
PAYLOADS: dict[str, dict[str, Any]] = {
    "p0": {"id": "p0"},
    "p1": {"id": "p1", "size": 2},
    "p2": {"id": "p2"},
    "a/b": {"id": "a/b"},  # these two ids look alike once sanitised for an execution name
    "a:b": {"id": "a:b"},
    "hash": {"job": "resize", "width": 640},  # no id: the key is the content hash
}
GROUPS = ("g0", "g1", "g2")
# Awaits, run-once keys and effects (issue 13): waiters await keys of the pool, other waiters,
# effects' keys, and a key never enqueued; effects name keys of their own and of the pool.
WAITERS = ("w0", "w1", "w2")
EFFECT_KEYS = ("fx0", "fx1", "p1", "w0")
AWAITABLE = ("p0", "p1", "p2", "w0", "w1", "fx0", "never-enqueued")
UNUSABLE = {
    "not_json": "this is not JSON",
    "array": "[1, 2, 3]",
    "empty_object": "{}",
    "lone_surrogate": '{"id": "x\\ud800"}',
    "too_deep": '{"a":' * 70 + "1" + "}" * 70,
    "long_id": json.dumps({"id": "x" * 10_000}),
}
# Launcher B's clock against A's: up to an hour either way, the bound docs/protocol.md states.
SKEWS = (0.0, 0.0, 0.0, -3600.0, -900.0, -240.0, -45.0, 45.0, 240.0, 600.0, 900.0, 3600.0)
STATUSES = ("SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED")
INTERLEAVE_POINTS = (
    "after_receive",
    "after_claim",
    "before_start",
    "after_start",
    "after_renew",
    "after_dead_letter",
    "before_delete",
    "after_delete",
    "after_list",
    "after_describe",
    "after_suspect",
    "after_wait",  # a waiter parked, before the launcher reads its awaited keys again
    "after_key_park",  # a message parked in its key's line, before the parker wakes the key
    "after_lane_limit",  # a lane's caps moved to its limit, before the tick admits into the lanes
)
INTERLEAVE_ACTORS = ("tick", "tick", "deliver", "finish_newest", "set_max", "key_cap", "lane_max")
COMPLETION_CRASH_POINTS = (
    "before_release",
    "after_release",
    "before_hand_over",
    "after_hand_over",
    "after_claim",
    "after_renew",
    "after_start",
    "before_delete",
    "after_unpark",
    # awaits and effects: the effects sent before the release, the waiters it wakes
    "before_effect",
    "after_effect",
    "before_wake",
    "after_wake",
    "after_waiter_released",
    "after_unwait",
    # concurrency keys: the wake-up of a released run's line
    "before_key_wake",
    "after_key_wake",
    "after_key_advance",
)
COMPLETION_THROTTLES = (
    "GetItem",
    "release",
    "hand_over",
    "ReceiveMessage",
    "claim",
    "StartExecution",
    "SendMessage",
    "BatchGetItem",
    "UpdateItem",
    "key_advance",
)
# Where the scheduled tick cuts into a completion: its release, and its refill resuming a claim.
COMPLETION_INTERLEAVE_POINTS = (
    "before_release",
    "after_release",
    "before_start",
    "after_renew",
    "after_claim",
)
# AWS failing right after a commit of the keys' line (``throttle_after``): the first call of these
# after the step, e.g. the read of the key a parker's own wake-up makes after its park.
AFTER_STEPS = ("key_park", "key_wake", "key_advance")
AFTER_TARGETS = ("GetItem", "BatchGetItem", "SendMessage", "TransactWriteItems", "DeleteMessageBatch")
# StartExecution with botocore's retries on, per attempt: lost (it reached Step Functions, its
# response did not come back), throttled (refused before it got there) or ok.
ATTEMPT_PLANS = {
    "lost_then_throttled": ("lost", "throttled", "throttled"),
    "lost_then_ok": ("lost", "ok"),
    "lost_every_time": ("lost", "lost", "lost"),
    "throttled_every_time": ("throttled", "throttled", "throttled"),
}
RETENTION_DAYS = 1  # the shortest retention: TTL can delete within one program
HISTORY_RUNS = 9_000  # a key claimed this often before the program starts
# Concurrency keys (issue 11): two keys, payloads of their own and of the pool (a payload sent with
# and without a key, or under both keys), and new ones ("new": an id never sent before), so that
# the keys' lines fill rather than their payloads' leases turning copies away as duplicates.
CKEYS = ("t0", "t1")
KEYED_PAYLOADS = ("k0", "k1", "k2", "new", "new", "new", "p0", "p2")
KEY_CAPS = (0, 1, 2, None)
# The tenant of a fair lane's unkeyed payloads (``lane:<name>``, sluice.features.fair), whose own cap the
# operator may set as any key's: on a stack without a fair lane, ``SetKeyCap`` of it does nothing.
UNKEYED_TENANT = "lane:<fair>"
# Lanes (sluice.features.lanes): half the programs have none; the others a priority lane beside the default
# one (the sum of the lanes' MAXes is 3), three lanes of one priority with weights 2, 1 and 1 (the
# default lane implied, with the global MAX), or a fair lane (sluice.features.fair): the default lane itself,
# or a fair lane beside a priority lane and the implied default one. Keyed payloads in a fair lane
# are its tenants by key, unkeyed ones its tenant ``lane:<name>``.
LANE_CONFIGS = (
    "",
    "",
    "",
    "",
    "fast:1:1,default:2",
    "a:1:0:2,b:2:0:1",
    "default:3:0:1:fair",
    "fast:1:1,shared:2:0:1:fair",
)
LANE_MAXES = (0, 1, 2, 3, None)

# -- the actions ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Enqueue:
    """New messages: (payload or unusable body, group, revised body, with ``sluice-key``)."""

    messages: tuple[tuple[str, str, bool, bool], ...]
    lane: int | None = None  # on a stack with lanes, the lane they go to (an index); None: default


@dataclass(frozen=True)
class EnqueueAgain:
    """An earlier body again, with its deduplication id (SQS may drop it) or as a re-submission."""

    earlier: int
    same_dedup_id: bool


@dataclass(frozen=True)
class Tick:
    """The operator may set MAX, time passes, then a scheduled tick with at most one fault."""

    launcher: str  # A, B (its own clock) or both (two threads)
    wait: int
    fault: tuple[str, str, Any] | None = None  # (crash|throttle|stale|interleave, what, n)
    new_max: int | None = None


@dataclass(frozen=True)
class End:
    """An execution ends; its event arrives now, later (pending), never, or twice."""

    execution: int
    status: str
    delivery: str


@dataclass(frozen=True)
class Deliver:
    """EventBridge delivers a pending event (late, maybe out of order), with a completion fault."""

    event: int
    fault: tuple[str, str, Any] | None = None


@dataclass(frozen=True)
class Lose:
    event: int


@dataclass(frozen=True)
class Redeliver:
    """An event already delivered arrives again."""

    event: int


@dataclass(frozen=True)
class RunningEventLate:
    """The RUNNING event of an execution, after the fact."""

    execution: int


@dataclass(frozen=True)
class Outside:
    """Behind Sluice's back: ``redrive`` an ended execution (FAILED, TIMED_OUT or ABORTED), ``stop``
    a running one by hand (its event then comes as ``delivery`` says), or ``start`` one by hand with
    a name of Sluice's shape."""

    kind: str
    execution: int
    delivery: str = "now"


@dataclass(frozen=True)
class ExpireTTL:
    """A retention period passes (executions keep running); DynamoDB's TTL deletes what expired."""

    days: int = RETENTION_DAYS


@dataclass(frozen=True)
class ResubmitBeforeRelease:
    """An execution ends and its payload is sent again while the status event is still on its way;
    then a tick, the event, or nothing comes first."""

    execution: int
    then: str


@dataclass(frozen=True)
class EnqueueAwaiting:
    """A message that awaits keys (``sluice-awaits``): a waiter's own payload or one of the pool,
    maybe run-once too. Its own key is left out of what it awaits."""

    name: str
    group: str
    awaits: tuple[str, ...]
    once: bool = False
    lane: int | None = None


@dataclass(frozen=True)
class EnqueueKeyed:
    """Payloads sent with ``sluice-concurrency-key``: (payload, group, concurrency key) each."""

    messages: tuple[tuple[str, str, str], ...]
    lane: int | None = None


@dataclass(frozen=True)
class SetKeyCap:
    """The operator gives a concurrency key its own cap (0 pauses it), or None: back on the default;
    then its line is woken (``sluice set-max N --key KEY``)."""

    ckey: str  # or UNKEYED_TENANT: the tenant of the stack's fair lane's unkeyed payloads
    cap: int | None


@dataclass(frozen=True)
class SetLaneMax:
    """The operator sets a lane's MAX (``value``; None: back to the configured MAX) or pauses it, as
    ``sluice set-max N --lane NAME`` (``pause``, ``resume``) does; ``interrupted``: the command dies
    after writing the setting, before it moves the caps. Nothing on a stack without lanes."""

    lane: int
    value: int | None
    paused: bool = False
    interrupted: bool = False


@dataclass(frozen=True)
class EnqueueOnce:
    """A payload of the pool sent with ``sluice-once: true``."""

    name: str
    group: str


@dataclass(frozen=True)
class EndWithEffects:
    """An execution ends SUCCEEDED with an output naming effects: (key, once, awaits) each; its event
    arrives now, later, never, or twice."""

    execution: int
    effects: tuple[tuple[str, bool, tuple[str, ...]], ...]
    delivery: str


MESSAGE = st.tuples(
    st.sampled_from(sorted(PAYLOADS) * 3 + sorted(UNUSABLE)),
    st.sampled_from(GROUPS),
    st.booleans(),
    st.booleans(),
)


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Pick a strategy with the given weights (``st.one_of`` ignores repeats of one strategy)."""
    return st.sampled_from([strategy for weight, strategy in choices for _ in range(weight)]).flatmap(
        lambda strategy: strategy
    )


FAULTS = weighted(
    (2, st.none()),
    (2, st.tuples(st.just("crash"), st.sampled_from(sorted(ALL_POINTS)), st.integers(1, 2))),
    (2, st.tuples(st.just("crash_on_call"), st.sampled_from(("before", "after")), st.integers(1, 8))),
    (1, st.tuples(st.just("throttle"), st.sampled_from(THROTTLE_TARGETS), st.sampled_from((1, 2, ALWAYS)))),
    (1, st.tuples(st.just("throttle_call"), st.just(""), st.integers(1, 14))),
    (1, st.tuples(st.just("throttle_after"), st.sampled_from(AFTER_STEPS), st.sampled_from(AFTER_TARGETS))),
    (1, st.tuples(st.just("stale"), st.sampled_from(STALE_MODES), st.just(0))),
    (
        2,
        st.tuples(
            st.just("interleave"),
            st.sampled_from(INTERLEAVE_POINTS),
            st.sampled_from(INTERLEAVE_ACTORS),
        ),
    ),
    (1, st.tuples(st.just("attempts"), st.sampled_from(sorted(ATTEMPT_PLANS)), st.just(0))),
)
COMPLETION_FAULTS = weighted(
    (2, st.none()),
    (1, st.tuples(st.just("crash"), st.sampled_from(COMPLETION_CRASH_POINTS), st.just(1))),
    (1, st.tuples(st.just("throttle"), st.sampled_from(COMPLETION_THROTTLES), st.sampled_from((1, ALWAYS)))),
    (1, st.tuples(st.just("interleave"), st.sampled_from(COMPLETION_INTERLEAVE_POINTS), st.just("tick"))),
)
INDEX = st.integers(0, 7)  # taken modulo the length of the list it picks from
LANE = weighted((1, st.none()), (2, INDEX))  # a lane of the stack's, or the default one

MESSAGES = st.lists(MESSAGE, min_size=1, max_size=3).map(tuple)
TICK = st.builds(
    Tick,
    launcher=st.sampled_from(("A", "A", "B", "both")),
    wait=st.sampled_from((0, 0, 0, 5, 61, 181, 181, 901)),  # 181 s: in-flight messages return
    fault=FAULTS,
    new_max=weighted((4, st.none()), (1, st.sampled_from((0, 1, 2, 2, 3, 3, 5)))),
)
END = st.builds(
    End,
    execution=INDEX,
    status=st.sampled_from(STATUSES),
    delivery=st.sampled_from(("now", "now", "later", "lost", "twice")),
)
OUTSIDE = st.builds(
    Outside,
    kind=st.sampled_from(("redrive", "redrive", "stop", "start")),
    execution=INDEX,
    delivery=st.sampled_from(("now", "later", "lost")),
)
AWAITING = st.builds(
    EnqueueAwaiting,
    name=st.sampled_from(WAITERS * 2 + ("p2", "hash")),
    group=st.sampled_from(GROUPS),
    awaits=st.lists(st.sampled_from(AWAITABLE), min_size=1, max_size=3, unique=True).map(tuple),
    once=st.sampled_from((False, False, True)),
    lane=LANE,
)
KEYED = st.builds(
    EnqueueKeyed,
    st.lists(
        st.tuples(st.sampled_from(KEYED_PAYLOADS), st.sampled_from(GROUPS), st.sampled_from(CKEYS)),
        min_size=1,
        max_size=4,
    ).map(tuple),
    lane=LANE,
)
LANE_MAX = st.builds(
    SetLaneMax,
    lane=INDEX,
    value=st.sampled_from(LANE_MAXES),
    paused=st.sampled_from((False, False, False, True)),
    interrupted=st.sampled_from((False, False, True)),
)
KEY_CAP = st.builds(SetKeyCap, ckey=st.sampled_from((*CKEYS, UNKEYED_TENANT)), cap=st.sampled_from(KEY_CAPS))
ONCE = st.builds(EnqueueOnce, name=st.sampled_from(sorted(PAYLOADS)), group=st.sampled_from(GROUPS))
EFFECT = st.tuples(
    st.sampled_from(EFFECT_KEYS),
    st.sampled_from((False, False, True)),
    weighted((3, st.just(())), (1, st.lists(st.sampled_from(AWAITABLE), max_size=2, unique=True).map(tuple))),
)
WITH_EFFECTS = st.builds(
    EndWithEffects,
    execution=INDEX,
    effects=st.lists(EFFECT, min_size=1, max_size=3).map(tuple),
    delivery=st.sampled_from(("now", "now", "later", "lost", "twice")),
)
ACTIONS = weighted(
    (3, st.builds(Enqueue, MESSAGES, LANE)),
    (1, st.builds(EnqueueAgain, INDEX, st.booleans())),
    (6, TICK),
    (4, END),
    (2, st.builds(Deliver, INDEX, COMPLETION_FAULTS)),
    (1, st.builds(Lose, INDEX)),
    (1, st.builds(Redeliver, INDEX)),
    (1, st.builds(RunningEventLate, INDEX)),
    (1, OUTSIDE),
    (1, st.builds(ExpireTTL)),
    (1, st.builds(ResubmitBeforeRelease, INDEX, st.sampled_from(("tick", "deliver", "nothing")))),
    # awaits, run-once keys and effects (issue 13)
    (1, AWAITING),
    (1, ONCE),
    (1, WITH_EFFECTS),
    # concurrency keys (issue 11)
    (2, KEYED),
    (1, KEY_CAP),
    # lanes (sluice.features.lanes): nothing on a stack without lanes
    (1, LANE_MAX),
)


def make_faults(spec: tuple[str, str, Any] | None, world: World | None = None) -> list[Fault]:
    if spec is None:
        return []
    kind, what, n = spec
    if kind == "crash":
        return [CrashAt(what, nth=n)]
    if kind == "crash_on_call":
        return [CrashOnCall(n, when=what)]
    if kind == "throttle":
        return [Throttle(what, times=n)]
    if kind == "throttle_call":
        return [ThrottleCall(n)]
    if kind == "throttle_after":
        return [ThrottleAfter(what, n)]
    if kind == "interleave":  # into a completion: the scheduled tick of launcher B
        assert world is not None
        return [Interleave(what, lambda: world.tick("B"))]
    return [StaleList(what)]


def pick(items: list[Any], index: int) -> Any:
    return items[index % len(items)] if items else None


class SluiceMachine(RuleBasedStateMachine):
    # Programs may run on a stack with lanes (LANE_CONFIGS); a focused mix may keep to one queue.
    with_lanes = True

    def __init__(self) -> None:
        super().__init__()
        self.world: World | None = None
        self.failed = False
        self.revision = 0

    @initialize(
        max_concurrency=st.sampled_from((1, 2, 3, 5)),
        skew=st.sampled_from(SKEWS),
        policy=st.sampled_from(("suppress", "suppress", "defer")),
        backlog=st.lists(MESSAGE, min_size=2, max_size=8).map(tuple),
        history=st.sampled_from((0, 0, 0, HISTORY_RUNS)),
        fill=st.sampled_from((1, 1, 1, 4)),
        key_concurrency=st.sampled_from((1, 2)),
        lanes=st.sampled_from(LANE_CONFIGS),
    )
    def build(
        self,
        max_concurrency: int,
        skew: float,
        policy: str,
        backlog: tuple[tuple[str, str, bool, bool], ...],
        history: int = 0,
        fill: int = 1,
        key_concurrency: int = 1,
        lanes: str = "",
    ) -> None:
        """A fresh world, with a backlog queued already, so that the first tick has work, and maybe
        a payload with thousands of earlier runs. Launcher ``R`` is A's twin whose clients retry as
        deployed (botocore's standard mode). ``fill``: the claims and starts a tick keeps in flight
        at once (``SLUICE_START_CONCURRENCY``; 4: on threads). ``key_concurrency``: a concurrency key's
        cap unless it has its own (``SLUICE_KEY_CONCURRENCY``). ``lanes``: the stack parameter
        (``SLUICE_LANES``; empty: no lanes); the backlog is then spread over the lanes."""
        mock_random.seed(0)  # moto's message ids and receipts: the same program replays the same
        lanes = lanes if self.with_lanes else ""
        self.world = World(
            max_concurrency=max_concurrency,
            skew=skew,
            duplicate_policy=policy,
            retention_days=RETENTION_DAYS,
            start_concurrency=fill,
            key_concurrency=key_concurrency,
            lanes=lanes,
        )
        self.world.add_container("R", CLIENT_CONFIG)
        count("examples", counter=STATS)
        if skew:
            count("clock_skew")
        if fill > 1:
            count("parallel_fill")
        if lanes:
            count("lanes:programs")
            count("lanes:programs", counter=STATS)
        if self.world.model.fair_lanes:
            count("lanes:fair programs")
            count("lanes:fair programs", counter=STATS)
        if history:
            self.world.seed_history(canonical_key(json.dumps(PAYLOADS["p0"])), runs=history)
        if lanes:
            for i, message in enumerate(backlog):
                self._Enqueue(Enqueue((message,), lane=i))
        else:
            self._Enqueue(Enqueue(backlog))

    def teardown(self) -> None:
        world, self.world = self.world, None
        if world is None:
            return
        try:
            if not self.failed:
                world.settle()
        finally:
            model = world.model
            count("messages sent", len(model.sent), counter=STATS)
            count("executions started", len(model.starts), counter=STATS)
            count("messages deleted", len(model.deleted), counter=STATS)
            count("messages dead-lettered", len(model.dead_lettered), counter=STATS)
            count("messages parked in a key's line", model.key_parks, counter=STATS)
            count("messages woken from a key's line", model.key_wakes, counter=STATS)
            count("executions claimed in a lane", len(model.lane_of), counter=STATS)
            fair = [n for n, lane in model.lane_of.items() if lane in model.fair_lanes]
            count("executions claimed in a fair lane", len(fair), counter=STATS)
            world.close()

    @invariant()
    def promises_hold(self) -> None:
        if self.world is not None:
            try:
                self.world.check()
            except BaseException:
                self.failed = True
                raise

    @rule(action=ACTIONS)
    def act(self, action: Any) -> None:
        count("steps", counter=STATS)
        count(f"action:{type(action).__name__}", counter=STATS)
        try:
            getattr(self, f"_{type(action).__name__}")(action)
        except BaseException:
            self.failed = True  # teardown must not hide this failure behind another
            raise

    # -- producers ----------------------------------------------------------------------------------

    def _lane(self, index: int | None) -> str:
        """The lane ``index`` picks among the stack's (None, or a stack without lanes: default)."""
        names = self.world.lane_names()
        return DEFAULT_LANE if index is None or not names else pick(names, index)

    def _Enqueue(self, action: Enqueue) -> None:
        lane = self._lane(action.lane)
        for name, group, revised, with_key in action.messages:
            if name in UNUSABLE:
                count(f"unusable:{name}")
                self.world.send(UNUSABLE[name], group=group, valid=False, lane=lane)
                continue
            obj = dict(PAYLOADS[name])
            if revised:
                self.revision += 1
                obj["rev"] = self.revision
            body = json.dumps(obj)
            # With sluice-key, as `sluice enqueue` sends it; without, as the AWS CLI would.
            attributes = {"sluice-key": canonical_key(body)} if with_key else None
            self.world.send(body, group=group, attributes=attributes, lane=lane)

    def _EnqueueAwaiting(self, action: EnqueueAwaiting) -> None:
        obj = dict(PAYLOADS.get(action.name) or {"id": action.name})
        key = canonical_key(json.dumps(obj))
        awaits = [k for k in action.awaits if k != key]
        if not awaits:
            return
        count("enqueue:awaiting")
        count(f"enqueue:awaiting:{len(awaits)}_keys")
        if "never-enqueued" in awaits:
            count("enqueue:awaiting_a_key_never_enqueued")
        attributes = {"sluice-key": key, "sluice-awaits": json.dumps(awaits)}
        if action.once:
            attributes["sluice-once"] = "true"
        self.world.send(
            json.dumps(obj), group=action.group, attributes=attributes, lane=self._lane(action.lane)
        )

    def _EnqueueKeyed(self, action: EnqueueKeyed) -> None:
        for name, group, ckey in action.messages:
            count("enqueue:keyed")
            if name == "new":
                self.revision += 1
                name = f"k-new-{self.revision}"
            body = json.dumps(PAYLOADS.get(name) or {"id": name})
            self.world.send(
                body, group=group, attributes={"sluice-concurrency-key": ckey}, lane=self._lane(action.lane)
            )

    def _SetKeyCap(self, action: SetKeyCap) -> None:
        ckey = action.ckey
        if ckey == UNKEYED_TENANT:
            fair = sorted(self.world.model.fair_lanes)
            if not fair:
                return
            ckey = f"lane:{fair[0]}"
            count("key_cap:unkeyed_tenant")
        self.world.set_key_cap(ckey, action.cap)

    def _SetLaneMax(self, action: SetLaneMax) -> None:
        names = self.world.lane_names()
        if names:
            self.world.set_lane_max(
                pick(names, action.lane),
                action.value,
                paused=action.paused,
                by="setting" if action.interrupted else "cli",
            )

    def _EnqueueOnce(self, action: EnqueueOnce) -> None:
        count("enqueue:once")
        body = json.dumps(PAYLOADS[action.name])
        self.world.send(
            body, group=action.group, attributes={"sluice-key": canonical_key(body), "sluice-once": "true"}
        )

    def _EndWithEffects(self, action: EndWithEffects) -> None:
        name = pick(self._running(), action.execution)
        if name is None:
            return
        effects: list[dict[str, Any]] = []
        for key, once, awaits in action.effects:
            effect: dict[str, Any] = {"payload": {"id": key, "effect": len(effects)}}
            if once:
                effect["once"] = True
            if [k for k in awaits if k != key]:
                effect["awaits"] = [k for k in awaits if k != key]
            effects.append(effect)
        self._deliver(self.world.end(name, "SUCCEEDED", effects=effects), action.delivery)

    def _EnqueueAgain(self, action: EnqueueAgain) -> None:
        earlier = pick(list(self.world.model.sent.values()), action.earlier)
        if earlier is None:
            return
        count("enqueue:duplicate" if action.same_dedup_id else "enqueue:resubmission")
        self.world.send(
            earlier.body,
            group=earlier.group,
            valid=earlier.valid,
            dedup=earlier.dedup if action.same_dedup_id else None,
            attributes=earlier.attributes or None,
            lane=earlier.lane or DEFAULT_LANE,
        )

    # -- launchers, time and the operator ------------------------------------------------------------

    def _Tick(self, action: Tick) -> None:
        if action.new_max is not None:
            self.world.set_max(action.new_max)
        if action.wait:
            self.world.advance(action.wait)
        if action.launcher == "both":
            self.world.ticks_at_once(("A", "B"))
        elif action.fault is not None and action.fault[0] == "interleave":
            self.world.tick_interleaved(action.launcher, action.fault[1], action.fault[2])
        elif action.fault is not None and action.fault[0] == "attempts":
            # Launcher R, whose clients retry: botocore's backoff is recorded, not slept.
            attempts = AttemptFaults("StartExecution", ATTEMPT_PLANS[action.fault[1]])
            with retry_sleeps():
                self.world.tick("R", [attempts])
        else:
            self.world.tick(action.launcher, make_faults(action.fault))

    # -- Step Functions and EventBridge -----------------------------------------------------------------

    def _running(self) -> list[str]:
        """RUNNING executions, Sluice's in the order they started, then those started by hand."""
        model = self.world.model
        ours = [s.name for s in model.starts if s.name in model.running]
        return ours + sorted(set(model.running) - set(ours))

    def _End(self, action: End) -> None:
        world = self.world
        name = pick(self._running(), action.execution)
        if name is None:
            return
        self._deliver(world.end(name, action.status), action.delivery)

    def _deliver(self, event: Any, delivery: str) -> None:
        world = self.world
        index = world.pending.index(event)
        if delivery == "lost":
            world.lose(index)
        elif delivery in ("now", "twice") and world.deliver(index) == "ok" and delivery == "twice":
            world.redeliver(len(world.delivered) - 1)

    def _Deliver(self, action: Deliver) -> None:
        if self.world.pending:
            self.world.deliver(action.event % len(self.world.pending), make_faults(action.fault, self.world))

    def _Lose(self, action: Lose) -> None:
        if self.world.pending:
            self.world.lose(action.event % len(self.world.pending))

    def _Redeliver(self, action: Redeliver) -> None:
        if self.world.delivered:
            self.world.redeliver(action.event % len(self.world.delivered))

    def _RunningEventLate(self, action: RunningEventLate) -> None:
        name = pick([s.name for s in self.world.model.starts], action.execution)
        if name is not None:
            self.world.deliver_running_event(name)

    # -- behind Sluice's back -------------------------------------------------------------------------

    def _Outside(self, action: Outside) -> None:
        world = self.world
        if action.kind == "start":
            world.start_by_hand(pick(sorted(PAYLOADS), action.execution))
        elif action.kind == "stop":
            name = pick([n for n in self._running() if n not in world.model.outside], action.execution)
            if name is not None:
                self._deliver(world.stop_by_hand(name), action.delivery)
        else:
            ended = world.redrivable()
            name = pick([n for n in ended if n not in world.model.running], action.execution)
            if name is not None:
                world.redrive(name)

    def _ExpireTTL(self, action: ExpireTTL) -> None:
        self.world.advance(action.days * 86_400 + 1)
        self.world.expire_ttl()

    def _ResubmitBeforeRelease(self, action: ResubmitBeforeRelease) -> None:
        world = self.world
        start = pick([s for s in world.model.starts if s.name in world.model.running], action.execution)
        earlier = world.model.sent.get(start.message_id or "") if start else None
        if earlier is None:
            return
        count("resubmit:before_release")
        event = world.end(start.name, "SUCCEEDED")
        world.send(
            earlier.body,
            group=earlier.group,
            attributes=earlier.attributes or None,
            lane=earlier.lane or DEFAULT_LANE,
        )
        if action.then == "tick":
            world.tick("A")
        elif action.then == "deliver":
            world.deliver(world.pending.index(event))

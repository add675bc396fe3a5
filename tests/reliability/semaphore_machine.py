"""The semaphore step's stateful property suite: Hypothesis drives workflows through the semaphore
function (tests/reliability/semaphore_world.py) and checks its promises after every action.

As in tests/reliability/machine.py there is one rule, ``act``, whose argument is the action, so that
every example mixes every kind of action. The actions:

- ``Acquire``: an execution (a new one, or one that may hold a permit of the other semaphore, or of
  the same one under another acquisition id) enters the Acquire task; ``AcquireAgain``: the task is
  invoked again, with its token or a new one (the task retried);
- ``Release``: the Release state (after the section, or the error path after the Acquire task
  failed or timed out); ``ReleaseAgain``: a repeated or late release, or one of an acquisition that
  was never made;
- ``TimeOut``: a waiter's token times out; then the Catch releases, the task is retried, or nothing;
- ``End``: the execution ends by any path; its status-change event comes now, later, twice or never;
  ``Deliver`` / ``Redeliver``: a late event, or one already delivered;
- ``SetLimit``: the operator lowers or raises a limit; ``Sweep``: the scheduled reconciliation;
  ``Advance``: time passes (past the delivery grace, or not), maybe with a hand-off;
- ``Quiesce``: the world is brought to rest and the promises at rest are checked.

Most invocations carry a crash at a protocol step: between the grant's record and the permit's
claim, between the claim and SendTaskSuccess, after SendTaskSuccess, between a release's two writes,
in the middle of the line's bookkeeping.

After every action (``SemaphoreWorld.check``): never more holders than the limit (after a lowering,
no new grant until fewer than the new limit hold); every execution inside the section holds its
permit (a repeated release, a late event, another execution's end never frees it); no holder holds
two permits; a waiter granted had no live waiter ahead of it (FIFO among live waiters). After a sweep:
no permit is held by an ended execution. At rest (``quiesce``, and ``settle`` at the end): no live
waiter waits while a permit is free; everything ended frees everything; every permit works again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.reliability.machine import weighted
from tests.reliability.promises import PromiseBroken
from tests.reliability.semaphore_world import (
    SEMAPHORES,
    STEPS,
    TERMINAL,
    SemaphoreWorld,
)
from tests.support.faults import STATS, count

ACQUISITION_IDS = ("one", "two")
MAX_EXECUTIONS = 10
# The steps where the races live (lib/sluice/semaphore/step.py), drawn more often: the grant's record, the
# permit's claim, SendTaskSuccess and its record, a release's two writes.
RACES = ("grant", "claim", "send", "send", "delivered", "end", "free")
Fault = tuple[str, str, int] | None


@dataclass(frozen=True)
class Acquire:
    execution: int  # an index into the running executions; past their end: a new execution
    semaphore: str
    acquisition: str
    container: int
    fault: Fault = None


@dataclass(frozen=True)
class AcquireAgain:
    """The Acquire task of a waiting, failed or timed-out acquisition is invoked again."""

    index: int
    new_token: bool
    container: int
    fault: Fault = None


@dataclass(frozen=True)
class Release:
    """The Release state of an execution inside the section, or the error path of a failed Acquire."""

    index: int
    container: int
    fault: Fault = None


@dataclass(frozen=True)
class ReleaseAgain:
    """A release that comes again, late, or for an acquisition that was never made."""

    index: int
    stranger: bool
    container: int


@dataclass(frozen=True)
class TimeOut:
    index: int
    then: str  # catch (the error path releases), retry (a new token), nothing
    container: int


@dataclass(frozen=True)
class End:
    execution: int
    status: str
    delivery: str  # now, later, lost, twice
    container: int
    fault: Fault = None


@dataclass(frozen=True)
class Deliver:
    event: int
    container: int
    fault: Fault = None


@dataclass(frozen=True)
class Redeliver:
    event: int
    container: int


@dataclass(frozen=True)
class SetLimit:
    semaphore: str
    limit: int
    container: int
    fault: Fault = None


@dataclass(frozen=True)
class Sweep:
    container: int
    fault: Fault = None


@dataclass(frozen=True)
class Advance:
    seconds: int
    hand_off: bool
    container: int


@dataclass(frozen=True)
class Quiesce:
    pass


CONTAINER = st.integers(0, 2)
INDEX = st.integers(0, 7)
FAULTS = weighted(
    (3, st.none()),
    (3, st.tuples(st.sampled_from(STEPS + RACES), st.sampled_from(("before", "after")), st.integers(1, 2))),
)
ACTIONS = weighted(
    (
        6,
        st.builds(
            Acquire,
            st.integers(0, 9),
            st.sampled_from(SEMAPHORES),
            st.sampled_from(ACQUISITION_IDS),
            CONTAINER,
            FAULTS,
        ),
    ),
    (2, st.builds(AcquireAgain, INDEX, st.booleans(), CONTAINER, FAULTS)),
    (5, st.builds(Release, INDEX, CONTAINER, FAULTS)),
    (1, st.builds(ReleaseAgain, INDEX, st.booleans(), CONTAINER)),
    (2, st.builds(TimeOut, INDEX, st.sampled_from(("catch", "retry", "nothing")), CONTAINER)),
    (
        3,
        st.builds(
            End,
            INDEX,
            st.sampled_from(TERMINAL),
            st.sampled_from(("now", "now", "later", "lost", "twice")),
            CONTAINER,
            FAULTS,
        ),
    ),
    (2, st.builds(Deliver, INDEX, CONTAINER, FAULTS)),
    (1, st.builds(Redeliver, INDEX, CONTAINER)),
    (
        2,
        st.builds(
            SetLimit, st.sampled_from(SEMAPHORES), st.sampled_from((0, 1, 1, 2, 3, 4)), CONTAINER, FAULTS
        ),
    ),
    (1, st.builds(Sweep, CONTAINER, FAULTS)),
    (2, st.builds(Advance, st.sampled_from((1, 30, 61, 61)), st.booleans(), CONTAINER)),
    (1, st.just(Quiesce())),
)


def pick(items: list[Any], index: int) -> Any:
    return items[index % len(items)] if items else None


class SemaphoreMachine(RuleBasedStateMachine):
    backend = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.world: SemaphoreWorld | None = None
        self.failed = False
        self.made = 0

    @initialize(limit_a=st.sampled_from((1, 2, 3)), limit_b=st.sampled_from((1, 2)))
    def build(self, limit_a: int, limit_b: int) -> None:
        self.world = SemaphoreWorld(self.backend, {"a": limit_a, "b": limit_b})
        count("examples", counter=STATS)

    def teardown(self) -> None:
        world, self.world = self.world, None
        if world is None:
            return
        try:
            if not self.failed:
                world.settle(self._new_name)
        finally:
            world.close()

    def _new_name(self) -> str:
        self.made += 1
        return f"e{self.made}"

    @invariant()
    def promises_hold(self) -> None:
        if self.world is not None and self.world.broken:
            self.failed = True
            raise PromiseBroken("\n".join(self.world.broken))

    @rule(action=ACTIONS)
    def act(self, action: Any) -> None:
        count("steps", counter=STATS)
        count(f"action:semaphore {type(action).__name__}", counter=STATS)
        try:
            getattr(self, f"_{type(action).__name__}")(action)
        except BaseException:
            self.failed = True
            raise

    # -- the workflows ------------------------------------------------------------------------------

    def _running(self) -> list[str]:
        return [n for n, status in self.world.executions.items() if status == "RUNNING"]

    def _in(self, *phases: str) -> list[Any]:
        return [a for a in self.world.acqs.values() if a.phase in phases and self.world.running(a.execution)]

    def _Acquire(self, action: Acquire) -> None:
        world = self.world
        running = self._running()
        if action.execution >= len(running) and self.made < MAX_EXECUTIONS:
            name = self._new_name()
            world.start(name)
        else:
            name = pick(running, action.execution)
            if name is None:
                return
        acq = world.acq(name, action.semaphore, action.acquisition)
        if acq.phase in ("waiting", "inside", "failed", "timed_out"):
            return  # busy with this acquisition: AcquireAgain and Release deal with it
        world.acquire(action.container, acq, new_token=True, fault=action.fault)

    def _AcquireAgain(self, action: AcquireAgain) -> None:
        acq = pick(self._in("waiting", "failed", "timed_out"), action.index)
        if acq is None:
            return
        again = action.new_token or acq.phase != "waiting"  # a closed token is never used again
        count("semaphore acquire again" + (" with a new token" if again else ""))
        self.world.acquire(action.container, acq, new_token=again, fault=action.fault)

    def _Release(self, action: Release) -> None:
        acq = pick(self._in("inside", "failed", "timed_out"), action.index)
        if acq is not None:
            self.world.release(action.container, acq, action.fault)

    def _ReleaseAgain(self, action: ReleaseAgain) -> None:
        world = self.world
        if action.stranger:  # an acquisition id nobody acquired, of any execution
            name = pick(sorted(world.executions), action.index)
            if name is not None:
                world.invoke(action.container, world.request("release", world.acq(name, "a", "never")))
            return
        acq = pick([a for a in world.acqs.values() if a.phase in ("left", "done")], action.index)
        if acq is not None:
            count("semaphore release again")
            world.invoke(action.container, world.request("release", acq))

    def _TimeOut(self, action: TimeOut) -> None:
        acq = pick(self._in("waiting"), action.index)
        if acq is None:
            return
        self.world.time_out(acq)
        if action.then == "catch":
            self.world.release(action.container, acq)
        elif action.then == "retry":
            self.world.acquire(action.container, acq, new_token=True)

    def _End(self, action: End) -> None:
        world = self.world
        name = pick(self._running(), action.execution)
        if name is None:
            return
        event = world.end(name, action.status)
        if action.delivery == "later":
            world.pending.append(event)
        elif action.delivery in ("now", "twice"):
            world.delivered.append(event)
            if (
                world.invoke(action.container, event, action.fault) != "crashed"
                and action.delivery == "twice"
            ):
                world.invoke(action.container + 1, event)
        else:
            count("semaphore event lost")

    def _Deliver(self, action: Deliver) -> None:
        if self.world.pending:
            self.world.deliver(action.event % len(self.world.pending), action.container, action.fault)

    def _Redeliver(self, action: Redeliver) -> None:
        event = pick(self.world.delivered, action.event)
        if event is not None:
            self.world.invoke(action.container, event)

    # -- the operator, the schedule, time ------------------------------------------------------------

    def _SetLimit(self, action: SetLimit) -> None:
        self.world.set_limit(action.container, action.semaphore, action.limit, action.fault)

    def _Sweep(self, action: Sweep) -> None:
        self.world.sweep(action.container, action.fault)

    def _Advance(self, action: Advance) -> None:
        self.world.clock.advance(action.seconds)
        if action.hand_off:
            for sem in SEMAPHORES:
                self.world.hand_off(action.container, sem)

    def _Quiesce(self, action: Quiesce) -> None:
        self.world.quiesce()


class MemorySemaphoreMachine(SemaphoreMachine):
    backend = "memory"


class DynamoSemaphoreMachine(SemaphoreMachine):
    backend = "dynamodb"

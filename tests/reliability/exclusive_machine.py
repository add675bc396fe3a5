"""``@exclusive`` under expiring locks: a stateful property test of up to 16 concurrent invocations.

Each invocation of the decorated handler runs in a thread of its own, as Lambda runs it in a
container of its own; the machine moves one at a time, so a program replays exactly. An invocation
is started with its remaining time (its deadline) and its clock's skew from real time (within the
documented bound: two clocks differ by less than ``margin``), and raises ``Busy`` at once or waits
(``on_busy="wait"``: its backoff sleep is the machine's ``Poll``). Inside the function it stays until
the machine finishes it: it returns, raises, or returns while its release is slow to reach the table
(the request lands later, ``Land``). Time is a ``FakeClock`` that only ``Advance`` moves; an
invocation whose deadline passes is killed there, as Lambda kills it (nothing released).

Some invocations run outside Lambda (``exclusive.hold`` with ``ttl`` = their remaining time): the
run must end ``ttl`` after its acquire's request (the clock reading the lease is dated with), so it
is killed there once inside, and never while it waits. Some get their acquire's answer late: the
write has landed, and the answer waits for ``Land`` while time passes and others act.

After every action:

- never more invocations inside the function than ``limit`` (1: a mutex), and the table names each of
  them as a holder of the key (a late release never freed a lease that is someone else's);
- every ``Busy`` named a holder whose lock had not expired by the refused invocation's own clock (a
  lock expires with its invocation: deadline + margin).

At the end every lock is given back or expires, and a new invocation gets in.
"""

from __future__ import annotations

import math
import queue
import random
import threading
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from sluice.adapters.dynamo.lease import DynamoLeases
from sluice.adapters.dynamo.store import create_table
from sluice.adapters.memory.lease import MemoryLeases
from sluice.concurrency import Busy, exclusive
from sluice.core.clock import FakeClock
from tests.reliability.machine import weighted
from tests.reliability.promises import PromiseBroken
from tests.support.aws import NO_RETRY, REGION, LambdaContext
from tests.support.faults import STATS, count
from tests.support.hooks import Crash

TABLE = "exclusive-properties"
SCOPE = "orders"
KEY = "o-1"
MARGIN = 5.0
CONCURRENT = 16
MAX_INVOCATIONS = 40
# Each clock's offset from real time: any two differ by less than MARGIN (docs/concurrency.md).
SKEWS = (0.0, 0.0, -2.4, -1.0, -0.5, 0.5, 1.0, 2.4)
REPORT_TIMEOUT = 60.0

_local = threading.local()


class Failed(Exception):
    """What the function raises when the machine says so."""


@dataclass
class Invocation:
    number: int
    remaining: float
    skew: float
    started_at: float  # real time
    waits: bool
    phase: str = "starting"  # inside, waiting, releasing, done
    commands: queue.Queue[str] = field(default_factory=queue.Queue)
    reports: queue.Queue[tuple[str, Any]] = field(default_factory=queue.Queue)
    slow_release: bool = False
    thread: threading.Thread | None = None
    outside: bool = False  # exclusive.hold(ttl=remaining), not a Lambda handler
    late: bool = False  # its acquire's answer waits for Land
    ends_at: float | None = None  # outside Lambda: when its run must end (real time), once inside

    @property
    def holder(self) -> str:
        return f"request-{self.number}"

    @property
    def deadline(self) -> float:
        """When Lambda kills it, in real time; outside Lambda, when its run must end, known once it is
        inside (``ttl`` from its acquire's request), never while it waits."""
        if not self.outside:
            return self.started_at + self.remaining
        return self.ends_at if self.ends_at is not None else math.inf


class SkewedClock:
    """Each invocation's own clock: real time plus the skew of the thread's invocation."""

    def __init__(self, real: FakeClock) -> None:
        self.real = real

    def now(self) -> float:
        invocation = getattr(_local, "invocation", None)
        return self.real.now() + (invocation.skew if invocation else 0.0)


def _wait_for_command() -> str:
    return _local.invocation.commands.get(timeout=REPORT_TIMEOUT)


def body(event: Any, context: Any) -> str:
    invocation: Invocation = _local.invocation
    invocation.reports.put(("inside", None))
    command = _wait_for_command()
    if command == "kill":
        raise Crash("Task timed out")
    if command == "raise":
        raise Failed("the run failed")
    invocation.slow_release = command == "slow"
    return "ok"


def backoff(seconds: float) -> None:
    """The injected sleep of ``on_busy="wait"``: the machine decides when it tries again."""
    _local.invocation.reports.put(("waiting", seconds))
    if _wait_for_command() == "kill":
        raise Crash("Task timed out")


class SlowAnswers:
    """The leases as the decorator reaches them: a release marked slow waits before it is sent; an
    acquire marked late has landed, and its answer waits."""

    def __init__(self, leases: Any) -> None:
        self.leases = leases

    def __getattr__(self, name: str) -> Any:
        return getattr(self.leases, name)

    def acquire(self, *args: Any, **kwargs: Any) -> Any:
        lease = self.leases.acquire(*args, **kwargs)
        invocation = getattr(_local, "invocation", None)
        if invocation is not None and invocation.late:
            invocation.late = False  # one late answer an invocation
            invocation.reports.put(("answering", None))
            if _wait_for_command() == "kill":
                raise Crash("Task timed out")
        return lease

    def release(self, lease: Any, **kwargs: Any) -> bool:
        invocation = getattr(_local, "invocation", None)
        if invocation is not None and invocation.slow_release:
            invocation.reports.put(("releasing", None))
            _wait_for_command()
        return self.leases.release(lease, **kwargs)


_CLIENT: list[Any] = []


def moto_client() -> Any:
    if not _CLIENT:
        import boto3

        _CLIENT.append(boto3.session.Session(region_name=REGION).client("dynamodb", config=NO_RETRY))
    return _CLIENT[0]


@dataclass(frozen=True)
class Invoke:
    remaining: int
    skew: float
    waits: bool
    outside: bool = False
    late: bool = False


@dataclass(frozen=True)
class Finish:
    index: int
    how: str  # return, raise, slow (returns; its release lands later)


@dataclass(frozen=True)
class Poll:
    index: int


@dataclass(frozen=True)
class Land:
    index: int


@dataclass(frozen=True)
class Advance:
    seconds: float


@dataclass(frozen=True)
class Until:
    """Time passes until ``offset`` seconds from an invocation's deadline (its lock's expiry is the
    deadline + margin by its own clock): the instants where an expiry is misjudged."""

    index: int
    offset: float


ACTIONS = weighted(
    (
        5,
        st.builds(
            Invoke,
            st.sampled_from((10, 30, 60)),
            st.sampled_from(SKEWS),
            st.booleans(),
            st.sampled_from((False, False, True)),
            st.sampled_from((False, False, True)),
        ),
    ),
    (3, st.builds(Finish, st.integers(0, 15), st.sampled_from(("return", "raise", "slow", "slow")))),
    (2, st.builds(Poll, st.integers(0, 15))),
    (1, st.builds(Land, st.integers(0, 15))),
    (2, st.builds(Advance, st.sampled_from((0.5, 2.0, 5.0, 15.0, 35.0, 61.0)))),
    (2, st.builds(Until, st.integers(0, 15), st.sampled_from((-4.9, -2.5, -0.01, 0.0, 2.5, 4.99, 5.0, 7.5)))),
)


class ExclusiveMachine(RuleBasedStateMachine):
    backend = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.invocations: list[Invocation] = []
        self.real = FakeClock()
        self._exit: Any = None
        self.failed = False

    @initialize(limit=st.sampled_from((1, 1, 1, 2)))
    def build(self, limit: int) -> None:
        self.limit = limit
        if self.backend == "memory":
            leases: Any = MemoryLeases(rng=random.Random(0))
        else:
            from contextlib import ExitStack

            from moto import mock_aws

            self._exit = ExitStack()
            self._exit.enter_context(mock_aws())
            create_table(moto_client(), TABLE)
            leases = DynamoLeases(moto_client(), TABLE, rng=random.Random(0), sleep=lambda _s: None)
        self.leases = leases
        clock = SkewedClock(self.real)
        options = dict(name=SCOPE, limit=limit, leases=SlowAnswers(leases), clock=clock, margin=MARGIN)
        self.handlers = {
            False: exclusive("orderId", **options)(body),
            True: exclusive("orderId", on_busy="wait", sleep=backoff, rng=random.Random(1), **options)(body),
        }
        hold_options = {k: v for k, v in options.items() if k != "name"}
        self.holds = {
            False: lambda i: exclusive.hold(SCOPE, KEY, ttl=i.remaining, holder=i.holder, **hold_options),
            True: lambda i: exclusive.hold(
                SCOPE,
                KEY,
                ttl=i.remaining,
                holder=i.holder,
                on_busy="wait",
                sleep=backoff,
                rng=random.Random(1),
                **hold_options,
            ),
        }
        count("examples", counter=STATS)

    def teardown(self) -> None:
        try:
            if not self.failed:
                self._settle()
        finally:
            for invocation in self.invocations:
                if invocation.phase != "done":
                    invocation.commands.put("kill")
            for invocation in self.invocations:
                if invocation.thread is not None:
                    invocation.thread.join(timeout=REPORT_TIMEOUT)
            if self._exit is not None:
                self._exit.close()

    def _settle(self) -> None:
        """Everyone finishes or is killed, every slow release lands; once every lock has expired by
        every clock, an invocation gets in."""
        for invocation in self._in("answering"):
            self._command(invocation, "land")
        for invocation in self._in("inside"):
            self._command(invocation, "return")
        for invocation in self._in("releasing"):
            self._command(invocation, "land")
        self._advance(max([60.0 + MARGIN + 5.0, *(i.remaining + MARGIN + 5.0 for i in self.invocations)]))
        last = self._invoke(Invoke(30, 0.0, False))
        if last.phase != "inside":
            raise PromiseBroken(f"after every lock expired, a new invocation was refused: {last.phase}")
        self._command(last, "return")
        self.check()

    # -- driving the invocations --------------------------------------------------------------------

    def _in(self, *phases: str) -> list[Invocation]:
        return [i for i in self.invocations if i.phase in phases]

    def _run(self, invocation: Invocation) -> None:
        _local.invocation = invocation
        context = LambdaContext(
            remaining_ms=int(invocation.remaining * 1000), aws_request_id=invocation.holder
        )
        try:
            if invocation.outside:
                with self.holds[invocation.waits](invocation):
                    body(None, None)
            else:
                self.handlers[invocation.waits]({"orderId": KEY}, context)
            invocation.reports.put(("done", "returned"))
        except Busy as busy:
            invocation.reports.put(("busy", (busy, self.real.now() + invocation.skew)))
        except Failed:
            invocation.reports.put(("done", "raised"))
        except Crash:
            invocation.reports.put(("done", "killed"))
        except BaseException as exc:
            invocation.reports.put(("error", exc))

    def _await(self, invocation: Invocation) -> None:
        """Until the invocation is inside, waiting, releasing, or done."""
        kind, detail = invocation.reports.get(timeout=REPORT_TIMEOUT)
        if kind == "error":
            raise detail
        if kind == "busy":
            busy, now = detail
            count("exclusive busy")
            expired = [h for h in busy.holders if h.expires_at <= now]
            if expired:
                raise PromiseBroken(
                    f"{invocation.holder} was refused at {now} by lock(s) expired by its clock: {expired}"
                )
            invocation.phase = "done"
            return
        invocation.phase = "done" if kind == "done" else kind
        if kind == "inside":
            count("exclusive entered")
            if invocation.outside:
                count("exclusive entered outside Lambda")
                held = [
                    s for s in self.leases.inspect(SCOPE, KEY, self.limit) if s.holder == invocation.holder
                ]
                if held:  # its run ends ttl after the reading its lease is dated with (its own clock)
                    invocation.ends_at = held[0].acquired_at - invocation.skew + invocation.remaining
        if kind == "answering":
            count("exclusive late answer")

    def _invoke(self, action: Invoke) -> Invocation:
        invocation = Invocation(
            len(self.invocations), float(action.remaining), action.skew, self.real.now(), action.waits
        )
        invocation.outside, invocation.late = action.outside, action.late
        self.invocations.append(invocation)
        invocation.thread = threading.Thread(target=self._run, args=(invocation,), daemon=True)
        invocation.thread.start()
        self._await(invocation)
        return invocation

    def _command(self, invocation: Invocation, command: str) -> None:
        invocation.commands.put(command)
        self._await(invocation)

    def _advance(self, seconds: float) -> None:
        """Time passes; Lambda kills every invocation whose deadline it reached (no release runs).
        A release already on its way still lands."""
        self.real.advance(seconds)
        for invocation in self._in("inside", "waiting", "answering"):
            if invocation.deadline <= self.real.now():
                count("exclusive killed at its deadline")
                self._command(invocation, "kill")

    # -- the rule -----------------------------------------------------------------------------------

    @rule(action=ACTIONS)
    def act(self, action: Any) -> None:
        count("steps", counter=STATS)
        count(f"action:exclusive {type(action).__name__}", counter=STATS)
        try:
            self._act(action)
            self.check()
        except BaseException:
            self.failed = True
            raise

    def _act(self, action: Any) -> None:
        if isinstance(action, Invoke):
            if len(self._in("starting", "inside", "waiting", "releasing")) < CONCURRENT and (
                len(self.invocations) < MAX_INVOCATIONS
            ):
                self._invoke(action)
        elif isinstance(action, Finish):
            inside = self._in("inside")
            if inside:
                self._command(inside[action.index % len(inside)], action.how)
        elif isinstance(action, Poll):
            waiting = self._in("waiting")
            if waiting:
                self._command(waiting[action.index % len(waiting)], "retry")
        elif isinstance(action, Land):
            landing = self._in("releasing", "answering")
            if landing:
                chosen = landing[action.index % len(landing)]
                count(f"exclusive {'late release' if chosen.phase == 'releasing' else 'answer landed'}")
                self._command(chosen, "land")
        elif isinstance(action, Until):
            alive = [
                i for i in self._in("inside", "waiting", "releasing", "answering") if i.deadline < math.inf
            ]
            if alive:
                target = alive[action.index % len(alive)].deadline + action.offset
                if target > self.real.now():
                    self._advance(target - self.real.now())
        else:
            self._advance(action.seconds)

    def check(self) -> None:
        inside = self._in("inside")
        if len(inside) > self.limit:
            raise PromiseBroken(
                f"{len(inside)} invocations inside at once with limit {self.limit}: {[i.holder for i in inside]}"
            )
        held = {item.holder for item in self.leases.inspect(SCOPE, KEY, self.limit)}
        lost = [i.holder for i in inside if i.holder not in held]
        if lost:
            raise PromiseBroken(
                f"{lost} run inside, and the table says {sorted(map(str, held))} hold the key"
            )


class MemoryExclusiveMachine(ExclusiveMachine):
    backend = "memory"


class DynamoExclusiveMachine(ExclusiveMachine):
    backend = "dynamodb"

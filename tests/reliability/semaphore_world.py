"""The world the semaphore's property suite runs in (tests/reliability/semaphore_machine.py).

Step Functions is played by ``MemoryTokens`` (executions, their task tokens, every answer sent), time
by a ``FakeClock``, EventBridge by the world (status-change events delivered now, later, twice or
never). The semaphore function runs as deployed: ``SemaphoreService.handle`` on the events the
Acquire and Release tasks, the status-change rule and the sweep schedule send, in three warm
containers on one store: ``MemorySemaphoreStore``, or ``DynamoSemaphoreStore`` on moto's DynamoDB
(each container with its own client, as Lambda containers have).

A crash (``Crash``, a ``BaseException``) stops a container at a step of the protocol, before or after
it: on moto from botocore ``before-call`` / ``after-call`` hooks on that container's client, the step
named by the request (``dynamo_step``); on the memory store from a proxy around the store's methods.
SendTaskSuccess (``send``) is wrapped the same way on both. Nothing of Sluice is edited.

After every action ``check`` compares what the table and Step Functions show with what the
semaphore promises; ``quiesce`` and ``settle`` check what holds at rest.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from sluice.adapters.dynamo.semaphore import DynamoSemaphoreStore
from sluice.adapters.dynamo.store import create_table
from sluice.adapters.memory.semaphore import MemorySemaphoreStore, MemoryTokens
from sluice.core.clock import FakeClock
from sluice.primitives.slots import Occupancy
from sluice.semaphore.model import Acquisition, Delivery, State, holder_name, pool_of
from sluice.semaphore.service import SemaphoreService
from sluice.semaphore.step import DELIVERY_GRACE, Semaphores
from tests.reliability.promises import PromiseBroken
from tests.support.aws import NO_RETRY, REGION, status_change_event
from tests.support.faults import STATS, count
from tests.support.hooks import Crash

MACHINE = "arn:aws:states:us-east-1:123456789012:stateMachine:held"
TABLE = "semaphore-properties"
SEMAPHORES = ("a", "b")
CONTAINERS = 3
PER_SHARD = 2  # permits spread over several slot items
STEPS = (
    "take_ticket",
    "open",
    "refresh",
    "grant",
    "claim",
    "ungrant",
    "take_over",
    "send",
    "delivered",
    "end",
    "free",
    "advance",
)
TERMINAL = ("SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED")


def arn(execution: str) -> str:
    return MACHINE.replace(":stateMachine:", ":execution:") + f":{execution}"


# -- crashes at protocol steps ---------------------------------------------------------------------


class Crasher:
    """One container's armed crash: at the ``nth`` call of ``step`` in this action, before or after it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.armed: tuple[str, str, int] | None = None
        self.seen = 0
        self.fired = False

    def arm(self, fault: tuple[str, str, int] | None) -> None:
        self.armed, self.seen, self.fired = fault, 0, False

    def before(self, step: str | None) -> None:
        if self.armed is None or step != self.armed[0] or self.fired:
            return
        self.seen += 1
        if self.armed[1] == "before" and self.seen == self.armed[2]:
            self._fire()

    def after(self, step: str | None) -> None:
        if self.armed is None or step != self.armed[0] or self.fired:
            return
        if self.armed[1] == "after" and self.seen == self.armed[2]:
            self._fire()

    def _fire(self) -> None:
        self.fired = True
        count(f"semaphore crash {self.armed[1]} {self.armed[0]}")
        raise Crash(f"container {self.name} stopped {self.armed[1]} {self.armed[0]}")


_SEMA_UPDATES = (
    ("SET #state = :granted", "grant"),
    ("SET #state = :waiting", "ungrant"),
    ("SET granted_at", "take_over"),
    ("SET delivered_at", "delivered"),
    ("SET #state = :released", "end"),
    ("SET #token", "refresh"),
)


def dynamo_step(operation: str, body: dict[str, Any]) -> str | None:
    """The semaphore protocol step a DynamoDB request performs (lib/sluice/adapters/dynamo/semaphore.py)."""
    if operation == "UpdateItem":
        pk, expression = body["Key"]["pk"]["S"], body.get("UpdateExpression", "")
        if pk.startswith("SLOTS#") and expression.startswith("SET holders.#n"):
            return "claim"
        if pk.startswith("SEMQ#"):
            return "take_ticket" if "ADD" in expression else "advance"
        if pk.startswith("SEMA#"):
            return next((step for prefix, step in _SEMA_UPDATES if expression.startswith(prefix)), None)
    if operation == "TransactWriteItems":
        items = body.get("TransactItems", [])
        checks = [i["ConditionCheck"]["Key"]["pk"]["S"] for i in items if "ConditionCheck" in i]
        if any(pk.startswith("SEMA#") for pk in checks):
            return "free"
        puts = [i["Put"]["Item"]["pk"]["S"] for i in items if "Put" in i]
        if any(pk.startswith("SEMW#") for pk in puts):
            return "open"
    return None


def attach(client: Any, crasher: Crasher) -> Any:
    """Crash hooks on a DynamoDB client: before the request is sent, or after moto carried it out."""
    last: list[str | None] = [None]

    def before(model: Any, params: dict[str, Any], **_: Any) -> None:
        last[0] = dynamo_step(model.name, json.loads(params.get("body") or b"{}"))
        crasher.before(last[0])

    def after(**_: Any) -> None:
        crasher.after(last[0])

    client.meta.events.register("before-call.dynamodb.*", before)
    client.meta.events.register("after-call.dynamodb.*", after)
    return client


class _Crashing:
    """A store, its slots or the tokens, with a crash point around the methods ``steps`` names."""

    def __init__(self, target: Any, crasher: Crasher, steps: dict[str, str], nested: dict[str, Any]) -> None:
        self._target, self._crasher, self._steps, self._nested = target, crasher, steps, nested

    def __getattr__(self, name: str) -> Any:
        if name in self._nested:
            return self._nested[name]
        attr = getattr(self._target, name)
        step = self._steps.get(name)
        if step is None:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._crasher.before(step)
            out = attr(*args, **kwargs)
            self._crasher.after(step)
            return out

        return call


def crashing_store(store: MemorySemaphoreStore, crasher: Crasher) -> Any:
    slots = _Crashing(store.slots, crasher, {"claim": "claim"}, {})
    methods = {s: s for s in STEPS if s not in ("claim", "send")}
    return _Crashing(store, crasher, methods, {"slots": slots})


_CLIENTS: dict[str, tuple[Any, Crasher]] = {}


def moto_client(name: str) -> tuple[Any, Crasher]:
    """One container's DynamoDB client with its crash hooks, made once per process (clients are slow
    to make; moto's mock reaches every client, whenever it was made)."""
    if name not in _CLIENTS:
        import boto3

        crasher = Crasher(name)
        client = boto3.session.Session(region_name=REGION).client("dynamodb", config=NO_RETRY)
        _CLIENTS[name] = (attach(client, crasher), crasher)
    return _CLIENTS[name]


# -- the world --------------------------------------------------------------------------------------


@dataclass
class Acq:
    """One acquisition as the workflow sees it: its Acquire task's latest token and where it is.

    waiting   the Acquire task waits on ``token``
    failed    the Acquire task failed (its function crashed): the token is closed
    timed_out the Acquire task timed out: the token is closed
    inside    SendTaskSuccess reached it: the execution runs the section
    left      the execution called Release (whatever became of the call)
    done      released on the error path, or the execution ended
    """

    execution: str
    semaphore: str
    acquisition: str
    token: str | None = None
    phase: str = "new"

    @property
    def holder(self) -> str:
        return holder_name(arn(self.execution), self.acquisition)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.execution, self.semaphore, self.acquisition)


@dataclass
class View:
    """What the table shows of one semaphore at an instant."""

    occupancy: Occupancy
    holders: list[str]  # holder names on the permits (a name twice: held on two shards)
    records: dict[str, Acquisition] = field(default_factory=dict)


class SemaphoreWorld:
    def __init__(self, backend: str, limits: dict[str, int]) -> None:
        self.backend = backend
        self.clock = FakeClock()
        self.tokens = MemoryTokens()
        self.configured = dict(limits)
        self._exit = ExitStack()
        self.crashers = [Crasher(f"c{i}") for i in range(CONTAINERS)]
        if backend == "memory":
            self.store: Any = MemorySemaphoreStore(per_shard=PER_SHARD, rng=random.Random(0))
            stores = [crashing_store(self.store, c) for c in self.crashers]
        else:
            from moto import mock_aws

            from tests.support.moto_patches import atomic_fast_moto

            self._exit.enter_context(mock_aws())
            self._exit.enter_context(atomic_fast_moto())
            plain, _ = moto_client("observer")
            create_table(plain, TABLE)
            self.store = DynamoSemaphoreStore(plain, TABLE, per_shard=PER_SHARD, sleep=lambda _s: None)
            stores = []
            for i in range(CONTAINERS):
                client, self.crashers[i] = moto_client(f"c{i}")
                stores.append(
                    DynamoSemaphoreStore(
                        client, TABLE, per_shard=PER_SHARD, rng=random.Random(i + 1), sleep=lambda _s: None
                    )
                )
        self.services = [
            SemaphoreService(
                Semaphores(
                    store,
                    _Crashing(self.tokens, crasher, {"succeed": "send"}, {}),
                    self.clock,
                    grace=DELIVERY_GRACE,
                    rng=random.Random(10 + i),
                ),
                self.configured,
            )
            for i, (store, crasher) in enumerate(zip(stores, self.crashers, strict=True))
        ]
        self.executions: dict[str, str] = {}  # name -> RUNNING or how it ended
        self.acqs: dict[tuple[str, str, str], Acq] = {}
        self.by_token: dict[str, Acq] = {}
        self.closed: set[str] = set()  # tokens that can no longer be answered
        self.pending: list[dict[str, Any]] = []  # status-change events not delivered yet
        self.delivered: list[dict[str, Any]] = []
        self.seen_answers = 0
        self.broken: list[str] = []
        self.sweep_checks = True  # after a sweep: no permit held by an ended execution
        self.services[0].sweep()  # the configured semaphores exist, as after the first sweep

    def close(self) -> None:
        for crasher in self.crashers:
            crasher.arm(None)
        self._exit.close()

    # -- reading the table ------------------------------------------------------------------------

    def view(self, semaphore: str) -> View:
        occupancy = self.store.slots.occupancy(pool_of(semaphore))
        holders = [h for s in occupancy.shards for h in s.holders]
        known = [a.holder for a in self.acqs.values() if a.semaphore == semaphore]
        records = self.store.acquisitions(semaphore, sorted(set(known))) if known else {}
        return View(occupancy, holders, records)

    def views(self) -> dict[str, View]:
        return {s: self.view(s) for s in SEMAPHORES}

    def owner(self, semaphore: str, holder: str) -> Acq | None:
        return next((a for a in self.acqs.values() if a.semaphore == semaphore and a.holder == holder), None)

    # -- playing Step Functions -------------------------------------------------------------------

    def start(self, execution: str) -> None:
        self.executions[execution] = "RUNNING"

    def running(self, execution: str) -> bool:
        return self.executions.get(execution) == "RUNNING"

    def acq(self, execution: str, semaphore: str, acquisition: str) -> Acq:
        key = (execution, semaphore, acquisition)
        if key not in self.acqs:
            self.acqs[key] = Acq(execution, semaphore, acquisition)
        return self.acqs[key]

    def new_token(self, acq: Acq) -> str:
        if acq.token is not None:
            self.closed.add(acq.token)
        acq.token = self.tokens.issue(arn(acq.execution))
        self.by_token[acq.token] = acq
        return acq.token

    def time_out(self, acq: Acq) -> None:
        assert acq.token is not None
        self.tokens.time_out(acq.token)
        self.closed.add(acq.token)
        acq.phase = "timed_out"

    def live_waiter(self, acq: Acq, record: Acquisition | None) -> bool:
        """Waiting on an open token that its record carries, in a running execution."""
        return (
            acq.phase == "waiting"
            and self.running(acq.execution)
            and acq.token not in self.closed
            and record is not None
            and record.state is State.WAITING
            and record.token == acq.token
        )

    def end(self, execution: str, status: str) -> dict[str, Any]:
        self.tokens.end(arn(execution), status)
        self.executions[execution] = status
        for acq in self.acqs.values():
            if acq.execution == execution:
                if acq.token is not None:
                    self.closed.add(acq.token)
                acq.phase = "done"
        return status_change_event(MACHINE, execution, status)

    # -- the function, as invoked -----------------------------------------------------------------

    def invoke(self, container: int, event: dict[str, Any], fault: tuple[str, str, int] | None = None) -> Any:
        """One invocation of the semaphore function; the crash armed fires at most once."""
        with self.checked():
            return self._invoke(container, event, fault)

    def _invoke(self, container: int, event: dict[str, Any], fault: tuple[str, str, int] | None) -> Any:
        crasher = self.crashers[container % CONTAINERS]
        crasher.arm(fault)
        try:
            return self.services[container % CONTAINERS].handle(event)
        except Crash:
            return "crashed"
        finally:
            crasher.arm(None)

    def request(self, action: str, acq: Acq, token: str | None = None) -> dict[str, Any]:
        body = {
            "action": action,
            "semaphore": acq.semaphore,
            "acquisitionId": acq.acquisition,
            "executionArn": arn(acq.execution),
        }
        if token is not None:
            body["taskToken"] = token
        return body

    def acquire(
        self, container: int, acq: Acq, *, new_token: bool, fault: tuple[str, str, int] | None = None
    ) -> Any:
        """The Acquire task: a token (new, or the one it waits on: the invocation retried)."""
        token = self.new_token(acq) if new_token or acq.token is None else acq.token
        acq.phase = "waiting"
        with self.checked():
            out = self._invoke(container, self.request("acquire", acq, token), fault)
            self.observe()  # a crash after SendTaskSuccess: the task has its answer already
            if out == "crashed" and acq.phase == "waiting":  # the task fails: its token closes
                self.tokens.time_out(token)
                self.closed.add(token)
                acq.phase = "failed"
        return out

    def release(self, container: int, acq: Acq, fault: tuple[str, str, int] | None = None) -> Any:
        acq.phase = "left" if acq.phase in ("inside", "left") else "done"
        return self.invoke(container, self.request("release", acq), fault)

    def deliver(self, index: int, container: int = 0, fault: tuple[str, str, int] | None = None) -> Any:
        event = self.pending.pop(index)
        self.delivered.append(event)
        return self.invoke(container, event, fault)

    def sweep(self, container: int = 0, fault: tuple[str, str, int] | None = None) -> Any:
        with self.checked():
            out = self._invoke(container, {"detail-type": "Scheduled Event", "source": "aws.events"}, fault)
            if out != "crashed" and self.sweep_checks:
                self.check_nothing_held_by_ended("after a sweep")
        return out

    def set_limit(
        self, container: int, semaphore: str, limit: int, fault: tuple[str, str, int] | None = None
    ) -> None:
        crasher = self.crashers[container % CONTAINERS]
        with self.checked():
            crasher.arm(fault)
            try:
                self.services[container % CONTAINERS].semaphores.set_limit(semaphore, limit)
            except Crash:
                pass
            finally:
                crasher.arm(None)

    def hand_off(self, container: int, semaphore: str) -> None:
        with self.checked():
            self.services[container % CONTAINERS].semaphores.hand_off(semaphore)

    # -- the promises, after every action -----------------------------------------------------------

    @contextmanager
    def checked(self) -> Iterator[None]:
        before = self.views()
        yield
        self.observe()
        self.check(before, self.views())

    def observe(self) -> None:
        """Every answer Step Functions took since the last look moves its workflow on."""
        for sent in self.tokens.sent[self.seen_answers :]:
            acq = self.by_token.get(sent.token)
            if sent.answer is not Delivery.DELIVERED:
                continue
            self.closed.add(sent.token)
            if sent.kind != "success":
                self.broken.append(f"SendTaskFailure reached {sent.execution_arn}: {sent.output}")
            elif acq is None or acq.phase != "waiting":
                self.broken.append(f"a permit was sent to {sent.token}, which waits for none")
            else:
                acq.phase = "inside"
                count("semaphore grants delivered", counter=STATS)
        self.seen_answers = len(self.tokens.sent)

    def check(self, before: dict[str, View], after: dict[str, View]) -> None:
        problems = list(self.broken)
        for sem in SEMAPHORES:
            old, new = before[sem], after[sem]
            limit = new.occupancy.limit
            holders = set(new.holders)
            if len(holders) != len(new.holders):
                problems.append(f"{sem}: a holder has two permits: {sorted(new.holders)}")
            # Never more holders than the limit; a lowering evicts nobody, and then admits nobody
            # until fewer than the new limit hold.
            stayed = holders & set(old.holders)
            if holders - stayed and len(holders) > max(limit, len(stayed)):
                problems.append(
                    f"{sem}: limit {limit}: {len(holders)} hold permits after granting "
                    f"{len(holders - stayed)} while {len(stayed)} still held"
                )
            for acq in self.acqs.values():
                if acq.semaphore != sem:
                    continue
                if acq.phase == "inside" and self.running(acq.execution) and acq.holder not in holders:
                    problems.append(f"{sem}: {acq.execution} is inside the section without its permit")
            for holder in holders:
                if self.owner(sem, holder) is None:
                    problems.append(f"{sem}: a permit is held by {holder}, which never acquired")
            problems.extend(self.fifo(sem, old, new))
        if problems:
            self.broken = problems
            raise PromiseBroken("\n".join(problems))

    def fifo(self, sem: str, old: View, new: View) -> list[str]:
        """A waiter granted in this action had no live waiter ahead of it in line."""
        out = []
        for holder, record in new.records.items():
            was = old.records.get(holder)
            if record.state is not State.GRANTED or (
                was is not None and was.gen == record.gen and was.state is State.GRANTED
            ):
                continue
            for other, waiting in new.records.items():
                acq = self.owner(sem, other)
                if waiting.ticket < record.ticket and acq is not None and self.live_waiter(acq, waiting):
                    out.append(
                        f"{sem}: {record.execution_arn.rsplit(':', 1)[1]} (ticket {record.ticket}) was granted "
                        f"before {acq.execution} (ticket {waiting.ticket}), a live waiter ahead of it"
                    )
        return out

    def check_nothing_held_by_ended(self, when: str) -> None:
        problems = []
        for sem, view in self.views().items():
            for holder in view.holders:
                acq = self.owner(sem, holder)
                if acq is not None and not self.running(acq.execution):
                    problems.append(
                        f"{sem}: {when}, {acq.execution} ({self.executions[acq.execution]}) still holds a permit"
                    )
        if problems:
            raise PromiseBroken("\n".join(problems))

    # -- at rest ------------------------------------------------------------------------------------

    def quiesce(self) -> None:
        """Past the delivery grace, the sweep has run: no permit of an ended execution, and no live
        waiter waits while a permit is free."""
        self.clock.advance(DELIVERY_GRACE + 1)
        self.sweep(0)
        self.check_nothing_held_by_ended("at rest")
        problems = []
        for sem, view in self.views().items():
            occ = view.occupancy
            free = 0 if occ.frozen else max(0, occ.limit - occ.running)
            waiters = [
                a.execution
                for h, record in view.records.items()
                if (a := self.owner(sem, h)) is not None and self.live_waiter(a, record)
            ]
            if waiters and free:
                problems.append(f"{sem}: at rest {free} permit(s) free while {sorted(waiters)} wait")
        if problems:
            raise PromiseBroken("\n".join(problems))

    def settle(self, seq: Callable[[], str]) -> None:
        """At rest; then every execution ends, half the events lost: nothing stays held, nothing is
        left in the index (a paused semaphore is resumed first); then every permit can be used again."""
        self.quiesce()
        for sem, view in self.views().items():
            if view.occupancy.limit == 0:  # paused: its line never moves, its dead waiters stay in it
                self.set_limit(0, sem, 1)
        for i, name in enumerate(sorted(n for n in self.executions if self.running(n))):
            event = self.end(name, TERMINAL[i % len(TERMINAL)])
            if i % 2:
                self.invoke(i, event)
        while self.pending:
            self.deliver(0)
        self.clock.advance(DELIVERY_GRACE + 1)
        self.sweep(1)
        for sem, view in self.views().items():
            if view.holders:
                raise PromiseBroken(f"{sem}: permits held after every execution ended: {view.holders}")
        left = [n for n in self.executions if self.store.held_by(arn(n))]
        if left:
            detail = {
                n: [
                    (e, self.store.acquisition(e[0], holder_name(arn(n), e[1])))
                    for e in self.store.held_by(arn(n))
                ]
                for n in left
            }
            raise PromiseBroken(f"index entries left for ended executions {detail}")
        for sem in SEMAPHORES:
            limit = self.view(sem).occupancy.limit
            fresh = []
            for i in range(limit):
                name = seq()
                self.start(name)
                acq = self.acq(name, sem, "settle")
                self.acquire(i, acq, new_token=True)
                fresh.append(acq)
            idle = [a.execution for a in fresh if a.phase != "inside"]
            if idle:
                raise PromiseBroken(f"{sem}: only {limit - len(idle)} of {limit} permits could be used")
            for acq in fresh:
                self.release(0, acq)
            if self.view(sem).holders:
                raise PromiseBroken(f"{sem}: permits held after the last release")

"""The world the reliability suite runs Sluice in.

One moto account holds the stack (FIFO queue and DLQ, table, state machine, MAX parameter).
Three Lambda containers use it: launchers ``A`` and ``B`` (B's clock may be skewed) and the
``completion`` function. Each container is a real ``sluice.runtime.Runtime`` whose boto3 clients
carry an ``Injector``; every call they make is reported to one ``Model``, which checks the
promises as they could break. The world plays the parts moto does not: EventBridge (status
events, delivered when the test says: late, twice, out of order or never), the passing of time
(a ``FakeClock``; SQS visibility runs on real time in moto, so a message whose visibility timeout
has run out by the fake clock is made visible through ChangeMessageVisibility), and the operator
(MAX in SSM).

Nothing here sleeps. Nothing here edits Sluice: it runs ``Launcher.tick``, ``Launcher.admit`` and
``handle_status_change`` exactly as the handlers do.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import boto3
from moto import mock_aws

from sluice.clock import FakeClock
from sluice.completion import StatusChange, handle_status_change
from sluice.errors import TransientError
from sluice.model import TERMINAL_STATUSES
from sluice.runtime import Runtime
from sluice.settings import DuplicatePolicy
from tests.support.aws import NO_RETRY, REGION, build_stack, status_change_event
from tests.support.faults import (
    Crash,
    CrashAt,
    CrashOnCall,
    Fault,
    Injector,
    Interleave,
    Throttle,
    ThrottleCall,
    count,
)
from tests.support.model import Model, Sent, canonical_key
from tests.support.moto_patches import atomic_fast_moto

VISIBILITY = 180  # the queue's visibility timeout: launcher timeout (120 s) + 60 s, as deployed
CLAIM_TIMEOUT = 900
WINDOW = 60  # reconciliation's consistency window
SERVICES = ("sqs", "dynamodb", "stepfunctions", "ssm")
SETTLE_ROUNDS = 40
END_ERRORS = {"FAILED": "States.TaskFailed", "TIMED_OUT": "States.Timeout"}


class PromiseBroken(AssertionError):
    """A promise of Sluice does not hold."""


@dataclass
class SkewedClock:
    """Another machine's clock: the shared fake time plus a fixed skew."""

    base: FakeClock
    skew: float

    def now(self) -> float:
        return self.base.now() + self.skew


@dataclass
class Event:
    seq: int
    name: str
    status: str
    body: dict[str, Any]
    born_after_tick: int


class ClientPool:
    """boto3 clients made once per process (a client costs about 0.1 s to build; an example needs
    twenty). Clients made after moto is imported carry moto's handler, which serves them while a
    mock is active, so they survive from one example's moto to the next. Containers' clients
    carry an Injector whose observer each new world replaces."""

    def __init__(self) -> None:
        self.session = boto3.session.Session(region_name=REGION)
        self._plain: dict[tuple[str, int], Any] = {}
        self._containers: dict[str, tuple[Injector, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def client(self, service: str, region_name: str | None = None, config: Any = None, **_: Any) -> Any:
        """``boto3.Session.client`` with a cache: a session to hand to ``build_stack``."""
        with self._lock:
            key = (service, id(config))
            if key not in self._plain:
                self._plain[key] = self.session.client(service, region_name=REGION, config=config)
            return self._plain[key]

    def container(self, name: str) -> tuple[Injector, dict[str, Any]]:
        with self._lock:
            if name not in self._containers:
                injector = Injector(name)
                clients = {
                    s: injector.attach(self.session.client(s, region_name=REGION, config=NO_RETRY))
                    for s in SERVICES
                }
                self._containers[name] = (injector, clients)
            return self._containers[name]


POOL: ClientPool | None = None


def pool() -> ClientPool:
    global POOL
    if POOL is None:
        POOL = ClientPool()
    return POOL


class Container:
    """One warm Lambda container: a Runtime whose clients carry an Injector."""

    def __init__(self, name: str, world: World, clock: Any) -> None:
        self.name = name
        self.clock = clock
        self.injector, self._clients = pool().container(name)
        self.injector.observer = world.model
        self.injector.revive()
        self.injector.last_listing = None
        self.runtime = Runtime(
            world.stack.settings,
            session=world.session,
            clock=clock,
            client_config=NO_RETRY,
            _clients=dict(self._clients),
        )

    @property
    def launcher(self) -> Any:
        return self.runtime.launcher()

    def restart(self) -> None:
        """The process died; Lambda starts a new one: fresh launcher and caches. The boto3 clients
        (and their hooks) are reused: they keep no state a crash could have left behind."""
        self.injector.revive()
        self.runtime = Runtime(
            self.runtime.settings,
            session=self.runtime.session,
            clock=self.clock,
            client_config=NO_RETRY,
            _clients=dict(self._clients),
        )


class World:
    def __init__(
        self,
        *,
        max_concurrency: int = 3,
        skew: float = 0.0,
        duplicate_policy: str = "suppress",
        name: str = "sluice-rel",
    ) -> None:
        self._exit = ExitStack()
        self._lock = threading.RLock()
        try:
            self._exit.enter_context(mock_aws())
            self._exit.enter_context(atomic_fast_moto())
            self.session = pool()
            self.clock = FakeClock()
            self.stack = build_stack(
                self.session,
                name=name,
                max_concurrency=max_concurrency,
                max_receive_count=1_000,  # SQS's own redrive is not under test: see docs/reliability.md
                visibility_timeout=VISIBILITY,
                clock=self.clock,
                claim_timeout_seconds=CLAIM_TIMEOUT,
                consistency_window_seconds=WINDOW,
                duplicate_policy=DuplicatePolicy(duplicate_policy),
            )
            self.settings = self.stack.settings
            self.sqs = self.session.client("sqs")
            self.ddb = self.session.client("dynamodb")
            self.ssm = self.session.client("ssm")
            self.sfn = self.session.client("stepfunctions")
            self.model = Model(
                dlq_url=self.settings.dlq_url,
                clock=self.clock,
                max_concurrency=max_concurrency,
                visibility_timeout=VISIBILITY,
            )
            self.containers = {
                "A": Container("A", self, self.clock),
                "B": Container("B", self, SkewedClock(self.clock, skew) if skew else self.clock),
                "completion": Container("completion", self, self.clock),
            }
        except BaseException:
            self._exit.close()
            raise
        self.skew = skew
        self.pending: list[Event] = []  # status events EventBridge still owes
        self.delivered: list[Event] = []
        self.ticks = 0
        self.settling = False
        self._seq = 0

    def close(self) -> None:
        self._exit.close()

    def count(self, kind: str, n: int = 1) -> None:
        if not self.settling:
            count(kind, n)

    # -- the producer -------------------------------------------------------------------------------

    def send(
        self,
        body: str,
        *,
        group: str = "g",
        valid: bool = True,
        dedup: str | None = None,
        attributes: dict[str, str] | None = None,
    ) -> str | None:
        """Send one message; its id, or None when SQS dropped it as a duplicate (same dedup id)."""
        request: dict[str, Any] = {
            "QueueUrl": self.settings.queue_url,
            "MessageBody": body,
            "MessageGroupId": group,
            "MessageDeduplicationId": dedup or uuid.uuid4().hex,
        }
        if attributes:
            request["MessageAttributes"] = {
                k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()
            }
        before = self.queue_depth() if dedup else None
        message_id = self.sqs.send_message(**request)["MessageId"]
        if before is not None and self.queue_depth() == before:
            self.count("sqs:deduplicated")
            return None
        key = canonical_key(body, attributes) if valid else None
        self.model.sent_message(
            Sent(message_id, body, group, request["MessageDeduplicationId"], key, dict(attributes or {}))
        )
        return message_id

    # -- running the containers -------------------------------------------------------------------

    def run(self, name: str, work: Callable[[Container], Any], faults: Sequence[Fault] = ()) -> str:
        """Run one invocation of a container with ``faults`` armed. Returns ok, crashed or refused.

        A crash or a refusal is only acceptable when a fault that causes one was armed; anything
        else escaping Sluice is a failure of the test.
        """
        container = self.containers[name]
        container.injector.faults[:] = list(faults)
        may_fail = any(isinstance(f, CrashAt | CrashOnCall | Throttle | ThrottleCall) for f in faults)
        outcome = "ok"
        try:
            work(container)
        except Crash:
            outcome = "crashed"
        except TransientError:
            if not may_fail:
                raise
            outcome = "refused"
        finally:
            container.injector.faults.clear()
        if outcome == "crashed" or container.injector.dead:
            container.restart()
        return outcome

    def tick(self, name: str = "A", faults: Sequence[Fault] = ()) -> str:
        with self._lock:
            self.ticks += 1
        return self.run(name, lambda c: c.launcher.tick(), faults)

    def ticks_at_once(self, names: Iterable[str] = ("A", "B")) -> None:
        """Two launchers in two threads, released together."""
        names = list(names)
        self.count("concurrent_ticks")
        barrier = threading.Barrier(len(names))
        errors: list[BaseException] = []

        def go(name: str) -> None:
            try:
                barrier.wait(timeout=60)
                self.tick(name)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=go, args=(n,), name=f"launcher-{n}") for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def tick_interleaved(self, outer: str, point: str, inner: str, nth: int = 1) -> str:
        """Run launcher ``outer``; at ``point`` (the ``nth`` time), another actor takes its turn."""
        other = "B" if outer == "A" else "A"

        def action() -> None:
            if inner == "tick":
                self.tick(other)
            elif inner == "deliver" and self.pending:
                self.deliver(0)
            elif inner == "finish_newest":
                self.finish_newest()

        return self.tick(outer, [Interleave(point, action, nth)])

    # -- Step Functions and EventBridge -------------------------------------------------------------

    def end(self, name: str, status: str = "SUCCEEDED") -> Event:
        """End a RUNNING execution; EventBridge now owes its status event."""
        body = self.stack.finish(name, status, error=END_ERRORS.get(status))
        self.model.ended(name)
        self.count(f"ended:{status}")
        with self._lock:
            self._seq += 1
            event = Event(self._seq, name, status, body, self.ticks)
            self.pending.append(event)
        return event

    def finish_newest(self) -> None:
        """The newest execution ends at once and its event arrives at once."""
        running = [s.name for s in self.model.starts if s.name in self.model.running]
        if running:
            event = self.end(running[-1])
            self.deliver(self.pending.index(event))

    def _complete(self, event: Event) -> Callable[[Container], None]:
        def work(c: Container) -> None:
            # What handlers/completion.py does: release, then fill the one freed slot at once.
            launcher = c.launcher
            released = handle_status_change(
                StatusChange.from_event(event.body),
                store=launcher.store,
                state_machine_arn=self.settings.state_machine_arn,
                now=c.clock.now(),
            )
            if released:
                launcher.admit(max_new=1)

        return work

    def deliver(self, index: int = 0, faults: Sequence[Fault] = ()) -> str:
        """Deliver a pending event. A failed invocation keeps it pending (Lambda retries it)."""
        event = self.pending[index]
        if any(e.seq < event.seq for e in self.pending):
            self.count("event:out_of_order")
        if self.ticks > event.born_after_tick:
            self.count("event:late")
        outcome = self.run("completion", self._complete(event), faults)
        if outcome == "ok":
            self.pending.remove(event)
            self.delivered.append(event)
        return outcome

    def redeliver(self, index: int) -> str:
        """EventBridge delivers an event a second time."""
        self.count("event:duplicate")
        return self.run("completion", self._complete(self.delivered[index]))

    def lose(self, index: int) -> None:
        self.count("event:lost")
        self.pending.pop(index)

    def deliver_running_event(self, name: str) -> str:
        """The RUNNING event of an execution, arriving whenever (often after its end)."""
        self.count("event:running_late")
        body = status_change_event(self.settings.state_machine_arn, name, "RUNNING")
        event = Event(0, name, "RUNNING", body, self.ticks)
        return self.run("completion", self._complete(event))

    # -- the operator and time ----------------------------------------------------------------------

    def set_max(self, value: int) -> None:
        old = self.model.max
        self.ssm.put_parameter(
            Name=self.settings.max_parameter, Value=str(value), Type="String", Overwrite=True
        )
        with self.model.lock:
            self.model.max = value
        self.count("max:zero" if value == 0 else "max:raised" if value > old else "max:lowered")

    def advance(self, seconds: float) -> None:
        """Time passes. Messages whose visibility timeout ran out become visible again."""
        self.clock.advance(seconds)
        due = sorted(self.model.due().items())
        for i in range(0, len(due), 10):
            chunk = due[i : i + 10]
            self.sqs.change_message_visibility_batch(
                QueueUrl=self.settings.queue_url,
                Entries=[
                    {"Id": str(n), "ReceiptHandle": receipt, "VisibilityTimeout": 0}
                    for n, (_, receipt) in enumerate(chunk)
                ],
            )
            for message_id, _ in chunk:
                self.model.made_visible(message_id)

    # -- observations ---------------------------------------------------------------------------------

    def queue_depth(self) -> int:
        attrs = self.sqs.get_queue_attributes(
            QueueUrl=self.settings.queue_url,
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed",
            ],
        )["Attributes"]
        return sum(int(v) for v in attrs.values())

    def table(self) -> dict[str, dict[str, Any]]:
        items: dict[str, dict[str, Any]] = {}
        request: dict[str, Any] = {"TableName": self.settings.table_name, "ConsistentRead": True}
        while True:
            page = self.ddb.scan(**request)
            for item in page.get("Items", []):
                items[item["pk"]["S"]] = item
            if "LastEvaluatedKey" not in page:
                return items
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def drain_dlq(self) -> list[dict[str, Any]]:
        """Every message in the DLQ, deleted as read (a FIFO group stays locked while a message of it
        is in flight, so reading without deleting stops at the first batch of each group)."""
        out: list[dict[str, Any]] = []
        while True:
            got = self.sqs.receive_message(
                QueueUrl=self.settings.dlq_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
            ).get("Messages", [])
            if not got:
                return out
            out.extend(got)
            self.sqs.delete_message_batch(
                QueueUrl=self.settings.dlq_url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)],
            )

    @staticmethod
    def holders(items: dict[str, dict[str, Any]]) -> set[str]:
        return set(items.get("LEDGER", {}).get("holders", {}).get("SS", []))

    def running_in_step_functions(self) -> set[str]:
        names: set[str] = set()
        pages = self.sfn.get_paginator("list_executions").paginate(
            stateMachineArn=self.settings.state_machine_arn, statusFilter="RUNNING"
        )
        for page in pages:
            names.update(e["name"] for e in page["executions"])
        return names

    # -- the promises -------------------------------------------------------------------------------

    # The ledger-against-leases check finds a broken release one step after it happens; switched
    # off, the promises alone must still catch it (tests/reliability/test_broken_variants.py).
    check_ledger = True

    def check(self) -> None:
        """After every step: no promise broken so far, and the ledger agrees with the leases."""
        if self.model.violations:
            raise PromiseBroken("\n".join(self.model.violations))
        if not self.check_ledger:
            return
        items = self.table()
        slots = self.holders(items)
        leases = {
            item["holder"]["S"]
            for pk, item in items.items()
            if pk.startswith("PAYLOAD#") and "holder" in item
        }
        problems = []
        if slots != leases:
            problems.append(
                f"slot without lease or lease without slot: slots {sorted(slots)}, leases {sorted(leases)}"
            )
        if slots != self.model.holders:
            problems.append(
                f"the ledger changed outside a claim or release: ledger {sorted(slots)}, "
                f"claimed and not released {sorted(self.model.holders)}"
            )
        for name in slots:
            state = items.get(f"EXEC#{name}", {}).get("state", {}).get("S")
            if state not in ("CLAIMED", "RUNNING"):
                problems.append(f"slot held by {name}, whose record is {state}")
        if problems:
            raise PromiseBroken("\n".join(problems))

    def settle(self) -> None:
        """Quiescence, then the promises that hold at rest: nothing leaks (4), nothing lost (3)."""
        self.settling = True
        for container in self.containers.values():
            container.restart()
        if self.model.max < 2:
            self.set_max(2)
        while self.pending:
            self.deliver(0)

        # Drain: the queue empties once executions end and their slots come back.
        for round_ in range(SETTLE_ROUNDS):
            self.advance(CLAIM_TIMEOUT + VISIBILITY + WINDOW)
            self.tick("A")
            self.check()
            if self.queue_depth() == 0:
                break
            for name in sorted(self.model.running):
                self.end(name, "SUCCEEDED")
            if round_ % 2:
                self.pending.clear()  # lost: reconciliation frees those slots
            while self.pending:
                self.deliver(0)
        else:
            raise PromiseBroken(
                f"promise 4 (nothing leaks): the queue did not drain in {SETTLE_ROUNDS} ticks: {self.queue_depth()} left"
            )

        # Once reconciliation has had its window, the ledger counts exactly the RUNNING executions.
        self.advance(WINDOW + 1)
        self.tick("A")
        self.check()
        running = self.running_in_step_functions()
        if running != set(self.model.running):
            raise PromiseBroken(
                f"Step Functions runs {sorted(running)}, the suite saw {sorted(self.model.running)} start and not end"
            )
        holders = self.holders(self.table())
        if holders != running:
            raise PromiseBroken(
                f"promise 4 (nothing leaks): ledger holds {len(holders)} slots for {len(running)} RUNNING executions: "
                f"{sorted(holders ^ running)}"
            )

        # Everything ends and every event is lost: reconciliation alone must free every slot.
        statuses = sorted(TERMINAL_STATUSES)
        for i, name in enumerate(sorted(running)):
            self.end(name, statuses[i % len(statuses)])
        self.pending.clear()
        self.advance(WINDOW + 1)
        self.tick("A")
        self.check()
        items = self.table()
        if self.holders(items):
            raise PromiseBroken(
                f"promise 4 (nothing leaks): slots held after every execution ended: {sorted(self.holders(items))}"
            )
        for key in sorted({s.key for s in self.model.sent.values() if s.key is not None}):
            item = items.get(f"PAYLOAD#{key}")
            state = item.get("state", {}).get("S") if item else None
            if state not in TERMINAL_STATUSES:
                raise PromiseBroken(
                    f"promise 4 (nothing leaks): payload {key!r} has no final record: state {state}"
                )

        # Every one of the MAX slots can be used again.
        fresh = [
            self.send(json.dumps({"id": f"settle-{self._seq}-{i}"}), group=f"settle-{i}")
            for i in range(self.model.max)
        ]
        self.tick("A")
        self.check()
        idle = [m for m in fresh if m not in self.model.started_by_message]
        if idle:
            raise PromiseBroken(
                f"promise 4 (nothing leaks): only {len(fresh) - len(idle)} of MAX={self.model.max} slots could be used"
            )
        for name in sorted(self.model.running):
            self.end(name)
        while self.pending:
            self.deliver(0)
        self.check()

        # Nothing lost: every message that left the queue started, was a duplicate, or has a reason.
        if self.queue_depth():
            raise PromiseBroken(f"promise 3 (nothing lost): {self.queue_depth()} messages left in the queue")
        dlq: dict[str, str] = {}
        for message in self.drain_dlq():
            attributes = message.get("MessageAttributes", {})
            reason = attributes.get("sluice-error", {}).get("StringValue", "")
            source = attributes.get("sluice-source-message-id", {}).get("StringValue", message["MessageId"])
            if not reason:
                raise PromiseBroken(
                    f"promise 3 (nothing lost): message {source} reached the DLQ without a reason"
                )
            dlq[source] = reason
        for sent in self.model.sent.values():
            if sent.valid:
                accounted = sent.message_id in self.model.started_by_message or sent.message_id in (
                    self.model.duplicates
                )
                if not accounted:
                    raise PromiseBroken(
                        f"promise 3 (nothing lost): message {sent.message_id} (key {sent.key!r}) never started and is no duplicate"
                    )
            elif sent.message_id not in dlq:
                raise PromiseBroken(
                    f"promise 5 (bad input): unusable message {sent.message_id} is not in the DLQ with a reason"
                )
        self.check()

"""The actors of the reliability world (tests/reliability/world.py) besides the world itself.

* The Lambda containers: one ``Runtime`` each, whose boto3 clients carry an ``Injector`` and come
  from one process-wide pool (``ClientPool``); another machine's clock (``SkewedClock``).
* Whoever changes AWS behind Sluice's back (``BehindTheBack``, mixed into ``World``): an operator
  who redrives an execution Sluice released, stops one of Sluice's executions by hand, or starts
  one with a Sluice-like name; DynamoDB's TTL process, which moto never runs; years of history
  written straight into a payload record.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import boto3
from moto.core import DEFAULT_ACCOUNT_ID
from moto.stepfunctions.models import stepfunctions_backends

from sluice.core.clock import FakeClock
from sluice.core.model import REDRIVE_WINDOW_SECONDS
from sluice.runtime import Runtime
from tests.support.aws import NO_RETRY, REGION, status_change_event
from tests.support.faults import Injector

if TYPE_CHECKING:
    from tests.reliability.world import World

SERVICES = ("sqs", "dynamodb", "stepfunctions", "ssm")
ITEM_LIMIT = 400 * 1024  # DynamoDB's largest item


@dataclass
class SkewedClock:
    """Another machine's clock: the shared fake time plus a fixed skew."""

    base: FakeClock
    skew: float

    @property
    def identity(self) -> str:
        return f"{self.base.identity}{self.skew:+g}"

    def now(self) -> float:
        return self.base.now() + self.skew

    def sleep(self, seconds: float) -> None:
        """A launcher backing off: the shared time passes, nothing waits."""
        self.base.advance(seconds)


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

    def container(self, name: str, config: Any = NO_RETRY) -> tuple[Injector, dict[str, Any]]:
        """The clients of container ``name``; ``config`` is used when they are first made (so a
        name stands for one client configuration for the whole process)."""
        with self._lock:
            if name not in self._containers:
                injector = Injector(name)
                clients = {
                    s: injector.attach(self.session.client(s, region_name=REGION, config=config))
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

    def __init__(self, name: str, world: World, clock: Any, config: Any = NO_RETRY) -> None:
        self.name = name
        self.clock = clock
        self.config = config
        self.injector, self._clients = pool().container(name, config)
        self.injector.observer = world.model
        self.injector.revive()
        self.injector.last_listing = None
        self.runtime = Runtime(
            world.stack.settings,
            session=world.session,
            clock=clock,
            client_config=config,
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
            client_config=self.config,
            _clients=dict(self._clients),
        )


def sluice_like_name(key: str, seed: str) -> str:
    """A name of the shape Sluice gives its executions (``<prefix>-<32 hex digits>``), made here."""
    prefix = "".join(c if c.isalnum() or c in "-_" else "-" for c in key)[:40].strip("-_")
    digest = hashlib.sha256(f"{key}\x00{seed}".encode()).hexdigest()[:32]
    return f"{prefix}-{digest}" if prefix else digest


def item_size(item: dict[str, Any]) -> int:
    """An item's size by DynamoDB's documented rules (names and values in bytes; a list or map
    adds 3 bytes and 1 per element; a number about one byte per two digits)."""

    def value(v: dict[str, Any]) -> int:
        (kind, raw), *_ = v.items()
        if kind == "S":
            return len(raw.encode("utf-8"))
        if kind == "N":
            return len(raw.lstrip("-").replace(".", "")) // 2 + 2
        if kind in ("SS",):
            return sum(len(x.encode("utf-8")) for x in raw)
        if kind == "NS":
            return sum(len(x) // 2 + 2 for x in raw)
        if kind == "L":
            return 3 + sum(1 + value(x) for x in raw)
        if kind == "M":
            return 3 + sum(1 + len(k.encode("utf-8")) + value(x) for k, x in raw.items())
        return 1

    return sum(len(name.encode("utf-8")) + value(v) for name, v in item.items())


class BehindTheBack:
    """What changes AWS without Sluice: mixed into ``World`` (uses its clients, model and clock)."""

    def _execution(self: World, name: str) -> Any:
        backend = stepfunctions_backends[DEFAULT_ACCOUNT_ID][REGION]
        arn = self.settings.state_machine_arn.replace(":stateMachine:", ":execution:") + f":{name}"
        return backend.describe_execution(arn)

    def redrivable(self: World) -> list[str]:
        """What RedriveExecution accepts: executions that did not succeed and ended in the last 14
        days (``REDRIVE_WINDOW_SECONDS``); older ones it refuses."""
        now = self.clock.now()
        return [
            n
            for n, status in self.ended_as.items()
            if status != "SUCCEEDED" and now - self.ended_when.get(n, now) <= REDRIVE_WINDOW_SECONDS
        ]

    def redrive(self: World, name: str) -> None:
        """An operator's RedriveExecution of an ended execution: RUNNING again, same name and ARN.
        (moto has no RedriveExecution; this is the reverse of ``Stack.finish`` on moto's record.)"""
        assert name in self.redrivable(), f"RedriveExecution refuses {name}: not within its window"
        execution = self._execution(name)
        assert execution.status in ("FAILED", "TIMED_OUT", "ABORTED"), f"{name} is {execution.status}"
        execution.status = "RUNNING"
        execution.redrive_count = getattr(execution, "redrive_count", 0) + 1  # (tests.support.moto_patches)
        execution.stop_date = None
        execution.error = execution.cause = None
        self.ended_as.pop(name, None)
        self.ended_when.pop(name, None)
        self.model.running_again(name)
        self.count("outside:redrive")

    def stop_by_hand(self: World, name: str) -> Any:
        """An operator's StopExecution of one of Sluice's executions; EventBridge owes its event."""
        self.sfn.stop_execution(executionArn=self._execution(name).execution_arn)
        self.model.ended(name, "ABORTED")
        self.ended_as[name] = "ABORTED"
        self.ended_when[name] = self.clock.now()
        self.count("outside:stop")
        return self.owe_event(
            name, "ABORTED", status_change_event(self.settings.state_machine_arn, name, "ABORTED")
        )

    def start_by_hand(self: World, key: str, body: str = "{}") -> str:
        """Someone starts an execution on Sluice's state machine with a name of Sluice's shape."""
        # Numbered: two started by hand at one moment, with as many outside, are still two names.
        self.by_hand += 1
        name = sluice_like_name(key, f"by-hand-{self.clock.now()}-{self.by_hand}")
        self.sfn.start_execution(stateMachineArn=self.settings.state_machine_arn, name=name, input=body)
        self.model.started_outside(name)
        self.count("outside:start")
        return name

    def expire_ttl(self: World) -> Counter[str]:
        """DynamoDB's TTL process: delete every item whose ``expires_at`` has passed (by the world's
        clock, which is true time here). Returns the items deleted, by kind (``PAYLOAD``, ``EXEC``...)."""
        now = self.clock.now()
        deleted: Counter[str] = Counter()
        for pk, item in self.table("expires_at").items():
            expires = item.get("expires_at", {}).get("N")
            if expires is not None and float(expires) <= now:
                self.ddb.delete_item(TableName=self.settings.table_name, Key={"pk": {"S": pk}})
                self.expired.add(pk)
                deleted[pk.split("#", 1)[0]] += 1
                if pk.startswith("PAYLOAD#"):
                    self.model.forget_key(pk[len("PAYLOAD#") :])
        for kind, n in deleted.items():
            self.count(f"ttl:deleted:{kind}", n)
        return deleted

    def seed_history(self: World, key: str, *, runs: int | None = None, up_to: int | None = None) -> int:
        """A payload with a long history, written straight into the table: a released record whose
        ``executions`` list names ``runs`` earlier runs (oldest first), or as many as keep the item
        within ``up_to`` bytes. Returns the number of runs."""
        now = self.clock.now()

        def item(n: int) -> dict[str, Any]:
            return {
                "pk": {"S": f"PAYLOAD#{key}"},
                "key": {"S": key},
                "state": {"S": "SUCCEEDED"},
                "executions": {"L": [{"S": sluice_like_name(key, f"history-{i}")} for i in range(n)]},
                "attempts": {"N": str(n)},
                "updated_at": {"N": str(now)},
                "expires_at": {"N": str(int(now) + self.settings.retention_seconds)},
            }

        if runs is None:
            assert up_to is not None, "say how many runs, or up to what size"
            base, one = item_size(item(0)), item_size(item(1)) - item_size(item(0))
            runs = (up_to - base) // one
        self.ddb.put_item(TableName=self.settings.table_name, Item=item(runs))
        self.count("history:seeded")
        return runs

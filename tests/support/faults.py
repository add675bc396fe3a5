"""Fault injection through botocore event hooks on the boto3 clients of one Lambda container.

An ``Injector`` is attached to the clients of one container (a launcher, or the completion
function). It hooks three client events:

* ``before-parameter-build``: keeps the call's parameters for the hooks below;
* ``before-call``: refuses the call (throttling), kills the container, or runs another actor first.
  A response returned here replaces the request entirely, so nothing reaches moto. (A
  ``before-send`` response would not do: moto's own ``before-send`` handler runs all the same and
  applies the request, so the "throttled" call would have happened);
* ``after-call``: reports the call and its result to an observer, kills the container after the
  side effect, rewrites a ListExecutions page, or runs another actor.

A crash is ``Crash``, a ``BaseException``: it escapes ``except Exception`` as a Lambda timeout or
kill would, and from then on every call of that container raises it too, so no ``finally`` block
can reach AWS after the process died. The harness revives the container (a new one, in Lambda).

A throttle injected here is the ``ThrottlingException`` that reaches Sluice once botocore's own
retries have given up: before-call responses bypass the retry loop, so one injected throttle is one
refusal that Sluice sees. Throttles absorbed by botocore's retries change nothing Sluice can see.

Every fault that fires is counted in ``FAULTS`` (by kind), which the soak prints at the end.
"""

from __future__ import annotations

import copy
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from tests.support.hooks import Crash, error_answer

FAULTS: Counter[str] = Counter()  # faults injected, by kind, over the whole process
STATS: Counter[str] = Counter()  # examples, steps and rules run by the property suite
_counter_lock = threading.Lock()

ALWAYS = 1_000_000


def count(kind: str, n: int = 1, counter: Counter[str] = FAULTS) -> None:
    with _counter_lock:
        counter[kind] += n


# -- what a call is, in protocol terms -------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    container: str
    service: str  # sqs, dynamodb, stepfunctions, ssm
    operation: str  # the API operation, e.g. TransactWriteItems
    step: str  # the protocol step, e.g. claim, start, mark, delete, release
    params: dict[str, Any]

    def matches(self, target: str) -> bool:
        return target in (self.step, self.operation)


def protocol_step(service: str, operation: str, params: dict[str, Any]) -> str:
    """Name a call by the protocol step it performs (launcher.py's timeline)."""
    if operation == "TransactWriteItems":
        items = params.get("TransactItems", [])
        if any("Put" in item for item in items):
            return "claim"
        expressions = " ".join(item.get("Update", {}).get("UpdateExpression", "") for item in items)
        if "DELETE holders" in expressions:
            return "release"
        return "mark"
    if operation == "UpdateItem":
        expression = params.get("UpdateExpression", "")
        if "ADD duplicates" in expression:
            return "duplicate"
        if ":invalid" in expression:
            return "invalid"
        if "reconciled_at" in expression:
            return "save_reconciliation"
        return "update"
    return {
        "ReceiveMessage": "receive",
        "DeleteMessageBatch": "delete",
        "ChangeMessageVisibilityBatch": "return",
        "SendMessage": "dead_letter",
        "StartExecution": "start",
        "DescribeExecution": "describe",
        "ListExecutions": "list",
        "DescribeStateMachine": "check",
        "GetParameter": "max",
        "GetItem": "read",
        "BatchGetItem": "read",
    }.get(operation, operation)


# Where a process can die: (before or after the call, protocol step). "after" counts successful
# calls only: dying after a refused call is dying before it.
CRASH_POINTS: dict[str, tuple[str, str]] = {
    "after_receive": ("after", "receive"),
    "after_claim": ("after", "claim"),
    "after_start": ("after", "start"),
    "after_mark": ("after", "mark"),
    "before_delete": ("before", "delete"),
    "after_delete": ("after", "delete"),
    "after_duplicate": ("after", "duplicate"),
    "after_dead_letter": ("after", "dead_letter"),
    "after_return": ("after", "return"),
    "before_release": ("before", "release"),
    "after_release": ("after", "release"),
    "after_list": ("after", "list"),
    "after_describe": ("after", "describe"),
}

# The steps of launcher.py's timeline, and of reconciliation and completion, where a crash matters.
PROTOCOL_STEPS = frozenset(step for _, step in CRASH_POINTS.values())

# Calls that can be throttled: TransactWriteItems by protocol step, the rest by operation.
THROTTLE_TARGETS = (
    "ReceiveMessage",
    "DeleteMessageBatch",
    "ChangeMessageVisibilityBatch",
    "SendMessage",
    "claim",
    "mark",
    "release",
    "GetItem",
    "BatchGetItem",
    "UpdateItem",
    "StartExecution",
    "DescribeExecution",
    "ListExecutions",
    "DescribeStateMachine",
    "GetParameter",
)

STALE_MODES = ("empty", "drop_newest", "previous")

_THROTTLE_CODES = {"sqs": "RequestThrottled", "dynamodb": "ThrottlingException"}


def throttled(service: str) -> tuple[Any, dict[str, Any]]:
    """A 400 throttling answer, in the (http, parsed) shape a before-call handler returns."""
    return error_answer(_THROTTLE_CODES.get(service, "ThrottlingException"), 400)


# -- faults ------------------------------------------------------------------------------------------


class Fault:
    """One armed fault. ``before`` may return a response; either hook may raise ``Crash``."""

    def before(self, injector: Injector, call: Call) -> tuple[Any, dict[str, Any]] | None:
        return None

    def after(self, injector: Injector, call: Call, status: int, parsed: dict[str, Any]) -> None:
        return None


@dataclass
class CrashAt(Fault):
    """Kill the container at the ``nth`` time it reaches ``point`` (a key of ``CRASH_POINTS``)."""

    point: str
    nth: int = 1
    seen: int = 0

    def _reached(self, injector: Injector, when: str, call: Call) -> None:
        expected_when, step = CRASH_POINTS[self.point]
        if when != expected_when or call.step != step:
            return
        self.seen += 1
        if self.seen == self.nth:
            count(f"crash:{self.point}")
            injector.dead = True
            raise Crash(f"{injector.name} died {self.point.replace('_', ' ')}")

    def before(self, injector: Injector, call: Call) -> None:
        self._reached(injector, "before", call)

    def after(self, injector: Injector, call: Call, status: int, parsed: dict[str, Any]) -> None:
        if status < 300:
            self._reached(injector, "after", call)


@dataclass
class Throttle(Fault):
    """Refuse the next ``times`` calls to ``target`` (an operation or a protocol step)."""

    target: str
    times: int = 1
    fired: int = 0

    def before(self, injector: Injector, call: Call) -> tuple[Any, dict[str, Any]] | None:
        if self.fired >= self.times or not call.matches(self.target):
            return None
        self.fired += 1
        count(f"throttle:{self.target}")
        return throttled(call.service)


@dataclass
class CrashOnCall(Fault):
    """Kill the container before or after the ``nth`` protocol step it reaches in this invocation,
    whichever step that is: the steps are then hit as often as the protocol reaches them
    (``CrashAt`` aims at one step, which a given tick may never reach)."""

    nth: int
    when: str = "after"
    seen: int = 0

    def _reached(self, injector: Injector, when: str, call: Call) -> None:
        if when != self.when or call.step not in PROTOCOL_STEPS:
            return
        self.seen += 1
        if self.seen == self.nth:
            count(f"crash:{when}_{call.step}")
            injector.dead = True
            raise Crash(f"{injector.name} died {when} {call.step} (call {self.nth})")

    def before(self, injector: Injector, call: Call) -> None:
        self._reached(injector, "before", call)

    def after(self, injector: Injector, call: Call, status: int, parsed: dict[str, Any]) -> None:
        if status < 300:
            self._reached(injector, "after", call)


@dataclass
class ThrottleCall(Fault):
    """Refuse the ``nth`` call of this invocation, whatever it is."""

    nth: int
    seen: int = 0

    def before(self, injector: Injector, call: Call) -> tuple[Any, dict[str, Any]] | None:
        self.seen += 1
        if self.seen != self.nth:
            return None
        count(f"throttle:{call.step if call.operation == 'TransactWriteItems' else call.operation}")
        return throttled(call.service)


@dataclass
class StaleList(Fault):
    """ListExecutions answers from an older view: ``empty``, ``drop_newest`` (the two newest
    executions are missing) or ``previous`` (the page this container got last time, which may
    list ended executions as RUNNING and miss new ones)."""

    mode: str

    def after(self, injector: Injector, call: Call, status: int, parsed: dict[str, Any]) -> None:
        if call.operation != "ListExecutions" or status >= 300:
            return
        fresh = copy.deepcopy(parsed.get("executions", []))
        if self.mode == "empty":
            parsed["executions"] = []
        elif self.mode == "drop_newest":
            ordered = sorted(parsed.get("executions", []), key=lambda e: e.get("startDate"), reverse=True)
            parsed["executions"] = ordered[2:]
        elif self.mode == "previous":
            parsed["executions"] = copy.deepcopy(injector.last_listing or [])
        injector.last_listing = fresh
        count(f"stale_list:{self.mode}")


@dataclass
class Interleave(Fault):
    """Run ``action`` (another actor's whole turn) at the ``nth`` time this container reaches
    ``point``: a deterministic "at the same time", reproducible where threads are not."""

    point: str
    action: Callable[[], None]
    nth: int = 1
    seen: int = 0

    def _reached(self, when: str, call: Call) -> None:
        expected_when, step = CRASH_POINTS[self.point]
        if when != expected_when or call.step != step:
            return
        self.seen += 1
        if self.seen == self.nth:
            count(f"interleave:{self.point}")
            self.action()

    def before(self, injector: Injector, call: Call) -> None:
        self._reached("before", call)

    def after(self, injector: Injector, call: Call, status: int, parsed: dict[str, Any]) -> None:
        if status < 300:
            self._reached("after", call)


# -- the injector --------------------------------------------------------------------------------------


class Observer(Protocol):
    def saw(self, call: Call, status: int, parsed: dict[str, Any]) -> None: ...


@dataclass
class Injector:
    """Faults and observation for the boto3 clients of one container."""

    name: str
    observer: Observer | None = None
    faults: list[Fault] = field(default_factory=list)
    dead: bool = False
    last_listing: list[dict[str, Any]] | None = None

    def attach(self, client: Any) -> Any:
        service = client.meta.service_model.service_name
        events = client.meta.events
        events.register("before-parameter-build", self._keep_params)
        events.register_first("before-call", partial(self._before_call, service))
        events.register("after-call", partial(self._after_call, service))
        return client

    def revive(self) -> None:
        """A new container takes over: no longer dead, no fault left armed."""
        self.dead = False
        self.faults.clear()

    @staticmethod
    def _keep_params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["sluice.params"] = params

    def _before_call(
        self, service: str, model: Any, context: dict[str, Any], **_: Any
    ) -> tuple[Any, dict[str, Any]] | None:
        if self.dead:
            raise Crash(f"{self.name} is dead")
        params = context.get("sluice.params") or {}
        call = Call(self.name, service, model.name, protocol_step(service, model.name, params), params)
        context["sluice.call"] = call
        for fault in list(self.faults):
            response = fault.before(self, call)
            if response is not None:
                return response
        return None

    def _after_call(
        self, service: str, http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any
    ) -> None:
        call = context.get("sluice.call")
        if call is None:
            return
        status = int(getattr(http_response, "status_code", 200))
        if self.observer is not None:
            self.observer.saw(call, status, parsed)
        for fault in list(self.faults):
            fault.after(self, call, status, parsed)
        if (
            call.operation == "ListExecutions"
            and status < 300
            and not any(isinstance(f, StaleList) for f in self.faults)
        ):
            self.last_listing = copy.deepcopy(parsed.get("executions", []))

"""Fault injection through botocore event hooks on the boto3 clients of one Lambda container.

An ``Injector`` is attached to the clients of one container (a launcher, or the completion
function). It hooks three client events:

* ``before-parameter-build``: keeps the call's parameters for the hooks below;
* ``before-call``: refuses the call (throttling), kills the container, or runs another actor first.
  A response returned here replaces the request entirely, so nothing reaches moto. (A
  ``before-send`` response would not do: moto's own ``before-send`` handler runs all the same and
  applies the request, so the "throttled" call would have happened);
* ``after-call``: reports the call and its result to an observer, kills the container after the
  side effect, rewrites a ListExecutions page, or runs another actor;
* ``before-send``, once per attempt (botocore's retries make several attempts of one call), twice:
  first, ahead of moto's handler, to refuse an attempt before it reaches AWS (``AttemptFaults``);
  last, after moto's handler has carried the attempt out, to lose its response (a read timeout).

A crash is ``Crash``, a ``BaseException``: it escapes ``except Exception`` as a Lambda timeout or
kill would, and from then on every call of that container raises it too, so no ``finally`` block
can reach AWS after the process died. The harness revives the container (a new one, in Lambda).

A throttle injected here is the ``ThrottlingException`` that reaches Sluice once botocore's own
retries have given up: before-call responses bypass the retry loop, so one injected throttle is one
refusal that Sluice sees. Throttles absorbed by botocore's retries change nothing Sluice can see,
except after an earlier attempt of the same call reached AWS: ``AttemptFaults`` plays that, on a
container whose clients retry as deployed.

Every fault that fires is counted in ``FAULTS`` (by kind), which the soak prints at the end.
"""

from __future__ import annotations

import copy
import json
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from botocore.awsrequest import AWSResponse
from botocore.exceptions import ReadTimeoutError

from tests.support.hooks import Crash, RawBody, error_answer
from tests.support.steps import (
    ALL_POINTS,
    AWAIT_POINTS,
    CRASH_POINTS,
    KEY_POINTS,
    LANE_POINTS,
    PROTOCOL_STEPS,
    SITUATIONAL_POINTS,
    STALE_MODES,
    THROTTLE_TARGETS,
    Call,
    protocol_step,
)

__all__ = [
    "ALL_POINTS",
    "ALWAYS",
    "AWAIT_POINTS",
    "CRASH_POINTS",
    "FAULTS",
    "KEY_POINTS",
    "LANE_POINTS",
    "PROTOCOL_STEPS",
    "SITUATIONAL_POINTS",
    "STALE_MODES",
    "STATS",
    "THROTTLE_TARGETS",
    "AttemptFaults",
    "Call",
    "Crash",
    "CrashAt",
    "CrashOnCall",
    "Fault",
    "Injector",
    "Interleave",
    "StaleList",
    "Throttle",
    "ThrottleAfter",
    "ThrottleCall",
    "count",
    "protocol_step",
]

FAULTS: Counter[str] = Counter()  # faults injected, by kind, over the whole process
STATS: Counter[str] = Counter()  # examples, steps and rules run by the property suite
_counter_lock = threading.Lock()

ALWAYS = 1_000_000


def count(kind: str, n: int = 1, counter: Counter[str] = FAULTS) -> None:
    with _counter_lock:
        counter[kind] += n


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

    def before_send(self, injector: Injector, call: Call, attempt: int, request: Any) -> AWSResponse | None:
        """Per attempt, ahead of moto. A response returned here refuses the attempt."""
        return None

    def after_send(self, injector: Injector, call: Call, attempt: int, request: Any) -> None:
        """Per attempt, after moto carried it out. May raise an HTTP client error (a lost response)."""
        return None


@dataclass
class CrashAt(Fault):
    """Kill the container at the ``nth`` time it reaches ``point`` (a key of ``ALL_POINTS``)."""

    point: str
    nth: int = 1
    seen: int = 0

    def _reached(self, injector: Injector, when: str, call: Call) -> None:
        expected_when, step = ALL_POINTS[self.point]
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
    """Refuse the next ``times`` calls to ``target`` (an operation or a protocol step), after
    letting the first ``skip`` of them through."""

    target: str
    times: int = 1
    fired: int = 0
    skip: int = 0

    def before(self, injector: Injector, call: Call) -> tuple[Any, dict[str, Any]] | None:
        if self.fired >= self.times or not call.matches(self.target):
            return None
        if self.skip > 0:
            self.skip -= 1
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
class ThrottleAfter(Fault):
    """Refuse the first ``target`` call (an operation or a protocol step) made after ``step`` has
    succeeded in this invocation: AWS failing right after a commit, whose effect a transient error
    must not undo (a message parked in its key's line, then its wake-up's read refused)."""

    step: str
    target: str
    armed: bool = False
    fired: bool = False

    def after(self, injector: Injector, call: Call, status: int, parsed: dict[str, Any]) -> None:
        if status < 300 and call.step == self.step:
            self.armed = True

    def before(self, injector: Injector, call: Call) -> tuple[Any, dict[str, Any]] | None:
        if not self.armed or self.fired or not call.matches(self.target):
            return None
        self.fired = True
        count(f"throttle_after:{self.step}:{self.target}")
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
        expected_when, step = ALL_POINTS[self.point]
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


# Where a refused attempt is sent instead of AWS: moto's before-send handler runs for every attempt,
# whatever an earlier handler answered, and carries out anything addressed to an AWS endpoint. A
# request addressed here is one moto does not recognise, so it reaches no backend.
NOWHERE = "https://refused-before-aws.invalid/"


def throttled_attempt(service: str, request: Any) -> AWSResponse:
    """The HTTP answer of a throttled attempt, for a JSON-protocol service."""
    code = _THROTTLE_CODES.get(service, "ThrottlingException")
    body = json.dumps({"__type": code, "message": f"{code} (injected)"}).encode()
    headers = {"Content-Type": "application/x-amz-json-1.0", "x-amzn-RequestId": "injected"}
    return AWSResponse(request.url, 400, headers, RawBody(body))


@dataclass
class AttemptFaults(Fault):
    """What happens to each attempt of the first call to ``target`` in this invocation, for a
    container whose clients retry (botocore's standard mode): ``plan[i]`` for attempt ``i + 1``.

    * ``lost``: the attempt reaches AWS, which carries it out (moto's handler runs), and its response
      is lost: ``ReadTimeoutError``, raised after moto's handler. The observer hears of the call as
      it reached AWS (no response body: the client never saw one);
    * ``throttled``: refused before it reaches AWS (``ThrottlingException``, readdressed to
      ``NOWHERE`` so that moto does not carry it out);
    * ``ok`` (or past the end of the plan): untouched.

    ``fired`` counts what was injected, by kind."""

    target: str
    plan: tuple[str, ...]
    fired: Counter[str] = field(default_factory=Counter)
    call: Call | None = None

    def before(self, injector: Injector, call: Call) -> None:
        if self.call is None and call.matches(self.target):
            self.call = call

    def _what(self, call: Call, attempt: int) -> str:
        if call is not self.call or attempt > len(self.plan):
            return "ok"
        return self.plan[attempt - 1]

    def before_send(self, injector: Injector, call: Call, attempt: int, request: Any) -> AWSResponse | None:
        if self._what(call, attempt) != "throttled":
            return None
        self.fired["throttled"] += 1
        count(f"attempt:throttled:{self.target}")
        request.url = NOWHERE
        return throttled_attempt(call.service, request)

    def after_send(self, injector: Injector, call: Call, attempt: int, request: Any) -> None:
        if self._what(call, attempt) != "lost":
            return
        self.fired["lost"] += 1
        count(f"attempt:lost_response:{self.target}")
        if injector.observer is not None:
            injector.observer.saw(call, 200, {})
        raise ReadTimeoutError(endpoint_url=request.url)


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
    _local: threading.local = field(default_factory=threading.local, repr=False)

    def attach(self, client: Any) -> Any:
        service = client.meta.service_model.service_name
        events = client.meta.events
        events.register("before-parameter-build", self._keep_params)
        events.register_first("before-call", partial(self._before_call, service))
        events.register("after-call", partial(self._after_call, service))
        # moto's handler is registered on "before-send" as a builtin: first runs before it, last after.
        events.register_first("before-send", self._before_send)
        events.register_last("before-send", self._after_send)
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
        self._local.call = call
        for fault in list(self.faults):
            response = fault.before(self, call)
            if response is not None:
                return response
        return None

    @staticmethod
    def _attempt(request: Any) -> int:
        """The attempt number botocore puts in the ``amz-sdk-request`` header (``attempt=2; max=3``)."""
        header = request.headers.get("amz-sdk-request") or b""
        if isinstance(header, bytes):
            header = header.decode("ascii", "replace")
        for part in header.split(";"):
            name, _, value = part.strip().partition("=")
            if name == "attempt" and value.isdigit():
                return int(value)
        return 1

    def _before_send(self, request: Any, **_: Any) -> AWSResponse | None:
        call = getattr(self._local, "call", None)
        if call is None:
            return None
        for fault in list(self.faults):
            response = fault.before_send(self, call, self._attempt(request), request)
            if response is not None:
                return response
        return None

    def _after_send(self, request: Any, **_: Any) -> None:
        call = getattr(self._local, "call", None)
        if call is None or request.url == NOWHERE:
            return
        for fault in list(self.faults):
            fault.after_send(self, call, self._attempt(request), request)

    def _after_call(
        self, service: str, http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any
    ) -> None:
        call = context.get("sluice.call")
        if call is None:
            return
        status = int(getattr(http_response, "status_code", 200))
        # A stale listing is what the caller got: rewrite it before the observer sees it. The other
        # faults come after the observer: a crash after a call must not hide the call's effect.
        stale = [f for f in self.faults if isinstance(f, StaleList)]
        for fault in stale:
            fault.after(self, call, status, parsed)
        if self.observer is not None:
            self.observer.saw(call, status, parsed)
        for fault in [f for f in self.faults if not isinstance(f, StaleList)]:
            fault.after(self, call, status, parsed)
        if (
            call.operation == "ListExecutions"
            and status < 300
            and not any(isinstance(f, StaleList) for f in self.faults)
        ):
            self.last_listing = copy.deepcopy(parsed.get("executions", []))

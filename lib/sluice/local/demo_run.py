"""The demo's run loop: it plays EventBridge (the launcher's schedule, a status-change event for each
execution that ended, one of them twice) around the deployed functions' containers, samples what runs,
and feeds the dashboard."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from sluice.adapters.dynamo.store import DynamoStore
from sluice.core.model import ExecutionStatus, Outcome
from sluice.local.dashboard import Dashboard, Snapshot
from sluice.local.deployment import Deployment
from sluice.local.events import status_change_event
from sluice.local.lambdas import Containers, InvocationError

if TYPE_CHECKING:
    from sluice.local.demo_batch import Producer
    from sluice.local.demo_options import Options


# What a launcher's summary counts (``sluice.core.model.Outcome``) that the demo shows.
OUTCOMES = ("started", "duplicate", "invalid", "resumed", "already_ran", "deferred", "returned")


class Pacing(Protocol):
    """The run's time: ``now`` in seconds (monotonic) and ``sleep``; a FakeClock in tests."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class WallClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class Run:
    """What the run saw: executions, samples, events delivered, invocations that failed."""

    def __init__(self, options: Options, console: Any, stack: str, clock: Pacing | None = None) -> None:
        self.o = options
        self.console = console
        self.snapshot = Snapshot(stack=stack, maximum=options.maximum)
        self.counts: Counter[str] = Counter()
        self.delivered: set[str] = set()
        self.executions: dict[str, dict[str, Any]] = {}  # name → last ListExecutions entry
        self.running: set[str] = set()  # RUNNING in the last ListExecutions
        self.samples: list[tuple[float, int]] = []  # (seconds since enqueue, RUNNING listed)
        self.waiting: list[tuple[float, int]] = []  # (seconds since enqueue, visible messages)
        self.errors: list[str] = []  # handler invocations that raised
        self.repeat: dict[str, Any] | None = None  # the event delivered twice on purpose
        self.repeated = 0
        self.repeated_released = 0
        self.clock: Pacing = clock or WallClock()
        self.echo: Callable[[str], None] | None = None  # the kept stack's lines (``keep``)
        self._pending: dict[Future[Any], tuple[str, str]] = {}  # invocation → (what, execution status)
        self._ticking: list[Future[Any]] = []
        self._next_tick = self._next_full = 0.0

    def loop(
        self, deployment: Deployment, containers: dict[str, Containers], started: float, producer: Producer
    ) -> bool:
        """Play EventBridge until every message is dealt with and every execution has ended and been
        reported. True when it gave up (``--timeout``)."""
        o, clock = self.o, self.clock
        sfn, sqs = deployment.aws.client("stepfunctions"), deployment.aws.client("sqs")
        out = deployment.outputs
        live = self.console.is_terminal if o.live is None else o.live
        deadline = clock.now() + o.timeout
        next_dlq = next_depth = 0.0
        dlq = 0
        depth: dict[str, int] = {}
        with Dashboard(self.console, live=live) as board:
            while True:
                running = self.play(deployment, containers)
                self.samples.append((time.time() - started, running))
                if clock.now() >= next_depth:
                    depth = queues_depth(sqs, out)
                    self.waiting.append((time.time() - started, depth["ApproximateNumberOfMessages"]))
                    next_depth = clock.now() + 0.5
                if clock.now() >= next_dlq:
                    dlq = queue_depth(sqs, out["DlqUrl"])["ApproximateNumberOfMessages"]
                    next_dlq = clock.now() + 2.0
                self._show(board, started, running, depth, dlq)
                # A tick is always on its way; with the queue empty and nothing held it can do nothing.
                if (
                    not producer.is_alive()
                    and all(what == "tick" for what, _ in self._pending.values())
                    and sum(queues_depth(sqs, out).values()) == 0
                    and running == 0
                    and self._all_delivered()
                    and not ledger_store(deployment).ledger().holders
                    and not ledger_store(deployment).waiting()  # no payload parked on its awaits
                    and not self._key_waiters(deployment)  # nor in a concurrency key's line
                ):
                    # The last line is exact, as the summary will be: every execution listed, the
                    # DLQ read now.
                    if self.poll(sfn, out["StateMachineArn"], full=True):
                        self._next_full = 0.0  # one ended unseen: deliver its event first
                        continue
                    dlq = queue_depth(sqs, out["DlqUrl"])["ApproximateNumberOfMessages"]
                    self._show(board, started, running, queues_depth(sqs, out), dlq, force=True)
                    return False
                if clock.now() > deadline:
                    self._show(board, started, running, depth, dlq, force=True)
                    return True
                clock.sleep(o.poll)

    def keep(
        self,
        deployment: Deployment,
        containers: dict[str, Containers],
        *,
        until: Callable[[], bool] = lambda: False,
        periods: int | None = None,
        echo: Callable[[str], None] | None = None,
    ) -> None:
        """The kept stack (``--keep``), after the summary: go on playing EventBridge as the run did
        (the schedule every ``--tick`` s, each execution's status-change event once it ends) until
        Ctrl-C, ``until()`` says so, or ``periods`` schedule periods have passed. ``echo`` gets one
        line for each tick that did something and each event delivered."""
        self.echo = echo
        end = None if periods is None else self.clock.now() + periods * self.o.tick
        while not until() and (end is None or self.clock.now() < end):
            self.play(deployment, containers)
            self.clock.sleep(self.o.poll)

    def play(self, deployment: Deployment, containers: dict[str, Containers]) -> int:
        """One round of EventBridge: the schedule rule fires when it is due (a tick still running is
        not doubled), finished invocations are harvested, and each execution that ended gets its
        status-change event, delivered to every target of the rules it matches. The RUNNING count."""
        clock, pending = self.clock, self._pending
        sfn = deployment.aws.client("stepfunctions")
        if clock.now() >= self._next_tick and all(f.done() for f in self._ticking):
            self._ticking = []
            for key, event in deployment.scheduled():
                future = containers[key].submit(event)
                self._ticking.append(future)
                pending[future] = ("tick", "")
            self._next_tick = clock.now() + self.o.tick
        for future in [f for f in pending if f.done()]:
            self._harvest(future, *pending.pop(future), deployment, containers, pending)
        # ListExecutions: RUNNING every round (the sample), everything every 2 s (the net for an
        # execution that started and ended between two rounds).
        full = clock.now() >= self._next_full
        if full:
            self._next_full = clock.now() + 2.0
        for name in self.poll(sfn, deployment.outputs["StateMachineArn"], full=full):
            described = sfn.describe_execution(executionArn=self.executions[name]["executionArn"])
            if not ExecutionStatus.terminal(described["status"]):
                continue
            self.executions[name] = {**self.executions[name], **described}
            event = status_change_event(described)
            self.delivered.add(name)
            for key in deployment.route(event):
                pending[containers[key].submit(event)] = ("event", described["status"])
                if self.repeat is None:
                    self.repeat = event
        return len(self.running)

    @staticmethod
    def _key_waiters(deployment: Any) -> int:
        store = ledger_store(deployment)
        return sum(store.key_state(k).waiting for k in store.keys_waiting())

    def _harvest(
        self,
        future: Future[Any],
        what: str,
        status: str,
        deployment: Deployment,
        containers: dict[str, Containers],
        pending: dict[Future[Any], tuple[str, str]],
    ) -> None:
        try:
            result = future.result()
        except Exception as exc:  # the function failed: Lambda would report and retry it
            error = str(exc) if isinstance(exc, InvocationError) else f"{type(exc).__name__}: {exc}"
            self.errors.append(f"{what}: {error}")
            self.counts["errors"] += 1
            if self.echo is not None:
                self.echo(f"{what} failed: {error}")
            return
        if self.echo is not None and what != "repeat":
            self._say(self.echo, what, result)
        if what == "tick":
            self._absorb(result)
            return
        if what == "repeat":
            self.repeated += 1
            self.repeated_released += bool(result.get("released"))
            return
        self.counts["events"] += 1
        if result.get("released"):
            self.counts[status.lower()] += 1
        if isinstance(result.get("admission"), dict):
            self._absorb(result["admission"])
        if (
            self.repeat is not None
            and self.repeated == 0
            and not any(w == "repeat" for w, _ in pending.values())
        ):
            # EventBridge delivers at least once: send the first event again, once its first delivery
            # is done, and show that it frees nothing.
            for key in deployment.route(self.repeat):
                pending[containers[key].submit(self.repeat)] = ("repeat", "")

    @staticmethod
    def _say(echo: Callable[[str], None], what: str, result: Any) -> None:
        if not isinstance(result, dict):
            return
        admission = result.get("admission") if what == "event" else result
        done = {
            k: v
            for k, v in (admission if isinstance(admission, dict) else {}).items()
            if k in {o.value for o in Outcome} and isinstance(v, int) and v
        }
        admitted = ", ".join(f"{k} {v}" for k, v in done.items())
        if what == "event":
            freed = "slot released" if result.get("released") else "nothing held"
            echo(
                f"status event: {result.get('execution')} {result.get('status')}: {freed}"
                + (f"; refill: {admitted}" if admitted else "")
            )
        elif admitted:
            echo(f"schedule tick: {admitted}")

    def poll(self, sfn: Any, arn: str, *, full: bool) -> list[str]:
        """Names of executions that have ended and were not reported yet."""
        before = set(self.running)
        request: dict[str, Any] = {"stateMachineArn": arn, "PaginationConfig": {"PageSize": 1000}}
        if not full:
            request["statusFilter"] = "RUNNING"
        now: set[str] = set()
        for page in sfn.get_paginator("list_executions").paginate(**request):
            for entry in page["executions"]:
                self.executions[entry["name"]] = entry
                if entry["status"] == "RUNNING":
                    now.add(entry["name"])
        self.running = now
        left = before - now  # no longer RUNNING: ended (DescribeExecution will say how)
        if full:
            left |= {n for n, e in self.executions.items() if ExecutionStatus.terminal(e["status"])}
        return sorted(n for n in left if n not in self.delivered)

    def _absorb(self, summary: dict[str, Any]) -> None:
        for outcome in OUTCOMES:
            self.counts[outcome] += int(summary.get(outcome, 0) or 0)

    def _all_delivered(self) -> bool:
        return all(e["status"] == "RUNNING" or n in self.delivered for n, e in self.executions.items())

    def _show(
        self,
        board: Dashboard,
        started: float,
        running: int,
        depth: dict[str, int],
        dlq: int,
        *,
        force: bool = False,
    ) -> None:
        s = self.snapshot
        s.elapsed = time.time() - started
        s.running = running
        s.peak = max(s.peak, running)
        s.waiting = depth["ApproximateNumberOfMessages"]
        s.in_flight = depth["ApproximateNumberOfMessagesNotVisible"]
        s.dlq = dlq
        s.statuses = dict(Counter(e["status"] for e in self.executions.values()))
        s.counts = dict(self.counts)
        s.events = self.counts["events"]
        s.repeated, s.repeated_released = self.repeated, self.repeated_released
        s.history.append(running)
        board.update(s, force=force)


def ledger_store(deployment: Deployment) -> DynamoStore:
    return DynamoStore(deployment.aws.client("dynamodb"), deployment.outputs["TableName"])


def payload_queues(outputs: dict[str, str]) -> list[str]:
    """Every lane's queue: the stack's payload queue (lane default) and the other lanes' (``LaneQueueUrls``)."""
    lanes = [part.partition("=")[2] for part in outputs.get("LaneQueueUrls", "").split(",") if "=" in part]
    return [outputs["QueueUrl"], *lanes]


def queues_depth(sqs: Any, outputs: dict[str, str]) -> dict[str, int]:
    """``queue_depth`` summed over every lane's queue."""
    total: dict[str, int] = {}
    for url in payload_queues(outputs):
        for k, v in queue_depth(sqs, url).items():
            total[k] = total.get(k, 0) + v
    return total


def queue_depth(sqs: Any, url: str) -> dict[str, int]:
    attrs = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    return {k: int(v) for k, v in attrs.items()}

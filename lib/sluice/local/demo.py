"""``make demo``: Sluice end to end on an embedded AWS.

    osls package ──► moto server (127.0.0.1, free port) ──► deploy as `sls deploy` does
          │
          ▼
    demo workflow (Wait for $.seconds, Choice → Fail when $.fail), really executed by moto
          │
    batch ──► sluice.enqueue (valid) + raw SendMessage (invalid) ──► FIFO queue
          │
    loop: every --tick s fire the deployed schedule rule        → launcher handler
          poll ListExecutions; each execution that ended        → completion handler (once;
                                                                   one event twice, on purpose)
          sample running / queue / DLQ                          → dashboard
          │
    account for every message, chart running vs MAX, exit 1 if MAX was exceeded or one is missing

The launcher and completion handlers are the deployed ones (``handlers/…``) and run in this process
with the environment GetFunctionConfiguration returns for them. Their logs and metrics go to
``<out>/handlers.log``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import random
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sluice.enqueue import Item, enqueue, read_items
from sluice.local import chart
from sluice.local.dashboard import Dashboard, Snapshot
from sluice.local.embedded import (
    ACCOUNT,
    REGION,
    DeployError,
    Deployment,
    EmbeddedAws,
    PackagingError,
    package_stack,
    status_change_event,
)
from sluice.local.lambdas import Containers
from sluice.names import execution_name

STAGE = "demo"
STACK = f"sluice-{STAGE}"
WORKFLOW = "sluice-demo-jobs"
WORKFLOW_ARN = f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:{WORKFLOW}"
# Raw messages each get a group of their own ("raw-1", ...): a dead-lettered message keeps its group,
# and the DLQ can only be read in full when no group holds more than one receive's worth.
RAW_GROUP = "raw"
TERMINAL = ("SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED")

# Wait $.seconds (2 s when absent or not a number), then fail when $.fail is true, else succeed.
DEMO_WORKFLOW: dict[str, Any] = {
    "Comment": "Sluice demo job: waits the payload's seconds, fails when the payload asks to.",
    "StartAt": "HasSeconds",
    "States": {
        "HasSeconds": {
            "Type": "Choice",
            "Choices": [
                {
                    "And": [
                        {"Variable": "$.seconds", "IsPresent": True},
                        {"Variable": "$.seconds", "IsNumeric": True},
                    ],
                    "Next": "Work",
                }
            ],
            "Default": "WorkTwoSeconds",
        },
        "Work": {"Type": "Wait", "SecondsPath": "$.seconds", "Next": "ShouldFail"},
        "WorkTwoSeconds": {"Type": "Wait", "Seconds": 2, "Next": "ShouldFail"},
        "ShouldFail": {
            "Type": "Choice",
            "Choices": [
                {
                    "And": [
                        {"Variable": "$.fail", "IsPresent": True},
                        {"Variable": "$.fail", "BooleanEquals": True},
                    ],
                    "Next": "Failed",
                }
            ],
            "Default": "Done",
        },
        "Failed": {"Type": "Fail", "Error": "DemoFailure", "Cause": "the payload asked to fail"},
        "Done": {"Type": "Succeed"},
    },
}

# Bodies a careless producer sends with the AWS CLI; the launcher dead-letters each with a reason.
INVALID_BODIES = [
    '{"id": "order-broken", "seconds": 2',
    "[1, 2, 3]",
    "{}",
    '"just a string"',
    '{"a": ' * 70 + "1" + "}" * 70,
    "null",
]


@dataclass
class Options:
    maximum: int = 10
    count: int = 200
    payloads: Path | None = None
    seed: int = 7
    out: Path = Path("demo-out")
    tick: float = 2.0  # how often the demo fires the launcher's schedule rule
    workers: int = 4  # completion invocations at once (Lambda containers)
    poll: float = 0.25  # how often it looks for ended executions
    timeout: float = 300.0  # gives up (and fails) after this long in the run loop
    live: bool | None = None  # None: live dashboard when stdout is a terminal
    keep: bool = False  # keep the embedded AWS up after the summary, for the operator CLI


@dataclass(frozen=True)
class Planned:
    """One message to send: a payload through sluice.enqueue, or a raw body through SendMessage."""

    where: str
    body: str
    raw: bool = False
    resubmission: bool = False


@dataclass(frozen=True)
class Sent:
    where: str
    message_id: str
    key: str | None  # None for raw bodies
    group: str
    raw: bool
    resubmission: bool


@dataclass
class Result:
    ok: bool = False
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    maximum: int = 0
    messages: int = 0
    payload_messages: int = 0
    raw_messages: int = 0
    resubmissions: int = 0
    groups: int = 0
    fates: dict[str, int] = field(default_factory=dict)  # started, duplicate, invalid, dead_lettered, lost
    resubmission_fates: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)  # SUCCEEDED, FAILED, ...
    peak_sampled: int = 0
    peak_timed: int = 0
    samples: int = 0
    events_delivered: int = 0
    repeated_events: int = 0
    repeated_released: int = 0
    ledger_holders: int = 0
    queue_left: int = 0
    dlq: int = 0
    dlq_reasons: dict[str, str] = field(default_factory=dict)
    handler_errors: list[str] = field(default_factory=list)
    order_violations: list[str] = field(default_factory=list)  # keys whose later message ran instead
    unexpected_executions: list[str] = field(default_factory=list)
    record_mismatches: list[str] = field(default_factory=list)
    chart: str = ""
    log: str = ""
    timeline: dict[str, Any] = field(default_factory=dict)


# -- the batch -----------------------------------------------------------------------------------


def generate_batch(count: int, seed: int) -> list[Planned]:
    """``count`` messages: about 2% invalid, 5% re-submissions of an earlier payload right behind it in
    its FIFO group, the rest distinct orders of 8 customers (the message groups), each waiting 1 to 3 s,
    one in ten failing."""
    rng = random.Random(seed)
    invalid = max(1, round(count * 0.02)) if count >= 10 else 0
    resubmitted = max(1, round(count * 0.05)) if count >= 10 else 0
    distinct = max(1, count - invalid - resubmitted)
    customers = [f"customer-{c:02d}" for c in range(1, min(8, distinct) + 1)]
    payloads = [
        {
            "id": f"order-{i:04d}",
            "customer": rng.choice(customers),
            "seconds": rng.choice((1, 2, 3)),
            "fail": rng.random() < 0.1,
            "attempt": 1,
        }
        for i in range(1, distinct + 1)
    ]
    again = set(rng.sample(range(distinct), min(resubmitted, distinct)))
    planned: list[Planned] = []
    for i, payload in enumerate(payloads):
        planned.append(Planned(f"payload {len(planned) + 1}", json.dumps(payload)))
        if i in again:
            retry = {**payload, "attempt": 2}
            planned.append(Planned(f"payload {len(planned) + 1}", json.dumps(retry), resubmission=True))
    # Invalid bodies arrive spread over the batch, as they would from a careless producer.
    for n in range(invalid):
        at = rng.randrange(len(planned) + 1)
        planned.insert(at, Planned("raw", INVALID_BODIES[n % len(INVALID_BODIES)], raw=True))
    return [Planned(f"message {i}", p.body, p.raw, p.resubmission) for i, p in enumerate(planned, 1)]


def load_batch(path: Path) -> list[Planned]:
    """A file of payloads (a JSON array, one object, or JSON Lines). Lines sluice.enqueue would refuse
    are sent raw, so they reach the launcher and the DLQ."""
    from sluice.enqueue import prepare
    from sluice.errors import InvalidPayload

    planned: list[Planned] = []
    seen: set[str] = set()
    for item in read_items(path.read_text(encoding="utf-8")):
        try:
            key = prepare(item).key
        except InvalidPayload:
            planned.append(Planned(item.where, item.body, raw=True))
            continue
        planned.append(Planned(item.where, item.body, resubmission=key in seen))
        seen.add(key)
    return planned


def send_batch(sqs: Any, queue_url: str, planned: list[Planned], *, group_by: str | None) -> list[Sent]:
    """Valid payloads through ``sluice.enqueue`` (batches of 10), raw bodies with plain SendMessage."""
    sent: list[Sent] = []
    run: list[Planned] = []

    def flush() -> None:
        if not run:
            return
        items = [Item(p.where, p.body) for p in run]
        report = enqueue(sqs, queue_url, items, group_by=group_by)
        by_where = {p.where: p for p in run}
        for where, key, message_id in report.sent:
            body = json.loads(by_where[where].body)
            group = str(body[group_by]) if group_by else key
            sent.append(Sent(where, message_id, key, group, False, by_where[where].resubmission))
        for where, _reason in report.failed:
            # Refused by sluice.enqueue after all: a producer without it would send it anyway.
            sent.append(_send_raw(sqs, queue_url, by_where[where]))
        run.clear()

    for p in planned:
        if p.raw:
            flush()
            sent.append(_send_raw(sqs, queue_url, p))
        else:
            run.append(p)
    flush()
    return sent


class Producer(threading.Thread):
    """Sends the batch in the background with a client of its own."""

    def __init__(self, aws: EmbeddedAws, queue_url: str, planned: list[Planned], by_customer: bool) -> None:
        super().__init__(name="producer", daemon=True)
        self.sqs = aws.session().client("sqs", endpoint_url=aws.endpoint)
        self.queue_url = queue_url
        self.planned = planned
        self.group_by = "customer" if by_customer else None
        self.sent: list[Sent] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.sent = send_batch(self.sqs, self.queue_url, self.planned, group_by=self.group_by)
        except BaseException as exc:  # reported by the main thread
            self.error = exc


def _send_raw(sqs: Any, queue_url: str, p: Planned) -> Sent:
    group = f"{RAW_GROUP}-{uuid.uuid4().hex[:8]}"
    message_id = sqs.send_message(
        QueueUrl=queue_url,
        MessageBody=p.body,
        MessageGroupId=group,
        MessageDeduplicationId=uuid.uuid4().hex,
    )["MessageId"]
    return Sent(p.where, message_id, None, group, True, False)


# -- the run --------------------------------------------------------------------------------------


class Demo:
    def __init__(self, options: Options, console: Any) -> None:
        self.o = options
        self.console = console
        self.snapshot = Snapshot(stack=STACK, maximum=options.maximum)
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

    # -- phases -------------------------------------------------------------------------------

    def run(self) -> Result:
        o = self.o
        o.out.mkdir(parents=True, exist_ok=True)
        log = o.out / "handlers.log"
        log.write_text("")
        planned = load_batch(o.payloads) if o.payloads else generate_batch(o.count, o.seed)
        with tempfile.TemporaryDirectory(prefix="sluice-demo-") as work:
            with self._step(f"Packaging the stack with osls (stage {STAGE}, MAX {o.maximum})"):
                package = package_stack(
                    Path(work),
                    stage=STAGE,
                    params={"maxConcurrency": str(o.maximum), "stateMachineArn": WORKFLOW_ARN},
                )
            with EmbeddedAws(own_process=True, log=o.out / "moto.log") as aws:
                self.snapshot.endpoint = aws.endpoint
                with self._step(f"Deploying into the embedded AWS at {aws.endpoint}"):
                    aws.execute_state_machines()
                    aws.client("stepfunctions").create_state_machine(
                        name=WORKFLOW,
                        definition=json.dumps(DEMO_WORKFLOW),
                        roleArn=f"arn:aws:iam::{ACCOUNT}:role/{WORKFLOW}",
                    )
                    deployment = aws.deploy(package, STACK)
                if deployment.outputs["StateMachineArn"] != WORKFLOW_ARN:
                    raise RuntimeError(f"the stack drives {deployment.outputs['StateMachineArn']}")
                scheduled = {key for key, _ in deployment.scheduled()}
                sizes = {key: 1 if key in scheduled else o.workers for key in deployment.functions}
                containers = {
                    key: Containers(deployment, key, size=size, log=log, root=Path.cwd())
                    for key, size in sizes.items()
                }
                try:
                    with self._step(
                        "Starting Lambda containers: "
                        + ", ".join(f"{key} ×{size}" for key, size in sorted(sizes.items()))
                    ):
                        for pool in containers.values():
                            pool.warm()
                    # A producer sends the batch while Sluice already runs, as producers do.
                    producer = Producer(aws, deployment.outputs["QueueUrl"], planned, o.payloads is None)
                    self.snapshot.messages = len(planned)
                    print(f"Enqueueing {len(planned)} messages while Sluice runs …", flush=True)
                    started = time.time()
                    producer.start()
                    timed_out = self._loop(deployment, containers, started, producer)
                    producer.join()
                    if producer.error is not None:
                        raise producer.error
                    sent = producer.sent
                finally:
                    for pool in containers.values():
                        pool.close()
                result = self._account(deployment, sent, started, timed_out)
                result.log = str(log)
                (o.out / "summary.json").write_text(json.dumps(asdict(result), indent=2, default=str))
                self._report(result)
                if o.keep:
                    self._hold(aws)
        return result

    def _report(self, result: Result) -> None:
        for line in summary_lines(result):
            style = "" if not line.startswith("RESULT") else ("bold green" if result.ok else "bold red")
            self.console.print(line, style=style, markup=False, highlight=False, soft_wrap=True)

    def _hold(self, aws: EmbeddedAws) -> None:
        """Keep the embedded AWS up for the operator CLI until Ctrl-C."""
        exports = {**aws.environ()}
        self.console.print(
            "\nThe embedded AWS stays up; in another shell:\n"
            + "".join(f"  export {k}={v}\n" for k, v in exports.items())
            + f"  sluice status --stage {STAGE}\n"
            + "Ctrl-C stops it.",
            markup=False,
            highlight=False,
        )
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)

    @contextlib.contextmanager
    def _step(self, text: str) -> Any:
        began = time.monotonic()
        if self.console.is_terminal:
            with self.console.status(text + " …"):
                yield
        else:
            print(text + " …", flush=True)
            yield
        self.console.print(f"{text}: done in {time.monotonic() - began:.1f} s", highlight=False)

    def _loop(
        self, deployment: Deployment, containers: dict[str, Containers], started: float, producer: Producer
    ) -> bool:
        """Play EventBridge until every message is dealt with and every execution has ended and been
        reported. True when it gave up (``--timeout``)."""
        o = self.o
        sfn, sqs = deployment.aws.client("stepfunctions"), deployment.aws.client("sqs")
        out = deployment.outputs
        live = self.console.is_terminal if o.live is None else o.live
        deadline = time.monotonic() + o.timeout
        next_tick = next_dlq = next_depth = next_full = 0.0
        dlq = 0
        depth: dict[str, int] = {}
        ticking: list[Future[Any]] = []
        pending: dict[Future[Any], tuple[str, str]] = {}  # future → (what, execution status)
        with Dashboard(self.console, live=live) as board:
            while True:
                # The schedule rule fires; a tick still running is not doubled.
                if time.monotonic() >= next_tick and all(f.done() for f in ticking):
                    ticking = []
                    for key, event in deployment.scheduled():
                        future = containers[key].submit(event)
                        ticking.append(future)
                        pending[future] = ("tick", "")
                    next_tick = time.monotonic() + o.tick
                for future in [f for f in pending if f.done()]:
                    self._harvest(future, *pending.pop(future), deployment, containers, pending)
                # ListExecutions: RUNNING every round (the sample), everything every 2 s (the net
                # for an execution that started and ended between two rounds).
                full = time.monotonic() >= next_full
                if full:
                    next_full = time.monotonic() + 2.0
                ended = self._poll(sfn, out["StateMachineArn"], full=full)
                running = len(self.running)
                self.samples.append((time.time() - started, running))
                for name in ended:
                    # EventBridge: the status-change event, to every target of the rules it matches.
                    described = sfn.describe_execution(executionArn=self.executions[name]["executionArn"])
                    if described["status"] not in TERMINAL:
                        continue
                    self.executions[name] = {**self.executions[name], **described}
                    event = status_change_event(described)
                    self.delivered.add(name)
                    for key in deployment.route(event):
                        pending[containers[key].submit(event)] = ("event", described["status"])
                        if self.repeat is None:
                            self.repeat = event
                if time.monotonic() >= next_depth:
                    depth = _depth(sqs, out["QueueUrl"])
                    self.waiting.append((time.time() - started, depth["ApproximateNumberOfMessages"]))
                    next_depth = time.monotonic() + 0.5
                if time.monotonic() >= next_dlq:
                    dlq = _depth(sqs, out["DlqUrl"])["ApproximateNumberOfMessages"]
                    next_dlq = time.monotonic() + 2.0
                self._show(board, started, running, depth, dlq)
                # A tick is always on its way; with the queue empty and nothing held it can do nothing.
                if (
                    not producer.is_alive()
                    and all(what == "tick" for what, _ in pending.values())
                    and sum(_depth(sqs, out["QueueUrl"]).values()) == 0
                    and running == 0
                    and self._all_delivered()
                    and not _store(deployment).ledger().holders
                ):
                    board.update(self.snapshot, force=True)
                    return False
                if time.monotonic() > deadline:
                    board.update(self.snapshot, force=True)
                    return True
                time.sleep(o.poll)

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
        except Exception as exc:  # a handler that raised: Lambda would report and retry it
            self.errors.append(f"{what}: {type(exc).__name__}: {exc}")
            self.counts["errors"] += 1
            return
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

    def _poll(self, sfn: Any, arn: str, *, full: bool) -> list[str]:
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
            left |= {n for n, e in self.executions.items() if e["status"] in TERMINAL}
        return sorted(n for n in left if n not in self.delivered)

    def _absorb(self, summary: dict[str, Any]) -> None:
        for outcome in ("started", "duplicate", "invalid", "resumed", "already_ran", "deferred", "returned"):
            self.counts[outcome] += int(summary.get(outcome, 0) or 0)

    def _all_delivered(self) -> bool:
        return all(e["status"] == "RUNNING" or n in self.delivered for n, e in self.executions.items())

    def _show(self, board: Dashboard, started: float, running: int, depth: dict[str, int], dlq: int) -> None:
        s = self.snapshot
        s.elapsed = time.time() - started
        s.running = running
        s.peak = max(s.peak, running)
        s.waiting = depth["ApproximateNumberOfMessages"]
        s.in_flight = depth["ApproximateNumberOfMessagesNotVisible"]
        s.dlq = dlq
        s.counts = dict(self.counts)
        s.events = self.counts["events"]
        s.repeated, s.repeated_released = self.repeated, self.repeated_released
        s.history.append(running)
        board.update(s)

    # -- the reckoning ----------------------------------------------------------------------

    def _account(self, deployment: Deployment, sent: list[Sent], started: float, timed_out: bool) -> Result:
        o, aws, out = self.o, deployment.aws, deployment.outputs
        sfn, sqs = aws.client("stepfunctions"), aws.client("sqs")
        store = _store(deployment)
        self._poll(sfn, out["StateMachineArn"], full=True)
        ran = dict(self.executions)
        dead = _dlq_messages(sqs, out["DlqUrl"])
        dead_ids = {m["source"]: m["reason"] for m in dead}

        r = Result(maximum=o.maximum, messages=len(sent))
        r.payload_messages = sum(not s.raw for s in sent)
        r.raw_messages = sum(s.raw for s in sent)
        r.resubmissions = sum(s.resubmission for s in sent)
        fates: Counter[str] = Counter()
        resub: Counter[str] = Counter()
        expected: set[str] = set()
        maybe_duplicate: dict[str, list[Sent]] = {}
        for s in sent:
            name = execution_name(s.key, s.message_id) if s.key is not None else None
            if name is not None:
                expected.add(name)
            if name is not None and name in ran:
                fate = "started"
            elif s.message_id in dead_ids:
                fate = "invalid" if s.raw else "dead_lettered"
            elif s.key is not None:
                maybe_duplicate.setdefault(s.key, []).append(s)
                continue
            else:
                fate = "lost"
            fates[fate] += 1
            if s.resubmission:
                resub[fate] += 1
        for key, messages in maybe_duplicate.items():
            record = store.payload(key)
            recorded = record.duplicates if record else 0
            for i, s in enumerate(messages):
                fate = "duplicate" if i < recorded else "lost"
                fates[fate] += 1
                if s.resubmission:
                    resub[fate] += 1
        r.fates = dict(fates)
        # FIFO order within a group: a payload's later message never runs when an earlier one was
        # suppressed as its duplicate (that would mean the group was handed out twice at once).
        by_key: dict[str, list[Sent]] = {}
        for s in sent:
            if s.key is not None:
                by_key.setdefault(s.key, []).append(s)
        for key, messages in by_key.items():
            ran_flags = [execution_name(key, m.message_id) in ran for m in messages]
            if any(
                not earlier and later for i, earlier in enumerate(ran_flags) for later in ran_flags[i + 1 :]
            ):
                r.order_violations.append(key)
        r.resubmission_fates = dict(resub)
        r.groups = len({s.group for s in sent})
        r.unexpected_executions = sorted(set(ran) - expected)
        r.statuses = dict(Counter(e["status"] for e in ran.values()))

        records = store.executions(ran)
        for name, e in ran.items():
            record = records.get(name)
            if record is None or record.state.value != e["status"]:
                r.record_mismatches.append(
                    f"{name}: Step Functions {e['status']}, record {record and record.state}"
                )

        intervals = [
            (e["startDate"].timestamp() - started, e["stopDate"].timestamp() - started)
            for e in ran.values()
            if e.get("stopDate") is not None
        ]
        r.peak_timed = chart.peak(intervals)
        r.peak_sampled = max((n for _, n in self.samples), default=0)
        r.samples = len(self.samples)
        r.events_delivered = self.counts["events"]
        r.repeated_events, r.repeated_released = self.repeated, self.repeated_released
        r.handler_errors = self.errors
        r.ledger_holders = len(store.ledger().holders)
        r.queue_left = sum(_depth(sqs, out["QueueUrl"]).values())
        r.dlq = len(dead)
        r.dlq_reasons = {m["source"]: m["reason"] for m in dead}
        r.seconds = round(time.time() - started, 1)
        r.timeline = {
            "intervals": [[round(a, 3), round(b, 3)] for a, b in sorted(intervals)],
            "samples": [[round(t, 3), n] for t, n in self.samples],
            "waiting": [[round(t, 3), n] for t, n in self.waiting],
        }

        problems = r.problems
        if timed_out:
            problems.append(f"gave up after {o.timeout:.0f} s with work left")
        if r.peak_sampled > o.maximum or r.peak_timed > o.maximum:
            problems.append(f"MAX {o.maximum} exceeded: peak {max(r.peak_sampled, r.peak_timed)}")
        if fates["lost"]:
            problems.append(f"{fates['lost']} message(s) unaccounted for")
        if r.unexpected_executions:
            problems.append(f"{len(r.unexpected_executions)} execution(s) no message asked for")
        if r.record_mismatches:
            problems.append(f"{len(r.record_mismatches)} record(s) disagree with Step Functions")
        if r.ledger_holders:
            problems.append(f"the ledger still holds {r.ledger_holders} slot(s)")
        if r.queue_left:
            problems.append(f"{r.queue_left} message(s) left in the queue")
        if r.order_violations:
            problems.append(f"FIFO order broken for {', '.join(r.order_violations)}")
        if r.handler_errors:
            problems.append(f"{len(r.handler_errors)} handler invocation(s) raised: {r.handler_errors[0]}")
        if r.repeated_released:
            problems.append("a repeated status event released a slot")
        if any(s not in ("SUCCEEDED", "FAILED") for s in r.statuses):
            problems.append(f"unexpected execution statuses: {r.statuses}")

        r.chart = str(
            chart.draw(
                o.out / "demo-chart.png",
                intervals=intervals,
                samples=self.samples,
                waiting=self.waiting,
                maximum=o.maximum,
                title=(
                    f"Sluice demo: {len(ran)} executions from {len(sent)} messages, MAX {o.maximum}, "
                    f"peak {max(r.peak_timed, r.peak_sampled)}"
                ),
            )
        )
        r.ok = not problems
        return r


def _store(deployment: Deployment) -> Any:
    from sluice.adapters.dynamodb import DynamoStore

    return DynamoStore(deployment.aws.client("dynamodb"), deployment.outputs["TableName"])


def _depth(sqs: Any, url: str) -> dict[str, int]:
    attrs = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    return {k: int(v) for k, v in attrs.items()}


def _dlq_messages(sqs: Any, url: str) -> list[dict[str, str]]:
    """Read every DLQ message (source message id and reason), then make them visible again."""
    found: list[dict[str, str]] = []
    receipts: list[str] = []
    while True:
        got = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], VisibilityTimeout=600
        ).get("Messages", [])
        if not got:
            for i in range(0, len(receipts), 10):
                sqs.change_message_visibility_batch(
                    QueueUrl=url,
                    Entries=[
                        {"Id": str(n), "ReceiptHandle": r, "VisibilityTimeout": 0}
                        for n, r in enumerate(receipts[i : i + 10])
                    ],
                )
            return found
        receipts += [m["ReceiptHandle"] for m in got]
        for m in got:
            attrs = m.get("MessageAttributes", {})
            found.append(
                {
                    "source": attrs.get("sluice-source-message-id", {}).get("StringValue", ""),
                    "reason": attrs.get("sluice-error", {}).get("StringValue", ""),
                }
            )


# -- output -----------------------------------------------------------------------------------------


def summary_lines(r: Result) -> list[str]:
    f, rf = r.fates, r.resubmission_fates
    peak = max(r.peak_sampled, r.peak_timed)
    mark = "ok" if peak <= r.maximum else "EXCEEDED"
    lines = [
        f"Sluice demo: {r.messages} messages in {r.groups} message groups ({r.payload_messages} payloads, "
        f"{r.resubmissions} of them re-submissions; {r.raw_messages} invalid sent raw), MAX {r.maximum}, "
        f"{r.seconds:.1f} s",
        f"  peak running, ListExecutions samples : {r.peak_sampled:>3} / MAX {r.maximum}  ({r.samples} samples)",
        f"  peak running, start/stop times       : {r.peak_timed:>3} / MAX {r.maximum}  {mark}",
        f"  executions  : {f.get('started', 0)} started: "
        + ", ".join(f"{n} {s.lower()}" for s, n in sorted(r.statuses.items())),
        f"  duplicates  : {f.get('duplicate', 0)} suppressed while their payload ran"
        + (
            f" ({rf.get('duplicate', 0)} of {r.resubmissions} re-submissions; "
            f"{rf.get('started', 0)} ran again after the first run ended)"
            if r.resubmissions
            else ""
        ),
        f"  invalid     : {f.get('invalid', 0)} of {r.raw_messages} raw messages in the DLQ with a reason",
    ]
    if f.get("dead_lettered"):
        lines.append(
            f"  dead-letter : {f['dead_lettered']} valid-looking payload(s) refused by Step Functions"
        )
    accounted = sum(n for k, n in f.items() if k != "lost")
    lines += [
        f"  accounted   : {accounted} / {r.messages} messages, {f.get('lost', 0)} lost; queue {r.queue_left} left, "
        f"ledger {r.ledger_holders} slot(s) held",
        f"  events      : {r.events_delivered} status changes delivered, "
        f"{r.repeated_events} repeated on purpose (released {r.repeated_released})",
        f"  chart       : {r.chart}",
        f"  handler logs: {r.log}",
    ]
    for reason in list(dict.fromkeys(r.dlq_reasons.values()))[:6]:
        lines.append(f"    DLQ reason: {reason}")
    lines.append("RESULT: " + ("OK" if r.ok else "FAILED: " + "; ".join(r.problems)))
    return lines


def parse_args(argv: list[str] | None = None) -> Options:
    p = argparse.ArgumentParser(
        prog="python -m sluice.local.demo",
        description="Run Sluice end to end on an embedded AWS (moto server): package, deploy, run a batch.",
    )
    p.add_argument(
        "--max", type=int, default=10, dest="maximum", help="MAX, the most executions at once (10)"
    )
    p.add_argument("--count", type=int, default=200, help="messages in the generated batch (200)")
    p.add_argument("--payloads", type=Path, help="send this file instead (JSON array, object or JSON Lines)")
    p.add_argument("--seed", type=int, default=7, help="seed of the generated batch (7)")
    p.add_argument("--out", type=Path, default=Path("demo-out"), help="chart, summary and logs (demo-out/)")
    p.add_argument("--tick", type=float, default=2.0, help="seconds between launcher runs (2)")
    p.add_argument("--workers", type=int, default=4, help="completion invocations at once (4)")
    p.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds (300)")
    p.add_argument("--keep", action="store_true", help="keep the embedded AWS up afterwards (for `sluice`)")
    view = p.add_mutually_exclusive_group()
    view.add_argument("--live", dest="live", action="store_true", default=None, help="live dashboard")
    view.add_argument("--plain", dest="live", action="store_false", help="plain progress lines")
    a = p.parse_args(argv)
    if a.maximum < 1:
        p.error("--max must be at least 1")
    if a.count < 1:
        p.error("--count must be at least 1")
    if a.payloads and not a.payloads.is_file():
        p.error(f"--payloads {a.payloads}: no such file")
    return Options(
        maximum=a.maximum,
        count=a.count,
        payloads=a.payloads,
        seed=a.seed,
        out=a.out,
        tick=a.tick,
        workers=max(1, a.workers),
        timeout=a.timeout,
        live=a.live,
        keep=a.keep,
    )


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    options = parse_args(argv)
    # The handlers are imported from the project root, as Lambda imports them from /var/task.
    root = str(Path.cwd())
    if root not in sys.path:
        sys.path.insert(0, root)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    logging.getLogger("moto").setLevel(logging.CRITICAL)
    import warnings

    warnings.filterwarnings("ignore", message="Tried to parse AWS::", category=UserWarning)
    console = Console()

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    # SIGTERM stops as Ctrl-C does: the containers and the embedded AWS are shut down on the way out.
    signal.signal(signal.SIGTERM, stop)
    try:
        result = Demo(options, console).run()
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130
    except (PackagingError, DeployError) as exc:
        console.print(f"demo: {exc}", style="bold red", markup=False, highlight=False)
        return 2
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""The world the reliability suite runs Sluice in.

One moto account holds the stack (FIFO queue and DLQ, table, state machine, MAX parameter).
Three Lambda containers use it: launchers ``A`` and ``B`` (B's clock may be skewed) and the
``completion`` function. Each container is a real ``sluice.runtime.Runtime`` whose boto3 clients
carry an ``Injector``; every call they make is reported to one ``Model``, which checks the
promises as they could break. The world plays the parts moto does not: EventBridge (status
events, delivered when the test says: late, twice, out of order or never), the passing of time
(a ``FakeClock``; SQS visibility runs on real time in moto, so a message whose visibility timeout
has run out by the fake clock is made visible through ChangeMessageVisibility), the operator
(MAX in SSM), and whatever changes AWS behind Sluice's back (``actors.BehindTheBack``: redrives,
executions stopped or started by hand, DynamoDB's TTL). A container may be added whose clients
retry as deployed (``add_container``).

With ``lanes`` (the stack parameter, e.g. ``fast:1:1,default:2``: ``sluice.features.lanes``) the stack has a
queue per lane, as ``build_stack`` makes it, and the containers' launchers run with
``Settings.lanes``: the producer sends to a lane's queue (``send(lane=...)``), time makes messages
visible again in whichever queue they were received from, and every count of "the queue" (depth,
backlog, drain) covers every lane's queue. The operator sets a lane's MAX as ``sluice set-max N
--lane NAME`` does (``set_lane_max``), also between two steps of a tick.

Nothing here sleeps. Nothing here edits Sluice: it runs ``Launcher.tick`` and
``Launcher.on_status_change`` exactly as the handlers do.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from typing import Any

from moto import mock_aws

from sluice.core.clock import FakeClock
from sluice.core.errors import TransientError
from sluice.core.events import StatusChange
from sluice.core.records import LaneSetting
from sluice.features.lanes import DEFAULT_LANE
from sluice.launch.settings import DuplicatePolicy
from sluice.ops.keys import set_key_max
from sluice.ops.lanes import change_lane
from sluice.ops.maximum import set_max
from sluice.runtime import Runtime
from tests.reliability.actors import (
    SERVICES,
    BehindTheBack,
    ClientPool,
    Container,
    Event,
    SkewedClock,
    pool,
)
from tests.reliability.promises import CLAIM_TIMEOUT, VISIBILITY, WINDOW, PromiseBroken, Promises
from tests.support.aws import NO_RETRY, build_stack, status_change_event
from tests.support.faults import (
    AttemptFaults,
    Crash,
    CrashAt,
    CrashOnCall,
    Fault,
    Interleave,
    Throttle,
    ThrottleAfter,
    ThrottleCall,
    count,
)
from tests.support.model import Model, Sent, canonical_key
from tests.support.moto_patches import atomic_fast_moto, scanned_items
from tests.support.steps import lane_of_shard

__all__ = [
    "CLAIM_TIMEOUT",
    "SERVICES",
    "VISIBILITY",
    "WINDOW",
    "ClientPool",
    "Container",
    "Event",
    "PromiseBroken",
    "SkewedClock",
    "World",
    "pool",
]

END_ERRORS = {"FAILED": "States.TaskFailed", "TIMED_OUT": "States.Timeout"}


class DiesAfterSetting(CrashAt):
    """``sluice set-max --lane`` dies after its first write, the lane's setting (its caps unmoved)."""

    def _reached(self, injector: Any, when: str, call: Any) -> None:
        if when == "after" and call.step == "lane_setting":
            count("crash:after_lane_setting")
            injector.dead = True
            raise Crash(f"{injector.name} died after its lane setting")


class World(BehindTheBack, Promises):
    def __init__(
        self,
        *,
        max_concurrency: int = 3,
        skew: float = 0.0,
        duplicate_policy: str = "suppress",
        name: str = "sluice-rel",
        lanes: str = "",
        **settings: Any,
    ) -> None:
        """``settings`` override the stack's settings (e.g. ``retention_days``); ``lanes`` is the
        stack parameter (``name:max[:priority[:weight]]``, comma-separated; empty: no lanes)."""
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
                lanes=lanes,
                **settings,
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
                key_concurrency=self.settings.key_concurrency,
                lanes={lane.name: None if lane.implied else lane.max for lane in self.settings.lanes},
                fair_lanes=frozenset(lane.name for lane in self.settings.lanes if lane.fair),
                lane_queues=self.queue_urls() if self.settings.lanes else None,
            )
            # The operator's own machine: the real `sluice set-max`, on clients without faults.
            self.operator = Runtime(self.stack.settings, session=self.session, clock=self.clock)
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
        self.expired: set[str] = set()  # items DynamoDB's TTL deleted (``expire_ttl``)
        self.by_hand = 0  # executions started by hand so far (``start_by_hand`` numbers their names)
        self.ended_as: dict[str, str] = {}  # executions that ended (and are not running again): status
        self.ended_when: dict[str, float] = {}  # ... and when, by the world's clock (redrive's window)
        self.lanes_set: set[str] = set()  # lanes whose MAX the operator set (``set_lane_max``)
        self._seq = 0

    def close(self) -> None:
        self._exit.close()

    def add_container(self, name: str, config: Any = NO_RETRY, *, skew: float = 0.0) -> Container:
        """Another Lambda container, e.g. a launcher whose clients retry as deployed."""
        clock = SkewedClock(self.clock, skew) if skew else self.clock
        self.containers[name] = Container(name, self, clock, config)
        return self.containers[name]

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
        lane: str = DEFAULT_LANE,
    ) -> str | None:
        """Send one message to ``lane``'s queue (the stack's payload queue is the lane ``default``);
        its id, or None when SQS dropped it as a duplicate (same dedup id)."""
        request: dict[str, Any] = {
            "QueueUrl": self.queue_urls()[lane],
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
        if self.settings.lanes and lane != DEFAULT_LANE:
            self.count("lanes:sent_to_a_lane")
        self.model.sent_message(
            Sent(
                message_id,
                body,
                group,
                request["MessageDeduplicationId"],
                key,
                dict(attributes or {}),
                lane if self.settings.lanes else None,
            )
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
        may_fail = any(
            isinstance(f, CrashAt | CrashOnCall | Throttle | ThrottleAfter | ThrottleCall | AttemptFaults)
            for f in faults
        )
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
        # Died (also when something above it caught the crash): what it parked may stay in the queue.
        self.model.invocation_ended(name, "crashed" if container.injector.dead else outcome)
        if outcome == "crashed" or container.injector.dead:
            container.restart()
        return outcome

    def tick(self, name: str = "A", faults: Sequence[Fault] = ()) -> str:
        with self._lock:
            self.ticks += 1
        outcome = self.run(name, lambda c: c.launcher.tick(), faults)
        if outcome == "ok":
            self.model.tick_returned()  # it put every lane's limit in force before it admitted
        return outcome

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
        """Run launcher ``outer``; at ``point`` (the ``nth`` time), another actor takes its turn:
        ``tick`` (the other launcher), ``deliver`` (the oldest pending event), ``finish_newest``,
        ``set_max`` (the operator lowers MAX by one, between two steps of the tick), ``key_cap``
        (the operator lowers the cap of the concurrency key most sent by one), or ``lane_max`` (the
        operator lowers the MAX of the lane most sent to by one)."""
        other = "B" if outer == "A" else "A"

        def action() -> None:
            if inner == "tick":
                self.tick(other)
            elif inner == "deliver" and self.pending:
                self.deliver(0)
            elif inner == "finish_newest":
                self.finish_newest()
            elif inner == "set_max":
                self.lower_max_mid_tick()
            elif inner == "key_cap":
                self.lower_key_cap_mid_tick()
            elif inner == "lane_max":
                self.lower_lane_max_mid_tick()

        return self.tick(outer, [Interleave(point, action, nth)])

    def lower_max_mid_tick(self, value: int | None = None, *, by: str = "cli") -> None:
        """The operator lowers MAX (by one, or to ``value``) while a tick runs. Time passes beyond
        the launcher's cache of MAX, so a launcher that read MAX again would see the new value."""
        self.set_max(max(0, self.model.max - 1) if value is None else value, by=by)
        self.count("max:lowered_mid_tick")
        if self.settings.max_cache_seconds:
            self.clock.advance(self.settings.max_cache_seconds + 1)

    def lower_key_cap_mid_tick(self) -> None:
        """The operator lowers a concurrency key's cap by one while a tick runs (the key most sent)."""
        sent = [s.attributes.get("sluice-concurrency-key") for s in self.model.sent.values()]
        ckeys = sorted({k for k in sent if k}, key=lambda k: (-sent.count(k), k))
        if ckeys:
            self.set_key_cap(ckeys[0], max(0, self.model.key_cap(ckeys[0]) - 1))
            self.count("key_cap:lowered_mid_tick")

    def lower_lane_max_mid_tick(self) -> None:
        """The operator lowers a lane's MAX by one while a tick runs (the lane most sent to)."""
        if not self.settings.lanes:
            return
        sent = [s.lane for s in self.model.sent.values()]
        lane = min(self.lane_names(), key=lambda name: (-sent.count(name), name))
        self.set_lane_max(lane, max(0, self.model.lane_limit(lane) - 1))
        self.count("lane_max:lowered_mid_tick")

    # -- Step Functions and EventBridge -------------------------------------------------------------

    def end(self, name: str, status: str = "SUCCEEDED", effects: list[dict[str, Any]] | None = None) -> Event:
        """End a RUNNING execution; EventBridge now owes its status event. ``effects``: a SUCCEEDED
        execution's output names these follow-up payloads (``sluiceEffects``)."""
        output = None
        if effects is not None and status == "SUCCEEDED":
            output = json.dumps({"sluiceEffects": effects})
            self.model.expect_effects(name, len(effects))
            self.count("ended:with_effects")
            self.count("effects:named", len(effects))
        body = self.stack.finish(name, status, error=END_ERRORS.get(status), output=output)
        self.model.ended(name, status)
        self.ended_as[name] = status
        self.ended_when[name] = self.clock.now()
        self.count(f"ended:{status}")
        return self.owe_event(name, status, body)

    def owe_event(self, name: str, status: str, body: dict[str, Any]) -> Event:
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
            c.launcher.on_status_change(StatusChange.from_event(event.body))

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

    def set_max(self, value: int, *, by: str = "cli") -> None:
        """The operator changes MAX: ``by="cli"`` runs ``sluice set-max`` (the parameter, then the
        caps: in force for the very next claim); ``by="parameter"`` writes only the parameter (the
        console, a deploy), which reaches the caps at the next launcher tick's next receive: only
        for scenarios where no claim comes before that."""
        old = self.model.max
        if value > old:
            with self.model.lock:  # a raise is allowed from its first write on
                self.model.max = value
        if by == "cli":
            set_max(self.operator, value)
        else:
            self.ssm.put_parameter(
                Name=self.settings.max_parameter, Value=str(value), Type="String", Overwrite=True
            )
        with self.model.lock:  # a lowering binds once the caps carry it
            self.model.max = value
        self.count("max:zero" if value == 0 else "max:raised" if value > old else "max:lowered")

    def set_key_cap(self, ckey: str, cap: int | None, *, wake: bool = True) -> None:
        """The operator gives concurrency key ``ckey`` its own cap (None: back on the default), as
        ``sluice set-max N --key KEY`` does: the cap, then a wake-up of the key's line (``wake``),
        in the ``operator`` container, whose calls the model sees. A raise is allowed from its write
        on; a lowering binds once written."""
        old = self.model.key_cap(ckey)
        new = self.settings.key_concurrency if cap is None else cap
        if new > old:
            self.model.set_key_cap(ckey, cap)
        if "operator" not in self.containers:
            self.add_container("operator")

        def work(c: Container) -> None:
            if wake:
                set_key_max(c.runtime, ckey, cap)
            else:
                c.runtime.store().set_key_cap(ckey, cap)

        self.run("operator", work)
        self.model.set_key_cap(ckey, cap)
        self.count("key_cap:zero" if new == 0 else "key_cap:raised" if new > old else "key_cap:lowered")

    def set_lane_max(self, lane: str, value: int | None, *, paused: bool = False, by: str = "cli") -> None:
        """The operator sets ``lane``'s MAX (None: back to its configured MAX; ``paused``: 0) with
        ``sluice set-max N --lane NAME``'s own code (``sluice.ops.lanes.change_lane``): the setting
        ``LANE#<lane>``, stamped after the one it replaces, then the lane's caps, in the
        ``operator`` container, whose calls the model sees. ``by="setting"``: the command dies after
        its first write, the caps unmoved: the next tick puts the setting in force. A raise is
        allowed from its first write; a lowering binds once the caps carry it. The implied lane
        ``default`` put back to its configured MAX follows the global MAX in force again: the command
        writes the deployed MAX in its caps, the next tick the global MAX it reads."""
        setting = LaneSetting(lane, max=value, paused=paused)
        written = setting.limit(self.settings.lane(lane))  # what the command puts in the caps
        new, old = written, self.model.lane_limit(lane)
        follows_max = self.settings.lane(lane).implied and value is None and not paused
        limit = None if follows_max else new  # the model's: None, the global MAX in force
        if follows_max:
            new = self.model.max
        if new > old:
            self.model.set_lane_limit(lane, limit)
        if "operator" not in self.containers:
            self.add_container("operator")

        def work(c: Container) -> None:
            change_lane(c.runtime, self.settings.lane(lane), maximum=value, paused=paused)

        self.run("operator", work, [] if by == "cli" else [DiesAfterSetting("after_lane_limit")])
        self.model.set_lane_limit(lane, limit, caps_moved=by == "cli")
        self.lanes_set.add(lane)
        change = "zero" if new == 0 else "raised" if new > old else "lowered" if new < old else "same"
        self.count(f"lane_max:{change}" + ("" if by == "cli" else ":setting_only"))

    def advance(self, seconds: float) -> None:
        """Time passes. Messages whose visibility timeout ran out become visible again (in the queue
        each was received from: with lanes, its lane's)."""
        self.clock.advance(seconds)
        by_queue: dict[str, list[tuple[str, str]]] = {}
        for message_id, receipt in sorted(self.model.due().items()):
            queue = self.model.queue_of.get(message_id) or self.settings.queue_url
            by_queue.setdefault(queue, []).append((message_id, receipt))
        for queue, due in sorted(by_queue.items()):
            for i in range(0, len(due), 10):
                chunk = due[i : i + 10]
                self.sqs.change_message_visibility_batch(
                    QueueUrl=queue,
                    Entries=[
                        {"Id": str(n), "ReceiptHandle": receipt, "VisibilityTimeout": 0}
                        for n, (_, receipt) in enumerate(chunk)
                    ],
                )
                for message_id, _ in chunk:
                    self.model.made_visible(message_id)

    # -- observations ---------------------------------------------------------------------------------

    def lane_names(self) -> list[str]:
        """The stack's lanes, as configured (none: the stack has no lanes)."""
        return [lane.name for lane in self.settings.lanes]

    def queue_urls(self) -> dict[str, str]:
        """Every lane's queue (the stack's payload queue is the lane ``default``)."""
        return {DEFAULT_LANE: self.settings.queue_url, **self.settings.lane_queue_urls}

    def queue_depth(self, lane: str | None = None) -> int:
        """Messages in ``lane``'s queue (visible, in flight or delayed); None: in every lane's."""
        urls = self.queue_urls()
        total = 0
        for url in [urls[lane]] if lane is not None else list(urls.values()):
            attrs = self.sqs.get_queue_attributes(
                QueueUrl=url,
                AttributeNames=[
                    "ApproximateNumberOfMessages",
                    "ApproximateNumberOfMessagesNotVisible",
                    "ApproximateNumberOfMessagesDelayed",
                ],
            )["Attributes"]
            total += sum(int(v) for v in attrs.values())
        return total

    def queue_depths(self) -> dict[str, int]:
        """Each lane's queue depth, for a report."""
        return {lane: self.queue_depth(lane) for lane in self.queue_urls()}

    def table(self, *attributes: str) -> dict[str, dict[str, Any]]:
        """Every item by ``pk``; with ``attributes``, only those (a payload's history can be long): what
        a consistent Scan returns, read from moto's table in place (``scanned_items``)."""
        items = scanned_items(self.settings.table_name, ("pk", *attributes) if attributes else ())
        return {item["pk"]["S"]: item for item in items}

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
    def lane_holders(items: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
        """Every holder of a lane's slot: (lane, execution name), from the shards of each lane's pool
        (``SLOTS#lane-<lane>#<i>``); a name twice if two shards hold it."""
        out = []
        for pk, item in items.items():
            lane = lane_of_shard(pk)
            if lane is not None:
                out.extend((lane, name) for name in item.get("holders", {}).get("M", {}))
        return sorted(out)

    @staticmethod
    def holders(items: dict[str, dict[str, Any]]) -> set[str]:
        """Every slot holder: in the launcher pool's shards, and any legacy ones in LEDGER."""
        names = set(items.get("LEDGER", {}).get("holders", {}).get("SS", []))
        for pk, item in items.items():
            if pk.startswith("SLOTS#launcher#"):
                names.update(item.get("holders", {}).get("M", {}))
        return names

    def running_in_step_functions(self) -> set[str]:
        names: set[str] = set()
        pages = self.sfn.get_paginator("list_executions").paginate(
            stateMachineArn=self.settings.state_machine_arn, statusFilter="RUNNING"
        )
        for page in pages:
            names.update(e["name"] for e in page["executions"])
        return names

"""The explorer's actors besides the invocations: what may happen at a step, and each one's act.

At each step ``Actors.step`` draws one of the things that may happen now (``options``, weighted):
an invocation waiting at a switch point proceeds (``resume``), a scheduled tick starts in an idle
launcher container, EventBridge delivers a pending status event to a free completion container
(in any order: late, reordered), loses one, repeats a delivered one or delivers a RUNNING event
late; an execution ends (SUCCEEDED, FAILED, TIMED_OUT, ABORTED); a producer sends (valid, keyed,
unusable, awaiting, run-once, forged Sluice attributes, a duplicate deduplication id); time passes;
the operator sets MAX, a key's cap, pauses (MAX 0) and resumes, redrives an ended run, switches the
state machine (with or without ``previousStateMachineArn``) and deletes the old one; someone starts
an execution by hand on the stack's machine; DynamoDB's TTL sweeps.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from moto.core import DEFAULT_ACCOUNT_ID
from moto.sqs.models import sqs_backends

import sluice.enqueue
from sluice.core.events import StatusChange
from sluice.core.names import ORIGIN_ATTRIBUTE
from sluice.features.lanes import DEFAULT_LANE
from sluice.features.rate_limits import NONE, STACK, Rate, key_scope, lane_scope
from sluice.ops.dlq import dlq_list, dlq_redrive
from sluice.ops.semaphore import semaphore_set
from sluice.semaphore.model import pool_of
from sluice.semaphore.service import SemaphoreService
from tests.reliability.world import Container, Event
from tests.support.aws import REGION, status_change_event
from tests.support.faults import count
from tests.support.model import Sent, canonical_key

if TYPE_CHECKING:
    from tests.explorer.sim import Explorer

LAUNCHERS = ("A", "B", "C")
# What goes on while a swarm run drains its backlog (sim.DRAINS): the stack's invocations, Step
# Functions and EventBridge, runs started by hand and redriven; no producer, no setting changed.
DRAIN_ACTORS = (
    "resume",
    "tick",
    "wake",
    "deliver",
    "end",
    "advance",
    "lose",
    "redeliver",
    "running_event",
    "redrive",
    "redrive_last",
    "by_hand",
    "resubmit",
)
UPGRADE_ACTORS = ("delete_old_machine",)  # an upgrade's last step goes on while it drains too (sim.UPGRADES)
COMPLETIONS = ("completion", "completion2", "completion3")
STATUSES = ("SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED")
MAX_MESSAGES = 20
MAX_BY_HAND = 3
MAX_RESUBMITS = 10  # swarm runs: re-submissions of a just-ended payload, beyond MAX_MESSAGES
PAYLOADS = 6  # payload ids p0..p5: copies of one payload arise by themselves
CKEYS = 2
ADVANCES = (1.0, 10.0, 61.0, 200.0, 1000.0)
# What a producer sends, and how often (``--without NAME`` leaves one out).
PRODUCERS = (
    ("valid", 6),
    ("keyed", 2),
    ("unusable", 1),
    ("awaiting", 1),
    ("once", 1),
    ("forged", 1),
    ("duplicate_id", 1),
)
FORGED = (
    {"sluice-origin-message-id": "not a valid dedup id", "sluice-concurrency-key": "ck0"},
    {"sluice-key-ticket": "1@\u00b2", "sluice-concurrency-key": "ck0"},
    {"sluice-awaits": "[" * 5000},
    {"sluice-awaits": '"p0"'},
)

CONSOLE_VALUES = ("10001", "5000000000000", "99999999999999999999999", "1" * 4000)  # SSM: at most 4 KB

ENQUEUE_ITEMS = ('{"id":"P"}', '{"id":"P","n":7}', "1" * 5000, "[" * 3000 + "]" * 3000, '"text"', "null")

LANE = "gpu"  # the lane a swarm run's lanes name beside the default one (sim.LANES)

SEMAPHORE, SEMAPHORE_CONFIGURED = "db", 5  # SLUICE_SEMAPHORES=db:5 in the semaphore function
MAX_SEMAPHORES = 8  # SEMAPHORE_ADDS: at most seven added


def _queued(queue_url: str) -> set[str]:
    """The ids of the messages in the queue, from moto's backend."""
    queue = sqs_backends[DEFAULT_ACCOUNT_ID][REGION].queues[queue_url.rsplit("/", 1)[1]]
    return {m.id for m in queue._messages}


class _Recording:
    """An SQS client that keeps what its batches sent: (message id, entry)."""

    def __init__(self, sqs: Any) -> None:
        self.sqs = sqs
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send_message_batch(self, **request: Any) -> Any:
        answer = self.sqs.send_message_batch(**request)
        entries = {e["Id"]: e for e in request["Entries"]}
        self.sent += [(ok["MessageId"], entries[ok["Id"]]) for ok in answer.get("Successful", [])]
        return answer


class Actors:
    def __init__(self, explorer: Explorer) -> None:
        self.ex = explorer
        self.sent_count = 0
        self.by_hand = 0
        self.ended_keys: list[str] = []  # the payload ids of ended runs, latest last (swarm: re-submits)
        self.resubmitted = 0
        self.semaphores = [SEMAPHORE]  # the semaphores configured, newest last (SEMAPHORE_ADDS)
        self.semaphore_limits: dict[str, int] = {}  # each one's last ``sluice semaphore set``

    @property
    def world(self) -> Any:
        return self.ex.world

    @property
    def choices(self) -> Any:
        return self.ex.choices

    @property
    def waiting(self) -> list[Any]:
        return self.ex.waiting

    @property
    def history(self) -> Any:
        return self.ex.history

    @property
    def config(self) -> dict[str, Any]:
        return self.ex.config

    @property
    def machine(self) -> str:
        return self.ex.world.settings.state_machine_arn

    def note(self, text: str) -> None:
        self.ex.note(text)

    def busy(self) -> set[str]:
        return self.ex.busy()

    def spawn(self, *args: Any) -> None:
        self.ex.spawn(*args)

    def options(self) -> list[tuple[str, float, Callable[[], None]]]:
        w = self.world
        out: list[tuple[str, float, Callable[[], None]]] = []
        if self.waiting:
            out.append(("resume", 30.0 * self.ex.resume_pace(), self.do_resume))
        idle = [n for n in LAUNCHERS if n not in self.busy()]
        if idle:
            out.append(("tick", 3.0, lambda: self.do_tick(idle)))
        free = [n for n in COMPLETIONS if n not in self.busy()]
        if w.pending and free:
            out.append(("deliver", 3.0, lambda: self.do_deliver(free)))
        endable = self.endable()
        if endable:
            out.append(("end", 2.0, lambda: self.do_end(endable)))
        producing = self.sent_count < MAX_MESSAGES and not self.ex.draining
        if producing:
            out.append(("send", 3.0, self.do_send))
        out.append(("advance", 1.0, self.do_advance))
        if w.pending:
            out.append(("lose", 0.5, self.do_lose))
        if w.delivered:
            out.append(("redeliver", 0.4, self.do_redeliver))
        if w.model.starts:
            out.append(("running_event", 0.2, self.do_running_event))
        out.append(("operator", 0.6, self.do_operator))
        if w.redrivable():
            out.append(("redrive", 0.4, self.do_redrive))
        if self.by_hand < MAX_BY_HAND:
            out.append(("by_hand", 0.3, self.do_by_hand))
        out.append(("ttl", 0.2, self.do_ttl))
        if w.model.dead_lettered:
            out.append(("dlq_redrive", 0.2, self.do_dlq_redrive))
        if self.ex.scale:  # widened after the plain actors were frozen: swarm runs only
            out.append(("console", 0.2, self.do_console))
            if w.queue_depth() == 0:  # SQS keeps a message 14 days: none may sit through a month
                out.append(("quiet_month", 0.1, self.do_quiet_month))
            if producing:
                out.append(("enqueue", 0.3, self.do_enqueue))
            if "semaphore" not in self.busy():
                out.append(("semaphore_cold_start", 0.5, self.do_semaphore_cold_start))
                if self.ex.semaphore_adds and len(self.semaphores) < MAX_SEMAPHORES:
                    out.append(("semaphore_add", 0.3, self.do_semaphore_add))
            out.append(("semaphore_set", 0.5, self.do_semaphore_set))
            if self.ex.rate is not None or self.ex.key_rate is not None or self.ex.lane_rate is not None:
                out.append(("set_rate", 0.3, self.do_set_rate))
            last = self.last_handled_failure() if self.ex.redrive_last else None
            if last is not None:
                out.append(("redrive_last", self.ex.redrive_last, lambda: self.do_redrive_last(last)))
            if self.ended_keys and self.resubmitted < MAX_RESUBMITS:
                out.append(("resubmit", 2.0 * self.ex.scale.get("resubmit", 0.0), self.do_resubmit))
        if self.ex.switch.old is None:
            out.append(("switch_machine", 0.15, self.do_switch_machine))
        elif self.ex.switch.deletable():
            out.append(("delete_old_machine", 0.3, self.do_delete_old_machine))
        if self.ex.lanes:  # after the others: a run without lanes draws as before
            out.append(("lane_max", 0.4, self.do_lane_max))
        if self.ex.wake and idle:  # last: a run that does not draw it draws as before
            out.append(("wake", self.ex.wake, lambda: self.do_wake(idle)))
        return out

    def step(self) -> str:
        """One action, drawn; its name."""
        options = self.options()
        weights = [weight * self.ex.scale.get(name, 1.0) for name, weight, _ in options]
        if self.ex.draining:
            # The stack at work on its backlog: its own actors, each at least at its plain weight.
            weights = [
                max(w, weight)
                if name in DRAIN_ACTORS or (name in UPGRADE_ACTORS and self.ex.upgrade)
                else 0.0
                for (name, weight, _), w in zip(options, weights, strict=True)
            ]
        if not any(weights):  # every option this step offers is left out of the run's profile
            weights = [weight for _, weight, _ in options]
        name, _, act = options[self.choices.draw(len(options), weights)]
        act()
        return name

    def do_resume(self) -> None:
        inv = self.waiting[self.choices.draw(len(self.waiting), self.ex.resume_weights())]
        self.ex.resume(inv)

    def do_tick(self, idle: list[str]) -> None:
        name = idle[self.choices.draw(len(idle))]
        self.world.ticks += 1
        self.spawn("tick", name, lambda c: c.launcher.tick())

    def do_wake(self, idle: list[str]) -> None:
        """A producer's wake (``sluice enqueue``): a tick without reconciliation or linger, woken
        launchers taking turns (``Launcher.wake``, as handlers/launcher.py runs it)."""
        name = idle[self.choices.draw(len(idle))]
        count("explorer:wake")
        self.spawn("tick", name, lambda c: c.launcher.wake(c.runtime.wake_turns()))

    def do_deliver(self, free: list[str]) -> None:
        w = self.world
        event = w.pending.pop(self.choices.draw(len(w.pending)))
        self.complete(free[0], event)

    def complete(self, container: str, event: Event) -> None:
        def work(c: Container) -> None:
            c.launcher.on_status_change(StatusChange.from_event(event.body))

        self.spawn("completion", container, work, event)

    def do_redeliver(self) -> None:
        free = [n for n in COMPLETIONS if n not in self.busy()]
        w = self.world
        event = w.delivered[self.choices.draw(len(w.delivered))]
        if free:
            count("explorer:event_repeated")
            self.complete(free[0], event)

    def do_lose(self) -> None:
        w = self.world
        event = w.pending.pop(self.choices.draw(len(w.pending)))
        count("explorer:event_lost")
        self.note(f"lose the {event.status} event of {event.name[:12]}")

    def do_running_event(self) -> None:
        free = [n for n in COMPLETIONS if n not in self.busy()]
        w = self.world
        name = w.model.starts[self.choices.draw(len(w.model.starts))].name
        if free:
            count("explorer:event_running_late")
            body = status_change_event(self.history.machine.get(name, self.machine), name, "RUNNING")
            self.complete(free[0], Event(0, name, "RUNNING", body, w.ticks))

    def endable(self) -> list[str]:
        """The running executions that may end now: all of them, or (a swarm run's least life) those
        started or redriven at least ``run_life`` virtual seconds ago."""
        names = sorted(self.world.model.running)
        life = self.ex.run_life
        if not life:
            return names
        now = self.world.clock.now()
        old = [n for n in names if now - self.history.by_name.get(n, [(now - life, "")])[-1][0] >= life]
        if len(old) < len(names):
            count("explorer:end_held_by_life")
        return old

    def do_end(self, names: list[str]) -> None:
        w = self.world
        name = names[self.choices.draw(len(names))]
        status = STATUSES[self.choices.draw(len(STATUSES), (4, 2, 1, 1))]
        effects = None
        if status == "SUCCEEDED" and w.model.claims.get(name) and self.choices.chance(0.15):
            effects = [{"payload": {"id": f"p{self.choices.draw(self.ex.payloads)}", "effect": 0}}]
        self.note(f"{name[:12]} ends {status}" + (f" naming effect {effects}" if effects else ""))
        w.end(name, status, effects)
        self.history.record(name, status, date=w.stopped_at.get(name))
        self.ended_keys.append(name.rsplit("-", 1)[0])
        if self.ex.scale.get("resubmit") and self.resubmitted < MAX_RESUBMITS and self.choices.chance(0.5):
            self.do_resubmit()  # the producer saw its run end: sent again before the event is delivered
        idle = [n for n in LAUNCHERS if n not in self.busy()]
        if idle and self.ex.scale.get("tick_on_end") and self.choices.chance(self.ex.scale["tick_on_end"]):
            count("explorer:tick_on_end")
            self.do_tick(idle)  # the scheduled tick fires with the end's status event on its way

    def do_send(self) -> None:
        w = self.world
        draw = self.choices.draw
        self.sent_count += 1
        weights = [
            0 if name in self.ex.without else w * self.ex.scale.get(f"send:{name}", 1.0)
            for name, w in PRODUCERS
        ]
        kind = draw(7, weights if any(weights) else [0 if n in self.ex.without else w for n, w in PRODUCERS])
        payload = f"p{draw(self.ex.payloads)}"
        body = json.dumps({"id": payload})
        group = f"g{draw(3)}"
        attributes: dict[str, str] = {}
        valid = True
        copied: Sent | None = None
        if kind == 1:
            attributes["sluice-concurrency-key"] = f"ck{draw(CKEYS)}"
        elif kind == 2:
            body, valid = "{not json", False
        elif kind == 3:
            other = (
                int(payload[1:]) + 1 + draw(self.ex.payloads - 1)
            ) % self.ex.payloads  # never itself: a cycle
            attributes["sluice-awaits"] = json.dumps([f"p{other}"])
        elif kind == 4:
            attributes["sluice-once"] = "true"
        elif kind == 5 and self.ex.forges_origins and draw(2) == 0 and self._others(payload):
            if self._copies(payload) and draw(2) == 0:
                group, attributes, copied = self._copy_of(payload)
            else:
                attributes = self._forged_origin(payload)
        elif kind == 5:
            attributes, valid = dict(FORGED[draw(len(FORGED))]), False
        dedup = None
        if kind == 6 and w.model.sent:
            earlier = sorted(w.model.sent.values(), key=lambda s: s.message_id)
            dedup = earlier[draw(len(earlier))].dedup
        lane = (LANE, DEFAULT_LANE)[draw(2)] if self.ex.lanes else DEFAULT_LANE  # a lanes run's draw only
        if copied is not None and self.ex.lanes:
            lane = copied.lane or DEFAULT_LANE  # a copy goes where its message went: one message, one lane
        sent = w.send(body, group=group, valid=valid, attributes=attributes or None, dedup=dedup, lane=lane)
        forged = {k: v[:24] for k, v in attributes.items()}
        to = f" (lane {lane})" if self.ex.lanes else ""
        to += f" (a copy of {copied.message_id})" if copied is not None else ""
        self.note(f"send {body[:20]} {forged} {'(invalid) ' if not valid else ''}-> {sent}{to}")

    def _others(self, payload: str) -> list[Sent]:
        """Valid messages of other payloads sent so far, oldest first, whose id no forgery of
        ``payload`` carries yet (the same forgery sent again, maybe to another lane, is one message)."""
        model = self.world.model
        sent = sorted(model.sent.values(), key=lambda s: model.sent_order.get(s.message_id, 0))
        return [
            s
            for s in sent
            if s.valid
            and s.key != payload
            and ORIGIN_ATTRIBUTE not in s.attributes
            and (s.message_id, payload) not in model.forged
        ]

    def _copies(self, payload: str) -> list[Sent]:
        """Valid messages of ``payload`` sent so far with no origin of their own, oldest first: what a
        producer's copy may name (FORGES_ORIGINS)."""
        model = self.world.model
        sent = sorted(model.sent.values(), key=lambda s: model.sent_order.get(s.message_id, 0))
        return [s for s in sent if s.valid and s.key == payload and ORIGIN_ATTRIBUTE not in s.attributes]

    def _copy_of(self, payload: str) -> tuple[str, dict[str, str], Sent]:
        """A copy of a message of ``payload`` in another group (FORGES_ORIGINS): its origin id, so the
        same execution name, as a producer resending it or the DLQ's redrive sends it. Half the time
        the newest, which a launcher may be claiming or starting now."""
        copies = self._copies(payload)
        first = copies[-1] if self.choices.draw(2) == 0 else copies[self.choices.draw(len(copies))]
        group = (
            f"g{(int(first.group[1:]) + 1 + self.choices.draw(2)) % 3}" if first.group[1:].isdigit() else "g0"
        )
        attributes = {ORIGIN_ATTRIBUTE: first.message_id}
        for name in ("sluice-awaits", "sluice-once", "sluice-concurrency-key"):
            if name in first.attributes:
                attributes[name] = first.attributes[name]
        return group, attributes, first

    def _forged_origin(self, payload: str) -> dict[str, str]:
        """A healthy message of ``payload`` carrying another payload's message id as its origin
        (FORGES_ORIGINS), and that message's awaits where they do not name ``payload``: parked
        beside it (a waiter, a deferred duplicate), never over it."""
        others = self._others(payload)
        parked = [s for s in others if s.message_id in self.world.model.parked]
        # Half the time one parked now (a waiter, a deferred duplicate): where the id keys an item.
        pool = parked if parked and self.choices.draw(2) == 0 else others
        other = pool[self.choices.draw(len(pool))]
        attributes = {ORIGIN_ATTRIBUTE: other.message_id}
        awaits = other.attributes.get("sluice-awaits")
        if awaits and payload not in json.loads(awaits):
            attributes["sluice-awaits"] = awaits
        return attributes

    def do_resubmit(self) -> None:
        """A producer sends the payload whose run ended last again (a retry of a run that just
        failed, the next day's job of the same id), maybe before its status event is delivered."""
        self.resubmitted += 1
        payload = self.ended_keys[-1]
        sent = self.world.send(json.dumps({"id": payload}), group=f"g{self.choices.draw(3)}")
        self.note(f"re-submit {payload} -> {sent}")

    def do_advance(self) -> None:
        weights = [4, 3, 2, 1, 1]
        if self.ex.draining:  # invocations die of faults alone: none is carried past its Lambda timeout
            left = self.ex.time_left()
            if left is not None and left >= ADVANCES[0]:
                weights = [w if s <= left else 0 for s, w in zip(ADVANCES, weights, strict=True)]
        elif self.ex.faulty_one_in:
            # Faults kept to some invocations: time passes for a clean one as it does on a healthy
            # stack, in steps that do not carry it past its Lambda timeout (a faulty one may die there).
            left = self.ex.clean_time_left()
            if left is not None and left >= ADVANCES[0]:
                weights = [w if s <= left else 0 for s, w in zip(ADVANCES, weights, strict=True)]
        seconds = ADVANCES[self.choices.draw(len(ADVANCES), tuple(weights))]
        self.note(f"advance {seconds:g} s")
        self.world.advance(seconds)

    def do_operator(self) -> None:
        w = self.world
        draw = self.choices.draw
        what = draw(3)
        if what == 0:
            value = draw(self.config["max_concurrency"] + 2)
            self.note(f"operator: set-max {value}")
            w.set_max(value)
        elif what == 1:
            ckey, cap = f"ck{draw(CKEYS)}", (None, 0, 1, 2)[draw(4)]
            self.note(f"operator: set-max {cap} --key {ckey}")
            w.set_key_cap(ckey, cap)
        else:
            self.note(f"operator: set-max {self.config['max_concurrency']} (back)")
            w.set_max(self.config["max_concurrency"])

    def do_lane_max(self) -> None:
        """The operator sets a lane's MAX (``sluice set-max N --lane L``: 0 pauses it, none puts the
        configured MAX back); half the time the command dies after its first write, the setting, and
        the next tick puts it in force."""
        draw = self.choices.draw
        lane, value, by = (LANE, DEFAULT_LANE)[draw(2)], (None, 0, 1, 2)[draw(4)], ("cli", "setting")[draw(2)]
        died = " (the command dies after its first write)" if by == "setting" else ""
        self.note(f"operator: set-max {value} --lane {lane}{died}")
        count("explorer:lane_max")
        self.world.set_lane_max(lane, value, by=by)

    def do_quiet_month(self) -> None:
        """A month passes with no message in any queue (SQS drops a message after 14 days, so one
        cannot sit through it; retention is 30 days): records past their retention may go to TTL."""
        self.note("advance 31 days")
        count("explorer:quiet_month")
        self.world.advance(31 * 86400.0)

    def do_console(self) -> None:
        """Someone writes MAX in the parameter by hand (the console, a script), above its ceiling:
        Sluice must refuse it and keep the MAX in force (docs/operations.md)."""
        value = CONSOLE_VALUES[self.choices.draw(len(CONSOLE_VALUES))]
        self.note(f"console: the MAX parameter set to {value[:24]}")
        count("explorer:console_max")
        w = self.world
        w.ssm.put_parameter(Name=w.settings.max_parameter, Value=value, Type="String", Overwrite=True)

    def do_set_rate(self) -> None:
        """The operator changes a rate at run time (``sluice set-rate [--key ck1]``): the stack's or a
        concurrency key's, N up or down in the same period, none, or back to the stack's parameter.
        The window keeps what it granted."""
        draw = self.choices.draw
        scopes = [(STACK, self.ex.rate)] if self.ex.rate is not None else []
        if self.ex.key_rate is not None:  # ck1's; ck0 keeps the stack's, its starts judged against its grants
            scopes.append((key_scope("ck1"), self.ex.key_rate))
        if self.ex.lane_rate is not None:
            scopes.append((lane_scope(LANE), self.ex.lane_rate))
        scope, base = scopes[draw(len(scopes))] if len(scopes) > 1 else scopes[0]
        choices: list[Rate | str | None] = [Rate(n, base.period) for n in (1, 2, 4)] + [NONE, None]
        value = choices[draw(len(choices))]
        self.note(f"operator: sluice set-rate {value or 'default'} ({scope})")
        count("explorer:set_rate")
        self.world.operator.rates().set(scope, value)
        self.world.model.rates_in_force[scope] = base if value is None else None if value == NONE else value  # type: ignore[assignment]

    def do_enqueue(self) -> None:
        """The operator runs ``sluice enqueue`` on a JSON array: payloads and values no payload is
        (a number of 5,000 digits, nesting past the recursion limit, a string, null). Every item
        is sent or reported, and the command never raises."""
        draw = self.choices.draw
        items = [ENQUEUE_ITEMS[draw(len(ENQUEUE_ITEMS))] for _ in range(1 + draw(3))]
        text = "[" + ",".join(item.replace("P", f"p{draw(self.ex.payloads)}") for item in items) + "]"
        self.note(f"operator: sluice enqueue {text[:60]}")
        count("explorer:enqueue")
        from tests.explorer.sim import Failure

        w = self.world
        sqs = _Recording(w.sqs)
        try:
            items_read = list(sluice.enqueue.read_items(text))
            report = sluice.enqueue.enqueue(sqs, w.settings.queue_url, items_read, key_field="id")
        except Exception as exc:
            self.ex.failure = f"sluice enqueue raised on bad input: {exc!r} ({text[:80]})"
            raise Failure(self.ex.failure) from exc
        if len(report.sent) + len(report.failed) != len(items):
            self.ex.failure = f"sluice enqueue lost items: {len(items)} in, {report} out"
            raise Failure(self.ex.failure)
        queued = _queued(w.settings.queue_url)
        for message_id, entry in sqs.sent:
            if message_id not in queued:  # SQS took it for a copy of one sent within 5 minutes
                count("sqs:deduplicated")
                continue
            self.sent_count += 1
            attributes = {k: v["StringValue"] for k, v in entry.get("MessageAttributes", {}).items()}
            body = entry["MessageBody"]
            w.model.sent_message(
                Sent(
                    message_id,
                    body,
                    entry["MessageGroupId"],
                    entry["MessageDeduplicationId"],
                    canonical_key(body, attributes),
                    attributes,
                )
            )

    def do_semaphore_cold_start(self) -> None:
        """A new container of the semaphore function: it creates each configured semaphore that is
        absent (``SemaphoreService.ensure``), its calls switch points like every invocation's."""
        container = self.ex.container("semaphore")
        container.injector.observer = None  # the semaphore's items are not the launcher's protocol
        configured = dict.fromkeys(self.semaphores, SEMAPHORE_CONFIGURED)

        def work(c: Container) -> None:
            service = SemaphoreService(c.runtime.semaphores(), configured)
            for name in configured:
                service.ensure(name)

        self.spawn("semaphore", "semaphore", work)

    def do_semaphore_add(self) -> None:
        """A deployment that configures one more semaphore (SEMAPHORE_ADDS): the function's first
        invocation after it is a cold start that finds the new one absent."""
        self.semaphores.append(f"{SEMAPHORE}{len(self.semaphores) + 1}")
        self.note(f"operator: deploy with semaphore {self.semaphores[-1]} added")
        count("explorer:semaphore_add")
        self.do_semaphore_cold_start()

    def do_semaphore_set(self) -> None:
        """``sluice semaphore set``: from its return on, that limit is in force until the next set."""
        limit = (0, 1, 2)[self.choices.draw(3)]
        name = (
            self.semaphores[self.choices.draw(len(self.semaphores))]
            if len(self.semaphores) > 1
            else SEMAPHORE
        )
        self.note(f"operator: sluice semaphore set {name} {limit}")
        count("explorer:semaphore_set")
        semaphore_set(self.world.operator, name, limit)
        self.semaphore_limits[name] = limit

    def check(self) -> str | None:
        """What the actors themselves know must hold after every step."""
        for name, set_limit in sorted(self.semaphore_limits.items()):
            pool = self.world.table("limit").get(f"SLOTS#{pool_of(name)}", {})
            limit = int(pool.get("limit", {}).get("N", -1))
            if limit != set_limit:
                return (
                    f"semaphore {name}: limit {limit} in force, but the operator set {set_limit} "
                    "and nobody set it since (a cold start undid the operator's limit)"
                )
        return None

    def do_redrive(self) -> None:
        w = self.world
        names = sorted(w.redrivable())
        name = names[self.choices.draw(len(names))]
        self.note(f"operator: redrive {name[:12]}")
        w.redrive(name)
        self.history.record(name, "RUNNING", date=w.redriven_on[name])

    def last_handled_failure(self) -> str | None:
        """The run whose failure a completion handled last (its FAILED, TIMED_OUT or ABORTED event
        delivered and the completion returned), if RedriveExecution still accepts it; in a run that
        draws ``RETRY_ON_EVENT``, first the failure a completion is handling now (the retry
        automation is another target of the same EventBridge rule: it runs beside the completion)."""
        w = self.world
        handling = (
            [inv.event for inv in self.ex.running if inv.event is not None] if self.ex.retry_on_event else []
        )
        for event in [*reversed(handling), *reversed(w.delivered)]:
            if event.status in STATUSES[1:]:
                return event.name if event.name in w.redrivable() else None
        return None

    def do_redrive_last(self, name: str) -> None:
        """A retry automation on the failure's event (or the operator at the console, the cause
        fixed) redrives the run once Sluice has handled its end (``RETRY_ON_EVENT``: or while it
        handles it)."""
        count("explorer:redrive_last")
        if any(inv.event is not None and inv.event.name == name for inv in self.ex.running):
            count("explorer:redrive_beside_completion")
        self.note(f"operator: redrive {name[:12]}, the failure handled last")
        self.world.redrive(name)
        self.history.record(name, "RUNNING", date=self.world.redriven_on[name])

    def do_by_hand(self) -> None:
        self.by_hand += 1
        name = self.world.start_by_hand(f"p{self.choices.draw(self.ex.payloads)}")
        self.note(f"someone starts {name[:12]} by hand")
        self.history.record(name, "RUNNING", self.machine)

    def do_ttl(self) -> None:
        self.note("TTL sweep")
        self.world.expire_ttl()

    # -- a run ---------------------------------------------------------------------------------------

    def do_switch_machine(self) -> None:
        previous = self.choices.draw(2) == 0
        self.note(
            "operator: switch the state machine" + (" (previousStateMachineArn set)" if previous else "")
        )
        self.ex.switch.switch(previous)

    def do_delete_old_machine(self) -> None:
        self.note("operator: delete the old state machine")
        self.ex.switch.delete()

    def do_dlq_redrive(self) -> None:
        self.note("operator: sluice dlq redrive")
        count("explorer:dlq_redrive")
        w = self.world
        # The operator lists first, as docs/operations.md has it (its requests are part of the run's
        # draws). A listing stops at the first batch of each FIFO group and the redrive drains them
        # all, so each redriven copy is traced to its message from the whole DLQ.
        dlq_list(w.operator)
        source = w.dlq_sources()
        report = dlq_redrive(w.operator)
        for done in report.done:  # a redriven copy, and its DLQ message, are the message it came from
            origin = source.get(done["dlq_message_id"])
            if origin and done.get("message_id"):
                w.model.origin[done["message_id"]] = w.model.origin[done["dlq_message_id"]] = w.model.logical(
                    origin
                )

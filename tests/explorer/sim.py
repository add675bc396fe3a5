"""The explorer: Sluice's real code on in-process moto, every AWS call a switch point.

A run builds a small world (tests/reliability/world.py: the stack, launcher containers with their
own Runtime and caches, the Model observing every call) and then takes ``steps`` steps. At each step
the seeded scheduler (``Choices``) picks one thing to happen: an invocation waiting at a switch point
proceeds to its next AWS call, a new invocation starts (a scheduled tick in an idle launcher
container; a completion for a status event, in one of several completion containers), or an actor
of the world acts at once (a producer sends, an execution ends, EventBridge loses or repeats an
event, the operator changes a limit or redrives, someone starts an execution by hand, time passes,
DynamoDB's TTL sweeps). Invocations are greenlets: a botocore hook on every container client
(``Switch``) hands control back to the scheduler before each call, and, when the scheduler resumes
it, may crash the container before the call or after it took effect, throttle it, or lose its
response after it took effect. Step Functions' reads answer from a view up to a minute old
(tests/explorer/view.py). After every step the world's promises are checked (the Model's record,
the ledger against the leases, the keys' caps); at the end every invocation runs to its end with no
fault, and the world settles and checks what holds at rest.

Everything is deterministic given the list of draws, so a failure replays from it (``replay``).
"""

from __future__ import annotations

import json
import random
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ReadTimeoutError
from greenlet import greenlet
from moto.moto_api._internal import mock_random

from sluice.completion import StatusChange
from sluice.errors import TransientError
from tests.explorer.choices import Choices
from tests.explorer.view import History, StaleView
from tests.reliability.world import Container, Event, World
from tests.support.faults import Call, Crash, Fault, Injector, count, throttled

LAUNCHERS = ("A", "B", "C")
COMPLETIONS = ("completion", "completion2", "completion3")
STATUSES = ("SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED")
MAX_MESSAGES = 20
CHECK_EVERY = (
    4  # steps between two full checks (the ledger against the leases: a scan); the model's every step
)
MAX_BY_HAND = 3
PAYLOADS = 6  # payload ids p0..p5: copies of one payload arise by themselves
CKEYS = 2
ADVANCES = (1.0, 10.0, 61.0, 200.0, 1000.0)
SKEWS = (0.0, 30.0, -30.0, 3600.0, -3600.0)  # launcher B's clock; docs/protocol.md: up to an hour
FORGED = (
    {"sluice-origin-message-id": "not a valid dedup id", "sluice-concurrency-key": "ck0"},
    {"sluice-key-ticket": "1@\u00b2", "sluice-concurrency-key": "ck0"},
    {"sluice-awaits": "[" * 5000},
    {"sluice-awaits": '"p0"'},
)
# What may happen at a switch point once the invocation is resumed (weights of a fresh draw).
NOTHING, CRASH_BEFORE, THROTTLE, CRASH_AFTER, LOST = range(5)
AT_CALL = (60, 1, 1, 1, 1)


class Failure(AssertionError):
    """A promise broken, or an invocation that raised what a tick must never raise."""


@dataclass
class Invocation:
    kind: str  # tick or completion
    container: Container
    label: str
    event: Event | None = None
    glet: Any = None
    at: str = ""  # the call it waits to make
    faulted: bool = False  # a throttle or a lost response reached it: it may fail with a TransientError
    after: int = NOTHING  # what happens once the call it is making took effect


class Switch(Fault):
    """Every call of a container: a switch point, then maybe a fault drawn by the scheduler."""

    def __init__(self, explorer: Explorer, inv: Invocation) -> None:
        self.explorer = explorer
        self.inv = inv

    def before(self, injector: Injector, call: Call) -> tuple[Any, dict[str, Any]] | None:
        ex = self.explorer
        ex.calls += 1
        self.inv.after = NOTHING
        if not ex.faulty:
            return None
        self.inv.at = f"{call.operation}/{call.step}"
        ex.waiting.append(self.inv)
        ex.main.switch()  # the scheduler resumes this invocation when it draws it
        if not ex.faulty:
            return None
        what = ex.choices.draw(len(AT_CALL), AT_CALL)
        ex.note(
            f"{self.inv.label} at {self.inv.at}: {('', 'crash before', 'throttle', 'crash after', 'lost response')[what]}"
        )
        if what == CRASH_BEFORE:
            count("explorer:crash_before")
            injector.dead = True
            raise Crash(f"{injector.name} died before {call.operation}")
        if what == THROTTLE:
            count("explorer:throttle")
            self.inv.faulted = True
            return throttled(call.service)
        self.inv.after = what
        return None

    def after(self, injector: Injector, call: Call, status: int, parsed: dict[str, Any]) -> None:
        what, self.inv.after = self.inv.after, NOTHING
        if status >= 300:
            return
        if what == CRASH_AFTER:
            count("explorer:crash_after")
            injector.dead = True
            raise Crash(f"{injector.name} died after {call.operation}")
        if what == LOST:
            count("explorer:lost_response")
            self.inv.faulted = True
            raise ReadTimeoutError(endpoint_url=f"https://{call.service}.invalid/")


@contextmanager
def deterministic(seed: int) -> Iterator[None]:
    """moto's ids, uuid4 and every ``random.Random()`` made without a seed (Sluice's shard and lane
    orders, a launcher's identity) drawn from ``seed``, so that a run is a function of its draws."""
    mock_random.seed(seed)
    rng = random.Random(seed)
    original_random, original_uuid4 = random.Random, uuid.uuid4

    class Seeded(original_random):  # type: ignore[misc, valid-type]
        def __init__(self, x: Any = None) -> None:
            super().__init__(rng.getrandbits(64) if x is None else x)

    random.Random = Seeded  # type: ignore[misc]
    uuid.uuid4 = lambda: uuid.UUID(int=rng.getrandbits(128), version=4)  # type: ignore[assignment]
    try:
        yield
    finally:
        random.Random = original_random  # type: ignore[misc]
        uuid.uuid4 = original_uuid4


@dataclass
class Outcome:
    failure: str | None
    draws: list[int]
    steps: int
    calls: int
    cpu: float
    trace: list[str] = field(default_factory=list)


class Explorer:
    def __init__(self, choices: Choices, steps: int, *, verbose: bool = False) -> None:
        self.choices = choices
        self.steps = steps
        self.verbose = verbose
        self.trace: list[str] = []
        self.calls = 0
        self.faulty = True  # switch points yield and may fault (off while the run winds down)
        self.waiting: list[Invocation] = []
        self.running: list[Invocation] = []
        self.failure: str | None = None
        self.sent = 0
        self.by_hand = 0
        self.main = greenlet.getcurrent()
        draw = choices.draw
        self.config = {
            "max_concurrency": 2 + draw(3),
            "skew": SKEWS[draw(len(SKEWS))],
            "slots_per_shard": (8, 2, 1)[draw(3)],
            "key_concurrency": 1 + draw(2),
        }
        self.world = World(**self.config)
        self.history = History(self.world.clock)
        self.machine = self.world.settings.state_machine_arn

    def note(self, text: str) -> None:
        self.trace.append(f"[{len(self.choices.made)}] {text}")

    # -- invocations ---------------------------------------------------------------------------------

    def container(self, name: str) -> Container:
        if name not in self.world.containers:
            self.world.add_container(name)
        return self.world.containers[name]

    def busy(self) -> set[str]:
        return {inv.container.name for inv in self.running}

    def spawn(
        self, kind: str, name: str, work: Callable[[Container], Any], event: Event | None = None
    ) -> None:
        inv = Invocation(kind, self.container(name), f"{kind}@{name}", event)
        self.note(f"start {inv.label}" + (f" for {event.status} of {event.name[:12]}" if event else ""))

        def body() -> None:
            c = inv.container
            c.injector.faults[:] = [Switch(self, inv), StaleView(self)]
            outcome = "ok"
            try:
                work(c)
            except Crash:
                outcome = "crashed"
            except TransientError as exc:
                outcome = "refused"
                if not inv.faulted:
                    self.failure = f"{inv.label} failed with no fault injected: {exc!r}"
            except Exception as exc:
                outcome = "raised"
                self.failure = (
                    f"bad input or a race crashed an invocation: {inv.label} raised {exc!r}\n"
                    + "".join(traceback.format_exception(exc)[-6:])
                )
            finally:
                c.injector.faults.clear()
            self.world.model.invocation_ended(c.name, "crashed" if c.injector.dead else outcome)
            if outcome == "crashed" or c.injector.dead:
                c.restart()
            if kind == "tick" and outcome == "ok":
                self.world.model.tick_returned()
            if event is not None:
                (self.world.delivered if outcome == "ok" else self.world.pending).append(event)
            self.running.remove(inv)
            self.note(f"end {inv.label}: {outcome}")

        inv.glet = greenlet(body, parent=self.main)
        self.running.append(inv)
        self.resume(inv)

    def resume(self, inv: Invocation) -> None:
        if inv in self.waiting:
            self.waiting.remove(inv)
        inv.glet.switch()
        if self.failure:
            raise Failure(self.failure)

    # -- the step ------------------------------------------------------------------------------------

    def options(self) -> list[tuple[str, float, Callable[[], None]]]:
        w = self.world
        out: list[tuple[str, float, Callable[[], None]]] = []
        if self.waiting:
            out.append(("resume", 30.0, self.do_resume))
        idle = [n for n in LAUNCHERS if n not in self.busy()]
        if idle:
            out.append(("tick", 3.0, lambda: self.do_tick(idle)))
        free = [n for n in COMPLETIONS if n not in self.busy()]
        if w.pending and free:
            out.append(("deliver", 3.0, lambda: self.do_deliver(free)))
        if w.model.running:
            out.append(("end", 2.0, self.do_end))
        if self.sent < MAX_MESSAGES:
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
        return out

    def step(self) -> None:
        options = self.options()
        _, _, act = options[self.choices.draw(len(options), [o[1] for o in options])]
        act()

    def do_resume(self) -> None:
        inv = self.waiting[self.choices.draw(len(self.waiting))]
        self.resume(inv)

    def do_tick(self, idle: list[str]) -> None:
        name = idle[self.choices.draw(len(idle))]
        self.world.ticks += 1
        self.spawn("tick", name, lambda c: c.launcher.tick())

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
        from tests.support.aws import status_change_event

        free = [n for n in COMPLETIONS if n not in self.busy()]
        w = self.world
        name = w.model.starts[self.choices.draw(len(w.model.starts))].name
        if free:
            count("explorer:event_running_late")
            body = status_change_event(self.machine, name, "RUNNING")
            self.complete(free[0], Event(0, name, "RUNNING", body, w.ticks))

    def do_end(self) -> None:
        w = self.world
        names = sorted(w.model.running)
        name = names[self.choices.draw(len(names))]
        status = STATUSES[self.choices.draw(len(STATUSES), (4, 2, 1, 1))]
        self.note(f"{name[:12]} ends {status}")
        w.end(name, status)
        self.history.record(name, status)

    def do_send(self) -> None:
        w = self.world
        draw = self.choices.draw
        self.sent += 1
        kind = draw(7, (6, 2, 1, 1, 1, 1, 1))
        payload = f"p{draw(PAYLOADS)}"
        body = json.dumps({"id": payload})
        group = f"g{draw(3)}"
        attributes: dict[str, str] = {}
        valid = True
        if kind == 1:
            attributes["sluice-concurrency-key"] = f"ck{draw(CKEYS)}"
        elif kind == 2:
            body, valid = "{not json", False
        elif kind == 3:
            other = (int(payload[1:]) + 1 + draw(PAYLOADS - 1)) % PAYLOADS  # never itself: a cycle
            attributes["sluice-awaits"] = json.dumps([f"p{other}"])
        elif kind == 4:
            attributes["sluice-once"] = "true"
        elif kind == 5:
            attributes, valid = dict(FORGED[draw(len(FORGED))]), False
        dedup = None
        if kind == 6 and w.model.sent:
            earlier = sorted(w.model.sent.values(), key=lambda s: s.message_id)
            dedup = earlier[draw(len(earlier))].dedup
        sent = w.send(body, group=group, valid=valid, attributes=attributes or None, dedup=dedup)
        forged = {k: v[:24] for k, v in attributes.items()}
        self.note(f"send {body[:20]} {forged} {'(invalid) ' if not valid else ''}-> {sent}")

    def do_advance(self) -> None:
        seconds = ADVANCES[self.choices.draw(len(ADVANCES), (4, 3, 2, 1, 1))]
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

    def do_redrive(self) -> None:
        w = self.world
        names = sorted(w.redrivable())
        name = names[self.choices.draw(len(names))]
        self.note(f"operator: redrive {name[:12]}")
        w.redrive(name)
        self.history.record(name, "RUNNING")

    def do_by_hand(self) -> None:
        self.by_hand += 1
        name = self.world.start_by_hand(f"p{self.choices.draw(PAYLOADS)}")
        self.note(f"someone starts {name[:12]} by hand")
        self.history.record(name, "RUNNING", self.machine)

    def do_ttl(self) -> None:
        self.note("TTL sweep")
        self.world.expire_ttl()

    # -- a run ---------------------------------------------------------------------------------------

    def check(self, when: str) -> None:
        try:
            self.world.check()
        except AssertionError as exc:
            raise Failure(f"{exc} ({when})") from exc

    def wind_down(self) -> None:
        """Every invocation runs to its end with no fault."""
        self.faulty = False
        while self.waiting:
            self.resume(self.waiting[0])
        self.check("winding down")

    def run(self) -> None:
        for i in range(self.steps):
            self.step()
            if self.world.model.violations or i % CHECK_EVERY == 0:
                self.check(f"step {i}")
        self.wind_down()
        try:
            self.world.settle()
        except AssertionError as exc:
            raise Failure(f"{exc} (at rest)") from exc
        except Exception as exc:
            raise Failure(
                f"bad input or a race crashed an invocation: settling raised {exc!r} (at rest)\n"
                + "".join(traceback.format_exception(exc)[-6:])
            ) from exc

    def close(self) -> None:
        self.faulty = False
        for inv in list(self.running):
            if not inv.glet.dead:
                inv.glet.throw(greenlet.GreenletExit)
        self.world.close()


def explore(seed: int, steps: int, replay: list[int] | None = None, *, verbose: bool = False) -> Outcome:
    """One run: seed ``seed`` (the world's own randomness, and the draws unless ``replay`` gives them)."""
    choices = Choices(seed, replay)
    started = time.process_time()
    failure = None
    explorer = None
    with deterministic(seed):
        try:
            explorer = Explorer(choices, steps, verbose=verbose)
            explorer.run()
        except Failure as exc:
            failure = str(exc)
        finally:
            if explorer is not None:
                explorer.close()
    return Outcome(
        failure,
        list(choices.made),
        steps,
        explorer.calls if explorer else 0,
        time.process_time() - started,
        explorer.trace if explorer else [],
    )

"""Attempts to break concurrency keys (docs/protocol.md, "Concurrency keys"; promise 6), on moto
with the real adapters. Faults come only through botocore event hooks and moto.

Each execution's input names its concurrency key (``ck``), so a monitor wrapped around moto's
StartExecution checks, atomically with every new execution, that no key has more RUNNING executions
than its cap (``Watch.caps``), and that no payload key runs twice. Each test then judges what is
observable: the executions Step Functions started (and in which order), what is left in the queue
and the DLQ, and the key's item.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from moto.stepfunctions import models as sfn_models

from sluice import keys
from sluice.clock import FakeClock
from sluice.completion import StatusChange
from sluice.keys import CONCURRENCY_KEY_ATTRIBUTE, INFLIGHT_SECONDS, TICKET_ATTRIBUTE
from sluice.model import Outcome
from sluice.names import execution_name
from tests.support.aws import Stack, build_stack
from tests.support.hooks import Crash, crash_after, error_answer
from tests.support.moto_patches import atomic_fast_moto

CK = CONCURRENCY_KEY_ATTRIBUTE.replace("-", "_")


# -- observation ----------------------------------------------------------------------------------


@dataclass
class Watch:
    """Every new execution moto creates, checked while moto holds the request."""

    default_cap: int = 1
    caps: dict[str, int] = field(default_factory=dict)
    starts: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    peak: Counter = field(default_factory=Counter)

    def cap(self, ckey: str) -> int:
        return self.caps.get(ckey, self.default_cap)

    def seen(self, machine: Any, execution: Any) -> None:
        self.starts.append(execution.name)
        running = [json.loads(e.execution_input) for e in machine.executions if e.status == "RUNNING"]
        per_key = Counter(i.get("ck") for i in running if i.get("ck") is not None)
        for ckey, n in per_key.items():
            self.peak[ckey] = max(self.peak[ckey], n)
            if n > self.cap(ckey):
                self.violations.append(f"promise 6: {n} RUNNING of key {ckey!r} > {self.cap(ckey)}")
        twice = {k: n for k, n in Counter(i.get("id") for i in running).items() if n > 1}
        if twice:
            self.violations.append(f"promise 2: {twice} running twice at the start of {execution.name}")


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch) -> Watch:
    w = Watch()
    original = sfn_models.StateMachine.start_execution

    def start_execution(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = len(self.executions)
        execution = original(self, *args, **kwargs)
        if len(self.executions) > before:
            w.seen(self, execution)
        return execution

    monkeypatch.setattr(sfn_models.StateMachine, "start_execution", start_execution)
    return w


@pytest.fixture
def atomic() -> Any:
    with atomic_fast_moto():
        yield


def make(session: Any, watch: Watch, *, cap: int = 1, max_concurrency: int = 10, **settings: Any) -> Stack:
    watch.default_cap = cap
    settings.setdefault("max_receive_count", 1000)
    return build_stack(
        session, clock=FakeClock(), max_concurrency=max_concurrency, key_concurrency=cap, **settings
    )


@dataclass
class Sent:
    key: str
    message_id: str
    ckey: str | None

    @property
    def name(self) -> str:
        return execution_name(self.key, self.message_id)


def send(stack: Stack, key: str, ckey: str | None = "k", group: str = "g", **attributes: str) -> Sent:
    body = {"id": key, **({"ck": ckey} if ckey is not None else {})}
    if ckey is not None:
        attributes[CK] = ckey
    return Sent(key, stack.send(body, group=group, **attributes), ckey)


def service(client: Any) -> str:
    return client.meta.service_model.service_id.hyphenize()


def text_of(params: dict[str, Any]) -> str:
    body = params.get("body")
    return body.decode() if isinstance(body, bytes) else str(body)


def end(stack: Stack, launcher: Any, name: str, status: str = "SUCCEEDED") -> Any:
    return launcher.on_status_change(StatusChange.from_event(stack.finish(name, status)))


def started_order(stack: Stack) -> list[str]:
    return [e["name"] for e in sorted(stack.executions(), key=lambda e: e["startDate"])]


def drain_all(stack: Stack, *, rounds: int = 40) -> None:
    """Ticks and completions (one at a time, oldest run first) until nothing is left to do."""
    launcher = stack.launcher()
    for _ in range(rounds):
        launcher.tick()
        running = stack.running()
        for name in running:
            end(stack, launcher, name)
        if not running and stack.queue_counts() == (0, 0):
            store = stack.runtime().store()
            if all(store.key_state(k).waiting == 0 for k in store.keys_waiting()):
                break
    for _ in range(2):
        stack.clock.advance(1_000)  # past the consistency window, the claim timeout, INFLIGHT_SECONDS
        launcher.tick()
        for name in stack.running():
            end(stack, launcher, name)


def check_all_ran(stack: Stack, watch: Watch, sent: list[Sent]) -> None:
    """Promise 3 and 6: no violation; each message started (or was a duplicate of a key that ran);
    nothing in the queue or the DLQ; no key line left; every key item empty."""
    assert watch.violations == []
    names = {e["name"] for e in stack.executions()}
    assert stack.queue_counts() == (0, 0)
    assert stack.dlq_messages() == []
    missing = [s for s in sent if s.name not in names]
    store = stack.runtime().store()
    for key, n in Counter(s.key for s in missing).items():
        record = store.payload(key)
        assert record is not None and record.duplicates >= n, f"{key}: {n} never started"
    assert stack.running() == []
    for ckey in {s.ckey for s in sent if s.ckey is not None}:
        state = store.key_state(ckey)
        assert (state.holders, state.waiting, state.inflight) == (frozenset(), 0, frozenset()), state
    assert store.keys_waiting() == frozenset()
    ledger = store.ledger()
    assert ledger.holders == frozenset() and ledger.free == ledger.in_force


# -- a woken waiter's attributes ---------------------------------------------------------------------


def many(n: int) -> dict[str, str]:
    """``n`` producer attributes whose names sort before Sluice's (capitals sort before "s")."""
    return {f"Trace_{i}": f"v{i}" for i in range(n)}


def test_a_woken_waiter_with_nine_attributes_keeps_its_ticket(session: Any, watch: Watch) -> None:
    """Attacks the wake's send: a waiter sent back carries one attribute more than it came with
    (``sluice-key-ticket``), and a message has at most 10. A keyed message with 8 producer
    attributes (9 in all, which SQS accepts) must still pass the line when woken, and start."""
    stack = make(session, watch, cap=1)
    first = send(stack, "a")
    crowded = send(stack, "b", **many(8))
    launcher = stack.launcher()
    launcher.tick()
    assert stack.running() == [first.name]
    assert stack.runtime().store().key_state("k").waiting == 1
    end(stack, launcher, first.name)  # wakes b, and the refill receives it
    drain_all(stack)
    assert crowded.name in {e["name"] for e in stack.executions()}, "the woken waiter never started"
    check_all_ran(stack, watch, [first, crowded])


def test_a_woken_waiter_with_ten_attributes_keeps_its_key(session: Any, watch: Watch) -> None:
    """Attacks the cap through the same send: a keyed message with 9 producer attributes (10 in
    all) woken from the line must come back under its key, or it runs outside the cap, and once
    its kept slot is dropped (``INFLIGHT_SECONDS``) the next waiter runs beside it."""
    stack = make(session, watch, cap=1)
    first = send(stack, "a")
    crowded = send(stack, "b", **many(9))
    launcher = stack.launcher()
    launcher.tick()
    end(stack, launcher, first.name)  # b is woken and refilled
    later = send(stack, "c")
    launcher.tick()
    stack.clock.advance(INFLIGHT_SECONDS + 1)
    launcher.tick()  # the sweep drops b's kept slot if b did not claim it
    assert watch.violations == [], f"{watch.violations}; running {stack.running()}"
    drain_all(stack)
    check_all_ran(stack, watch, [first, crowded, later])


def test_a_woken_run_once_waiter_stays_run_once(session: Any, watch: Watch) -> None:
    """Attacks run-once through the wake's send: a run-once keyed message (7 producer attributes,
    9 in all) waits in its key's line while its payload key runs elsewhere and SUCCEEDS. Woken, it
    must be recognised as already done, not run the payload a second time."""
    stack = make(session, watch, cap=1)
    holder = send(stack, "a")  # holds key k
    once = send(stack, "p", sluice_once="true", **many(7))  # parks behind it
    launcher = stack.launcher()
    launcher.tick()
    assert stack.runtime().store().key_state("k").waiting == 1
    elsewhere = send(stack, "p", ckey=None, group="h", sluice_once="true")
    launcher.tick()
    assert set(stack.running()) == {holder.name, elsewhere.name}
    end(stack, launcher, elsewhere.name)  # p SUCCEEDED
    end(stack, launcher, holder.name)  # wakes the run-once waiter
    drain_all(stack)
    runs_of_p = [e for e in stack.executions() if e["name"].startswith("p-")]
    assert [e["name"] for e in runs_of_p] == [elsewhere.name], "a run-once payload ran again after it SUCCEEDED"


def test_a_waiter_too_big_for_its_line_neither_crashes_the_tick_nor_holds_up_others(
    session: Any, watch: Watch
) -> None:
    """Attacks the park with bad input (promise 5): SQS takes a message of up to 1 MiB, body and
    attributes, but a waiter is one DynamoDB item (400 KB). A keyed message with a 450 KB attribute
    that finds its key full must not crash the tick, nor hold up the other keys' messages."""
    stack = make(session, watch, cap=1)
    first = send(stack, "a")
    big = send(stack, "b", Note="x" * 450_000)
    others = [send(stack, f"o{i}", ckey=f"other{i}", group=f"h{i}") for i in range(3)]
    launcher = stack.launcher()
    launcher.tick()  # must not raise
    names = {e["name"] for e in stack.executions()}
    assert {o.name for o in others} <= names
    drain_all(stack)
    (dead,) = stack.dlq_messages()
    assert dead["MessageAttributes"]["sluice-source-message-id"]["StringValue"] == big.message_id
    assert "waits in its key's line, which keeps at most 400,000" in (
        dead["MessageAttributes"]["sluice-error"]["StringValue"]
    )
    assert big.name not in {e["name"] for e in stack.executions()}
    assert watch.violations == []
    assert stack.queue_counts() == (0, 0)

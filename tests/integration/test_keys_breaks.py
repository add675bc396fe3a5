"""Attempts to break concurrency keys (docs/protocol.md, "Concurrency keys"; promise 6), on moto
with the real adapters. Faults come only through botocore event hooks and moto.

Each execution's input names its concurrency key (``ck``), so a monitor wrapped around moto's
StartExecution checks, atomically with every new execution, that no key has more RUNNING executions
than its cap (``Watch.caps``), and that no payload key runs twice. Each test then judges what is
observable: the executions Step Functions started (and in which order), what is left in the queue
and the DLQ, and the key's item.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from moto.stepfunctions import models as sfn_models

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import Outcome
from sluice.core.names import execution_name
from sluice.core.records import INFLIGHT_SECONDS
from sluice.features import keys
from sluice.features.keys import CONCURRENCY_KEY_ATTRIBUTE, TICKET_ATTRIBUTE
from tests.support.aws import Stack, build_stack
from tests.support.hooks import Crash, error_answer
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
    return install_watch(monkeypatch)


def install_watch(monkeypatch: pytest.MonkeyPatch) -> Watch:
    """Every execution Step Functions starts is checked against the promises as it starts."""
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
    send(stack, "p", sluice_once="true", **many(7))  # parks behind it
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
    assert [e["name"] for e in runs_of_p] == [elsewhere.name], (
        "a run-once payload ran again after it SUCCEEDED"
    )


def test_a_waiter_too_big_for_its_line_neither_crashes_the_tick_nor_holds_up_others(
    session: Any, watch: Watch
) -> None:
    """Attacks the park with bad input (promise 5): SQS takes a message of up to 1 MiB, body and
    attributes, but a waiter is one DynamoDB item (400 KB). A keyed message with a 450 KB attribute
    that finds its key full must not crash the tick, nor hold up the other keys' messages."""
    stack = make(session, watch, cap=1)
    send(stack, "a")
    big = send(stack, "b", Note="x" * 450_000)
    others = [send(stack, f"o{i}", ckey=f"other{i}", group=f"h{i}") for i in range(3)]
    launcher = stack.launcher()
    launcher.tick()  # must not raise
    names = {e["name"] for e in stack.executions()}
    assert {o.name for o in others} <= names
    drain_all(stack)
    (dead,) = stack.dlq_messages()
    assert dead["MessageAttributes"]["sluice-source-message-id"]["StringValue"] == big.message_id
    assert (
        "waits in its key's line, which keeps at most 400,000"
        in (dead["MessageAttributes"]["sluice-error"]["StringValue"])
    )
    assert big.name not in {e["name"] for e in stack.executions()}
    assert watch.violations == []
    assert stack.queue_counts() == (0, 0)


# -- the wake-up race ---------------------------------------------------------------------------------


def side_by_side(*calls: Any) -> list[BaseException | None]:
    barrier = threading.Barrier(len(calls))
    errors: list[BaseException | None] = [None] * len(calls)

    def run(i: int, call: Any) -> None:
        barrier.wait()
        try:
            call()
        except BaseException as exc:
            errors[i] = exc

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return errors


def on_park(client: Any, when: str, action: Any) -> Counter:
    """Run ``action`` once, ``before`` or ``after`` the first park (a transaction writing KWAIT#)."""
    seen: Counter = Counter()

    def before(params: dict[str, Any], **_: Any) -> None:
        if "KWAIT#" in text_of(params) and not seen["fired"]:
            seen["fired"] += 1
            action()

    def after(http_response: Any, model: Any, context: dict[str, Any], **_: Any) -> None:
        if context.get("park") and not seen["fired"] and http_response.status_code < 300:
            seen["fired"] += 1
            action()

    def mark(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["park"] = "KWAIT#" in text_of(params)

    if when == "before":
        client.meta.events.register(f"before-call.{service(client)}.TransactWriteItems", before)
    else:
        client.meta.events.register(f"before-call.{service(client)}.TransactWriteItems", mark)
        client.meta.events.register(f"after-call.{service(client)}.TransactWriteItems", after)
    return seen


def sends(client: Any) -> list[str]:
    """The SendMessage requests a client makes (their bodies)."""
    out: list[str] = []

    def hook(params: dict[str, Any], **_: Any) -> None:
        out.append(text_of(params))

    client.meta.events.register(f"before-call.{service(client)}.SendMessage", hook)
    return out


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_release_between_the_refused_claim_and_the_park_loses_no_wake_up(
    session: Any, watch: Watch, when: str
) -> None:
    """Attacks the lost wake-up argument: the only run of key k ends (release and the completion's
    wake) just before the launcher parks the message its claim refused (``before``: the completion's
    wake cannot see the waiter) or just after the park committed (``after``: both wakes see it).
    Either way the waiter starts within the launcher's own fill, once, with no reconciliation."""
    stack = make(session, watch, cap=1)
    first = send(stack, "a")
    stack.launcher().tick()
    waiter = send(stack, "b")
    launcher, completion = stack.launcher(), stack.launcher()
    completion_sends = sends(completion.queue.client)
    parker_sends = sends(launcher.queue.client)
    fired = on_park(
        launcher.store.client,
        when,
        lambda: completion.on_status_change(StatusChange.from_event(stack.finish(first.name))),
    )
    summary = launcher.tick(reconcile_first=False)
    assert fired["fired"] == 1
    assert summary.n(Outcome.KEY_WAITING) == 1
    if when == "before":
        assert completion_sends == []  # the completion's wake ran before the waiter was parked
    woken = [p for p in completion_sends + parker_sends if TICKET_ATTRIBUTE in p]
    assert woken, "nobody woke the waiter"
    assert stack.running() == [waiter.name]
    drain_all(stack)
    check_all_ran(stack, watch, [first, waiter])
    assert watch.starts == [first.name, waiter.name]


def test_two_launchers_and_completions_race_on_two_keys(session: Any, atomic: None, watch: Watch) -> None:
    """Two launchers with 10 start threads each and completions from both, all at once: messages of
    two keys (cap 2) and unkeyed ones in 12 groups. They claim, park and wake the same keys side by
    side; no key ever runs more than 2, nothing is lost, every line ends empty."""
    stack = make(session, watch, cap=2, max_concurrency=6, start_concurrency=10)
    sent = [send(stack, f"p{i}", ckey=("k1", "k2", None)[i % 3], group=f"g{i % 12}") for i in range(36)]
    a, b = stack.launcher(), stack.launcher()
    parks = Counter()

    def count_parks(params: dict[str, Any], **_: Any) -> None:
        if "KWAIT#" in text_of(params):
            parks["n"] += 1

    # The first ticks meet before either receives: each has read the slots before the other claims,
    # so both receive a full batch and the keys' claims collide however the threads are scheduled.
    meet, met = threading.Barrier(2), Counter()

    def receive_together(who: str) -> Callable[..., None]:
        def wait(**_: Any) -> None:
            met[who] += 1
            if met[who] == 1:
                with contextlib.suppress(threading.BrokenBarrierError):  # the other never came: go on
                    meet.wait(timeout=10)

        return wait

    for who, launcher in (("a", a), ("b", b)):
        launcher.store.client.meta.events.register(
            f"before-call.{service(launcher.store.client)}.TransactWriteItems", count_parks
        )
        launcher.queue.client.meta.events.register(
            f"before-call.{service(launcher.queue.client)}.ReceiveMessage", receive_together(who)
        )
    for _ in range(15):
        assert side_by_side(a.tick, b.tick) == [None, None]
        events = [StatusChange.from_event(stack.finish(n)) for n in stack.running()]
        calls = [lambda e=e, who=(a if i % 2 else b): who.on_status_change(e) for i, e in enumerate(events)]
        if calls:
            assert set(side_by_side(*calls)) == {None}
    assert parks["n"] >= 4, "no key line formed"
    assert watch.peak["k1"] == 2 and watch.peak["k2"] == 2
    drain_all(stack)
    check_all_ran(stack, watch, sent)


# -- crashes --------------------------------------------------------------------------------------------


def crash_after_park(client: Any) -> Counter:
    """The Lambda dies right after its first park committed: no wake by the parker, no delete."""
    seen: Counter = Counter()

    def mark(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["park"] = "KWAIT#" in text_of(params)

    def after(http_response: Any, context: dict[str, Any], **_: Any) -> None:
        if context.get("park") and http_response.status_code < 300 and not seen["crashed"]:
            seen["crashed"] += 1
            raise Crash("stopped after the park")

    client.meta.events.register(f"before-call.{service(client)}.TransactWriteItems", mark)
    client.meta.events.register(f"after-call.{service(client)}.TransactWriteItems", after)
    return seen


def test_a_crash_between_the_park_and_the_delete_runs_the_message_once(session: Any, watch: Watch) -> None:
    """Attacks the crash table's first row: the launcher dies after parking M (ticket 0) and before
    deleting it. The key's run ends meanwhile and its wake sends ticket 0 back behind M's original,
    which returns and, finding a waiter on the way, parks again (ticket 1): two tickets for one
    message. M must run once, the second ticket must not keep the key, and a later message of the
    key must still run."""
    stack = make(session, watch, cap=1, visibility_timeout=1)
    first = send(stack, "a")
    stack.launcher().tick()
    m = send(stack, "m")
    launcher = stack.launcher()
    crashed = crash_after_park(launcher.store.client)
    with pytest.raises(Crash):
        launcher.tick()
    assert crashed["crashed"] == 1
    store = stack.runtime().store()
    assert store.key_state("k").waiting == 1
    other = stack.launcher()
    end(stack, other, first.name)  # wakes ticket 0; M's original is still in flight
    time.sleep(1.2)
    summary = other.tick()  # the original parks again (ticket 1), the woken copy runs
    assert store.key_state("k").tickets == 2, "the original did not park a second time"
    assert stack.running() == [m.name], summary.as_dict()
    later = send(stack, "n")
    drain_all(stack)
    check_all_ran(stack, watch, [first, m, later])
    assert [n for n in watch.starts if n == m.name] == [m.name]
    assert watch.starts.index(m.name) < watch.starts.index(later.name)


def crash_after_wake_send(client: Any) -> Counter:
    """The Lambda dies right after its first send of a woken waiter (before ``woken`` moves)."""
    seen: Counter = Counter()

    def mark(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["wake"] = TICKET_ATTRIBUTE in text_of(params)

    def after(http_response: Any, context: dict[str, Any], **_: Any) -> None:
        if context.get("wake") and http_response.status_code < 300 and not seen["crashed"]:
            seen["crashed"] += 1
            raise Crash("stopped after the wake's send")

    client.meta.events.register(f"before-call.{service(client)}.SendMessage", mark)
    client.meta.events.register(f"after-call.{service(client)}.SendMessage", after)
    return seen


def test_a_crash_after_a_wake_send_before_the_advance(session: Any, watch: Watch) -> None:
    """Attacks the crash table's third row: the completion dies after sending waiter b back and
    before moving ``woken``. The sent copy passes the line with its ticket; reconciliation's sweep
    sends b again a little later and moves the line, keeping a slot for that second send. b runs
    once, and its key must not then sit idle with a waiter: once a slot was kept for a copy SQS
    dropped as a repeat of the first (one deduplication id per ticket), for INFLIGHT_SECONDS."""
    stack = make(session, watch, cap=1)
    sent = [send(stack, "a"), send(stack, "b"), send(stack, "c")]
    stack.launcher().tick()
    completion = stack.launcher()
    crashed = crash_after_wake_send(completion.queue.client)
    with pytest.raises(Crash):
        end(stack, completion, sent[0].name)
    assert crashed["crashed"] == 1
    store = stack.runtime().store()
    assert store.key_state("k").woken == 0
    stack.clock.advance(2)  # the next tick, a moment later
    launcher = stack.launcher()
    launcher.tick()  # the sweep sends b again, then b's first copy claims, the second resumes it
    assert stack.running() == [sent[1].name]
    end(stack, launcher, sent[1].name)  # wakes c: the key has no run and one waiter
    assert stack.running() == [sent[2].name], f"key idle with a waiter: {store.key_state('k')}"
    drain_all(stack)
    check_all_ran(stack, watch, sent)


def test_a_woken_waiter_claimed_before_its_wake_notes_it_keeps_no_slot_after_its_run(
    session: Any, watch: Watch
) -> None:
    """The completion's wake sends b back, and before it notes b's entry in the key's item another
    launcher receives b, claims and starts it. The entry noted after that claim must keep no slot:
    once b ends, c (waiting in the line) must start at once, not INFLIGHT_SECONDS later."""
    stack = make(session, watch, cap=1)
    sent = [send(stack, "a"), send(stack, "b"), send(stack, "c")]
    stack.launcher().tick()
    assert stack.running() == [sent[0].name]
    completion = stack.launcher()
    fired: Counter = Counter()

    def claim_in_between(http_response: Any, **_: Any) -> None:
        if http_response.status_code < 300 and not fired["ticks"]:
            fired["ticks"] += 1
            # Another launcher's admission (no reconciliation: its sweep would move the line).
            fired["started"] += stack.launcher().admit().n(Outcome.STARTED)

    completion.queue.client.meta.events.register(
        f"after-call.{service(completion.queue.client)}.SendMessage", claim_in_between
    )
    end(stack, completion, sent[0].name)
    assert fired["started"] == 1  # the fault fired: b claimed and started before its entry was noted
    assert stack.running() == [sent[1].name]
    end(stack, stack.launcher(), sent[1].name)
    store = stack.runtime().store()
    assert stack.running() == [sent[2].name], f"key idle with a waiter: {store.key_state('k')}"
    drain_all(stack)
    check_all_ran(stack, watch, sent)


# -- the line's order, refusals, reconciliation -----------------------------------------------------


def throttle_starts_of(client: Any, name: str) -> Counter:
    """Answer StartExecution of execution ``name`` with ThrottlingException (refused for sure)."""
    seen: Counter = Counter()

    def hook(params: dict[str, Any], **_: Any) -> Any:
        if name in text_of(params):
            seen["throttled"] += 1
            return error_answer("ThrottlingException", 400)
        return None

    client.meta.events.register(f"before-call.{service(client)}.StartExecution", hook)
    return seen


def test_a_woken_waiter_refused_by_step_functions_keeps_the_line_in_order(session: Any, watch: Watch) -> None:
    """Attacks "waiters start oldest-first": b, c and d wait behind a (cap 1). a ends, b is woken
    and claims, but Step Functions throttles its start five times: the claim is rolled back and b
    returns to the queue with its ticket. Its slot must stay kept for it: were it not, the rollback's
    release would wake c into it, b would claim first on its return, and c would park again at the
    back, behind d."""
    stack = make(session, watch, cap=1)
    sent = [send(stack, n) for n in "abcd"]
    stack.launcher().tick()
    completion = stack.launcher()
    refused = throttle_starts_of(completion.executions.client, sent[1].name)
    end(stack, completion, sent[0].name)  # wakes b; the refill's start of b is refused
    assert refused["throttled"] == 5
    drain_all(stack)
    check_all_ran(stack, watch, sent)
    assert started_order(stack) == [s.name for s in sent]


def test_reconciliation_frees_the_key_of_an_abandoned_claim_and_wakes_its_line(
    session: Any, watch: Watch
) -> None:
    """Attacks the key's release by reconciliation: the launcher claims a (key k, cap 1) and dies
    before StartExecution; b waits behind it. Reconciliation judges a's claim abandoned after the
    claim timeout, releases it with its key slot, and the sweep or the release wakes b. Then a's
    message returns and waits its turn behind b."""
    stack = make(session, watch, cap=1, visibility_timeout=1)
    a = send(stack, "a")
    launcher = stack.launcher()
    crashes = Counter()

    def die(**_: Any) -> None:
        crashes["n"] += 1
        raise Crash("stopped before StartExecution")

    sfn = launcher.executions.client
    sfn.meta.events.register(f"before-call.{service(sfn)}.StartExecution", die)
    with pytest.raises(Crash):
        launcher.tick()
    assert crashes["n"] == 1
    store = stack.runtime().store()
    assert len(store.key_state("k").holders) == 1
    b = send(stack, "b", group="h")
    other = stack.launcher()
    other.tick(reconcile_first=False)
    assert store.key_state("k").waiting >= 1
    for _ in range(3):  # reconciliation marks the claim suspect, then releases it a timeout later
        stack.clock.advance(stack.settings.claim_timeout_seconds + stack.settings.consistency_window_seconds)
        time.sleep(1.1)
        other.tick()
        if stack.running():
            break
    assert stack.running(), f"nothing started: {store.key_state('k')}"
    drain_all(stack)
    check_all_ran(stack, watch, [a, b])


def test_a_forged_ticket_passes_the_line_but_never_the_cap(session: Any, watch: Watch) -> None:
    """Attacks the line with a copied ``sluice-key-ticket``: a newcomer carrying one skips the
    waiters' condition, but the key's cap still holds it back while the key is full (it parks)."""
    stack = make(session, watch, cap=1)
    sent = [send(stack, "a"), send(stack, "b")]
    launcher = stack.launcher()
    launcher.tick()
    forged = send(stack, "f", group="h", sluice_key_ticket="0@1800000000000")
    summary = launcher.tick()
    assert summary.n(Outcome.KEY_WAITING) == 1 and stack.running() == [sent[0].name]
    bad = send(stack, "x", group="i", sluice_key_ticket="not a ticket")
    drain_all(stack)
    (dead,) = stack.dlq_messages()
    assert dead["MessageAttributes"]["sluice-source-message-id"]["StringValue"] == bad.message_id
    assert watch.violations == [] and stack.queue_counts() == (0, 0)
    assert {sent[1].name, forged.name} <= {e["name"] for e in stack.executions()}


def test_a_key_paused_and_raised_while_runs_and_waiters_are_there(session: Any, watch: Watch) -> None:
    """Attacks the cap as it moves: cap 2 with two runs and four waiters; the key is paused (0)
    while they run: their ends start nothing; raised to 3: three start at once (the wake the CLI
    does), never more; put back on the default: the rest start two at a time."""
    stack = make(session, watch, cap=2)
    sent = [send(stack, f"p{i}") for i in range(6)]
    launcher = stack.launcher()
    launcher.tick()
    store = stack.runtime().store()
    store.set_key_cap("k", 0)
    watch.caps["k"] = 2
    for name in stack.running():
        end(stack, launcher, name)
    launcher.tick()
    assert stack.running() == [] and store.key_state("k").waiting == 4
    store.set_key_cap("k", 3)
    watch.caps["k"] = 3
    keys.wake(store=store, queue=stack.runtime().queue(), ckey="k", now=stack.clock.now())
    launcher.tick()
    assert len(stack.running()) == 3
    store.set_key_cap("k", None)
    watch.caps["k"] = 3  # the three running keep their slots; the default (2) binds new starts
    drain_all(stack)
    check_all_ran(stack, watch, sent)
    assert started_order(stack) == [s.name for s in sent]


def test_deferred_duplicates_of_a_keyed_payload_and_the_line(session: Any, watch: Watch) -> None:
    """Attacks the lease beside the line, policy defer: two more messages of payload p (key k,
    cap 1) arrive while p runs, and q waits in k's line. The duplicates park behind p's run (the
    lease is checked before the key), come back when it ends, then queue behind q: p never runs
    twice at once, nothing is lost, the key's line ends empty."""
    from sluice.launch.settings import DuplicatePolicy

    stack = make(session, watch, cap=1, duplicate_policy=DuplicatePolicy.DEFER)
    sent = [send(stack, "p"), send(stack, "q", group="h")]
    launcher = stack.launcher()
    launcher.tick()
    sent += [send(stack, "p", group="i"), send(stack, "p", group="j")]
    summary = launcher.tick()
    assert summary.n(Outcome.DEFERRED) == 2
    drain_all(stack)
    check_all_ran(stack, watch, sent)
    assert [n[:2] for n in started_order(stack)] == ["p-", "q-", "p-", "p-"]


def test_a_woken_waiter_that_finds_every_slot_taken(session: Any, watch: Watch) -> None:
    """Attacks a key full and MAX full at once: MAX 3, key k cap 1. a (k), u and w (no key) run; b
    and c (k) wait. a ends and wakes b, but before the completion's refill receives, another
    launcher starts v (no key) in the freed slot: b stays in the queue with its ticket, MAX full.
    Past INFLIGHT_SECONDS b's kept slot lapses and the sweep wakes c too. As slots free up, b and c
    both come with tickets: one at a time for k, nothing lost."""
    stack = make(session, watch, cap=1, max_concurrency=3)
    sent = [send(stack, "a"), send(stack, "u", ckey=None, group="h"), send(stack, "b"), send(stack, "c")]
    launcher = stack.launcher()
    launcher.tick()
    assert stack.runtime().store().key_state("k").waiting == 2
    sent.append(send(stack, "w", ckey=None, group="h"))
    launcher.tick()
    assert len(stack.running()) == 3
    v = send(stack, "v", ckey=None, group="x")
    sent.append(v)
    thief, completion = stack.launcher(), stack.launcher()
    stolen = Counter()

    def steal(**_: Any) -> None:
        if not stolen["n"]:
            stolen["n"] += 1
            thief.admit()

    sqs = completion.queue.client
    sqs.meta.events.register(f"before-call.{service(sqs)}.ReceiveMessage", steal)
    end(stack, completion, sent[0].name)
    assert v.name in stack.running() and stolen["n"] == 1
    assert sent[2].name not in stack.running()
    state = stack.runtime().store().key_state("k")
    assert (state.holders, len(state.inflight)) == (frozenset(), 1)
    stack.clock.advance(INFLIGHT_SECONDS + 1)
    launcher.tick()  # MAX full: no receive; the sweep wakes c
    assert stack.runtime().store().key_state("k").woken == 2
    drain_all(stack)
    check_all_ran(stack, watch, sent)

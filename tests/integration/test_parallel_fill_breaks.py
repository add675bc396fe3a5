"""Attempts to break the parallel fill (SLUICE_START_CONCURRENCY > 1) and the throttle back-off,
written by a reviewer who had not seen the other tests.

Each test builds a moto stack with the real adapters, runs launchers with 10 start threads under
``atomic_fast_moto`` (each AWS request atomic, threads interleaving between requests), injects
faults through botocore hooks, and judges only what can be observed:

* a monitor wrapped around moto's StartExecution records, atomically with every new execution, the
  RUNNING executions at that instant: never more than the bound in force (promise 1), never two of
  one payload key (promise 2);
* at the end, every message sent either started (its execution name exists), was recorded as a
  duplicate on its key's record, or is in the DLQ with a ``sluice-error`` reason (promise 3); the
  queue is empty;
* once every execution has ended and reconciliation has run, no holders remain and the whole limit
  is free (promise 4).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from botocore.exceptions import ClientError
from moto.stepfunctions import models as sfn_models

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.names import execution_name
from sluice.launch.settings import DuplicatePolicy
from sluice.ops.maximum import set_max
from tests.support.aws import Stack, build_stack
from tests.support.hooks import Crash, crash_after, error_answer, receipts_of
from tests.support.moto_patches import atomic_fast_moto

WORKERS = 10
WAIT = 30  # seconds a forced interleaving waits for the other thread: ample on a loaded 2-core machine


# -- observation ----------------------------------------------------------------------------------


@dataclass
class Monitor:
    """Every new execution moto creates, checked atomically (moto's request lock is held)."""

    bound: int = 0
    starts: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    peak: int = 0

    def seen(self, machine: Any, execution: Any) -> None:
        running = [e for e in machine.executions if e.status == "RUNNING"]
        self.starts.append(execution.name)
        self.peak = max(self.peak, len(running))
        if len(running) > self.bound:
            self.violations.append(
                f"promise 1: {len(running)} RUNNING > {self.bound} at start of {execution.name}"
            )
        keys = Counter(json.loads(e.execution_input).get("id") for e in running)
        twice = {k: n for k, n in keys.items() if n > 1}
        if twice:
            self.violations.append(f"promise 2: key(s) running twice {twice} at start of {execution.name}")


@pytest.fixture
def monitor(monkeypatch: pytest.MonkeyPatch) -> Monitor:
    return install_monitor(monkeypatch)


def install_monitor(monkeypatch: pytest.MonkeyPatch) -> Monitor:
    """Watch every new execution moto creates (the broken-variants catalogue uses it too)."""
    mon = Monitor()
    original = sfn_models.StateMachine.start_execution

    def start_execution(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = len(self.executions)
        execution = original(self, *args, **kwargs)
        if len(self.executions) > before:
            mon.seen(self, execution)
        return execution

    monkeypatch.setattr(sfn_models.StateMachine, "start_execution", start_execution)
    return mon


@pytest.fixture
def atomic() -> Iterator[None]:
    with atomic_fast_moto():
        yield


def make_stack(session: Any, monitor: Monitor, max_concurrency: int, **settings: Any) -> Stack:
    settings.setdefault("start_concurrency", WORKERS)
    settings.setdefault("max_receive_count", 1000)  # SQS's own redrive is out of scope (docs/reliability.md)
    monitor.bound = max_concurrency
    return build_stack(session, clock=FakeClock(), max_concurrency=max_concurrency, **settings)


@dataclass
class Sent:
    key: str
    message_id: str
    group: str
    origin: str = ""  # sluice-origin-message-id, when the message carries one

    @property
    def name(self) -> str:
        return execution_name(self.key, self.origin or self.message_id)


def send(stack: Stack, key: str, group: str, **attributes: str) -> Sent:
    message_id = stack.send({"id": key, "n": 1}, group=group, **attributes)
    return Sent(key, message_id, group, attributes.get("sluice_origin_message_id", ""))


def service(client: Any) -> str:
    return client.meta.service_model.service_id.hyphenize()


def lose_response(
    client: Any,
    *,
    times: int = 1,
    status: int = 500,
    code: str = "ServiceUnavailable",
    retried: bool = False,
    names: list[str] | None = None,
) -> Counter:
    """StartExecution reaches Step Functions and starts the execution; the answer is lost and the
    caller sees ``code`` instead (with ``retried``: as after botocore retried the call). The names of
    the executions whose answers were lost go to ``names``."""
    seen: Counter = Counter()

    def hook(http_response: Any, parsed: dict[str, Any], **_: Any) -> None:
        if http_response.status_code < 300 and seen["lost"] < times:
            seen["lost"] += 1
            if names is not None:
                names.append(parsed["executionArn"].rsplit(":", 1)[-1])
            http_response.status_code = status
            parsed.clear()
            parsed.update(
                {
                    "Error": {"Code": code, "Message": f"{code} (injected after the start)"},
                    "ResponseMetadata": {"HTTPStatusCode": status, "RetryAttempts": 1 if retried else 0},
                }
            )

    client.meta.events.register(f"after-call.{service(client)}.StartExecution", hook)
    return seen


def throttle_when(client: Any, decide: Callable[[dict[str, Any]], bool]) -> Counter:
    """Answer StartExecution with ThrottlingException (refused for sure) whenever ``decide(params)``."""
    seen: Counter = Counter()

    def hook(params: dict[str, Any], **_: Any) -> Any:
        body = json.loads(params["body"]) if isinstance(params.get("body"), (str, bytes)) else {}
        if decide(body):
            seen["throttled"] += 1
            return error_answer("ThrottlingException", 400)
        return None

    client.meta.events.register(f"before-call.{service(client)}.StartExecution", hook)
    return seen


# -- driving ---------------------------------------------------------------------------------------


def side_by_side(*calls: Callable[[], Any]) -> list[BaseException | None]:
    """Run the calls on threads of their own, released together; their exceptions, in order."""
    barrier = threading.Barrier(len(calls))
    errors: list[BaseException | None] = [None] * len(calls)

    def run(i: int, call: Callable[[], Any]) -> None:
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


def finish_all(stack: Stack, launcher: Any) -> int:
    """End every RUNNING execution and deliver its status event (release + one refill)."""
    names = stack.running()
    for name in names:
        launcher.on_status_change(StatusChange.from_event(stack.finish(name)))
    return len(names)


def settle(stack: Stack, *, rounds: int = 30, wait_invisible: float = 0.0) -> None:
    """Ticks and completions until the queue is empty and nothing runs; then reconcile past every
    window, so that abandoned claims are released (promise 4 is judged after this)."""
    launcher = stack.launcher()
    for _ in range(rounds):
        launcher.tick()
        ended = finish_all(stack, launcher)
        visible, invisible = stack.queue_counts()
        if not ended and not visible and not invisible and not stack.running():
            break
        if invisible and not visible and not ended and wait_invisible:
            time.sleep(wait_invisible)
    for _ in range(3):
        stack.clock.advance(1_000)  # past the consistency window and the claim timeout
        launcher.tick()
        finish_all(stack, launcher)


def window_passes(stack: Stack, receipts: list[str]) -> None:
    """The consistency window passes: a message whose start was ambiguous, kept away for it, is
    visible again (moto's visibility runs in real time). A receipt of a message deleted since is
    refused, and skipped."""
    stack.clock.advance(61)
    sqs = stack.client("sqs")
    for receipt in receipts:
        with contextlib.suppress(ClientError):
            sqs.change_message_visibility(
                QueueUrl=stack.settings.queue_url, ReceiptHandle=receipt, VisibilityTimeout=0
            )


def check_promises(stack: Stack, monitor: Monitor, sent: list[Sent], max_concurrency: int) -> None:
    assert monitor.violations == []
    names = {e["name"] for e in stack.executions()}
    # each execution name at most once (Step Functions guarantees it; a second start would show here)
    assert len(monitor.starts) == len(set(monitor.starts))
    # promise 3: started, duplicate, or dead-lettered with a reason; nothing left in the queue
    assert stack.queue_counts() == (0, 0)
    dlq = stack.dlq_messages()
    reasons = [m for m in dlq if "sluice-error" in m.get("MessageAttributes", {})]
    assert len(reasons) == len(dlq), f"dead-lettered without a reason: {dlq}"
    dead = {m["MessageAttributes"]["sluice-source-message-id"]["StringValue"] for m in reasons}
    store = stack.runtime().store()
    not_started = Counter(s.key for s in sent if s.name not in names and s.message_id not in dead)
    for key, n in not_started.items():
        record = store.payload(key)
        duplicates = record.duplicates if record else 0
        assert duplicates >= n, (
            f"key {key}: {n} message(s) neither started nor dead-lettered, {duplicates} duplicates"
        )
    # promise 4: nothing runs, nothing held, the whole limit usable
    assert stack.running() == []
    ledger = store.ledger()
    assert ledger.holders == frozenset()
    assert ledger.in_force == max_concurrency
    assert ledger.free == max_concurrency


# -- attempts --------------------------------------------------------------------------------------


def test_two_parallel_launchers_race_for_few_slots(session: Any, atomic: None, monitor: Monitor) -> None:
    """Two launchers with 10 start threads each fill 3 slots at once from 12 groups, repeatedly."""
    stack = make_stack(session, monitor, 3)
    sent = [send(stack, f"k{i}", f"g{i % 12}") for i in range(24)]
    a, b = stack.launcher(), stack.launcher()
    for _ in range(12):
        errors = side_by_side(a.tick, b.tick)
        assert errors == [None, None]
        assert len(stack.running()) <= 3
        # completions from both launchers at once: each refills its one slot
        names = stack.running()
        events = [StatusChange.from_event(stack.finish(n)) for n in names]
        calls = [lambda e=e, who=(a if i % 2 else b): who.on_status_change(e) for i, e in enumerate(events)]
        if calls:
            side_by_side(*calls)
    settle(stack)
    check_promises(stack, monitor, sent, 3)
    assert len(monitor.starts) == 24


def test_one_key_in_many_groups_of_one_batch(session: Any, atomic: None, monitor: Monitor) -> None:
    """Ten messages of one key, each in a group of its own, received in one batch and claimed side by
    side: one runs, the others are duplicates; then the same with two keys interleaved."""
    # A copy refused after its batch's receive is sent back for the consistency window (moto's
    # visibility runs in real time): 0, so that it comes back within the test.
    stack = make_stack(session, monitor, 5, consistency_window_seconds=0)
    sent = [send(stack, "same", f"g{i}") for i in range(10)]
    sent += [send(stack, "other" if i % 2 else "same2", f"h{i}") for i in range(10)]
    stack.launcher().tick()
    assert len(stack.running()) <= 3  # one per key: same, same2, other
    settle(stack)
    check_promises(stack, monitor, sent, 5)


def test_group_hits_slots_full_while_others_start(session: Any, atomic: None, monitor: Monitor) -> None:
    """A second launcher takes slots between the first one's read and its claims: some groups find
    the slots full while others start; what was not begun returns, and nothing is lost."""
    stack = make_stack(session, monitor, 4)
    sent = [send(stack, f"k{i}", f"g{i}") for i in range(10)]
    a = stack.launcher()
    rt = stack.runtime()
    b = rt.launcher()
    # b wakes up in the middle of a's fill: at a's second StartExecution it fills the rest itself
    sfn_a = a.executions.client
    fired = threading.Event()

    def steal(**_: Any) -> None:
        if not fired.is_set():
            fired.set()
            b.admit()

    sfn_a.meta.events.register(f"before-call.{service(sfn_a)}.StartExecution", steal)
    a.tick()
    assert len(stack.running()) <= 4
    settle(stack)
    check_promises(stack, monitor, sent, 4)


def test_crash_in_one_thread_while_others_start(session: Any, atomic: None, monitor: Monitor) -> None:
    """The Lambda dies in one group's thread right after its StartExecution answered, while the other
    groups claim and start: no mark, no delete. The messages come back and resume."""
    stack = make_stack(session, monitor, 6, visibility_timeout=1)
    sent = [send(stack, f"k{i}", f"g{i % 8}") for i in range(16)]
    launcher = stack.launcher()
    crash_after(launcher.executions.client, "StartExecution", after=3)
    with pytest.raises(Crash):
        launcher.tick()
    assert len(stack.running()) <= 6
    time.sleep(1.2)
    settle(stack, wait_invisible=1.1)
    check_promises(stack, monitor, sent, 6)
    assert len(monitor.starts) == 16


def test_crash_before_a_claim_in_one_thread(session: Any, atomic: None, monitor: Monitor) -> None:
    """The Lambda dies in one thread just as it sends its claim (its 4th TransactWriteItems) while
    other threads are between their claims and their starts."""
    stack = make_stack(session, monitor, 6, visibility_timeout=1)
    sent = [send(stack, f"k{i}", f"g{i}") for i in range(10)]
    launcher = stack.launcher()
    ddb = launcher.store.client
    count = Counter()

    def hook(**_: Any) -> None:
        count["n"] += 1
        if count["n"] == 4:
            raise Crash("stopped before a claim")

    ddb.meta.events.register(f"before-call.{service(ddb)}.TransactWriteItems", hook)
    with pytest.raises(Crash):
        launcher.tick()
    ddb.meta.events.unregister(f"before-call.{service(ddb)}.TransactWriteItems", hook)
    time.sleep(1.2)
    settle(stack, wait_invisible=1.1)
    check_promises(stack, monitor, sent, 6)


def test_ambiguous_start_then_throttles_on_the_resume(session: Any, atomic: None, monitor: Monitor) -> None:
    """One group's StartExecution starts the execution but answers 500 while five other groups start
    beside it (the claim is kept, its message returns); on the resume Step Functions throttles every
    start 5 times: the resumed claim must stay, and the execution must never run twice nor lose its
    slot."""
    stack = make_stack(session, monitor, 8)
    sent = [send(stack, f"k{i}", f"g{i}") for i in range(6)]
    launcher = stack.launcher()
    sfn = launcher.executions.client
    lost = lose_response(sfn, times=1)
    received = receipts_of(launcher.queue.client)
    launcher.tick()
    assert lost["lost"] == 1
    # The one whose answer was lost runs, and the groups that had begun: those not yet begun when
    # the ambiguous answer halted the batch handed their messages back (how many: thread timing).
    begun = len(stack.running())
    assert 1 <= begun <= 6
    throttled = throttle_when(sfn, lambda body: True)
    window_passes(stack, received)
    launcher.admit()  # no reconciliation first: the resume finds its claim still CLAIMED
    # The resume asks Step Functions first (no mark is written after a start) and finds it started:
    # it calls StartExecution no more. The handed-back ones' starts (as many as begin side by side
    # before the first gives up) are throttled 5 times each.
    assert throttled["throttled"] % 5 == 0 and (throttled["throttled"] > 0) == (begun < 6)
    running = set(stack.running())
    holders = stack.runtime().store().ledger().holders
    assert running <= holders, f"running without a slot: {running - holders}"
    settle(stack)  # a fresh launcher: its client does not throttle
    check_promises(stack, monitor, sent, 8)
    assert len(monitor.starts) == 6


def test_throttled_start_that_did_start_then_refusals(session: Any, atomic: None, monitor: Monitor) -> None:
    """The ambiguous throttle: botocore retried and the last answer was ThrottlingException, but an
    earlier attempt started it. The back-off calls again and is refused for sure 4 times: the error
    must stay ambiguous (claim kept), while the other groups start side by side."""
    stack = make_stack(session, monitor, 5)
    sent = [send(stack, f"k{i}", f"g{i}") for i in range(5)]
    launcher = stack.launcher()
    sfn = launcher.executions.client
    victim: list[str] = []
    lose_response(sfn, times=1, status=400, code="ThrottlingException", retried=True, names=victim)
    retries = throttle_when(sfn, lambda body: bool(victim) and body.get("name") == victim[0])
    received = receipts_of(launcher.queue.client)
    launcher.tick()
    assert retries["throttled"] == 4  # the victim's own back-off calls, all refused for sure
    running = set(stack.running())
    assert victim[0] in running
    holders = stack.runtime().store().ledger().holders
    assert running <= holders, f"running without a slot: {running - holders}"
    window_passes(stack, received)
    settle(stack)
    check_promises(stack, monitor, sent, 5)
    assert len(monitor.starts) == 5


def test_throttle_back_off_on_several_threads_with_a_fake_clock(
    session: Any, atomic: None, monitor: Monitor
) -> None:
    """Every StartExecution is throttled 4 times then passes, on 10 threads sharing one pacer and one
    fake clock that the back-off moves: slots, leases and messages all accounted for."""
    stack = make_stack(session, monitor, 8, start_rate=2, start_burst=2)
    sent = [send(stack, f"k{i}", f"g{i}") for i in range(10)]
    launcher = stack.launcher()
    sfn = launcher.executions.client
    calls: Counter = Counter()

    def decide(body: dict[str, Any]) -> bool:
        calls[body.get("name")] += 1
        return calls[body.get("name")] <= 4

    throttle_when(sfn, decide)
    launcher.tick()
    assert len(stack.running()) <= 8
    settle(stack)
    check_promises(stack, monitor, sent, 8)
    assert sum(stack.naps) > 0


def lower_max_at_first_start(stack: Stack, launcher: Any, to: int) -> dict[str, frozenset[str]]:
    """``sluice set-max <to>`` runs (and returns) just before the fill's first StartExecution is
    sent. Returns, once it has run, the claims that held slots at that moment (``claimed``)."""
    sfn = launcher.executions.client
    seen: dict[str, frozenset[str]] = {}
    lock = threading.Lock()

    def lower(**_: Any) -> None:
        with lock:
            if "claimed" not in seen:
                set_max(stack.runtime(), to)
                seen["claimed"] = stack.runtime().store().ledger().holders

    sfn.meta.events.register(f"before-call.{service(sfn)}.StartExecution", lower)
    return seen


def check_lowered_mid_fill(stack: Stack, monitor: Monitor, sent: list[Sent], concurrency: int) -> None:
    """MAX 10 → 2 while a fill is in flight: the claims made before the change still start (each
    holds its slot already; docs/protocol.md, "MAX lowered"), and what is claimed after it fits
    under 2 beside them."""
    launcher = stack.launcher()
    seen = lower_max_at_first_start(stack, launcher, 2)
    launcher.tick()
    started = set(monitor.starts)
    assert "claimed" in seen, "MAX was never lowered mid-fill"
    assert 0 < len(seen["claimed"]) <= concurrency
    # Nothing ends during the tick: what was claimed after the change fits under the new MAX
    # beside what held slots when it came.
    after = started - seen["claimed"]
    assert len(after) <= max(0, 2 - len(seen["claimed"])), f"claimed after MAX was lowered: {after}"
    monitor.bound = 2  # from here on the lowered MAX binds every start
    settle(stack)
    check_promises(stack, monitor, sent, 2)


def test_deferred_duplicates_behind_a_claim_that_is_rolled_back(
    session: Any, atomic: None, monitor: Monitor
) -> None:
    """Policy defer: four messages of one key in four groups of one batch. The thread that wins the
    lease is refused 5 times (rollback) while the others park behind its claim side by side; the
    parked ones must come back and each run once, one at a time."""
    stack = make_stack(session, monitor, 4, duplicate_policy=DuplicatePolicy.DEFER)
    sent = [send(stack, "d", f"g{i}") for i in range(4)]
    sent += [send(stack, f"e{i}", f"h{i}") for i in range(3)]
    launcher = stack.launcher()
    first: dict[str, str] = {}

    def decide(body: dict[str, Any]) -> bool:
        name = body.get("name", "")
        if name.startswith("d-"):
            first.setdefault("name", name)
        return first.get("name") == name

    throttled = throttle_when(launcher.executions.client, decide)
    launcher.tick()
    assert throttled["throttled"] >= 5
    for _ in range(8):  # one run of "d" at a time: end it, its parked successor comes back
        settle(stack, rounds=3)
    check_promises(stack, monitor, sent, 4)
    d_runs = [n for n in monitor.starts if n.startswith("d-")]
    assert len(d_runs) == 4, d_runs


def test_max_lowered_while_a_fill_is_in_flight(session: Any, atomic: None, monitor: Monitor) -> None:
    """``sluice set-max 2`` returns while 10 threads are between their claims and their starts."""
    stack = make_stack(session, monitor, 10)
    sent = [send(stack, f"k{i}", f"g{i}") for i in range(10)]
    check_lowered_mid_fill(stack, monitor, sent, WORKERS)


def test_max_lowered_while_a_fill_is_in_flight_serial_control(
    session: Any, atomic: None, monitor: Monitor
) -> None:
    """The same with SLUICE_START_CONCURRENCY 1: one claim in flight when MAX is lowered."""
    stack = make_stack(session, monitor, 10, start_concurrency=1)
    sent = [send(stack, f"k{i}", f"g{i}") for i in range(10)]
    check_lowered_mid_fill(stack, monitor, sent, 1)


def test_copies_of_one_message_in_two_groups(session: Any, atomic: None, monitor: Monitor) -> None:
    """Two copies of one message (one origin id, so one execution name) in two groups of one batch.
    Thread A claims the name and is throttled 5 times (refused for sure: it rolls its claim back);
    meanwhile thread B finds the lease held by the same name. Before copies owned their start marks,
    B renewed the claim as its own and started it after A's rollback: it ran without its lease and
    slot. B's renewal is refused now (the mark is A's copy's) and B goes back for a claim timeout;
    back, it claims the released name afresh and starts it once."""
    stack = make_stack(session, monitor, 2)
    origin = "origin-1"
    sent = [
        send(stack, "dup", "ga", sluice_origin_message_id=origin),
        send(stack, "dup", "gb", sluice_origin_message_id=origin),
    ]
    launcher = stack.launcher()
    sfn, ddb, sqs = launcher.executions.client, launcher.store.client, launcher.queue.client
    calls: Counter = Counter()
    refused = threading.Event()

    def on_start(**_: Any) -> Any:
        calls["start"] += 1
        refused.wait(WAIT)  # the other copy's resume meets the claim's mark before its rollback
        return error_answer("ThrottlingException", 400)

    def on_update_sent(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        body = params.get("body")
        text = body.decode() if isinstance(body, bytes) else str(body)
        context["renew"] = "renewed_at" in text

    def on_update(http_response: Any, context: dict[str, Any], **_: Any) -> None:
        if context.get("renew"):
            calls["renewed" if http_response.status_code < 300 else "renewal refused"] += 1
            refused.set()

    sfn.meta.events.register(f"before-call.{service(sfn)}.StartExecution", on_start)
    ddb.meta.events.register(f"before-call.{service(ddb)}.UpdateItem", on_update_sent)
    ddb.meta.events.register(f"after-call.{service(ddb)}.UpdateItem", on_update)
    received = receipts_of(sqs)
    launcher.tick()
    assert calls["start"] >= 5, "A's start was never refused"
    assert calls["renewal refused"] >= 1 and calls["renewed"] == 0, calls
    assert stack.running() == [] and monitor.violations == []
    sfn.meta.events.unregister(f"before-call.{service(sfn)}.StartExecution", on_start)
    stack.visible_again(received)  # both copies back (moto's visibility runs in real time)
    later: list[str] = []
    stack.session.events.register(
        "after-call.sqs.ReceiveMessage",
        lambda parsed, **_: later.extend(m["ReceiptHandle"] for m in parsed.get("Messages", [])),
    )
    settle(stack)
    # Received in one batch, the copy that met the other's claim before its start went back for the
    # claim timeout (``another copy of this message holds its claim``), in real time on moto: it passes.
    window_passes(stack, later)
    settle(stack)
    check_promises(stack, monitor, sent, 2)


def test_copies_of_one_message_in_two_groups_serial_control(
    session: Any, atomic: None, monitor: Monitor
) -> None:
    """The same two copies with SLUICE_START_CONCURRENCY 1: the first copy's refusal ends the batch
    and the second copy is returned untouched, so no rollback can race a resume."""
    stack = make_stack(session, monitor, 3, start_concurrency=1)
    origin = "origin-1"
    sent = [
        send(stack, "dup", "ga", sluice_origin_message_id=origin),
        send(stack, "dup", "gb", sluice_origin_message_id=origin),
    ]
    launcher = stack.launcher()
    throttled = throttle_when(launcher.executions.client, lambda body: True)
    launcher.tick()
    assert throttled["throttled"] == 5
    assert stack.running() == []
    sent.append(send(stack, "dup", "gc"))
    settle(stack)
    check_promises(stack, monitor, sent, 3)

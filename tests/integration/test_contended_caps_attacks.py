"""Attacks on the change "a caps write that loses every round raises Contended" (``LaunchSlots.set_limit``,
``MERGE_ROUNDS = 5``): reconciliation then saves nothing and its tick starts nothing, an admission
that cannot bring the MAX it read to the caps starts nothing more, ``sluice set-max`` / ``pause`` /
``resume`` report ``contended`` and say what is in force. Written by a reviewer who had not seen
the change's tests; four of the six failed on the change as first made (tests 1, 4 and the two
messages), and test 6 too: each is fixed.

Real adapters on moto. Another writer runs from a botocore ``before-parameter-build`` hook on the
victim's DynamoDB client (or, for the CLI, on the session before the command makes its clients),
just before each of the victim's writes of the pool item ``SLOTS#launcher``: the pool's stamp moves,
the victim's compare-and-set fails, and it reads, merges and tries again, five times. Each test
asserts how often the interleaving fired.

The promise: never more than MAX executions run on the stack's state machine (Sluice's own plus
those started by hand, once a reconciliation has listed them past the consistency window).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.launch.reconcile import reconcile
from sluice.ops.maximum import set_max
from tests.support.aws import build_stack

POOL_PK = "SLOTS#launcher"
WINDOW = 60


@pytest.fixture
def stack(session):
    return build_stack(session, clock=FakeClock(), max_concurrency=2)


# -- helpers ----------------------------------------------------------------------------------------


def _pool_write(operation: str, params: dict[str, Any]) -> bool:
    """A write of the pool item itself (a planner's transaction, or a restamp)."""
    if operation == "TransactWriteItems":
        for item in params.get("TransactItems", []):
            body = next(iter(item.values()))
            if body.get("Key", {}).get("pk", {}).get("S") == POOL_PK:
                return True
        return False
    if operation == "UpdateItem":
        return params.get("Key", {}).get("pk", {}).get("S") == POOL_PK
    return False


class Meddle:
    """``action(n)`` runs just before each of the first ``times`` pool writes seen on ``events``
    (a client's or a session's), never from inside itself; ``active`` gates it."""

    def __init__(self, events: Any, action: Callable[[int], None], times: int) -> None:
        self.action, self.times = action, times
        self.fired = 0
        self.busy = False
        self.active = True
        events.register("before-parameter-build.dynamodb", self._hook)

    def _hook(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        if self.busy or not self.active or self.fired >= self.times:
            return
        if not _pool_write(model.name, params):
            return
        self.busy = True
        try:
            self.fired += 1
            self.action(self.fired)
        finally:
            self.busy = False


class Others:
    """Other launcher containers whose MAX reading is cached (``SLUICE_MAX_CACHE_SECONDS`` 5, the
    deployed default) from before the operator's change; each runs its tick's reconciliation."""

    def __init__(self, stack: Any, n: int = 5) -> None:
        self.launchers = [stack.runtime(max_cache_seconds=5).launcher() for _ in range(n)]
        for launcher in self.launchers:
            launcher.max_source.reading()  # cached now: the FakeClock does not move meanwhile
        self.reconciled = 0

    def reconcile(self, n: int) -> None:
        launcher = self.launchers[(n - 1) % len(self.launchers)]
        reconcile(
            store=launcher.store,
            executions=launcher.executions,
            queue=launcher.queue,
            clock=launcher.clock,
            settings=launcher.settings,
            reconciler=launcher.identity,
            logger=launcher.log,
            max_source=launcher.max_source,
        )
        self.reconciled += 1


def by_hand(stack: Any, *names: str) -> None:
    sfn = stack.client("stepfunctions")
    for name in names:
        sfn.start_execution(stateMachineArn=stack.settings.state_machine_arn, name=name, input="{}")


def in_force(stack: Any) -> int | None:
    return stack.runtime().store().ledger().in_force


def end(rt: Any, stack: Any, name: str):
    return rt.launcher().on_status_change(StatusChange.from_event(stack.finish(name)))


def cli_with_meddling(stack: Any, capsys: Any, monkeypatch: Any, others: Others, *argv: Any):
    """``sluice ARGV`` whose pool writes each lose to another container's reconciliation."""
    from handlers import _shared
    from tests.support.cli import sluice, use_env

    use_env(monkeypatch, stack, SLUICE_MAX_CONCURRENCY="2")
    _shared.reset()
    meddle = Meddle(stack.session.events, others.reconcile, times=5)
    try:
        run = sluice(capsys, *argv, session=stack.session)
    finally:
        meddle.active = False
        _shared.reset()
    return run, meddle


# -- 1. a contended reconciliation drops what it listed, and its own tick admits beside it -----------


def two_by_hand_then_a_contended_tick(session, caplog) -> tuple[Any, Meddle, Any]:
    """MAX 3, x and y started by hand past the window, 3 payloads queued; a tick whose every caps
    write loses to a busy operator's ``set_max(3)``."""
    stack = build_stack(session, clock=FakeClock(), max_concurrency=3)
    stack.launcher().tick()  # the pool exists: limit 3, nothing outside
    assert in_force(stack) == 3
    by_hand(stack, "x", "y")
    stack.clock.advance(WINDOW + 1)
    for i in range(3):
        stack.send({"id": f"p{i}"}, group=f"g{i}")
    operator = stack.runtime()
    rt = stack.runtime()
    meddle = Meddle(rt.client("dynamodb").meta.events, lambda n: set_max(operator, 3), times=5)
    with caplog.at_level(logging.WARNING):
        summary = rt.launcher().tick()
    return stack, meddle, summary


def lowered_max_then_a_contended_tick(session) -> tuple[Any, Meddle, Any, Any]:
    """MAX 3 lowered to 1 by other means; a tick whose pool writes each lose to a container holding
    MAX 3 cached (up to 10 of them)."""
    stack = build_stack(session, clock=FakeClock(), max_concurrency=3)
    stack.launcher().tick()
    assert in_force(stack) == 3
    for i in range(3):
        stack.send({"id": f"p{i}"}, group=f"g{i}")
    others = Others(stack)
    stack.client("ssm").put_parameter(
        Name=stack.settings.max_parameter, Value="1", Type="String", Overwrite=True
    )
    rt = stack.runtime()
    meddle = Meddle(rt.client("dynamodb").meta.events, others.reconcile, times=10)
    summary = rt.launcher().tick()
    return stack, meddle, summary, rt


def test_a_contended_reconciliation_still_counts_the_runs_it_listed(session, caplog):
    """MAX 3. X and Y are started by hand and are past the consistency window. Container A's tick
    reconciles: its listing shows X and Y (external 2), and its caps write (3 → 1) loses each of
    its five rounds: just before each of A's pool writes, a busy operator's ``set_max(3)`` (same
    value, a new parameter version) restamps the pool. A's reconciliation raises nothing and saves
    nothing; A's admission then merges LEDGER's count (still 0) with the pool (still 0) and fills
    MAX 3 of its own beside X and Y: 5 running under MAX 3.

    Before the change the count was saved in LEDGER anyway, and the same admission brought MAX − 2
    to the caps (LEDGER's count merged with the pool's): 3 running."""
    stack, meddle, summary = two_by_hand_then_a_contended_tick(session, caplog)
    assert meddle.fired == 5  # every round of A's caps write lost
    assert any("slot pool kept changing" in r.getMessage() for r in caplog.records)
    ledger = stack.runtime().store().ledger()
    running = stack.running()
    assert {"x", "y"} <= set(running)
    # The promise: X and Y were listed by a reconciliation, past the window; Sluice fills MAX − 2.
    assert len(running) <= 3, (
        f"{len(running)} RUNNING under MAX 3 after a reconciliation listed x and y "
        f"(LEDGER external {ledger.external}, limit in force {ledger.in_force}, tick's limit {summary.limit})"
    )


# -- 2. sluice pause under contention says "New starts stop now" ---------------------------------------


def test_pause_under_contention_does_not_say_new_starts_stop_now(stack, capsys, monkeypatch):
    """MAX 2, p0 and p1 run, p2 waits. ``sluice pause`` writes MAX 0, then its caps write loses each
    of its five rounds to other containers' reconciliations (their MAX 2 cached from before the pause,
    each numbering a new listing: the pool is restamped). ``apply_max`` returns ``contended``, but
    ``pause`` prints "New starts stop now" without looking at it. p0 then ends: its completion (which
    reads no MAX) hands the slot over to p2 under the caps of MAX 2, and p2 starts after the pause
    said nothing new would."""
    stack.send({"id": "p0"}, group="g0")
    stack.send({"id": "p1"}, group="g1")
    rt = stack.runtime()
    rt.launcher().tick()
    assert len(stack.running()) == 2
    stack.send({"id": "p2"}, group="g2")
    others = Others(stack)

    run, meddle = cli_with_meddling(stack, capsys, monkeypatch, others, "pause")
    assert run.code == 0 and meddle.fired == 5 and others.reconciled == 5
    assert in_force(stack) == 2  # the caps still obey MAX 2
    said_stop = "New starts stop now" in run.out
    assert "Not in force yet" in run.out and not said_stop, run.out

    first = sorted(stack.running())[0]
    _released, _refill, _ = end(rt, stack, first)
    started_after = len(stack.running()) == 2  # p2 took p0's slot
    # The output either says the pause is not in force yet, or it is in force.
    assert not (said_stop and started_after), (
        f"`sluice pause` printed {run.out!r}; then a completion started p2 "
        f"(limit in force {in_force(stack)}, running {sorted(stack.running())})"
    )


# -- 3. sluice set-max under contention: "Not in force yet" and "no new start" at once ------------------


def test_set_max_under_contention_does_not_promise_no_new_start(stack, capsys, monkeypatch):
    """MAX 2, p0 and p1 run, p2 waits. ``sluice set-max 1``: its caps write loses each of its five
    rounds to other containers' reconciliations (MAX 2 cached). The first line says "Not in force
    yet", the next "2 are running, more than 1: no new start until none runs". p0 ends: its
    completion hands the slot to p2 (the caps still say 2): a new start with 2 running under MAX 1."""
    stack.send({"id": "p0"}, group="g0")
    stack.send({"id": "p1"}, group="g1")
    rt = stack.runtime()
    rt.launcher().tick()
    stack.send({"id": "p2"}, group="g2")
    others = Others(stack)

    run, meddle = cli_with_meddling(stack, capsys, monkeypatch, others, "set-max", 1)
    assert run.code == 0 and meddle.fired == 5
    assert "Not in force yet" in run.out
    promised = "no new start" in run.out
    assert not promised, run.out
    end(rt, stack, sorted(stack.running())[0])
    started = len(stack.running()) == 2
    assert not (promised and started), (
        f"`sluice set-max 1` printed {run.out!r}; then a completion started p2 "
        f"(running {sorted(stack.running())} under MAX 1, limit in force {in_force(stack)})"
    )


# -- 4. a contended admission after MAX lowered by other means -------------------------------------------


def test_a_tick_that_read_a_lowered_max_never_fills_past_it(session, caplog):
    """MAX 3, lowered to 1 with ``aws ssm put-parameter`` (by other means: the docs say it reaches the
    caps at the next tick). Container A's tick reads MAX 1 fresh. Each of its reconciliation's five
    caps writes loses to another container's reconciliation holding MAX 3 cached from just before
    the change: the tick ends, starting nothing. A producer's wake then (no reconciliation) loses
    each of its admission's five MAX syncs the same way: it starts nothing either. Neither fills
    under the caps others left (3) past the MAX 1 it read. A clean tick then puts MAX 1 in force."""
    with caplog.at_level(logging.WARNING):
        stack, meddle, summary, rt = lowered_max_then_a_contended_tick(session)  # the tick ends normally
        assert meddle.fired == 5 and summary.stopped == "contended" and stack.running() == []
        woken = rt.launcher().tick(reconcile_first=False, linger=False)
    assert meddle.fired == 10 and woken.stopped == "contended"
    warned = [r.getMessage() for r in caplog.records if "kept changing" in r.getMessage()]
    assert len(warned) == 2, warned  # the reconciliation's and the admission's
    assert stack.running() == [], "a tick filled under caps it could not bring to the MAX it read"
    assert in_force(stack) == 3  # others' caps: the lowering is not in force yet
    stack.launcher().tick()
    assert in_force(stack) == 1 and len(stack.running()) == 1


# -- 5. Contended never escapes a wake, nor reaches a completion ---------------------------------------


def test_contended_caps_never_escape_a_wake_or_a_completion(stack, caplog):
    """MAX re-written by other means (2 → 2, a newer version): a producer's wake
    (``tick(reconcile_first=False)``) must restamp the pool, and each of its five attempts loses to
    another container's reconciliation (MAX cached from before). Contended does not escape the
    wake: it ends, starting nothing more. Then a completion refills: it never calls ``set_limit``,
    so it cannot meet Contended; and the next wake fills what MAX allows."""
    stack.send({"id": "p0"}, group="g0")
    rt = stack.runtime()
    rt.launcher().tick()
    stack.send({"id": "p1"}, group="g1")
    stack.send({"id": "p2"}, group="g2")
    others = Others(stack)
    stack.client("ssm").put_parameter(
        Name=stack.settings.max_parameter, Value="2", Type="String", Overwrite=True
    )
    waker = stack.runtime()
    meddle = Meddle(waker.client("dynamodb").meta.events, others.reconcile, times=5)
    with caplog.at_level(logging.WARNING):
        summary = waker.launcher().tick(reconcile_first=False, linger=False)
    assert meddle.fired == 5
    assert any("kept changing" in r.getMessage() for r in caplog.records)
    assert summary.stopped == "contended" and len(stack.running()) == 1
    released, _refill, skipped = end(rt, stack, sorted(stack.running())[0])
    assert released and skipped == "" and len(stack.running()) == 1  # p0's slot went to p1
    stack.launcher().tick(reconcile_first=False, linger=False)
    assert len(stack.running()) == 2


# -- 6. a lost answer to the fifth round's write, which took effect -------------------------------------


def test_set_max_whose_last_write_landed_does_not_say_not_in_force(stack, capsys, monkeypatch):
    """``sluice set-max 1``: its first four caps writes lose to other containers' reconciliations;
    the fifth lands in DynamoDB, but its answer is lost (``ReadTimeoutError`` after moto made the
    write). botocore sends it again: the version moved (its own write), so the transaction is
    cancelled, the planner reads the pool (its own stamp now) and reports it as overtaken. Round
    five was the last: Contended, and the command prints "Not in force yet" although the caps
    already obey MAX 1 (safe, but it tells the operator the opposite of the truth)."""
    from botocore.exceptions import ReadTimeoutError

    from handlers import _shared
    from tests.support.cli import sluice, use_env

    stack.send({"id": "p0"}, group="g0")
    stack.launcher().tick()
    others = Others(stack)
    use_env(monkeypatch, stack, SLUICE_MAX_CONCURRENCY="2")
    _shared.reset()
    meddle = Meddle(stack.session.events, others.reconcile, times=4)
    state = {"pool_writes": 0, "lost": 0, "arm": False}

    def count(params: dict[str, Any], model: Any, **_: Any) -> None:
        if meddle.active and not meddle.busy and _pool_write(model.name, params):
            state["pool_writes"] += 1
            state["arm"] = state["pool_writes"] == 5

    def lose(event_name: str, **_: Any) -> None:
        if state["arm"] and not meddle.busy and event_name == "before-send.dynamodb.TransactWriteItems":
            state["arm"] = False
            state["lost"] += 1
            raise ReadTimeoutError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")

    stack.session.events.register("before-parameter-build.dynamodb", count)
    stack.session.events.register_last("before-send", lose)
    try:
        run = sluice(capsys, "set-max", 1, "--json", session=stack.session)
    finally:
        meddle.active = False
        _shared.reset()
    assert meddle.fired == 4 and state["lost"] == 1
    assert in_force(stack) == 1  # the fifth write took effect: MAX 1 is in force
    assert not run.json.get("contended"), f"set-max says not in force yet, but the caps obey it: {run.json}"


def test_a_tick_filling_beside_what_its_contended_reconciliation_listed_is_caught(session, caplog):
    """Variant ``contended_tick_fills`` (tests/explorer/broken.py: ced6958, a contended reconciliation
    saving nothing and its tick filling) runs past MAX where the fixed code stays within it (test 1)."""
    from tests.explorer.broken import VARIANTS, patch

    saved = patch(VARIANTS["contended_tick_fills"][1])
    try:
        stack, meddle, _ = two_by_hand_then_a_contended_tick(session, caplog)
    finally:
        patch(saved)
    assert meddle.fired == 5 and len(stack.running()) > 3  # x, y and MAX of Sluice's own beside them


def test_contention_taken_for_carried_is_caught(session):
    """Variant ``contention_unseen`` (8bcc559: a caps write that lost every round taken as done)
    fills past the MAX 1 the tick read, where the fixed code starts nothing (test 4)."""
    from tests.explorer.broken import VARIANTS, patch

    saved = patch(VARIANTS["contention_unseen"][1])
    try:
        stack, meddle, _, _ = lowered_max_then_a_contended_tick(session)
    finally:
        patch(saved)
    assert meddle.fired >= 5 and len(stack.running()) > 1

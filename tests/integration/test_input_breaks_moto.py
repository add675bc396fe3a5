"""Forged Sluice attributes on moto, through the real launcher and completion (breaks 6, 7 and 8):
a producer can write any attribute Sluice writes itself. Each is dead-lettered at receipt with the
attribute named in its reason; the ticks and completions after it go on, and its batch-mates run.

SQS refuses a deduplication id that is not 1-128 alphanumeric or punctuation characters; moto does
not, so ``sqs_rules`` answers as SQS does, and every test asserts that nothing was refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import Outcome
from sluice.core.names import ORIGIN_ATTRIBUTE, execution_name
from sluice.features.awaits import AWAITS_ATTRIBUTE, Waiter
from sluice.features.keys import CONCURRENCY_KEY_ATTRIBUTE, TICKET_ATTRIBUTE, KeyWaiter
from sluice.launch.settings import DuplicatePolicy
from tests.support.aws import Stack, build_stack
from tests.support.sqs_rules import SqsRules, sqs_rules

FORGED_ORIGIN = "not a valid dedup id"
T = TypeVar("T")


@pytest.fixture
def rules(session: Any) -> Any:
    with sqs_rules(session) as r:
        yield r


def make(session: Any, **settings: Any) -> Stack:
    settings.setdefault("max_receive_count", 1000)
    return build_stack(session, clock=FakeClock(), max_concurrency=10, key_concurrency=1, **settings)


def attrs(**named: str) -> dict[str, str]:
    return {k.replace("-", "_"): v for k, v in named.items()}


def survive(what: str, call: Callable[[], T]) -> T:
    """Bad input never crashes a tick or a completion: an error escaping one is a broken promise."""
    try:
        return call()
    except Exception as exc:
        raise AssertionError(f"{what} crashed on bad input: {exc!r}") from exc


def tick(launcher: Any) -> Any:
    return survive("a tick", launcher.tick)


def reasons(stack: Stack) -> list[str]:
    return [m["MessageAttributes"]["sluice-error"]["StringValue"] for m in stack.dlq_messages()]


def finish(stack: Stack, launcher: Any, key: str, message_id: str) -> Any:
    change = StatusChange.from_event(stack.finish(execution_name(key, message_id), "SUCCEEDED"))
    return survive("a completion", lambda: launcher.on_status_change(change))


# Each way Sluice sends a message of the queue back to it: a key's line, a deferred duplicate, an
# awaits waiter. The forged message waits behind "a" in each.
RESEND_PATHS = {
    "key line": ({}, {CONCURRENCY_KEY_ATTRIBUTE: "k"}, {"id": "b"}),
    "deferred duplicate": ({"duplicate_policy": DuplicatePolicy.DEFER}, {}, {"id": "a"}),
    "awaits waiter": ({}, {AWAITS_ATTRIBUTE: json.dumps(["a"])}, {"id": "b"}),
}


@pytest.mark.parametrize("path", list(RESEND_PATHS))
def test_a_forged_origin_id_is_dead_lettered_at_receipt_and_the_completion_and_ticks_go_on(
    session: Any, rules: SqsRules, path: str
) -> None:
    settings, extra, body = RESEND_PATHS[path]
    stack = make(session, **settings)
    keyed = attrs(**{CONCURRENCY_KEY_ATTRIBUTE: "k"}) if path == "key line" else {}
    first = stack.send({"id": "a"}, group="g1", **keyed)
    stack.send(body, group="g2", **attrs(**extra, **{ORIGIN_ATTRIBUTE: FORGED_ORIGIN}))
    launcher = stack.launcher()
    tick(launcher)

    released, _, _ = finish(stack, launcher, "a", first)  # its release would send the forged one back
    assert released
    for _ in range(2):
        tick(launcher)  # the sweeps of keys, parked messages and waiters

    assert rules.refused == []
    assert [e["name"] for e in stack.executions()] == [execution_name("a", first)]
    [reason] = reasons(stack)
    assert ORIGIN_ATTRIBUTE in reason
    assert stack.queue_counts() == (0, 0)


def test_a_forged_ticket_with_a_unicode_digit_is_dead_lettered_and_the_key_goes_on(
    session: Any, rules: SqsRules
) -> None:
    # "²".isdigit() is True: a ticket "1@²" would claim a free key, be noted as landed in its
    # item, and int("²") would then raise in every wake of the key: the parker's, the sweep's and
    # the completion's.
    stack = make(session)
    keyed = attrs(**{CONCURRENCY_KEY_ATTRIBUTE: "k"})
    stack.send({"id": "b"}, group="g1", **keyed, **attrs(**{TICKET_ATTRIBUTE: "1@²"}))
    first = stack.send({"id": "a"}, group="g2", **keyed)
    later = stack.send({"id": "c"}, group="g3", **keyed)
    launcher = stack.launcher()
    tick(launcher)
    assert [e["name"] for e in stack.executions()] == [execution_name("a", first)]

    released, _, _ = finish(stack, launcher, "a", first)  # wakes c, the next in k's line
    assert released
    tick(launcher)
    finish(stack, launcher, "c", later)
    tick(launcher)

    assert rules.refused == []
    assert sorted(e["name"] for e in stack.executions()) == sorted(
        [execution_name("a", first), execution_name("c", later)]
    )
    [reason] = reasons(stack)
    assert TICKET_ATTRIBUTE in reason
    state = stack.runtime().store().key_state("k")
    assert (state.holders, state.landed, state.inflight, state.waiting) == (
        frozenset(),
        frozenset(),
        frozenset(),
        0,
    )


def test_awaits_nested_past_the_recursion_limit_dead_letters_that_message_and_its_batch_mates_run(
    session: Any, rules: SqsRules
) -> None:
    stack = make(session)
    awaited = [stack.send({"id": "p"}, group="gp")]
    healthy = [
        stack.send({"id": f"w{n}"}, group=f"g{n}", **attrs(**{AWAITS_ATTRIBUTE: json.dumps(["p"])}))
        for n in range(3)
    ]
    stack.send({"id": "bad"}, group="gb", **attrs(**{AWAITS_ATTRIBUTE: "[" * 5000}))
    launcher = stack.launcher()
    summary = tick(launcher)

    assert summary.n(Outcome.INVALID) == 1
    assert stack.queue_counts() == (0, 0)  # nothing left in flight
    finish(stack, launcher, "p", awaited[0])
    tick(launcher)
    assert rules.refused == []
    assert sorted(e["name"] for e in stack.executions()) == sorted(
        [execution_name("p", awaited[0])] + [execution_name(f"w{n}", m) for n, m in enumerate(healthy)]
    )
    [reason] = reasons(stack)
    assert AWAITS_ATTRIBUTE in reason and "nested" in reason


def test_a_waiter_parked_with_a_forged_origin_before_the_check_is_sent_back_and_then_dead_lettered(
    session: Any, rules: SqsRules
) -> None:
    """A line written before origins were checked at receipt (or by any other way in) may hold a
    waiter whose id SQS refuses in a deduplication id: its wake sends it back all the same (the
    deduplication id then derives from a digest of it), and its receipt dead-letters it."""
    stack = make(session)
    first = stack.send({"id": "a"}, group="g1", **attrs(**{CONCURRENCY_KEY_ATTRIBUTE: "k"}))
    launcher = stack.launcher()
    tick(launcher)
    store = stack.runtime().store()
    waiter = KeyWaiter(
        ckey="k",
        ticket=0,
        message_id=FORGED_ORIGIN,
        key="b",
        body=json.dumps({"id": "b"}),
        group_id="g2",
        attributes={CONCURRENCY_KEY_ATTRIBUTE: "k"},
        parked_at=stack.clock.now(),
    )
    assert store.park_for_key(waiter, tickets=store.key_state("k").tickets)

    released, _, _ = finish(stack, launcher, "a", first)  # wakes k: sends the waiter back
    assert released
    tick(launcher)
    tick(launcher)

    assert rules.refused == []
    assert [e["name"] for e in stack.executions()] == [execution_name("a", first)]
    [reason] = reasons(stack)
    assert ORIGIN_ATTRIBUTE in reason
    state = store.key_state("k")
    assert (state.holders, state.waiting) == (frozenset(), 0)
    assert stack.queue_counts() == (0, 0)


def test_a_plain_message_with_a_forged_origin_does_not_ride_a_release(session: Any, rules: SqsRules) -> None:
    """The completion's hand-over takes a plain message into the release it is making; one whose
    attributes fail their rules is left to admission, which dead-letters it."""
    stack = make(session)
    first = stack.send({"id": "a"}, group="g1")
    launcher = stack.launcher()
    tick(launcher)
    stack.send({"id": "b"}, group="g2", **attrs(**{ORIGIN_ATTRIBUTE: FORGED_ORIGIN}))
    released, _, _ = finish(stack, launcher, "a", first)
    assert released
    tick(launcher)

    assert rules.refused == []
    assert [e["name"] for e in stack.executions()] == [execution_name("a", first)]
    [reason] = reasons(stack)
    assert ORIGIN_ATTRIBUTE in reason


def test_an_awaits_waiter_parked_with_a_forged_origin_before_the_check_is_dead_lettered(
    session: Any, rules: SqsRules
) -> None:
    """Its awaited key ends FAILED: the waiter's dead-letter copy goes to the FIFO DLQ with a
    deduplication id SQS takes, not its forged id."""
    stack = make(session)
    first = stack.send({"id": "a"}, group="g1")
    launcher = stack.launcher()
    tick(launcher)
    store = stack.runtime().store()
    waiter = Waiter(
        message_id=FORGED_ORIGIN,
        key="b",
        body=json.dumps({"id": "b"}),
        group_id="g2",
        attributes={AWAITS_ATTRIBUTE: json.dumps(["a"])},
        awaits=("a",),
        run_anyway=False,
        parked_at=stack.clock.now(),
    )
    store.park_waiter(waiter, ["a"])

    change = StatusChange.from_event(stack.finish(execution_name("a", first), "FAILED", error="E"))
    survive("a completion", lambda: launcher.on_status_change(change))
    tick(launcher)

    assert rules.refused == []
    [reason] = reasons(stack)
    assert reason == "awaited a ended FAILED"
    assert store.waiting() == frozenset()

"""Attacks on "a name released as vanished is never claimed again" (d272f3c): a holder whose state
machine was deleted after a switch is released by reconciliation with ``outcome_unknown`` on
EXEC#<name>, and a claim of that name is refused (``AlreadyRan``) and its message dead-lettered.
On moto with the real adapters, launcher, completion and reconciliation. Breaks are strict-xfail."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import PayloadState
from sluice.launch.settings import DuplicatePolicy
from tests.support.aws import Stack, build_stack, new_machine
from tests.support.hooks import Crash, crash_after, crash_before, receipts_of

DAY = 86_400
VANISHED = "no longer used and deleted"


def exec_item(stack: Stack, name: str) -> dict[str, Any]:
    found = stack.client("dynamodb").get_item(
        TableName=stack.settings.table_name, Key={"pk": {"S": f"EXEC#{name}"}}, ConsistentRead=True
    )
    return found.get("Item", {})


def expire_ttl(stack: Stack) -> list[str]:
    """DynamoDB's TTL: every item whose ``expires_at`` has passed by the stack's clock is deleted."""
    ddb, table = stack.client("dynamodb"), stack.settings.table_name
    deleted: list[str] = []
    for page in ddb.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
        for item in page["Items"]:
            expires = item.get("expires_at", {}).get("N")
            if expires is not None and float(expires) <= stack.clock.now():
                ddb.delete_item(TableName=table, Key={"pk": item["pk"]})
                deleted.append(item["pk"]["S"])
    return deleted


def reasons(dead: list[dict[str, Any]]) -> list[str]:
    return [m.get("MessageAttributes", {}).get("sluice-error", {}).get("StringValue", "") for m in dead]


def started_on(stack: Stack, machine: str) -> list[str]:
    sfn = stack.client("stepfunctions")
    return [e["name"] for e in sfn.list_executions(stateMachineArn=machine)["executions"]]


def start_then_die_before_the_delete(stack: Stack, body: dict[str, Any], group: str, **attrs: str):
    """``body`` is claimed and started on the machine in use; the launcher dies right after
    StartExecution: its message is not deleted. Returns (name, receipts of the receive)."""
    stack.send(body, group=group, **attrs)
    rt = stack.runtime()
    crashed = crash_after(rt.client("stepfunctions"), "StartExecution")
    received = receipts_of(rt.client("sqs"))
    with pytest.raises(Crash):
        rt.launcher().tick()
    assert crashed["calls"] == 1
    store = stack.runtime().store()
    (name,) = [n for n in stack.running() if store.execution(n).key == body["id"]]
    return name, list(received)


def switch_and_delete(stack: Stack, clock: FakeClock, ended: list[str]) -> tuple[str, str]:
    """The stack switches to M2; ``ended`` SUCCEEDED on M1 (their events ignored: M1's); M1 is
    deleted. Returns (M1, M2)."""
    m1 = stack.settings.state_machine_arn
    m2 = new_machine(stack)
    for name in ended:
        stack.finish(name, "SUCCEEDED")
    stack.settings = replace(stack.settings, state_machine_arn=m2)
    stack.client("stepfunctions").delete_state_machine(stateMachineArn=m1)
    clock.advance(61)
    return m1, m2


def reconcile_releases(stack: Stack, name: str) -> None:
    """A tick whose reconciliation finds ``name`` vanished and releases it, outcome unknown."""
    stack.launcher().tick()
    store = stack.runtime().store()
    record = store.execution(name)
    assert record is not None and record.state is PayloadState.RELEASED, record
    assert exec_item(stack, name).get("outcome_unknown") == {"BOOL": True}
    assert name not in store.ledger().holders


# -- holds ---------------------------------------------------------------------------------------


def test_a_vanished_names_message_back_through_a_hand_over_is_dead_lettered_not_started(session):
    """L starts n (payload p) on M1 and dies before the delete. Switch to M2, n SUCCEEDED (event
    lost), M1 deleted; reconciliation releases n, outcome unknown. e (payload q) starts on M2. p's
    message becomes visible again; e ends and its completion's hand-over receives p's message as the
    successor: the Put of EXEC#n is refused, the release goes alone, p's message is claimed its own
    way and dead-lettered. n never starts on M2; no slot or lease is left held."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=2, clock=clock)
    n, received = start_then_die_before_the_delete(stack, {"id": "p"}, "gp")
    _, m2 = switch_and_delete(stack, clock, [n])
    reconcile_releases(stack, n)

    stack.send({"id": "q"}, group="gq")
    stack.launcher().tick()
    (e,) = stack.running()
    stack.visible_again(received)
    rt = stack.runtime()
    received_by_completion = receipts_of(rt.client("sqs"))
    rt.launcher().on_status_change(StatusChange.from_event(stack.finish(e, "SUCCEEDED")))
    assert received_by_completion, "the completion's hand-over received nothing"

    assert started_on(stack, m2) == [e], f"n started again on M2: {started_on(stack, m2)}"
    dead = stack.dlq_messages()
    assert [json.loads(m["Body"]) for m in dead] == [{"id": "p"}]
    assert VANISHED in reasons(dead)[0] and n in reasons(dead)[0]
    store = stack.runtime().store()
    assert store.ledger().holders == frozenset()
    assert store.payload("p").holder is None and store.payload("q").holder is None
    assert stack.queue_counts() == (0, 0)


def test_a_deferred_duplicate_parked_behind_a_vanished_name_starts_once_and_the_name_never(session):
    """defer policy. n (p, message m) starts on M1, the launcher dies before m's delete. d, another
    message of p, arrives and parks behind n. Switch, n SUCCEEDED unseen, M1 deleted; reconciliation
    releases n (outcome unknown) and wakes d: d claims its own name and starts on M2. m comes back:
    p is held by d, so m parks behind d (the lease is refused before EXEC#n is read). d ends; m is
    woken, its claim of n refused: dead-lettered. p ran d once on M2, n never again; nothing held."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=3, clock=clock, duplicate_policy=DuplicatePolicy.DEFER)
    n, received = start_then_die_before_the_delete(stack, {"id": "p", "v": 1}, "gm")
    stack.send({"id": "p", "v": 2}, group="gd")
    stack.launcher().tick()
    store = stack.runtime().store()
    assert store.execution(n).parked, "d did not park behind n"
    _, m2 = switch_and_delete(stack, clock, [n])
    reconcile_releases(stack, n)
    stack.launcher().tick()  # d, woken, claims and starts
    (d,) = started_on(stack, m2)
    assert d != n
    stack.visible_again(received)
    stack.launcher().tick()  # m: p is held by d, so m is d's duplicate: parked behind d
    assert store.execution(d).parked, "m did not park behind d"
    stack.launcher().on_status_change(StatusChange.from_event(stack.finish(d, "SUCCEEDED")))
    for _ in range(2):
        clock.advance(61)
        stack.launcher().tick()  # m woken: its claim of n is refused (vanished)

    assert started_on(stack, m2) == [d]
    dead = stack.dlq_messages()
    assert [json.loads(m["Body"]) for m in dead] == [{"id": "p", "v": 1}]
    assert VANISHED in reasons(dead)[0] and n in reasons(dead)[0]
    assert store.ledger().holders == frozenset() and store.payload("p").holder is None
    assert stack.queue_counts() == (0, 0)


def test_a_claim_that_died_before_its_start_on_a_deleted_machine_is_dead_lettered_with_its_slot_freed(
    session,
):
    """L claims n on M1, writes its start mark and dies before StartExecution (n never ran). Switch
    to M2, M1 deleted. Reconciliation: n CLAIMED, its machine gone: released (fenced), outcome
    unknown. m comes back: dead-lettered with the vanished reason, nothing starts on M2 (the
    promise "dead-lettered with a reason" holds, though n provably never started), nothing held."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=2, clock=clock)
    stack.send({"id": "p"}, group="gp")
    rt = stack.runtime()
    received = receipts_of(rt.client("sqs"))
    crash_before(rt.client("stepfunctions"), "StartExecution")
    with pytest.raises(Crash):
        rt.launcher().tick()
    store = stack.runtime().store()
    (n,) = store.ledger().holders
    assert store.execution(n).state is PayloadState.CLAIMED and stack.running() == []
    _, m2 = switch_and_delete(stack, clock, [])
    reconcile_releases(stack, n)
    stack.visible_again(list(received))
    stack.launcher().tick()

    assert started_on(stack, m2) == []
    dead = stack.dlq_messages()
    assert len(dead) == 1 and VANISHED in reasons(dead)[0]
    assert store.ledger().holders == frozenset() and store.payload("p").holder is None
    assert stack.queue_counts() == (0, 0)


def test_a_vanished_concurrency_key_holder_frees_the_key_and_its_message_back_takes_no_key_slot(session):
    """Key concurrency 1 on key c. n (p, key c) starts on M1; the launcher dies before its delete.
    w (q, key c) lines up behind it. Switch, n SUCCEEDED unseen, M1 deleted: reconciliation releases
    n and wakes w, which starts on M2. m (n's message) returns: refused as vanished before any key
    refusal, dead-lettered; w keeps c's one slot, and c has nobody else."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=3, clock=clock)
    n, received = start_then_die_before_the_delete(stack, {"id": "p"}, "gp", sluice_concurrency_key="c")
    stack.send({"id": "q"}, group="gq", sluice_concurrency_key="c")
    stack.launcher().tick()
    assert len(stack.running()) == 1  # q waits in c's line
    _, m2 = switch_and_delete(stack, clock, [n])
    reconcile_releases(stack, n)
    for _ in range(2):
        stack.launcher().tick()
    (w,) = started_on(stack, m2)
    stack.visible_again(received)
    stack.launcher().tick()

    assert started_on(stack, m2) == [w]
    dead = stack.dlq_messages()
    assert [json.loads(m["Body"]) for m in dead] == [{"id": "p"}] and VANISHED in reasons(dead)[0]
    store = stack.runtime().store()
    assert store.ledger().holders == {w}
    assert set(store.key_state("c").holders) == {w}
    assert stack.queue_counts() == (0, 0)


def test_a_message_back_before_the_vanished_release_and_a_run_once_copy_after_it_start_nothing(session):
    """n (p, sluice-once) starts on M1; the launcher dies before the delete. Switch, n SUCCEEDED
    unseen, M1 deleted. m comes back before any reconciliation: the resume asks n by its ARN on M1,
    vanished: dead-lettered, the lease still n's. Reconciliation then releases n (outcome unknown).
    A new run-once message of p: refused by the key's once_unknown mark, dead-lettered. Nothing
    starts on M2, two reasons, no lease or slot held."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=2, clock=clock)
    n, received = start_then_die_before_the_delete(stack, {"id": "p"}, "gp", sluice_once="true")
    _, m2 = switch_and_delete(stack, clock, [n])
    stack.visible_again(received)
    stack.launcher().tick(reconcile_first=False)
    store = stack.runtime().store()
    assert store.payload("p").holder == n  # not released yet: the message went first
    clock.advance(61)
    reconcile_releases(stack, n)
    stack.send({"id": "p"}, group="gp2", sluice_once="true")
    stack.launcher().tick()

    assert started_on(stack, m2) == []
    dead = stack.dlq_messages()
    assert len(dead) == 2, reasons(dead)
    assert VANISHED in reasons(dead)[0] and n in reasons(dead)[0]
    assert reasons(dead)[1], "the run-once copy was dead-lettered without a reason"
    assert store.ledger().holders == frozenset() and store.payload("p").holder is None
    assert stack.queue_counts() == (0, 0)


# -- the retention -------------------------------------------------------------------------------


def test_a_vanished_names_message_back_after_the_retention_is_not_started_again(session):
    """retentionDays 1 (allowed: 1..3650; the queue keeps a message 14 days). n (p) starts on M1,
    the launcher dies before the delete. Switch, n SUCCEEDED unseen, M1 deleted; reconciliation
    releases n, outcome unknown (PAYLOAD#p is kept: once_unknown, no expiry). p's message waits in
    the queue two days (its group held, the pool paused...), then up to the queue's 14: EXEC#n is
    kept past them (a name that ran outlives its messages), so m is refused, never started on M2."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=2, clock=clock, retention_days=1)
    n, received = start_then_die_before_the_delete(stack, {"id": "p"}, "gp")
    _, m2 = switch_and_delete(stack, clock, [n])
    reconcile_releases(stack, n)
    clock.advance(14 * DAY)
    deleted = expire_ttl(stack)
    assert f"EXEC#{n}" not in deleted and "PAYLOAD#p" not in deleted
    stack.visible_again(received)
    stack.launcher().tick()

    assert n not in started_on(stack, m2), f"{n} ran on M1 and started again on M2"


def test_a_name_that_ended_is_refused_to_its_message_back_after_the_retention(session):
    """retentionDays 1. n SUCCEEDED and was released by reconciliation (its event lost) while its
    message, never deleted, waited 14 days in the queue: EXEC#n is kept past them, so m is settled
    as already ran, not started a second time."""
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=2, clock=clock, retention_days=1)
    n, received = start_then_die_before_the_delete(stack, {"id": "p"}, "gp")
    stack.finish(n, "SUCCEEDED")
    clock.advance(120)
    stack.launcher().tick()  # reconciliation: n ended, released
    assert stack.runtime().store().execution(n).state is PayloadState.SUCCEEDED
    clock.advance(14 * DAY)
    deleted = expire_ttl(stack)
    assert "PAYLOAD#p" in deleted and f"EXEC#{n}" not in deleted
    stack.visible_again(received)
    stack.launcher().tick()
    assert [e["name"] for e in stack.executions()] == [n], "a name that ran started a second time"
    assert stack.queue_counts() == (0, 0)

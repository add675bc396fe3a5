"""A run-once holder whose execution vanished with its state machine (deleted after a switch, its
end's event lost): its outcome cannot be known, so the key's next once-message must not run by
itself. The release marks the payload record ``once_unknown``; a once-claim of the key is refused
on it in the claim's own condition and the message is dead-lettered with the reason; the mark
outlives ``retentionDays``. The real Launcher and reconciliation on moto."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sluice.core.clock import FakeClock
from sluice.core.model import Outcome, PayloadState
from sluice.ops.dlq import dlq_redrive
from tests.integration.test_once_ttl_moto import expire_ttl
from tests.support.aws import Stack, build_stack, new_machine
from tests.support.cli import sluice, use_env
from tests.support.hooks import Crash, crash_after, receipts_of

DAY = 86_400


def payload_item(stack: Stack, key: str) -> dict:
    found = stack.client("dynamodb").get_item(
        TableName=stack.settings.table_name, Key={"pk": {"S": f"PAYLOAD#{key}"}}, ConsistentRead=True
    )
    return found.get("Item", {})


def vanish_a_once_run(stack: Stack, *, once: bool = True) -> str:
    """A message of k (run-once unless ``once`` is False) starts e1 on M1; the stack switches to M2;
    a tick marks e1 RUNNING by its ARN; e1 ends (its event lost) and M1 is deleted; a tick releases
    e1 as vanished. Returns e1."""
    clock = stack.clock
    stack.send({"id": "k"}, group="a", **({"sluice_once": "true"} if once else {}))
    stack.launcher().tick()
    (e1,) = stack.running()
    m2 = new_machine(stack)
    m1 = stack.settings.state_machine_arn
    stack.settings = replace(stack.settings, state_machine_arn=m2)
    clock.advance(61)
    stack.launcher().tick()
    store = stack.runtime().store()
    assert store.execution(e1).state is PayloadState.RUNNING
    stack.finish(e1, "SUCCEEDED", output="{}")  # its status event is lost
    stack.client("stepfunctions").delete_state_machine(stateMachineArn=m1)
    clock.advance(61)
    stack.launcher().tick()
    assert store.ledger().holders == frozenset()
    assert store.execution(e1).state is PayloadState.RELEASED
    return e1


def dead_reasons(stack: Stack) -> list[str]:
    return [m["MessageAttributes"]["sluice-error"]["StringValue"] for m in stack.dlq_messages()]


def test_a_once_message_of_a_key_whose_once_run_vanished_is_dead_lettered_with_the_reason(session):
    stack = build_stack(session, max_concurrency=2, clock=FakeClock())
    e1 = vanish_a_once_run(stack)
    item = payload_item(stack, "k")
    assert item["once_unknown"]["S"] == e1
    assert "succeeded_by" not in item and "expires_at" not in item

    stack.send({"id": "k"}, group="b", sluice_once="true")
    summary = stack.launcher().tick()
    assert stack.running() == [], "a run-once key whose run's outcome is unknown started again"
    assert summary.n(Outcome.INVALID) == 1
    (reason,) = dead_reasons(stack)
    assert e1 in reason and "outcome" in reason and "once_unknown" in reason
    assert stack.queue_counts() == (0, 0)


def test_the_mark_outlives_retention(session):
    stack = build_stack(session, max_concurrency=2, clock=FakeClock())
    e1 = vanish_a_once_run(stack)
    stack.clock.advance(400 * DAY)
    expire_ttl(stack)  # DynamoDB's TTL sweep, a year on
    assert payload_item(stack, "k").get("once_unknown", {}).get("S") == e1, "the mark expired"
    stack.send({"id": "k"}, group="b", sluice_once="true")
    stack.launcher().tick()
    assert stack.running() == [], "a once-message of the key ran after the retention"
    (reason,) = dead_reasons(stack)
    assert e1 in reason


def test_a_plain_message_of_the_marked_key_still_runs_and_the_mark_outlives_it(session):
    stack = build_stack(session, max_concurrency=2, clock=FakeClock())
    e1 = vanish_a_once_run(stack)
    stack.send({"id": "k", "plain": True}, group="b")  # no sluice-once: runs whatever the mark says
    stack.launcher().tick()
    (plain,) = stack.running()
    assert plain != e1
    stack.finish(plain, "FAILED", error="Boom")  # a success would make the key done: already_done
    stack.clock.advance(61)
    stack.launcher().tick()  # released by reconciliation
    item = payload_item(stack, "k")
    assert "expires_at" not in item and item["once_unknown"]["S"] == e1  # kept, never under TTL

    stack.clock.advance(400 * DAY)
    expire_ttl(stack)  # DynamoDB's TTL sweep, a year on
    stack.send({"id": "k"}, group="c", sluice_once="true")
    stack.launcher().tick()
    assert [e["name"] for e in stack.executions()] == [plain], "a once-message ran after the retention"
    (reason,) = dead_reasons(stack)
    assert e1 in reason


def test_a_plain_holder_that_vanished_marks_its_key_too(session):
    """It may have SUCCEEDED: a run-once message of its key is dead-lettered, a plain one runs."""
    stack = build_stack(session, max_concurrency=2, clock=FakeClock())
    e1 = vanish_a_once_run(stack, once=False)
    assert payload_item(stack, "k")["once_unknown"] == {"S": e1}
    stack.send({"id": "k"}, group="b", sluice_once="true")
    stack.launcher().tick()
    assert stack.running() == []
    (reason,) = dead_reasons(stack)
    assert e1 in reason


def clear_the_mark(stack: Stack, name: str, *, succeeded: bool) -> None:
    """The operator's way out, as docs/operations.md writes it (a conditional update-item)."""
    expression = "REMOVE once_unknown"
    if succeeded:
        expression = "SET succeeded_by = if_not_exists(succeeded_by, :e) " + expression
    stack.client("dynamodb").update_item(
        TableName=stack.settings.table_name,
        Key={"pk": {"S": "PAYLOAD#k"}},
        UpdateExpression=expression,
        ConditionExpression="once_unknown = :e",
        ExpressionAttributeValues={":e": {"S": name}},
    )


@pytest.mark.parametrize("succeeded", [False, True])
def test_the_operator_clears_the_mark_and_redrives(session, succeeded):
    stack = build_stack(session, max_concurrency=2, clock=FakeClock())
    e1 = vanish_a_once_run(stack)
    stack.send({"id": "k"}, group="b", sluice_once="true")
    assert stack.launcher().tick().n(Outcome.INVALID) == 1
    clear_the_mark(stack, e1, succeeded=succeeded)
    assert dlq_redrive(stack.runtime()).ok
    summary = stack.launcher().tick()
    if succeeded:
        assert stack.running() == [] and summary.n(Outcome.ALREADY_DONE) == 1
    else:
        assert len(stack.running()) == 1 and summary.n(Outcome.STARTED) == 1
    assert stack.queue_counts() == (0, 0) and stack.queue_counts(stack.settings.dlq_url) == (0, 0)


def switch_and_delete_with_the_claim_unmarked(stack: Stack, *, once: bool) -> str:
    """A message of k starts e1 on M1 (its record stays CLAIMED: no tick marks it RUNNING); the
    stack switches to M2; e1 SUCCEEDED (its event lost); M1 is deleted. Returns e1."""
    stack.send({"id": "k"}, group="a", **({"sluice_once": "true"} if once else {}))
    stack.launcher().tick()
    (e1,) = stack.running()
    store = stack.runtime().store()
    assert store.execution(e1).state is PayloadState.CLAIMED
    m2 = new_machine(stack)
    m1 = stack.settings.state_machine_arn
    stack.settings = replace(stack.settings, state_machine_arn=m2)
    stack.finish(e1, "SUCCEEDED", output="{}")  # its status event is lost
    stack.client("stepfunctions").delete_state_machine(stateMachineArn=m1)
    return e1


def test_a_once_claim_on_a_deleted_machine_is_released_as_vanished_and_marks_its_key(session):
    """Absent on a deleted machine is no proof that a claim never started: e1 may have SUCCEEDED
    there. Released at once (nothing can start on a deleted machine), its outcome unknown."""
    stack = build_stack(session, max_concurrency=2, clock=FakeClock())
    e1 = switch_and_delete_with_the_claim_unmarked(stack, once=True)
    stack.clock.advance(61)
    stack.launcher().tick()
    store = stack.runtime().store()
    assert store.ledger().holders == frozenset(), "a claim on a deleted machine kept its slot"
    assert store.execution(e1).state is PayloadState.RELEASED
    assert payload_item(stack, "k")["once_unknown"]["S"] == e1

    stack.clock.advance(2_000)  # past any claim timeout
    stack.send({"id": "k"}, group="b", sluice_once="true")
    stack.launcher().tick()
    assert stack.running() == [], "a run-once key whose run SUCCEEDED started again"
    (reason,) = dead_reasons(stack)
    assert e1 in reason


def test_a_once_claim_on_a_deleted_machine_never_lets_its_key_run_again(session):
    """However long reconciliation goes on (one container: its own two sightings would release an
    abandoned claim), a once-message of the key does not run by itself."""
    stack = build_stack(session, max_concurrency=2, clock=FakeClock())
    e1 = switch_and_delete_with_the_claim_unmarked(stack, once=True)
    launcher = stack.launcher()
    for _ in range(3):
        stack.clock.advance(1_000)
        launcher.tick()
    assert stack.runtime().store().ledger().holders == frozenset()
    stack.send({"id": "k"}, group="b", sluice_once="true")
    launcher.tick()
    assert stack.running() == [], "a run-once key whose run SUCCEEDED started again"
    (reason,) = dead_reasons(stack)
    assert e1 in reason


def test_a_plain_claim_on_a_deleted_machine_frees_its_key_at_once(session):
    stack = build_stack(session, max_concurrency=2, clock=FakeClock())
    e1 = switch_and_delete_with_the_claim_unmarked(stack, once=False)
    stack.clock.advance(61)
    stack.launcher().tick()
    assert stack.runtime().store().ledger().holders == frozenset()
    assert payload_item(stack, "k")["once_unknown"] == {"S": e1}  # it may have run there
    stack.send({"id": "k", "n": 2}, group="b")
    stack.launcher().tick()
    (e2,) = stack.running()
    assert e2 != e1


def test_sluice_status_shows_the_mark(session, monkeypatch, capsys):
    stack = build_stack(session, max_concurrency=2, clock=FakeClock())
    e1 = vanish_a_once_run(stack)
    use_env(monkeypatch, stack)
    shown = sluice(capsys, "status", "k", session=session)
    assert f"outcome of run {e1} unknown" in shown.out
    as_json = json.loads(sluice(capsys, "status", "k", "--json", session=session).out)
    assert as_json["payload"]["once_unknown"] == e1


@pytest.mark.parametrize("run_anyway", [False, True])
def test_a_waiter_on_a_key_whose_run_vanished_is_not_left_parked(session, run_anyway):
    """Whether the vanished run SUCCEEDED is unknown: the waiter is dead-lettered with that reason,
    or, with ``sluice-on-await-failure: run``, starts (the key has ended, whichever way)."""
    stack = build_stack(session, max_concurrency=2, clock=FakeClock())
    e1 = vanish_a_once_run(stack, once=False)
    extra = {"sluice_on_await_failure": "run"} if run_anyway else {}
    stack.send({"id": "w"}, group="b", sluice_awaits=json.dumps(["k"]), **extra)
    stack.launcher().tick()
    if run_anyway:
        (started,) = stack.running()
        assert started != e1 and dead_reasons(stack) == []
    else:
        assert stack.running() == []
        assert dead_reasons(stack) == ["awaited k ended with an unknown outcome"]


def test_the_message_of_a_run_that_vanished_is_not_started_again_when_it_comes_back(session):
    """The launcher dies after e1's StartExecution, before deleting its message; the stack switches,
    e1 ends (its event lost), M1 is deleted, reconciliation releases e1 as vanished. The message
    comes back: e1 may have run on M1, so it is not started again on M2 but dead-lettered with the
    reason a resumed claim on a deleted machine gets."""
    stack = build_stack(session, max_concurrency=2, clock=FakeClock())
    stack.send({"id": "k"}, group="a")
    rt = stack.runtime()
    receipts = receipts_of(rt.client("sqs"))
    crashed = crash_after(rt.client("stepfunctions"), "StartExecution")
    with pytest.raises(Crash):
        rt.launcher().tick()
    assert crashed["calls"] == 1
    (e1,) = stack.running()
    m1 = stack.settings.state_machine_arn
    stack.settings = replace(stack.settings, state_machine_arn=new_machine(stack))
    stack.finish(e1, "SUCCEEDED", output="{}")  # its status event is lost
    stack.client("stepfunctions").delete_state_machine(stateMachineArn=m1)
    stack.clock.advance(2_000)
    stack.launcher().tick()
    assert stack.runtime().store().execution(e1).state is PayloadState.RELEASED

    stack.visible_again(receipts)
    stack.launcher().tick()
    assert stack.running() == [], "the name of a run that vanished started again on the new machine"
    (reason,) = dead_reasons(stack)
    assert reason.startswith(
        f"its claim {e1} is on state machine {m1.split(':')[6]}, no longer used and deleted"
    )
    assert stack.queue_counts() == (0, 0)

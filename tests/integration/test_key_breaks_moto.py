"""Issue 25, breaks 3 and 4: a blocked claim started anyway (promise 2), and a holder of a deleted
state machine that leaked its slot (promise 4). Each reproduced in the reliability world exactly as
the issue tells it (moto in-process, atomic requests, a fake clock, faults through botocore hooks)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from sluice.core.clock import FakeClock
from sluice.core.errors import ConfigurationError
from sluice.core.model import Outcome, PayloadState
from tests.reliability.world import CLAIM_TIMEOUT, VISIBILITY, WINDOW
from tests.support.aws import build_stack, new_machine
from tests.support.faults import CrashAt, Interleave
from tests.support.hooks import error_answer


def body(key: str) -> str:
    return json.dumps({"id": key})


def runs_of(world, key: str) -> list[str]:
    return [s.name for s in world.model.starts if s.key == key]


def failed(world) -> str:
    """j's first run e1 FAILED and was released."""
    world.send(body("j"), group="g0")
    world.tick("A")
    (e1,) = world.model.running
    world.end(e1, "FAILED")
    assert world.deliver(0) == "ok"
    world.advance(WINDOW + 1)
    return e1


def test_a_resumed_claim_blocked_before_its_start_mark_never_starts(make_world):
    """Break 3. Tick A claimed n2 of j and died before its start. n2's message back, tick A resumes
    it: its renewal lifts the mark the claim carried; before A marks it anew, the operator redrives
    e1 and tick B's reconciliation, refused the adoption of e1 (n2 holds j's lease), blocks n2. The
    mark is refused and n2 never starts. Failed before the fix: promise 2 (n2 started for j while
    e1 still runs): the mark did not check ``blocked_by``."""
    world = make_world(max_concurrency=3)
    e1 = failed(world)
    world.send(body("j"), group="g1")  # a new message of j: n2
    crash = CrashAt("after_claim")
    assert world.tick("A", [crash]) == "crashed" and crash.seen == 1
    world.advance(VISIBILITY + 1)
    # The operator redrives e1 once tick A's reconciliation has listed (so A does not adopt it).
    redrive = Interleave("after_list", lambda: world.redrive(e1))
    blocking = Interleave("before_start_mark", lambda: world.tick("B"))
    assert world.tick("A", [redrive, blocking]) == "ok"
    assert redrive.seen >= 1
    assert blocking.seen >= 1, "tick A never resumed n2 up to its start mark"
    world.check()
    assert runs_of(world, "j") == [e1], "j ran twice"
    assert world.holders(world.table()) == {e1}, "the redriven run holds j's slot"
    world.advance(WINDOW + 1)  # n2's message, refused by e1 (RUNNING), is looked at again a window later
    world.tick("A")
    world.check()
    assert world.queue_depth() == 0, "n2's message was settled as a duplicate of e1"
    world.settle()


def test_a_hand_over_claim_carries_its_start_mark_so_a_block_before_its_start_is_refused(make_world):
    """Break 3, the hand-over's StartExecution: a completion's release hands x's slot to n2 of j;
    before n2's start the operator redrives e1 and tick B tries to block n2. n2's claim, in the
    release's transaction, carries its start mark: the block is refused, n2 starts (committed
    before the redrive was seen), and j's lease is marked, so e1 is adopted once n2 ends. Failed
    before the fix: the hand-over's claim was started whatever its record said."""
    world = make_world(max_concurrency=3)
    e1 = failed(world)
    world.send(body("x"), group="gx")
    world.tick("A")
    (x,) = world.model.running
    world.send(body("j"), group="g1")  # n2, received by x's completion
    world.end(x)

    def redrive_and_reconcile() -> None:
        world.redrive(e1)
        world.tick("B")

    late = Interleave("before_start", redrive_and_reconcile)
    assert world.deliver(0, [late]) == "ok"
    assert late.seen == 1, "the completion's hand-over never reached its start"
    world.check()
    (n2,) = [n for n in runs_of(world, "j") if n != e1]
    record = world.table()[f"EXEC#{n2}"]
    assert "starting_at" in record and "blocked_by" not in record, "a block landed on the marked claim"
    assert world.table()["PAYLOAD#j"].get("redriven", {}).get("S") == e1, "j's lease is marked"
    world.end(n2)
    assert world.deliver(len(world.pending) - 1) == "ok"
    world.send(body("j"), group="g2")
    world.tick("A")
    world.check()
    assert world.holders(world.table()) == {e1}, "the redriven run was adopted"
    world.settle()


def test_a_block_after_the_start_mark_is_refused_and_the_key_marked(make_world):
    """Break 3, a fresh claim: n2's claim carries its start mark, so tick B's block between the
    claim and the start is refused and n2 starts (it had committed to start before the redrive was seen, as if e1 had been
    redriven after n2's start). j's lease is marked: once n2 ends, the next claim adopts e1."""
    world = make_world(max_concurrency=3)
    e1 = failed(world)
    world.send(body("j"), group="g1")
    redrive = Interleave("after_list", lambda: world.redrive(e1))
    late = Interleave("before_start", lambda: world.tick("B"))
    assert world.tick("A", [redrive, late]) == "ok"
    assert redrive.seen >= 1 and late.seen == 1
    world.check()
    (n2,) = [n for n in runs_of(world, "j") if n != e1]
    record = world.table()[f"EXEC#{n2}"]
    assert "blocked_by" not in record, "a block landed after the start mark"
    assert world.table()["PAYLOAD#j"].get("redriven", {}).get("S") == e1, "j's lease is marked"
    world.end(n2)
    assert world.deliver(len(world.pending) - 1) == "ok"
    world.send(body("j"), group="g2")
    world.tick("A")
    world.check()
    assert world.holders(world.table()) == {e1}, "the redriven run was adopted"
    world.settle()


# -- break 4: a holder whose state machine was deleted ------------------------------------------------


def marked_running_then_deleted(session, clock: FakeClock):
    """A holder on M1, marked RUNNING after a switch to M2 (its run missing from M2's listing,
    DescribeExecution by its recorded ARN said RUNNING); then M1 is deleted."""
    stack = build_stack(session, clock=clock, max_concurrency=1)
    stack.send({"id": "old"})
    stack.launcher().tick()
    (old,) = stack.running()
    switched = stack.runtime(state_machine_arn=new_machine(stack))
    clock.advance(61)
    switched.launcher().tick()
    assert switched.store().execution(old).state is PayloadState.RUNNING
    sfn = stack.client("stepfunctions")
    sfn.delete_state_machine(stateMachineArn=stack.settings.state_machine_arn)
    return stack, switched, old


def test_a_holder_of_a_deleted_state_machine_is_released(session):
    """Break 4. Failed before the fix: the slot and the lease stayed held for good (reconciliation
    released only CLAIMED holders Step Functions said did not exist), so "new" never started."""
    clock = FakeClock()
    stack, switched, old = marked_running_then_deleted(session, clock)
    stack.send({"id": "new"})
    clock.advance(61)
    summary = switched.launcher().tick()
    assert summary.released_by_reconcile == 1 and summary.n(Outcome.STARTED) == 1
    record = switched.store().execution(old)
    assert record.state is PayloadState.RELEASED and "does not exist" in (record.error or "")
    assert switched.store().payload("old").holder is None


def answer_describe(client, code: str, arn_part: str) -> Counter:
    """Answer DescribeExecution with ``code`` for the ARNs containing ``arn_part``, as Step Functions
    would (moto answers ExecutionDoesNotExist for a deleted machine's executions)."""
    fired: Counter = Counter()

    def hook(params, **_) -> tuple | None:
        body = params.get("body", b"")  # the serialized request: {"executionArn": ...}
        if arn_part not in (body.decode() if isinstance(body, bytes) else str(body)):
            return None
        fired[code] += 1
        return error_answer(code, 400)

    client.meta.events.register("before-call.sfn.DescribeExecution", hook)
    return fired


def test_a_holder_whose_state_machine_does_not_exist_is_released(session):
    """Break 4, StateMachineDoesNotExist: Step Functions' other answer for a deleted machine's
    execution. Failed before the fix: a ConfigurationError for a machine the stack no longer uses,
    logged and skipped each tick; the slot and lease stayed held."""
    clock = FakeClock()
    stack, switched, old = marked_running_then_deleted(session, clock)
    fired = answer_describe(
        switched.client("stepfunctions"), "StateMachineDoesNotExist", ":sluice-test-workflow:"
    )
    stack.send({"id": "new"})
    clock.advance(61)
    summary = switched.launcher().tick()
    assert fired["StateMachineDoesNotExist"] >= 1
    assert summary.released_by_reconcile == 1 and summary.n(Outcome.STARTED) == 1
    assert switched.store().execution(old).state is PayloadState.RELEASED


def test_the_stacks_own_missing_state_machine_stays_a_configuration_error(session):
    """StateMachineDoesNotExist for the machine the stack uses is a misconfigured stack: loud, and
    nothing is released on its word."""
    clock = FakeClock()
    stack = build_stack(session, clock=clock, max_concurrency=1)
    stack.send({"id": "old"})
    stack.launcher().tick()
    (old,) = stack.running()
    rt = stack.runtime()
    fired = answer_describe(rt.client("stepfunctions"), "StateMachineDoesNotExist", old)
    clock.advance(61)
    with pytest.raises(ConfigurationError):
        rt.executions().describe(old)
    assert fired["StateMachineDoesNotExist"] == 1
    assert rt.store().execution(old).state.holds_lease


# -- break 3 by another copy: a copy's resume lifts the mark of a claim about to start ----------------


@pytest.mark.parametrize("point", ["after_claim", "before_start"])
def test_a_copy_of_the_message_never_lifts_the_mark_of_a_claim_about_to_start(make_world, point):
    """Found by an attack on moto: two copies of one message (the second carries the first's
    ``sluice-origin-message-id`` in another group: one name N). Tick A claims N; before its start
    the operator redrives e1, j's earlier run, and tick B runs: its reconciliation, refused the
    adoption (N holds j) and the block (N's mark), marks j; its admission receives the copy, finds
    N's claim and resumes it. Were the renewal to lift A's mark, the copy would yield to e1 (N
    rolled back, e1 adopted) and A, past its mark, would start N beside e1, holding nothing. A
    mark is lifted only by the copy that wrote it (``copy_id``), whose redelivery comes after its
    invocation ended: the copy is looked at again later, and settles as N's."""
    world = make_world(max_concurrency=3)
    e1 = failed(world)
    m1 = world.send(body("j"), group="g1")

    def redrive_copy_and_tick() -> None:
        world.redrive(e1)
        world.send(body("j"), group="g2", attributes={"sluice-origin-message-id": m1})
        world.tick("B")

    meanwhile = Interleave(point, redrive_copy_and_tick)
    assert world.tick("A", [meanwhile]) == "ok"
    assert meanwhile.seen == 1
    world.check()
    (n2,) = [n for n in runs_of(world, "j") if n != e1]
    assert world.holders(world.table()) >= {n2}, "N started holding no slot"
    assert world.table()["PAYLOAD#j"].get("holder", {}).get("S") == n2
    world.end(n2)
    assert world.deliver(len(world.pending) - 1) == "ok"
    # The copy is back once N's claim has expired; it finds e1 adopted: a duplicate, settled at
    # its second sighting.
    for wait in (CLAIM_TIMEOUT, WINDOW):
        world.advance(wait + 1)
        world.tick("A")
        world.check()
    assert world.queue_depth() == 0, "the copy was settled"
    assert sorted(runs_of(world, "j")) == sorted([e1, n2]), "N ran once, the copy started nothing"
    world.settle()


def test_a_resume_never_gives_back_a_claim_another_copy_renewed_since(make_world):
    """Found by an attack on moto (and broken before copies owned their marks). m1 claimed N and
    died before its start. m1 back, tick A renews N; then tick B receives a copy of m1 (its origin
    id, another group), renews N too (no mark: A's renewal lifted it), marks and starts it. The
    operator redrives e1, and B's next reconciliation marks j (the block is refused: B's mark).
    A, reading j's mark, would yield: roll N back, fenced on the version it reads, B's. A claim
    another copy renewed since is that copy's: A looks again, finds N running, and N keeps j."""
    world = make_world(max_concurrency=3)
    e1 = failed(world)
    m1 = world.send(body("j"), group="g1")
    crash = CrashAt("after_claim")
    assert world.tick("A", [crash]) == "crashed" and crash.seen == 1
    world.advance(VISIBILITY + 1)

    def copy_starts_then_redrive() -> None:
        world.send(body("j"), group="g2", attributes={"sluice-origin-message-id": m1})
        assert world.tick("B") == "ok"  # the copy's resume: renewed, marked, started
        world.redrive(e1)
        world.advance(1)
        assert world.tick("B") == "ok"  # reconciliation: j marked, the block refused

    meanwhile = Interleave("after_renew", copy_starts_then_redrive)
    assert world.tick("A", [meanwhile]) == "ok"
    assert meanwhile.seen == 1
    world.check()
    (n2,) = [n for n in runs_of(world, "j") if n != e1]
    assert world.table()[f"EXEC#{n2}"]["state"]["S"] == "CLAIMED", "N was given back while it ran"
    assert world.table()["PAYLOAD#j"].get("holder", {}).get("S") == n2
    world.end(n2)
    assert world.deliver(len(world.pending) - 1) == "ok"
    for _ in range(2):
        world.advance(WINDOW + 1)
        world.tick("A")
        world.check()
    assert world.queue_depth() == 0
    world.settle()

"""The suite catches what it exists to catch: broken variants of Sluice, each patched in for the
length of one test, must make the suite fail.

Two are launchers others have shipped, caught by the property suite within a fixed, derandomised
budget: random execution names, and a slot count decremented per status event.

The rest are the shapes of the bugs fixed since (issue 9) and the shortcuts a refactoring could
take (issue 10), each caught by the scenario that pins it down: the scenario passes on Sluice as it
is (it runs in ``test_promise_breaks.py`` or below) and fails with the variant patched in. A variant
is caught only by a broken promise (``PromiseBroken``) or a failed assertion about what AWS holds;
any other error fails the test, so a variant cannot pass by crashing the scenario.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky
from hypothesis.stateful import rule, run_state_machine_as_test

import sluice.adapters.aws.sfn
import sluice.adapters.aws.sqs
import sluice.adapters.dynamo.claims
import sluice.adapters.dynamo.keys
import sluice.adapters.dynamo.parking
import sluice.adapters.dynamo.release
import sluice.adapters.dynamo.store
import sluice.concurrency
import sluice.features.fair
import sluice.features.keys
import sluice.features.pointers
import sluice.launch.admission
import sluice.launch.completion
import sluice.launch.handover
import sluice.launch.lane_admission
import sluice.launch.launcher
import sluice.launch.message_branches
import sluice.launch.per_message
import sluice.launch.reconcile
import sluice.launch.redriven
import sluice.ops.maximum
import sluice.primitives.fanout
import sluice.runtime
from sluice.adapters.aws.ssm import SsmMax
from sluice.adapters.dynamo.claims import ClaimsTable
from sluice.adapters.dynamo.keys import KeysTable
from sluice.adapters.dynamo.lanes import LaneSlots
from sluice.adapters.dynamo.launch_slots import POOL
from sluice.adapters.dynamo.slots import release_item
from sluice.adapters.dynamo.store import DynamoStore, create_table
from sluice.adapters.memory.lease import MemoryLeases
from sluice.core.clock import FakeClock
from sluice.core.errors import AmbiguousStartError, InvalidPayload, NotFound, SluiceError, TransientError
from sluice.core.limits import LimitSource, MaxReading
from sluice.core.model import Ending, PayloadState
from sluice.core.names import ORIGIN_ATTRIBUTE, origin_id
from sluice.features.keys import TICKET_ATTRIBUTE
from sluice.features.pointers import Pointer
from sluice.launch.completion import complete
from sluice.launch.lane_admission import LaneAdmission
from sluice.launch.launcher import Launcher
from sluice.launch.message_branches import MessageBranches
from sluice.launch.per_message import THROTTLED_STARTS, MessageProtocol
from sluice.launch.settings import DuplicatePolicy
from sluice.primitives.lease import LeaseSlot
from sluice.primitives.slots import Capacity
from sluice.runtime import CLIENT_CONFIG
from sluice.semaphore.model import HandOff, Released, pool_of
from sluice.semaphore.model import State as SemaphoreState
from sluice.semaphore.step import Semaphores
from tests.contract import test_store_fences as fences
from tests.integration import test_awaits_moto as awaits_moto
from tests.integration import test_handover_moto as handover_moto
from tests.integration import test_keys_breaks as keys_breaks
from tests.integration import test_keys_moto as keys_moto
from tests.integration import test_launcher_moto as launching
from tests.integration import test_parallel_fill as fill
from tests.integration import test_parallel_fill_breaks as breaks_moto
from tests.integration import test_parking_moto as parking_moto
from tests.integration import test_stale_duplicate_moto as stale_duplicate
from tests.reliability import machine as programs
from tests.reliability import test_promise_breaks as breaks
from tests.reliability.conftest import profile, profile_name
from tests.reliability.exclusive_machine import MemoryExclusiveMachine
from tests.reliability.machine import SluiceMachine
from tests.reliability.semaphore_machine import MemorySemaphoreMachine
from tests.reliability.world import CLAIM_TIMEOUT, VISIBILITY, WINDOW, PromiseBroken, World
from tests.support.aws import build_stack, moto_session
from tests.support.faults import KEY_POINTS, AttemptFaults, CrashAt, Interleave, Throttle
from tests.support.hooks import retry_sleeps
from tests.support.moto_patches import atomic_fast_moto

BUDGET = settings(
    max_examples=40,
    stateful_step_count=25,
    derandomize=True,
    database=None,
    deadline=None,
    phases=(Phase.generate,),
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
)

Scenario = Callable[..., None]


def run(scenario: Scenario, **params: Any) -> None:
    """Run one scenario with its own worlds, closed afterwards."""
    worlds: list[World] = []

    def make(**kwargs: Any) -> World:
        worlds.append(World(**kwargs))
        return worlds[-1]

    try:
        scenario(make, **params)
    finally:
        for world in worlds:
            world.close()


def caught(scenario: Scenario, **params: Any) -> BaseException:
    """The scenario fails on a broken promise, a failed assertion, or an error Sluice itself
    reports from AWS (a tick that fails on every run)."""
    with pytest.raises((AssertionError, SluiceError)) as failure:
        run(scenario, **params)
    print(failure.value)
    return failure.value


def body(key: str) -> str:
    return json.dumps({"id": key})


# -- launchers others have shipped: the property suite ------------------------------------------------


def random_name(key: str, message_id: str) -> str:
    return f"run-{uuid.uuid4().hex}"


class CountingStore(DynamoStore):
    """Frees a slot for every status event, whether or not this execution still held one."""

    def release(self, name, ending, **more):
        released = super().release(name, ending, **more)
        if released is None:
            holders = sorted(self.ledger().holders)
            victim = self.execution(holders[0]) if holders else None
            if victim is not None and victim.shard is not None:
                self.client.update_item(**release_item(self.table, POOL, victim.shard, victim.name)["Update"])
        return released


def property_suite_fails() -> BaseException:
    """Run the property suite's budget; return what broke it. Programs with two launchers in threads
    are not fully deterministic, so Hypothesis's replay of a failure it found can diverge: it then
    reports the failure as flaky, which still means a promise broke in the run that found it."""
    with pytest.raises((PromiseBroken, Flaky)) as failure:
        run_state_machine_as_test(SluiceMachine, settings=BUDGET)
    print(failure.value)
    return failure.value


def redelivered_after_its_run_ended(make_world: Callable[..., World]) -> None:
    """The launcher dies after the start, before the delete; the run ends and is released; then the
    message comes back. Its name must be the one that ran: Step Functions refuses it again, and the
    message is settled as already ran, never run a second time."""
    world = make_world(max_concurrency=2)
    world.send(body("p0"), group="g0")
    assert world.tick("A", [CrashAt("after_start")]) == "crashed"
    (p0,) = world.model.running
    world.end(p0, "SUCCEEDED")
    assert world.deliver(0) == "ok"
    world.advance(VISIBILITY + 1)
    world.tick("B")
    world.check()
    world.settle()


def test_the_redelivered_after_its_run_ended_scenario_holds():
    run(redelivered_after_its_run_ended)


def test_random_execution_names_are_caught(monkeypatch):
    monkeypatch.setattr(sluice.launch.per_message, "execution_name", random_name)
    monkeypatch.setattr(sluice.launch.handover, "execution_name", random_name)
    failure = caught(redelivered_after_its_run_ended)
    assert "exactly once" in str(failure)


# A whole search for a variant that an explicit program also catches runs in `make soak` (SOAK_VARIANTS
# in mk/soak.mk); `make test` replays the program the search reaches the variant with, on Sluice as it
# is and with the variant in (tests/reliability/test_suite_programs.py).
in_the_soak = pytest.mark.skipif(
    profile_name() != "reliability-soak",
    reason="a whole search, run by make soak; test_suite_programs.py replays the program it finds",
)


@in_the_soak
def test_a_counter_decremented_per_event_is_caught(monkeypatch):
    monkeypatch.setattr(sluice.runtime, "DynamoStore", CountingStore)
    property_suite_fails()


@in_the_soak
def test_the_promises_alone_catch_the_counter(monkeypatch):
    """Without the ledger-against-leases check, promise 1 (MAX) or 4 (no leak) still fails."""
    monkeypatch.setattr(sluice.runtime, "DynamoStore", CountingStore)
    monkeypatch.setattr(World, "check_ledger", False)
    failure = property_suite_fails()
    if isinstance(failure, PromiseBroken):
        assert re.search(r"promise [14]", str(failure)), failure


# -- issue 9: the bugs fixed, put back ----------------------------------------------------------------


def resume_after_a_mark(make_world: Callable[..., World]) -> None:
    """A claim whose launcher died is marked by reconciliation (first sighting). A claim timeout
    later its message comes back to a completion's refill, which resumes it; as the refill is about
    to start it, the same reconciler sees it a second time. The renewal must fence that release off."""
    world = make_world(max_concurrency=2)
    world.send(body("e"), group="ge")
    world.tick("A")
    (e,) = world.model.running
    world.send(body("p0"), group="g0")
    assert world.tick("A", [CrashAt("after_claim")]) == "crashed"
    world.advance(WINDOW + 1)
    world.tick("B")  # first sighting: marked by B
    world.advance(CLAIM_TIMEOUT + 1)
    world.send(body("p0"), group="g1")
    world.send(body("q"), group="g2")
    world.end(e)
    second = Interleave("before_start", lambda: world.tick("B"))
    assert world.deliver(0, [second]) == "ok"
    assert second.seen >= 1, "the refill never resumed the claim"
    world.check()
    world.settle()


def test_the_resume_after_a_mark_scenario_holds():
    run(resume_after_a_mark)


def test_a_resume_that_does_not_renew_its_claim_is_caught(monkeypatch):
    monkeypatch.setattr(DynamoStore, "renew", lambda self, **_: True)
    caught(resume_after_a_mark)


def one_sighting_on_the_claimers_clock(store, queue, record, now, reconciler, claim_timeout):
    """The release before the fix: once the claim's own expiry has passed, by whoever's clock."""
    if now < record.claim_expires_at:
        return 0
    done = complete(store=store, queue=queue, name=record.name, ending=Ending(PayloadState.RELEASED, now))
    return int(done is not None)


def test_releasing_an_unstarted_claim_on_the_claimers_expiry_is_caught(monkeypatch):
    monkeypatch.setattr(sluice.launch.reconcile, "_settle_unstarted", one_sighting_on_the_claimers_clock)
    caught(breaks.test_a_fresh_claim_survives_a_reconciler_with_a_skewed_clock, skew=900.0)


def at_first_sight(store, queue, record, now, reconciler, claim_timeout):
    """Reconciliation releasing a CLAIMED holder before its claim has expired."""
    done = complete(store=store, queue=queue, name=record.name, ending=Ending(PayloadState.RELEASED, now))
    return int(done is not None)


def test_releasing_a_claim_before_it_expires_is_caught(monkeypatch):
    monkeypatch.setattr(sluice.launch.reconcile, "_settle_unstarted", at_first_sight)
    caught(breaks.test_a_resumed_claim_never_starts_after_reconciliation_released_it)


def retried_start_then_refill(make_world: Callable[..., World]) -> None:
    """StartExecution's first attempt reaches Step Functions and its answer is lost; botocore's
    retries are throttled. Before any reconciliation, a completion's refill receives a re-submission
    of the same key: the claim must still stand, so it is a duplicate, not a second run."""
    world = make_world(max_concurrency=2)
    world.add_container("A-retrying", CLIENT_CONFIG)
    world.send(body("e"), group="ge")
    world.tick("A")
    (e,) = world.model.running
    world.send(body("p0"), group="g0")
    attempts = AttemptFaults("StartExecution", ("lost", "throttled", "throttled"))
    # The launcher's own calls again, backing off (THROTTLED_STARTS in all): still throttled.
    again = Throttle("StartExecution", times=THROTTLED_STARTS - 1, skip=1)

    def meanwhile() -> None:
        world.send(body("p0"), group="g1")
        world.end(e)
        world.deliver(0)

    refill = Interleave("before_return", meanwhile)
    with retry_sleeps():
        world.tick("A-retrying", [attempts, again, refill])
    assert attempts.fired == {"lost": 1, "throttled": 2} and again.fired == THROTTLED_STARTS - 1
    assert refill.seen == 1
    world.check()
    world.settle()


def test_the_retried_start_scenario_holds():
    run(retried_start_then_refill)


def test_a_retried_start_taken_for_a_refusal_is_caught(monkeypatch):
    monkeypatch.setattr(sluice.adapters.aws.sfn, "_retried", lambda exc: False)
    caught(retried_start_then_refill)


def test_a_launcher_that_stops_rereading_max_is_caught(monkeypatch):
    read_once = SsmMax.reading

    def first_value_forever(self: SsmMax) -> MaxReading:
        if not hasattr(self, "_forever"):
            self._forever = read_once(self)
        return self._forever

    monkeypatch.setattr(SsmMax, "reading", first_value_forever)
    caught(breaks.test_max_lowered_between_batches_of_one_tick_is_obeyed)


def redriven_with_room(make_world: Callable[..., World]) -> None:
    """A released execution is redriven while a slot is free; a re-submission of its key arrives.
    Counting the redriven run as external keeps MAX, but only taking its lease back, or marking its
    key for it when that fails, keeps the key."""
    world = make_world(max_concurrency=2)
    world.send(body("p0"), group="g0")
    world.tick("A")
    (p0,) = world.model.running
    world.end(p0, "FAILED")
    world.deliver(0)
    world.redrive(p0)
    world.send(body("p0"), group="g1")
    world.advance(WINDOW + 1)
    world.tick("A")
    world.check()
    world.settle()


def test_the_redriven_with_room_scenario_holds():
    run(redriven_with_room)


def test_a_redriven_execution_left_out_of_the_ledger_and_its_key_unmarked_is_caught(monkeypatch):
    monkeypatch.setattr(DynamoStore, "adopt", lambda self, **_: False)
    monkeypatch.setattr(DynamoStore, "mark_redriven", lambda self, **_: False)
    caught(redriven_with_room)


def test_a_redriven_execution_left_out_of_the_ledger_keeps_its_key_by_the_mark(monkeypatch):
    """Adoption failing for good: the run counts as external and its free key is marked for it, so
    the re-submission waits for its end instead of starting beside it."""
    monkeypatch.setattr(DynamoStore, "adopt", lambda self, **_: False)
    run(redriven_with_room)


def test_an_earlier_runs_event_releasing_an_adopted_execution_is_caught(monkeypatch):
    monkeypatch.setattr(
        sluice.launch.completion, "_ended_by_its_own_word", lambda executions: lambda record: True
    )
    monkeypatch.setattr(
        sluice.launch.completion,
        "_not_its_earlier_end",
        lambda change, now, window, judge: lambda record: True,
    )
    caught(breaks.test_a_repeated_event_of_a_redriven_executions_earlier_run_releases_nothing)


def test_records_of_redrivable_executions_kept_only_for_the_retention_is_caught(monkeypatch):
    def retention_only(state, *, now, retention_seconds, ran=False):
        return int(now) + retention_seconds

    monkeypatch.setattr(sluice.adapters.dynamo.release, "record_expiry", retention_only)
    caught(breaks.test_an_execution_redriven_after_the_retention_period_still_holds_its_key)


def test_a_reconciliation_that_never_blocks_a_claim_of_a_redriven_key_is_caught(monkeypatch):
    monkeypatch.setattr(sluice.launch.redriven, "hold_for_redriven", lambda *args: None)
    caught(breaks.test_a_claim_of_a_key_whose_earlier_run_was_redriven_never_starts)


def test_a_refused_adoption_that_leaves_the_lease_unmarked_is_caught(monkeypatch):
    monkeypatch.setattr(DynamoStore, "mark_redriven", lambda self, **_: False)
    caught(breaks.test_a_redriven_run_refused_adoption_keeps_its_key_when_the_holder_ends)


def test_a_mark_never_lifted_after_the_redriven_run_ended_is_caught(monkeypatch):
    monkeypatch.setattr(DynamoStore, "clear_redriven", lambda self, **_: False)
    caught(breaks.test_a_marked_lease_is_lifted_once_the_redriven_run_has_ended)


def test_a_resume_that_ignores_the_block_is_caught(monkeypatch):
    renew = DynamoStore.renew

    def ignoring_the_block(self, *, name, now, claim_expires_at, **more):
        record = self.execution(name)
        if record is not None and record.blocked_by:
            self.client.update_item(
                TableName=self.table,
                Key={"pk": {"S": f"EXEC#{name}"}},
                UpdateExpression="REMOVE blocked_by",
            )
        return renew(self, name=name, now=now, claim_expires_at=claim_expires_at, **more)

    monkeypatch.setattr(DynamoStore, "renew", ignoring_the_block)
    # The resume's second fence, the key's redriven mark read after the renewal, is patched out too.
    monkeypatch.setattr(
        sluice.launch.message_branches.MessageBranches, "_yield_to_redriven", lambda *args: False
    )
    caught(breaks.test_a_claim_of_a_key_whose_earlier_run_was_redriven_never_starts)


def test_a_claim_recording_another_shard_than_the_one_it_took_is_caught(monkeypatch):
    """Issue 10: the release finds the holder by the shard on its record; a wrong one leaks the slot."""
    claim_items = ClaimsTable._claim_items

    def recording_the_neighbour(self, key, name, message_id, shard, now, claim_expires_at, arn, *rest):
        items = claim_items(self, key, name, message_id, shard, now, claim_expires_at, arn, *rest)
        items[2]["Put"]["Item"]["shard"] = {"N": str(shard + 1)}
        return items

    monkeypatch.setattr(ClaimsTable, "_claim_items", recording_the_neighbour)
    caught(breaks.test_an_execution_stopped_by_hand_frees_its_slot)


def test_live_records_with_a_ttl_are_caught(monkeypatch):
    claim_items = ClaimsTable._claim_items

    def expiring(self, key, name, message_id, shard, now, claim_expires_at, arn, *rest):
        items = claim_items(self, key, name, message_id, shard, now, claim_expires_at, arn, *rest)
        lease = items[1]["Update"]
        lease["UpdateExpression"] = (
            lease["UpdateExpression"]
            .replace("updated_at = :now,", "updated_at = :now, expires_at = :ttl,")
            .replace("REMOVE reason, expires_at", "REMOVE reason")
        )
        ttl = {"N": str(int(now) + self.db.retention_seconds)}
        lease["ExpressionAttributeValues"][":ttl"] = ttl
        items[2]["Put"]["Item"]["expires_at"] = ttl
        return items

    mark_items = ClaimsTable._mark_items

    def keeping_the_ttl(self, key, name, arn, started_at, now):
        items = mark_items(self, key, name, arn, started_at, now)
        for entry in items:
            update = entry["Update"]
            update["UpdateExpression"] = update["UpdateExpression"].replace(" REMOVE expires_at,", " REMOVE")
            update["UpdateExpression"] = update["UpdateExpression"].replace(" REMOVE expires_at", "")
        return items

    monkeypatch.setattr(ClaimsTable, "_claim_items", expiring)
    monkeypatch.setattr(ClaimsTable, "_mark_items", keeping_the_ttl)
    caught(breaks.test_records_of_a_running_execution_never_expire)


def test_suppressing_a_duplicate_without_asking_whether_its_holder_ended_is_caught(monkeypatch):
    """The second look, a window after a stale RUNNING answer, suppresses without asking: the
    holder ended before the re-submission was sent, its event is still on the way, and no
    reconciliation has judged it yet (promise 3)."""
    duplicate = MessageBranches._duplicate

    def without_asking(self, payload, held, *rest):
        ask = self.ctx.executions.describe
        self.ctx.executions.describe = lambda *args, **kwargs: None
        try:
            return duplicate(self, payload, held, *rest)
        finally:
            self.ctx.executions.describe = ask

    monkeypatch.setattr(MessageBranches, "_duplicate", without_asking)
    assert "promise 3" in str(caught(resubmission_judged_twice))


def test_the_resubmission_judged_twice_scenario_holds():
    run(resubmission_judged_twice)


def resubmission_judged_twice(make_world: Callable[..., World]) -> None:
    """p ended, its event on the way; a re-submission of p is sent, refused by p's lease, sent back
    for the window and judged again, with no reconciliation in between: it must run."""
    world = make_world(max_concurrency=2)
    p = stale_duplicate.ended_holder(world)
    world.send(body("p"), group="g1")
    stale_duplicate.admit(world)
    world.advance(WINDOW + 1)
    stale_duplicate.admit(world)
    world.check()
    assert len(breaks.runs_of(world, "p")) == 2, f"the re-submission never ran beside {p}'s end"
    world.settle()


def test_an_unbounded_payload_history_is_caught(monkeypatch):
    monkeypatch.setattr(sluice.adapters.dynamo.claims, "HISTORY_LIMIT", 10**9)
    caught(breaks.test_a_key_with_a_long_history_keeps_running)


# -- issue 10: shortcuts a refactoring could take ------------------------------------------------------


def completion_refills_one_slot(make_world: Callable[..., World]) -> None:
    """MAX is raised while every slot is busy; an execution ends. Its completion fills the slot it
    freed and no other: slots freed otherwise are the scheduled tick's, or a burst of completions
    would receive more than they can claim and walk healthy messages to the DLQ."""
    world = make_world(max_concurrency=1)
    for i in range(4):
        world.send(body(f"p{i}"), group=f"g{i}")
    world.tick("A")
    (first,) = world.model.running
    world.set_max(3)
    world.end(first)
    before = len(world.model.starts)
    assert world.deliver(0) == "ok"
    world.check()
    assert len(world.model.starts) - before == 1, "a completion started more than the slot it freed"
    world.tick("A")
    assert len(world.model.running) == 3
    world.settle()


def test_the_completion_refill_scenario_holds():
    run(completion_refills_one_slot)


def test_a_completion_that_refills_every_free_slot_is_caught(monkeypatch):
    def every_free_slot(self, change, *, remaining_ms=None):
        released = sluice.launch.completion.handle_status_change(
            change,
            store=self.store,
            queue=self.queue,
            state_machine_arn=self.executions.state_machine_arn,
            now=self.clock.now(),
        )
        return released, (self.admit(remaining_ms=remaining_ms) if released else None), ""

    monkeypatch.setattr(Launcher, "on_status_change", every_free_slot)
    caught(completion_refills_one_slot)


def stale_max_after_set_max(make_world: Callable[..., World]) -> None:
    """A warm launcher read MAX 3 and caches it for a minute; the operator runs `sluice set-max 1`;
    the launcher ticks again within the minute, still holding 3. The caps are stamped with when
    MAX changed: the launcher's older reading must not put 3 back, and nothing more starts."""
    world = make_world(max_concurrency=3, max_cache_seconds=60)
    world.send(body("p0"), group="g0")
    world.tick("A")
    world.set_max(1)
    for i in range(1, 3):
        world.send(body(f"p{i}"), group=f"g{i}")
    world.tick("A")
    world.check()
    assert len(world.model.running) == 1
    world.settle()


def test_the_stale_max_scenario_holds():
    run(stale_max_after_set_max)


def test_limits_written_without_regard_to_the_one_in_force_are_caught(monkeypatch):
    monkeypatch.setattr(LimitSource, "merged", lambda self, other: self)
    monkeypatch.setattr(Capacity, "refused_by", lambda self, occupancy: False)
    caught(stale_max_after_set_max)


def test_a_set_max_that_writes_only_the_parameter_is_caught(monkeypatch):
    monkeypatch.setattr(sluice.ops.maximum, "apply_max", lambda rt: {"limit": None, "running": 0})
    caught(breaks.test_max_lowered_between_the_receive_and_the_claim_is_obeyed)


def set_max_with_an_older_external_count(make_world: Callable[..., World]) -> None:
    """Found by the soak (issue 10, stamped limits): `sluice set-max` put MAX − the external count
    it read in force; the next tick of a launcher still holding the earlier MAX counted an execution
    started by hand. Ordered as one stamp, the operator's newer MAX made the launcher's newer count
    lose, and the caps kept MAX − 0 while one ran outside Sluice. The limit's source now merges: the
    newer MAX and the newer external count each win on their own."""
    world = make_world(max_concurrency=2, max_cache_seconds=60)
    world.send(body("p0"), group="g0")
    world.tick("A")  # A reads MAX 2 and keeps it for a minute
    world.start_by_hand("outside")
    world.set_max(2)  # written again: a newer MAX of the same value
    for i in range(1, 3):
        world.send(body(f"p{i}"), group=f"g{i}")
    world.tick("A")  # counts the outside execution: 2 − 1 = 1 slot, and p0 holds it
    world.check()
    assert len(world.model.running) == 2
    # ... and the caps carry it: a tick whose count cannot reach them (``Contended``) starts nothing,
    # so a merge that loses the count shows here before it shows as a run too many.
    assert world.containers["A"].runtime.store().ledger().in_force == 1
    world.settle()


def test_the_older_external_count_scenario_holds():
    run(set_max_with_an_older_external_count)


def test_limits_ordered_as_one_stamp_are_caught(monkeypatch):
    monkeypatch.setattr(LimitSource, "merged", lambda self, other: self)
    caught(set_max_with_an_older_external_count)


def resume_throttled(make_world: Callable[..., World], *, started: bool = True) -> None:
    """A launcher dies after StartExecution (``started``; else after its claim, before the start);
    the message returns to a completion's refill, where Step Functions throttles StartExecution. The
    claim must stay: the execution runs, and the next refill (no reconciliation in between) must not
    start its key again. Started, the resume finds it so (it asks Step Functions by the ARN its claim
    recorded) and calls StartExecution no more; not started, its start is throttled and it stays."""
    world = make_world(max_concurrency=3)
    for key in ("e1", "e2"):
        world.send(body(key), group=f"g{key}")
    world.tick("A")
    e1, e2 = sorted(world.model.running)
    world.send(body("p0"), group="g0")
    assert world.tick("A", [CrashAt("after_start" if started else "after_claim")]) == "crashed"
    world.advance(VISIBILITY + 1)
    world.end(e1)
    # Not started: the function dies before it gives the message back, so the message stays in
    # flight: the next refill can only receive the re-submission.
    throttled = Throttle("StartExecution", times=THROTTLED_STARTS)
    assert world.deliver(0, [throttled, CrashAt("before_return")]) == ("ok" if started else "crashed")
    assert throttled.fired == (0 if started else THROTTLED_STARTS)
    world.check()
    world.send(body("p0"), group="g1")  # a re-submission
    event = world.end(e2)
    world.deliver(world.pending.index(event))  # a refill, with no reconciliation first
    world.check()
    world.settle()


def test_the_throttled_resume_scenario_holds():
    run(resume_throttled)
    run(resume_throttled, started=False)


def test_a_resumed_claim_rolled_back_when_its_start_is_throttled_is_caught(monkeypatch):
    """Rolling back a resumed claim whose StartExecution was refused would let the key start again
    beside a run an earlier attempt started. The resume asks Step Functions first, so such a claim
    reaches StartExecution only if it never started; the rollback breaks a promise only beside a
    resume that does not ask, which is how it is caught here."""
    attempt = MessageProtocol._attempt

    def rolls_back_resumes(self, payload, name, *rest):
        try:
            return attempt(self, payload, name, *rest)
        except AmbiguousStartError:
            raise
        except TransientError as exc:
            if exc.operation == "StartExecution":
                record = self.ctx.store.execution(name)  # the renewed claim, as it stands
                self.branches._rollback(name, f"StartExecution refused: {exc}", version=record.claim_version)
            raise

    monkeypatch.setattr(MessageProtocol, "_attempt", rolls_back_resumes)
    monkeypatch.setattr(MessageBranches, "_started_before", lambda self, name: None)
    caught(resume_throttled, started=True)


def lost_wake_up(make_world: Callable[..., World]) -> None:
    """The completion releases a holder with a message parked behind it, then dies before sending
    it back: reconciliation must find it, or the message is lost in the table."""
    world = make_world(max_concurrency=2, duplicate_policy="defer")
    breaks.woken(world, [CrashAt("before_unpark")])
    world.check()
    world.advance(WINDOW + 1)
    world.tick("B")
    world.check()
    world.settle()


def test_the_lost_wake_up_scenario_holds():
    run(lost_wake_up)


def test_a_reconciliation_that_never_sweeps_the_waiting_room_is_caught(monkeypatch):
    monkeypatch.setattr(sluice.launch.reconcile, "sweep", lambda **_: 0)
    caught(lost_wake_up)


def test_a_release_that_misses_a_park_landing_during_it_is_caught(monkeypatch):
    """The release returns the holder's record as read before its transaction, whatever parked
    behind the holder in between: that message is never woken by it (found failing in CI, where
    the holder's name was then claimed again before reconciliation could look)."""
    items_of = sluice.adapters.dynamo.release.ReleasesTable._release_items

    def unconditioned(self, record, ending, *more):
        items = items_of(self, record, ending, *more)
        for item in items:
            update = item.get("Update", {})
            condition = update.get("ConditionExpression", "")
            update_condition = re.sub(
                r" AND (size\(parked\) = :nparked|attribute_not_exists\(parked\))", "", condition
            )
            if update_condition != condition:
                update["ConditionExpression"] = update_condition
                update["ExpressionAttributeValues"].pop(":nparked", None)
        return items

    monkeypatch.setattr(sluice.adapters.dynamo.release.ReleasesTable, "_release_items", unconditioned)
    with pytest.raises(AssertionError, match="not in what it woke"), moto_session() as session:
        stack = build_stack(session, clock=FakeClock(), duplicate_policy=DuplicatePolicy.DEFER)
        parking_moto.test_a_park_that_lands_while_the_release_is_on_its_way_is_woken_by_that_release(stack)


def test_a_claim_again_that_erases_what_waits_behind_the_name_is_caught(monkeypatch):
    """A name claimed again (its message back after a rollback) Puts a fresh record over one whose
    parked messages were never woken (a crash after the release): they wait for good."""

    def erase(items, parked):
        put = items[2]["Put"]
        put["ConditionExpression"] = sluice.adapters.dynamo.claims.NOT_ENDED  # the parked guard alone gone
        put.pop("ReturnValuesOnConditionCheckFailure", None)

    monkeypatch.setattr(sluice.adapters.dynamo.claims, "_carry_parked", erase)
    with pytest.raises(AssertionError), moto_session() as session:
        client = session.client("dynamodb")
        create_table(client, "contract")
        store = DynamoStore(client, "contract", retention_seconds=3600, slots_per_shard=2)
        fences.test_a_name_claimed_again_keeps_what_waits_behind_its_earlier_claim(store)


def test_a_release_blind_to_the_awaited_flag_is_caught(monkeypatch):
    """The release's lease item is not conditioned on the ``awaited`` flag, so it never learns
    that a waiter parked on its key (while it was on its way, or before): it reads no waiters."""
    items_of = sluice.adapters.dynamo.release.ReleasesTable._release_items

    def blind(self, record, ending, known=frozenset()):
        return items_of(self, record, ending, known | {"awaited"})

    monkeypatch.setattr(sluice.adapters.dynamo.release.ReleasesTable, "_release_items", blind)
    with pytest.raises(AssertionError, match="waits on"), moto_session() as session:
        awaits_moto.test_a_waiter_parked_while_the_release_is_on_its_way_is_woken_by_it(
            build_stack(session, clock=FakeClock())
        )


def test_a_wake_up_that_clears_every_parked_id_is_caught(monkeypatch):
    """The wake-up takes the whole ``parked`` set and the index entry away, not just the ids it
    sent: a late one erases what parked behind a new claim of the same name (found by a breaker)."""
    table = sluice.adapters.dynamo.parking.ParkingTable
    mark_woken = table.unpark

    def clear_all(self, holder, message_ids, *, woken=(), now):
        mark_woken(self, holder, message_ids, woken=woken, now=now)
        self.db.update_if(
            "PARKED", "DELETE holders :h", "attribute_exists(pk)", {":h": {"SS": [holder]}}, names={}
        )
        self.db.update_if(f"EXEC#{holder}", "REMOVE parked", "attribute_exists(pk)", {}, names={})

    monkeypatch.setattr(table, "unpark", clear_all)
    with pytest.raises(AssertionError, match="erased what parked"), moto_session() as session:
        stack = build_stack(session, clock=FakeClock(), duplicate_policy=DuplicatePolicy.DEFER)
        parking_moto.test_a_late_wake_up_leaves_what_parked_behind_a_new_claim_of_the_name(stack)


def test_a_resume_that_starts_without_asking_step_functions_is_caught(monkeypatch):
    """With no RUNNING mark, a returning message of a started claim is told from an unstarted one
    only by asking Step Functions; a resume that starts at once starts it a second time on the state
    machine the stack was switched to."""
    monkeypatch.setattr(MessageBranches, "_started_before", lambda self, name: None)
    with pytest.raises(AssertionError), moto_session() as session:
        launching.test_a_started_claim_back_after_a_switch_is_not_started_on_the_new_machine(session, "crash")


def claims_over_ended_runs(monkeypatch) -> None:
    """The claim's Put of EXEC#<name> without its guard on a run that ended (``AlreadyRan``)."""
    real = ClaimsTable._claim_items

    def over_ended_runs(self, *args, **kwargs):
        items = real(self, *args, **kwargs)
        put = items[2]["Put"]
        put["ConditionExpression"] = "attribute_not_exists(parked)"
        put.pop("ExpressionAttributeNames", None)
        put.pop("ExpressionAttributeValues", None)
        return items

    monkeypatch.setattr(ClaimsTable, "_claim_items", over_ended_runs)


def test_a_claim_over_a_name_that_ran_and_ended_is_caught(monkeypatch):
    """Without the claim's guard on an ended record, a message back after its run was released
    claims its name afresh, and StartExecution on a state machine the stack switched to accepts it:
    one message, two runs. (On the same machine, ExecutionAlreadyExists would have saved it.)"""
    claims_over_ended_runs(monkeypatch)
    with pytest.raises(AssertionError), moto_session() as session:
        launching.test_a_message_whose_run_ended_before_a_switch_is_not_run_again_on_the_new_machine(
            session, "crash"
        )


def test_a_duplicate_check_on_the_machine_in_use_is_caught(monkeypatch):
    """Asking about a key's holder on the stack's state machine rather than the one it was claimed
    on (before a switch) finds no such execution, so an ended holder passes for running and the
    re-submission is dropped as a duplicate."""
    real = sluice.adapters.aws.sfn.StepFunctionsExecutions.describe
    monkeypatch.setattr(
        sluice.adapters.aws.sfn.StepFunctionsExecutions,
        "describe",
        lambda self, name, arn=None: real(self, name, None),
    )
    with pytest.raises(AssertionError), moto_session() as session:
        launching.test_a_re_submission_after_a_switch_asks_about_its_holder_on_the_old_machine(session)


# -- a completion's refill by hand-over (issue 10, item 3) ----------------------------------------------


def test_a_hand_over_that_ignores_the_shards_cap_is_caught(monkeypatch):
    """The swap passes the freed slot on whatever the shard's cap: a MAX lowered between the
    hand-over's read and its write is not obeyed."""
    real = sluice.adapters.dynamo.release.swap_item

    def uncapped(*args, **kwargs):
        item = real(*args, **kwargs)
        update = item["Update"]
        update["ConditionExpression"] = update["ConditionExpression"].replace(" AND size(holders) <= cap", "")
        return item

    monkeypatch.setattr(sluice.adapters.dynamo.release, "swap_item", uncapped)
    with pytest.raises(AssertionError, match="past the lowered MAX"), moto_session() as session:
        handover_moto.test_max_lowered_between_the_read_and_the_hand_over_is_obeyed(
            build_stack(session, clock=FakeClock(), max_concurrency=2)
        )


def test_a_hand_over_offered_whatever_the_pool_is_caught(monkeypatch):
    """The hand-over receives whatever the pool item says (frozen, paused): a completion under a
    lowered MAX spends a receive of a message it cannot start, at every end until runs fit."""
    real = sluice.adapters.dynamo.release.ReleasesTable._end

    def always_room(self, record, ending, *, offer=None, room=False):
        return real(self, record, ending, offer=offer, room=offer is not None)

    monkeypatch.setattr(sluice.adapters.dynamo.release.ReleasesTable, "_end", always_room)
    with pytest.raises(AssertionError), moto_session() as session:
        handover_moto.test_a_refill_under_a_lowered_max_receives_nothing(
            build_stack(session, clock=FakeClock(), max_concurrency=2)
        )


def successor_without_its_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch in a hand-over whose successor takes the slot without its payload's lease."""
    real = sluice.adapters.dynamo.release.ReleasesTable._successor_items

    def slot_only(self, successor, shard):
        return real(self, successor, shard)[1:]  # its record, not its lease

    monkeypatch.setattr(sluice.adapters.dynamo.release.ReleasesTable, "_successor_items", slot_only)


@in_the_soak
def test_a_hand_over_whose_claim_keeps_no_lease_is_caught(monkeypatch):
    """The successor takes the slot without its payload's lease: a second message of its key then
    claims beside it (promise 2), which the property suite finds."""
    successor_without_its_lease(monkeypatch)
    property_suite_fails()


# -- parallel fill: the tick's claims and starts side by side (issue 10, item 4) ---------------------


def on_moto(test: Callable[..., None]) -> None:
    """Run one of the moto integration tests on a fresh moto of its own (requests atomic)."""
    with moto_session() as session, atomic_fast_moto():
        test(session, **({"atomic": None} if "atomic" in inspect.signature(test).parameters else {}))


def test_a_rollback_not_fenced_by_its_claims_version_is_harmless_now_copies_own_their_marks(monkeypatch):
    """Two copies of one message side by side: one rolled back a claim the other renewed and started
    (an orphan run, holding neither lease nor slot). The other copy's renewal is refused now (the
    claim's mark is the first copy's: ``MARK_OURS``), and a resume gives back no claim another copy
    renewed since (``_yield_to_redriven``): the version fence is a second line no scenario reaches,
    so the variant is equivalent. The race itself is caught under ``copies_lift_marks``
    (tests/reliability/test_key_variants.py)."""

    def unfenced(self, name, reason, *, version):
        complete(
            store=self.ctx.store,
            queue=self.ctx.queue,
            name=name,
            ending=Ending(PayloadState.RELEASED, self.ctx.clock.now(), error=reason),
        )

    monkeypatch.setattr(MessageBranches, "_rollback", unfenced)
    with moto_session() as session, atomic_fast_moto():
        breaks_moto.test_copies_of_one_message_in_two_groups(
            session, None, breaks_moto.install_monitor(monkeypatch)
        )


# -- concurrency keys (issue 11, item 4) ------------------------------------------------------------


def on_keyed_stack(test: Callable[..., None]) -> None:
    with moto_session() as session:
        test(keys_moto.keyed_stack(session))


def claims_ignoring_the_keys_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch in a keyed claim that takes the key's slot whatever its cap, as an adoption takes it."""
    monkeypatch.setattr(
        KeysTable,
        "key_claim_item",
        lambda self, ckey, name, *, ticket, uncapped=False, landed=False: self.key_adopt_item(ckey, name),
    )


def test_a_keyed_claim_that_ignores_the_keys_cap_is_caught(monkeypatch):
    claims_ignoring_the_keys_cap(monkeypatch)
    with pytest.raises(AssertionError):
        on_keyed_stack(
            keys_moto.test_a_key_runs_at_most_its_cap_the_rest_wait_out_of_the_queue_and_others_go_on
        )


def test_a_newcomer_that_overtakes_the_keys_waiters_is_caught(monkeypatch):
    monkeypatch.setattr(
        sluice.adapters.dynamo.keys, "NOBODY_WAITING", "attribute_not_exists(#ckey) OR #ckey = #ckey"
    )
    with pytest.raises(AssertionError):
        on_keyed_stack(keys_moto.test_a_freed_slot_goes_to_the_oldest_waiter_within_the_completion)


def test_a_release_that_keeps_the_keys_slot_is_caught(monkeypatch):
    monkeypatch.setattr(
        KeysTable, "key_release_item", lambda self, ckey, name: self.key_adopt_item(ckey, "nobody")
    )
    with pytest.raises(AssertionError):
        on_keyed_stack(keys_moto.test_a_freed_slot_goes_to_the_oldest_waiter_within_the_completion)


def test_a_reconciliation_that_never_sweeps_the_keys_lines_is_caught(monkeypatch):
    monkeypatch.setattr(sluice.launch.reconcile, "sweep_keys", lambda **_: 0)
    with pytest.raises(AssertionError):
        on_keyed_stack(keys_moto.test_a_wake_up_lost_to_a_crash_is_found_by_reconciliation)


def test_a_woken_claim_that_never_records_it_landed_first_is_caught(monkeypatch):
    """A woken waiter's claim that lands before its wake noted its entry takes nothing out of
    ``inflight`` and records nothing: the entry noted after it keeps the key's slot for nobody, and
    the next waiter waits INFLIGHT_SECONDS (found by the tenants benchmark)."""
    claim_item = KeysTable.key_claim_item

    def unrecorded(self, ckey, name, *, ticket, uncapped=False, landed=False):
        item = claim_item(self, ckey, name, ticket=ticket, uncapped=uncapped)
        update = item["Update"]
        update["ConditionExpression"] = update["ConditionExpression"].replace(
            " AND contains(#inflight, :entry)", ""
        )
        update["ExpressionAttributeValues"].pop(":entry", None)
        return item

    monkeypatch.setattr(KeysTable, "key_claim_item", unrecorded)
    with pytest.raises(AssertionError, match="key idle with a waiter"), moto_session() as session:
        keys_breaks.test_a_woken_waiter_claimed_before_its_wake_notes_it_keeps_no_slot_after_its_run(
            session, keys_breaks.install_watch(monkeypatch)
        )


def test_a_rolled_back_woken_claim_that_gives_up_its_kept_slot_is_caught(monkeypatch):
    monkeypatch.setattr(KeysTable, "keep_inflight", lambda self, ckey, entries: None)
    with pytest.raises(AssertionError), moto_session() as session:
        keys_breaks.test_a_woken_waiter_refused_by_step_functions_keeps_the_line_in_order(
            session, keys_breaks.install_watch(monkeypatch)
        )


def test_a_requeue_that_drops_sluices_own_attributes_first_is_caught(monkeypatch):
    def first_by_name(self, parked):
        from sluice.adapters.aws.sqs import MAX_ATTRIBUTES, _string
        from sluice.core.names import ORIGIN_ATTRIBUTE

        kept = dict(sorted(parked.attributes.items())[: MAX_ATTRIBUTES - 1])
        kept[ORIGIN_ATTRIBUTE] = parked.message_id
        self.client.send_message(
            QueueUrl=self.queue_url,
            MessageBody=parked.body,
            MessageGroupId=parked.group_id or "sluice-parked",
            MessageDeduplicationId=f"{parked.message_id[:90]}-{uuid.uuid4().hex[:20]}",
            MessageAttributes={k: _string(v) for k, v in kept.items()},
        )

    monkeypatch.setattr(sluice.adapters.aws.sqs.SqsQueue, "requeue", first_by_name)
    with pytest.raises(AssertionError), moto_session() as session:
        keys_breaks.test_a_woken_waiter_with_nine_attributes_keeps_its_ticket(
            session, keys_breaks.install_watch(monkeypatch)
        )


@in_the_soak
def test_a_keyed_claim_that_ignores_the_keys_cap_is_caught_by_the_property_suite(monkeypatch):
    """The property suite's own budget, its usual mix (keyed messages among the rest): a key's
    slot taken whatever its cap, as an adoption takes it, is a "key cap:" break."""
    claims_ignoring_the_keys_cap(monkeypatch)
    assert "key cap:" in str(property_suite_fails())


def test_a_fill_that_runs_one_groups_messages_side_by_side_is_caught(monkeypatch):
    monkeypatch.setattr(sluice.launch.admission, "_group", lambda message: message.message_id)
    with pytest.raises(AssertionError):
        on_moto(fill.test_the_messages_of_one_group_start_in_their_order)


def test_a_fill_that_returns_a_throttled_start_at_once_is_caught(monkeypatch):
    monkeypatch.setattr(
        MessageProtocol, "_start", lambda self, name, body: self.ctx.executions.start(name, body)
    )
    with pytest.raises(AssertionError):
        on_moto(launching.test_a_throttled_start_backs_off_and_keeps_its_claim_and_message)


def test_starts_not_paced_to_the_token_bucket_are_caught(monkeypatch):
    monkeypatch.setattr(sluice.primitives.fanout.Pacer, "take", lambda self: 0.0)
    with pytest.raises(AssertionError):
        on_moto(fill.test_a_tick_paces_its_starts_to_the_token_bucket)


def test_every_variant_is_restored_after_its_test():
    """The patches above are undone by monkeypatch: Sluice as it is passes the scenarios."""
    run(breaks.test_a_resumed_claim_never_starts_after_reconciliation_released_it)
    assert Launcher.on_status_change.__qualname__ == "Launcher.on_status_change"
    assert sluice.launch.reconcile._settle_unstarted.__name__ == "_settle_unstarted"
    assert isinstance(run, Callable)


def test_a_variant_that_crashes_the_scenario_is_not_counted_as_caught(monkeypatch):
    def broken(self, **_: Any) -> bool:
        raise RuntimeError("not a promise")

    monkeypatch.setattr(DynamoStore, "renew", broken)
    with pytest.raises(RuntimeError):
        caught(breaks.test_a_resumed_claim_never_starts_after_reconciliation_released_it)


# -- stored payloads: a pointer's object is checked before its payload is claimed ----------------------


def altered_object(make_world: Callable[..., World]) -> None:
    """A pointer whose object was overwritten with other bytes of the same size: the payload must be
    dead-lettered with the reason, and nothing started. (Stored payloads live in S3, which the
    reliability world does not model: the scenario runs on a moto stack with a payload bucket.)"""
    from sluice.core.model import Outcome
    from sluice.features.pointers import POINTER_FIELD, object_key
    from tests.support.aws import REGION, build_stack, moto_session

    payload = json.dumps({"id": "scene-1", "manifest": "m" * 300_000}).encode()
    digest = hashlib.sha256(payload).hexdigest()
    with moto_session() as session:
        session.client("s3", region_name=REGION).create_bucket(Bucket="sluice-variant-payloads")
        stack = build_stack(session, name="sluice-variant", payload_bucket="sluice-variant-payloads")
        stack.client("s3").put_object(
            Bucket="sluice-variant-payloads",
            Key=object_key(digest),
            Body=payload.replace(b"mmm", b"MMM", 1),
            ChecksumAlgorithm="SHA256",
        )
        uri = f"s3://sluice-variant-payloads/{object_key(digest)}"
        stack.send(
            {POINTER_FIELD: {"uri": uri, "sha256": digest, "size": len(payload)}}, sluice_key="scene-1"
        )
        summary = stack.launcher().tick()
        assert stack.executions() == [], "a payload whose object was altered started"
        assert summary.n(Outcome.INVALID) == 1
        [dead] = stack.dlq_messages()
        assert "the object was changed" in dead["MessageAttributes"]["sluice-error"]["StringValue"]


def test_the_altered_object_scenario_holds():
    run(altered_object)


def test_a_launcher_that_checks_a_pointers_size_but_not_its_checksum_is_caught(monkeypatch):
    def size_only(pointer: Pointer, objects: Any) -> None:
        try:
            stored = objects.head(pointer.key)
        except NotFound:
            raise InvalidPayload(f"stored payload {pointer.uri} does not exist") from None
        if stored.size != pointer.size:
            raise InvalidPayload(f"stored payload {pointer.uri} is {stored.size} bytes")

    monkeypatch.setattr(sluice.features.pointers, "_check_object", size_only)
    caught(altered_object)


# -- issue 12: the semaphore step and @exclusive, caught by their property suites --------------------
#
# Each variant is patched into Sluice for one test, and the property suite of the semaphore
# (tests/reliability/semaphore_machine.py, on the memory store) or of @exclusive
# (tests/reliability/exclusive_machine.py, on MemoryLeases) must break a promise within the budget.


# 150 programs a variant, a second or two on the memory stores. The @exclusive suite's boundaries (a
# clock a few seconds ahead at an expiry, a late release after a takeover) take that many to meet;
# the semaphore suite met one of its variants within 40 programs when this file ran alone but not
# once in a whole-suite run (why the runs differ is not known).
SUITE_BUDGET = settings(BUDGET, max_examples=150)


def suite_fails(machine: type) -> PromiseBroken:
    with pytest.raises(PromiseBroken) as failure:
        run_state_machine_as_test(machine, settings=SUITE_BUDGET)
    print(failure.value)
    return failure.value


def semaphore_suite_fails() -> PromiseBroken:
    return suite_fails(MemorySemaphoreMachine)


def exclusive_suite_fails() -> PromiseBroken:
    return suite_fails(MemoryExclusiveMachine)


@pytest.mark.slow
def test_the_semaphore_and_exclusive_suites_pass_within_the_budget():
    run_state_machine_as_test(MemorySemaphoreMachine, settings=BUDGET)
    run_state_machine_as_test(MemoryExclusiveMachine, settings=SUITE_BUDGET)


def _take_whatever_the_cap(slots: Any, pool: str, holder: str, now: float) -> int:
    """A permit written straight into the first shard, as an adoption takes a slot (no cap)."""
    memory = getattr(slots, "_target", slots)
    shard = min(s.index for s in memory.occupancy(pool).shards)
    memory._shard(pool, shard).holders[holder] = now
    return shard


def granting_past_the_limit(self, name, record, now, done):
    granted = self.store.grant(name, record.holder, record.gen, record.ticket, now)
    if granted is None:
        return True
    shard = self._claim(name, record.holder, now, self._occupancy(name))
    if shard is None:
        shard = _take_whatever_the_cap(self.slots, pool_of(name), record.holder, now)
    if self._still(name, granted, shard):
        self._deliver(name, granted, shard, now, done, fresh=True)
    return True


def test_a_semaphore_grant_that_ignores_the_limit_is_caught(monkeypatch):
    monkeypatch.setattr(Semaphores, "_grant", granting_past_the_limit)
    assert "hold permits after granting" in str(semaphore_suite_fails())


def newest_waiter_first(self, semaphore, now=None):
    """The hand-off serves the line from its tail: the newest live waiter first."""
    name, now = semaphore, self._now(now)
    done = HandOff([], [])
    for _ in range(50):
        head, tail = self.store.line(name)
        tickets = [t for t in self.store.tickets(name, head + 1, tail) if t.holder]
        records = self.store.acquisitions(name, [t.holder for t in tickets])
        waiting = [
            records[t.holder]
            for t in reversed(tickets)
            if t.holder in records
            and records[t.holder].state is SemaphoreState.WAITING
            and (records[t.holder].gen, records[t.holder].ticket) == (t.gen, t.number)
        ]
        if not waiting or not self._grant(name, waiting[0], now, done):
            break
    return done


def test_a_hand_off_to_the_newest_waiter_is_caught(monkeypatch):
    monkeypatch.setattr(Semaphores, "hand_off", newest_waiter_first)
    assert "a live waiter ahead of it" in str(semaphore_suite_fails())


def test_a_release_not_fenced_by_execution_and_acquisition_is_caught(monkeypatch):
    """A release that finds nothing of its own frees the oldest permit, as a bare counter would."""
    release = Semaphores.release

    def freeing_the_oldest_permit(self, semaphore, execution_arn, acquisition_id, now=None):
        result = release(self, semaphore, execution_arn, acquisition_id, now)
        if result is Released.NOTHING:
            occupancy = self.slots.occupancy(pool_of(semaphore))
            held = sorted((since, h, s.index) for s in occupancy.shards for h, since in s.holders.items())
            if held:
                self.slots.release(pool_of(semaphore), held[0][2], held[0][1])
                self.hand_off(semaphore, now)
        return result

    monkeypatch.setattr(Semaphores, "release", freeing_the_oldest_permit)
    assert "without its permit" in str(semaphore_suite_fails())


def test_a_sweep_that_never_frees_ended_holders_is_caught(monkeypatch):
    def hand_off_only(self, semaphore, now=None):
        self.hand_off(semaphore, now)
        return []

    monkeypatch.setattr(Semaphores, "reconcile", hand_off_only)
    assert "still holds a permit" in str(semaphore_suite_fails())


def test_an_exclusive_release_not_fenced_by_holder_is_caught(monkeypatch):
    """The release frees the key whoever holds it: a late release frees the next holder's lock."""

    def unfenced(self, lease, *, state=None, error=None):
        with self._lock:
            found = self._items.get((lease.scope, lease.key, lease.slot))
            if found is None:
                return False
            item, kept = found
            freed = replace(item, holder=None, expires_at=lease.expires_at + self.retention_seconds)
            self._items[(lease.scope, lease.key, lease.slot)] = (freed, kept)
            return True

    monkeypatch.setattr(MemoryLeases, "release", unfenced)
    assert re.search("inside at once|the table says", str(exclusive_suite_fails()))


def test_an_exclusive_lock_that_never_expires_is_caught(monkeypatch):
    monkeypatch.setattr(LeaseSlot, "admits", lambda self, holder, now: self.holder in (None, holder))
    exclusive_suite_fails()


def test_an_exclusive_lock_that_expires_at_the_deadline_without_the_margin_is_caught(monkeypatch):
    """A taker whose clock is ahead (within the margin) then takes over while the holder still runs."""
    monkeypatch.setattr(sluice.concurrency._Guard, "lock_end", lambda _self, end: end + 0.001)
    assert re.search("inside at once|the table says", str(exclusive_suite_fails()))


def test_an_exclusive_grant_trusted_by_its_requests_reading_is_found_by_the_machine(monkeypatch):
    """The same variant, found by the stateful machine from its late answers alone."""
    monkeypatch.setattr(sluice.concurrency._Guard, "in_time", lambda _self, _end: True)
    assert re.search("inside at once|the table says", str(exclusive_suite_fails()))


def test_an_exclusive_grant_trusted_by_the_reading_its_request_was_dated_with_is_caught(monkeypatch):
    """A grant answered after the run's time is used as if in time: the section runs under a lock
    another run may take."""
    from sluice.adapters.dynamo.store import create_table
    from tests.integration import test_exclusive_attacks as attacks
    from tests.support.aws import NO_RETRY, moto_session

    monkeypatch.setattr(sluice.concurrency._Guard, "in_time", lambda _self, _end: True)
    # the first grant's lock (ttl + margin after the request) already ended when the section ran
    with moto_session() as session, pytest.raises(AssertionError, match=r"1800000065\.0 > 1800000066\.0"):
        client = session.client("dynamodb", config=NO_RETRY)
        create_table(client, attacks.TABLE)
        attacks.test_stale_grant_is_given_back_and_asked_again(client)


# -- receipts and run-once keys (sluice.features.receipts) ------------------------------------------------------


def once_twice(make_world: Callable[..., World]) -> None:
    """A run-once key SUCCEEDED; a second once-message of its key arrives, first after the event,
    then racing it (the holder ended, its event still on the way). Nothing may start again.
    (Message attributes and receipts: on a moto stack, as the integration tests run it.)"""
    from tests.integration import test_receipts_moto as receipts
    from tests.support.aws import build_stack, moto_session

    with moto_session() as session:
        receipts.once_race(build_stack(session, name="sluice-once-race"))
        receipts.test_a_once_key_that_succeeded_is_acknowledged_not_started(
            build_stack(session, name="sluice-once-after")
        )


def test_the_once_scenario_holds():
    run(once_twice)


def test_a_launcher_that_ignores_sluice_once_is_caught(monkeypatch):
    monkeypatch.setattr(sluice.launch.per_message, "is_once", lambda message: False)
    caught(once_twice)


def test_a_claim_without_the_once_condition_is_caught(monkeypatch):
    monkeypatch.setattr(sluice.adapters.dynamo.claims, "only_once", lambda items: None)  # a claim's
    monkeypatch.setattr(sluice.adapters.dynamo.release, "only_once", lambda items: None)  # a hand-over's
    caught(once_twice)


def earlier_end_after_a_redrive(make_world: Callable[..., World]) -> None:
    """p0 FAILED and was released; redriven and adopted, it SUCCEEDED; EventBridge delivered p0's
    first FAILED event again and lost the SUCCEEDED one. A waiter on p0 is then judged by a
    completion's refill, before any reconciliation: p0's earlier FAILED, taken for its last end,
    would dead-letter it. It must run, and the receipt must say how p0 really ended last."""
    from sluice.features.receipts import read_receipt

    world = make_world(max_concurrency=2)
    world.send(body("p0"), group="g0")
    world.tick("A")
    (p0,) = world.model.running
    world.end(p0, "FAILED")
    assert world.deliver(0) == "ok"
    world.redrive(p0)
    world.advance(WINDOW + 1)
    world.tick("A")  # adopted
    world.send(body("p1"), group="g1")
    world.tick("A")
    (p1,) = set(world.model.running) - {p0}
    world.end(p0, "SUCCEEDED")
    world.redeliver(0)  # the FAILED event of the earlier end, once more
    world.lose(0)  # the SUCCEEDED one: a reconciliation releases p0 later
    waiter = world.send(body("w"), group="g2", attributes={"sluice-awaits": json.dumps(["p0"])})
    world.end(p1, "SUCCEEDED")
    assert world.deliver(0) == "ok"  # p1's completion refills from the queue: w is judged
    world.settle()
    receipt = read_receipt(world.stack.runtime().store(), "p0")
    assert receipt is not None and receipt.outcome is PayloadState.SUCCEEDED, (
        f"the receipt of p0 says {receipt}: an earlier end's event overwrote its later end"
    )
    assert waiter not in world.model.dead_lettered, (
        f"w, awaiting p0, was dead-lettered ({world.model.dead_lettered.get(waiter)}): p0's earlier end "
        "was taken for its last"
    )


def test_the_earlier_end_after_a_redrive_scenario_holds():
    run(earlier_end_after_a_redrive)


def test_a_receipt_overwritten_by_an_earlier_ends_event_is_caught(monkeypatch):
    monkeypatch.setattr(
        sluice.launch.completion, "_ended_at_this_events_stop", lambda executions, change: lambda record: True
    )
    monkeypatch.setattr(
        sluice.launch.completion,
        "_not_its_earlier_end",
        lambda change, now, window, judge: lambda record: True,
    )
    caught(earlier_end_after_a_redrive)


# -- awaits (issue 13, item 1) ------------------------------------------------------------------------


def awaits_kept(make_world: Callable[..., World], *, test: str) -> None:
    """A waiter starts only once every key it awaits has SUCCEEDED; a FAILED awaited key sends it to
    the DLQ with the reason; a wake-up lost to a crash is found by reconciliation. (Message
    attributes, the table and the DLQ: on a moto stack, as the integration tests run them.)"""
    from sluice.core.clock import FakeClock
    from tests.integration import test_awaits_moto as awaits
    from tests.support.aws import build_stack, moto_session

    with moto_session() as session:
        getattr(awaits, test)(build_stack(session, name="sluice-awaits", clock=FakeClock()))


AWAIT_SCENARIOS = {
    "early": "test_a_waiter_is_parked_and_its_message_deleted_then_starts_on_the_last_receipt",
    "failed": "test_a_failed_awaited_key_dead_letters_the_waiter_with_the_reason",
    "lost": "test_a_wake_up_lost_before_the_send_is_found_by_reconciliation",
}


@pytest.mark.parametrize("scenario", sorted(AWAIT_SCENARIOS))
def test_the_awaits_scenarios_hold(scenario):
    run(awaits_kept, test=AWAIT_SCENARIOS[scenario])


def test_a_waiter_started_before_its_awaits_succeeded_is_caught(monkeypatch):
    monkeypatch.setattr(sluice.launch.per_message, "gate", lambda **kw: False)  # no check before the claim
    caught(awaits_kept, test=AWAIT_SCENARIOS["early"])


def test_a_reconciliation_that_never_wakes_waiters_is_caught(monkeypatch):
    monkeypatch.setattr(sluice.launch.reconcile, "sweep_awaits", lambda **kw: {})
    caught(awaits_kept, test=AWAIT_SCENARIOS["lost"])


def test_a_waiter_released_when_an_awaited_key_failed_is_caught(monkeypatch):
    import sluice.features.awaits

    judge = sluice.features.awaits.judge
    monkeypatch.setattr(
        sluice.features.awaits,
        "judge",
        lambda awaits, records, **kw: judge(awaits, records, **{**kw, "run_anyway": True}),
    )
    caught(awaits_kept, test=AWAIT_SCENARIOS["failed"])


@pytest.mark.parametrize("after", ["an invalid message of the key", "a claim of the key released unstarted"])
def test_a_waiter_judging_a_key_by_its_record_not_its_last_run_is_caught(monkeypatch, after):
    """A waiter whose awaited key's last run FAILED, then whose record moved on, waits to the horizon."""
    import sluice.features.awaits
    from sluice.core.clock import FakeClock
    from tests.integration import test_awaits_moto as awaits
    from tests.support.aws import build_stack

    monkeypatch.setattr(sluice.features.awaits, "last_end", lambda record: record.state)
    with pytest.raises(AssertionError), moto_session() as session:
        awaits.test_a_key_whose_last_run_failed_dead_letters_its_waiter_whatever_came_after(
            build_stack(session, name="sluice-awaits", clock=FakeClock()), after
        )


# -- effects (sluice.features.effects) -------------------------------------------------------------------------


def effects_once(make_world: Callable[..., World]) -> None:
    """A SUCCEEDED output names effects; its event is repeated, comes late, and its message comes back
    after the execution ended (a second release of the same name). Each effect is enqueued once.
    (On moto stacks, as the integration tests run them.)"""
    from tests.integration import test_effects_moto as effects
    from tests.support.aws import build_stack, moto_session

    with moto_session() as session:
        effects.test_a_repeated_or_late_event_sends_nothing_more(
            build_stack(session, name="sluice-fx-repeat")
        )
        effects.test_reconciliation_after_a_lost_event_sends_them_once(
            build_stack(session, name="sluice-fx-lost")
        )
    with moto_session() as session:
        effects.test_a_redelivered_message_that_already_ran_sends_nothing_again(session)


def test_the_effects_scenario_holds():
    run(effects_once)


def test_effects_sent_on_every_event_are_caught(monkeypatch):
    """Sent from the event itself, not from the release that happens: every repeat sends again."""
    import sluice.features.effects

    def send_now(output, effects, *, store, queue, name, state, now):
        record = store.execution(name)
        if output is not None and state is PayloadState.SUCCEEDED and record is not None:
            kept = output(record)
            if kept is not None and kept.text:
                (effects or sluice.features.effects.Effects()).send(
                    kept.text, record=record, queue=queue, now=now
                )
        return output

    monkeypatch.setattr(sluice.launch.completion, "around", send_now)
    caught(effects_once)


def test_effects_sent_again_when_their_execution_is_released_again_are_caught(monkeypatch):
    """The mark is the second guard: were a name that ran claimed again (the claim's guard on an
    ended record gone too), a release that does not consult the mark (or one kept on EXEC#<name>,
    which such a claim writes afresh) would send the effects again."""
    import sluice.features.effects

    claims_over_ended_runs(monkeypatch)

    class Forgetful:
        def __init__(self, store: Any) -> None:
            self.store = store

        def effects(self, name: str) -> None:
            return None

        def __getattr__(self, attr: str) -> Any:
            return getattr(self.store, attr)

    def without_the_mark(output, effects, *, store, **rest):
        return sluice.features.effects.around(output, effects, store=Forgetful(store), **rest)

    monkeypatch.setattr(sluice.launch.completion, "around", without_the_mark)
    failure = caught(effects_once)
    assert "effects sent again" in str(failure)  # by the sends, not by the mark's own assertion


# -- awaits, run-once keys and effects in the property suite (issue 13) ----------------------------------
#
# The property suite's own promises catch these, with a program mix that draws the actions
# more often (waiters, run-once messages, outputs naming effects, with the faults of the completion)
# and a small, derandomised budget.

FOCUSED = programs.weighted(
    (3, programs.AWAITING),
    (2, programs.ONCE),
    (3, programs.WITH_EFFECTS),
    (2, st.builds(programs.Enqueue, programs.MESSAGES)),
    (6, programs.TICK),
    (3, programs.END),
    (3, st.builds(programs.Deliver, programs.INDEX, programs.COMPLETION_FAULTS)),
    (1, st.builds(programs.Lose, programs.INDEX)),
    (2, st.builds(programs.Redeliver, programs.INDEX)),  # a repeated event: what effects must survive
)
FOCUSED_BUDGET = settings(BUDGET, max_examples=20, stateful_step_count=25)


def focused_pass_budget() -> settings:
    """A focused suite on Sluice as it is: 3 derandomised programs of up to 25 actions in `make test`,
    the soak profile's (100 random programs of up to 50 actions by default) in `make soak`
    (HYPOTHESIS_PROFILE=soak). The variants the focused suites catch keep FOCUSED_BUDGET."""
    if profile_name() == "reliability-soak":
        return profile()
    return settings(FOCUSED_BUDGET, max_examples=3)


class AwaitsOnceEffectsMachine(SluiceMachine):
    """The property suite, drawing awaits, run-once messages and effects more often (on one queue:
    lanes are the usual mix's)."""

    with_lanes = False

    @rule(action=FOCUSED)
    def act(self, action: Any) -> None:
        super().act(action)


def focused_suite_fails() -> BaseException:
    with pytest.raises((PromiseBroken, Flaky)) as failure:
        run_state_machine_as_test(AwaitsOnceEffectsMachine, settings=FOCUSED_BUDGET)
    print(failure.value)
    return failure.value


def effects_sent_from_every_event(output, effects, *, store, queue, name, state, now):
    """Effects sent from the event itself, not from the release that happens: every repeat sends."""
    import sluice.features.effects

    record = store.execution(name)
    if output is not None and state is PayloadState.SUCCEEDED and record is not None:
        kept = output(record)
        if kept is not None and kept.text:
            (effects or sluice.features.effects.Effects()).send(
                kept.text, record=record, queue=queue, now=now
            )
    return output


@pytest.mark.slow
def test_the_focused_suite_passes_within_its_budget():
    run_state_machine_as_test(AwaitsOnceEffectsMachine, settings=focused_pass_budget())


def test_a_launcher_that_skips_the_awaits_gate_is_caught_by_the_suite(monkeypatch):
    monkeypatch.setattr(sluice.launch.per_message, "gate", lambda **kw: False)
    assert "awaits:" in str(focused_suite_fails())


@in_the_soak
def test_effects_sent_on_every_event_are_caught_by_the_suite(monkeypatch):
    monkeypatch.setattr(sluice.launch.completion, "around", effects_sent_from_every_event)
    assert "effects once:" in str(focused_suite_fails())


@in_the_soak
def test_a_claim_that_ignores_sluice_once_is_caught_by_the_suite(monkeypatch):
    monkeypatch.setattr(sluice.launch.per_message, "is_once", lambda message: False)
    assert "run once:" in str(focused_suite_fails())


# A reconciliation that never sweeps waiters: the focused suite's budget does not reliably draw a
# completion that dies between the receipt and the wake-up, so promise 9 is held to this variant by
# its scenario, test_a_reconciliation_that_never_wakes_waiters_is_caught (above).


# -- concurrency keys in the property suite (issue 11) -----------------------------------------------
#
# A mix that draws keyed messages, key caps and faults aimed at the keys' line (a crash at each of
# its steps, AWS failing right after a park, a wake-up's send or the line's advance, another actor
# cutting in after a park) more often than the usual mix does.

KEY_TICK = st.builds(
    programs.Tick,
    launcher=st.sampled_from(("A", "A", "B", "both")),
    wait=st.sampled_from((0, 0, 5, 61, 181, 301)),  # 301 s: a woken waiter's kept slot goes stale
    fault=programs.weighted(
        (1, programs.FAULTS),
        (2, st.tuples(st.just("crash"), st.sampled_from(sorted(KEY_POINTS)), st.integers(1, 2))),
        (
            3,
            st.tuples(
                st.just("throttle_after"),
                st.sampled_from(("key_park", *programs.AFTER_STEPS)),
                st.sampled_from(programs.AFTER_TARGETS),
            ),
        ),
        (
            1,
            st.tuples(
                st.just("interleave"), st.just("after_key_park"), st.sampled_from(programs.INTERLEAVE_ACTORS)
            ),
        ),
    ),
    # MAX raised more often than lowered: a tick takes up to its free slots, and a key's line fills
    # only when it takes more of one key's payloads than the key's cap.
    new_max=programs.weighted((3, st.none()), (2, st.sampled_from((1, 3, 5, 8, 8)))),
)
KEYS_FOCUSED = programs.weighted(
    (5, programs.KEYED),
    (1, programs.KEY_CAP),
    (1, st.builds(programs.Enqueue, programs.MESSAGES)),
    (1, st.builds(programs.EnqueueAgain, programs.INDEX, st.booleans())),
    (6, KEY_TICK),
    (3, programs.END),
    (3, st.builds(programs.Deliver, programs.INDEX, programs.COMPLETION_FAULTS)),
    (1, st.builds(programs.Lose, programs.INDEX)),
    (1, st.builds(programs.Redeliver, programs.INDEX)),
    (1, programs.OUTSIDE),
)


class ConcurrencyKeysMachine(SluiceMachine):
    """The property suite, drawing concurrency keys and faults at their line's steps more often (on
    one queue: lanes are the usual mix's)."""

    with_lanes = False

    @rule(action=KEYS_FOCUSED)
    def act(self, action: Any) -> None:
        super().act(action)


def wait_undone_by_its_wake_up(*, store, queue, payload, ckey, now, seen=None, fair=None):
    """``sluice.features.keys.wait`` without its guard of the wake-up: the parker's own wake-up failing
    escapes the park, so the launcher hands the parked message back to the queue."""
    message = payload.message
    for _ in range(sluice.features.keys.PARK_ATTEMPTS):
        state = store.key_state(ckey)
        waiter = sluice.features.keys.KeyWaiter(
            ckey=ckey,
            ticket=state.tickets,
            message_id=origin_id(message.message_id, message.attributes),
            key=payload.key,
            body=message.body,
            group_id=message.group_id,
            attributes={
                k: v for k, v in message.attributes.items() if k not in (ORIGIN_ATTRIBUTE, TICKET_ATTRIBUTE)
            },
            parked_at=now,
        )
        if store.park_for_key(
            waiter, tickets=state.tickets, replaces=sluice.features.keys.ticket_of(message), fair=fair
        ):
            break
    else:
        raise TransientError("the line kept moving", operation="TransactWriteItems")
    if fair is None:
        sluice.features.keys.wake(store=store, queue=queue, ckey=ckey, now=now)
    return waiter.ticket


@pytest.mark.slow
def test_the_keys_focused_suite_passes_within_its_budget():
    run_state_machine_as_test(ConcurrencyKeysMachine, settings=focused_pass_budget())


# A park undone by its own wake-up's failure: the keys' suite flags it ("key line (no receive while
# parked)") when a throttle lands right after a park in a tick that parks, which its budget does not
# draw reliably (of three mixes tried, one caught it, at its 19th program of 20); the scenario holds it.


def test_a_park_undone_by_its_wake_ups_failure_is_caught(monkeypatch):
    monkeypatch.setattr(sluice.launch.per_message.keys, "wait", wait_undone_by_its_wake_up)
    with pytest.raises(AssertionError):
        on_keyed_stack(keys_moto.test_a_parked_message_whose_wake_up_is_throttled_is_deleted_all_the_same)


# -- lanes (sluice.features.lanes, promise 7 of docs/protocol.md) ------------------------------------------------


def harmless_item(table: str) -> dict[str, Any]:
    """A transaction item that writes nothing any check reads: in place of a lane's slot."""
    return {
        "Update": {
            "TableName": table,
            "Key": {"pk": {"S": "VARIANT#harmless"}},
            "UpdateExpression": "SET touched = :t",
            "ExpressionAttributeValues": {":t": {"N": "1"}},
        }
    }


def without_the_lane_slot(self: LaneSlots, lane: str, shard: int, name: str, now: float) -> dict[str, Any]:
    return harmless_item(self.table)


def keeping_the_lane_slot(self: LaneSlots, lane: str, shard: int, name: str) -> dict[str, Any]:
    return harmless_item(self.table)


@pytest.mark.parametrize("ledger_check", [True, False], ids=["ledger-check", "promises-alone"])
def test_a_claim_without_its_lane_slot_is_caught(monkeypatch, ledger_check):
    """The claim's transaction without the lane's slot: the lane's next claim finds room again."""
    monkeypatch.setattr(LaneSlots, "claim_item", without_the_lane_slot)
    monkeypatch.setattr(World, "check_ledger", ledger_check)
    failure = caught(breaks.test_a_lane_never_passes_its_max_whatever_the_global_room)
    assert "promise 7 (lane MAX)" in str(failure)


def test_a_release_that_keeps_the_lane_slot_is_caught(monkeypatch):
    """The release's transaction without the lane's slot: the lanes' ledger check at once."""
    monkeypatch.setattr(LaneSlots, "release_item", keeping_the_lane_slot)
    failure = caught(breaks.test_a_lane_slot_comes_back_when_its_run_ends)
    assert "holds a slot of lane 'gpu' and no global slot" in str(failure)


def lane_slot_after_the_end(make_world: Callable[..., World]) -> None:
    """One gpu run, ended with its event delivered; then the world comes to rest."""
    world = make_world(max_concurrency=2, lanes="gpu:1:1,default:1")
    world.send(body("g0"), group="g0", lane="gpu")
    world.tick("A")
    (g0,) = world.model.running
    world.end(g0)
    assert world.deliver(0) == "ok"
    world.settle()


def test_the_lane_slot_after_the_end_scenario_holds():
    run(lane_slot_after_the_end)


def test_a_release_that_keeps_the_lane_slot_is_caught_at_rest(monkeypatch):
    """With the ledger check off, the promises at rest: gpu's pool holds a slot nothing runs in."""
    monkeypatch.setattr(LaneSlots, "release_item", keeping_the_lane_slot)
    monkeypatch.setattr(World, "check_ledger", False)
    failure = caught(lane_slot_after_the_end)
    assert "promise 7 (nothing leaks)" in str(failure)


def test_a_completion_that_ignores_the_lanes_priority_is_caught(monkeypatch):
    refill_order = sluice.launch.lane_admission.refill_order
    monkeypatch.setattr(
        sluice.launch.lane_admission,
        "refill_order",
        lambda lanes, rng: list(reversed(refill_order(lanes, rng))),
    )
    failure = caught(breaks.test_a_slot_freed_in_a_low_lane_goes_to_the_priority_lane)
    assert "the freed slot went to 'default'" in str(failure)


def creating_the_lanes_pools_only(self: LaneAdmission) -> dict[str, int]:
    """``sync_lanes`` that writes each lane's pool once, with its configured MAX, and never moves it."""
    names = [lane.name for lane in self.ctx.settings.lanes]
    rooms = self.ctx.store.lane_rooms(names)
    for lane in self.ctx.settings.lanes:
        if not rooms[lane.name].exists:
            self.ctx.store.set_lane_limit(lane.name, lane.max, 0.0)
    return {name: room.limit for name, room in self.ctx.store.lane_rooms(names).items()}


def test_a_tick_that_never_moves_a_lanes_limit_is_caught(monkeypatch):
    monkeypatch.setattr(LaneAdmission, "sync_lanes", creating_the_lanes_pools_only)
    failure = caught(breaks.test_a_lane_max_whose_command_died_is_put_in_force_by_the_next_tick)
    assert "promise 7 (lane MAX)" in str(failure)


def test_a_requeue_that_ignores_the_messages_lane_is_caught(monkeypatch):
    monkeypatch.setattr(sluice.adapters.aws.sqs.SqsQueue, "url_for", lambda self, attributes: self.home_url)
    failure = caught(breaks.test_a_waiter_woken_from_the_table_goes_back_to_its_lanes_queue)
    assert "lanes (messages keep their lane)" in str(failure)


def test_a_lane_never_thawed_after_a_lowered_max_is_caught(monkeypatch):
    monkeypatch.setattr(DynamoStore, "thaw_lane", lambda self, lane: None)
    caught(breaks.test_a_lane_lowered_below_its_runs_admits_again_once_they_end)


def test_a_tick_whose_rounds_end_at_the_first_that_starts_nothing_is_caught(monkeypatch):
    """The lanes' split gives the free slot to a lane with an empty queue; a tick that stops there
    never offers it to the lane the split gave nothing."""
    split = sluice.launch.lane_admission.split

    def first_round_only(room, lanes, rooms):
        shares = split(room, lanes, rooms)
        first_round_only.rounds += 1
        return shares if first_round_only.rounds % 2 else dict.fromkeys(shares, 0)

    first_round_only.rounds = 0
    monkeypatch.setattr(sluice.launch.lane_admission, "split", first_round_only)
    caught(breaks.test_a_lane_whose_share_rounds_to_nothing_still_gets_the_free_slot)


# -- fair lanes (sluice.features.fair) -------------------------------------------------------------------------


def test_a_fair_lane_that_serves_its_tenants_in_arrival_order_is_caught(monkeypatch):
    """The waker gives every free slot to the tenant whose line holds the oldest waiter (the first
    parked): what a FIFO queue does. The light tenant queued behind the heavy one gets nothing."""

    def oldest_first(free, states, *, now, rng, gate_rooms=None, waiting=None):
        wants = {k: s.waiting if waiting is None else waiting.get(k, 0) for k, s in states.items()}
        order = sorted(states, key=lambda k: (wants[k] == 0, k))
        given: dict[str, int] = {}
        for ckey in order:
            take = min(free, max(0, wants[ckey]))
            if take:
                given[ckey], free = take, free - take
        return given

    monkeypatch.setattr(sluice.features.fair, "share_out", oldest_first)
    failure = caught(breaks.test_a_fair_lane_shares_its_slots_among_its_tenants)
    assert "served in arrival order" in str(failure)


def test_a_fair_tenant_held_to_the_default_key_cap_is_caught(monkeypatch):
    """A claim from a fair lane that keeps the default key cap (``uncapped`` ignored): keyConcurrency
    (1) holds every tenant of the fair lane, and half its slots stay empty with work waiting."""
    claim_item = KeysTable.key_claim_item

    def capped(self, ckey, name, *, ticket, uncapped=False, landed=False):
        return claim_item(self, ckey, name, ticket=ticket, landed=landed)

    monkeypatch.setattr(KeysTable, "key_claim_item", capped)
    failure = caught(breaks.test_a_fair_lane_shares_its_slots_among_its_tenants)
    assert "served in arrival order" in str(failure) or "heavy" in str(failure)

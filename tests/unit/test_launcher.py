"""The launcher's protocol on in-memory adapters and a fake clock: sequences of outcomes."""

import json

import pytest

from sluice.adapters.memory.aws import MemoryExecutions, MemoryQueue, _Queued
from sluice.adapters.memory.store import MemoryStore
from sluice.core.clock import FakeClock
from sluice.core.errors import ConfigurationError, TransientError
from sluice.core.limits import LimitSource, MaxReading
from sluice.core.model import Claim, ClaimFence, Ending, Message, Outcome, PayloadState
from sluice.core.names import execution_name
from sluice.launch.completion import complete
from sluice.launch.launcher import Launcher
from sluice.launch.settings import DuplicatePolicy, Settings


class Max:
    """MAX as an operator sets it: each change is a newer reading."""

    def __init__(self, value: int) -> None:
        self._value, self.changed_at = value, 1.0

    @property
    def value(self) -> int:
        return self._value

    @value.setter
    def value(self, value: int) -> None:
        self._value, self.changed_at = value, self.changed_at + 1

    def reading(self) -> MaxReading:
        return MaxReading(self._value, self.changed_at)


class World:
    def __init__(self, max_concurrency: int = 3, **settings) -> None:
        self.clock = FakeClock()
        self.queue = MemoryQueue(clock=self.clock, visibility_timeout=180)
        self.sfn = MemoryExecutions(clock=self.clock)
        self.store = MemoryStore()
        self.max = Max(max_concurrency)
        self.settings = Settings(receive_wait_seconds=0, **settings)
        self.launcher = self.new_launcher()

    def new_launcher(self) -> Launcher:
        return Launcher(
            queue=self.queue,
            executions=self.sfn,
            store=self.store,
            max_source=self.max,
            clock=self.clock,
            settings=self.settings,
        )

    def send(self, payload) -> str:
        return self.queue.send(payload if isinstance(payload, str) else json.dumps(payload))

    def finish(self, name: str, status: str = "SUCCEEDED") -> None:
        info = self.sfn.finish(name, status)
        complete(
            store=self.store,
            queue=self.queue,
            name=name,
            ending=Ending(PayloadState(status), self.clock.now(), ended_at=info.stop_date),
        )


def test_fills_free_slots_and_stops_when_full():
    w = World(max_concurrency=3)
    for i in range(5):
        w.send({"id": f"p{i}"})
    s = w.launcher.tick()
    assert (s.n(Outcome.STARTED), s.received, s.stopped) == (3, 3, "full")
    assert len(w.sfn.running) == 3 and len(w.queue.messages) == 2  # never received without a slot
    assert len(w.store.ledger().holders) == 3


def test_completion_frees_a_slot_and_admission_refills_it():
    w = World(max_concurrency=2)
    for i in range(3):
        w.send({"id": f"p{i}"})
    w.launcher.tick()
    first = sorted(w.sfn.running)[0]
    w.finish(first)
    assert w.store.payload(w.store.execution(first).key).state is PayloadState.SUCCEEDED
    s = w.launcher.admit()
    assert s.n(Outcome.STARTED) == 1 and len(w.sfn.running) == 2 and len(w.queue) == 0


def test_duplicate_of_a_running_payload_is_suppressed_and_counted():
    w = World()
    w.send({"id": "same", "v": 1})
    w.launcher.tick()
    w.send({"id": "same", "v": 2})
    # The holder reads RUNNING, an answer that may be stale: looked at again a window later.
    assert w.launcher.tick().n(Outcome.RECHECK) == 1 and len(w.queue) == 1
    w.clock.advance(w.settings.consistency_window_seconds)
    s = w.launcher.tick()
    assert s.n(Outcome.DUPLICATE) == 1 and len(w.sfn.running) == 1 and len(w.queue) == 0
    assert w.store.payload("same").duplicates == 1


def test_defer_policy_parks_the_duplicate_until_the_lease_ends():
    w = World(duplicate_policy=DuplicatePolicy.DEFER)
    w.send({"id": "same", "v": 1})
    w.launcher.tick()
    w.send({"id": "same", "v": 2})
    assert w.launcher.tick().n(Outcome.DEFERRED) == 1
    assert len(w.queue) == 0  # parked in the store: no receive is spent while it waits
    receives = w.queue.calls["ReceiveMessage"]
    w.launcher.tick()
    assert w.queue.calls["ReceiveMessage"] == receives + 1  # one empty receive, nothing redelivered
    (running,) = w.sfn.running
    w.finish(running)  # the release sends the parked message back
    assert len(w.queue) == 1
    s = w.launcher.tick()
    assert s.n(Outcome.STARTED) == 1
    (second,) = w.sfn.running
    assert json.loads(w.sfn.inputs[second]) == {"id": "same", "v": 2}


def test_resubmission_after_the_run_ended_runs_again():
    w = World()
    w.send({"id": "p"})
    w.launcher.tick()
    (first,) = w.sfn.running
    w.finish(first)
    w.send({"id": "p"})
    assert w.launcher.tick().n(Outcome.STARTED) == 1
    record = w.store.payload("p")
    assert record.attempts == 2 and len(record.executions) == 2 and record.state is PayloadState.CLAIMED


def test_invalid_payload_goes_to_the_dlq_with_its_reason_and_the_tick_goes_on():
    w = World()
    w.send("not json")
    w.send({"id": "good"})
    s = w.launcher.tick()
    assert (s.n(Outcome.INVALID), s.n(Outcome.STARTED)) == (1, 1)
    ((message, reason),) = w.queue.dead
    assert message.body == "not json" and reason.startswith("not JSON")


def test_invalid_with_a_key_records_the_reason():
    w = World()
    w.send(json.dumps({"id": "big", "blob": "x" * 300_000}))
    w.launcher.tick()
    # The key is derivable only for messages with the sluice-key attribute; here it is not recorded.
    assert w.store.payload("big") is None
    assert w.queue.dead[0][1].startswith("payload is 300,")


def test_max_zero_pauses_without_receiving():
    w = World(max_concurrency=0)
    w.send({"id": "p"})
    s = w.launcher.tick()
    assert (s.stopped, s.received) == ("paused", 0)
    assert w.queue.calls.get("ReceiveMessage", 0) == 0


def test_lowered_max_starts_nothing_until_below_it():
    w = World(max_concurrency=4)
    for i in range(6):
        w.send({"id": f"p{i}"})
    w.launcher.tick()
    w.max.value = 2
    assert w.launcher.tick().n(Outcome.STARTED) == 0
    for name in sorted(w.sfn.running)[:2]:
        w.finish(name)
    assert w.launcher.tick().n(Outcome.STARTED) == 0  # 2 running = MAX
    w.finish(sorted(w.sfn.running)[0])
    assert w.launcher.tick().n(Outcome.STARTED) == 1


def test_redelivery_after_a_crash_between_claim_and_start_resumes_with_the_same_name():
    w = World()
    w.send({"id": "p"})
    (message,) = w.queue.receive(1, 0)
    name = execution_name("p", message.message_id)
    now = w.clock.now()
    w.store.set_limit(LimitSource(3, None))
    w.store.claim(
        Claim(key="p", name=name, message_id=message.message_id, now=now, claim_expires_at=now + 900)
    )
    w.clock.advance(181)  # visibility timeout: the message comes back
    s = w.launcher.tick()
    assert s.n(Outcome.RESUMED) == 1 and list(w.sfn.running) == [name]
    assert w.store.payload("p").holder == name and len(w.queue) == 0


def test_redelivery_after_the_execution_ended_does_not_run_it_again():
    w = World()
    w.send({"id": "p"})
    w.launcher.tick()
    (name,) = w.sfn.running
    # Lost delete: put the same message back, then the execution ends and its event arrives.
    message_id = w.store.execution(name).message_id
    w.finish(name)
    w.queue.messages.append(_Queued(Message(message_id, "", json.dumps({"id": "p"}))))
    s = w.launcher.tick()
    assert s.n(Outcome.ALREADY_RAN) == 1 and not w.sfn.running and len(w.queue) == 0
    assert w.store.ledger().holders == frozenset() and w.store.payload("p").state is PayloadState.SUCCEEDED


def test_throttled_start_rolls_back_the_claim_and_returns_the_rest():
    w = World()
    for i in range(3):
        w.send({"id": f"p{i}"})

    def throttled(name, input_json):
        raise TransientError("slow down", operation="StartExecution", code="ThrottlingException")

    w.sfn.start = throttled
    s = w.launcher.tick()
    assert (s.stopped, s.n(Outcome.INTERRUPTED)) == ("transient", 3)
    assert w.store.ledger().holders == frozenset()  # nothing started, nothing held
    assert len(w.queue) == 3


def test_configuration_error_fails_loudly_and_holds_nothing():
    w = World()
    w.send({"id": "p"})

    def missing():
        raise ConfigurationError("StateMachineDoesNotExist")

    w.sfn.check = missing
    with pytest.raises(ConfigurationError):
        w.launcher.tick()
    assert w.queue.calls.get("ReceiveMessage", 0) == 0 and w.store.ledger().holders == frozenset()


def test_reconcile_releases_a_slot_whose_event_was_lost():
    w = World(max_concurrency=1, consistency_window_seconds=60)
    w.send({"id": "a"})
    w.send({"id": "b"})
    w.launcher.tick()
    (name,) = w.sfn.running
    w.sfn.finish(name, "FAILED")  # ended; its status event never arrives
    w.clock.advance(30)
    assert w.launcher.tick().n(Outcome.STARTED) == 0  # too young to trust ListExecutions
    w.clock.advance(60)
    s = w.launcher.tick()
    assert (s.released_by_reconcile, s.n(Outcome.STARTED)) == (1, 1)
    assert w.store.payload("a").state is PayloadState.FAILED


def test_reconcile_releases_an_abandoned_claim_a_claim_timeout_after_it_first_saw_it():
    w = World(max_concurrency=1, claim_timeout_seconds=900)
    w.send({"id": "a"})
    (message,) = w.queue.receive(1, 0)
    now = w.clock.now()
    name = execution_name("a", message.message_id)
    w.store.set_limit(LimitSource(1, None))
    w.store.claim(
        Claim(key="a", name=name, message_id=message.message_id, now=now, claim_expires_at=now + 900)
    )
    w.queue.in_flight.clear()  # the message went elsewhere (DLQ); only the claim is left
    w.clock.advance(600)
    assert w.launcher.tick().released_by_reconcile == 0  # first sighting: marked, by this clock
    assert w.store.execution(name).suspect_since == w.clock.now()
    w.clock.advance(899)
    assert w.launcher.tick().released_by_reconcile == 0
    w.clock.advance(1)
    assert w.launcher.tick().released_by_reconcile == 1
    assert w.store.payload("a").state is PayloadState.RELEASED and not w.store.ledger().holders


def test_a_resumed_claim_fences_off_the_release_reconciliation_had_judged():
    w = World(max_concurrency=2, claim_timeout_seconds=900)
    w.send({"id": "a"})
    (message,) = w.queue.receive(1, 0)  # a launcher received it, claimed, and died
    now = w.clock.now()
    name = execution_name("a", message.message_id)
    w.store.set_limit(LimitSource(2, None))
    w.store.claim(
        Claim(key="a", name=name, message_id=message.message_id, now=now, claim_expires_at=now + 900)
    )
    w.clock.advance(600)  # the message is visible again
    s = w.launcher.tick()  # reconciliation marks the claim, then admission receives the message
    assert s.n(Outcome.RESUMED) == 1 and set(w.sfn.running) == {name}
    record = w.store.execution(name)
    assert (record.claim_version, record.suspect_since) == (1, None)  # renewed: the mark is gone
    stale = ClaimFence(claim_version=0, suspect_since=now + 600)
    assert w.store.release(name, Ending(PayloadState.RELEASED, w.clock.now()), fence=stale) is None
    assert w.store.ledger().holders == {name}


def test_executions_started_by_others_count_against_max():
    w = World(max_concurrency=3)
    w.sfn.start("by-hand-1", "{}")
    w.sfn.start("by-hand-2", "{}")
    for i in range(3):
        w.send({"id": f"p{i}"})
    s = w.launcher.tick()
    assert (s.limit, s.n(Outcome.STARTED), s.drift) == (1, 1, 2)
    assert len(w.sfn.running) == 3


def test_a_completion_refills_only_the_slot_it_freed():
    w = World(max_concurrency=2)
    for i in range(6):
        w.send({"id": f"p{i}"})
    w.launcher.tick()
    w.max.value = 4  # raised: two more slots free, but a completion fills only its own
    w.finish(sorted(w.sfn.running)[0])
    s = w.launcher.admit(max_new=1)
    assert (s.received, s.n(Outcome.STARTED)) == (1, 1) and len(w.sfn.running) == 2
    assert w.launcher.tick().n(Outcome.STARTED) == 2  # the tick fills the rest


@pytest.mark.parametrize(("max_new", "bounced"), [(1, 0), (None, 20)])
def test_a_burst_of_completions_never_walks_healthy_messages_towards_the_dlq(max_new, bounced):
    """Five executions end together; their five completion handlers read the ledger at the same
    moment (all see five free slots) and then admit one after another."""
    w = World(max_concurrency=5)
    for i in range(15):
        w.send({"id": f"p{i}"})
    w.launcher.tick()
    for name in sorted(w.sfn.running):
        w.finish(name)
    same_moment = w.store.ledger()
    read_now = w.store.ledger
    w.store.ledger = lambda: same_moment
    returned = sum(w.new_launcher().admit(max_new=max_new).n(Outcome.RETURNED) for _ in range(5))
    w.store.ledger = read_now
    assert len(w.sfn.running) == 5
    # Each returned message spent one of its maxReceiveCount receives without a chance to run.
    assert returned == bounced
    assert w.queue.calls.get("ChangeMessageVisibilityBatch", 0) == (0 if max_new else 4)


def test_only_the_scheduled_tick_lingers():
    w = World(linger_seconds=30)
    w.store.set_limit(LimitSource(3, None))
    calls = w.queue.calls
    w.launcher.admit(max_new=1)
    assert calls["ReceiveMessage"] == 1  # a completion's admission does not wait for more work


def test_a_completion_obeys_the_caps_and_reads_no_max():
    w = World(max_concurrency=2)
    for i in range(4):
        w.send({"id": f"p{i}"})
    w.launcher.tick()
    w.max = Max(5)  # MAX raised where only a tick reads it
    w.launcher.max_source = w.max
    w.finish(sorted(w.sfn.running)[0])
    s = w.launcher.admit(max_new=1)
    assert (s.n(Outcome.STARTED), s.max_concurrency, s.limit) == (1, None, 2)
    assert len(w.sfn.running) == 2  # the caps said 2: the refill took the one freed slot
    s = w.launcher.tick()
    assert (s.n(Outcome.STARTED), s.max_concurrency, s.limit) == (1, 5, 5)  # the tick moved them


def test_a_completion_before_any_tick_starts_nothing():
    w = World(max_concurrency=2)
    w.send({"id": "p"})
    s = w.launcher.admit(max_new=1)
    assert (s.n(Outcome.STARTED), s.stopped, len(w.queue)) == (0, "full", 1)
    assert w.queue.calls.get("ReceiveMessage", 0) == 0  # nothing received without a slot

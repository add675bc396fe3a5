"""Attacks on the ambiguous start's window (``sluice.launch.admission.away_after``, commit 44670b0).

The fix: a message whose StartExecution may have landed (``AmbiguousStartError``) goes back to the
queue for the consistency window S (60 s), so that its resume cannot read the start as missing
(DescribeExecution is eventually consistent for up to S) and, after the stack was switched to
another state machine, start its name on the new machine beside the run on the old one.

Attacked here, on moto with the real adapters, each fault a botocore hook asserted to have fired:

* paths where the start landed and the message still comes back within S: a retried start whose
  last answer is a 4xx (a ``ConfigurationError``, not ambiguous), a start answered "already
  exists" whose DescribeExecution is throttled (a plain ``TransientError``), and a completion's
  hand-over that dies after its start on a stack whose visibility timeout is less than the
  completion function's timeout plus S;
* paths the fix must cover and does: a plain lost answer on the hand-over, a throttled start
  turned ambiguous, and the batch around an ambiguous start (nothing lost, blocked or leaked).

A stale DescribeExecution answers "no such execution" for a run younger than S by the stack's
clock (its landing is recorded by the StartExecution hook). moto's SQS visibility runs in real
time: the window passing is the clock advanced and the message made visible again.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import Outcome, PayloadState
from sluice.core.names import execution_name
from tests.support.aws import build_stack, new_machine
from tests.support.hooks import Crash, error_answer, receipts_of
from tests.unit.test_stack_config import config as stack_config

WINDOW = 60
ENDPOINT = "https://states.us-east-1.amazonaws.com"


@pytest.fixture
def stack(session):
    return build_stack(session, clock=FakeClock(), max_concurrency=2)


# -- the world: where runs landed, and a Step Functions whose reads lag -----------------------------


class Landings(dict[str, float]):
    """Execution name → when (by the stack's clock) its StartExecution landed."""


def record_landings(client: Any, stack: Any, landings: Landings) -> None:
    """Note every StartExecution that reached Step Functions (moto), before any hook loses its answer."""

    def hook(http_response: Any, parsed: Any, **_: Any) -> None:
        if http_response.status_code < 300 and "executionArn" in parsed:
            landings.setdefault(parsed["executionArn"].rsplit(":", 1)[1], stack.clock.now())

    client.meta.events.register_first("after-call.sfn.StartExecution", hook)


def stale_describe(client: Any, stack: Any, landings: Landings) -> Counter:
    """DescribeExecution answers "no such execution" for a run younger than S (eventual consistency)."""
    fired: Counter = Counter()

    def hook(params: dict[str, Any], **_: Any) -> Any:
        raw = params.get("body", b"")
        request = json.loads(raw.decode() if isinstance(raw, bytes) else raw or "{}")
        name = request.get("executionArn", "").rsplit(":", 1)[-1]
        landed = landings.get(name)
        if landed is None or stack.clock.now() - landed >= WINDOW:
            return None
        fired["stale"] += 1
        return error_answer("ExecutionDoesNotExist", 400)

    client.meta.events.register("before-call.sfn.DescribeExecution", hook)
    return fired


def answer_lost(client: Any, *, error: Exception | None = None, times: int = 1) -> Counter:
    """StartExecution lands, and its caller gets ``error`` instead of the answer (a read timeout by
    default: ``AmbiguousStartError``), the first ``times`` times."""
    fired: Counter = Counter()

    def hook(http_response: Any, **_: Any) -> None:
        if http_response.status_code < 300 and fired["lost"] < times:
            fired["lost"] += 1
            raise error or ReadTimeoutError(endpoint_url=ENDPOINT)

    client.meta.events.register("after-call.sfn.StartExecution", hook)
    return fired


def retried_answer(code: str) -> ClientError:
    """The last answer of a call botocore retried (its first attempt landed, its answer lost)."""
    return ClientError(
        {
            "Error": {"Code": code, "Message": f"{code} (injected, after a retry)"},
            "ResponseMetadata": {"HTTPStatusCode": 400, "HTTPHeaders": {}, "RetryAttempts": 1},
        },
        "StartExecution",
    )


def runs_on(stack: Any, machine: str) -> list[str]:
    sfn = stack.client("stepfunctions")
    return [e["name"] for e in sfn.list_executions(stateMachineArn=machine)["executions"]]


def switched(stack: Any, landings: Landings) -> tuple[Any, str, Counter]:
    """The stack switched to a new state machine; its runtime, that machine, and the stale hook's count."""
    machine = new_machine(stack)
    rt = stack.runtime(state_machine_arn=machine)
    sfn = rt.client("stepfunctions")
    record_landings(sfn, stack, landings)
    return rt, machine, stale_describe(sfn, stack, landings)


def warm(stack: Any) -> Any:
    """A runtime whose launcher ticked once (its state machine check is done)."""
    rt = stack.runtime()
    rt.launcher().tick()
    return rt


# -- breaks: the start landed, and the message is back within the window -----------------------------


@pytest.mark.parametrize("code", ["ExecutionLimitExceeded", "KmsThrottlingException", "StateMachineDeleting"])
def test_a_retried_start_refused_at_last_is_not_taken_as_never_started(stack, code):
    """A retried StartExecution whose first attempt landed and whose last answer is a 4xx: was a
    ConfigurationError, the fresh claim rolled back and the message returned at once; after a
    switch its name started on the new machine beside the run on the old one (promise 2). Now
    ambiguous: the claim is kept and the message stays away for the window."""
    old = stack.settings.state_machine_arn
    landings = Landings()
    p0 = stack.send({"id": "p0"}, group="g0")
    name = execution_name("p0", p0)
    rt = stack.runtime()
    sfn = rt.client("stepfunctions")
    record_landings(sfn, stack, landings)
    lost = answer_lost(sfn, error=retried_answer(code))
    assert rt.launcher().tick().stopped == "transient"
    assert lost["lost"] == 1 and runs_on(stack, old) == [name]
    # The run landed; what Sluice kept of it:
    kept = stack.runtime().store().execution(name)
    back = stack.queue_counts()
    stack.clock.advance(5)
    rt2, machine, stale = switched(stack, landings)
    rt2.launcher().tick()
    assert runs_on(stack, old) == [name]
    assert runs_on(stack, machine) == [], (
        f"started twice: the claim was {kept.state if kept else None}, the message back at once {back}, "
        f"stale reads {stale['stale']}"
    )


def test_a_retried_start_refused_at_last_keeps_its_slot(session):
    """Tick B reconciles and reads the room (1 free under MAX 1); tick A then receives a, claims
    the slot, and its start lands with a 4xx as the retry's last answer; B receives b. The claim
    was rolled back and B filled the slot beside a's run (promise 1); now a keeps its slot."""
    stack = build_stack(session, clock=FakeClock(), max_concurrency=1)
    stack.send({"id": "a"}, group="g0")
    rt_a, rt_b = stack.runtime(), stack.runtime()
    lost = answer_lost(rt_a.client("stepfunctions"), error=retried_answer("ExecutionLimitExceeded"))
    received = receipts_of(rt_a.client("sqs"))
    between: Counter = Counter()

    def tick_a_first(**_: Any) -> None:
        if between["a"]:
            return
        between["a"] += 1
        assert rt_a.launcher().tick().stopped == "transient"
        # SQS hands out the other group first (no order across groups): a's copy is not received yet.
        stack.client("sqs").change_message_visibility(
            QueueUrl=stack.settings.queue_url, ReceiptHandle=received[0], VisibilityTimeout=300
        )
        stack.send({"id": "b"}, group="g1")

    rt_b.client("sqs").meta.events.register("before-call.sqs.ReceiveMessage", tick_a_first)
    rt_b.launcher().tick()
    assert between["a"] == 1 and lost["lost"] == 1
    assert len(stack.running()) <= 1, f"{sorted(stack.running())} running under MAX 1"


def test_an_already_exists_whose_describe_is_throttled_stays_away_for_the_window(stack):
    """StartExecution answered ExecutionAlreadyExists after a retry (its first attempt landed), and
    the DescribeExecution that follows throttled: was a plain TransientError, the message back at
    once and, after a switch, started on the new machine (promise 2). Now ambiguous: away the window."""
    old = stack.settings.state_machine_arn
    landings = Landings()
    p0 = stack.send({"id": "p0"}, group="g0")
    name = execution_name("p0", p0)
    rt = stack.runtime()
    sfn = rt.client("stepfunctions")
    record_landings(sfn, stack, landings)
    lost = answer_lost(sfn, error=retried_answer("ExecutionAlreadyExists"))
    throttled: Counter = Counter()

    def throttle_once(**_: Any) -> Any:
        if throttled["describe"] == 0:
            throttled["describe"] += 1
            return error_answer("ThrottlingException", 400)
        return None

    sfn.meta.events.register("before-call.sfn.DescribeExecution", throttle_once)
    summary = rt.launcher().tick()
    assert lost["lost"] == 1 and throttled["describe"] == 1 and summary.stopped == "transient"
    assert runs_on(stack, old) == [name]
    back = stack.queue_counts()
    stack.clock.advance(5)
    rt2, machine, stale = switched(stack, landings)
    rt2.launcher().tick()
    assert runs_on(stack, machine) == [], f"started twice: back at once {back}, stale reads {stale['stale']}"


def test_a_hand_over_that_dies_after_a_late_start_comes_back_after_the_window(session):
    """The completion function's timeout (60 s) exceeds the shortest launcher timeout (30 s): with
    visibility = launcherTimeout + 60 = 90 s, a hand-over that died after a start landing 33 s after
    its receive saw its message back 57 s after that start, read it missing and, after a switch,
    started it on the new machine (promise 2). The visibility now covers the completion's timeout:
    the stack packaged with the shortest launcher timeout, its copy is back only after the window."""
    cfg = stack_config(launcherTimeout=30, lingerSeconds=15)
    visibility = cfg["visibilityTimeout"]
    assert visibility >= cfg["completionTimeout"] + WINDOW
    stack = build_stack(session, clock=FakeClock(), max_concurrency=2, visibility_timeout=visibility)
    old = stack.settings.state_machine_arn
    landings = Landings()
    stack.send({"id": "p0"}, group="g0")
    rt = warm(stack)
    (first,) = stack.running()
    p1 = stack.send({"id": "p1"}, group="g1")
    name = execution_name("p1", p1)
    sfn = rt.client("stepfunctions")
    record_landings(sfn, stack, landings)
    received_at: list[float] = []
    rt.client("sqs").meta.events.register(
        "after-call.sqs.ReceiveMessage",
        lambda parsed, **_: received_at.extend(stack.clock.now() for _ in parsed.get("Messages", [])),
    )
    receipts = receipts_of(rt.client("sqs"))
    slow: Counter = Counter()

    def slow_start(**_: Any) -> None:  # the first attempt timed out (30 s); the retry lands
        slow["slow"] += 1
        stack.clock.advance(33)

    sfn.meta.events.register("before-call.sfn.StartExecution", slow_start)

    def dies(http_response: Any, **_: Any) -> None:
        raise Crash("the completion function timed out waiting for the retried start's answer")

    sfn.meta.events.register("after-call.sfn.StartExecution", dies)
    event = StatusChange.from_event(stack.finish(first))
    with pytest.raises(Crash):
        rt.launcher().on_status_change(event)
    assert slow["slow"] == 1 and name in landings and set(runs_on(stack, old)) == {first, name}
    # Back when its visibility timeout, counted from the hand-over's receive, ends.
    stack.clock.advance(received_at[-1] + visibility - stack.clock.now())
    assert stack.clock.now() - landings[name] >= WINDOW
    stack.visible_again(receipts)
    rt2, machine, stale = switched(stack, landings)
    assert rt2.launcher().tick().received == 1
    assert runs_on(stack, machine) == [], f"started twice ({stale['stale']} stale reads)"


# -- holds: the window covers these -----------------------------------------------------------------


def test_a_hand_over_whose_answer_is_lost_resumes_on_the_old_machine_after_a_switch(stack):
    """A completion hands its slot to p1, whose start lands with its answer lost: p1 stays away
    for the window; the stack is switched meanwhile; back after it, p1 finds its run on the old
    machine and starts nothing on the new one."""
    old = stack.settings.state_machine_arn
    landings = Landings()
    stack.send({"id": "p0"}, group="g0")
    rt = warm(stack)
    (first,) = stack.running()
    p1 = stack.send({"id": "p1"}, group="g1")
    name = execution_name("p1", p1)
    sfn = rt.client("stepfunctions")
    record_landings(sfn, stack, landings)
    lost = answer_lost(sfn)
    receipts = receipts_of(rt.client("sqs"))
    released, refill, _ = rt.launcher().on_status_change(StatusChange.from_event(stack.finish(first)))
    assert released and lost["lost"] == 1 and refill.stopped == "transient"
    assert name in runs_on(stack, old) and stack.queue_counts() == (0, 1)
    rt2, machine, stale = switched(stack, landings)
    early = rt2.launcher().tick()  # within the window: p1 is not in the queue
    assert early.received == 0 and runs_on(stack, machine) == []
    stack.clock.advance(WINDOW + 1)
    stack.visible_again(receipts)
    after = rt2.launcher().tick()
    assert after.n(Outcome.RESUMED) == 1 and stale["stale"] == 0
    assert runs_on(stack, machine) == [] and stack.queue_counts() == (0, 0)
    store = rt2.store()
    assert store.payload("p1").holder == name
    assert set(store.ledger().holders) == {name}


def test_a_throttled_start_turned_ambiguous_stays_away_for_the_window(stack):
    """The first StartExecution lands and botocore's retries of it are throttled (ambiguous,
    throttled); every later call is throttled too, until the payload's calls run out: the error
    stays ambiguous, the claim is kept, and the message stays away for the window."""
    old = stack.settings.state_machine_arn
    landings = Landings()
    p0 = stack.send({"id": "p0"}, group="g0")
    name = execution_name("p0", p0)
    rt = stack.runtime()
    sfn = rt.client("stepfunctions")
    record_landings(sfn, stack, landings)
    retried_throttle = ClientError(
        {
            "Error": {"Code": "ThrottlingException", "Message": "throttled (injected, after retries)"},
            "ResponseMetadata": {"HTTPStatusCode": 400, "HTTPHeaders": {}, "RetryAttempts": 2},
        },
        "StartExecution",
    )
    lost = answer_lost(sfn, error=retried_throttle)
    later: Counter = Counter()

    def throttled(**_: Any) -> Any:
        if lost["lost"]:
            later["throttled"] += 1
            return error_answer("ThrottlingException", 400)
        return None

    sfn.meta.events.register("before-call.sfn.StartExecution", throttled)
    receipts = receipts_of(rt.client("sqs"))
    summary = rt.launcher().tick()
    assert lost["lost"] == 1 and later["throttled"] == 4 and summary.stopped == "transient"
    assert runs_on(stack, old) == [name] and stack.queue_counts() == (0, 1)
    assert rt.store().execution(name).state is PayloadState.CLAIMED
    rt2, machine, stale = switched(stack, landings)
    assert rt2.launcher().tick().received == 0
    stack.clock.advance(WINDOW + 1)
    stack.visible_again(receipts)
    assert rt2.launcher().tick().n(Outcome.RESUMED) == 1
    assert runs_on(stack, machine) == [] and stale["stale"] == 0 and stack.queue_counts() == (0, 0)


def test_the_batch_around_an_ambiguous_start_loses_blocks_and_leaks_nothing(session):
    """m1's start is ambiguous; m2 (its group) and n1 (another group) were received with it. m1
    stays away for the window; the rest goes back at once and nothing is lost: n1 starts at the
    next tick, m2 after m1 (FIFO), each once, and the slots held are the runs."""
    stack = build_stack(session, clock=FakeClock(), max_concurrency=3)
    landings = Landings()
    m1 = stack.send({"id": "m1"}, group="g0")
    m2 = stack.send({"id": "m2"}, group="g0")
    n1 = stack.send({"id": "n1"}, group="g1")
    rt = stack.runtime()
    sfn = rt.client("stepfunctions")
    record_landings(sfn, stack, landings)
    lost: Counter = Counter()
    first = execution_name("m1", m1)

    def lose_m1(http_response: Any, parsed: Any, **_: Any) -> None:
        if parsed.get("executionArn", "").endswith(f":{first}") and not lost["lost"]:
            lost["lost"] += 1
            raise ReadTimeoutError(endpoint_url=ENDPOINT)

    sfn.meta.events.register("after-call.sfn.StartExecution", lose_m1)
    receipts: dict[str, str] = {}
    rt.client("sqs").meta.events.register(
        "after-call.sqs.ReceiveMessage",
        lambda parsed, **_: receipts.update(
            (m["MessageId"], m["ReceiptHandle"]) for m in parsed.get("Messages", [])
        ),
    )
    ticks = [rt.launcher().tick()]
    assert lost["lost"] == 1 and ticks[0].stopped == "transient"
    stale = stale_describe(sfn, stack, landings)
    for _ in range(3):
        ticks.append(rt.launcher().tick())
    names = {execution_name(k, m) for k, m in (("m1", m1), ("m2", m2), ("n1", n1))}
    running = set(stack.running())
    assert execution_name("n1", n1) in running and execution_name("m2", m2) not in running
    assert stack.queue_counts() == (0, 2) or stack.queue_counts() == (1, 1)  # m1 away, m2 behind it
    stack.clock.advance(WINDOW + 1)
    stack.visible_again([receipts[m1]])
    for _ in range(3):
        ticks.append(rt.launcher().tick())
    assert set(stack.running()) == names and len(stack.executions()) == 3
    assert stack.queue_counts() == (0, 0) and stale["stale"] == 0
    assert set(rt.store().ledger().holders) == names  # no slot leaked, none freed under a run

"""A run redriven long after its release, read by a reconciliation whose DescribeExecution answer is
stale (explorer seed 818180473, swarm).

    e1 of k ABORTED, its event releases it                (t0)
    … more than the consistency window passes …
    operator: RedriveExecution(e1) → RUNNING again         (t1)
    tick: ListExecutions lists e1 RUNNING                  (fresh: t1 is after t0 + window)
          DescribeExecution(e1) → ABORTED, e1's own stop   (stale: from before the redrive)
          before: "ended; the listing is behind" → nothing adopted
          claim(n2 of k): the lease is free → StartExecution(n2): k runs twice (promise 2)

A listing taken the consistency window after the release cannot be behind the end its record
holds, so a RUNNING there is a run that ran again: the answer that says otherwise is the stale one,
and the run is adopted. Within the window of the release either answer may be the stale one:
nothing is adopted (a listing behind an end is common), and the key is marked for the run, which
holds its claims, not a slot, for the window of the mark.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from sluice.core.clock import FakeClock
from sluice.core.model import Outcome
from tests.integration.test_breaker_findings import deliver, redrive, running_of_key
from tests.support.aws import build_stack


def stale_describe(client: Any, name: str, record: Any) -> Counter:
    """DescribeExecution answers about ``name`` as it was before its redrive, once: the end its
    record holds (status and stop date)."""
    seen: Counter = Counter()

    def describe(parsed: dict[str, Any], **_: Any) -> None:
        if seen["described"] == 0 and parsed.get("name") == name and parsed.get("status") == "RUNNING":
            seen["described"] += 1
            parsed["status"] = record.state.value
            parsed["stopDate"] = parsed["startDate"].__class__.fromtimestamp(
                record.ended_at, parsed["startDate"].tzinfo
            )

    client.meta.events.register("after-call.sfn.DescribeExecution", describe)
    return seen


def test_a_run_redriven_long_after_its_release_is_adopted_despite_a_stale_describe(session):
    clock = FakeClock(time.time())  # Step Functions' stop dates are moto's, taken from the wall clock
    stack = build_stack(session, max_concurrency=3, clock=clock)
    stack.send({"id": "k", "n": 1}, group="a")
    stack.launcher().tick()
    (e1,) = stack.running()
    assert deliver(stack, stack.finish(e1, "ABORTED"))
    store = stack.runtime().store()
    assert store.payload("k").holder is None
    ended = store.execution(e1)

    clock.advance(1_000)
    redrive(stack, e1)
    stack.send({"id": "k", "n": 2}, group="b")
    rt = stack.runtime()
    stale = stale_describe(rt.client("stepfunctions"), e1, ended)
    rt.launcher().tick()

    assert stale == Counter(described=1)  # the stale answer was given
    assert running_of_key(stack, "k") == [e1], f"k runs {running_of_key(stack, 'k')}"
    assert store.payload("k").holder == e1  # adopted: its slot and its key's lease back
    assert e1 in store.ledger().holders


def test_a_run_listed_running_just_after_its_release_holds_its_key_for_the_window(session):
    """The common case: an end, its event, and a listing still behind it within the window.
    DescribeExecution says ended (fresh, but it could be stale after a redrive): reconciliation
    adopts nothing and marks the key. The key's next message, within the window of the mark, takes
    the run back (a slot) and is parked behind it as its duplicate; past the window the answers
    are fresh: the run is released on its end, which wakes the message, and it starts. The cost:
    a window of delay for that key, and a slot held meanwhile, only when a message of the key
    comes within the window."""
    clock = FakeClock(time.time())  # Step Functions' stop dates are moto's, taken from the wall clock
    stack = build_stack(session, max_concurrency=3, clock=clock)
    stack.send({"id": "k", "n": 1}, group="a")
    stack.launcher().tick()
    (e1,) = stack.running()
    assert deliver(stack, stack.finish(e1, "FAILED", error="Boom"))
    rt = stack.runtime()
    listed: Counter = Counter()

    def listing(parsed: dict[str, Any], **_: Any) -> None:
        if listed["listed"] == 0 and not any(e["name"] == e1 for e in parsed.get("executions", [])):
            listed["listed"] += 1
            parsed.setdefault("executions", []).append({"name": e1, "status": "RUNNING"})

    rt.client("stepfunctions").meta.events.register("after-call.sfn.ListExecutions", listing)
    clock.advance(5)
    stack.send({"id": "k", "n": 2}, group="b")
    summary = rt.launcher().tick()

    assert listed == Counter(listed=1)
    store = rt.store()
    assert running_of_key(stack, "k") == [] and summary.n(Outcome.DEFERRED) == 1  # parked behind e1
    assert store.payload("k").holder == e1  # held for e1, which may run again

    clock.advance(121)  # past the young adoption (two windows: the adopter's clock may be behind)
    stack.launcher().tick()  # reconciliation releases e1 on its end, which wakes the message
    (n2,) = running_of_key(stack, "k")
    assert n2 != e1 and store.payload("k").holder == n2 and store.ledger().holders == {n2}

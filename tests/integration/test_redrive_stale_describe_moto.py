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
and the run is adopted. Within the window of the release either answer may be the stale one, and
nothing is adopted (``test_stale_adoption_variants.py``: a listing behind an end is common).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from sluice.core.clock import FakeClock
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


def test_a_run_listed_running_just_after_its_release_is_not_adopted_on_an_ended_answer(session):
    """The common case the rule must leave alone: an end, its event, and a listing still behind it
    within the window. DescribeExecution says ended (fresh): nothing is adopted, and the key's next
    message starts."""
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
    rt.launcher().tick()

    assert listed == Counter(listed=1)
    store = rt.store()
    (n2,) = running_of_key(stack, "k")
    assert n2 != e1 and store.payload("k").holder == n2

"""A run its record says ended, listed RUNNING and described as missing (explorer seed 1204130804).

    a FAILED, its event releases it;  RedriveExecution(a): a runs again, unheld
    reconciliation: a listed RUNNING; DescribeExecution(a): no such execution (a view before a)
        before: "ended, the listing is behind" → a runs uncounted → c takes its slot: MAX + 1
        now:    unsure → a counts against MAX (its key held for it) → nothing new starts

The real launcher and reconciliation on moto; the stale answer through a botocore hook.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

import sluice.launch.redriven as redriven
from sluice.core.clock import FakeClock
from tests.integration.test_breaker_findings import deliver, redrive
from tests.support.aws import build_stack
from tests.support.hooks import error_answer


def described_missing(client: Any, name: str) -> Counter:
    """Every DescribeExecution of ``name`` answers "no such execution", as from a view older than it."""
    fired: Counter = Counter()

    def hook(params: dict[str, Any], **_: Any) -> Any:
        raw = params.get("body", b"")
        request = json.loads(raw.decode() if isinstance(raw, bytes) else raw or "{}")
        if request.get("executionArn", "").rsplit(":", 1)[-1] != name:
            return None
        fired["missing"] += 1
        return error_answer("ExecutionDoesNotExist", 400)

    client.meta.events.register("before-call.sfn.DescribeExecution", hook)
    return fired


def redriven_and_described_missing(session: Any) -> None:
    stack = build_stack(session, max_concurrency=2, clock=FakeClock())
    stack.send({"id": "a"}, group="a")
    stack.send({"id": "b"}, group="b")
    stack.launcher().tick()
    store = stack.runtime().store()
    (a,) = [n for n in stack.running() if store.execution(n).key == "a"]
    assert deliver(stack, stack.finish(a, "FAILED", error="Boom"))  # a's slot is free
    redrive(stack, a)  # behind Sluice's back: a runs again, holding nothing
    stack.send({"id": "c"}, group="c")

    rt = stack.runtime()
    missing = described_missing(rt.client("stepfunctions"), a)
    stack.clock.advance(1)
    rt.launcher().tick()  # reconciliation lists a RUNNING, asks, and hears "no such execution"

    assert missing["missing"] >= 1  # the stale answer was given
    assert len(stack.running()) == 2, f"running {sorted(stack.running())} under MAX 2"
    assert sum(stack.queue_counts()) == 1  # c waits for a slot


def test_a_redriven_run_described_as_missing_counts_against_max(session):
    redriven_and_described_missing(session)


def test_a_missing_run_taken_for_ended_is_caught(session, monkeypatch):
    """The code before the fix: "no such execution" read as "ended, the listing is behind"."""
    monkeypatch.setattr(
        redriven,
        "listed_again",
        lambda p, info, record: redriven.Rerun.ENDED if info is None else redriven.ran_again(p, info, record),
    )
    with pytest.raises(AssertionError, match="under MAX 2"):
        redriven_and_described_missing(session)

"""Statuses and states: a Step Functions status is not a payload state."""

from __future__ import annotations

import dataclasses

import pytest

from sluice.core.model import (
    QUEUE_RETENTION_SECONDS,
    REDRIVE_WINDOW_SECONDS,
    ExecutionStatus,
    PayloadState,
    record_expiry,
)


def test_only_the_four_end_statuses_are_terminal():
    ended = {s for s in ExecutionStatus if ExecutionStatus.terminal(s)}
    assert ended == {"SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"}
    assert not ExecutionStatus.terminal("RUNNING")
    assert not ExecutionStatus.terminal("PENDING_REDRIVE")
    assert not ExecutionStatus.terminal("SOMETHING_NEW")  # an unknown status is not an end


def test_a_payload_ends_in_the_state_of_its_executions_end():
    assert PayloadState.after("TIMED_OUT") is PayloadState.TIMED_OUT
    for status in ("RUNNING", "PENDING_REDRIVE", "", "CLAIMED"):
        with pytest.raises(ValueError, match="not a status an execution ends with"):
            PayloadState.after(status)
    assert {s for s in PayloadState if s.ended} == {
        PayloadState.after(s) for s in ExecutionStatus if ExecutionStatus.terminal(s)
    }


def test_a_redrivable_end_is_kept_past_the_redrive_window():
    day = 86_400
    assert record_expiry(PayloadState.RELEASED, now=1_000, retention_seconds=day) == 1_000 + day
    for state in (PayloadState.FAILED, PayloadState.TIMED_OUT, PayloadState.ABORTED):
        assert record_expiry(state, now=1_000, retention_seconds=day) == 1_000 + REDRIVE_WINDOW_SECONDS + day
        assert record_expiry(state, now=1_000, retention_seconds=90 * day) == 1_000 + 90 * day


def test_a_limit_source_merges_the_newer_max_and_the_newer_count_each_on_its_own():
    from sluice.core.limits import LimitSource

    operator = LimitSource(2, 200.0, external=0, count=4, max_version=8)
    launcher = LimitSource(5, 100.0, external=1, count=5, max_version=7)  # cached MAX, newer count
    merged = launcher.merged(operator)
    assert (merged.max_value, merged.external, merged.count, merged.limit) == (2, 1, 5, 1)
    assert operator.merged(launcher) == merged
    # A pool's stamp keeps no listing's start: read back, it is unknown (0), never "at its count".
    assert LimitSource.from_stamp(merged.stamp()) == dataclasses.replace(merged, listed_after=0)
    # Two changes of the parameter within one millisecond: its version orders them.
    same_ms = LimitSource(3, 200.0, max_version=9)
    assert operator.merged(same_ms).max_value == 3 and same_ms.merged(operator).max_value == 3
    # The deployed default (no parameter): unfenced, taken as it is.
    default = LimitSource(7, None)
    assert default.merged(operator) == default and default.stamp() == ()


def test_a_name_that_ran_is_kept_past_the_queues_retention():
    """A message lives 14 days in the queue: the record of a name that ran (ended, or released as
    vanished) outlives it, so the message back is refused as already ran whatever the retention."""
    day = 86_400
    kept = QUEUE_RETENTION_SECONDS + day
    assert record_expiry(PayloadState.SUCCEEDED, now=1_000, retention_seconds=day) == 1_000 + kept
    assert record_expiry(PayloadState.RELEASED, now=1_000, retention_seconds=day, ran=True) == 1_000 + kept
    assert record_expiry(PayloadState.SUCCEEDED, now=1_000, retention_seconds=90 * day) == 1_000 + 90 * day

"""Statuses and states: a Step Functions status is not a payload state."""

from __future__ import annotations

import pytest

from sluice.model import REDRIVE_WINDOW_SECONDS, ExecutionStatus, PayloadState, record_expiry


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
    assert record_expiry(PayloadState.SUCCEEDED, now=1_000, retention_seconds=day) == 1_000 + day
    assert record_expiry(PayloadState.RELEASED, now=1_000, retention_seconds=day) == 1_000 + day
    for state in (PayloadState.FAILED, PayloadState.TIMED_OUT, PayloadState.ABORTED):
        assert record_expiry(state, now=1_000, retention_seconds=day) == 1_000 + REDRIVE_WINDOW_SECONDS + day
        assert record_expiry(state, now=1_000, retention_seconds=90 * day) == 1_000 + 90 * day

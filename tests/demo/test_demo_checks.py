"""The demo's DAG check follows the protocol at any MAX and batch size (issue 27, item 2).

A dependent whose awaits had all SUCCEEDED when the launcher received it is never parked
(docs/protocol.md, Awaits): the demo must not call that a failure. The demo's flow is played in
lockstep on moto with the real launcher and completion: the batch, then the DAG's three commands
one round apart, each round a tick and the end (SUCCEEDED, its status event delivered) of every
execution running at its start. Whether ``dag-merge`` finds its awaits met depends on MAX and the
batch, as in the demo; the check must pass either way, and from what Step Functions and the table
say.
"""

from __future__ import annotations

import json
import time

import pytest

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.local import chart, demo_dag, demo_rate
from sluice.local.dashboard import Snapshot, plain_line
from sluice.local.demo_batch import Sent
from sluice.local.demo_report import Result, summary_lines
from tests.support.aws import build_stack

# (MAX, batch size, schedule periods between two commands): the issue's --max 3 --count 20 and a few
# small ones on either side; commands one period apart, or sent before the next tick.
CASES = [(1, 2, 1), (2, 5, 1), (3, 20, 1), (10, 4, 0), (10, 4, 1)]


def play_round(stack) -> None:
    """One schedule period: a tick, then every execution that ran at its start ends SUCCEEDED and
    its status event is delivered to the completion (which refills the slot it frees)."""
    stack.launcher().tick()
    for name in stack.running():
        stack.launcher().on_status_change(StatusChange.from_event(stack.finish(name)))


def play_demo(stack, count: int, gap: int) -> tuple[list[Sent], float]:
    """The batch, then ``sluice enqueue`` of the DAG's three steps one round apart, until idle."""
    started = time.time()
    for i in range(count):
        stack.send({"id": f"order-{i:04d}", "seconds": 1}, group=f"customer-{i % 8}")
    play_round(stack)
    sent: list[Sent] = []
    steps = [[k for k, a in demo_dag.DAG if not a], *[[k] for k, a in demo_dag.DAG if a]]
    for keys in steps:
        for key in keys:
            awaits = dict(demo_dag.DAG)[key]
            attributes = {"sluice_awaits": json.dumps(list(awaits))} if awaits else {}
            message_id = stack.send({"id": key, "seconds": 1}, group=key, **attributes)
            sent.append(Sent("sluice enqueue", message_id, key, key, False, False))
        for _ in range(gap):
            play_round(stack)
    for _ in range(count + 20):
        if not stack.running() and stack.queue_counts() == (0, 0):
            break
        play_round(stack)
    return sent, started


@pytest.mark.parametrize(
    ("maximum", "count", "gap"), CASES, ids=[f"max{m}-count{c}-gap{g}" for m, c, g in CASES]
)
def test_item2_the_dag_check_holds_whether_or_not_a_dependent_was_parked(session, maximum, count, gap):
    stack = build_stack(session, max_concurrency=maximum, clock=FakeClock(time.time()))
    sent, started = play_demo(stack, count, gap)
    sfn = stack.client("stepfunctions")
    store = stack.runtime().store()

    r = demo_dag.check_dag(sfn, store, stack.settings.state_machine_arn, sent, started)

    assert r.problems == [] and r.violations == []
    nodes = {n.key: n for n in r.nodes}
    assert set(nodes) == {k for k, _ in demo_dag.DAG}
    for key, awaits in demo_dag.DAG:
        node = nodes[key]
        assert node.status == "SUCCEEDED"
        assert all(nodes[a].stop <= node.start for a in awaits)
        assert not node.parked or awaits  # only a dependent is ever parked
    # What the summary says of each dependent agrees with the table.
    text = "\n".join(demo_dag.summary_lines(r))
    assert "VIOLATED" not in text
    for key, awaits in demo_dag.DAG:
        if awaits and not nodes[key].parked:
            assert f"{key}: its awaits were met on arrival, never parked" in text
    parked = sum(n.parked for n in r.nodes)
    assert f"{parked} of 2 dependents parked until their awaits SUCCEEDED" in text


def test_item2_a_dependent_that_started_before_its_awaits_ended_is_a_violation(session):
    stack = build_stack(session, max_concurrency=10, clock=FakeClock(time.time()))
    started = time.time()
    sent = []
    for key, _ in demo_dag.DAG:  # sent with no awaits: everything starts at once
        message_id = stack.send({"id": key}, group=key)
        sent.append(Sent("sluice enqueue", message_id, key, key, False, False))
    stack.launcher().tick()
    for name in stack.running():
        stack.launcher().on_status_change(StatusChange.from_event(stack.finish(name)))

    r = demo_dag.check_dag(
        stack.client("stepfunctions"),
        stack.runtime().store(),
        stack.settings.state_machine_arn,
        sent,
        started,
    )

    assert r.violations == ["dag-merge", "dag-publish"]
    assert any(p.startswith("started before what it awaits SUCCEEDED") for p in r.problems)
    assert "VIOLATED" in "\n".join(demo_dag.summary_lines(r))


# -- the demo's output (issue 27, item 6) ----------------------------------------------------------


def test_item6_the_last_progress_line_and_the_summary_count_the_same_messages():
    """The progress line counts from AWS's side as the summary does: executions listed by Step
    Functions, duplicates, the DLQ; every message sent (the batch and `sluice enqueue`'s) settled."""
    snapshot = Snapshot(
        stack="sluice-demo",
        maximum=10,
        batch=60,
        extra=16,
        statuses={"SUCCEEDED": 66, "FAILED": 7},
        counts={"started": 70, "duplicate": 2, "invalid": 1},  # the handlers' own counts miss 3 starts
        dlq=1,
    )
    result = Result(
        ok=True,
        maximum=10,
        messages=60,
        raw_messages=1,
        fates={"started": 57, "duplicate": 2, "invalid": 1},
        statuses={"SUCCEEDED": 66, "FAILED": 7},
        also_messages=16,
        also_started=16,
    )

    line = plain_line(snapshot)
    summary = "\n".join(summary_lines(result))

    assert "executions 73 started, 66 succeeded, 7 failed" in line
    assert line.endswith("settled 76/76 messages (60 batch + 16 by sluice enqueue)")
    assert "executions  : 73 started: 57 for the batch's messages + 16 for `sluice enqueue`'s" in summary
    assert (
        "accounted   : 76 / 76 messages settled (started, suppressed as a duplicate or dead-lettered)"
        in summary
    )
    assert "the batch's 60 / 60, 0 lost; `sluice enqueue`'s 16 / 16" in summary


def test_item6_the_chart_legend_leaves_the_plot_clear_and_the_running_line_is_on_top(tmp_path):
    intervals = [(0.0, 3.0), (0.5, 2.5), (1.0, 4.0), (2.0, 5.0)]
    lanes = {"default": (intervals[:3], 4), "urgent": (intervals[3:], 2)}
    fig = chart.figure(
        intervals=intervals,
        samples=[(0.5, 2), (1.5, 3)],
        waiting=[(0.0, 5), (2.0, 1)],
        maximum=4,
        title="demo",
        lanes=lanes,
    )
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        plot = fig.axes[0]
        legends = [*fig.legends, *(a.get_legend() for a in fig.axes if a.get_legend() is not None)]
        assert len(legends) == 1
        box, area = legends[0].get_window_extent(renderer), plot.get_window_extent(renderer)
        assert not box.overlaps(area), "the legend covers the plot"
        lines = {line.get_label(): line for line in plot.get_lines()}
        running = lines["running (start/stop times)"]
        for lane in ("default", "urgent"):
            own = lines[f"running in lane {lane}"]
            assert running.get_zorder() > own.get_zorder()
            assert (running.get_linewidth(), running.get_color()) != (own.get_linewidth(), own.get_color())
            assert running.get_linewidth() > own.get_linewidth()
            assert own.get_linestyle() != running.get_linestyle()
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    path = chart.draw(
        tmp_path / "chart.png",
        intervals=intervals,
        samples=[],
        waiting=[],
        maximum=4,
        title="demo",
        lanes=lanes,
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_rate_panel_draws_each_periods_starts_against_the_rate_below_the_running_plot(tmp_path):
    starts = [0.2, 0.9, 1.5, 3.0, 3.1, 3.9]
    assert chart.per_period(starts, 1) == [(0, 2), (1, 1), (2, 0), (3, 3)]
    assert demo_rate.most_in_window(starts, 1) == 3  # [3.0, 3.9]
    assert demo_rate.most_in_window([0.0, 1.0, 2.0], 1) == 1  # a window is [t, t + P)
    rate = chart.RatePanel("lane api", 1, 1, "1/second", starts)
    intervals = [(t, t + 2) for t in starts]
    fig = chart.figure(
        intervals=intervals, samples=[], waiting=[(0.0, 3)], maximum=4, title="demo", rate=rate
    )
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        plot, under = fig.axes[0], fig.axes[1]
        assert under.get_window_extent(renderer).y1 < plot.get_window_extent(renderer).y0
        heights = [bar.get_height() for bar in under.patches]
        assert heights == [2, 1, 0, 3]
        assert [line.get_ydata()[0] for line in under.get_lines()] == [1]  # the rate's N
        (legend,) = fig.legends
        box = legend.get_window_extent(renderer)
        for area in (plot, under):
            assert not box.overlaps(area.get_window_extent(renderer)), "the legend covers a plot"
        assert "lane api rate: 1/second" in [t.get_text() for t in legend.get_texts()]
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)

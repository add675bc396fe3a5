"""The demo's chart: running executions over time against MAX (matplotlib, no display needed); below
it, a rated scope's starts per period against its rate."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LANE_COLOURS = ("#2ca02c", "#9467bd", "#8c564b", "#e377c2")


@dataclass(frozen=True)
class RatePanel:
    """A scope under a rate: its name, the rate's N per ``period`` seconds (``label``: ``1/second``)
    and its start times (seconds since the batch was enqueued)."""

    scope: str
    count: int
    period: int
    label: str
    starts: Sequence[float]


def per_period(starts: Sequence[float], period: float) -> list[tuple[float, int]]:
    """(window start, starts in [window start, + period)) for every window from 0 to the last start."""
    if not starts:
        return []
    counts = [0] * (math.floor(max(starts) / period) + 1)
    for t in starts:
        counts[max(0, math.floor(t / period))] += 1
    return [(i * period, n) for i, n in enumerate(counts)]


def running_steps(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, int]]:
    """(time, running from then on) from (start, stop) pairs. At equal times a stop counts before a
    start: a slot is refilled only after the execution that held it ended."""
    changes = sorted([(stop, -1) for _, stop in intervals] + [(start, +1) for start, _ in intervals])
    steps: list[tuple[float, int]] = []
    running = 0
    for t, delta in changes:
        running += delta
        if steps and steps[-1][0] == t:
            steps[-1] = (t, running)
        else:
            steps.append((t, running))
    return steps


def peak(intervals: Sequence[tuple[float, float]]) -> int:
    return max((n for _, n in running_steps(intervals)), default=0)


def draw(
    path: Path,
    *,
    intervals: Sequence[tuple[float, float]],
    samples: Sequence[tuple[float, int]],
    waiting: Sequence[tuple[float, int]],
    maximum: int,
    title: str,
    lanes: Mapping[str, tuple[Sequence[tuple[float, float]], int]] | None = None,
    rate: RatePanel | None = None,
) -> Path:
    """Write the PNG of ``figure``."""
    import matplotlib.pyplot as plt

    fig = figure(
        intervals=intervals,
        samples=samples,
        waiting=waiting,
        maximum=maximum,
        title=title,
        lanes=lanes,
        rate=rate,
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path


def figure(
    *,
    intervals: Sequence[tuple[float, float]],
    samples: Sequence[tuple[float, int]],
    waiting: Sequence[tuple[float, int]],
    maximum: int,
    title: str,
    lanes: Mapping[str, tuple[Sequence[tuple[float, float]], int]] | None = None,
    rate: RatePanel | None = None,
) -> Any:
    """The chart: the exact running count from start/stop times (a thick step line, drawn over
    everything else), the ListExecutions samples (dots), MAX (dashed) and the queue backlog (right
    axis); with ``lanes`` (name → the lane's (start, stop) pairs and its MAX), each lane's running
    count (thin, dash-dotted) and its MAX (dotted); with ``rate``, a panel below: the scope's starts
    in each period (bars) against its rate (dashed). The legend sits below the plot, never on it.
    The caller closes the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if rate is None:
        fig, ax = plt.subplots(figsize=(10, 5.6), dpi=110)
        under = None
    else:
        fig, (ax, under) = plt.subplots(
            2, 1, figsize=(10, 7.4), dpi=110, sharex=True, gridspec_kw={"height_ratios": (3, 1)}
        )
    _running(ax, intervals, samples, maximum)
    _lanes(ax, lanes or {}, maximum)
    ax.set_ylim(0, maximum * 1.15 + 1)
    ax.set_xlim(left=0)
    (ax if under is None else under).set_xlabel("seconds since the batch was enqueued")
    ax.set_ylabel("running executions")
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=11)
    handles, labels = ax.get_legend_handles_labels()
    if waiting:
        more, more_labels = _backlog(ax, waiting)
        handles, labels = handles + more, labels + more_labels
    if under is not None and rate is not None:
        more, more_labels = _rate(under, rate)
        handles, labels = handles + more, labels + more_labels
    rows = -(-len(handles) // 3)
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.045 * rows + 0.02, 1, 1))
    return fig


def _running(
    ax: Any, intervals: Sequence[tuple[float, float]], samples: Sequence[tuple[float, int]], maximum: int
) -> None:
    """The running count from start/stop times, the samples, and MAX."""
    steps = running_steps(intervals)
    if steps:
        xs = [0.0] + [t for t, _ in steps]
        ys = [0] + [n for _, n in steps]
        ax.step(
            xs,
            ys,
            where="post",
            color="#1f4e8c",
            linewidth=2.2,
            zorder=5,
            label="running (start/stop times)",
        )
        ax.fill_between(xs, ys, step="post", color="#1f6fb4", alpha=0.12, zorder=1)
    if samples:
        ax.scatter(
            [t for t, _ in samples],
            [n for _, n in samples],
            s=9,
            color="#f28e2b",
            zorder=6,
            label="running (ListExecutions samples)",
        )
    ax.axhline(maximum, color="#d62728", linestyle="--", linewidth=1.4, zorder=4, label=f"MAX = {maximum}")


def _lanes(ax: Any, lanes: Mapping[str, tuple[Sequence[tuple[float, float]], int]], maximum: int) -> None:
    """Each lane's running count and, when below the global one, its MAX."""
    for (lane, (spans, lane_max)), colour in zip(sorted(lanes.items()), LANE_COLOURS, strict=False):
        lane_steps = running_steps(spans)
        if lane_steps:
            ax.step(
                [0.0] + [t for t, _ in lane_steps],
                [0] + [n for _, n in lane_steps],
                where="post",
                color=colour,
                linewidth=1.1,
                linestyle="-.",
                zorder=3,
                label=f"running in lane {lane}",
            )
        if lane_max < maximum:  # a lane's MAX at the global one would hide it
            ax.axhline(
                lane_max,
                color=colour,
                linestyle=":",
                linewidth=1.2,
                zorder=3,
                label=f"lane {lane} MAX = {lane_max}",
            )


def _rate(ax: Any, rate: RatePanel) -> tuple[list[Any], list[str]]:
    """The scope's starts in each period (bars) and its rate's N (dashed); its legend entries."""
    bars = per_period(rate.starts, rate.period)
    ax.bar(
        [t for t, _ in bars],
        [n for _, n in bars],
        width=rate.period * 0.85,
        align="edge",
        color="#17becf",
        alpha=0.75,
        label=f"starts in {rate.scope} per {rate.period} s (Step Functions' times)",
    )
    ax.axhline(
        rate.count, color="#d62728", linestyle="--", linewidth=1.2, label=f"{rate.scope} rate: {rate.label}"
    )
    ax.set_ylim(0, max([rate.count, *(n for _, n in bars)]) * 1.6 + 0.5)
    ax.set_ylabel(f"starts per {rate.period} s")
    ax.grid(alpha=0.3)
    return ax.get_legend_handles_labels()


def _backlog(ax: Any, waiting: Sequence[tuple[float, int]]) -> tuple[list[Any], list[str]]:
    """The queue backlog on a right axis, under the running line; its legend entries."""
    backlog = ax.twinx()
    backlog.plot(
        [t for t, _ in waiting],
        [n for _, n in waiting],
        color="#7f7f7f",
        linewidth=1.1,
        linestyle=":",
        label="messages waiting in the queue",
    )
    backlog.set_ylabel("messages waiting", color="#7f7f7f")
    backlog.tick_params(axis="y", colors="#7f7f7f")
    backlog.set_ylim(bottom=0)
    ax.set_zorder(backlog.get_zorder() + 1)  # the running line over the backlog's axis
    ax.patch.set_visible(False)
    return backlog.get_legend_handles_labels()

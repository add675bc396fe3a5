"""The demo's live view: a rich panel on a terminal, one plain line every few seconds otherwise."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

SPARKS = "▁▂▃▄▅▆▇█"


@dataclass
class Snapshot:
    """What the dashboard shows; the demo fills it in as it goes. Executions and the DLQ are counted
    from AWS's side (ListExecutions, the queue's attributes), as the final reckoning counts them."""

    stack: str = ""
    endpoint: str = ""
    maximum: int = 0
    batch: int = 0  # messages of the batch
    extra: int = 0  # messages `sluice enqueue` sends after it (the DAG, the stored payload, ...)
    elapsed: float = 0.0
    running: int = 0  # RUNNING executions in the last ListExecutions
    peak: int = 0
    waiting: int = 0  # visible messages in the queue
    in_flight: int = 0
    dlq: int = 0  # messages in the dead-letter queue
    statuses: dict[str, int] = field(default_factory=dict)  # executions listed, by status
    counts: dict[str, int] = field(default_factory=dict)  # what the handlers returned: duplicate, ...
    events: int = 0  # status-change events delivered
    repeated: int = 0  # events delivered a second time on purpose
    repeated_released: int = 0  # slots those freed (must stay 0)
    history: list[int] = field(default_factory=list)  # running, one value per sample

    def n(self, name: str) -> int:
        return self.counts.get(name, 0)

    def status(self, name: str) -> int:
        return self.statuses.get(name, 0)

    @property
    def messages(self) -> int:
        return self.batch + self.extra

    @property
    def started(self) -> int:
        """Executions Step Functions lists: one per message that started."""
        return sum(self.statuses.values())

    @property
    def ended(self) -> int:
        return self.started - self.status("RUNNING")

    @property
    def settled(self) -> int:
        """Messages whose fate is known: started, suppressed as a duplicate, or dead-lettered."""
        return self.started + self.n("duplicate") + self.dlq


def sparkline(values: list[int], top: int, width: int = 48) -> str:
    if not values:
        return ""
    step = max(1, len(values) // width)
    picked = [max(values[i : i + step]) for i in range(0, len(values), step)][-width:]
    top = max(top, 1)
    return "".join(SPARKS[min(len(SPARKS) - 1, round(v / top * (len(SPARKS) - 1)))] for v in picked)


def plain_line(s: Snapshot) -> str:
    return (
        f"[{s.elapsed:6.1f}s] running {s.running:>3}/{s.maximum} (peak {s.peak}) | "
        f"queue {s.waiting} waiting, {s.in_flight} in flight | dlq {s.dlq} | "
        f"executions {s.started} started, {s.status('SUCCEEDED')} succeeded, {s.status('FAILED')} failed | "
        f"duplicates {s.n('duplicate')} | settled {s.settled}/{s.messages} messages "
        f"({s.batch} batch + {s.extra} by sluice enqueue)"
    )


def render(s: Snapshot) -> Any:
    from rich.console import Group
    from rich.panel import Panel
    from rich.text import Text

    over = s.running > s.maximum or s.peak > s.maximum
    queues = Text.assemble(
        ("Queue ", "bold"),
        f"{s.waiting} waiting, {s.in_flight} in flight      ",
        ("DLQ ", "bold"),
        (str(s.dlq), "yellow" if s.dlq else ""),
    )
    events = Text(f"status events delivered {s.events}")
    if s.repeated:
        events.append(
            f"   (+{s.repeated} repeated on purpose: released {s.repeated_released})",
            style="red" if s.repeated_released else "dim",
        )
    history = Text.assemble(("Running over time  ", "bold"), (sparkline(s.history, s.maximum), "cyan"))
    return Panel(
        Group(_gauge(s, over), Text(""), queues, Text(""), _counts(s), Text(""), events, history),
        title=f"Sluice demo · stack {s.stack} on {s.endpoint} · {s.elapsed:.1f} s",
        title_align="left",
        border_style="red" if over else "blue",
    )


def _gauge(s: Snapshot, over: bool) -> Any:
    """Three bars: running against MAX, messages settled, executions finished."""
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    gauge = Table.grid(padding=(0, 2))
    gauge.add_column(width=10, style="bold")
    gauge.add_column(width=40)
    gauge.add_column()
    gauge.add_row(
        "Running",
        ProgressBar(
            total=max(s.maximum, 1),
            completed=min(s.running, s.maximum),
            width=40,
            complete_style="red" if over else "green",
            finished_style="red" if over else "bright_green",
        ),
        Text.assemble(
            (f"{s.running:>3} / MAX {s.maximum}", "bold red" if over else "bold"),
            f"   peak {s.peak}",
            (" EXCEEDED" if over else "", "bold red"),
        ),
    )
    gauge.add_row(
        "Settled",
        ProgressBar(total=max(s.messages, 1), completed=s.settled, width=40),
        f"{s.settled:>3} / {s.messages} messages ({s.batch} + {s.extra})",
    )
    gauge.add_row(
        "Finished",
        ProgressBar(total=max(s.started, 1), completed=s.ended, width=40),
        f"{s.ended:>3} / {s.started} executions",
    )
    return gauge


def _counts(s: Snapshot) -> Any:
    from rich.table import Table

    counts = Table(box=None, padding=(0, 2), show_edge=False)
    for title, style in (
        ("started", "cyan"),
        ("succeeded", "green"),
        ("failed", "red"),
        ("duplicate", "magenta"),
        ("dead-lettered", "yellow"),
    ):
        counts.add_column(title, justify="right", header_style=f"bold {style}")
    counts.add_row(*map(str, (s.started, s.status("SUCCEEDED"), s.status("FAILED"), s.n("duplicate"), s.dlq)))
    return counts


class Dashboard:
    """``update`` often; on a terminal it redraws, elsewhere it prints a line every ``every`` seconds."""

    def __init__(self, console: Any, *, live: bool, every: float = 2.0) -> None:
        self.console = console
        self.live_mode = live
        self.every = every
        self._live: Any = None
        self._last = 0.0

    def __enter__(self) -> Dashboard:
        if self.live_mode:
            from rich.live import Live

            self._live = Live(
                console=self.console,
                refresh_per_second=4,
                transient=False,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def update(self, snapshot: Snapshot, *, force: bool = False) -> None:
        if self._live is not None:
            self._live.update(render(snapshot))
            return
        now = time.monotonic()
        if force or now - self._last >= self.every:
            self._last = now
            print(plain_line(snapshot), flush=True)

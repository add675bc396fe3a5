"""Exit codes and what the commands print: tables for people, a progress bar for long enqueues."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

EXIT_OK, EXIT_PARTIAL, EXIT_CONFIG, EXIT_AWS = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT
EXIT_PIPE = 141  # standard output's reader went away (`| head`), as shells report SIGPIPE


def usage(message: str) -> int:
    print(f"sluice: {message}", file=sys.stderr)
    return EXIT_CONFIG


def in_force(result: dict[str, object]) -> str:
    """What ``apply_max`` put in force, for set-max, pause and resume."""
    outside = f", MAX less {result['external']} running outside Sluice" if result.get("external") else ""
    if result.get("contended"):
        return (
            f"Not in force yet: the slot pool kept changing, and {plural(result['limit'] or 0, 'slot')} for Sluice"
            " stay in force (a completion may still refill one) until the next launcher tick puts it there."
        )
    return f"In force now: the next start obeys it ({plural(result['limit'], 'slot')} for Sluice{outside})."


def lane_max(state: dict[str, Any]) -> str:
    """A lane's MAX as set (``sluice.ops.lanes.describe``): ``MAX 3 (set at run time; configured 2)``,
    ``PAUSED (MAX 2 on resume; configured)``."""
    own = state["max"] is not None
    value = state["max"] if own else state["configured_max"]
    origin = f"set at run time; configured {state['configured_max']}" if own else "configured"
    if state["paused"]:
        return f"PAUSED (MAX {value} on resume; {origin})"
    return f"MAX {value} ({origin})"


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def until_fewer(limit: int, verb: str = "run") -> str:
    """When a start is allowed again over a lowered limit: ``until fewer than 3 run``, ``until none
    runs`` (a limit of 1)."""
    return "until none " + verb + "s" if limit <= 1 else f"until fewer than {limit} {verb}"


def table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows) + 2
    return "\n".join(f"{k:<{width}}{v}" for k, v in rows)


def when(ts: float | int | None) -> str:
    if not ts:
        return "-"
    return datetime.fromtimestamp(float(ts), UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def preview(text: str, width: int) -> str:
    flat = text.replace("\n", "\\n")
    return flat if len(flat) <= width else flat[: width - 1] + "…"


class progress_bar:
    """A progress bar on standard error for long enqueues; nothing when quiet or not a terminal."""

    def __init__(self, total: int, *, quiet: bool) -> None:
        self.total = total
        self.quiet = quiet or not sys.stderr.isatty()
        self.bar: Any = None

    def __enter__(self) -> Callable[[int], None] | None:
        if self.quiet:
            return None
        try:
            from rich.console import Console
            from rich.progress import Progress
        except ImportError:
            return None
        self.bar = Progress(console=Console(stderr=True), transient=True)
        task = self.bar.add_task("enqueue", total=self.total)
        self.bar.start()
        return lambda n: self.bar.advance(task, n)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

"""The options of ``make demo`` (``python -m sluice.local.demo``), read by its run loop and its
reckoning too."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Options:
    maximum: int = 10
    count: int = 200
    payloads: Path | None = None
    seed: int = 7
    out: Path = Path("demo-out")
    tick: float = 2.0  # how often the demo fires the launcher's schedule rule
    workers: int = 4  # completion invocations at once (Lambda containers)
    poll: float = 0.25  # how often it looks for ended executions
    timeout: float = 300.0  # gives up (and fails) after this long in the run loop
    live: bool | None = None  # None: live dashboard when stdout is a terminal
    keep: bool = False  # keep the embedded AWS up after the summary, for the operator CLI

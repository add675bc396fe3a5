"""Clocks. Domain code takes time from a ``Clock``; tests move a ``FakeClock`` by hand."""

from __future__ import annotations

import time
from dataclasses import dataclass


class SystemClock:
    def now(self) -> float:
        return time.time()


@dataclass
class FakeClock:
    t: float = 1_800_000_000.0

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def sleep(self, seconds: float) -> None:
        """Inject as ``sleep``: time passes, nothing waits."""
        self.t += seconds

"""Clocks. Domain code takes time from a ``Clock``; tests move a ``FakeClock`` by hand.

A clock's ``identity`` names the machine whose time it reads. An age stamped by one clock is judged
only by a clock of the same identity (an unstarted claim's mark, an adoption): no two machines'
clocks are compared to decide a release, whatever their skew (docs/protocol.md, "Clocks")."""

from __future__ import annotations

import itertools
import time
import uuid
from dataclasses import dataclass, field

# This process's: a Lambda container is one process, one clock. A snapshot restored in many
# containers (Lambda SnapStart, which the stack does not enable) would share it.
MACHINE = uuid.uuid4().hex[:16]
_fakes = itertools.count(1)


class SystemClock:
    identity = MACHINE

    def now(self) -> float:
        return time.time()


@dataclass
class FakeClock:
    """A machine's clock in tests: each one made is another machine's."""

    t: float = 1_800_000_000.0
    identity: str = field(default_factory=lambda: f"fake-{next(_fakes)}", compare=False)

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def sleep(self, seconds: float) -> None:
        """Inject as ``sleep``: time passes, nothing waits."""
        self.t += seconds

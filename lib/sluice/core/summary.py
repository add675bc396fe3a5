"""What one tick or completion did: the figures the handlers return, log and emit as metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.core.limits import Ledger
from sluice.core.model import Outcome


@dataclass(slots=True)
class TickSummary:
    """What one tick did. Returned by the handlers and logged."""

    max_concurrency: int | None = None  # MAX as read by a tick; None for a completion's refill (reads none)
    limit: int = 0  # the slots in force (the caps)
    running_before: int = 0
    running_after: int = 0
    received: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    reconciled: bool = False
    released_by_reconcile: int = 0
    drift: int | None = None
    stopped: str = (
        ""  # why the loop ended: full, empty, paused, time, transient, contended, or the gate's name ("rate")
    )
    counted: bool = True  # limit and running were read (a completion's hand-over reads neither)
    lanes: dict[str, dict[str, int]] = field(default_factory=dict)  # per lane: received, started

    def saw(self, ledger: Ledger, *, first: bool) -> None:
        """The pool as read: the limit in force and the holders (also as before, on the first read)."""
        self.limit, self.running_after, self.counted = ledger.in_force or 0, ledger.running, ledger.counted
        if first:
            self.running_before = ledger.running

    def add_lane(self, lane: str, part: TickSummary) -> None:
        """Fold one lane's admission into this summary (``sluice.features.lanes``)."""
        counts = self.lanes.setdefault(lane, {"received": 0, "started": 0})
        counts["received"] += part.received
        counts["started"] += part.n(Outcome.STARTED)
        self.received += part.received
        for outcome, n in part.outcomes.items():
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + n
        self.max_concurrency = (
            part.max_concurrency if part.max_concurrency is not None else self.max_concurrency
        )
        self.limit = part.limit
        self.running_after = part.running_after

    def count(self, outcome: Outcome) -> None:
        self.outcomes[outcome.value] = self.outcomes.get(outcome.value, 0) + 1

    def n(self, outcome: Outcome) -> int:
        return self.outcomes.get(outcome.value, 0)

    @property
    def all_started(self) -> bool:
        """Every message received started (or none was received): each start's own line tells it all."""
        return self.received == self.n(Outcome.STARTED)

    @property
    def free_after(self) -> int:
        return max(0, self.limit - self.running_after)

    def as_dict(self) -> dict[str, object]:
        """What the handlers return and log; the slots' figures are None when none was read."""
        known = self.counted
        return {
            "max": self.max_concurrency,
            "limit": self.limit if known else None,
            "running_before": self.running_before if known else None,
            "running": self.running_after if known else None,
            "free_slots": self.free_after if known else None,
            "received": self.received,
            **{o.value: self.n(o) for o in Outcome},
            "reconciled": self.reconciled,
            "released_by_reconcile": self.released_by_reconcile,
            "drift": self.drift,
            "stopped": self.stopped,
            **({"lanes": self.lanes} if self.lanes else {}),
        }

"""What waits parked in the table, per lane, for ``sluice status``.

Three waiting rooms hold payloads whose message was deleted from the queue: the concurrency keys'
lines (``sluice.features.keys``, fair lanes' tenants included), deferred duplicates (``sluice.features.parking``) and
awaits waiters (``sluice.features.awaits``). Each parked message keeps the ``sluice-lane`` attribute stamped
at its receive, which names the queue it goes back to; a message without one is the default lane's.
The count reads each room's index and at most ``SCAN`` of its entries (a key's line, a holder's
parked set, a waiter): beyond that it is a lower bound, and says so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sluice.features.lanes import DEFAULT_LANE, LANE_ATTRIBUTE

SCAN = 100  # index entries read per waiting room; a larger room is counted in part


@dataclass(frozen=True, slots=True)
class ParkedCount:
    """Payloads parked per lane, by waiting room; ``partial``: some room held more than ``SCAN``."""

    lines: Counter[str] = field(default_factory=Counter)
    deferred: Counter[str] = field(default_factory=Counter)
    awaiting: Counter[str] = field(default_factory=Counter)
    partial: bool = False

    def of(self, lane: str) -> dict[str, int]:
        return {
            "in_key_lines": self.lines[lane],
            "deferred": self.deferred[lane],
            "awaiting": self.awaiting[lane],
            "total": self.lines[lane] + self.deferred[lane] + self.awaiting[lane],
        }


def lane_of(attributes: Mapping[str, str]) -> str:
    return attributes.get(LANE_ATTRIBUTE) or DEFAULT_LANE


def parked_by_lane(store: Any) -> ParkedCount:
    """Read the three waiting rooms (``store``: the launcher's table) and count what waits per lane."""
    lines: Counter[str] = Counter()
    deferred: Counter[str] = Counter()
    awaiting: Counter[str] = Counter()

    ckeys = sorted(store.keys_waiting())
    partial = len(ckeys) > SCAN
    for ckey, state in sorted(store.key_states(ckeys[:SCAN]).items()):
        partial |= state.waiting > SCAN
        tickets = range(state.woken, state.woken + min(state.waiting, SCAN))
        lines.update(lane_of(w.attributes) for w in store.key_waiters(ckey, tickets))

    holders = sorted(store.parked_holders())
    partial |= len(holders) > SCAN
    for name, record in sorted(store.executions(holders[:SCAN]).items()):
        if record.parked:
            ids = sorted(record.parked)
            partial |= len(ids) > SCAN
            deferred.update(lane_of(p.attributes) for p in store.parked_messages(name, ids[:SCAN]))

    waiting = sorted(store.waiting())
    partial |= len(waiting) > SCAN
    awaiting.update(lane_of(w.attributes) for w in store.waiters(waiting[:SCAN]) if w.released_at is None)
    return ParkedCount(lines, deferred, awaiting, partial)

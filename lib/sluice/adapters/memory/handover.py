"""``MemoryStore``'s hand-over (``Store.hand_over``): its release and the successor's claim under
one lock, as DynamoStore writes them in one transaction. For tests and the benchmark."""

from __future__ import annotations

from collections.abc import Callable

from sluice.adapters.memory.claims import MemoryClaims
from sluice.adapters.memory.releases import MemoryReleases
from sluice.adapters.memory.table import MemoryPool, MemoryTable
from sluice.core.errors import AlreadyDone, AlreadyRan, LeaseHeld, OnceUnknown, SlotsFull
from sluice.core.model import Claim, Ending, ExecutionRecord, HandOver
from sluice.core.records import ReceiptOutput
from sluice.features.receipts import asked_once


class MemoryHandOver:
    def __init__(
        self, table: MemoryTable, pool: MemoryPool, releases: MemoryReleases, claims: MemoryClaims
    ) -> None:
        self.table = table
        self.pool = pool
        self.releases = releases
        self.claims = claims

    def hand_over(
        self,
        name: str,
        ending: Ending,
        offer: Callable[[ExecutionRecord, bool], Claim | None],
        *,
        confirm: Callable[[ExecutionRecord], bool] | None = None,
        output: Callable[[ExecutionRecord], ReceiptOutput | None] | None = None,
    ) -> HandOver:
        with self.table.lock:
            seen = self.table.executions.get(name)
        if seen is None or not seen.state.holds_lease:
            return HandOver(None)
        if confirm is not None and seen.adopted_at is not None and not confirm(seen):
            return HandOver(None)
        with self.table.lock:
            limit = self.pool.limit or 0
            room = limit > 0 and len(self.table.holders) <= limit
        output = asked_once(output)
        if ending.state.ended:
            output(seen)  # its effects are sent first, so the offer may receive one
        successor = offer(seen, room)
        if successor is not None and (
            not successor.plain or successor.key == seen.key or successor.name == seen.name
        ):
            successor = None  # as DynamoStore: the release alone, and the caller claims it its own way
        with self.table.lock:  # the release and the claim as one write
            released = self.releases.release(name, ending, confirm=confirm, output=output)
            if released is None or successor is None:
                return HandOver(released)
            try:
                self.claims.claim(successor)
            except (LeaseHeld, AlreadyDone, OnceUnknown, AlreadyRan, SlotsFull):
                return HandOver(released)  # the release alone; the caller claims it its own way
            return HandOver(released, claimed=True)

"""``MemoryStore``'s hand-over (``Store.hand_over``): its release and the successor's claim under
one lock, as DynamoStore writes them in one transaction. For tests and the benchmark."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sluice.errors import AlreadyDone, AlreadyRan, LeaseHeld, OnceUnknown, SlotsFull
from sluice.model import ExecutionRecord, HandOver, PayloadState, Successor
from sluice.receipts import asked_once
from sluice.records import ReceiptOutput


class MemoryHandOver:
    _lock: threading.RLock
    _limit: int | None
    _holders: set[str]
    execution: Callable[[str], ExecutionRecord | None]
    release: Callable[..., ExecutionRecord | None]
    claim: Callable[..., Any]

    def hand_over(
        self,
        *,
        name: str,
        state: PayloadState,
        now: float,
        offer: Callable[[ExecutionRecord, bool], Successor | None],
        error: str | None = None,
        cause: str | None = None,
        ended_at: float | None = None,
        started_at: float | None = None,
        confirm: Callable[[ExecutionRecord], bool] | None = None,
        output: Callable[[ExecutionRecord], ReceiptOutput | None] | None = None,
    ) -> HandOver:
        seen = self.execution(name)
        if seen is None or not seen.state.holds_lease:
            return HandOver(None)
        if confirm is not None and seen.adopted_at is not None and not confirm(seen):
            return HandOver(None)
        with self._lock:
            room = (self._limit or 0) > 0 and len(self._holders) <= (self._limit or 0)
        output = asked_once(output)
        if state.ended:
            output(seen)  # its effects are sent first, so the offer may receive one
        successor = offer(seen, room)
        if successor is not None and (successor.key == seen.key or successor.name == seen.name):
            successor = None
        with self._lock:  # the release and the claim as one write
            released = self.release(
                name=name,
                state=state,
                now=now,
                error=error,
                cause=cause,
                ended_at=ended_at,
                started_at=started_at,
                output=output,
            )
            if released is None or successor is None:
                return HandOver(released)
            try:
                self.claim(
                    key=successor.key,
                    name=successor.name,
                    message_id=successor.message_id,
                    now=now,
                    claim_expires_at=successor.claim_expires_at,
                    arn=successor.arn,
                    once=successor.once,
                )
            except (LeaseHeld, AlreadyDone, OnceUnknown, AlreadyRan, SlotsFull):
                return HandOver(released)  # the release alone; the caller claims it its own way
            return HandOver(released, claimed=True)

"""The small interfaces domain code talks to. Adapters in ``sluice.adapters`` implement them.

Every method raises only ``sluice.errors`` exceptions: ``TransientError`` for throttling and
service faults, ``ConfigurationError`` for setup problems. Nothing here ever raises ``ClientError``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from sluice.model import (
    ExecutionInfo,
    ExecutionRecord,
    Ledger,
    Message,
    PayloadRecord,
    PayloadState,
    StartedExecution,
    StartResult,
)


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...


class Queue(Protocol):
    """The main FIFO queue and its DLQ."""

    def receive(self, max_messages: int, wait_seconds: int) -> list[Message]: ...

    def delete(self, messages: Sequence[Message]) -> None:
        """Delete messages. A receipt that is no longer valid is not an error: it was handled."""
        ...

    def release(self, messages: Sequence[Message], delay_seconds: int = 0) -> None:
        """Make in-flight messages visible again after ``delay_seconds`` (best effort)."""
        ...

    def send_to_dlq(self, message: Message, reason: str) -> None:
        """Copy the message, body untouched, to the DLQ with ``reason`` attached.

        The caller deletes it from the main queue afterwards; a crash in between sends it again
        with the same deduplication id (its message id).
        """
        ...


class Executions(Protocol):
    """One Step Functions state machine."""

    state_machine_arn: str

    def arn_for(self, name: str) -> str: ...

    def start(self, name: str, input_json: str) -> StartResult:
        """Start ``name``. A name that exists already gives ``StartResult(already_existed=True)``."""
        ...

    def describe(self, name: str) -> ExecutionInfo | None:
        """The execution, or ``None`` when Step Functions has never heard of it."""
        ...

    def list_running(self) -> set[str]:
        """Names of RUNNING executions. Eventually consistent: a fresh start may be missing."""
        ...

    def check(self) -> None:
        """Raise ``ConfigurationError`` unless the state machine exists and may be used."""
        ...


class MaxSource(Protocol):
    def current(self) -> int:
        """MAX in force now. 0 pauses admission."""
        ...


class Store(Protocol):
    """Ledger, payload leases and execution records (DynamoDB in production).

    The claim and every release are atomic over the ledger and the records they touch: there is
    never a slot without a lease or a lease without a slot.
    """

    def ledger(self) -> Ledger: ...

    def claim(
        self,
        *,
        key: str,
        name: str,
        message_id: str,
        limit: int,
        now: float,
        claim_expires_at: float,
        expires_at: int,
    ) -> None:
        """Take a slot and the payload's lease for ``name``.

        Raises ``LeaseHeld`` (with the existing record) when the payload's lease is live, including
        when ``name`` itself holds it, and ``SlotsFull`` when ``|holders| >= limit``.
        """
        ...

    def mark_running(self, *, key: str, name: str, arn: str, started_at: float, now: float) -> bool:
        """CLAIMED → RUNNING if ``name`` still holds the lease and has not ended. False otherwise."""
        ...

    def mark_running_many(self, started: Sequence[StartedExecution], *, now: float) -> int:
        """``mark_running`` for a batch, in one write when all still hold their leases.

        Returns how many were marked; one already released (it ended first) is skipped.
        """
        ...

    def release(
        self,
        *,
        name: str,
        state: PayloadState,
        now: float,
        error: str | None = None,
        cause: str | None = None,
        ended_at: float | None = None,
    ) -> ExecutionRecord | None:
        """Free ``name``'s slot and lease and record ``state``; only if ``name`` holds them.

        Returns the record as it was before, or ``None`` when ``name`` held nothing (a redelivered
        event, an execution Sluice did not start): a second release never frees a second slot.
        """
        ...

    def record_duplicate(self, *, key: str, message_id: str, now: float) -> None: ...

    def record_invalid(self, *, key: str, reason: str, now: float, expires_at: int) -> None: ...

    def payload(self, key: str) -> PayloadRecord | None: ...

    def execution(self, name: str) -> ExecutionRecord | None: ...

    def executions(self, names: Iterable[str]) -> dict[str, ExecutionRecord]: ...

    def save_reconciliation(self, *, external: int, drift: int, now: float) -> None: ...

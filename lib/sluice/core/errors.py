"""One exception tree for Sluice. Adapters translate AWS ``ClientError`` codes into these, so
domain code never sees botocore.

    SluiceError
    ├── ConfigurationError        wrong setup: fail loudly, touch nothing
    │   └── NotFound              the thing asked about does not exist (parameter, execution)
    ├── TransientError            throttling or an AWS fault: end the tick cleanly, retry later
    │   └── AmbiguousStartError   StartExecution may or may not have happened
    ├── InvalidPayload            bad input: dead-lettered with ``reason``
    ├── ConditionFailed           a conditional write found the item otherwise: nothing written
    └── ClaimRejected             the ledger said no
        ├── SlotsFull             no free slot under the current limit
        ├── KeyFull               the payload's concurrency key is at its cap; carries its state
        ├── LeaseHeld             the payload's lease is live; carries the existing record
        ├── AlreadyRan            the execution name ran and ended already; carries its record
        ├── AlreadyDone           a run-once key has SUCCEEDED already; carries its record
        ├── OnceUnknown           a run-once key's run has an unknown outcome; carries its record
        └── lease.Busy            a key's lease (``@exclusive``) is held; carries its holders
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sluice.core.model import ExecutionRecord, PayloadRecord
    from sluice.core.records import KeyState


class SluiceError(Exception):
    """Base class of every error Sluice raises on purpose."""


class ConfigurationError(SluiceError):
    """Sluice is not set up right (missing state machine, access denied, bad MAX value)."""


class NotFound(ConfigurationError):
    """The resource or record asked for does not exist (adapters say when that is not an error)."""


class MachineVanished(ConfigurationError):
    """An execution asked about by its ARN is on a state machine the stack no longer uses, and
    Step Functions says that machine does not exist: whether it ran there can no longer be known."""

    @classmethod
    def claim(cls, name: str, arn: str | None) -> MachineVanished:
        """The reason a claim of ``name`` (recorded on ``arn``'s machine) is not started again."""
        machine = (arn or "").split(":")[6:7] or [""]
        return cls(
            f"its claim {name} is on state machine {machine[0]}, no longer used and deleted: whether it "
            "ran there cannot be known, so it is not started again"
        )


class ConditionFailed(SluiceError):
    """A conditional write was refused because the item was not as expected. Nothing was written."""


class TransientError(SluiceError):
    """AWS refused for now (throttling, service fault). Nothing was changed by the failed call.
    ``throttled``: AWS said slow down (a rate or a token bucket), rather than failed."""

    def __init__(self, message: str, *, operation: str = "", code: str = "", throttled: bool = False) -> None:
        super().__init__(message)
        self.operation = operation
        self.code = code
        self.throttled = throttled


class Contended(TransientError):
    """Other writers moved an item between each read and its conditional write, round after round:
    nothing of ours was written. Trying again later is safe."""


class AmbiguousStartError(TransientError):
    """StartExecution failed in a way that does not say whether the execution started."""


class InvalidPayload(SluiceError):
    """A message cannot be run. ``reason`` is recorded and travels with it to the DLQ."""

    def __init__(self, reason: str, *, key: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.key = key


class ClaimRejected(SluiceError):
    """The ledger refused a claim."""


class SlotsFull(ClaimRejected):
    def __init__(self, limit: int) -> None:
        super().__init__(f"no free slot under limit {limit}")
        self.limit = limit


class KeyFull(ClaimRejected):
    """The payload's concurrency key is at its cap, or has waiters the claim may not overtake
    (``sluice.features.keys``). ``state`` is the key as the failed claim saw it."""

    def __init__(self, state: KeyState) -> None:
        super().__init__(
            f"concurrency key {state.key!r} is at its cap or has waiters "
            f"({len(state.holders)} running, {state.waiting} waiting)"
        )
        self.state = state


class LeaseHeld(ClaimRejected):
    """The payload's lease is live. ``existing`` is the record as the failed claim saw it."""

    def __init__(self, existing: PayloadRecord) -> None:
        super().__init__(f"payload {existing.key!r} is held by execution {existing.holder!r}")
        self.existing = existing


class AlreadyRan(ClaimRejected):
    """A claim of an execution name that ran and ended already (its message back after its run was
    released). Names are unique per state machine only: a start on a machine the stack switched to
    since would run it a second time, so the claim refuses it. ``existing`` is the execution record
    as the failed claim saw it."""

    def __init__(self, existing: ExecutionRecord) -> None:
        super().__init__(f"execution {existing.name!r} ran already and ended {existing.state.value}")
        self.existing = existing


class AlreadyDone(ClaimRejected):
    """A run-once claim (``sluice-once``) of a key that has SUCCEEDED already: nothing to run.
    ``existing`` is the payload record as the failed claim saw it (``succeeded_by`` set)."""

    def __init__(self, existing: PayloadRecord) -> None:
        super().__init__(f"payload {existing.key!r} succeeded already ({existing.succeeded_by})")
        self.existing = existing


class OnceUnknown(ClaimRejected):
    """A run-once claim of a key whose run-once execution vanished with its state machine (deleted
    after a switch) before Sluice saw it end: whether the key SUCCEEDED cannot be known, so it does
    not run once more by itself (``sluice.features.receipts``). ``existing`` is the payload record as the
    failed claim saw it (``once_unknown`` set)."""

    def __init__(self, existing: PayloadRecord) -> None:
        super().__init__(
            f"run-once key {existing.key!r}: the outcome of its run {existing.once_unknown} is unknown "
            "(its execution no longer exists in Step Functions: its state machine was deleted), so it "
            "is not run again; once its outcome is known, clear the key's once_unknown mark "
            "(docs/operations.md) and redrive"
        )
        self.existing = existing

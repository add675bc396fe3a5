"""The semaphore's names, records and ports (``sluice.semaphore.step`` holds the logic and its races).

Names: a semaphore ``name`` is part of item keys and of the slots pool ``sem:<name>``; an acquisition
id is chosen by the workflow (a state name, ``$$.State.EnteredTime``, a Map index). A permit's holder
name is ``<first 32 hex digits of sha256(execution ARN)>:<acquisition id>``: at most 73 characters,
within what ``sluice.primitives.slots`` sizes its shard items for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from sluice.core.errors import SluiceError
from sluice.primitives.slots import Slots, check_pool

POOL_PREFIX = "sem:"
MAX_NAME = 64 - len(POOL_PREFIX)
MAX_ACQUISITION_ID = (
    40  # holder names stay within 32 + 1 + 40 = 73 characters (sluice.primitives.slots sizes)
)
HASH_CHARS = 32
UNKNOWN_ERROR = "Sluice.UnknownSemaphore"


class BadSemaphoreName(SluiceError, ValueError):
    """A semaphore name or acquisition id the table cannot take."""


class State(StrEnum):
    WAITING = "WAITING"
    GRANTED = "GRANTED"
    RELEASED = "RELEASED"


class Outcome(StrEnum):
    GRANTED = "granted"  # the permit is held (SendTaskSuccess sent, or being sent)
    WAITING = "waiting"  # in line
    RELEASED = "released"  # a late repeat of an acquisition already released: nothing taken
    REFUSED = "refused"  # unknown semaphore: SendTaskFailure sent


class Released(StrEnum):
    PERMIT = "permit"
    LINE = "line"  # it was waiting: it left the line
    NOTHING = "nothing"


class Delivery(StrEnum):
    DELIVERED = "delivered"
    GONE = "gone"  # TaskTimedOut, InvalidToken, TaskDoesNotExist


class Opened(StrEnum):
    OPENED = "opened"
    TICKET_TAKEN = "ticket-taken"  # the hand-off passed this ticket over already
    RECORD_CHANGED = "record-changed"


class Freed(StrEnum):
    FREED = "freed"
    NOT_RELEASED = "not-released"
    MOVED = "moved"  # the holder was not on that shard


def check_name(name: str) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME or not _plain(name):
        raise BadSemaphoreName(
            f"bad semaphore name {name!r}: 1 to {MAX_NAME} ASCII characters, no '#' '|' or space"
        )
    return name


def check_acquisition_id(acquisition_id: str) -> str:
    if not isinstance(acquisition_id, str) or not 1 <= len(acquisition_id) <= MAX_ACQUISITION_ID:
        raise BadSemaphoreName(f"bad acquisition id {acquisition_id!r}: 1 to {MAX_ACQUISITION_ID} characters")
    if not _plain(acquisition_id):
        raise BadSemaphoreName(f"bad acquisition id {acquisition_id!r}: ASCII, no '#' '|' or space")
    return acquisition_id


def _plain(text: str) -> bool:
    return all("!" <= c <= "~" and c not in "#|" for c in text)


def pool_of(name: str) -> str:
    return check_pool(POOL_PREFIX + check_name(name))


def execution_hash(execution_arn: str) -> str:
    if not execution_arn:
        raise BadSemaphoreName("an acquisition needs an execution ARN")
    return hashlib.sha256(execution_arn.encode()).hexdigest()[:HASH_CHARS]


def holder_name(execution_arn: str, acquisition_id: str) -> str:
    return f"{execution_hash(execution_arn)}:{check_acquisition_id(acquisition_id)}"


def acquisition_of(holder: str) -> str:
    return holder.partition(":")[2]


@dataclass(frozen=True)
class Acquisition:
    """The record of one (semaphore, execution, acquisition id): its latest token and generation."""

    semaphore: str
    execution_arn: str
    acquisition_id: str
    token: str
    gen: int
    state: State
    ticket: int
    requested_at: float
    granted_at: float | None = None
    delivered_at: float | None = None
    released_at: float | None = None
    reason: str | None = None

    @property
    def holder(self) -> str:
        return holder_name(self.execution_arn, self.acquisition_id)


@dataclass(frozen=True)
class Ticket:
    """A place in line. A tombstone (``holder`` None) marks a ticket passed over before its item came."""

    semaphore: str
    number: int
    holder: str | None = None
    gen: int = 0
    execution_arn: str = ""
    acquisition_id: str = ""
    enqueued_at: float = 0.0


@dataclass(frozen=True)
class AcquireResult:
    outcome: Outcome
    semaphore: str
    acquisition_id: str
    ticket: int | None = None


@dataclass(frozen=True)
class Holder:
    execution_arn: str
    acquisition_id: str
    since: float


@dataclass(frozen=True)
class Waiter:
    ticket: int
    execution_arn: str
    acquisition_id: str
    enqueued_at: float


@dataclass(frozen=True)
class SemaphoreStatus:
    name: str
    limit: int
    frozen: bool
    holders: tuple[Holder, ...]
    waiters: tuple[Waiter, ...]
    line: int  # tickets not served yet (dead ones among them until the hand-off passes them)


@dataclass
class HandOff:
    granted: list[Holder]
    skipped: list[Waiter]


class Tokens(Protocol):
    """Step Functions' task tokens and executions. Raises only ``sluice.core.errors``."""

    def succeed(self, token: str, output: Mapping[str, object]) -> Delivery: ...

    def fail(self, token: str, error: str, cause: str) -> Delivery: ...

    def execution_status(self, execution_arn: str) -> str | None:
        """RUNNING, SUCCEEDED, FAILED, TIMED_OUT, ABORTED, ...; None when there is no such execution."""
        ...


class SemaphoreStore(Protocol):
    """Records of acquisitions and lines; each method is one atomic step (adapters say how)."""

    slots: Slots

    def acquisition(self, name: str, holder: str) -> Acquisition | None: ...

    def acquisitions(self, name: str, holders: Sequence[str]) -> dict[str, Acquisition]: ...

    def open(self, acquisition: Acquisition, previous_gen: int | None, now: float) -> Opened:
        """Ticket item, record (new, or after ``previous_gen`` RELEASED) and index entry, all or none."""
        ...

    def refresh(self, name: str, holder: str, gen: int, token: str) -> Acquisition | None:
        """A repeated acquire's token, unless the record left ``gen`` or was released."""
        ...

    def take_ticket(self, name: str) -> int: ...

    def line(self, name: str) -> tuple[int, int]:
        """(head, tail): tickets head + 1 .. tail wait."""
        ...

    def ticket(self, name: str, number: int) -> Ticket | None: ...

    def tickets(self, name: str, first: int, last: int) -> list[Ticket]: ...

    def tombstone(self, name: str, number: int, now: float) -> bool: ...

    def advance(self, name: str, number: int, *, drop: bool) -> bool:
        """head number - 1 → number; ``drop`` deletes the ticket item afterwards."""
        ...

    def grant(self, name: str, holder: str, gen: int, ticket: int, now: float) -> Acquisition | None: ...

    def ungrant(self, name: str, holder: str, gen: int, granted_at: float) -> bool:
        """Back to WAITING (no permit was free after all), if still that grant."""
        ...

    def take_over(
        self, name: str, holder: str, gen: int, granted_at: float, now: float
    ) -> Acquisition | None: ...

    def delivered(self, name: str, holder: str, gen: int, now: float, *, sure: bool) -> None: ...

    def end(
        self,
        name: str,
        holder: str,
        gen: int,
        now: float,
        reason: str,
        *,
        token: str | None = None,
        granted_at: float | None = None,
    ) -> bool:
        """Mark RELEASED, if still at ``gen`` and not released (and holding ``token``, ``granted_at``)."""
        ...

    def free(self, name: str, holder: str, shard: int | None) -> Freed:
        """Release the permit on ``shard`` (None: none held) and drop the index entry, IF RELEASED."""
        ...

    def held_by(self, execution_arn: str) -> list[tuple[str, str]]:
        """(semaphore, acquisition id) of every acquisition the execution's index lists."""
        ...

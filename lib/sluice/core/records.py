"""Value records shared by the ports, the errors and the features that own them: a leaf module (it
imports only ``sluice.core.model``), so ``ports.py`` and ``errors.py`` name these without importing a
feature module. Their rules stay with their features: lanes (``sluice.features.lanes``), concurrency keys
(``sluice.features.keys``), receipts (``sluice.features.receipts``), calls side by side (``sluice.primitives.fanout``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sluice.core.model import EffectsLog

T = TypeVar("T")

MAX_LANE_LIMIT = 10_000
POOL_PREFIX = "lane-"
INFLIGHT_SECONDS = 300.0  # how long a woken waiter's slot is kept for its claim
# ``landed`` notes a key keeps for wakes still to note them (``KeyState.stale``): its wakers at once
# times their batch is the most a key meets; a producer's forged tickets pile up past it.
LANDED_KEPT = 64
# A ticket and the time it was sent back, in ASCII digits ("²".isdigit() is True, int("²") raises).
TICKET_PATTERN = re.compile(r"([0-9]{1,18})@([0-9]{1,18})", re.ASCII)


@dataclass(frozen=True, slots=True)
class Done(Generic[T]):
    """One call's result: its value, or the ``Exception`` it raised."""

    value: T | None = None
    error: Exception | None = None


@dataclass(frozen=True, slots=True)
class Lane:
    name: str
    max: int
    priority: int = 0
    weight: int = 1
    fair: bool = False
    implied: bool = False  # the lane default, not named by the setting: it follows the global MAX

    @property
    def pool(self) -> str:
        """The lane's slot pool (``sluice.primitives.slots``)."""
        return POOL_PREFIX + self.name


@dataclass(frozen=True, slots=True)
class LaneSetting:
    """Item ``LANE#<name>``: a lane's run-time MAX, written by the operator's commands."""

    name: str
    max: int | None = None  # None: the configured MAX
    paused: bool = False
    changed_at: float = 0.0  # orders the lane's limits: a tick holding an older one does not undo it

    def limit(self, lane: Lane) -> int:
        """The lane's limit: 0 when paused, else the operator's MAX, else the configured one. An
        operator's MAX above ``MAX_LANE_LIMIT`` (written by hand: the CLI refuses it) is refused for
        the configured MAX, never planned: no lane's pool grows past the ceiling."""
        if self.paused:
            return 0
        if self.max is None or not 0 <= self.max <= MAX_LANE_LIMIT:
            return lane.max
        return self.max


@dataclass(frozen=True, slots=True)
class LaneRoom:
    """A lane's pool as read: the limit in force, its holders, its free slots."""

    limit: int
    running: int
    free: int
    exists: bool = True  # False before the lane's first tick wrote its caps
    complete: bool = True  # False: a sample of a big lane's shards (``free`` counts those read)
    frozen: bool = False  # its limit was lowered below its holders: no cap has room until re-planned
    unsettled: bool = False  # read whole, its caps do not add up to its limit: a plan stopped midway


@dataclass(frozen=True, slots=True)
class KeyState:
    """Item ``CKEY#<key>`` as read: the runs holding a slot of the key and its waiting line."""

    key: str
    holders: frozenset[str] = frozenset()
    cap: int | None = None  # the key's own cap; None: the default applies
    tickets: int = 0
    woken: int = 0
    inflight: frozenset[str] = frozenset()  # entries "<ticket>@<ms>" (``entry``)
    fair: str | None = None  # the fair lane whose tenant it is (``sluice.features.fair``): its waker wakes it
    # Entries whose claim landed before the wake that sent them recorded them in ``inflight``
    # (``wake``'s timeline): not kept, and dropped from both sets by the next wake.
    landed: frozenset[str] = frozenset()

    def limit(self, default: int) -> int:
        return default if self.cap is None else self.cap

    def kept(self, now: float) -> int:
        """Slots kept for woken waiters whose claim has not landed yet."""
        return sum(1 for e in self.inflight - self.landed if sent_at(e) > now - INFLIGHT_SECONDS)

    def stale(self, now: float) -> tuple[str, ...]:
        """Entries to drop: those whose claim has landed and that their wake noted; those kept past
        ``INFLIGHT_SECONDS`` or dated further ahead than any clock is; and a ``landed`` note no
        wake can note any more: its ticket is behind ``woken`` (the one wake that could note it
        moved ``woken`` past it, or lost that move) or not in the line at all (a forged ticket).

        A ``landed`` note still in the line is kept whatever its date: it waits for the wake that
        sent its copy. Judged by the reader's clock, a launcher an hour behind the waker took a
        fresh note for one dated ahead and dropped it before the wake noted its entry, which then
        kept a slot for nobody for ``INFLIGHT_SECONDS`` (explorer seed 1206004492):

            waker (clock right)              launcher (an hour behind)
            send M (entry e, t = woken)
                                             receive M, claim: landed += e
                                             wake k: e "ahead" → drop e      ✗ (now: t ≥ woken, kept)
            woken += 1, inflight += e        (e keeps a slot: not in landed)

        At most ``LANDED_KEPT`` of them, nearest the head of the line first: copies with forged
        tickets in a line that stands still (a paused key) each give their entry back, and each is
        noted; kept all, they would fill the key's item. One dropped too soon costs what a date
        did: an entry noted after it keeps a slot for nobody for ``INFLIGHT_SECONDS``.
        """
        done = self.inflight & self.landed
        waiting = sorted(
            (e for e in self.landed - self.inflight if self.woken <= ticket_number(e) < self.tickets),
            key=lambda e: (ticket_number(e), sent_at(e), e),
        )
        unnoted = self.landed - self.inflight - set(waiting[:LANDED_KEPT])
        lapsed = {
            e
            for e in self.inflight - self.landed
            if not now - INFLIGHT_SECONDS < sent_at(e) <= now + INFLIGHT_SECONDS
        }
        return tuple(sorted(done | unnoted | lapsed))

    def room(self, default: int, now: float) -> int:
        return max(0, self.limit(default) - len(self.holders) - self.kept(now))

    @property
    def waiting(self) -> int:
        return self.tickets - self.woken


def ticket_number(entry: str) -> int:
    """The entry's place in its key's line; -1 for an entry that is not ``<ticket>@<ms>``."""
    match = TICKET_PATTERN.fullmatch(entry)
    return int(match.group(1)) if match else -1


def sent_at(entry: str) -> float:
    """When the entry's waiter was sent back; 0 (long past: dropped at the next wake) for an entry
    that is not ``<ticket>@<ms>``, which no claim checked at receipt can write."""
    match = TICKET_PATTERN.fullmatch(entry)
    return int(match.group(2)) / 1000 if match else 0.0


@dataclass(frozen=True, slots=True)
class ReceiptOutput:
    """What a receipt keeps of an output: the text inline, or a pointer to it (JSON), and its size."""

    inline: str | None = None
    pointer: str | None = None
    size: int | None = None
    # The output's text as it was in hand at the release (not stored here; ``sluice.features.effects`` reads
    # the effects it names), and the effects sent from it, written by the release (``EFFECTS#<name>``).
    text: str | None = field(default=None, compare=False, repr=False)
    effects: EffectsLog | None = None

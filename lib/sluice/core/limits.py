"""The launcher's limit: MAX as read, what the limit in force is worked out from, and the ledger
of who holds a slot. Everything here is immutable."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.core.external import ExternalCount


@dataclass(frozen=True, slots=True)
class MaxReading:
    """MAX as configured, and when it last changed (``changed_at``, epoch seconds; None when that
    is unknown: the parameter is missing and the deployed default applies)."""

    value: int
    changed_at: float | None = 0.0
    version: int = 0  # the parameter's version: orders two changes within the same millisecond


@dataclass(frozen=True, slots=True)
class LimitSource:
    """What the launcher's limit (MAX − external) is worked out from, with the order of each part:
    MAX by when the parameter last changed (then its version), and the external count by its
    listing's numbers (``ExternalCount``).

    Writers hold readings of different ages (a launcher's cached MAX, an operator's fresh one, a
    newer external count), so the limit in force keeps its source (the slot pool's stamp) and a
    writer merges: the newer MAX and the newer external count of the two (``ExternalCount.merged``:
    the larger when their listings overlap). Neither part ever goes back to an older reading,
    whoever writes last. A MAX whose change time is unknown (the parameter is missing and the
    deployed default applies) is unfenced: written as it is.
    """

    max_value: int
    max_changed_at: float | None
    external: int = 0
    count: int = 0
    max_version: int = 0
    listed_after: int | None = None  # see ExternalCount; a pool's stamp does not keep it (unknown: 0)

    @property
    def limit(self) -> int:
        return max(0, self.max_value - self.external)

    @property
    def fenced(self) -> bool:
        return self.max_changed_at is not None

    @property
    def counted(self) -> ExternalCount:
        return ExternalCount(self.external, self.count, self.listed_after)

    def stamp(self) -> tuple[float, ...]:
        if self.max_changed_at is None:
            return ()
        return (
            self.max_changed_at,
            float(self.max_version),
            float(self.max_value),
            float(self.count),
            float(self.external),
        )

    @classmethod
    def from_stamp(cls, stamp: tuple[float, ...]) -> LimitSource | None:
        if len(stamp) != 5:
            return None
        return cls(int(stamp[2]), stamp[0], int(stamp[4]), int(stamp[3]), int(stamp[1]), listed_after=0)

    def merged(self, other: LimitSource | None) -> LimitSource:
        """The newer MAX and the newer external count of ``self`` and ``other`` (ties: ``self``)."""
        if other is None or self.max_changed_at is None or other.max_changed_at is None:
            return self  # either not fenced
        mine, theirs = (self.max_changed_at, self.max_version), (other.max_changed_at, other.max_version)
        newer_max = other if theirs > mine else self
        counted = self.counted.merged(other.counted)
        return LimitSource(
            newer_max.max_value,
            newer_max.max_changed_at,
            counted.external,
            counted.count,
            newer_max.max_version,
            counted.listed_after,
        )


@dataclass(frozen=True, slots=True)
class Ledger:
    """Who holds a slot, the limit in force in the slots' caps, and what reconciliation last saw."""

    holders: frozenset[str] = frozenset()
    external: int = 0  # RUNNING executions of the state machine that Sluice did not start
    reconciled_at: float | None = None
    drift: int = 0
    in_force: int | None = None  # the slots Sluice may fill now (the caps); None before the first tick
    room: int | None = None  # free slots on the shards read (``Store.look``); None: in_force − holders
    complete: bool = True  # every holder was read (False: ``Store.look`` read a sample of the shards)
    estimated: int | None = None  # holders, scaled up from the shards last read, when not complete
    count: int = 0  # the number of the external count saved (reconciliations number theirs)
    listed_after: int | None = 0  # the number taken before its listing (``ExternalCount``; 0: unknown)
    numbered: int = 0  # LEDGER's counter as read: how many counts were numbered so far

    def limit(self, max_concurrency: int) -> int:
        """Slots Sluice may fill: MAX less what others run on the same state machine."""
        return max(0, max_concurrency - self.external)

    def source(self, reading: MaxReading) -> LimitSource:
        """The limit's source from ``reading`` and this ledger's external count."""
        return LimitSource(
            reading.value, reading.changed_at, self.external, self.count, reading.version, self.listed_after
        )

    @property
    def free(self) -> int:
        """Slots a receive may be sized for: the room seen, or the limit less the holders."""
        if self.room is not None:
            return self.room
        return max(0, (self.in_force or 0) - len(self.holders))

    @property
    def running(self) -> int:
        """Holders: counted when every one was read, else estimated from the shards last read."""
        if self.complete or self.estimated is None:
            return len(self.holders)
        return self.estimated

    @property
    def counted(self) -> bool:
        """The holders were read (every one, or a sample scaled up): False for a room known without
        a read of the slots (a completion's hand-over freed one), whose ``running`` means nothing."""
        return self.complete or self.estimated is not None

"""The external count: reconciliation's count of the RUNNING executions outside Sluice, which the
launcher's limit leaves room for (MAX − external; ``sluice.core.limits.LimitSource``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ExternalCount:
    """Reconciliation's count of the RUNNING executions outside Sluice, ordered by when its listing
    was taken: ``count`` is the number the reconciliation took just after ListExecutions (one atomic
    counter in LEDGER; no clock is compared), ``listed_after`` one more than the counter as read
    just before it: every count numbered below ``listed_after`` was numbered before the listing.
    ``listed_after`` None: listed when numbered (``count``); 0: unknown (a figure read from a pool's
    stamp, or written before listings were numbered on both sides).

    A count replaces another only when its listing began after the other's was numbered, so it saw
    everything the other did and later, but for starts younger than S: ListExecutions may miss one
    of those, also one an earlier listing showed, so an execution started outside Sluice counts
    from at most S after its start (explorer seed 1326082451). Two listings that overlap keep the
    larger count. Ordering
    by one number alone lets an older listing win whichever end is numbered:

        numbered after the listing                  numbered before the listing
        ───────────────────────────────────        ────────────────────────────────────────────
        A lists: 0 outside                          A numbers 1;  B numbers 2
        X started by hand                           B lists: 0 outside
        B lists: 1 (X), numbers 1, saves            X started by hand
        A numbers 2: its 0 wins → MAX + 1 run       A lists: 1 (X), saves 1
                                                    B saves its 0 numbered 2: wins → MAX + 1 run

    With both numbers, two listings overlap unless one's ``listed_after`` passes the other's
    ``count``; overlapping, the larger external stands until a listing taken wholly after both.
    """

    external: int = 0
    count: int = 0
    listed_after: int | None = None

    @property
    def began(self) -> int:
        return self.count if self.listed_after is None else self.listed_after

    def merged(self, other: ExternalCount) -> ExternalCount:
        """The newer of the two, or, when their listings may overlap, the larger external."""
        if self.began > other.count:
            return self  # listed after ``other`` was numbered: newer (an ended run left the count)
        if other.began > self.count:
            return other
        return ExternalCount(
            max(self.external, other.external), max(self.count, other.count), min(self.began, other.began)
        )

"""``sluice tick``: one launcher tick in this process."""

from __future__ import annotations

import time

from sluice.core.summary import TickSummary
from sluice.runtime import Runtime


def tick(rt: Runtime, *, time_limit: float | None = None) -> TickSummary:
    """One launcher tick in this process: reconcile, then fill free slots, exactly as the Lambda does."""
    remaining_ms = None
    if time_limit is not None:
        deadline = time.monotonic() + time_limit

        def remaining_ms() -> int:
            return int((deadline - time.monotonic()) * 1000)

    return rt.launcher().tick(reconcile_first=True, remaining_ms=remaining_ms)

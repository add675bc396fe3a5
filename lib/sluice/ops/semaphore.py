"""Semaphores at run time: put a limit in force, show one semaphore, list them all.

A semaphore exists once a limit was set for it (``sluice semaphore set NAME N``): its pool item
``SLOTS#sem:<name>`` is written then; an acquire of a semaphore without one is refused.

Listing. The table has a partition key only and no index, so there is no cheap way to list
semaphores: ``semaphore_list`` runs a Scan filtered on the pool items (``begins_with(pk,
"SLOTS#sem:")`` and a ``version``, which only the pool item has). A Scan reads, and is billed for,
every item of the table whatever the filter keeps (half a read unit per 4 KB, eventually
consistent), so it is bounded: it stops after ``max_pages`` pages of up to 1 MB, or once ``limit``
semaphores are found, and says so (``truncated``). The permits and lines of the semaphores found are
then read with BatchGetItem, 100 keys a call.
"""

from __future__ import annotations

from typing import Any

from sluice.core.errors import ConfigurationError
from sluice.primitives.slots import Occupancy
from sluice.runtime import Runtime
from sluice.semaphore.model import SemaphoreStatus, check_name, pool_of
from sluice.semaphore.step import Semaphores

MAX_LIMIT = 10_000  # permits of one semaphore: 1,250 shard items of 8
MAX_WAITERS = 100
LIST_LIMIT = 100  # semaphores listed at most
SCAN_PAGES = 10  # pages of up to 1 MB read at most by one listing
SCAN_COST = (
    "found by a Scan of the whole table, filtered on the semaphores' pool items: it reads and is billed "
    "for every item (half a read unit per 4 KB)"
)


def _semaphores(rt: Runtime) -> Semaphores:
    return rt.semaphores()


def check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= MAX_LIMIT:
        raise ConfigurationError(
            f"{limit!r}: a semaphore's limit is a whole number 0 to {MAX_LIMIT} (0 pauses)"
        )
    return limit


def semaphore_set(rt: Runtime, name: str, limit: int) -> dict[str, Any]:
    """Put ``limit`` in force and hand freed permits to waiters at once. Nobody is evicted: below the
    holders, the semaphore admits nothing until fewer than ``limit`` hold (the pool freezes)."""
    check_name(name)
    check_limit(limit)
    sems = _semaphores(rt)
    pool = pool_of(name)
    existed = sems.slots.occupancy(pool).version > 0
    before = sems.status(name, max_waiters=MAX_WAITERS)
    plan = sems.set_limit(name, limit)
    after = sems.status(name, max_waiters=MAX_WAITERS)
    had = {(h.execution_arn, h.acquisition_id) for h in before.holders}
    line = {(w.execution_arn, w.acquisition_id): w.ticket for w in before.waiters}
    granted = sorted(
        (h for h in after.holders if (h.execution_arn, h.acquisition_id) not in had),
        key=lambda h: line.get((h.execution_arn, h.acquisition_id), 1 << 62),
    )
    return {
        "semaphore": name,
        "created": not existed,
        "before": before.limit if existed else None,
        "limit": after.limit,
        "requested": limit,
        "overtaken": plan is None,  # another change came in meanwhile: ``limit`` is the one in force
        "frozen": after.frozen,
        "holding": len(after.holders),
        "granted": [_holder(h) for h in granted],
        "waiting": len(after.waiters),
        "line": after.line,
    }


def semaphore_status(rt: Runtime, name: str, *, max_waiters: int = MAX_WAITERS) -> dict[str, Any] | None:
    """One semaphore: limit, holders (oldest first), up to ``max_waiters`` waiters in line order.
    None when no limit was ever set for it."""
    check_name(name)
    sems = _semaphores(rt)
    if sems.slots.occupancy(pool_of(name)).version == 0:
        return None
    return _status(sems.status(name, max_waiters=max_waiters), max_waiters)


def semaphore_list(rt: Runtime, *, limit: int = LIST_LIMIT, max_pages: int = SCAN_PAGES) -> dict[str, Any]:
    """Every semaphore of the table, one summary each, sorted by name (bounded: see the module)."""
    rt.settings.require("table_name")
    found = rt.semaphore_catalogue().scan(limit=limit, max_pages=max_pages)
    return {
        "semaphores": [_summary(s.name, s.occupancy, s.line) for s in found.semaphores],
        "scanned_items": found.scanned_items,
        "scan_pages": found.pages,
        "truncated": found.truncated,
        "cost": SCAN_COST,
    }


def _summary(name: str, occupancy: Occupancy, line: int) -> dict[str, Any]:
    return {
        "semaphore": name,
        "limit": occupancy.limit,
        "frozen": occupancy.frozen,
        "holding": occupancy.running,
        "free": 0 if occupancy.frozen else max(0, occupancy.limit - occupancy.running),
        "line": max(0, line),
    }


def _holder(h: Any) -> dict[str, Any]:
    return {"execution_arn": h.execution_arn, "acquisition_id": h.acquisition_id, "since": h.since}


def _status(s: SemaphoreStatus, max_waiters: int) -> dict[str, Any]:
    return {
        "semaphore": s.name,
        "limit": s.limit,
        "frozen": s.frozen,
        "holding": len(s.holders),
        "free": 0 if s.frozen else max(0, s.limit - len(s.holders)),
        "holders": [_holder(h) for h in s.holders],
        "waiters": [
            {
                "ticket": w.ticket,
                "execution_arn": w.execution_arn,
                "acquisition_id": w.acquisition_id,
                "enqueued_at": w.enqueued_at,
            }
            for w in s.waiters
        ],
        "max_waiters": max_waiters,
        "line": s.line,
    }

"""Every semaphore of the table, for ``sluice semaphore status`` without a name (``sluice.ops.semaphore``).

The table has a partition key only and no index: the semaphores are found by a Scan filtered on their
pool items (``begins_with(pk, "SLOTS#sem:")`` and a ``version``, which only a pool item has), read
page by page (up to 1 MB each) until ``max_pages`` pages or ``limit`` semaphores. Their permits and
lines are then read with BatchGetItem, 100 keys a call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.adapters.dynamo.codec import plain
from sluice.adapters.dynamo.semaphore import line_pk
from sluice.adapters.dynamo.slots import shard_pk, to_occupancy
from sluice.adapters.dynamo.table import Table
from sluice.adapters.errors import translated
from sluice.primitives.slots import Occupancy
from sluice.semaphore.model import POOL_PREFIX, pool_of


@dataclass(frozen=True, slots=True)
class SemaphoreSeen:
    """One semaphore as the listing read it: its permits, and how many tickets its line holds."""

    name: str
    occupancy: Occupancy
    line: int  # tickets issued and not yet served


@dataclass(frozen=True, slots=True)
class SemaphoreScan:
    semaphores: tuple[SemaphoreSeen, ...]  # by name
    scanned_items: int  # items the Scan read (and was billed for)
    pages: int
    truncated: bool  # stopped at ``limit`` semaphores or ``max_pages`` pages


@dataclass(frozen=True, slots=True)
class _Pools:
    metas: dict[str, dict[str, Any]]  # semaphore name -> its pool item
    scanned: int
    pages: int
    truncated: bool


class SemaphoreCatalogue(Table):
    """The semaphores of the Sluice table, found by a bounded Scan."""

    def scan(self, *, limit: int, max_pages: int) -> SemaphoreScan:
        """The semaphores found (at most ``limit``, sorted by name), each with its permits and line."""
        pools = self._pools(limit, max_pages)
        names = sorted(pools.metas)[:limit]
        keys = [line_pk(n) for n in names]
        for n in names:
            keys += [shard_pk(pool_of(n), i) for i in range(int(pools.metas[n].get("shards", 0)))]
        found = {str(r["pk"]): r for r in self._batch_get(keys)}
        seen = []
        for n in names:
            pool = pool_of(n)
            count = int(pools.metas[n].get("shards", 0))
            shards = [found[shard_pk(pool, i)] for i in range(count) if shard_pk(pool, i) in found]
            line = found.get(line_pk(n)) or {}
            occupancy = to_occupancy(pool, pools.metas[n], shards, count)
            seen.append(SemaphoreSeen(n, occupancy, int(line.get("tail", 0)) - int(line.get("head", 0))))
        truncated = pools.truncated or len(pools.metas) > limit
        return SemaphoreScan(tuple(seen), pools.scanned, pools.pages, truncated)

    def _pools(self, limit: int, max_pages: int) -> _Pools:
        """The pool items of the semaphores, page by page, until ``limit`` of them or ``max_pages``."""
        metas: dict[str, dict[str, Any]] = {}
        request: dict[str, Any] = {
            "TableName": self.table,
            "FilterExpression": "begins_with(pk, :prefix) AND attribute_exists(version)",
            "ExpressionAttributeValues": {":prefix": {"S": f"SLOTS#{POOL_PREFIX}"}},
        }
        scanned = pages = 0
        while True:
            with translated("Scan"):
                page = self.client.scan(**request)
            pages += 1
            scanned += int(page.get("ScannedCount", 0))
            for raw in page.get("Items", []):
                meta = plain(raw)
                metas[str(meta["pk"]).removeprefix("SLOTS#").removeprefix(POOL_PREFIX)] = meta
            more = page.get("LastEvaluatedKey")
            if not more:
                return _Pools(metas, scanned, pages, False)
            if len(metas) >= limit or pages >= max_pages:
                return _Pools(metas, scanned, pages, True)
            request["ExclusiveStartKey"] = more

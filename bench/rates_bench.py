"""The rate limits' workload (``python -m bench.rates_bench``): an API quota of 120 calls a minute
behind 1,000 jobs of 30 s at MAX 100, Sluice as deployed (``sluice-linger``) with ``rateLimit``
``120/minute``, beside the same jobs without a rate.

MAX alone would start 200 a minute (100 slots, 30 s runs); the rate holds it to 120. Measured: the
most grants in any window of 60 s by the simulation's one clock (at most 120: the promise), the
most starts AWS saw in one (a start follows its grant by up to a round's claims and starts, so a
window of starts may hold a few granted just before it), the starts a minute while the backlog
lasts (at least 0.95 × 120: the rate used, not only obeyed), and the calls and write units per
start beside the plain run. The rate book is one DynamoDB item: each load a strongly consistent
GetItem, each save a PutItem of its size in write units.
"""

from __future__ import annotations

import json
import math
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from bench.harness import SYSTEMS, backlog, run
from bench.sluice_system import SluiceLinger
from sluice.adapters.memory.rate_limits import MemoryRates
from sluice.features.rate_limits import MAIN, Grant, Rate, RateBook, RateDefaults, RateLimiter

RATE = Rate(120, 60)
JOBS, MAX, SEED = 1_000, 100, 7
OUT = Path(__file__).resolve().parent / "out" / "rates.json"


class MeteredRates:
    """``RatePersistence`` in memory, each primitive metered as the DynamoDB call it makes."""

    def __init__(self, meter: Any) -> None:
        self.inner, self.meter = MemoryRates(), meter

    def load(self, where: str = MAIN) -> RateBook:
        self.meter.call("dynamodb:GetItem")
        self.meter.rru += 1
        self.meter.wait("dynamodb:GetItem")
        return self.inner.load(where)

    def save(self, book: RateBook, expected: int, where: str = MAIN) -> bool:
        text = sum(len(f"{at}:{n} ") for window in book.windows.values() for at, n in window)
        self.meter.call("dynamodb:PutItem")
        self.meter.wru += max(1, math.ceil((60 + text) / 1024))
        self.meter.wait("dynamodb:PutItem")
        return self.inner.save(book, expected, where)


class SluiceRated(SluiceLinger):
    """``sluice-linger`` under ``rateLimit=120/minute``: one rate book shared by every container."""

    name = "sluice-rate"

    last: SluiceRated | None = None  # the run ``measure`` reads its grants from

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.rates = RateLimiter(MeteredRates(ctx.meter), RateDefaults(stack=RATE))
        self.granted: dict[float, int] = {}  # grant time (s) -> grants kept (taken less given back)
        take, give_back = self.rates.take, self.rates.give_back

        def taking(scopes: Any, wanted: int, now: float) -> Grant:
            grant = take(scopes, wanted, now)
            if grant.n and grant.scopes:
                self.granted[grant.at_ms / 1000] = self.granted.get(grant.at_ms / 1000, 0) + grant.n
            return grant

        def giving_back(grant: Grant, unused: int) -> None:
            give_back(grant, unused)  # what it raises stays spent
            at = grant.at_ms / 1000
            if at in self.granted:  # as many as that entry holds (a grant of none gives none back)
                self.granted[at] -= min(unused, grant.n, self.granted[at])

        self.rates.take, self.rates.give_back = taking, giving_back  # type: ignore[method-assign]
        SluiceRated.last = self


SYSTEMS[SluiceRated.name] = SluiceRated


def busiest_minute(times: list[float] | dict[float, int], period: float) -> int:
    """The most events (each time's count, for a mapping) in one window [t, t + period)."""
    counted = times if isinstance(times, dict) else Counter(times)
    return max((sum(n for u, n in counted.items() if t <= u < t + period) for t in counted), default=0)


def measure(seed: int = SEED) -> dict[str, Any]:
    jobs = backlog("fixed30", JOBS, random.Random(seed))
    times: dict[str, list[float]] = {}
    out: dict[str, Any] = {"rate": str(RATE), "jobs": JOBS, "max": MAX}
    for name in (SluiceRated.name, "sluice-linger"):
        result = run(name, "api-quota", MAX, seed, jobs=jobs, keep_latencies=True)
        starts = sorted(result["_start_times"])
        times[name] = starts
        out[name] = {
            "started": result["started"],
            "calls_per_start": result["api_calls_per_start"],
            "write_units_per_start": result["dynamodb_wru_per_start"],
            "cost_per_million_usd": result["cost_per_million_usd"],
            "makespan_s": result["makespan_s"],
        }
    rated = times[SluiceRated.name]
    if rated:
        backlogged = rated[-1] - rated[0]  # the backlog lasts until the last start
        assert SluiceRated.last is not None
        out["busiest_minute"] = busiest_minute(SluiceRated.last.granted, RATE.period)
        out["busiest_minute_of_starts"] = busiest_minute(rated, RATE.period)
        out["starts_per_minute_backlogged"] = round((len(rated) - 1) / backlogged * 60, 1)
    return out


if __name__ == "__main__":
    figures = measure()
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(figures, indent=2) + "\n")
    json.dump(figures, sys.stdout, indent=2)

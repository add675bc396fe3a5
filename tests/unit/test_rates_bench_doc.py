"""docs/benchmarks.md, "Rate limits": the figures are the API-quota workload's own (``bench.rates_bench``),
and the workload keeps the promise (at most 120 grants in any 60 s by the simulation's one clock; its
starts follow their grants by up to a round's calls) and uses the rate (at least 0.95 of it while
backlogged)."""

from __future__ import annotations

from bench.rates_bench import RATE, measure
from tests.support.docs import DOCS


def test_the_rate_limits_section_states_the_workloads_figures():
    figures = measure()
    rated, plain = figures["sluice-rate"], figures["sluice-linger"]
    assert figures["busiest_minute"] <= RATE.count
    assert figures["starts_per_minute_backlogged"] >= 0.95 * RATE.count
    section = (DOCS / "benchmarks.md").read_text().split("## Rate limits", 1)[1]
    text = " ".join(section.split())
    for figure in (
        f"at most {figures['busiest_minute']} grants in any 60 s ({figures['busiest_minute_of_starts']} starts",
        f"{figures['starts_per_minute_backlogged']} a minute while backlogged",
        f"{rated['calls_per_start']} calls, {rated['write_units_per_start']} write",
        f"${rated['cost_per_million_usd']} per million starts",
        f"against {plain['calls_per_start']}, {plain['write_units_per_start']} and ${plain['cost_per_million_usd']}",
    ):
        assert figure in text, figure

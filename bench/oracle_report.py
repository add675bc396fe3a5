"""Sluice judged against the oracle (bench/oracle.py): the ratios, the one-screen summary, the status
event's sensitivity and queues without high-throughput mode, as results.json sections and Markdown."""

from __future__ import annotations

from typing import Any

ORACLE = "oracle-event"
ORACLE_ZERO = "oracle-0"
ORACLES = (ORACLE, ORACLE_ZERO)
DEPLOYED = "sluice-linger"
ORACLE_TARGET = 0.97  # every as-deployed run at least this share of O-event's utilisation


def _fmt(x: Any, spec: str = "") -> str:
    if x is None:
        return "-"
    return format(x, spec) if spec else str(x)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def with_oracle(runs: list[dict[str, Any]]) -> None:
    """Give every Sluice run O-event's utilisation on its jobs (same workload, MAX and seed) and the
    ratio of its own to it."""
    oracle = {(r["workload"], r["max"]): r for r in runs if r["system"] == ORACLE}
    for r in runs:
        o = oracle.get((r["workload"], r["max"]))
        if r["system"].startswith("sluice") and o is not None:
            r["oracle_utilisation"] = o["utilisation"]
            r["oracle_ratio"] = _ratio(r["utilisation"], o["utilisation"])


def _refused(r: dict[str, Any]) -> int:
    return sum(r.get("refused_by_api", {}).values())


def _row(r: dict[str, Any], zero: dict[str, Any] | None) -> dict[str, Any]:
    started = r.get("started") or r.get("jobs") or 1
    return {
        "workload": r["workload"],
        "max": r["max"],
        "utilisation": r["utilisation"],
        "oracle_utilisation": r.get("oracle_utilisation"),
        "oracle_ratio": r.get("oracle_ratio"),
        "oracle_zero_utilisation": None if zero is None else zero["utilisation"],
        "api_calls_per_start": r["api_calls_per_start"],
        "dynamodb_wru_per_start": r["dynamodb_wru_per_start"],
        "cost_per_million_usd": r["cost_per_million_usd"],
        "refused_per_start": round(_refused(r) / started, 3),
        "refused_by_api": r.get("refused_by_api", {}),
        "met": r.get("oracle_ratio") is not None and r["oracle_ratio"] >= ORACLE_TARGET,
    }


def oracle_section(runs: list[dict[str, Any]], large: dict[str, Any] | None) -> dict[str, Any]:
    """The one-screen summary: Sluice as deployed against O-event on every (workload, MAX), MAX
    10,000 included (``large``: its runs, the large section's rows)."""
    pairs = [r for r in runs if r["system"] == DEPLOYED]
    zero = {(r["workload"], r["max"]): r for r in runs if r["system"] == ORACLE_ZERO}
    rows = [_row(r, zero.get((r["workload"], r["max"]))) for r in pairs]
    if large is not None:
        by = {r["system"]: {**r, "workload": large["workload"]} for r in large["rows"]}
        for system in (DEPLOYED, "sluice-wide"):
            if system in by:
                row = _row(by[system], by.get(ORACLE_ZERO))
                row["system"] = system
                rows.append(row)
    below = [r for r in rows if not r["met"]]
    return {
        "target": ORACLE_TARGET,
        "rows": rows,
        "below": [(r["workload"], r["max"], r.get("system", DEPLOYED), r["oracle_ratio"]) for r in below],
        "met": not below,
    }


def sensitivity_section(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Sluice as deployed and O-event at each status event delay, on the same jobs."""
    rows = []
    for r in sorted(runs, key=lambda r: (r["workload"], r["max"], r["status_event_delay_s"])):
        if r["system"] != DEPLOYED:
            continue
        o = next(
            x
            for x in runs
            if x["system"] == ORACLE
            and (x["workload"], x["max"], x["status_event_delay_s"])
            == (r["workload"], r["max"], r["status_event_delay_s"])
        )
        rows.append(
            {
                "workload": r["workload"],
                "max": r["max"],
                "status_event_delay_s": r["status_event_delay_s"],
                "utilisation": r["utilisation"],
                "oracle_utilisation": o["utilisation"],
                "oracle_ratio": _ratio(r["utilisation"], o["utilisation"]),
                "refill_latency_p50_s": r["refill_latency_p50_s"],
                "makespan_ratio": r["makespan_ratio"],
            }
        )
    return {"system": DEPLOYED, "rows": rows}


def without_high_throughput_section(
    runs: list[dict[str, Any]], deployed: list[dict[str, Any]]
) -> dict[str, Any]:
    """Sluice as deployed (its queues in high-throughput mode), beside the same run on queues without
    it (``runs``: 300 calls a second per action, as a stack whose queues lack the mode would get).
    ``deployed``: the as-deployed runs and O-event's on the same jobs."""
    rows = []
    for r in sorted(runs, key=lambda r: (r["max"], r["workload"])):
        key = (r["workload"], r["max"])
        same = {x["system"]: x for x in deployed if (x["workload"], x["max"]) == key}
        ht, oracle = same.get(r["system"]), same.get(ORACLE)
        o = None if oracle is None else oracle["utilisation"]
        rows.append(
            {
                "workload": r["workload"],
                "max": r["max"],
                "utilisation": None if ht is None else ht["utilisation"],
                "oracle_utilisation": o,
                "oracle_ratio": None if ht is None else _ratio(ht["utilisation"], o),
                "refused": None if ht is None else _refused(ht),
                "cost_per_million_usd": None if ht is None else ht["cost_per_million_usd"],
                "fifo300_utilisation": r["utilisation"],
                "fifo300_oracle_ratio": _ratio(r["utilisation"], o),
                "fifo300_refused": _refused(r),
                "fifo300_cost_per_million_usd": r["cost_per_million_usd"],
            }
        )
    return {"system": DEPLOYED, "rows": rows}


def markdown(data: dict[str, Any]) -> str:
    out: list[str] = []
    section = data.get("oracle")
    if section:
        backlog = f", backlog {section['backlog']:,}" if "backlog" in section else ""
        out.append(
            f"\n#### Sluice as deployed against O-event (target: ≥ {section['target']} × O-event's utilisation"
            f"{backlog}; `{section.get('command', 'make bench')}`)\n"
        )
        out.append(
            "| workload | MAX | Sluice | O-event | Sluice / O-event | O-0 | calls / start | write units / start "
            "| refused calls / start | $ per M launches | |"
        )
        out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for r in section["rows"]:
            who = "" if r.get("system", DEPLOYED) == DEPLOYED else " (startConcurrency=100)"
            out.append(
                f"| {r['workload']}{who} | {r['max']:,} | {_fmt(r['utilisation'], '.3f')} "
                f"| {_fmt(r['oracle_utilisation'], '.3f')} | {_fmt(r['oracle_ratio'], '.3f')} "
                f"| {_fmt(r['oracle_zero_utilisation'], '.3f')} | {_fmt(r['api_calls_per_start'], '.2f')} "
                f"| {_fmt(r['dynamodb_wru_per_start'])} | {_fmt(r['refused_per_start'], '.3f')} "
                f"| {_fmt(r['cost_per_million_usd'], '.2f')} | {'met' if r['met'] else '**below**'} |"
            )
    sens = data.get("sensitivity")
    if sens:
        out.append("\n#### Status event delay (assumed 0.5 s; the event is best effort)\n")
        out.append(
            "| workload | MAX | status event (s) | Sluice | O-event | Sluice / O-event | refill latency p50 (s) "
            "| makespan / ideal |"
        )
        out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in sens["rows"]:
            out.append(
                f"| {r['workload']} | {r['max']:,} | {r['status_event_delay_s']} | {_fmt(r['utilisation'], '.3f')} "
                f"| {_fmt(r['oracle_utilisation'], '.3f')} | {_fmt(r['oracle_ratio'], '.3f')} "
                f"| {_fmt(r['refill_latency_p50_s'], '.2f')} | {_fmt(r['makespan_ratio'], '.3f')} |"
            )
    without = data.get("without_high_throughput")
    if without:
        out.append(
            "\n#### Without SQS FIFO high-throughput mode (300 calls/s per action; Sluice as deployed)\n"
        )
        out.append(
            "| workload | MAX | Sluice | without high throughput | O-event | Sluice / O-event | without "
            "| calls refused | without | $ per M launches | without |"
        )
        out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in without["rows"]:
            out.append(
                f"| {r['workload']} | {r['max']:,} | {_fmt(r['utilisation'], '.3f')} "
                f"| {_fmt(r['fifo300_utilisation'], '.3f')} | {_fmt(r['oracle_utilisation'], '.3f')} "
                f"| {_fmt(r['oracle_ratio'], '.3f')} | {_fmt(r['fifo300_oracle_ratio'], '.3f')} "
                f"| {_fmt(r['refused'], ',')} | {r['fifo300_refused']:,} | {_fmt(r['cost_per_million_usd'], '.2f')} "
                f"| {_fmt(r['fifo300_cost_per_million_usd'], '.2f')} |"
            )
    return "\n".join(out) + ("\n" if out else "")


def table(data: dict[str, Any]) -> str:
    """The summary for the console."""
    section = data.get("oracle")
    if not section:
        return ""
    lines = [f"Sluice as deployed / O-event (target >= {section['target']}):"]
    for r in section["rows"]:
        lines.append(
            f"  {r['workload']:<10} {r.get('system', DEPLOYED):<14} MAX {r['max']:>6,} "
            f"{_fmt(r['utilisation'], '.3f')} / {_fmt(r['oracle_utilisation'], '.3f')} = "
            f"{_fmt(r['oracle_ratio'], '.3f')} (O-0 {_fmt(r['oracle_zero_utilisation'], '.3f')}) "
            f"refused {r['refused_by_api']} {'met' if r['met'] else 'BELOW'}"
        )
    for r in data.get("sensitivity", {}).get("rows", []):
        lines.append(
            f"  event {r['status_event_delay_s']} s: {r['workload']} MAX {r['max']:,} "
            f"{_fmt(r['utilisation'], '.3f')} / {_fmt(r['oracle_utilisation'], '.3f')} = {_fmt(r['oracle_ratio'], '.3f')}"
        )
    for r in data.get("without_high_throughput", {}).get("rows", []):
        lines.append(
            f"  without high throughput: {r['workload']} MAX {r['max']:,} {_fmt(r['utilisation'], '.3f')} -> "
            f"{_fmt(r['fifo300_utilisation'], '.3f')} (refused {_fmt(r['refused'])} -> {r['fifo300_refused']})"
        )
    return "\n".join(lines)

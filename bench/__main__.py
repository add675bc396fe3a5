"""``python -m bench [--quick] [--seed N]``: run every benchmark and write the results.

Full run: ``bench/results.json``, the plots in ``docs/img/`` and the tables of docs/benchmarks.md
(``bench.docs_tables``). Quick run: the same under ``bench/out/`` (git-ignored), the docs untouched. Both
print the table and write ``bench/out/summary.md``.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from pathlib import Path

from bench import docs_tables, oracle_report, report, semaphore_bench
from bench import plan as plan_mod

ROOT = Path(__file__).resolve().parent.parent
DOCS_PAGE = ROOT / "docs" / "benchmarks.md"
DEFAULT_SEED = 20261129


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller scale, under a minute")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--workers", type=int, default=None, help="processes (default: up to 2)")
    parser.add_argument("--no-moto", action="store_true", help="skip the call-count check against moto")
    parser.add_argument(
        "--semaphore-only",
        action="store_true",
        help="run only the semaphore step's benchmark and update its section of the results file",
    )
    parser.add_argument(
        "--dag-only",
        action="store_true",
        help="run only the DAG workload and write bench/out/results-dag.json (the results file is kept)",
    )
    parser.add_argument(
        "--tenants-only",
        action="store_true",
        help="run only the tenants workload and write bench/out/results-tenants.json (the results file is kept)",
    )
    parser.add_argument(
        "--lanes-only",
        action="store_true",
        help="run only the lanes workload and write bench/out/results-lanes.json (the results file is kept)",
    )
    parser.add_argument(
        "--oracle-only",
        action="store_true",
        help="run only Sluice as deployed and the oracles (the summary, the status event's sensitivity, "
        "queues without high throughput) and write bench/out/results-oracle.json (the results file is kept)",
    )
    parser.add_argument(
        "--idle-only",
        action="store_true",
        help="run only the payloads enqueued while slots are free and the idle hour, and update their "
        "sections of the results file (and the targets)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="redo the report and plots from the last run's bench/out/raw.pickle",
    )
    args = parser.parse_args(argv)

    began = time.monotonic()
    plan = plan_mod.Plan.make(quick=args.quick, seed=args.seed)
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results-quick.json" if plan.quick else ROOT / "bench" / "results.json"
    img = out / "img" if plan.quick else ROOT / "docs" / "img"

    print(
        f"sluice bench: seed {plan.seed}, backlog {plan.backlog:,}{' (quick)' if plan.quick else ''}",
        flush=True,
    )
    if args.semaphore_only:
        return _semaphore_only(plan, results_path, out)
    if args.dag_only:
        return _dag_only(plan, out)
    if args.tenants_only:
        return _tenants_only(plan, out)
    if args.lanes_only:
        return _lanes_only(plan, out)
    if args.oracle_only:
        return _oracle_only(plan, out, args.workers, results_path)
    if args.idle_only:
        return _idle_only(plan, args.workers, results_path)
    raw = out / ("raw-quick.pickle" if plan.quick else "raw.pickle")
    if args.report_only:
        results = pickle.loads(raw.read_bytes())
    else:
        results = plan_mod.execute(plan, args.workers, moto=not args.no_moto)
        raw.write_bytes(pickle.dumps(results))
    results = dict(results)
    scaled, moto = results.pop("scale"), results.pop("moto")
    semaphore_runs = results.pop("semaphore", [])
    large_runs = results.get(
        "large", []
    )  # kept: the runs without high-throughput mode are judged beside them
    dag_runs = results.pop("dag", [])
    tenant_runs = results.pop("tenants", [])
    lane_runs = results.pop("lanes", [])
    command = (
        "make bench"
        + (" QUICK=1" if plan.quick else "")
        + (f" SEED={plan.seed}" if plan.seed != DEFAULT_SEED else "")
    )
    data, cpu = report.assemble(plan, results, scaled, moto, command)
    if semaphore_runs:
        data["semaphore"] = report.semaphore_section(plan, semaphore_runs)
    if large_runs:
        data["large"] = report.large_section(plan, large_runs)
    data["oracle"] = oracle_report.oracle_section(data["runs"], data.get("large"))
    data["oracle"].update(command=command, seed=plan.seed, backlog=plan.backlog)
    if dag_runs:
        data["dag"] = report.dag_section(plan, dag_runs)
    if tenant_runs:
        data["tenants"] = report.tenants_section(plan, tenant_runs)
    if lane_runs:
        data["lanes"] = report.lanes_section(plan, lane_runs)
    results_path.write_text(json.dumps({**data, "cpu": cpu}, indent=1) + "\n")
    _write_docs(plan, results_path)
    summary = report.markdown(data, cpu)
    if "large" in data:
        summary += report.large_markdown(data["large"])
    if "dag" in data:
        summary += report.dag_markdown(data["dag"])
    if "tenants" in data:
        summary += report.tenants_markdown(data["tenants"])
    if "lanes" in data:
        summary += report.lanes_markdown(data["lanes"])
    if "semaphore" in data:
        summary += report.semaphore_markdown(data["semaphore"])
    (out / "summary.md").write_text(summary)
    written = report.plots(data, results, cpu, img)
    print(report.table(data))
    print(oracle_report.table(data))
    if "large" in data:
        print(report.large_table(data["large"]))
    if "dag" in data:
        print(report.dag_table(data["dag"]))
    if "tenants" in data:
        print(report.tenants_table(data["tenants"]))
    if "lanes" in data:
        print(report.lanes_table(data["lanes"]))
    if "semaphore" in data:
        print(report.semaphore_table(data["semaphore"]))
    print(
        f"\nwrote {results_path.relative_to(ROOT)}, bench/out/summary.md and {len(written)} plots in {img.relative_to(ROOT)}/"
    )
    print(f"took {time.monotonic() - began:.0f} s")
    return 0


def _semaphore_only(plan: plan_mod.Plan, results_path: Path, out: Path) -> int:
    """The semaphore runs alone; the other sections of the results file are kept as they are."""
    began = time.monotonic()
    runs = [
        semaphore_bench.run_task(a) for a in semaphore_bench.plan_runs(plan.semaphore_executions, plan.seed)
    ]
    section = report.semaphore_section(plan, runs)
    data = json.loads(results_path.read_text()) if results_path.exists() else {}
    data["semaphore"] = section
    results_path.write_text(json.dumps(data, indent=1) + "\n")
    (out / "summary-semaphore.md").write_text(report.semaphore_markdown(section))
    print(report.semaphore_table(section))
    print(
        f"\nwrote the semaphore section of {results_path.relative_to(ROOT)} and bench/out/summary-semaphore.md"
    )
    print(f"took {time.monotonic() - began:.0f} s")
    return 0


def _dag_only(plan: plan_mod.Plan, out: Path) -> int:
    """The DAG workload alone (two runs, a few seconds): bench/out/results-dag.json and
    bench/out/summary-dag.md; the results file is left as it is."""
    began = time.monotonic()
    runs = [plan_mod._dag_task(args) for _, args in plan_mod.dag_tasks(plan)]
    section = report.dag_section(plan, runs)
    (out / "results-dag.json").write_text(json.dumps({"dag": section}, indent=1) + "\n")
    (out / "summary-dag.md").write_text(report.dag_markdown(section))
    print(report.dag_table(section))
    print("\nwrote bench/out/results-dag.json and bench/out/summary-dag.md")
    print(f"took {time.monotonic() - began:.0f} s")
    return 0


def _tenants_only(plan: plan_mod.Plan, out: Path) -> int:
    """The tenants workload alone (seven runs, seconds each: keys, no keys and a fair lane, in each
    arrival pattern, late and together; heavy's burst alone in the fair lane):
    bench/out/results-tenants.json and bench/out/summary-tenants.md; the results file is left as
    it is."""
    began = time.monotonic()
    runs = [plan_mod._tenants_task(args) for _, args in plan_mod.tenant_tasks(plan)]
    section = report.tenants_section(plan, runs)
    (out / "results-tenants.json").write_text(json.dumps({"tenants": section}, indent=1) + "\n")
    (out / "summary-tenants.md").write_text(report.tenants_markdown(section))
    print(report.tenants_table(section))
    print("\nwrote bench/out/results-tenants.json and bench/out/summary-tenants.md")
    print(f"took {time.monotonic() - began:.0f} s")
    return 0


def _oracle_only(plan: plan_mod.Plan, out: Path, workers: int | None, results_path: Path) -> int:
    """Sluice as deployed against the oracles alone: bench/out/results-oracle.json and
    bench/out/summary-oracle.md, and the sections ``oracle``, ``sensitivity`` and
    ``without_high_throughput`` of the results file (the others are kept as they are, as
    ``--semaphore-only`` does)."""
    began = time.monotonic()
    runs = plan_mod.run_tasks(plan_mod.oracle_tasks(plan), workers)
    backlog = sorted(runs.get("backlog", []), key=report._order)
    oracle_report.with_oracle(backlog)
    large = report.large_section(plan, runs.get("large", []))
    data: dict = {"oracle": oracle_report.oracle_section(backlog, large)}
    data["oracle"]["command"] = "python -m bench --oracle-only" + (" --quick" if plan.quick else "")
    data["oracle"]["seed"], data["oracle"]["backlog"] = plan.seed, plan.backlog
    data["sensitivity"] = oracle_report.sensitivity_section(runs.get("sensitivity", []))
    data["without_high_throughput"] = oracle_report.without_high_throughput_section(
        runs.get("without-high-throughput", []), [*backlog, *runs.get("large", [])]
    )
    (out / "results-oracle.json").write_text(json.dumps(data, indent=1) + "\n")
    merge_sections(results_path, data)
    _write_docs(plan, results_path)
    (out / "summary-oracle.md").write_text(oracle_report.markdown(data))
    print(oracle_report.table(data))
    print(
        f"\nwrote bench/out/results-oracle.json, bench/out/summary-oracle.md and the summary's sections of "
        f"{results_path.relative_to(ROOT)}"
    )
    print(f"took {time.monotonic() - began:.0f} s")
    return 0


def _idle_only(plan: plan_mod.Plan, workers: int | None, results_path: Path) -> int:
    """The trickle and the idle hour alone (seconds): their sections of the results file, the
    linger's cost and the targets that use them; the other sections are kept as they are."""
    began = time.monotonic()
    runs = plan_mod.run_tasks(plan_mod.idle_tasks(plan), workers)
    data = json.loads(results_path.read_text())
    report.replace_idle(data, plan, runs["trickle"], runs["idle"])
    merge_sections(results_path, data)
    _write_docs(plan, results_path)
    print(report.table(data))
    print(f"\nwrote the trickle, idle, linger and target sections of {results_path.relative_to(ROOT)}")
    print(f"took {time.monotonic() - began:.0f} s")
    return 0


def _write_docs(plan: plan_mod.Plan, results_path: Path) -> None:
    """The tables of docs/benchmarks.md from the results file just written (a full-scale run only)."""
    if plan.quick:
        return
    changed = docs_tables.sync(DOCS_PAGE, json.loads(results_path.read_text()))
    print(
        f"{changed} table(s) of {DOCS_PAGE.relative_to(ROOT)} rewritten from {results_path.relative_to(ROOT)}"
    )


def merge_sections(results_path: Path, sections: dict) -> None:
    """Write ``sections`` into the results file, keeping its other sections."""
    data = json.loads(results_path.read_text()) if results_path.exists() else {}
    data.update(sections)
    cpu = data.pop("cpu", None)
    results_path.write_text(
        json.dumps({**data, **({"cpu": cpu} if cpu is not None else {})}, indent=1) + "\n"
    )


def _lanes_only(plan: plan_mod.Plan, out: Path) -> int:
    """The lanes workload alone (three runs, seconds each): bench/out/results-lanes.json and
    bench/out/summary-lanes.md; the results file is left as it is."""
    began = time.monotonic()
    runs = [plan_mod._lanes_task(args) for _, args in plan_mod.lane_tasks(plan)]
    section = report.lanes_section(plan, runs)
    (out / "results-lanes.json").write_text(json.dumps({"lanes": section}, indent=1) + "\n")
    (out / "summary-lanes.md").write_text(report.lanes_markdown(section))
    print(report.lanes_table(section))
    print("\nwrote bench/out/results-lanes.json and bench/out/summary-lanes.md")
    print(f"took {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``make demo``: Sluice end to end on an embedded AWS.

    osls package ──► moto server (127.0.0.1, free port) ──► deploy as `sls deploy` does
          │
          ▼
    demo workflow (Wait for $.seconds, Choice → Fail when $.fail), really executed by moto
          │
    batch ──► sluice.enqueue (valid) + raw SendMessage (invalid) ──► FIFO queue
          │
    loop: every --tick s fire the deployed schedule rule        → launcher handler
          poll ListExecutions; each execution that ended        → completion handler (once;
                                                                   one event twice, on purpose)
          sample running / queue / DLQ                          → dashboard
          │
    account for every message, chart running vs MAX, exit 1 if MAX was exceeded or one is missing
          │
    the stack's semaphore example workflow, 6 executions at once, through the deployed semaphore
    function: never more inside its section than the semaphore's limit (demo_semaphore.py)
          │
    --keep: the loop goes on (schedule, status events) until Ctrl-C, for the operator CLI

The launcher and completion functions run as deployed: the code of the zip fetched back from the
deployment bucket, in warm worker processes (Lambda's containers, ``sluice.local.lambdas``), with the
environment GetFunctionConfiguration returns for them. Their logs and metrics go to
``<out>/handlers.log``.

    demo.py          options, the phases (package, deploy, containers, run, account) and ``main``
    demo_batch.py    the workflow, the batch and the producer that sends it
    demo_run.py      the run loop: playing EventBridge, sampling, the dashboard
    demo_report.py   the reckoning: every message's fate, the peak, the summary and the chart
    demo_semaphore.py  the semaphore example workflow through the deployed semaphore function
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sluice.local import demo_dag, demo_rate
from sluice.local.demo_batch import DEMO_WORKFLOW, Producer, Sent, generate_batch, load_batch
from sluice.local.demo_options import Options
from sluice.local.demo_report import Result, account, summary_lines
from sluice.local.demo_run import Run
from sluice.local.demo_semaphore import SectionResult, SemaphoreSection
from sluice.local.embedded import (
    ACCOUNT,
    REGION,
    UPDATE_TEMPLATE,
    DeployError,
    EmbeddedAws,
    PackagingError,
    package_stack,
)

STAGE = "demo"
STACK = f"sluice-{STAGE}"
WORKFLOW = "sluice-demo-jobs"
WORKFLOW_ARN = f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:{WORKFLOW}"
ACCOUNTING = (
    "Accounting for every message from AWS's side (Step Functions, the table, the queues, the DLQ) "
    "and drawing the chart"
)


@dataclass(frozen=True)
class Played:
    """What the run sent, and how it went: when it started, whether the time ran out."""

    sent: list[Sent]
    extras: demo_dag.Extras
    started: float
    timed_out: bool


class Demo:
    def __init__(self, options: Options, console: Any) -> None:
        self.o = options
        self.console = console

    # -- phases -------------------------------------------------------------------------------

    def run(self) -> Result:
        o = self.o
        o.out.mkdir(parents=True, exist_ok=True)
        log = o.out / "handlers.log"
        log.write_text("")
        planned = load_batch(o.payloads) if o.payloads else generate_batch(o.count, o.seed)
        with tempfile.TemporaryDirectory(prefix="sluice-demo-") as work:
            package = self._package(Path(work))
            with EmbeddedAws(own_process=True, log=o.out / "moto.log") as aws:
                run = Run(o, self.console, STACK)
                run.snapshot.endpoint = aws.endpoint
                deployment = self._deploy(aws, package)
                scheduled = {key for key, _ in deployment.scheduled()}
                sizes = {key: 1 if key in scheduled else o.workers for key in deployment.functions}
                containers = {
                    key: deployment.containers(key, size=size, log=log) for key, size in sizes.items()
                }
                try:
                    with self._step(
                        "Starting Lambda containers: "
                        + ", ".join(f"{key} ×{size}" for key, size in sorted(sizes.items()))
                    ):
                        for pool in containers.values():
                            pool.warm()
                    played = self._play(aws, run, deployment, containers, planned)
                    section = self._semaphore_section(package, deployment, containers)
                    result = self._reckon(aws, run, deployment, played, section)
                    result.log = str(log)
                    (o.out / "summary.json").write_text(json.dumps(asdict(result), indent=2, default=str))
                    self._report(result)
                    if o.keep:
                        self._hold(aws, run, deployment, containers)
                finally:
                    for pool in containers.values():
                        pool.close()
        return result

    def _package(self, work: Path) -> Path:
        with self._step(f"Packaging the stack with osls (stage {STAGE}, MAX {self.o.maximum})"):
            return package_stack(
                work,
                stage=STAGE,
                params={
                    "maxConcurrency": str(self.o.maximum),
                    "stateMachineArn": WORKFLOW_ARN,
                    "lanes": demo_dag.lanes_param(self.o.maximum),
                    "laneRateLimits": demo_rate.lane_rates_param(),
                },
            )

    def _deploy(self, aws: EmbeddedAws, package: Path) -> Any:
        """The demo workflow, then the stack driving it."""
        with self._step(f"Deploying into the embedded AWS at {aws.endpoint}"):
            aws.execute_state_machines()
            aws.client("stepfunctions").create_state_machine(
                name=WORKFLOW,
                definition=json.dumps(DEMO_WORKFLOW),
                roleArn=f"arn:aws:iam::{ACCOUNT}:role/{WORKFLOW}",
            )
            deployment = aws.deploy(package, STACK)
        if deployment.outputs["StateMachineArn"] != WORKFLOW_ARN:
            raise RuntimeError(f"the stack drives {deployment.outputs['StateMachineArn']}")
        return deployment

    def _play(
        self, aws: EmbeddedAws, run: Run, deployment: Any, containers: dict[str, Any], planned: list[Any]
    ) -> Played:
        """A producer sends the batch while Sluice already runs, as producers do; then the small DAG
        and the 600 KiB payload, with the `sluice enqueue` command. The run loop plays EventBridge
        until the work is done (or the time is up)."""
        producer = Producer(
            aws,
            deployment.outputs["QueueUrl"],
            planned,
            self.o.payloads is None,
            then=lambda: demo_dag.send(aws.environ(), STAGE),
        )
        run.snapshot.batch = len(planned)
        run.snapshot.extra = (
            len(demo_dag.DAG)
            + 1
            + len(demo_dag.TENANT_JOBS)
            + len(demo_dag.URGENT_JOBS)
            + len(demo_rate.RATE_JOBS)
        )
        print(
            f"Enqueueing {len(planned)} messages while Sluice runs, then a DAG of "
            f"{len(demo_dag.DAG)}, a {demo_dag.SCENE_BYTES // 1024} KiB payload, a tenant's "
            f"{len(demo_dag.TENANT_JOBS)} under a concurrency key of cap {demo_dag.TENANT_CAP} "
            f"and {len(demo_dag.URGENT_JOBS)} in the lane {demo_dag.URGENT_LANE!r} (MAX "
            f"{demo_dag.URGENT_MAX}, priority 1), then {len(demo_rate.RATE_JOBS)} in the lane "
            f"{demo_rate.RATE_LANE!r} at {demo_rate.RATE} with `sluice enqueue` …",
            flush=True,
        )
        started = time.time()
        producer.start()
        timed_out = run.loop(deployment, containers, started, producer)
        producer.join()
        if producer.error is not None:
            raise producer.error
        extras: demo_dag.Extras = producer.then_result or demo_dag.Extras()
        return Played(producer.sent, extras, started, timed_out)

    def _reckon(
        self, aws: EmbeddedAws, run: Run, deployment: Any, played: Played, section: SectionResult | None
    ) -> Result:
        """Every message accounted for, with the DAG's check and the semaphore section's."""
        with self._step(ACCOUNTING):
            dag = demo_dag.check(aws, deployment.outputs, played.extras, played.started)
            result = account(
                run,
                self.o,
                deployment,
                played.sent,
                played.started,
                played.timed_out,
                also=played.extras.sent,
            )
        result.dag = dag.to_dict()
        result.problems += dag.problems
        result.ok = result.ok and dag.ok
        result.rate = demo_rate.check(aws, deployment.outputs, played.extras.rated, played.started)
        result.problems += result.rate["problems"]
        result.ok = result.ok and not result.rate["problems"]
        if section is not None:
            result.semaphore = section.to_dict()
            result.problems += section.problems()
            result.ok = result.ok and section.ok
        return result

    def _semaphore_section(
        self, package: Path, deployment: Any, containers: dict[str, Any]
    ) -> SectionResult | None:
        """The stack's semaphore example workflow, a few executions at once, through the deployed
        semaphore function (``sluice.local.demo_semaphore``)."""
        if "semaphore" not in containers or "SemaphoreExampleStateMachineArn" not in deployment.outputs:
            return None
        template = json.loads((package / UPDATE_TEMPLATE).read_text())
        with self._step("Running the semaphore example workflow (6 executions, semaphore 'example')"):
            return SemaphoreSection(
                deployment.aws, deployment.outputs, template, containers["semaphore"], deployment.route
            ).run()

    def _report(self, result: Result) -> None:
        for line in summary_lines(result):
            style = "" if not line.startswith("RESULT") else ("bold green" if result.ok else "bold red")
            self.console.print(line, style=style, markup=False, highlight=False, soft_wrap=True)

    def _hold(self, aws: EmbeddedAws, run: Run, deployment: Any, containers: dict[str, Any]) -> None:
        """Keep the embedded AWS up for the operator CLI until Ctrl-C, still playing EventBridge: the
        schedule fires and each execution that ends gets its status-change event, as on AWS."""
        exports = {**aws.environ()}
        self.console.print(
            "\nThe embedded AWS stays up, and the demo goes on playing EventBridge: the schedule fires\n"
            f"every {self.o.tick:g} s and each execution that ends gets its status-change event. "
            "In another shell:\n"
            + "".join(f"  export {k}={v}\n" for k, v in exports.items())
            + f"  sluice status --stage {STAGE}\n"
            + "Ctrl-C stops it.",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )

        def echo(line: str) -> None:
            self.console.print(
                f"[{time.strftime('%H:%M:%S')}] {line}", markup=False, highlight=False, soft_wrap=True
            )

        with contextlib.suppress(KeyboardInterrupt):
            run.keep(deployment, containers, echo=echo)

    @contextlib.contextmanager
    def _step(self, text: str) -> Any:
        began = time.monotonic()
        if self.console.is_terminal:
            with self.console.status(text + " …"):
                yield
        else:
            print(text + " …", flush=True)
            yield
        self.console.print(
            f"{text}: done in {time.monotonic() - began:.1f} s", markup=False, highlight=False, soft_wrap=True
        )


def parse_args(argv: list[str] | None = None) -> Options:
    p = argparse.ArgumentParser(
        prog="python -m sluice.local.demo",
        description="Run Sluice end to end on an embedded AWS (moto server): package, deploy, run a batch.",
    )
    p.add_argument(
        "--max", type=int, default=10, dest="maximum", help="MAX, the most executions at once (10)"
    )
    p.add_argument("--count", type=int, default=200, help="messages in the generated batch (200)")
    p.add_argument("--payloads", type=Path, help="send this file instead (JSON array, object or JSON Lines)")
    p.add_argument("--seed", type=int, default=7, help="seed of the generated batch (7)")
    p.add_argument("--out", type=Path, default=Path("demo-out"), help="chart, summary and logs (demo-out/)")
    p.add_argument("--tick", type=float, default=2.0, help="seconds between launcher runs (2)")
    p.add_argument("--workers", type=int, default=4, help="completion invocations at once (4)")
    p.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds (300)")
    p.add_argument("--keep", action="store_true", help="keep the embedded AWS up afterwards (for `sluice`)")
    view = p.add_mutually_exclusive_group()
    view.add_argument("--live", dest="live", action="store_true", default=None, help="live dashboard")
    view.add_argument("--plain", dest="live", action="store_false", help="plain progress lines")
    a = p.parse_args(argv)
    if a.maximum < 1:
        p.error("--max must be at least 1")
    if a.count < 1:
        p.error("--count must be at least 1")
    if a.payloads and not a.payloads.is_file():
        p.error(f"--payloads {a.payloads}: no such file")
    return Options(
        maximum=a.maximum,
        count=a.count,
        payloads=a.payloads,
        seed=a.seed,
        out=a.out,
        tick=a.tick,
        workers=max(1, a.workers),
        timeout=a.timeout,
        live=a.live,
        keep=a.keep,
    )


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    options = parse_args(argv)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    logging.getLogger("moto").setLevel(logging.CRITICAL)
    import warnings

    warnings.filterwarnings("ignore", message="Tried to parse AWS::", category=UserWarning)
    console = Console()

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    # SIGTERM stops as Ctrl-C does: the containers and the embedded AWS are shut down on the way out.
    signal.signal(signal.SIGTERM, stop)
    try:
        result = Demo(options, console).run()
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130
    except (PackagingError, DeployError) as exc:
        console.print(f"demo: {exc}", style="bold red", markup=False, highlight=False)
        return 2
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())

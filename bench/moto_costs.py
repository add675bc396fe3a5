"""``python -m bench.moto_costs [--max 40 200 1000]``: AWS calls and DynamoDB write units per start,
measured on moto against Sluice's real adapters and handlers.

For each MAX, in process (``moto.mock_aws``), a stack is built with the tests' support
(``tests.support.aws.build_stack``: SQS FIFO queue and DLQ, the table, a state machine, MAX in SSM)
configured as deployed for what the counts depend on: 8 holders per slot shard, MAX cached 5 s,
maxReceiveCount 10, no linger, one FIFO group per payload (the receive wait is 0, not 1 s: with
messages waiting it changes no count). Then:

    setup    the slot pool is created (``set_limit``, what the first claim of a stack's life does);
             counted apart, it happens once per stack
    fill     MAX payloads queued; scheduled ticks (``handlers.launcher.handler``, reconciliation
             first) until MAX executions run
    steady   min(MAX, 200) more queued; one running execution after another ends (in a seeded
             random order, the virtual clock moving 30 s / MAX between two: 30 s jobs) and its
             status event goes to ``handlers.completion.handler``: release, then the refill
             (``admit(max_new=1)``)
    idle     one more scheduled tick with every slot held and nothing queued

Two warm Lambda containers play the two functions (a ``Runtime`` each, kept between invocations,
as ``handlers._shared`` keeps it): the launcher's runs the ticks, the completion function's the
events. Prints a markdown table and writes ``bench/out/moto_costs.json``.

What is measured, and how
-------------------------

*Calls*: every botocore call of the two containers' clients (SQS, DynamoDB, Step Functions, SSM),
counted by a ``before-call`` hook, per phase. Calls per start = the phase's calls / the executions
it started. The producer's sends, the test's reads and the ending of executions in moto are made
with other clients (or moto's backend) and are not counted.

*DynamoDB write units*, billed as DynamoDB bills a standard table on demand (moto's own
``ConsumedCapacity`` is not used: moto does not apply these rules). For every written item of
PutItem, UpdateItem, DeleteItem, BatchWriteItem and each action of TransactWriteItems:

    units = ceil(max(size before, size after) / 1 KB), at least 1;  × 2 inside TransactWriteItems

A ``ConditionCheck`` action is billed like a write of its item (2 per KB) but not counted as a
write of the item. A write whose condition fails is billed on the item as it stands (DynamoDB
charges failed conditional writes); a cancelled transaction is billed the same way for each of its
actions (an assumption: every action was prepared). The sizes before and after each call are read
from moto's backend objects directly in the ``before-call`` and ``after-call`` hooks (no client
call is added) and sized with DynamoDB's documented item-size rules
(``tests.reliability.actors.item_size``: attribute names and string values in UTF-8 bytes, a
number about one byte per two significant digits plus one — rounded up there: a number may come
out a byte over —, a map or list 3 bytes plus 1 per element).

*Writes per item per start*: how many write actions touched each item (failed ones included),
divided by the phase's starts; the table shows the most written item of the steady state and the
``LEDGER`` item. Sizes: the largest each item ever was in the run.

Not measured: concurrent containers (several completion functions at once each keep their own MAX
cache and state machine check, and may race for a shard: each lost race is one more claim),
retries (none are needed on moto), read units.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import math
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "moto_costs.json"
DEFAULT_MAX = (40, 200, 1000)
PER_SHARD = 8  # SLUICE_SLOTS_PER_SHARD as deployed
MAX_CACHE_SECONDS = 5  # SLUICE_MAX_CACHE_SECONDS as deployed
JOB_SECONDS = 30.0  # steady state: every execution runs this long, so MAX / 30 end per second
TICK_SECONDS = 60.0  # the schedule, rate(1 minute)
STEADY_CAP = 200  # completions measured in steady state: min(MAX, this)
SEED = 20261129
KB = 1024
SERVICES = ("sqs", "dynamodb", "stepfunctions", "ssm")
WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"})
# A clock with the digits of a real one: billed sizes depend on how long the stored times are.
T0 = 1_800_000_000.123456
KEY = "bench_moto_costs"  # our entry in botocore's request context

# The targets (#10, point 3), and the "before" numbers of the single-item ledger.
TARGETS = {
    "refill_calls_per_start": 4.0,
    "wcu_per_start": 12.0,
    "writes_per_item_per_start_at_max_200": 0.25,
    "fill_calls_per_start": 2.3,
}
BEFORE = {
    40: {"fill": 2.48, "refill": 8.53, "wcu": 24, "ledger_writes": 2.1, "ledger_kb": 2.5},
    200: {"fill": 2.33, "refill": 8.19, "wcu": 64, "ledger_writes": 2.0, "ledger_kb": 12},
}


def write_units(size: int, *, transactional: bool) -> int:
    """What DynamoDB bills for writing an item of ``size`` bytes (the larger of its two images)."""
    units = max(1, math.ceil(size / KB))
    return 2 * units if transactional else units


def kind_of(pk: str) -> str:
    """``EXEC#x`` → ``EXEC#*``; ``SLOTS#launcher#3`` → ``SLOTS#launcher#*``; ``LEDGER`` as is."""
    if pk.startswith("SLOTS#"):
        head, _, tail = pk.rpartition("#")
        return f"{head}#*" if tail.isdigit() and head != "SLOTS" else pk
    head, sep, _ = pk.partition("#")
    return f"{head}#*" if sep else pk


@dataclass
class Phase:
    name: str
    calls: Counter = field(default_factory=Counter)  # "dynamodb:TransactWriteItems" -> calls
    wcu: int = 0
    writes: Counter = field(default_factory=Counter)  # pk -> write actions
    failed_writes: int = 0  # write actions whose condition failed (or whose transaction was cancelled)
    starts: int = 0
    invocations: int = 0

    def summary(self) -> dict[str, Any]:
        per = max(1, self.starts)
        hottest, hottest_writes = self.writes.most_common(1)[0] if self.writes else ("", 0)
        total = sum(self.calls.values())
        return {
            "starts": self.starts,
            "invocations": self.invocations,
            "calls": total,
            "calls_per_start": round(total / per, 3),
            "calls_per_start_by_api": {k: round(v / per, 3) for k, v in sorted(self.calls.items())},
            "dynamodb_calls_per_start": round(
                sum(v for k, v in self.calls.items() if k.startswith("dynamodb:")) / per, 3
            ),
            "wcu": self.wcu,
            "wcu_per_start": round(self.wcu / per, 3),
            "item_writes": sum(self.writes.values()),
            "failed_writes": self.failed_writes,
            "hottest_item": hottest,
            "hottest_item_writes": hottest_writes,
            "hottest_item_writes_per_start": round(hottest_writes / per, 4),
            "ledger_writes": self.writes.get("LEDGER", 0),
            "ledger_writes_per_start": round(self.writes.get("LEDGER", 0) / per, 4),
            "writes_per_start_by_kind": {
                kind: round(n / per, 4) for kind, n in sorted(_by_kind(self.writes).items())
            },
        }


def _by_kind(writes: Counter) -> Counter:
    out: Counter = Counter()
    for pk, n in writes.items():
        out[kind_of(pk)] += n
    return out


class Meter:
    """botocore hooks on the clients under test: calls, write units and item writes, per phase."""

    def __init__(self, table_name: str) -> None:
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.dynamodb.models import dynamodb_backends

        from tests.support.aws import REGION

        self.table_name = table_name
        self.backend = dynamodb_backends[DEFAULT_ACCOUNT_ID][REGION]
        self.phase = Phase("unmetered")
        self.largest: dict[str, int] = {}  # pk -> the largest size seen, in bytes

    def attach(self, client: Any) -> None:
        service = client.meta.service_model.service_name
        client.meta.events.register("before-call.*.*", lambda **kw: self._before(service, **kw))
        if service == "dynamodb":
            client.meta.events.register("after-call.dynamodb.*", self._after)

    # -- the hooks --------------------------------------------------------------------------------

    def _before(self, service: str, *, model: Any, params: Any, context: dict[str, Any], **_: Any) -> None:
        self.phase.calls[f"{service}:{model.name}"] += 1
        if service != "dynamodb" or model.name not in WRITES:
            return
        body = json.loads(params["body"] or b"{}")
        actions = self._actions(model.name, body)
        context[KEY] = (self.phase, actions, [self.size(pk) for pk, _, _ in actions])

    def _after(self, *, http_response: Any, context: dict[str, Any], **_: Any) -> None:
        pending = context.pop(KEY, None)
        if pending is None:
            return
        phase, actions, before = pending
        ok = http_response.status_code < 300
        for (pk, transactional, counted), was in zip(actions, before, strict=True):
            size = max(was, self.size(pk)) if ok else was
            phase.wcu += write_units(size, transactional=transactional)
            if counted:
                phase.writes[pk] += 1
                phase.failed_writes += not ok

    # -- items ------------------------------------------------------------------------------------

    def _actions(self, operation: str, body: dict[str, Any]) -> list[tuple[str, bool, bool]]:
        """(pk, transactional, counts as a write of the item) for each item the call writes."""
        out: list[tuple[str, bool, bool]] = []
        if operation == "TransactWriteItems":
            for entry in body.get("TransactItems", []):
                ((kind, action),) = entry.items()
                if action.get("TableName") == self.table_name:
                    key = action.get("Key") or action.get("Item") or {}
                    out.append((key["pk"]["S"], True, kind != "ConditionCheck"))
        elif operation == "BatchWriteItem":
            for request in body.get("RequestItems", {}).get(self.table_name, []):
                put, delete = request.get("PutRequest"), request.get("DeleteRequest")
                key = put["Item"] if put else delete["Key"]
                out.append((key["pk"]["S"], False, True))
        elif body.get("TableName") == self.table_name:
            key = body.get("Key") or body.get("Item") or {}
            out.append((key["pk"]["S"], False, True))
        return out

    def size(self, pk: str) -> int:
        """The item's size now by DynamoDB's rules (0 when absent), read from moto's backend."""
        from moto.dynamodb.models.dynamo_type import DynamoType

        from tests.reliability.actors import item_size

        table = self.backend.tables.get(self.table_name)
        stored = table.items.get(DynamoType({"S": pk})) if table is not None else None
        if stored is None:
            return 0
        size = item_size(stored.to_json()["Attributes"])
        if size > self.largest.get(pk, 0):
            self.largest[pk] = size
        return size

    def sizes(self) -> dict[str, Any]:
        by_kind: dict[str, tuple[int, str]] = {}
        for pk, size in self.largest.items():
            kind = kind_of(pk)
            if size > by_kind.get(kind, (-1, ""))[0]:
                by_kind[kind] = (size, pk)
        largest = max(self.largest.items(), key=lambda kv: kv[1], default=("", 0))
        return {
            "largest_item": largest[0],
            "largest_item_bytes": largest[1],
            "ledger_bytes": self.largest.get("LEDGER", 0),
            "largest_by_kind": {k: {"bytes": s, "item": pk} for k, (s, pk) in sorted(by_kind.items())},
        }


def _body(i: int) -> str:
    job = f"job-{i:06d}"
    return f'{{"id":"{job}","task":"bench","seq":{i}}}'  # the shape of bench.harness's payloads


def _send(sqs: Any, url: str, indexes: range) -> None:
    """Queue payloads, one FIFO group each, ten per call (the producer: not counted)."""
    batch: list[dict[str, str]] = []
    for i in indexes:
        batch.append(
            {
                "Id": str(len(batch)),
                "MessageBody": _body(i),
                "MessageGroupId": f"job-{i:06d}",
                "MessageDeduplicationId": f"d{i}",
            }
        )
        if len(batch) == 10 or i == indexes[-1]:
            sqs.send_message_batch(QueueUrl=url, Entries=batch)
            batch = []


def _running(state_machine_arn: str) -> list[str]:
    """RUNNING executions, in the order they started, from moto's backend (no call)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.stepfunctions.models import stepfunctions_backends

    from tests.support.aws import REGION

    backend = stepfunctions_backends[DEFAULT_ACCOUNT_ID][REGION]
    machine = backend.describe_state_machine(state_machine_arn)
    return [e.name for e in machine.executions if e.status == "RUNNING"]


def _finish(state_machine_arn: str, name: str) -> dict[str, Any]:
    """End ``name`` in moto and return its status event (``Stack.finish``, without a new client)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.stepfunctions.models import stepfunctions_backends

    from sluice.core.names import execution_arn
    from tests.support.aws import REGION, status_change_event

    backend = stepfunctions_backends[DEFAULT_ACCOUNT_ID][REGION]
    execution = backend.describe_execution(execution_arn(state_machine_arn, name))
    execution.status = "SUCCEEDED"
    execution.stop_date = datetime.now(UTC)
    return status_change_event(state_machine_arn, name, "SUCCEEDED")


@contextmanager
def _quiet_handlers() -> Iterator[tuple[Any, Any, Any]]:
    """The Lambda entry points, logging warnings only while measuring (their INFO lines would flood
    the output); the log levels and the warm runtime are put back afterwards."""
    os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "Sluice")
    os.environ.setdefault("POWERTOOLS_SERVICE_NAME", "sluice-bench")
    os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "1")
    from handlers import _shared
    from handlers import completion as completion_handler
    from handlers import launcher as launcher_handler

    loggers = [_shared.logger, logging.getLogger("sluice")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield _shared, launcher_handler, completion_handler
    finally:
        _shared.reset()
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def measure(
    max_: int,
    *,
    steady: int | None = None,
    per_shard: int = PER_SHARD,
    job_seconds: float = JOB_SECONDS,
    seed: int = SEED,
) -> dict[str, Any]:
    """Measure one MAX on a fresh moto (see the module docstring). ``steady``: completions measured
    in steady state (default min(MAX, 200))."""
    from sluice.adapters.dynamo.launch_slots import POOL
    from sluice.adapters.dynamo.slots import DynamoSlots
    from sluice.core.clock import FakeClock
    from sluice.primitives.slots import Capacity
    from tests.support.aws import REGION, LambdaContext, build_stack, moto_session, scheduled_event
    from tests.support.moto_patches import atomic_fast_moto

    steady = min(max_, STEADY_CAP) if steady is None else steady
    if steady > max_:
        raise ValueError(f"steady {steady} > MAX {max_}: only executions running after the fill end")
    began = time.monotonic()
    clock = FakeClock(T0)
    with (
        _quiet_handlers() as (shared, launcher_handler, completion_handler),
        moto_session() as session,
        atomic_fast_moto(),
        redirect_stdout(io.StringIO()),
    ):
        stack = build_stack(
            session,
            name=f"costs-{max_}",
            max_concurrency=max_,
            clock=clock,
            slots_per_shard=per_shard,
            max_cache_seconds=MAX_CACHE_SECONDS,
            max_receive_count=10,
        )
        s = stack.settings
        producer = session.client("sqs", region_name=REGION)
        meter = Meter(s.table_name)
        # Two functions, each a warm container with its own runtime (launcher, caches, views). They
        # share the boto3 clients, which keep no state that changes a call: building one takes 0.1 s.
        launcher_rt, completion_rt = stack.runtime(), stack.runtime()
        for service in SERVICES:
            meter.attach(launcher_rt.client(service))
        completion_rt._clients.update(launcher_rt._clients)

        def invoke(rt: Any, handler: Any, event: dict[str, Any]) -> dict[str, Any]:
            shared._runtime = rt  # the container's warm runtime
            meter.phase.invocations += 1
            function = handler.__name__.rpartition(".")[2]
            return handler.handler(event, LambdaContext(function_name=f"sluice-bench-{function}"))

        meter.phase = setup = Phase("setup")
        DynamoSlots(launcher_rt.client("dynamodb"), s.table_name, per_shard=per_shard).set_limit(
            Capacity(POOL, max_)
        )

        _send(producer, s.queue_url, range(max_))
        meter.phase = fill = Phase("fill")
        running, ticks = 0, 0
        while running < max_ and ticks < 10:
            result = invoke(launcher_rt, launcher_handler, scheduled_event())
            fill.starts += int(result["started"])
            running, ticks = int(result["running"]), ticks + 1
            clock.advance(TICK_SECONDS)

        names = _running(s.state_machine_arn)
        random.Random(f"{seed}/{max_}").shuffle(names)
        _send(producer, s.queue_url, range(max_, max_ + steady))
        meter.phase = refill = Phase("steady")
        released = 0
        for name in names[:steady]:
            clock.advance(job_seconds / max_)
            result = invoke(completion_rt, completion_handler, _finish(s.state_machine_arn, name))
            released += bool(result["released"])
            refill.starts += int(result.get("admission", {}).get("started", 0))

        clock.advance(TICK_SECONDS)
        meter.phase = idle = Phase("idle")
        invoke(launcher_rt, launcher_handler, scheduled_event())
        queued = stack.queue_counts()
        still_running = len(_running(s.state_machine_arn))

    return {
        "max": max_,
        "slots_per_shard": per_shard,
        "shards": math.ceil(max_ / per_shard),
        "max_cache_seconds": MAX_CACHE_SECONDS,
        "job_seconds": job_seconds,
        "fill_ticks": ticks,
        "steady_completions": steady,
        "released": released,
        "running_at_end": still_running,
        "queued_at_end": list(queued),
        "setup": setup.summary(),
        "fill": fill.summary(),
        "steady": refill.summary(),
        "idle_tick": idle.summary(),
        "sizes": meter.sizes(),
        "seconds": round(time.monotonic() - began, 1),
    }


# -- the report -----------------------------------------------------------------------------------


def targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each of the issue's targets (point 3) against each measured MAX."""
    out = []
    for r in results:
        m = r["max"]
        checks = [
            (
                "fill tick ≤ 2.3 calls per start",
                r["fill"]["calls_per_start"],
                TARGETS["fill_calls_per_start"],
            ),
            (
                "completion refill ≤ 4 calls per start",
                r["steady"]["calls_per_start"],
                TARGETS["refill_calls_per_start"],
            ),
            ("≤ 12 write units per start (fill)", r["fill"]["wcu_per_start"], TARGETS["wcu_per_start"]),
            ("≤ 12 write units per start (steady)", r["steady"]["wcu_per_start"], TARGETS["wcu_per_start"]),
        ]
        if m == 200:
            checks.append(
                (
                    "no item written > 0.25 times per start (steady, MAX 200)",
                    r["steady"]["hottest_item_writes_per_start"],
                    TARGETS["writes_per_item_per_start_at_max_200"],
                )
            )
        for what, value, limit in checks:
            out.append({"max": m, "target": what, "measured": value, "limit": limit, "met": value <= limit})
    return out


def table(results: list[dict[str, Any]]) -> str:
    rows = [
        "| MAX | fill calls/start | refill calls/start | WCU/start fill | WCU/start steady "
        "| most written item (steady) | its writes/start | LEDGER writes/start fill / steady "
        "| LEDGER bytes | largest shard bytes | largest item |",
        "| ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        f, st, sz = r["fill"], r["steady"], r["sizes"]
        shard = sz["largest_by_kind"].get("SLOTS#launcher#*", {"bytes": 0})["bytes"]
        rows.append(
            f"| {r['max']:,} | {f['calls_per_start']:.2f} | {st['calls_per_start']:.2f} "
            f"| {f['wcu_per_start']:.2f} | {st['wcu_per_start']:.2f} "
            f"| `{st['hottest_item']}` | {st['hottest_item_writes_per_start']:.3f} "
            f"| {f['ledger_writes_per_start']:.3f} / {st['ledger_writes_per_start']:.3f} "
            f"| {sz['ledger_bytes']:,} | {shard:,} | `{sz['largest_item']}` {sz['largest_item_bytes']:,} B |"
        )
    return "\n".join(rows)


def breakdown(results: list[dict[str, Any]], phase: str) -> str:
    apis = sorted({api for r in results for api in r[phase]["calls_per_start_by_api"]})
    rows = [
        "| API | " + " | ".join(f"MAX {r['max']:,}" for r in results) + " |",
        "| --- |" + " ---: |" * len(results),
    ]
    for api in apis:
        cells = " | ".join(f"{r[phase]['calls_per_start_by_api'].get(api, 0):.3f}" for r in results)
        rows.append(f"| {api} | {cells} |")
    return "\n".join(rows)


def report(results: list[dict[str, Any]]) -> str:
    lines = [
        "## AWS calls and DynamoDB write units per start (moto, real adapters)",
        "",
        table(results),
        "",
        "### Completion refill: calls per start by API",
        "",
        breakdown(results, "steady"),
        "",
        "### Fill tick: calls per start by API",
        "",
        breakdown(results, "fill"),
        "",
        "### Write actions per start by item kind (steady)",
        "",
        "| item kind | " + " | ".join(f"MAX {r['max']:,}" for r in results) + " |",
        "| --- |" + " ---: |" * len(results),
    ]
    kinds = sorted({k for r in results for k in r["steady"]["writes_per_start_by_kind"]})
    for kind in kinds:
        cells = " | ".join(f"{r['steady']['writes_per_start_by_kind'].get(kind, 0):.3f}" for r in results)
        lines.append(f"| `{kind}` | {cells} |")
    lines += ["", "### Once and idle", ""]
    for r in results:
        su, idle = r["setup"], r["idle_tick"]
        lines.append(
            f"- MAX {r['max']:,}: pool creation {su['calls']} calls, {su['wcu']} WCU (once per stack); "
            f"idle tick {idle['calls']} calls, {idle['wcu']} WCU; failed writes fill/steady "
            f"{r['fill']['failed_writes']}/{r['steady']['failed_writes']}; {r['seconds']} s"
        )
    compared = [r for r in results if r["max"] in BEFORE]
    if compared:
        lines += [
            "",
            "### Before (one LEDGER item, issue #10) → now",
            "",
            "| MAX | fill calls/start | refill calls/start | WCU/start | LEDGER writes/start | LEDGER size |",
            "| ---: | --- | --- | --- | --- | --- |",
        ]
        for r in compared:
            b = BEFORE[r["max"]]
            lines.append(
                f"| {r['max']:,} | {b['fill']} → {r['fill']['calls_per_start']:.2f} "
                f"| {b['refill']} → {r['steady']['calls_per_start']:.2f} "
                f"| {b['wcu']} → {r['steady']['wcu_per_start']:.0f} (steady), {r['fill']['wcu_per_start']:.0f} (fill) "
                f"| {b['ledger_writes']} → {r['steady']['ledger_writes_per_start']:.3f} (steady), "
                f"{r['fill']['ledger_writes_per_start']:.3f} (fill) "
                f"| {b['ledger_kb']} KB → {r['sizes']['ledger_bytes']} B |"
            )
    lines += [
        "",
        "### Targets (issue #10, point 3)",
        "",
        "| MAX | target | measured | |",
        "| ---: | --- | ---: | --- |",
    ]
    for t in targets(results):
        lines.append(
            f"| {t['max']:,} | {t['target']} | {t['measured']:.3f} | {'met' if t['met'] else '**missed**'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.moto_costs", description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, nargs="+", default=list(DEFAULT_MAX), help="MAX values to measure")
    parser.add_argument(
        "--steady", type=int, default=None, help="completions in steady state (min(MAX, 200))"
    )
    parser.add_argument("--per-shard", type=int, default=PER_SHARD)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    results = []
    for max_ in args.max:
        steady = None if args.steady is None else min(args.steady, max_)
        results.append(measure(max_, steady=steady, per_shard=args.per_shard))
        print(f"MAX {max_:,}: done in {results[-1]['seconds']} s", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"results": results, "targets": targets(results), "before": BEFORE}
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(report(results))
    print(f"\n(written to {args.out})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

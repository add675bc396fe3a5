"""Check the call counting against the real adapters on moto.

One scripted scenario runs twice: once with Sluice's real AWS adapters on moto (in process), counting
every botocore call with a ``before-call`` event hook, and once with the benchmark's counting wrappers
on the in-memory adapters. The per-API counts must be the same.

    send N payloads ──► tick ──► repeat: end the oldest running execution, its status event
                                         through Launcher.on_status_change ──► final tick

With ``lanes`` (``SLUICE_LANES``), each payload goes to a lane's queue in turn, and the launcher gets
one queue per lane and a seeded draw for the completions' order among lanes of one priority.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from bench.aws import CountingSsmClient, CountingStore, Meter, SimExecutions, SimQueue, counting_logger
from bench.harness import body
from bench.sluice_system import PARAMETER, sluice_settings
from sluice.adapters.aws.ssm import SsmMax
from sluice.adapters.memory.store import MemoryStore
from sluice.core.clock import FakeClock, SystemClock
from sluice.core.events import StatusChange
from sluice.features.keys import CONCURRENCY_KEY_ATTRIBUTE
from sluice.features.lanes import DEFAULT_LANE, parse_lanes
from sluice.launch.launcher import Launcher
from sluice.launch.settings import Settings

REGION = "us-east-1"
LANE_DRAW_SEED = 20261201  # the completions' draw among lanes of one priority, the same in both runs
SERVICE = {"sfn": "states", "stepfunctions": "states"}


def _settings(max_: int, **overrides: Any) -> Settings:
    # No SSM cache and no receive wait: the count must not depend on how fast moto answers.
    # One start after another: the same calls as side by side, in an order both runs share.
    return sluice_settings(
        max_, max_cache_seconds=0, receive_wait_seconds=0, start_concurrency=1, **overrides
    )


def _lane_names(lanes: str) -> list[str]:
    """The lanes ``SLUICE_LANES`` names, which the payloads are sent to in turn (``[]``: no lanes)."""
    return [part.split(":")[0].strip() for part in lanes.split(",") if part.strip()]


def _tenant(ckey: str, job_id: str) -> str:
    """The concurrency key of payload ``job-NNNNNN``: ``ckey``, or, for ``"a,b"``, a and b in turn."""
    keys = [k.strip() for k in ckey.split(",")]
    return keys[int(job_id.rsplit("-", 1)[1]) % len(keys)]


def _scenario(
    launcher: Launcher,
    send: Callable[[str, str, str], None],
    running: Callable[[], list[str]],
    finish: Callable[[str], None],
    reset: Callable[[], None],
    now: Callable[[], float],
    payloads: int,
    lanes: list[str],
) -> None:
    for i in range(payloads):
        send(body(f"job-{i:06d}", i), f"job-{i:06d}", lanes[i % len(lanes)] if lanes else DEFAULT_LANE)
    reset()
    launcher.tick()
    arn = launcher.settings.state_machine_arn
    while names := sorted(running()):
        finish(names[0])
        change = StatusChange(
            name=names[0],
            status="SUCCEEDED",
            state_machine_arn=arn,
            execution_arn=launcher.executions.arn_for(names[0]),
        )
        launcher.on_status_change(change)
    launcher.tick()


def memory_counts(
    payloads: int = 8, max_: int = 3, ckey: str | None = None, lanes: str = ""
) -> dict[str, int]:
    clock = FakeClock()
    meter = Meter(clock)
    store = CountingStore(MemoryStore(), meter)
    queue = SimQueue(meter, clock, visibility_timeout=180, max_receive_count=10)
    sfn = SimExecutions(meter, clock, lag=0)
    parsed = parse_lanes(lanes, max_)
    settings = _settings(max_, state_machine_arn=sfn.state_machine_arn, lanes=parsed)
    queues = {
        lane.name: queue
        if lane.name == DEFAULT_LANE
        else SimQueue(meter, clock, visibility_timeout=180, max_receive_count=10)
        for lane in parsed
    }
    launcher = Launcher(
        queue=queue,  # type: ignore[arg-type]
        executions=sfn,  # type: ignore[arg-type]
        store=store,  # type: ignore[arg-type]
        max_source=SsmMax(
            CountingSsmClient(meter, max_), PARAMETER, default=max_, clock=clock, cache_seconds=0
        ),
        clock=clock,
        settings=settings,
        logger=counting_logger(meter, "bench.validate"),
        lane_queues=queues,  # type: ignore[arg-type]
        rng=random.Random(LANE_DRAW_SEED),
    )
    _scenario(
        launcher,
        send=lambda b, key, lane: queues.get(lane, queue).send(
            b, key, {CONCURRENCY_KEY_ATTRIBUTE: _tenant(ckey, key)} if ckey else None
        ),
        running=lambda: list(sfn.inner.running),
        finish=lambda name: (clock.advance(1.0), sfn.finish(name)),  # time passes, as on moto
        reset=meter.calls.clear,
        now=clock.now,
        payloads=payloads,
        lanes=_lane_names(lanes),
    )
    return dict(sorted(meter.calls.items()))


def moto_counts(payloads: int = 8, max_: int = 3, ckey: str | None = None, lanes: str = "") -> dict[str, int]:
    import boto3
    from moto import mock_aws
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.stepfunctions.models import stepfunctions_backends

    from sluice.adapters.aws.sfn import StepFunctionsExecutions
    from sluice.adapters.aws.sqs import SqsQueue
    from sluice.adapters.dynamo.store import DynamoStore, create_table

    counts: dict[str, int] = {}

    def count(event_name: str, **_: Any) -> None:
        _, service, operation = event_name.split(".", 2)
        api = f"{SERVICE.get(service, service)}:{operation}"
        counts[api] = counts.get(api, 0) + 1

    saved = {k: os.environ.get(k) for k in ("AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_ENDPOINT_URL")}
    os.environ["AWS_DEFAULT_REGION"] = REGION
    os.environ.pop("AWS_PROFILE", None)
    os.environ.pop("AWS_ENDPOINT_URL", None)
    try:
        with ExitStack() as stack:
            stack.enter_context(mock_aws())
            session = boto3.session.Session(region_name=REGION)
            producer = session.client("sqs")
            dlq = producer.create_queue(QueueName="bench-dlq.fifo", Attributes={"FifoQueue": "true"})[
                "QueueUrl"
            ]
            dlq_arn = producer.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"][
                "QueueArn"
            ]
            url = producer.create_queue(
                QueueName="bench.fifo",
                Attributes={
                    "FifoQueue": "true",
                    "VisibilityTimeout": "180",
                    "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 10}),
                },
            )["QueueUrl"]
            parsed = parse_lanes(lanes, max_)
            lane_urls = {
                lane.name: producer.create_queue(
                    QueueName=f"bench-lane-{lane.name}.fifo",
                    Attributes={
                        "FifoQueue": "true",
                        "VisibilityTimeout": "180",
                        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 10}),
                    },
                )["QueueUrl"]
                for lane in parsed
                if lane.name != DEFAULT_LANE
            }
            create_table(session.client("dynamodb"), "bench-table")
            sm_arn = session.client("stepfunctions").create_state_machine(
                name="bench-workflow",
                definition=json.dumps({"StartAt": "Work", "States": {"Work": {"Type": "Pass", "End": True}}}),
                roleArn=f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:role/bench",
            )["stateMachineArn"]
            session.client("ssm").put_parameter(Name=PARAMETER, Value=str(max_), Type="String")

            clients = {s: session.client(s) for s in ("sqs", "dynamodb", "stepfunctions", "ssm")}
            for client in clients.values():
                client.meta.events.register("before-call", count)
            clock = SystemClock()
            settings = _settings(
                max_,
                queue_url=url,
                dlq_url=dlq,
                table_name="bench-table",
                state_machine_arn=sm_arn,
                lanes=parsed,
                lane_queue_urls=lane_urls,
            )
            queue = SqsQueue(clients["sqs"], url, dlq, lane_urls=lane_urls)
            launcher = Launcher(
                queue=queue,
                executions=StepFunctionsExecutions(clients["stepfunctions"], sm_arn),
                store=DynamoStore(clients["dynamodb"], "bench-table"),
                max_source=SsmMax(clients["ssm"], PARAMETER, default=max_, clock=clock, cache_seconds=0),
                clock=clock,
                settings=settings,
                lane_queues={lane.name: queue.for_lane(lane.name) for lane in parsed},
                rng=random.Random(LANE_DRAW_SEED),
            )
            observer = session.client("stepfunctions")
            backend = stepfunctions_backends[DEFAULT_ACCOUNT_ID][REGION]

            def send(text: str, key: str, lane: str) -> None:
                keyed = (
                    {CONCURRENCY_KEY_ATTRIBUTE: {"DataType": "String", "StringValue": _tenant(ckey, key)}}
                    if ckey
                    else {}
                )
                producer.send_message(
                    QueueUrl=lane_urls.get(lane, url),
                    MessageBody=text,
                    MessageGroupId=key,
                    MessageDeduplicationId=key,
                    MessageAttributes=keyed,
                )

            def running() -> list[str]:
                pages = observer.get_paginator("list_executions").paginate(
                    stateMachineArn=sm_arn, statusFilter="RUNNING"
                )
                return [e["name"] for page in pages for e in page["executions"]]

            def finish(name: str) -> None:
                from datetime import UTC, datetime

                execution = backend.describe_execution(launcher.executions.arn_for(name))
                execution.status = "SUCCEEDED"
                execution.stop_date = datetime.now(UTC)

            _scenario(launcher, send, running, finish, counts.clear, clock.now, payloads, _lane_names(lanes))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return dict(sorted(counts.items()))


def agreement(payloads: int = 8, max_: int = 3, ckey: str | None = None, lanes: str = "") -> dict[str, Any]:
    """``ckey``: every payload under that concurrency key (cap 1): the line's parks and wakes counted
    too; ``"a,b"``: under a and b in turn. ``lanes``: ``SLUICE_LANES``, the payloads sent to the
    lanes it names in turn (a fair lane: the keys are its tenants, every payload parked and woken)."""
    memory = memory_counts(payloads, max_, ckey, lanes)
    moto = moto_counts(payloads, max_, ckey, lanes)
    return {
        "payloads": payloads,
        "max": max_,
        "lanes": lanes,
        "memory": memory,
        "moto": moto,
        "agree": memory == moto,
    }

"""Wiring: build the launcher, the semaphore step and their adapters from ``Settings`` and boto3 clients.

Clients are created on first use, never at import time (a client made before a test's moto
starts would talk to real AWS), and reused while the Lambda container stays warm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from botocore.config import Config

from sluice.adapters.aws.cloudwatch import QueueMetrics
from sluice.adapters.aws.deployment import Functions, Stacks
from sluice.adapters.aws.s3 import S3PayloadObjects
from sluice.adapters.aws.sfn import StepFunctionsExecutions
from sluice.adapters.aws.sfn_tokens import SfnTokens
from sluice.adapters.aws.sqs import SqsQueue
from sluice.adapters.aws.sqs_dead_letters import DeadLetterQueue
from sluice.adapters.aws.ssm import FixedMax, MaxParameter, SsmMax
from sluice.adapters.dynamo.rate_limits import DynamoRates
from sluice.adapters.dynamo.semaphore import DynamoSemaphoreStore
from sluice.adapters.dynamo.semaphore_catalogue import SemaphoreCatalogue
from sluice.adapters.dynamo.store import DynamoStore
from sluice.adapters.dynamo.table import TableRef
from sluice.adapters.dynamo.wake import DynamoWakeTurns
from sluice.core.clock import SystemClock
from sluice.core.errors import ConfigurationError
from sluice.core.ports import Clock, MaxSource
from sluice.features.rate_limits import RateLimiter
from sluice.launch.launcher import Launcher
from sluice.launch.settings import Settings
from sluice.primitives.fanout import pool_size
from sluice.semaphore.service import SemaphoreService
from sluice.semaphore.step import Semaphores

# Standard retry mode: throttling and 5xx are retried with backoff before Sluice sees them.
CLIENT_CONFIG = Config(
    retries={"mode": "standard", "total_max_attempts": 3}, connect_timeout=5, read_timeout=30
)


@dataclass
class Runtime:
    settings: Settings
    session: Any = None  # a boto3 Session; the default session when None
    clock: Clock = field(default_factory=SystemClock)
    client_config: Config = CLIENT_CONFIG
    # How the launcher waits (pacing its starts, backing off): the clock's own sleep, else time.sleep.
    sleep: Callable[[float], None] | None = None
    _clients: dict[str, Any] = field(default_factory=dict)
    _launcher: Launcher | None = None
    _semaphore_service: SemaphoreService | None = None
    _rates: RateLimiter | None = None

    def client(self, service: str) -> Any:
        if service not in self._clients:
            if self.session is None:
                import boto3

                self.session = boto3.session.Session()
            # A connection for each of the launcher's threads (sluice.primitives.fanout): botocore keeps 10.
            threads = pool_size(self.settings.start_concurrency)
            config = self.client_config.merge(Config(max_pool_connections=max(10, threads)))
            self._clients[service] = self.session.client(service, config=config)
        return self._clients[service]

    def store(self) -> DynamoStore:
        store = DynamoStore(
            self.client("dynamodb"),
            self.settings.table_name,
            retention_seconds=self.settings.retention_seconds,
            slots_per_shard=self.settings.slots_per_shard,
            key_concurrency=self.settings.key_concurrency,
        )
        store.key_gate = self.rates()  # a key's wake sends no more waiters than its rate has room for
        return store

    def queue(self) -> SqsQueue:
        return SqsQueue(
            self.client("sqs"),
            self.settings.queue_url,
            self.settings.dlq_url,
            lane_urls=self.settings.lane_queue_urls,
        )

    def dead_letters(self) -> DeadLetterQueue:
        """The DLQ as the operator's commands use it (``sluice.ops.dlq``)."""
        return DeadLetterQueue(self.client("sqs"), self.settings.dlq_url)

    def queue_metrics(self) -> QueueMetrics:
        """The queues' CloudWatch metrics (``sluice status``)."""
        return QueueMetrics(self.client("cloudwatch"))

    def stacks(self) -> Stacks:
        """CloudFormation stacks (the deployed stack's resources, for the ``sluice`` command)."""
        return Stacks(self.client("cloudformation"))

    def functions(self) -> Functions:
        """Lambda functions (the deployed launcher's configuration, for the ``sluice`` command)."""
        return Functions(self.client("lambda"))

    def executions(self) -> StepFunctionsExecutions:
        return StepFunctionsExecutions(
            self.client("stepfunctions"), self.settings.state_machine_arn, self.settings.lane_state_machines
        )

    def max_source(self) -> MaxSource:
        if self.settings.max_parameter:
            return SsmMax(
                self.client("ssm"),
                self.settings.max_parameter,
                default=self.settings.max_concurrency,
                clock=self.clock,
                cache_seconds=self.settings.max_cache_seconds,
            )
        return FixedMax(self.settings.max_concurrency)

    def max_parameter(self) -> MaxParameter:
        """The MAX parameter as the operator's commands use it (``sluice.ops.maximum``)."""
        if not self.settings.max_parameter:
            raise ConfigurationError("no MAX parameter (SLUICE_MAX_PARAMETER)")
        return MaxParameter(self.client("ssm"), self.settings.max_parameter)

    def payload_objects(self) -> S3PayloadObjects | None:
        """The bucket of stored payloads (``sluice.features.pointers``); None when the stack names none."""
        if not self.settings.payload_bucket:
            return None
        return S3PayloadObjects(lambda: self.client("s3"), self.settings.payload_bucket)

    def launcher(self, logger: Any = None) -> Launcher:
        if self._launcher is None:
            self.settings.require("queue_url", "dlq_url", "table_name", "state_machine_arn")
            self._launcher = Launcher(
                queue=self.queue(),
                executions=self.executions(),
                store=self.store(),
                max_source=self.max_source(),
                clock=self.clock,
                settings=self.settings,
                logger=logger,
                sleep=self.sleep,
                payloads=self.payload_objects(),
                lane_queues=self.lane_queues(),
                gate=self.rates(),  # the rate limits (sluice.features.rate_limits)
            )
        return self._launcher

    def rates(self) -> RateLimiter:
        """The rate limits (``sluice.features.rate_limits``) on the table: one per runtime, so that
        what it read where no rate is in force serves the container's later invocations."""
        self.settings.require("table_name")
        if self._rates is None:
            self._rates = RateLimiter(
                DynamoRates(TableRef(self.client("dynamodb"), self.settings.table_name)), self.settings.rates
            )
        return self._rates

    def wake_turns(self) -> DynamoWakeTurns:
        """The woken launchers' turn (``sluice.features.wake``) on the table."""
        self.settings.require("table_name")
        return DynamoWakeTurns(TableRef(self.client("dynamodb"), self.settings.table_name))

    def lane_queues(self) -> dict[str, SqsQueue]:
        """Each lane's queue adapter (``sluice.features.lanes``); empty without lanes."""
        queue = self.queue()
        return {lane.name: queue.for_lane(lane.name) for lane in self.settings.lanes}

    def semaphores(self) -> Semaphores:
        """The semaphore step (``sluice.semaphore.step``) on the table and Step Functions' task tokens."""
        self.settings.require("table_name")
        store = DynamoSemaphoreStore(
            self.client("dynamodb"),
            self.settings.table_name,
            retention_seconds=self.settings.retention_seconds,
            per_shard=self.settings.slots_per_shard,
        )
        return Semaphores(store, SfnTokens(self.client("stepfunctions")), self.clock)

    def semaphore_catalogue(self) -> SemaphoreCatalogue:
        """Every semaphore of the table, found by a bounded Scan (``sluice semaphore status``)."""
        self.settings.require("table_name")
        return SemaphoreCatalogue(self.client("dynamodb"), self.settings.table_name)

    def semaphore_service(self, logger: Any = None) -> SemaphoreService:
        if self._semaphore_service is None:
            self._semaphore_service = SemaphoreService(
                self.semaphores(), dict(self.settings.semaphore_limits), logger=logger
            )
        return self._semaphore_service

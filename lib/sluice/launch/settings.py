"""Settings, read from the environment. Names are a public contract: see docs/configuration.md."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from sluice.core.errors import ConfigurationError
from sluice.core.records import Lane
from sluice.core.validation import MAX_CEILING, WHOLE
from sluice.features.lanes import DEFAULT_LANE, parse_lane_queues, parse_lane_state_machines, parse_lanes
from sluice.features.pointers import DEFAULT_THRESHOLD
from sluice.features.rate_limits import RateDefaults, parse_lane_rates, parse_optional_rate
from sluice.features.receipts import DEFAULT_INLINE_BYTES, MAX_INLINE_BYTES
from sluice.semaphore.service import parse_limits


class DuplicatePolicy(StrEnum):
    SUPPRESS = "suppress"  # delete the duplicate message and count it on the payload record
    DEFER = "defer"  # park it in the table (message deleted); re-sent to the queue once the lease ends


# StartExecution's token bucket per account and region (Step Functions quotas, standard workflows):
# a refill per second and a burst. Regions not named here have the smaller one.
LARGE_BUCKET_REGIONS = frozenset({"us-east-1", "us-west-2", "eu-west-1"})
LARGE_BUCKET = (300, 1300)
SMALL_BUCKET = (150, 800)
# S, the staleness bound of Step Functions' answers: the default and the least
CONSISTENCY_WINDOW_SECONDS = 60
# A time stamped by one container's clock (a mark, an adoption) and judged by another's: judged
# old after this many windows, so that a judge whose clock runs up to S ahead still finds it S old.
OTHER_CLOCK_WINDOWS = 2


def start_bucket(region: str) -> tuple[int, int]:
    """StartExecution's (refill per second, burst) in ``region``."""
    return LARGE_BUCKET if region in LARGE_BUCKET_REGIONS else SMALL_BUCKET


# SQS's longest visibility timeout: a message sent back for the window cannot wait longer.
SQS_MAX_VISIBILITY = 43_200


@dataclass(frozen=True)
class Settings:
    queue_url: str = ""
    dlq_url: str = ""
    table_name: str = ""
    state_machine_arn: str = ""
    max_concurrency: int = 10
    max_parameter: str | None = None
    max_cache_seconds: float = 5.0
    claim_timeout_seconds: int = 900
    retention_days: int = 30
    duplicate_policy: DuplicatePolicy = DuplicatePolicy.SUPPRESS
    receive_wait_seconds: int = 1
    linger_seconds: int = 0
    consistency_window_seconds: int = CONSISTENCY_WINDOW_SECONDS
    time_reserve_seconds: int = 15
    slots_per_shard: int = 8  # holders per slot shard item: about 1 KB each (sluice.adapters.dynamo.slots)
    # Semaphores the stack creates when absent, with their first limit (sluice.semaphore.service).
    semaphore_limits: tuple[tuple[str, int], ...] = ()
    # Claims and starts a tick keeps in flight at once (sluice.primitives.fanout); 1 makes them one by one;
    # None ("auto", the environment's default): the room to fill at each round, up to a bound.
    start_concurrency: int | None = 1
    # The StartExecution token bucket the launcher paces its starts to (per second, and burst).
    start_rate: int = 300
    start_burst: int = 1300
    # Stored payloads (sluice.features.pointers): the stack's bucket, and the body size over which
    # `sluice enqueue` stores a payload there and sends a pointer.
    payload_bucket: str = ""
    pointer_threshold: int = DEFAULT_THRESHOLD
    # Receipts (sluice.features.receipts): an output up to this many bytes is kept on the execution record,
    # a larger one in the payload bucket.
    receipt_inline_bytes: int = DEFAULT_INLINE_BYTES
    # Awaits (sluice.features.awaits): how long a waiter waits for an awaited key that is not running.
    await_horizon_seconds: int = 7 * 86_400
    # Concurrency keys (sluice.features.keys): how many payloads of one key run at once, unless it has its own cap.
    key_concurrency: int = 1
    # Lanes (sluice.features.lanes): () is one lane, "default", with no lane pool; and the lanes' queues.
    lanes: tuple[Lane, ...] = ()
    lane_queue_urls: Mapping[str, str] = field(default_factory=dict, hash=False)
    # A lane's own state machine (``lane=arn``); a lane not named starts ``state_machine_arn``.
    lane_state_machines: Mapping[str, str] = field(default_factory=dict, hash=False)
    # Rate limits (sluice.features.rate_limits): the stack's and each lane's, as deployed.
    rates: RateDefaults = field(default_factory=RateDefaults, hash=False)

    @property
    def retention_seconds(self) -> int:
        return self.retention_days * 86_400

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        read = _Env(os.environ if env is None else env)
        text, integer = read.text, read.integer
        rate, burst = start_bucket(text("AWS_REGION") or text("AWS_DEFAULT_REGION"))
        duplicate_policy = _duplicate_policy(text("SLUICE_DUPLICATE_POLICY", DuplicatePolicy.SUPPRESS.value))
        max_concurrency = integer("SLUICE_MAX_CONCURRENCY", 10, maximum=MAX_CEILING)
        lanes, lane_queue_urls = _lanes(read, max_concurrency)
        return cls(
            lanes=lanes,
            lane_queue_urls=lane_queue_urls,
            lane_state_machines=parse_lane_state_machines(text("SLUICE_LANE_STATE_MACHINES"), lanes),
            queue_url=text("SLUICE_QUEUE_URL"),
            dlq_url=text("SLUICE_DLQ_URL"),
            table_name=text("SLUICE_TABLE_NAME"),
            state_machine_arn=text("SLUICE_STATE_MACHINE_ARN"),
            max_concurrency=max_concurrency,
            max_parameter=text("SLUICE_MAX_PARAMETER") or None,
            max_cache_seconds=integer("SLUICE_MAX_CACHE_SECONDS", 5),
            claim_timeout_seconds=integer("SLUICE_CLAIM_TIMEOUT_SECONDS", 900, minimum=1),
            retention_days=integer("SLUICE_RETENTION_DAYS", 30, minimum=1),
            duplicate_policy=duplicate_policy,
            receive_wait_seconds=min(20, integer("SLUICE_RECEIVE_WAIT_SECONDS", 1)),
            linger_seconds=integer("SLUICE_LINGER_SECONDS", 0),
            consistency_window_seconds=integer(
                "SLUICE_CONSISTENCY_WINDOW_SECONDS",
                CONSISTENCY_WINDOW_SECONDS,
                minimum=CONSISTENCY_WINDOW_SECONDS,
                maximum=SQS_MAX_VISIBILITY,
            ),
            time_reserve_seconds=integer("SLUICE_TIME_RESERVE_SECONDS", 15),
            slots_per_shard=integer("SLUICE_SLOTS_PER_SHARD", 8, minimum=1),
            semaphore_limits=parse_limits(text("SLUICE_SEMAPHORES")),
            start_concurrency=_start_concurrency(read),
            start_rate=integer("SLUICE_START_RATE", 0) or rate,
            start_burst=integer("SLUICE_START_BURST", 0) or burst,
            payload_bucket=text("SLUICE_PAYLOAD_BUCKET"),
            pointer_threshold=pointer_threshold(
                text("SLUICE_POINTER_THRESHOLD"), source="SLUICE_POINTER_THRESHOLD"
            ),
            await_horizon_seconds=integer("SLUICE_AWAIT_HORIZON_SECONDS", 7 * 86_400, minimum=1),
            key_concurrency=integer("SLUICE_KEY_CONCURRENCY", 1, minimum=1, maximum=MAX_CEILING),
            receipt_inline_bytes=inline_bytes(integer("SLUICE_RECEIPT_INLINE_BYTES", DEFAULT_INLINE_BYTES)),
            rates=_rates(read, lanes),
        )

    def lane(self, name: str) -> Lane:
        """The lane named ``name``; ``ConfigurationError`` listing the lanes when there is none."""
        for lane in self.lanes:
            if lane.name == name:
                return lane
        known = ", ".join(lane.name for lane in self.lanes) or DEFAULT_LANE + " (no lanes configured)"
        raise ConfigurationError(f"no lane {name!r}: the lanes are {known}")

    def lane_queue_url(self, name: str) -> str:
        return self.queue_url if name == DEFAULT_LANE else self.lane_queue_urls[self.lane(name).name]

    def require(self, *names: str) -> Settings:
        """Fail with every missing setting named at once, not one per deploy."""
        env_names = {
            "queue_url": "SLUICE_QUEUE_URL",
            "dlq_url": "SLUICE_DLQ_URL",
            "table_name": "SLUICE_TABLE_NAME",
            "state_machine_arn": "SLUICE_STATE_MACHINE_ARN",
        }
        missing = [env_names[n] for n in names if not getattr(self, n)]
        if missing:
            raise ConfigurationError(f"missing setting(s): {', '.join(missing)}")
        return self


@dataclass(frozen=True)
class _Env:
    """The environment, read setting by setting: text stripped, whole numbers checked."""

    env: Mapping[str, str]

    def text(self, name: str, default: str = "") -> str:
        return self.env.get(name, default).strip()

    def integer(self, name: str, default: int, minimum: int = 0, maximum: int | None = None) -> int:
        raw = self.text(name)
        if not raw:
            return default
        number = raw[1:] if raw.startswith("-") else raw
        if not WHOLE.fullmatch(number):  # ASCII digits only: int() also reads "١٠" and "1_0"
            raise ConfigurationError(f"{name}={raw[:40]!r} is not a whole number")
        digits = number.lstrip("0") or "0"
        if len(digits) > 18:  # no setting needs more; int() refuses beyond 4,300 digits
            raise ConfigurationError(f"{name}={raw[:40]}... is too large")
        value = -int(digits) if raw.startswith("-") else int(digits)
        if value < minimum:
            raise ConfigurationError(f"{name}={value} must be at least {minimum}")
        if maximum is not None and value > maximum:
            raise ConfigurationError(f"{name}={value} must be at most {maximum:,}")
        return value


def _duplicate_policy(raw: str) -> DuplicatePolicy:
    policy = raw.lower()
    try:
        return DuplicatePolicy(policy)
    except ValueError:
        raise ConfigurationError(
            f"SLUICE_DUPLICATE_POLICY={policy!r}: use one of {', '.join(p.value for p in DuplicatePolicy)}"
        ) from None


def _start_concurrency(read: _Env) -> int | None:
    """``SLUICE_START_CONCURRENCY``: ``auto`` (or unset) is None, the room to fill at each round
    (``sluice.primitives.fanout.start_width``); a whole number from 1 keeps that many in flight."""
    name = "SLUICE_START_CONCURRENCY"
    raw = read.text(name)
    if not raw or raw.lower() == "auto":
        return None
    try:
        return read.integer(name, 0, minimum=1)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{exc} (use auto, or a whole number from 1)") from None


def _rates(read: _Env, lanes: tuple[Lane, ...]) -> RateDefaults:
    """``SLUICE_RATE_LIMIT`` (the stack's), ``SLUICE_LANE_RATE_LIMITS`` (``lane=rate,...``) and
    ``SLUICE_KEY_RATE_LIMIT`` (every concurrency key's)."""
    names = [lane.name for lane in lanes]  # none without lanes: the stack's rate is the one
    return RateDefaults(
        stack=parse_optional_rate(read.text("SLUICE_RATE_LIMIT"), source="SLUICE_RATE_LIMIT"),
        lanes=parse_lane_rates(read.text("SLUICE_LANE_RATE_LIMITS"), names, source="SLUICE_LANE_RATE_LIMITS"),
        key=parse_optional_rate(read.text("SLUICE_KEY_RATE_LIMIT"), source="SLUICE_KEY_RATE_LIMIT"),
    )


def _lanes(read: _Env, max_concurrency: int) -> tuple[tuple[Lane, ...], dict[str, str]]:
    """The lanes (SLUICE_LANES) and their queues (SLUICE_LANE_QUEUES): every lane but the default has one."""
    lanes = parse_lanes(read.text("SLUICE_LANES"), max_concurrency)
    lane_queue_urls = parse_lane_queues(read.text("SLUICE_LANE_QUEUES"))
    missing = [lane.name for lane in lanes if lane.name != DEFAULT_LANE and lane.name not in lane_queue_urls]
    if missing:
        raise ConfigurationError(f"SLUICE_LANE_QUEUES names no queue for lane(s) {', '.join(missing)}")
    return lanes, lane_queue_urls


def inline_bytes(value: int) -> int:
    """The largest output a receipt keeps inline (``SLUICE_RECEIPT_INLINE_BYTES``): 0 to 100,000."""
    if value > MAX_INLINE_BYTES:
        raise ConfigurationError(
            f"SLUICE_RECEIPT_INLINE_BYTES={value} must be at most {MAX_INLINE_BYTES:,} (a larger output "
            "goes to the payload bucket; the execution record must stay under DynamoDB's 400 KB)"
        )
    return value


def pointer_threshold(raw: str, *, source: str) -> int:
    """Bytes of body over which a payload is stored in the bucket: 0 (every payload) to the default,
    the largest body a message carries with room for its attributes."""
    if not raw:
        return DEFAULT_THRESHOLD
    if not WHOLE.fullmatch(raw):  # ASCII digits only: int() also reads "١٠"
        raise ConfigurationError(f"{source}={raw[:40]!r} is not a whole number")
    if len(raw.lstrip("0")) > 9 or int(raw) > DEFAULT_THRESHOLD:
        raise ConfigurationError(
            f"{source}={raw[:40]} must be from 0 to {DEFAULT_THRESHOLD:,} (a larger body does not fit a message "
            "beside its attributes)"
        )
    value = int(raw)
    return value

"""The request quotas AWS enforces, as refusals: a call past its quota fails, as in AWS.

    states:StartExecution   one token bucket for the account and region, every start (a tick's, a
                            completion's, a baseline's): 1,300 at once, refilled at 300 a second
    sqs:<action>            per queue and per API action: high-throughput FIFO, as the stack deploys
                            its queues (``HIGH_THROUGHPUT_FIFO_PER_ACTION``); 300 calls a second
                            without that mode (``SQS_FIFO_PER_ACTION``)

A refused call changes nothing and is counted (``Meter.refused``). The SDK retries it as
``lib/sluice/runtime.py`` configures boto3 (standard mode, 3 attempts in all, a random wait of up to
1 s, then up to 2 s, between them); the third refusal reaches the caller as Sluice's adapters
translate it: ``TransientError(throttled=True)`` (``sluice.adapters.errors``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Step Functions quotas, "Quotas related to API action throttling" (StartExecution: bucket size 1,300,
# refill rate 300 per second in us-east-1, us-west-2 and eu-west-1; 800 and 150 elsewhere).
START_BURST = 1_300
START_RATE = 300.0
# Amazon SQS Developer Guide, "Amazon SQS message quotas" (Message throughput, FIFO queues) and
# "Troubleshoot FIFO throttling issues in Amazon SQS": without high-throughput mode a FIFO queue takes
# 300 transactions per second per API action (SendMessage, ReceiveMessage, DeleteMessage; a batch of
# 10 is one); requests over it get ThrottlingException.
SQS_FIFO_PER_ACTION = 300
# "Amazon SQS message quotas", High throughput for FIFO queues: up to 70,000 transactions per second
# per API action without batching in us-east-1, us-west-2 and eu-west-1 (spread over partitions by
# message group; the bench does not model partitions).
HIGH_THROUGHPUT_FIFO_PER_ACTION = 70_000
# lib/sluice/runtime.py CLIENT_CONFIG: retries {"mode": "standard", "total_max_attempts": 3}; botocore's
# standard mode waits random() * 2 ** (attempt - 1) seconds (at most 20 s) before each retry.
SDK_ATTEMPTS = 3
SDK_BACKOFF_BASE = 2.0


@dataclass
class TokenBucket:
    """``burst`` tokens, refilled at ``rate`` a second; a call takes one or is refused."""

    rate: float
    burst: float
    tokens: float = -1.0
    at: float | None = None

    def take(self, now: float) -> bool:
        """A call at ``now``; refused when no whole token is left."""
        self._refill(now)
        if self.tokens >= 1.0 - 1e-9:
            self.tokens -= 1.0
            return True
        return False

    def next_token(self, now: float) -> float:
        """When a token is free at the earliest, taking it (a caller that paces itself: the oracle)."""
        self._refill(now)
        self.tokens -= 1.0
        return now if self.tokens >= -1e-9 else now - self.tokens / self.rate

    def _refill(self, now: float) -> None:
        """The tokens up to ``now``. The branches of a round (``bench.sim.Parallel``) call from their
        own times one branch after another, so ``now`` may be earlier than a call already seen:
        nothing is refilled then, and the same time is never refilled twice."""
        if self.at is None:
            self.tokens, self.at = self.burst, now
        if now > self.at:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now


@dataclass
class PerSecond:
    """At most ``limit`` calls in one wall-clock second."""

    limit: int
    second: int = -1
    count: int = 0

    def take(self, now: float) -> bool:
        second = int(now)
        if second > self.second:  # an earlier second (a round's branch) counts in the later one
            self.second, self.count = second, 0
        if self.count >= self.limit:
            return False
        self.count += 1
        return True


@dataclass
class Quotas:
    """The quotas of one simulated account. ``high_throughput_fifo``: the queues have high-throughput
    mode on, as the deployed stack's do; False: a stack whose queues lack it (300 calls a second)."""

    high_throughput_fifo: bool = True
    start_rate: float = START_RATE
    start_burst: int = START_BURST
    _start: TokenBucket | None = None
    _sqs: dict[tuple[int, str], PerSecond] = field(default_factory=dict)

    @property
    def sqs_per_action(self) -> int:
        return HIGH_THROUGHPUT_FIFO_PER_ACTION if self.high_throughput_fifo else SQS_FIFO_PER_ACTION

    def admit(self, api: str, now: float, scope: object = None) -> bool:
        """True if AWS takes the call now; ``scope``: the queue, for an SQS action."""
        if api == "states:StartExecution":
            if self._start is None:
                self._start = TokenBucket(self.start_rate, self.start_burst)
            return self._start.take(now)
        if api.startswith("sqs:"):
            key = (id(scope), api)
            limiter = self._sqs.get(key)
            if limiter is None:
                limiter = self._sqs[key] = PerSecond(self.sqs_per_action)
            return limiter.take(now)
        return True

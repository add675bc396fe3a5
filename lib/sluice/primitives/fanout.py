"""Calls side by side, and the pace of StartExecution.

A tick with many free slots fills them with several claims and starts in flight at once
(``Threads``); the launcher then waits for the slowest. ``Serial`` makes the same calls one after
another: a completion's refill (one start), the unit tests, and any launcher whose
``SLUICE_START_CONCURRENCY`` is 1.

How many a round keeps in flight (``start_width``): ``startConcurrency`` when it is a whole number;
``auto`` (the default) follows the room to fill at that round, MAX in force less running, up to
``AUTO_WIDEST``. At about 120 ms a start (a claim, StartExecution, its share of the batch's
receive and delete), 60 in flight keep up with StartExecution's 300 a second; 30 did not (a fill
of 10,000 at about 250 a second, 0.966 of the bench's oracle against 0.988 at 60). Wider gains
little more (5 s jobs at MAX 1,000: 0.945 of the oracle at 60, 0.953 at 100, 0.960 at 200) for a
thread each in a launcher whose CPU is a fraction of a core at 128 MB (the bench has no CPU time).

Whatever runs them, a call's ``Exception`` is handed back as its result, so one failed claim does
not hide what the others did (their executions are marked and their messages deleted). A
``BaseException`` (a Lambda timeout, a kill) is not: it propagates, as it ends the process.

``Pacer`` keeps this launcher's StartExecution calls inside Step Functions' token bucket (a burst,
then a steady rate per second): a call waits for its token through the injected ``sleep``. A
throttled call empties the bucket and backs off, so that a fill slows down instead of returning
its messages to the queue, where each return would spend one of their ``maxReceiveCount``
receives.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, TypeVar

from sluice.core.records import Done

if TYPE_CHECKING:
    from sluice.core.ports import Clock

T = TypeVar("T")

AUTO_WIDEST = 60  # startConcurrency auto: the widest a round goes (measured: docs/configuration.md)
BACKOFF = 0.25  # first wait after a throttled start (s); doubled per throttle in a row
MAX_BACKOFF = 4.0


def _capture(call: Callable[[], T]) -> Done[T]:
    try:
        return Done(call())
    except Exception as exc:  # handed back; a BaseException ends the process
        return Done(error=exc)


class Serial:
    """One call after another."""

    workers = 1

    def each(self, calls: Sequence[Callable[[], T]]) -> list[Done[T]]:
        return [_capture(call) for call in calls]


class Threads:
    """Up to ``workers`` calls at once on a pool of threads made at the first call (never at import)
    and kept while the Lambda container stays warm. boto3 clients are safe to share between threads."""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def each(self, calls: Sequence[Callable[[], T]]) -> list[Done[T]]:
        if self.workers == 1 or len(calls) <= 1:
            return Serial().each(calls)
        futures = [self._executor().submit(_capture, call) for call in calls]
        wait(futures)  # every call has ended before a crash in one of them is raised
        return [f.result() for f in futures]

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="sluice-start")
            return self._pool


def pool_size(start_concurrency: int | None) -> int:
    """Threads for ``startConcurrency``: the number given; ``auto`` (None): the widest it goes."""
    return AUTO_WIDEST if start_concurrency is None else start_concurrency


def start_width(start_concurrency: int | None, room: int) -> int:
    """Claims and starts one round keeps in flight: ``startConcurrency`` when it is a number; ``auto``
    (None): the room to fill (MAX in force less running, as that round read it), 1 to ``AUTO_WIDEST``."""
    if start_concurrency is not None:
        return start_concurrency
    return max(1, min(room, AUTO_WIDEST))


def fanout(workers: int | None) -> Serial | Threads:
    workers = pool_size(workers)
    return Serial() if workers <= 1 else Threads(workers)


class Pacer:
    """A token bucket of ``burst`` tokens refilled at ``rate`` a second; one token per start.

    Waiting callers reserve their tokens in turn (the count goes below zero), so callers on several
    threads wait one after another instead of all waking at the same moment."""

    def __init__(self, rate: float, burst: int, *, clock: Clock, sleep: Callable[[float], None]) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a start rate above 0 and a burst of at least 1, not {rate}/{burst}")
        self.rate = float(rate)
        self.burst = float(burst)
        self.clock = clock
        self.sleep = sleep
        self._tokens = float(burst)
        self._at = clock.now()
        self._throttles = 0  # throttled starts in a row
        self._lock = threading.Lock()

    def take(self) -> float:
        """Wait for one start's token. Returns the seconds waited."""
        with self._lock:
            self._refill()
            self._tokens -= 1.0
            delay = 0.0 if self._tokens >= 0 else -self._tokens / self.rate
        if delay > 0:
            self.sleep(delay)
        return delay

    def throttled(self) -> float:
        """A start was throttled all the same (other starters share the account's bucket): the
        bucket is empty; wait, longer for each throttle in a row. Returns the seconds waited."""
        with self._lock:
            self._refill()
            self._tokens = min(self._tokens, 0.0)
            delay = min(MAX_BACKOFF, BACKOFF * 2**self._throttles)
            self._throttles += 1
        self.sleep(delay)
        return delay

    def passed(self) -> None:
        """A start went through: the next throttle backs off from the start again."""
        with self._lock:
            self._throttles = 0

    def _refill(self) -> None:
        now = self.clock.now()
        self._tokens = min(self.burst, self._tokens + max(0.0, now - self._at) * self.rate)
        self._at = now

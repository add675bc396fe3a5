"""Calls side by side and the StartExecution pace (sluice.primitives.fanout, sluice.launch.settings.start_bucket)."""

from __future__ import annotations

import threading

import pytest

from sluice.core.clock import FakeClock
from sluice.launch.settings import Settings, start_bucket
from sluice.primitives.fanout import Pacer, Serial, Threads, fanout


class Crash(BaseException):
    """A Lambda timeout: not an Exception."""


def test_a_full_bucket_lets_the_burst_through_then_paces_to_the_rate():
    clock = FakeClock()
    pacer = Pacer(10, 3, clock=clock, sleep=clock.sleep)
    t0 = clock.now()
    waits = [pacer.take() for _ in range(6)]
    assert waits[:3] == [0.0, 0.0, 0.0]
    assert waits[3:] == pytest.approx([0.1, 0.1, 0.1])
    assert clock.now() - t0 == pytest.approx(0.3)  # 6 starts: a burst of 3, then 3 at 10 a second


def test_the_bucket_refills_while_nothing_starts_up_to_its_burst():
    clock = FakeClock()
    pacer = Pacer(10, 3, clock=clock, sleep=clock.sleep)
    for _ in range(3):
        pacer.take()
    clock.advance(60)
    assert [pacer.take() for _ in range(4)] == pytest.approx([0.0, 0.0, 0.0, 0.1])


def test_waiting_threads_reserve_their_tokens_in_turn():
    clock = FakeClock()
    naps: list[float] = []
    lock = threading.Lock()

    def sleep(seconds: float) -> None:
        with lock:
            naps.append(seconds)

    pacer = Pacer(100, 2, clock=clock, sleep=sleep)
    threads = [threading.Thread(target=pacer.take) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # The clock never moved: each waiter waits one token longer than the one before it.
    assert sorted(naps) == pytest.approx([0.01, 0.02, 0.03, 0.04])


def test_a_throttle_empties_the_bucket_and_backs_off_longer_each_time_until_a_start_passes():
    clock = FakeClock()
    pacer = Pacer(300, 1300, clock=clock, sleep=clock.sleep)
    t0 = clock.now()
    assert [pacer.throttled() for _ in range(6)] == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0]
    pacer.passed()
    assert pacer.throttled() == 0.25
    assert pacer.take() == 0.0  # 0.25 s at 300 a second refilled the emptied bucket
    assert clock.now() - t0 == pytest.approx(0.25 + 0.5 + 1 + 2 + 4 + 4 + 0.25)  # all of it slept


def test_a_pacer_refuses_a_rate_or_burst_it_cannot_keep():
    clock = FakeClock()
    with pytest.raises(ValueError, match="start rate"):
        Pacer(0, 10, clock=clock, sleep=clock.sleep)
    with pytest.raises(ValueError, match="burst"):
        Pacer(10, 0, clock=clock, sleep=clock.sleep)


@pytest.mark.parametrize("run", [Serial(), Threads(4)], ids=["serial", "threads"])
def test_each_hands_back_values_and_exceptions_in_order(run):
    def fail() -> int:
        raise ValueError("no")

    results = run.each([lambda: 1, fail, lambda: 3])
    assert [r.value for r in results] == [1, None, 3]
    assert isinstance(results[1].error, ValueError) and results[0].error is None


def test_threads_run_the_calls_at_once():
    barrier = threading.Barrier(4, timeout=5)  # breaks (and fails the test) unless all 4 run together
    results = Threads(4).each([barrier.wait for _ in range(4)])
    assert sorted(r.value for r in results) == [0, 1, 2, 3]


def test_a_crash_in_one_thread_propagates_once_every_call_has_ended():
    ended: list[int] = []
    gate = threading.Event()

    def slow() -> None:
        gate.wait(5)
        ended.append(1)

    def crash() -> None:
        gate.set()
        raise Crash("timeout")

    with pytest.raises(Crash):
        Threads(2).each([slow, crash])
    assert ended == [1]


def test_one_worker_means_one_call_after_another():
    assert isinstance(fanout(1), Serial) and isinstance(fanout(8), Threads)
    with pytest.raises(ValueError):
        Threads(0)


def test_the_start_bucket_follows_the_region_unless_set():
    assert start_bucket("us-east-1") == (300, 1300) and start_bucket("eu-west-1") == (300, 1300)
    assert start_bucket("ap-southeast-2") == (150, 800)
    s = Settings.from_env({"AWS_REGION": "eu-central-1"})
    assert (s.start_concurrency, s.start_rate, s.start_burst) == (None, 150, 800)
    s = Settings.from_env(
        {"AWS_REGION": "us-west-2", "SLUICE_START_RATE": "50", "SLUICE_START_CONCURRENCY": "1"}
    )
    assert (s.start_concurrency, s.start_rate, s.start_burst) == (1, 50, 1300)

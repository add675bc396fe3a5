"""The rate limits' contract (``sluice.features.rate_limits``), run against the in-memory book and
the DynamoDB one on moto: at most N grants in any window [t, t + P), given back grants free their
room, a changed rate does not reset the window, and limiters racing in threads never over-grant."""

from __future__ import annotations

import random

import pytest

from sluice.adapters.dynamo.codec import create_table
from sluice.adapters.dynamo.rate_limits import DynamoRates
from sluice.adapters.dynamo.table import TableRef
from sluice.adapters.memory.rate_limits import MemoryRates
from sluice.features.rate_limits import (
    KEPT_PAST,
    NONE,
    STACK,
    Rate,
    RateBook,
    RateDefaults,
    RateLimiter,
    key_scope,
    lane_scope,
)
from tests.contract.slots_fixtures import in_threads
from tests.support.moto_patches import atomic_fast_moto

T0 = 1_800_000_000.0
GPU = lane_scope("gpu")


@pytest.fixture(params=["memory", "dynamodb"])
def persistence(request):
    if request.param == "memory":
        return MemoryRates()
    client = request.getfixturevalue("session").client("dynamodb")
    create_table(client, "rates")
    return DynamoRates(TableRef(client, "rates"))


FIVE_A_SECOND = Rate(5, 1)


def limiter(persistence, stack: Rate | None = FIVE_A_SECOND, **lanes: Rate) -> RateLimiter:
    return RateLimiter(persistence, RateDefaults(stack=stack, lanes=lanes))


def net_grants(events: list[tuple[float, int]], period: float) -> int:
    """The most grants (net of those given back) in any window [t, t + period) of ``events``."""
    times = sorted({t for t, _ in events})
    return max((sum(n for u, n in events if t <= u < t + period) for t in times), default=0)


def test_at_most_n_in_a_window_then_room_again_when_the_oldest_leaves(persistence):
    rates = limiter(persistence)
    assert rates.take([STACK], 3, T0).n == 3
    assert rates.take([STACK], 3, T0 + 0.5).n == 2
    refused = rates.take([STACK], 1, T0 + 0.9)
    assert refused.n == 0 and refused.due == pytest.approx(T0 + 1)
    assert rates.take([STACK], 5, T0 + 1).n == 3  # the 3 of T0 left; the 2 of T0 + 0.5 still count
    assert rates.take([STACK], 5, T0 + 1.5).n == 2


def test_no_rate_in_force_grants_all_and_writes_nothing(persistence):
    rates = limiter(persistence, stack=None)
    assert rates.take([STACK, GPU], 40, T0).n == 40
    assert persistence.load().version == 0


def test_a_lane_grant_takes_from_the_stack_and_the_lane_at_once(persistence):
    rates = limiter(persistence, Rate(10, 60), gpu=Rate(2, 1))
    assert rates.take([STACK, GPU], 5, T0).n == 2
    assert rates.take([STACK], 20, T0).n == 8  # the stack's window holds the lane's two


def test_what_a_round_gives_back_is_free_again(persistence):
    rates = limiter(persistence)
    grant = rates.take([STACK], 5, T0)
    rates.give_back(grant, 3)
    assert rates.take([STACK], 5, T0 + 0.1).n == 3
    rates.give_back(grant, 99)  # more than the grant holds: only what it holds
    assert rates.status([STACK], T0 + 0.2)[0].in_window == 3


def test_a_rate_set_at_run_time_counts_the_window_already_granted(persistence):
    rates = limiter(persistence, Rate(10, 60))
    assert rates.take([STACK], 8, T0).n == 8
    rates.set(STACK, Rate(5, 60))
    assert rates.take([STACK], 1, T0 + 1).n == 0, "a lowered rate must count the 8 granted"
    rates.set(STACK, Rate(12, 60))
    assert rates.take([STACK], 10, T0 + 2).n == 4
    rates.set(STACK, NONE)
    assert rates.take([STACK], 50, T0 + 3).n == 50
    rates.set(STACK, None)  # back to the parameter's, with the window as it was
    assert rates.take([STACK], 1, T0 + 4).n == 0
    (status,) = rates.status([STACK], T0 + 4)
    assert (status.rate, status.overridden, status.in_window) == (Rate(10, 60), False, 12)


def test_random_takes_and_give_backs_never_pass_n_in_any_window(persistence):
    rng = random.Random(7)
    rates, now, events = limiter(persistence, Rate(4, 2)), T0, []
    for _ in range(150):
        now += rng.choice([0, 0.1, 0.25, 0.7, 1.3])
        grant = rates.take([STACK], rng.randint(1, 6), now)
        events.append((grant.at_ms / 1000, grant.n))
        unused = rng.randint(0, grant.n)
        rates.give_back(grant, unused)
        events.append((grant.at_ms / 1000, -unused))
        assert net_grants(events, 2) <= 4
    assert sum(n for _, n in events) > 40, "the test should grant, not only refuse"


def test_limiters_racing_in_threads_grant_at_most_n(persistence):
    limiters = [limiter(persistence, Rate(25, 60)) for _ in range(8)]

    def grab(i: int) -> int:
        return sum(limiters[i].take([STACK], 2, T0 + j * 0.01).n for j in range(6))

    with atomic_fast_moto():
        granted = in_threads(8, grab)
    assert sum(granted) == 25


def test_a_grant_by_a_clock_ahead_counts_in_every_window_it_shares(persistence):
    ahead, behind = limiter(persistence, Rate(3, 10)), limiter(persistence, Rate(3, 10))
    assert ahead.take([STACK], 3, T0 + 5).n == 3  # a launcher whose clock runs 5 s ahead
    assert behind.take([STACK], 3, T0).n == 0, "[T0, T0 + 10) would hold 6"
    assert behind.take([STACK], 3, T0 - 5.001).n == 3  # no window of 10 s holds both
    assert behind.take([STACK], 1, T0 + 15.001).n == 1


def test_each_keys_window_is_its_own_book_and_the_stacks_is_untouched(persistence):
    rates = RateLimiter(persistence, RateDefaults(key=Rate(2, 60)))
    a, b = key_scope("a"), key_scope("b")
    assert rates.take([a], 3, T0).n == 2 and rates.take([a], 1, T0 + 1).n == 0
    assert rates.take([b], 3, T0 + 1).n == 2
    assert persistence.load().version == 0, "the stack's book is not written by a key's grant"
    assert persistence.load(a).in_window(a, Rate(2, 60), int((T0 + 1) * 1000)) == 2
    assert rates.room(a, T0 + 1) == 0 and rates.room(a, T0 + 60) == 2
    assert rates.room(STACK, T0) is None
    with pytest.raises(ValueError):
        rates.take([STACK, a], 1, T0)


def test_a_keys_rate_set_at_run_time_is_copied_to_the_stacks_book(persistence):
    rates = RateLimiter(persistence, RateDefaults(), idle_seconds=5)
    a = key_scope("a")
    assert rates.take([a], 4, T0).n == 4 and persistence.load(a).version == 0
    rates.set(a, Rate(1, 60))
    assert rates.keys_set() == [a] and persistence.load(a).overrides == {a: "1/minute"}
    assert rates.take([a], 4, T0).n == 1  # in force for the very next grant of this limiter
    other = RateLimiter(persistence, RateDefaults(), idle_seconds=5)
    assert other.take([a], 1, T0 + 1).n == 0
    rates.set(a, NONE)
    assert rates.take([a], 3, T0 + 2).n == 3 and rates.room(a, T0 + 2) is None


def test_a_clock_behind_takes_nothing_from_a_window_a_write_ahead_dropped_from(persistence):
    """A clock an hour ahead keeps ``KEPT_PAST`` entries past its period, all its own: the grant of a
    clock behind goes with the oldest. That clock's window may reach what went: no room until it is
    a period past it (explorer seed 1211301274)."""
    ahead, behind = limiter(persistence, Rate(1, 1)), limiter(persistence, Rate(1, 1))
    assert behind.take([STACK], 1, T0).n == 1
    for i in range(KEPT_PAST + 2):
        assert ahead.take([STACK], 1, T0 + 3600 + i).n == 1
    book = persistence.load()
    assert int(T0 * 1000) not in dict(book.windows[STACK])
    assert book.dropped[STACK] == ((int(T0 * 1000),) * 2, (int((T0 + 3600) * 1000),) * 2)
    refused = behind.take([STACK], 1, T0 + 0.5)
    assert refused.n == 0 and refused.due == pytest.approx(T0 + 1)
    assert behind.take([STACK], 1, T0 + 1).n == 1


def test_a_clock_once_a_day_ahead_that_dropped_only_its_own_holds_no_other_clock(persistence):
    """A reviewer's finding on the first form of the fix (the latest time dropped, for every clock
    before it): a launcher a day ahead, gone, held every correct clock for a day."""
    ahead, right = limiter(persistence, Rate(1, 1)), limiter(persistence, Rate(1, 1))
    for i in range(40):
        assert ahead.take([STACK], 1, T0 + 86_400 + i).n == 1
    assert persistence.load().dropped[STACK]  # the drop fired
    assert right.take([STACK], 1, T0 + 40).n == 1


def test_a_period_lengthened_at_run_time_counts_the_grants_dropped_under_the_shorter(persistence):
    rates, events = limiter(persistence, Rate(1, 1)), []
    for i in range(40):
        events.append((T0 + i, rates.take([STACK], 1, T0 + i).n))
    rates.set(STACK, Rate(50, 60))  # the last minute holds 40 grants, the book 33 of them
    for i in range(40, 130):
        events.append((T0 + i, rates.take([STACK], 50, T0 + i).n))
    assert net_grants(events, 60) <= 50
    assert sum(n for t, n in events if t >= T0 + 40) >= 50, "the test should grant again, not only refuse"


def test_spans_dropped_under_a_long_period_hold_no_clock_once_it_is_shortened():
    """A second reviewer's finding: spans merged across a gap of the period (an hour) outlived it.
    Two grants 50 minutes apart, dropped under 2/hour, then 1/second: a clock 25 minutes from
    either has room."""
    hour, t = 3_600_000, int(T0 * 1000)
    rates = {STACK: Rate(2, 3600)}
    book = RateBook().granted([STACK], 1, t, rates).granted([STACK], 1, t + 50 * 60_000, rates)
    for base in (t + 2 * hour, t + 3 * hour):
        for i in range(KEPT_PAST + 1):
            book = book.granted([STACK], 1, base + 1000 * i, rates)
    assert book.dropped[STACK][:2] == ((t, t), (t + 50 * 60_000,) * 2)  # both dropped, apart
    assert book.room(STACK, Rate(1, 1), t + 25 * 60_000) == 1
    assert book.room(STACK, Rate(1, 1), t + 50 * 60_000 + 500) == 0

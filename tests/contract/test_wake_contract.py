"""The woken launchers' turn (``sluice.features.wake``), run against the in-memory item and the
DynamoDB one on moto: one holder at a time until its turn ends, a wake while it holds is a note it
fills for, and woken launchers racing in threads fill once for a crowd of wakes, never losing one."""

from __future__ import annotations

import threading
import time

import pytest

from sluice.adapters.dynamo.codec import create_table
from sluice.adapters.dynamo.table import TableRef
from sluice.adapters.dynamo.wake import DynamoWakeTurns
from sluice.adapters.memory.wake import MemoryWakeTurns
from sluice.core.errors import TransientError
from sluice.core.summary import TickSummary
from sluice.features.wake import NOTE_MARGIN, NOTED, woken
from tests.contract.slots_fixtures import in_threads
from tests.support.moto_patches import atomic_fast_moto

T0 = 1_800_000_000.0


@pytest.fixture(params=["memory", "dynamodb"])
def turns(request):
    if request.param == "memory":
        return MemoryWakeTurns()
    client = request.getfixturevalue("session").client("dynamodb")
    create_table(client, "wake")
    return DynamoWakeTurns(TableRef(client, "wake"))


def test_one_holder_until_its_turn_ends_or_is_given_back(turns):
    assert turns.take("w", now=T0, expires_at=T0 + 60)
    assert turns.take("w", now=T0, expires_at=T0 + 60)  # w's SDK again, the first answer lost
    assert not turns.take("v", now=T0 + 30, expires_at=T0 + 90)
    assert not turns.give_back("v")  # not v's
    assert turns.give_back("w")
    assert turns.take("v", now=T0 + 31, expires_at=T0 + 91)
    assert turns.take("u", now=T0 + 200, expires_at=T0 + 260)  # v crashed: its turn ended
    assert not turns.again("v") and turns.again("u")


def test_a_note_keeps_the_turn_until_its_holder_fills_again(turns):
    assert not turns.note(now=T0)  # no one holds it: the waker takes it itself
    assert turns.take("w", now=T0, expires_at=T0 + 60)
    assert turns.note(now=T0 + 1)
    assert not turns.give_back("w")  # noted: fill once more first
    assert turns.again("w")
    assert turns.give_back("w")
    assert turns.take("w", now=T0 + 2, expires_at=T0 + 60)
    assert turns.note(now=T0 + 3)
    assert turns.give_back("w", noted_or_not=True)  # its time is up: the scheduled tick takes it
    assert not turns.note(now=T0 + 100)  # ended turns take no note


class Recorded:
    """The turns, each successful note and each fill's start numbered in one sequence."""

    def __init__(self, turns) -> None:
        self.turns, self.lock, self.seq = turns, threading.Lock(), 0
        self.notes: list[int] = []
        self.fills: list[int] = []

    def stamp(self, into: list[int]) -> None:
        with self.lock:
            self.seq += 1
            into.append(self.seq)

    def take(self, holder, **kw):
        return self.turns.take(holder, **kw)

    def note(self, **kw):
        with self.lock:  # numbered as it takes effect: no fill can start between the two
            done = self.turns.note(**kw)
            if done:
                self.seq += 1
                self.notes.append(self.seq)
        return done

    def again(self, holder):
        return self.turns.again(holder)

    def give_back(self, holder, **kw):
        return self.turns.give_back(holder, **kw)


class GivenBackWhateverNoted(Recorded):
    """A broken variant: the holder gives its turn back without looking at the notes."""

    def give_back(self, holder, **kw):
        return self.turns.give_back(holder, noted_or_not=True)


def crowd(recorded: Recorded) -> list[str]:
    """Sixteen woken launchers at once, the first fill lasting until the others have found the turn
    held; what each returned."""
    clock = iter(range(10**6))
    lock = threading.Lock()

    def now() -> float:
        with lock:
            return T0 + next(clock) / 1000

    def fill() -> TickSummary:
        recorded.stamp(recorded.fills)
        if len(recorded.fills) == 1:  # the first fill lasts until the 15 others have left their note
            deadline = time.monotonic() + 10
            while len(recorded.notes) < 15 and time.monotonic() < deadline:
                time.sleep(0.005)
        return TickSummary()

    def wake(i: int) -> str:
        return woken(recorded, f"w{i}", now=now, ends_at=T0 + 600, fill=fill).stopped

    with atomic_fast_moto():
        return in_threads(16, wake)


def test_a_crowd_of_wakes_is_filled_for_and_none_is_dropped(turns):
    """Those that find the turn held leave a note, and a fill starts after every note; the turn is
    given back at the end."""
    recorded = Recorded(turns)

    stopped = crowd(recorded)

    assert stopped.count(NOTED) == len(recorded.notes) == 15  # the crowd was noted, not filled for each
    assert len(recorded.fills) == 2  # the first, and one more for every note left meanwhile
    assert all(any(f > n for f in recorded.fills) for n in recorded.notes)  # no note dropped
    assert turns.take("after", now=T0 + 601, expires_at=T0 + 660)  # given back: nothing left held


def test_a_turn_given_back_whatever_was_noted_drops_wakes(turns):
    """The check above catches the broken variant: notes left after the last fill began."""
    recorded = GivenBackWhateverNoted(turns)

    crowd(recorded)

    assert recorded.notes and max(recorded.notes) > max(recorded.fills)


def test_a_fill_that_fails_gives_the_turn_back(turns):
    """A fill AWS refused past the SDK's retries: the invocation fails (Lambda invokes it again), and
    the turn is free for the next wake at once instead of at the failed one's deadline."""

    def refused() -> TickSummary:
        raise TransientError("ReceiveMessage: throttled", operation="ReceiveMessage", code="Throttling")

    with pytest.raises(TransientError):
        woken(turns, "w", now=lambda: T0, ends_at=T0 + 600, fill=refused)
    assert turns.take("v", now=T0 + 1, expires_at=T0 + 600)


def test_near_the_end_of_a_turn_a_wake_fills_by_itself(turns):
    """W's fills stop receiving at its turn's end: a wake within NOTE_MARGIN of it is not noted (W
    might not fill for it in time) but fills by itself."""
    fills = []
    assert turns.take("w", now=T0, expires_at=T0 + 60)
    assert turns.note(now=T0 + 60 - NOTE_MARGIN - 1) and turns.again("w")
    late = T0 + 60 - NOTE_MARGIN + 1

    done = woken(
        turns, "v", now=lambda: late, ends_at=late + 100, fill=lambda: fills.append("v") or TickSummary()
    )

    assert fills == ["v"] and done.stopped != NOTED


def test_lambdas_retry_of_a_failed_wake_takes_its_turn_again(turns):
    """An invocation that died holding its turn (its give-back refused or never made): Lambda's retry
    carries the same request id, takes the turn again and fills, where another wake is only noted."""
    fills = []
    assert turns.take("request-1", now=T0, expires_at=T0 + 100)  # then the invocation failed

    other = woken(turns, "request-2", now=lambda: T0 + 5, ends_at=T0 + 100, fill=lambda: TickSummary())
    woken(
        turns,
        "request-1",
        now=lambda: T0 + 60,
        ends_at=T0 + 160,
        fill=lambda: fills.append(1) or TickSummary(),
    )

    assert other.stopped == NOTED and fills == [1]  # the retry's fill, after the note, fills for it
    assert turns.take("request-3", now=T0 + 61, expires_at=T0 + 100)  # and gave the turn back
